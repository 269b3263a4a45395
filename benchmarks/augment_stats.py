"""Whether the two augmentation engines draw the same views, op by op, on real images.

For every RandAugment op at magnitude 10 (each image its own draw of the op's parameter),
for the weak view and for the whole strong view, statistics of the views of ``--images``
test images of ``--dataset``, each drawn ``--repeat`` times per engine with other seeds:
the mean absolute change per pixel, the share of pixels moved by more than 0.1, the views'
mean and std. An engine's draws differ from one seed to the next; the table compares the
gap between the two engines' means with that spread (``z``: the gap over the standard
error of the difference of the means). The per-op tests (tests/test_augment_batched.py)
check that each op gives kornia's values for fixed parameters; this checks the parameters'
distributions, which a seed-for-seed comparison cannot (the engines draw differently).

    python benchmarks/augment_stats.py --json results/augment-stats.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tasks import augment, augment_batched  # noqa: E402
from tasks.config import data_root  # noqa: E402
from tasks.data import DatasetRequest, dataset_info, load_dataset  # noqa: E402
from tasks.results import host  # noqa: E402

OP_NAMES = [
    "identity",
    "autocontrast",
    "equalize",
    "rotate",
    "solarize",
    "posterize",
    "contrast",
    "brightness",
    "sharpness",
    "shear_x",
    "shear_y",
    "translate_x",
    "translate_y",
    "saturation",
]
STATS = ("mean_abs_change", "share_changed", "mean", "std")
CHUNK = augment.AUGMENT_GROUP

View = Callable[[torch.Tensor], torch.Tensor]


def view_stats(x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """The views ``y`` of images ``x``: mean |y - x|, share of pixels moved by > 0.1, mean, std."""
    change = (y - x).abs()
    return {
        "mean_abs_change": change.mean().item(),
        "share_changed": (change > 0.1).float().mean().item(),
        "mean": y.mean().item(),
        "std": y.std().item(),
    }


def in_chunks(view: View, x: torch.Tensor) -> torch.Tensor:
    """``view`` over ``x`` in groups of AUGMENT_GROUP images, as the clients call it."""
    return torch.cat([view(x[i : i + CHUNK]) for i in range(0, x.shape[0], CHUNK)])


def kornia_op(op: int, channels: int) -> View:
    """The kornia engine's op ``op`` alone, on every image, clamped as in RandAugment."""
    module = augment.randaugment_ops(1.0, channels)[op]
    return lambda x: module(x).clamp(0.0, 1.0)


def batched_op(op: int) -> View:
    """The batched engine's op ``op`` alone, every image its own parameter draw."""

    def view(x: torch.Tensor) -> torch.Tensor:
        size = x.shape[0]
        choice = torch.full((size,), op, dtype=torch.long)
        value = augment_batched.op_values(choice, torch.rand(size), torch.ones(size), *x.shape[-2:])
        return augment_batched.apply_chosen(x, choice, value)

    return view


def views(channels: int, size: int, flip: bool) -> dict[str, dict[str, View]]:
    """Every compared view, by name: {"kornia": ..., "batched": ...}."""
    out = {
        OP_NAMES[op]: {"kornia": kornia_op(op, channels), "batched": batched_op(op)}
        for op in range(augment_batched.num_ops(channels))
    }
    out["weak"] = {
        "kornia": augment.WeakAugment(size, flip),
        "batched": augment_batched.BatchedWeakAugment(size, flip),
    }
    out["strong"] = {
        "kornia": augment.StrongAugment(size, flip, channels),
        "batched": augment_batched.BatchedStrongAugment(size, flip, channels),
    }
    return out


def compare(draws: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Per statistic: each engine's mean over its draws, and z, the gap of the means over
    the standard error of their difference."""
    out = {}
    for stat in STATS:
        k = [d[stat] for d in draws["kornia"]]
        b = [d[stat] for d in draws["batched"]]
        error = math.sqrt(statistics.variance(k) / len(k) + statistics.variance(b) / len(b))
        gap = statistics.mean(b) - statistics.mean(k)
        out[stat] = {
            "kornia": statistics.mean(k),
            "batched": statistics.mean(b),
            "z": gap / error if error > 0 else (0.0 if gap == 0 else math.inf),
        }
    return out


def measure(dataset: str, images: int, repeat: int, seed: int) -> dict:
    """Every view's statistics on both engines, ``repeat`` seeds each."""
    info = dataset_info(dataset)
    data = load_dataset(DatasetRequest(dataset, str(data_root(""))))
    x = data.test_x[:images].float().div(255.0)
    results = {}
    for name, engines in views(info.channels, info.image_size, info.flip).items():
        draws: dict[str, list[dict[str, float]]] = {}
        for engine, view in engines.items():
            draws[engine] = []
            for r in range(repeat):
                torch.manual_seed(seed + r)
                draws[engine].append(view_stats(x, in_chunks(view, x)))
        results[name] = compare(draws)
    return {
        "dataset": dataset,
        "images": images,
        "repeat": repeat,
        "seed": seed,
        "views": results,
        "host": host(),
    }


def report(result: dict) -> str:
    """One line per view: each statistic's engine means and z."""
    lines = [f"{'view':<13} " + "  ".join(f"{s:>28}" for s in STATS)]
    for name, stats in result["views"].items():
        cells = [f"{v['kornia']:.4f} / {v['batched']:.4f} z {v['z']:+6.2f}" for v in stats.values()]
        lines.append(f"{name:<13} " + "  ".join(f"{c:>28}" for c in cells))
    z, name, stat = largest_z(result)
    lines.append(f"largest |z|: {z:.2f} ({name}, {stat})")
    return "\n".join(lines)


def largest_z(result: dict) -> tuple[float, str, str]:
    """(|z|, view, statistic) of the largest gap between the engines, in standard errors."""
    return max(
        (abs(v["z"]), name, stat)
        for name, stats in result["views"].items()
        for stat, v in stats.items()
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="fashion_mnist")
    parser.add_argument("--images", type=int, default=8000)
    parser.add_argument("--repeat", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.repeat < 2:
        parser.error("--repeat must be at least 2 (the spread needs two draws)")
    torch.set_num_threads(1)
    result = measure(args.dataset, args.images, args.repeat, args.seed)
    print(report(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()

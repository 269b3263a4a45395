"""What a strong view costs on the CPU, by augmentation engine.

One call of the strong view (the weak flip and shift, RandAugment(2, 10), Cutout: FixMatch's
and the SSFL benchmark's A(.)) on ``--images`` random images, best of ``--repeat`` on one
thread, for Fashion-MNIST's 1x28x28 and CIFAR-10's 3x32x32 images:

- ``kornia``: tasks.augment.StrongAugment (``augment.engine: kornia``);
- ``batched``: tasks.augment_batched.BatchedStrongAugment as a CPU run takes it (each op
  on the images that chose it);
- ``batched_masked``: the same module on the path an accelerator takes (every op on every
  image, each keeping its own op's result: no host sync), timed here on the CPU.

``batched`` and ``batched_masked`` give the same values to the bit
(tests/test_augment_batched.py). Writes ``--json`` and prints it.

    python benchmarks/augment_speed.py --json results/augment-speed.json
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.partial_sums import best_of, report  # noqa: E402
from tasks import augment_batched  # noqa: E402
from tasks.augment import StrongAugment  # noqa: E402
from tasks.results import host  # noqa: E402

SHAPES = {"fmnist": (1, 28), "cifar10": (3, 32)}  # (channels, image size)


@contextmanager
def masked_path() -> Iterator[None]:
    """The batched engine on its accelerator path, also on the CPU."""
    indexed = augment_batched.apply_chosen_indexed
    augment_batched.apply_chosen_indexed = augment_batched.apply_chosen_masked
    try:
        yield
    finally:
        augment_batched.apply_chosen_indexed = indexed


def measure(images: int, repeat: int) -> dict[str, dict[str, float]]:
    """Seconds of one strong view of ``images`` images, by shape and engine."""
    return {
        name: shape_seconds(channels, size, images, repeat)
        for name, (channels, size) in SHAPES.items()
    }


def shape_seconds(channels: int, size: int, images: int, repeat: int) -> dict[str, float]:
    """Seconds of one strong view of ``images`` random (channels, size, size) images, by
    engine."""
    torch.manual_seed(0)
    x = torch.rand(images, channels, size, size)
    kornia = StrongAugment(size, True, channels)
    batched = augment_batched.BatchedStrongAugment(size, True, channels)
    row = {
        "kornia": best_of(repeat, partial(kornia, x)),
        "batched": best_of(repeat, partial(batched, x)),
    }
    with masked_path():
        row["batched_masked"] = best_of(repeat, partial(batched, x))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", type=Path, help="write the result here")
    args = parser.parse_args()
    if args.images < 1 or args.repeat < 1:
        raise SystemExit("augment_speed: --images and --repeat must be >= 1")
    torch.set_num_threads(1)
    result = {
        "images": args.images,
        "repeat": args.repeat,
        "seconds": measure(args.images, args.repeat),
        "host": host(),
    }
    report(result, args.json)


if __name__ == "__main__":
    main()

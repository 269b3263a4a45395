"""How well the server's model knows what it knows: calibration before the users see it.

Builds the experiment's split and server as ``ssfl run`` does and takes the model the
users would receive: the server's bootstrap (``server.bootstrap_epochs``) or, with
``--checkpoint``, the global model a run kept after a round (``federation.checkpoint_every``;
the users of the next round start from it). For three sets of images, the users' weak
views alpha(x) (what the mask of SSFL benchmark eq. 6 and FixMatch thresholds), the
users' clean images and the test set, it records the reliability diagram, the expected
calibration error, and the share and accuracy of the predictions with max p >= tau
(``algo.threshold``), per predicted class (tasks/metrics.py). Writes
``--out/calibration.json`` and ``--out/reliability.png`` and prints a markdown table.

    python benchmarks/calibration.py experiments/ssfl-fmnist/crl_gn.yaml \
        --checkpoint results/calib/crl_gn-40/checkpoint-r013.pt --out results/calib/r013
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from ssfl.experiment import kept_checkpoint_state, resolve_experiment
from ssfl.registry import method, settings_of
from strategies.parts import ServerSide
from tasks.augment import WeakAugment
from tasks.config import ConfigError
from tasks.metrics import calibration
from tasks.partition import get_split
from tasks.settings import Settings
from tasks.train import derive_seed, predict_logits, seeded, to_float

SETS = ("weak views", "clean images", "test set")


def server_model(settings: Settings, checkpoint: Path | None) -> tuple[ServerSide, str]:
    """The server with the model the users would receive, and where that model comes from."""
    dataset, split = get_split(settings)
    server = ServerSide.build(settings, dataset, split, torch.device("cpu"))
    if checkpoint is None:
        strategy = method(settings.method).server_half().strategy(server, lambda row: None)
        strategy.parts.trainer.bootstrap()
        return server, f"the bootstrap ({settings.server.bootstrap_epochs} epochs)"
    state = kept_checkpoint_state(checkpoint, settings)
    server.model.load_state_dict(state["model"])
    return server, f"the global model after round {state['round']}"


def probabilities(server: ServerSide, x: torch.Tensor) -> torch.Tensor:
    logits = predict_logits(server.model, x, server.settings.eval.batch_size)
    return torch.softmax(logits, dim=1)


def measure(server: ServerSide, threshold: float, bins: int) -> dict[str, dict]:
    """Calibration on the users' weak views, their clean images and the test set."""
    ds, split, settings = server.dataset, server.split, server.settings
    users = np.concatenate(split.clients)
    clean = to_float(ds.train_x[users], server.device)
    labels = ds.train_y[users]
    with seeded(derive_seed(settings.seed, "calibration")):
        weak = WeakAugment(ds.image_size, ds.flip, settings.augment.weak_shift)(clean)
    return {
        "weak views": calibration(probabilities(server, weak), labels, threshold, bins),
        "clean images": calibration(probabilities(server, clean), labels, threshold, bins),
        "test set": calibration(
            probabilities(server, server.test_x), server.test_y, threshold, bins
        ),
    }


def plot(report: dict, path: Path) -> None:
    """Reliability diagram: accuracy against mean confidence per bin, one line a set."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 5))
    ax.plot([0, 1], [0, 1], color="grey", linestyle=":", label="calibrated")
    for name in SETS:
        rows = [r for r in report["sets"][name]["bins"] if r["count"]]
        ece = report["sets"][name]["ece"]
        ax.plot(
            [r["confidence"] for r in rows],
            [r["accuracy"] for r in rows],
            marker="o",
            label=f"{name} (ECE {ece:.3f})",
        )
    ax.axvline(report["threshold"], color="red", linewidth=0.8, label="tau")
    ax.set_xlabel("mean confidence of the bin")
    ax.set_ylabel("accuracy of the bin")
    ax.set_title(report["model"], fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiment")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--checkpoint", type=Path, help="a checkpoint a run of EXPERIMENT kept")
    parser.add_argument("--bins", type=int, default=10, help="reliability bins (default 10)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.bins < 1:
        raise SystemExit(f"--bins: a positive number of bins, got {args.bins}")
    try:
        settings = settings_of(resolve_experiment(args.experiment, sets=args.sets))
        server, source = server_model(settings, args.checkpoint)
    except ConfigError as err:
        raise SystemExit(f"calibration: {err}") from None
    threshold = float(getattr(settings.algo, "threshold", 0.95))
    report = {
        "experiment": args.experiment,
        "model": source,
        "threshold": threshold,
        "sets": measure(server, threshold, args.bins),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "calibration.json").write_text(json.dumps(report, indent=1))
    plot(report, args.out / "reliability.png")
    print(f"model: {source}; tau = {threshold}")
    print("| images | accuracy | mean confidence | ECE | share with max p >= tau | its accuracy |")
    print("|---|---|---|---|---|---|")
    for name in SETS:
        s = report["sets"][name]
        c = s["confident"]
        print(
            f"| {name} ({s['images']}) | {s['accuracy']:.4f} | {s['mean_confidence']:.4f} "
            f"| {s['ece']:.4f} | {c['rate']:.4f} ({c['count']}) | {c['accuracy']:.4f} |"
        )


if __name__ == "__main__":
    main()

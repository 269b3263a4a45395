"""Which classes pass a confidence threshold: the pseudo-labels of a server model.

Builds the experiment's split and server as ``ssfl run`` does, trains the server's
bootstrap (``server.bootstrap_epochs``), then labels every user's unlabeled data with
that model on the weak view and counts, per class, the samples whose confidence
reaches ``algo.threshold`` (the mask of FixMatch / CRL, SSFL benchmark eq. 6) and how
many of them are right. Writes ``--out/pseudo_labels.json`` and prints a markdown table.

    python benchmarks/pseudo_labels.py experiments/ssfl-fmnist/crl_gn.yaml \
        --set server.bootstrap_epochs=20 --out results/pseudo-labels
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from ssfl.experiment import resolve_experiment
from ssfl.registry import method, settings_of
from strategies.parts import ServerSide
from tasks.augment import WeakAugment
from tasks.partition import get_split
from tasks.train import evaluate, predict_logits, seeded, to_float


def class_counts(labels: torch.Tensor, num_classes: int) -> list[int]:
    return np.bincount(labels.cpu().numpy(), minlength=num_classes).tolist()


def user_pseudo_labels(model, x, y, weak, threshold: float, batch_size: int, k: int) -> dict:
    """Per-class counts of the kept pseudo-labels (max p >= threshold) and of the right ones."""
    probs = torch.softmax(predict_logits(model, weak(x), batch_size), dim=1)
    conf, pred = probs.max(dim=1)
    kept = conf >= threshold
    return {
        "true": class_counts(y, k),
        "kept": class_counts(pred[kept], k),
        "kept_right": class_counts(pred[kept & (pred == y)], k),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiment")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    settings = settings_of(resolve_experiment(args.experiment, sets=args.sets))
    ds, split = get_split(settings)
    device = torch.device("cpu")
    server = ServerSide.build(settings, ds, split, device)
    method(settings.method).server_half().strategy(
        server, lambda row: None
    ).parts.trainer.bootstrap()
    bs = settings.eval.batch_size
    test_acc, _ = evaluate(server.model, server.test_x, server.test_y, bs)
    with seeded(settings.seed):
        weak = WeakAugment(ds.image_size, ds.flip, settings.augment.weak_shift)
        k, threshold = ds.num_classes, settings.algo.threshold
        users = [
            user_pseudo_labels(
                server.model,
                to_float(ds.train_x[idx], device),
                ds.train_y[idx],
                weak,
                threshold,
                bs,
                k,
            )
            for idx in split.clients
        ]
    total = {key: np.sum([u[key] for u in users], axis=0).tolist() for key in users[0]}
    report = {"test_accuracy": test_acc, "threshold": threshold, "users": users, "total": total}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "pseudo_labels.json").write_text(json.dumps(report, indent=1))
    kept = sum(total["kept"])
    print(f"server model after the bootstrap: test accuracy {test_acc:.4f}")
    print(
        f"kept {kept} of {sum(total['true'])} user images (max p >= {threshold}), "
        f"{sum(total['kept_right']) / max(kept, 1):.3f} right"
    )
    print("| class | user images | kept as the class | kept / user images | right among kept |")
    print("|---|---|---|---|---|")
    for c in range(k):
        n, m, r = total["true"][c], total["kept"][c], total["kept_right"][c]
        print(f"| {c} | {n} | {m} | {m / max(n, 1):.3f} | {r / max(m, 1):.3f} |")


if __name__ == "__main__":
    main()

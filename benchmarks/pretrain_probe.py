"""What FedoSSL's SimCLR start gives the encoder: k-NN accuracy before and after it.

For an open-world experiment (experiments/fmnist-open/*.yaml) with algo.pretrain_epochs > 0,
runs the stage exactly as a run's server does before round 1 (strategies/fedossl.py:
SimCLRStart, kept in the cache for the run that follows) and scores the encoder of the
freshly initialised model and of the pretrained one by the accuracy of a cosine 20-nearest-
neighbour vote (the usual SimCLR monitor) of the test images among the pooled training
images, per class role (seen, locally unseen, globally unseen) and overall. Writes JSON.

    python benchmarks/pretrain_probe.py experiments/fmnist-open/fedossl.yaml \\
        --set algo.pretrain_epochs=10 --out results/pretrain_probe.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ssfl.experiment import resolve_experiment
from ssfl.registry import settings_of
from strategies.fedossl import SimCLRStart, roles_of
from strategies.parts import ServerSide
from tasks.openworld import predict
from tasks.partition import get_split
from tasks.train import to_float


def knn_predictions(train_z: torch.Tensor, train_y: torch.Tensor, test_z: torch.Tensor, k: int):
    """Each test row's majority label among its k most cosine-similar training rows."""
    train_z, test_z = F.normalize(train_z, dim=1), F.normalize(test_z, dim=1)
    classes = int(train_y.max()) + 1
    out = []
    for chunk in test_z.split(1024):
        nearest = (chunk @ train_z.T).topk(k, dim=1).indices
        votes = F.one_hot(train_y[nearest], classes).sum(1)
        out.append(votes.argmax(1))
    return torch.cat(out)


def knn_scores(server: ServerSide, pool: np.ndarray, k: int) -> dict[str, float]:
    """k-NN accuracy on the test set, overall and per class role."""
    scale = server.settings.algo.logit_scale
    images = to_float(server.dataset.train_x[pool], server.device)
    train_z, _ = predict(server.model, images, scale, 1024)
    test_z, _ = predict(server.model, server.test_x, scale, 1024)
    labels = server.dataset.train_y[pool].to(server.device)
    pred = knn_predictions(train_z, labels, test_z, k)
    right = (pred == server.test_y).float()
    roles = roles_of(server.settings, server.dataset.num_classes)
    out = {"all": float(right.mean())}
    for letter, name in (("S", "seen"), ("L", "lu"), ("G", "gu")):
        members = [c for c, r in enumerate(roles) if r == letter]
        mask = torch.isin(server.test_y, torch.tensor(members, device=server.device))
        if mask.any():
            out[name] = float(right[mask].mean())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiment")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--k", type=int, default=20, help="neighbours (default 20)")
    parser.add_argument("--out", type=Path, required=True, help="JSON file")
    args = parser.parse_args()
    settings = settings_of(resolve_experiment(args.experiment, sets=args.sets))
    if not getattr(settings.algo, "pretrain_epochs", 0):
        parser.error("the experiment runs no SimCLR stage: --set algo.pretrain_epochs=N")
    dataset, split = get_split(settings)
    server = ServerSide.build(settings, dataset, split, torch.device("cpu"))
    pool = np.unique(np.concatenate([*split.clients, *split.client_labeled]))
    before = knn_scores(server, pool, args.k)
    stage = SimCLRStart(server)
    started = time.perf_counter()
    stage.bootstrap()
    result = {
        "experiment": args.experiment,
        "sets": args.sets,
        "k": args.k,
        "knn_scratch": before,
        "knn_pretrained": knn_scores(server, pool, args.k),
        "stage": stage.record,
        "seconds": time.perf_counter() - started,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

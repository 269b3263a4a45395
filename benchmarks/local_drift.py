"""How far one round of local training moves each user's model: accuracy after T steps.

Builds the experiment's split and server as ``ssfl run`` does, trains the server's
bootstrap (``server.bootstrap_epochs``) or takes the global model a run kept
(``--checkpoint``, from federation.checkpoint_every), then gives that model to every user
as round 1 would and runs the method's real client half (``client_app``) for T local steps, for
each T of ``--steps``. Records, per user and T, the test accuracy of the user's model
and the half's own metrics (mask rate, pseudo-label accuracy), and the test accuracy of
the users' average (eq. 4 without the server's own T steps). A user loss that keeps
the server's accuracy leaves the average of eq. 4 (SSFL benchmark) something to build
on; one that collapses every user within T steps does not. Writes
``--out/local_drift.json`` and prints a markdown table.

    python benchmarks/local_drift.py experiments/ssfl-fmnist/crl_gn.yaml \
        --set server.bootstrap_epochs=6 --steps 2,4,8,16 --out results/local-drift/crl_gn
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from ssfl.experiment import kept_checkpoint_state, resolve_experiment
from ssfl.registry import method, settings_of
from strategies.loop import RoundLoop
from strategies.parts import ServerSide
from tasks.aggregate import weighted_average
from tasks.config import ConfigError
from tasks.partition import get_split
from tasks.settings import Settings, mapping
from tasks.train import evaluate


def steps_list(text: str) -> list[int]:
    steps = [int(s) for s in text.split(",") if s.strip()]
    if not steps or min(steps) < 1:
        raise SystemExit(f"--steps: expected positive integers like 2,4,8,16, got {text!r}")
    return steps


def user_round(
    settings: Settings, server: ServerSide, strategy: RoundLoop, pid: int
) -> tuple[float, dict, dict]:
    """Round 1 of user ``pid`` from the server's model: (test accuracy, metrics, state)."""
    start = ArrayRecord(server.model.state_dict())
    content = RecordDict(
        {
            "config": strategy.client_config(1, pid, ConfigRecord()),
            **strategy.parts.codec.encode(1, pid, start),
        }
    )
    half = method(settings.method).client_half()(content, RecordDict(), pid)
    metrics = half.run()
    accuracy, _ = evaluate(half.model, server.test_x, server.test_y, settings.eval.batch_size)
    return accuracy, {k: float(v) for k, v in metrics.items()}, half.model.state_dict()


def average_accuracy(server: ServerSide, states: list[dict], batch_size: int) -> float:
    """Test accuracy of the uniform average of the users' models (the project's FedAvg)."""
    arrays = [{k: v.numpy() for k, v in s.items()} for s in states]
    mean = weighted_average(arrays, [1.0] * len(arrays))
    server.model.load_state_dict({k: torch.from_numpy(v) for k, v in mean.items()})
    return evaluate(server.model, server.test_x, server.test_y, batch_size)[0]


def bootstrapped(settings: Settings) -> tuple[dict, float]:
    """The server's model after its bootstrap (state dict) and its test accuracy."""
    dataset, split = get_split(settings)
    server = ServerSide.build(settings, dataset, split, torch.device("cpu"))
    method(settings.method).server_half().strategy(
        server, lambda row: None
    ).parts.trainer.bootstrap()
    accuracy, _ = evaluate(server.model, server.test_x, server.test_y, settings.eval.batch_size)
    return server.model.state_dict(), accuracy


def checkpointed(settings: Settings, path: Path) -> tuple[dict, float]:
    """The global model a run of ``settings`` kept (federation.checkpoint_every) and its test
    accuracy; SystemExit with one line for another run's checkpoint or none."""
    try:
        state = kept_checkpoint_state(path, settings)
    except ConfigError as err:
        raise SystemExit(f"local_drift: {err}") from None
    dataset, split = get_split(settings)
    server = ServerSide.build(settings, dataset, split, torch.device("cpu"))
    server.model.load_state_dict(state["model"])
    accuracy, _ = evaluate(server.model, server.test_x, server.test_y, settings.eval.batch_size)
    return server.model.state_dict(), accuracy


def drift(settings: Settings, start: dict, steps: int) -> dict:
    """Every user's round 1 from the model ``start``, with T = ``steps``."""
    settings = dataclasses.replace(
        settings, client=dataclasses.replace(settings.client, local_steps=steps)
    )
    dataset, split = get_split(settings)
    server = ServerSide.build(settings, dataset, split, torch.device("cpu"))
    server.model.load_state_dict(start)
    strategy = method(settings.method).server_half().strategy(server, lambda row: None)
    users = [user_round(settings, server, strategy, pid) for pid in range(len(split.clients))]
    return {
        "steps": steps,
        "user_accuracy": [acc for acc, _, _ in users],
        "user_metrics": [m for _, m, _ in users],
        "average_accuracy": average_accuracy(
            server, [s for _, _, s in users], settings.eval.batch_size
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiment")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--steps", type=steps_list, default=[2, 4, 8, 16])
    parser.add_argument(
        "--checkpoint",
        type=Path,
        help="start from the global model a run of EXPERIMENT kept, not the bootstrap "
        "(the users' own state, e.g. kept momentum, starts fresh)",
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    settings = settings_of(resolve_experiment(args.experiment, sets=args.sets))
    client = method(settings.method).client_half()
    if client is None:
        raise SystemExit(f"method {settings.method!r} has no client half to measure")
    if "client.local_steps" not in client.honours:
        raise SystemExit(f"method {settings.method!r}: its client half does not count local steps")
    if args.checkpoint is None:
        (start, accuracy), source = bootstrapped(settings), "after the bootstrap"
    else:
        (start, accuracy), source = checkpointed(settings, args.checkpoint), f"of {args.checkpoint}"
    rows = [drift(settings, start, t) for t in args.steps]
    report = {
        "config": mapping(settings),
        "start": source,
        "server_accuracy": accuracy,
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "local_drift.json").write_text(json.dumps(report, indent=1))
    print(f"server model {source}: test accuracy {accuracy:.4f}")
    print(
        "| T | users' test accuracy: mean (min-max) | their average's accuracy "
        "| mask rate | pseudo-label accuracy |"
    )
    print("|---|---|---|---|---|")
    for row in rows:
        acc = np.array(row["user_accuracy"])
        mask = np.mean([m.get("mask_rate", 0.0) for m in row["user_metrics"]])
        right = np.mean([m.get("pseudo_label_accuracy", 0.0) for m in row["user_metrics"]])
        print(
            f"| {row['steps']} | {acc.mean():.3f} ({acc.min():.3f}-{acc.max():.3f}) "
            f"| {row['average_accuracy']:.3f} | {mask:.3f} | {right:.3f} |"
        )


if __name__ == "__main__":
    main()

"""Cost of one local SGD step of FedSup against FixMatch and the SSL baselines.

Each method's real client half runs ``--steps`` local steps on the same partition, batch
size and model as experiments/fmnist-fedsup (synthetic 28x28 images of Fashion-MNIST's
shape, so no data files are needed); the time of ``ClientHalf.run`` divided by the steps
is the step cost. FedSup's target: at most 2.5x FixMatch's step (issue: two forward passes
of the target without gradient, one of the online network with it). Writes
``--out/ssl_step.json`` and prints a markdown table.

    python benchmarks/ssl_step.py --steps 20 --repeats 3 --out results/ssl-step
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from flwr.app import ConfigRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from ssfl.experiment import resolve_experiment
from ssfl.registry import method, settings_of
from strategies.loop import RoundStats
from strategies.parts import ServerSide
from tasks.partition import get_split

ROOT = Path(__file__).resolve().parents[1]
CELLS = ("fixmatch", "fedsup", "simclr", "simsiam", "byol")


def client_for(name: str, steps: int):
    """The cell's client half for partition 0 in round 1, as a message would build it."""
    settings = settings_of(
        resolve_experiment(
            ROOT / f"experiments/fmnist-fedsup/{name}.yaml",
            sets=[
                "dataset.name=synthetic28",
                "dataset.synthetic_train_size=60000",
                "dataset.synthetic_test_size=5000",
                "client.epochs=0",
                f"client.local_steps={steps}",
                "device=cpu",
            ],
        )
    )
    ds, split = get_split(settings)
    server = ServerSide.build(settings, ds, split, torch.device("cpu"))
    spec = method(settings.method)
    strategy = spec.server_half().strategy(server, lambda row: None)
    strategy.nodes = {pid: pid for pid in range(settings.split.num_clients)}
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0  # no SuperLink
    message = strategy.messages(1, server.arrays(), ConfigRecord(), RoundStats())[0]
    pid = message.metadata.dst_node_id
    return lambda: spec.client_half()(message.content, RecordDict(), pid)


def step_seconds(name: str, steps: int, repeats: int) -> float:
    """Median over ``repeats`` of one round's local training time per step."""
    make = client_for(name, steps)
    times = []
    for _ in range(repeats):
        client = make()
        started = time.perf_counter()
        metrics = client.run()
        times.append((time.perf_counter() - started) / metrics["local_steps"])
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (a client's CPU)")
    parser.add_argument("--out", default="results/ssl-step")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    seconds = {name: step_seconds(name, args.steps, args.repeats) for name in CELLS}
    base = seconds["fixmatch"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"steps": args.steps, "repeats": args.repeats, "threads": args.threads}
    result["seconds_per_step"] = seconds
    (out / "ssl_step.json").write_text(json.dumps(result, indent=2))
    print("| client | ms per step (batch 128) | x FixMatch |\n|---|---|---|")
    for name, sec in seconds.items():
        print(f"| {name} | {1000 * sec:.1f} | {sec / base:.2f} |")


if __name__ == "__main__":
    main()

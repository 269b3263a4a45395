"""What cohort execution's partial sums (simulation.partial_sums) save the server per round.

For a model's state dict (random values, the real shapes), ``--clients`` clients split over
``--workers`` workers (partition p to worker p mod W, as in simulation): the server's
aggregation from every client's model (each reply's ArrayRecord decoded, then FedAvg's
float64 sum, :func:`tasks.aggregate.weighted_average`) against the workers' partial sums
(each worker sums its clients, :func:`tasks.aggregate.partial_sum`; the server decodes W sums
and divides, :func:`tasks.aggregate.mean_of_partial_sums`), on one thread, best of
``--repeat``; and the bytes the replies carry both ways. Writes ``--json`` and prints it.

    python benchmarks/partial_sums.py --model resnet18 --json results/partial-sums/resnet18.json
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from ssfl import cohort
from ssfl.records import record_arrays, to_record
from tasks.aggregate import mean_of_partial_sums, partial_sum, weighted_average
from tasks.models import build_model
from tasks.results import host

SIZES = {"small_cnn": (1, 28), "resnet18": (3, 32)}  # (channels, image size)


def client_states(model: str, clients: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """``clients`` random state dicts with ``model``'s keys, shapes and dtypes."""
    channels, size = SIZES[model]
    reference = build_model(model, channels, 10, size, "bn", [0.5] * channels, [0.5] * channels)
    rng = np.random.default_rng(seed)
    return [
        {
            k: (
                rng.standard_normal(v.shape).astype(np.float32)
                if v.is_floating_point()
                else v.numpy().copy()
            )
            for k, v in reference.state_dict().items()
        }
        for _ in range(clients)
    ]


def best_of(repeat: int, fn: Callable[[], object]) -> float:
    """The shortest of ``repeat`` timed calls (seconds)."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def report(result: dict, path: Path | None) -> None:
    """Print ``result`` as JSON and, with ``path``, write it there (its folder made)."""
    text = json.dumps(result, indent=2)
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    print(text)


def measure(model: str, clients: int, workers: int, repeat: int) -> dict:
    """Seconds and bytes of one round's aggregation both ways."""
    states = client_states(model, clients)
    weights = [float(100 + pid) for pid in range(clients)]
    records = [to_record(s) for s in states]
    groups = cohort.assign(list(range(clients)), workers)
    sums = [partial_sum(g, [states[p] for p in g], [weights[p] for p in g]) for g in groups if g]
    sum_records = [to_record(part.sums) for part in sums]

    def per_client() -> object:
        return weighted_average([record_arrays(r) for r in records], weights)

    def from_sums() -> object:
        parts = [
            type(part)(part.pids, record_arrays(r), part.weight)
            for part, r in zip(sums, sum_records)
        ]
        return mean_of_partial_sums(parts, {k: v.dtype for k, v in states[0].items()})

    def worker_sums() -> object:
        return [partial_sum(g, [states[p] for p in g], [weights[p] for p in g]) for g in groups]

    gap = max(
        float(np.abs(per_client()[k] - from_sums()[k]).max())
        for k in states[0]
        if states[0][k].dtype.kind == "f"
    )
    return {
        "model": model,
        "clients": clients,
        "workers": workers,
        "parameters": int(sum(v.size for v in states[0].values())),
        "server_seconds_per_client_models": best_of(repeat, per_client),
        "server_seconds_from_sums": best_of(repeat, from_sums),
        "worker_seconds_summing_all": best_of(repeat, worker_sums),
        "reply_bytes_per_client_models": sum(cohort.array_sizes(r)[0] for r in records),
        "reply_bytes_sums": sum(cohort.array_sizes(r)[0] for r in sum_records),
        "max_abs_difference": gap,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(SIZES), default="resnet18")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write the result here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    result = {**measure(args.model, args.clients, args.workers, args.repeat), "host": host()}
    report(result, args.json)


if __name__ == "__main__":
    main()

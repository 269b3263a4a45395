"""How a simulation grows with the number of clients: peak memory, start-up and round time.

Runs ``ssfl run EXP`` for ``--rounds`` rounds at each client count N of ``--clients``, with
the same ``--per-round`` clients sampled every round and the same ``--client-size`` images
per client, so a round's work is the same at every N and anything that grows with N is
overhead. Per N it records the peak summed RSS of the run's whole process tree, the
start-up time (wall time not spent in rounds) and the steady round time (the mean of
rounds 2.., the first round alone when there is one). Writes ``--json`` and a plot beside it,
and prints a markdown table.

    python benchmarks/scale.py experiments/fmnist-las/fedavg_fixmatch.yaml \
        --clients 10,100,1000 --json results/scale/fedavg_fixmatch.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from peak_memory import GIB, TreePeak

from tasks.results import host

ROOT = Path(__file__).resolve().parents[1]


def run_at(experiment: str, clients: int, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """One run with ``clients`` clients: its peak RSS, start-up and steady round seconds."""
    sets = [
        f"split.num_clients={clients}",
        f"split.client_size={args.client_size}",
        f"federation.clients_per_round={args.per_round}",
        *args.set,
    ]
    cmd = [sys.executable, "-m", "ssfl.cli", "run", experiment, "--rounds", str(args.rounds)]
    cmd += [f"--set={kv}" for kv in sets] + ["--out", str(out), "--overwrite", "--quiet"]
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT)
    with TreePeak(proc.pid, args.interval) as peak:
        rc = proc.wait()
    if rc != 0:
        sys.exit(f"scale: ssfl run with {clients} clients exited {rc}")
    wall = time.perf_counter() - started
    seconds = [r["seconds"] for r in json.loads((out / "results.json").read_text())["rounds"]]
    return {
        "clients": clients,
        "peak_rss_gib": peak.peak / GIB,
        "startup_seconds": wall - sum(seconds),
        "round_seconds": statistics.fmean(seconds[1:] or seconds),
        "wall_seconds": wall,
        "processes_at_peak": peak.processes,
        "rounds_seconds": seconds,
    }


def plot(runs: list[dict[str, Any]], title: str, path: Path) -> None:
    """Peak RSS and steady round time against the client count (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    clients = [r["clients"] for r in runs]
    fig, (mem, rnd) = plt.subplots(1, 2, figsize=(9, 3.5))
    mem.plot(clients, [r["peak_rss_gib"] for r in runs], marker="o")
    mem.set(xscale="log", xlabel="clients", ylabel="peak RSS, GiB", ylim=(0, None))
    rnd.plot(clients, [r["round_seconds"] for r in runs], marker="o", label="steady round")
    rnd.plot(clients, [r["startup_seconds"] for r in runs], marker="s", label="start-up")
    rnd.set(xscale="log", xlabel="clients", ylabel="seconds", ylim=(0, None))
    rnd.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_counts(text: str) -> list[int]:
    """``10,100,1000`` -> [10, 100, 1000]; anything else exits with one line."""
    try:
        counts = [int(item) for item in text.split(",")]
    except ValueError:
        sys.exit(f"scale: --clients {text!r}: expected integers separated by commas")
    if not counts or min(counts) < 1:
        sys.exit(f"scale: --clients {text!r}: every count must be at least 1")
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiment")
    parser.add_argument("--clients", default="10,100,1000", help="client counts, e.g. 10,100")
    parser.add_argument("--json", required=True, help="the results file (a .png goes beside it)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--per-round", type=int, default=10, help="clients sampled a round")
    parser.add_argument("--client-size", type=int, default=50, help="images per client")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--interval", type=float, default=0.25, help="seconds between samples")
    args = parser.parse_args()
    counts = parse_counts(args.clients)
    if min(counts) < args.per_round:
        sys.exit(f"scale: every client count must be at least --per-round ({args.per_round})")
    target = Path(args.json)
    target.parent.mkdir(parents=True, exist_ok=True)
    runs = []
    with tempfile.TemporaryDirectory(prefix="ssfl-scale-") as scratch:
        for clients in counts:
            runs.append(run_at(args.experiment, clients, args, Path(scratch) / str(clients)))
            print(f"scale: {clients} clients done ({runs[-1]['wall_seconds']:.0f} s)", flush=True)
    report = {
        "experiment": args.experiment,
        "rounds": args.rounds,
        "per_round": args.per_round,
        "client_size": args.client_size,
        "sets": args.set,
        "host": host(),
        "runs": runs,
    }
    target.write_text(json.dumps(report, indent=2) + "\n")
    plot(runs, Path(args.experiment).stem, target.with_suffix(".png"))
    base = runs[0]["round_seconds"]
    print("| clients | peak RSS GiB | start-up s | steady round s | round / first N's |")
    print("|---|---|---|---|---|")
    for r in runs:
        print(
            f"| {r['clients']} | {r['peak_rss_gib']:.2f} | {r['startup_seconds']:.1f} | "
            f"{r['round_seconds']:.2f} | {r['round_seconds'] / base:.2f} |"
        )


if __name__ == "__main__":
    main()

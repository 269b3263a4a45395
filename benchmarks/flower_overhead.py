"""Flower overhead: a fedavg_sl run under ``ssfl run`` against a plain PyTorch loop.

Both do the same SGD work (same split, model, seeds, client order, FedAvg and test
evaluation). Reports steady-state seconds per round (rounds 2..N), start-up cost
(wall time not spent in rounds) and the peak summed RSS of every process the run
started. Writes ``--out/overhead.json`` and prints a markdown table.

    python benchmarks/flower_overhead.py --data-dir ../shared/data --rounds 10 \
        --out results/overhead
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from peak_memory import TreePeak

from ssfl.experiment import resolve_experiment
from ssfl.registry import settings_of
from strategies.parts import ServerSide
from tasks.aggregate import weighted_average
from tasks.augment import WeakAugment
from tasks.models import model_for
from tasks.partition import get_split
from tasks.settings import Settings
from tasks.train import derive_seed, evaluate, make_sgd, seeded, supervised_epochs, to_float

ROOT = Path(__file__).resolve().parents[1]

EXPERIMENT = ROOT / "experiments/fmnist-las/fedavg_sl.yaml"


def plain_loop(settings: Settings, rounds: int) -> dict:
    """FedAvg-SL with no Flower: clients in partition order, the same seeds as the app."""
    t0 = time.perf_counter()
    ds, split = get_split(settings)
    device = torch.device("cpu")
    server = ServerSide.build(settings, ds, split, device)
    weak = WeakAugment(ds.image_size, ds.flip, settings.augment.weak_shift)
    clients = [(to_float(ds.train_x[idx], device), ds.train_y[idx]) for idx in split.clients]
    local = model_for(settings.model, ds)
    ccfg = settings.client
    startup = time.perf_counter() - t0
    times, accs = [], []
    for rnd in range(1, rounds + 1):
        start = time.perf_counter()
        global_state = {k: v.clone() for k, v in server.model.state_dict().items()}
        updates, weights = [], []
        for pid, (x, y) in enumerate(clients):
            local.load_state_dict(global_state)
            opt = make_sgd(
                local.parameters(),
                ccfg.lr * ccfg.lr_decay ** (rnd - 1),
                ccfg.momentum,
                ccfg.weight_decay,
            )
            with seeded(derive_seed(settings.seed, "client", pid, rnd)) as gen:
                supervised_epochs(
                    local,
                    x,
                    y,
                    epochs=ccfg.epochs,
                    optimizer=opt,
                    batch_size=ccfg.batch_size,
                    generator=gen,
                    augment=weak,
                )
            updates.append({k: v.detach().numpy().copy() for k, v in local.state_dict().items()})
            weights.append(len(x))
        avg = weighted_average(updates, weights)
        server.model.load_state_dict({k: torch.from_numpy(v) for k, v in avg.items()})
        acc, _ = evaluate(server.model, server.test_x, server.test_y, settings.eval.batch_size)
        times.append(time.perf_counter() - start)
        accs.append(acc)
    return {"startup_s": startup, "round_s": times, "accuracy": accs}


def flower_run(args, out: Path) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "ssfl.cli",
        "run",
        str(EXPERIMENT),
        "--rounds",
        str(args.rounds),
        "--set",
        f"dataset.root={args.data_dir}",
        "--out",
        str(out),
        "--overwrite",
        "--quiet",
    ]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT)
    with TreePeak(proc.pid, interval=0.25) as peak:
        if proc.wait() != 0:
            raise subprocess.CalledProcessError(proc.returncode, cmd)
    wall = time.perf_counter() - t0
    res = json.loads((out / "results.json").read_text())
    times = [r["seconds"] for r in res["rounds"]]
    return {
        "wall_s": wall,
        "startup_s": wall - sum(times),
        "round_s": times,
        "accuracy": [r["test_accuracy"] for r in res["rounds"]],
        "peak_rss_bytes": peak.peak,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--out", default="results/overhead")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    args.data_dir = str(Path(args.data_dir).resolve())

    flower = flower_run(args, out / "flower")
    settings = settings_of(
        resolve_experiment(EXPERIMENT, args.rounds, sets=[f"dataset.root={args.data_dir}"])
    )
    with TreePeak(os.getpid(), interval=0.25) as mem_plain:
        plain = plain_loop(settings, args.rounds)
    plain["peak_rss_bytes"] = mem_plain.peak

    def steady(times):
        return statistics.mean(times[1:]) if len(times) > 1 else times[0]

    report = {
        "rounds": args.rounds,
        "torch_threads": torch.get_num_threads(),
        "flower": {**flower, "steady_round_s": steady(flower["round_s"])},
        "plain": {**plain, "steady_round_s": steady(plain["round_s"])},
    }
    report["ratio"] = report["flower"]["steady_round_s"] / report["plain"]["steady_round_s"]
    (out / "overhead.json").write_text(json.dumps(report, indent=2))
    gib = 1024**3
    print("| | steady s/round | start-up s | peak RSS GiB | final acc |")
    print("|---|---|---|---|---|")
    for name in ("flower", "plain"):
        r = report[name]
        print(
            f"| {name} | {r['steady_round_s']:.2f} | {r['startup_s']:.1f} | "
            f"{r['peak_rss_bytes'] / gib:.2f} | {r['accuracy'][-1]:.4f} |"
        )
    print(f"\nFlower / plain steady-state ratio: {report['ratio']:.3f}")
    print(
        f"final accuracies equal to 4 decimals: "
        f"{np.isclose(flower['accuracy'][-1], plain['accuracy'][-1], atol=5e-5)}"
    )


if __name__ == "__main__":
    main()

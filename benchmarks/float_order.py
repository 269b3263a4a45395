"""How much a CPU run's numbers depend on the instruction set and the thread count.

The small CNN (docs/reference.md, "Determinism") takes ``--steps`` SGD steps on one fixed
synthetic batch, once per (instruction set, threads) pair, each in a fresh process with
``ATEN_CPU_CAPABILITY`` set or not (torch dispatches its CPU kernels at import); the largest weight
difference against the first pair says whether the same seed gives the same numbers there.
Writes ``--out/float_order.json`` and prints a markdown table.

    python benchmarks/float_order.py --out results/float-order
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def trained_weights(steps: int) -> torch.Tensor:
    """The small CNN's weights, flattened, after ``steps`` seeded SGD steps on one batch."""
    from tasks.models import build_model

    torch.manual_seed(0)
    model = build_model("small_cnn", 1, 10, 28, "bn", [0.5], [0.5])
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(1)
    x = torch.rand(128, 1, 28, 28, generator=gen)
    y = torch.randint(0, 10, (128,), generator=gen)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def run_pair(capability: str, threads: int, steps: int, out: Path) -> dict:
    """Train in a fresh process under ``capability`` ("native": the CPU's best, else one of
    torch's names: avx512, avx2, default) and ``threads``; its weights and what torch
    dispatched to."""
    file = out / f"weights-{capability}-{threads}.pt"
    code = (
        "import sys, torch; sys.path.insert(0, sys.argv[1]);"
        "from benchmarks.float_order import trained_weights;"
        "torch.set_num_threads(int(sys.argv[2]));"
        "torch.save({'w': trained_weights(int(sys.argv[3])),"
        " 'dispatched': torch.backends.cpu.get_cpu_capability()}, sys.argv[4])"
    )
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    if capability != "native":
        env["ATEN_CPU_CAPABILITY"] = capability
    subprocess.run(
        [sys.executable, "-c", code, str(ROOT), str(threads), str(steps), str(file)],
        env=env,
        check=True,
    )
    saved = torch.load(file)
    file.unlink()
    return saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--capabilities", default="native,avx2")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", type=Path, default=ROOT / "results/float-order")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows, first = [], None
    for capability in args.capabilities.split(","):
        for threads in map(int, args.threads.split(",")):
            saved = run_pair(capability, threads, args.steps, args.out)
            first = saved["w"] if first is None else first
            rows.append(
                {
                    "capability": capability,
                    "dispatched": saved["dispatched"],
                    "threads": threads,
                    "weight_sum": float(saved["w"].double().sum()),
                    "max_abs_diff": float((saved["w"] - first).abs().max()),
                }
            )
    (args.out / "float_order.json").write_text(json.dumps(rows, indent=2))
    print("| ATEN_CPU_CAPABILITY | dispatched | threads | weight sum | max abs diff to row 1 |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['capability']} | {r['dispatched']} | {r['threads']} | "
            f"{r['weight_sum']:.6f} | {r['max_abs_diff']:.2e} |"
        )


if __name__ == "__main__":
    main()

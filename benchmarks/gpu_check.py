"""One check of a GPU box in minutes: versions, every method under ``ssfl run`` with GPU
shares, a client's training step against a bare torch loop, round time and GPU use, and
a ResNet-18 cell at CIFAR-10 sizes. Writes one JSON (``scripts/gpu-check.sh`` wraps it).

Every step has a time budget (and the whole check one); a step that fails or runs out
of time is recorded in the JSON with its one-line reason, and the check goes on. Each
step prints one summary line as it ends. ``--cpu`` runs the same steps on the CPU at
tiny sizes (CI). ``--steps`` runs some steps only (``stacked``, a round's clients trained
at once against one after another, and ``cells``, a sweep's cells one after another against
all at once with ``--jobs``, only where they are named); ``--execution`` and ``--engine`` set the
round and CIFAR steps' ``simulation.execution`` and ``augment.engine`` (``--partial-sums``:
and cohort mode's partial sums; an A/B of cohort
execution and the sync-free augmentation on a GPU, against a default check's JSON).

    python -m benchmarks.gpu_check --json gpu-check.json [--cpu] [--methods a,b] [--keep DIR]
    python -m benchmarks.gpu_check --steps round,cifar --execution cohort --engine batched
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import yaml

from tasks.settings import EXECUTIONS, AugmentSettings, choices_of

ROOT = Path(__file__).resolve().parents[1]

# Method order: the issue's methods first, so a short budget still covers them.
FIRST = ("fedseal", "fedmatch", "fedavg_fixmatch", "fedsup", "fedossl", "fedavg_with_server")

# Per method, what it needs beyond the shared tiny experiment (labels at the clients for
# FedoSSL's open world; rounds of T steps for the SSFL benchmark's methods).
METHOD_SETTINGS: dict[str, dict[str, Any]] = {
    "fedmatch": {"algo": {"helper_interval": 1, "num_helpers": 1}},
    "fedsup": {"eval": {"protocol_every": 2, "finetune_epochs": 1, "linear_epochs": 1}},
    "fedrgd": {"server": {"bootstrap_epochs": 0, "epochs": 0, "local_steps": 2}},
    "fedavg_with_server": {"server": {"bootstrap_epochs": 0, "epochs": 0, "local_steps": 2}},
    "fedossl": {
        "split": {"labeled_per_class": 0, "val_size": 0, "samples_per_class": 8},
        "algo": {
            "cluster_from_round": 1,
            "ce_from_round": 1,
            "local_centroids": 4,
            "centroid_samples": 8,
            "server_cluster_steps": 5,
        },
    },
}
STEP_METHODS = ("fedrgd", "fedavg_with_server")
# Sections a method refuses to have set (FedoSSL's server does not train: no server keys).
WITHOUT: dict[str, tuple[str, ...]] = {"fedossl": ("server",)}


@dataclass(frozen=True)
class Sizes:
    """The sizes of one mode (GPU or CPU) and each step's time budget in seconds."""

    train_images: int
    client_images: int
    clients: int
    batch: int
    steps: int  # timed steps of the training-step comparison
    cnn_batch: int  # unlabeled batch of the small CNN (fmnist-las: 32)
    resnet_batch: int  # unlabeled batch of ResNet-18 (FixMatch: mu * B = 7 * 64)
    round_clients: int
    round_images: int
    cifar_train: int
    cifar_test: int
    cifar_rounds: int
    cifar_steps: int  # T local steps of the CIFAR cell
    cifar_batch: int
    budgets: Mapping[str, float]
    jobs: int  # method runs at once


GPU = Sizes(
    train_images=2000,
    client_images=200,
    clients=4,
    batch=32,
    steps=20,
    cnn_batch=32,
    resnet_batch=448,
    round_clients=10,
    round_images=500,
    cifar_train=50000,
    cifar_test=10000,
    cifar_rounds=3,
    cifar_steps=16,
    cifar_batch=64,
    budgets={
        "environment": 20,
        "methods": 240,
        "training_step": 40,
        "round": 75,
        "cifar": 95,
        "stacked": 60,
        "cells": 420,
    },
    jobs=4,  # an H200 box has 16 cores: four runs start at once (each ~55 s of start-up)
)
CPU = Sizes(
    train_images=300,
    client_images=16,
    clients=3,
    batch=16,
    steps=2,
    cnn_batch=16,
    resnet_batch=8,
    round_clients=3,
    round_images=32,
    cifar_train=400,
    cifar_test=100,
    cifar_rounds=2,
    cifar_steps=1,
    cifar_batch=8,
    budgets={
        "environment": 60,
        "methods": 900,
        "training_step": 180,
        "round": 180,
        "cifar": 300,
        "stacked": 120,
        "cells": 300,
    },
    jobs=1,  # CI's 2 cores run two tests at once already: more Ray starts time out
)
# Seconds for the whole check: on a GPU within 8 minutes (the check's promise); on a CPU
# (CI) the tiny runs still pay every start-up of `ssfl run` on few cores.
TOTAL_BUDGET_S = {"gpu": 470.0, "cpu": 1500.0}


def log(line: str) -> None:
    print(f"gpu-check: {line}", flush=True)


def one_line(text: str, limit: int = 300) -> str:
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else "no output")[:limit]


def failure_lines(stderr: str, limit: int = 1000) -> str:
    """A failed ``ssfl`` command's reasons: its ``ssfl...failed: ...`` lines joined (a
    sweep's last line only names the failed cells, their errors come before it), else its
    last line."""
    failed = [
        ln.strip() for ln in stderr.splitlines() if ln.startswith("ssfl") and " failed: " in ln
    ]
    return " | ".join(failed)[:limit] if failed else one_line(stderr, limit)


# ----- GPU utilisation -----------------------------------------------------------------
class UtilSampler:
    """Samples GPU utilisation (%) and memory in use (MiB) every ``period`` seconds with
    nvidia-smi while it is open; no samples without nvidia-smi (e.g. on CPU)."""

    def __init__(self, enabled: bool, period: float = 0.5):
        self.enabled = enabled and shutil.which("nvidia-smi") is not None
        self.period = period
        self.samples: list[tuple[float, float, float]] = []  # (time.time(), util, MiB)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> UtilSampler:
        if self.enabled:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.enabled:
            self.thread.join(timeout=5)

    def _loop(self) -> None:
        query = ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader"]
        while not self.stop.is_set():
            out = subprocess.run(query, capture_output=True, text=True, timeout=10).stdout
            for line in out.splitlines()[:1]:
                util, mem = (field.strip().split()[0] for field in line.split(","))
                self.samples.append((time.time(), float(util), float(mem)))
            self.stop.wait(self.period)

    def summary(self) -> dict[str, Any]:
        """Mean and peak utilisation and peak memory of the samples (None without any)."""
        if not self.samples:
            return {"gpu_util_mean": None, "gpu_util_max": None, "gpu_mem_max_mib": None}
        utils = [u for _, u, _ in self.samples]
        return {
            "gpu_util_mean": round(statistics.fmean(utils), 1),
            "gpu_util_max": max(utils),
            "gpu_mem_max_mib": max(m for _, _, m in self.samples),
            "gpu_util_samples": len(utils),
        }

    def steady(self, timeline: Mapping[str, float]) -> dict[str, Any]:
        """Mean utilisation over a run's steady rounds only (from the end of its first round
        to the end of its last: start-up, the first round and shut-down left out), and the
        samples it took (None without any)."""
        start, end = timeline.get("first_round_ended"), timeline.get("rounds_ended")
        inside = [u for t, u, _ in self.samples if start is not None and start <= t <= end]
        mean = round(statistics.fmean(inside), 1) if inside else None
        return {"gpu_util_steady_mean": mean, "gpu_util_steady_samples": len(inside)}


def phases(timeline: Mapping[str, float], started: float) -> dict[str, float | None]:
    """A run's wall time by phase (seconds): start-up (the command to the first round),
    the first round, the steady rounds, shut-down (the last round's end to the results)."""
    marks = [
        ("startup", started, timeline.get("first_round")),
        ("first_round", timeline.get("first_round"), timeline.get("first_round_ended")),
        ("steady_rounds", timeline.get("first_round_ended"), timeline.get("rounds_ended")),
        ("shutdown", timeline.get("rounds_ended"), timeline.get("finished")),
    ]
    return {
        f"{name}_seconds": None if a is None or b is None else round(b - a, 3)
        for name, a, b in marks
    }


# ----- Steps ---------------------------------------------------------------------------
def package_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def environment(ctx: Context) -> dict[str, Any]:
    """Versions, the GPU and its driver."""
    import torch

    out: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "cuda_available": torch.cuda.is_available(),
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "cpus": os.cpu_count(),
        **{name: package_version(name) for name in ("flwr", "ray", "torchvision", "kornia")},
    }
    if shutil.which("nvidia-smi"):
        query = ["nvidia-smi", "--query-gpu=driver_version,memory.total", "--format=csv,noheader"]
        out["nvidia_smi"] = subprocess.run(query, capture_output=True, text=True, timeout=10).stdout
    if not ctx.cpu and not out["cuda_available"]:
        raise RuntimeError("torch sees no CUDA GPU (run with --cpu on a machine without one)")
    return out


def tiny_experiment(method: str, ctx: Context) -> dict[str, Any]:
    """A 2-round experiment of ``method`` on synthetic28 at the mode's sizes."""
    s = ctx.sizes
    raw: dict[str, Any] = {
        "method": method,
        "name": f"gpu-check-{method}",
        "rounds": 2,
        "device": ctx.device,
        "dataset": {
            "name": "synthetic28",
            "synthetic_train_size": s.train_images,
            "synthetic_test_size": max(40, s.train_images // 5),
        },
        "split": {
            "labeled_per_class": 2,
            "val_size": 20,
            "test_size": 40,
            "num_clients": s.clients,
            "client_size": s.client_images,
        },
        "server": {"bootstrap_epochs": 1, "epochs": 1, "batch_size": s.batch},
        "client": {"batch_size": s.batch, **({"local_steps": 2} if method in STEP_METHODS else {})},
        # The clients' models tested too; FedSup's protocols (5.1.2) at the last round.
        "eval": {"local_models": True},
    }
    for key, values in METHOD_SETTINGS.get(method, {}).items():
        raw[key] = {**raw.get(key, {}), **values}
    for key in WITHOUT.get(method, ()):
        raw.pop(key)
    return raw


def ssfl_cli(args: list[str], sets: tuple[str, ...], timeout: float) -> dict[str, Any]:
    """``python -m ssfl.cli ARGS --set ...`` within ``timeout`` seconds: its status
    (ok, failed with the error's last line, timeout) and wall seconds."""
    cmd = [sys.executable, "-m", "ssfl.cli", *args]
    for item in sets:
        cmd += ["--set", item]
    started = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, cwd=ROOT, capture_output=True, text=True, timeout=max(timeout, 1.0)
        )
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "seconds": round(time.perf_counter() - started, 1)}
    seconds = round(time.perf_counter() - started, 1)
    if proc.returncode != 0:
        return {"status": "failed", "seconds": seconds, "error": failure_lines(proc.stderr)}
    return {"status": "ok", "seconds": seconds}


def ssfl_run(
    raw: Mapping[str, Any], out: Path, timeout: float, sets: tuple[str, ...] = ()
) -> dict[str, Any]:
    """``python -m ssfl.cli run`` of an experiment mapping; its results and wall time."""
    out.mkdir(parents=True, exist_ok=True)
    exp = out / "experiment.yaml"
    exp.write_text(yaml.safe_dump(dict(raw), sort_keys=False))
    wall_started = time.time()
    ran = ssfl_cli(["run", str(exp), "--out", str(out), "--quiet"], sets, timeout)
    if ran["status"] != "ok":
        return ran
    results = json.loads((out / "results.json").read_text())
    rounds = results["rounds"]
    return {
        **ran,
        "final_test_accuracy": results["final_test_accuracy"],
        "round_seconds": [round(r["seconds"], 3) for r in rounds],
        "devices": results.get("devices"),
        "timeline": results.get("timeline", {}),
        "phases": phases(results.get("timeline", {}), wall_started),
    }


def method_runs(ctx: Context) -> dict[str, Any]:
    """Every registered method (or --methods) for 2 rounds under ``ssfl run``."""
    from ssfl.gpu import client_gpu_share, gpu_count
    from ssfl.registry import METHODS

    names = ctx.methods or [*FIRST, *sorted(set(METHODS) - set(FIRST))]
    deadline = time.monotonic() + ctx.budget

    def one(name: str) -> dict[str, Any]:
        left = deadline - time.monotonic()
        if left < 5:
            return {"status": "skipped", "error": "out of the step's time budget"}
        result = ssfl_run(tiny_experiment(name, ctx), ctx.work / "methods" / name, left)
        log(f"  {name}: {result['status']} in {result.get('seconds', 0)}s")
        return result

    from ssfl.experiment import resolve_config
    from ssfl.registry import settings_of

    share = client_gpu_share(
        settings_of(resolve_config(tiny_experiment("fedavg_fixmatch", ctx))), gpu_count()
    )
    with UtilSampler(not ctx.cpu) as sampler, ThreadPoolExecutor(ctx.sizes.jobs) as pool:
        runs = dict(zip(names, pool.map(one, names)))
    ok = [n for n, r in runs.items() if r["status"] == "ok"]
    devices = next((runs[n]["devices"] for n in ok), None)
    failed = [n for n in names if n not in ok]
    if failed:
        ctx.problems.append(f"methods not ok: {', '.join(failed)}")
    return {
        "gpu_share": share,
        "jobs": ctx.sizes.jobs,
        "ok": len(ok),
        "of": len(names),
        "client_devices": devices,
        **sampler.summary(),
        "runs": runs,
    }


def round_experiment(ctx: Context) -> dict[str, Any]:
    """FedAvg-FixMatch (small CNN) on ``round_clients`` clients for 3 rounds."""
    s = ctx.sizes
    raw = tiny_experiment("fedavg_fixmatch", ctx)
    raw["rounds"] = 3
    raw["dataset"]["synthetic_train_size"] = s.round_clients * s.round_images + 400
    raw["split"].update(num_clients=s.round_clients, client_size=s.round_images)
    return raw


def round_time(ctx: Context) -> dict[str, Any]:
    """FedAvg-FixMatch (small CNN) on more clients for 3 rounds: round seconds and GPU use."""
    s = ctx.sizes
    with UtilSampler(not ctx.cpu) as sampler:
        result = ssfl_run(round_experiment(ctx), ctx.work / "round", ctx.budget, ctx.round_sets())
    if result["status"] != "ok":
        raise RuntimeError(f"the run {result['status']}: {result.get('error', '')}")
    later = result["round_seconds"][1:] or result["round_seconds"]
    return {
        "clients": s.round_clients,
        "images_per_client": s.round_images,
        "round_seconds_mean_after_first": round(statistics.fmean(later), 3),
        **result,
        **sampler.summary(),
        **sampler.steady(result["timeline"]),
    }


def cifar_cell(ctx: Context) -> dict[str, Any]:
    """The SSFL benchmark's CIFAR-10 cell (GroupNorm ResNet-18, CRL, T steps) on synthetic32
    at CIFAR-10's sizes for a few rounds."""
    s = ctx.sizes
    sets = (
        "dataset.name=synthetic32",
        f"dataset.synthetic_train_size={s.cifar_train}",
        f"dataset.synthetic_test_size={s.cifar_test}",
        f"rounds={s.cifar_rounds}",
        f"device={ctx.device}",
        "simulation.num_gpus=-1",
        f"client.local_steps={s.cifar_steps}",
        f"server.local_steps={s.cifar_steps}",
        f"client.batch_size={s.cifar_batch}",
        f"server.batch_size={s.cifar_batch}",
        f"eval.every={s.cifar_rounds}",
    )
    tiny = ("split.labeled_per_class=2", "split.client_size=16", "split.num_clients=3")
    tiny = tiny if ctx.cpu else ()
    raw = yaml.safe_load((ROOT / "experiments/ssfl-cifar10/crl_gn.yaml").read_text())
    with UtilSampler(not ctx.cpu) as sampler:
        result = ssfl_run(raw, ctx.work / "cifar", ctx.budget, sets + tiny + ctx.round_sets())
    if result["status"] != "ok":
        raise RuntimeError(f"the run {result['status']}: {result.get('error', '')}")
    return {
        "train_images": s.cifar_train,
        "test_images": s.cifar_test,
        **result,
        **sampler.summary(),
        **sampler.steady(result["timeline"]),
    }


# ----- A client's training step against a bare torch loop ------------------------------
def training_step(ctx: Context) -> dict[str, Any]:
    """Small CNN (Fashion-MNIST shape) and ResNet-18 (CIFAR shape) at a paper batch, fp32 and
    bf16 + channels-last (bf16 on the GPU only): benchmarks/gpu_step.py."""
    from benchmarks.gpu_step import case

    s = ctx.sizes
    cases = [("small_cnn", "synthetic28", s.cnn_batch), ("resnet18", "synthetic32", s.resnet_batch)]
    amps = ("off",) if ctx.cpu else ("off", "bf16")
    deadline = time.monotonic() + ctx.budget
    out = []
    for model_name, dataset, batch in cases:
        for amp in amps:
            if time.monotonic() > deadline:
                out.append({"model": model_name, "amp": amp, "status": "skipped"})
                continue
            out.append(case(model_name, dataset, batch, amp, s.steps, ctx.device))
            log(f"  {model_name} amp={amp}: {out[-1]}")
    return {"steps": s.steps, "cases": out}


# ----- K clients trained at once (optional) ----------------------------------------------
def stacked_clients(ctx: Context) -> dict[str, Any]:
    """A round's clients (``round_clients``) of GroupNorm models, the small CNN at its batch
    and ResNet-18 at the CIFAR cell's, trained one after another against all at once with
    stacked weights (benchmarks/gpu_step.py: ``stacked_case``): whether a cohort worker
    would gain by training its clients together. Not in the default check (``--steps
    stacked``)."""
    from benchmarks.gpu_step import stacked_case

    s = ctx.sizes
    cases = [("small_cnn", "synthetic28", s.cnn_batch), ("resnet18", "synthetic32", s.cifar_batch)]
    deadline = time.monotonic() + ctx.budget
    out = []
    for model_name, dataset, batch in cases:
        if time.monotonic() > deadline:
            out.append({"model": model_name, "status": "skipped"})
            continue
        out.append(stacked_case(model_name, dataset, batch, s.round_clients, s.steps, ctx.device))
        log(f"  {model_name} x {s.round_clients} clients: {out[-1]}")
    return {"steps": s.steps, "cases": out}


# ----- Cells at once (optional) ------------------------------------------------------------
def ssfl_sweep(
    exp: Path, seeds: int, jobs: int, out: Path, timeout: float, sets: tuple[str, ...]
) -> dict[str, Any]:
    """``ssfl sweep EXP --set-grid seed=0,...`` with ``--jobs``: wall seconds and each
    cell's final accuracy."""
    grid = "seed=" + ",".join(str(seed) for seed in range(seeds))
    args = ["sweep", str(exp), "--set-grid", grid, "--jobs", str(jobs), "--out", str(out)]
    ran = ssfl_cli(args, sets, timeout)
    if ran["status"] != "ok":
        return ran
    finals = [
        json.loads((out / f"seed={seed}" / "results.json").read_text())["final_test_accuracy"]
        for seed in range(seeds)
    ]
    return {**ran, "final_test_accuracies": finals}


def cells_at_once(ctx: Context) -> dict[str, Any]:
    """The round step's experiment as a sweep over ``max(2, jobs)`` seeds, one cell after
    another and then all at once (``--jobs``): wall seconds, GPU use, and whether the
    numbers are the same both ways. Not in the default check (``--steps cells``)."""
    cells = max(2, ctx.sizes.jobs)
    exp = ctx.work / "cells" / "experiment.yaml"
    exp.parent.mkdir(parents=True, exist_ok=True)
    exp.write_text(yaml.safe_dump(round_experiment(ctx), sort_keys=False))
    deadline = time.monotonic() + ctx.budget
    runs = {}
    for jobs in (1, cells):
        out = ctx.work / "cells" / f"jobs{jobs}"
        with UtilSampler(not ctx.cpu) as sampler:
            left = deadline - time.monotonic()
            result = ssfl_sweep(exp, cells, jobs, out, left, ctx.round_sets())
        runs[f"jobs_{jobs}"] = {**result, **sampler.summary()}
        log(f"  {cells} cells, --jobs {jobs}: {result['status']} in {result['seconds']}s")
    failed = {name: run for name, run in runs.items() if run["status"] != "ok"}
    if failed:
        reasons = "; ".join(
            f"{name} {run['status']}: {run.get('error', '')}" for name, run in failed.items()
        )
        raise RuntimeError(f"a sweep did not complete: {reasons}")
    one, apart = runs["jobs_1"], runs[f"jobs_{cells}"]
    if one["final_test_accuracies"] != apart["final_test_accuracies"]:
        ctx.problems.append("cells at once gave other numbers than one after another")
    return {"cells": cells, **runs, "speedup": round(one["seconds"] / apart["seconds"], 2)}


# ----- The check -----------------------------------------------------------------------
@dataclass
class Context:
    """What every step sees: the mode, its sizes, a work folder, the step's budget."""

    cpu: bool
    sizes: Sizes
    work: Path
    methods: list[str]
    budget: float = 0.0
    problems: list[str] | None = None
    execution: str = "per_client"  # the round and CIFAR steps' simulation.execution
    engine: str = ""  # and their augment.engine ("": the experiment's)
    partial_sums: bool = False  # and, in cohort mode, simulation.partial_sums
    steps: tuple[str, ...] = ()  # the steps to run (empty: every one)

    def round_sets(self) -> tuple[str, ...]:
        """The ``--set`` options of the round and CIFAR runs' execution and engine."""
        engine = (f"augment.engine={self.engine}",) if self.engine else ()
        sums = ("simulation.partial_sums=true",) if self.partial_sums else ()
        return (f"simulation.execution={self.execution}", *engine, *sums)

    @property
    def device(self) -> str:
        return "cpu" if self.cpu else "cuda"


STEPS: dict[str, Callable[[Context], dict[str, Any]]] = {
    "environment": environment,
    "methods": method_runs,
    "training_step": training_step,
    "round": round_time,
    "cifar": cifar_cell,
}
# Steps run only where ``--steps`` names them.
EXTRA_STEPS: dict[str, Callable[[Context], dict[str, Any]]] = {
    "stacked": stacked_clients,
    "cells": cells_at_once,
}


def run_step(name: str, fn: Callable[[Context], dict[str, Any]], ctx: Context) -> dict[str, Any]:
    """One step, timed; its exception becomes ``status: failed`` with one line."""
    started = time.perf_counter()
    try:
        out = {"status": "ok", **fn(ctx)}
    except Exception as err:
        out = {"status": "failed", "error": one_line(f"{type(err).__name__}: {err}", 1000)}
    out["seconds"] = round(time.perf_counter() - started, 1)
    log(f"{name}: {out['status']} in {out['seconds']}s{summary_of(name, out)}")
    return out


def summary_of(name: str, out: Mapping[str, Any]) -> str:
    """The few numbers of a step's summary line."""
    if out["status"] != "ok":
        return f" ({out.get('error', '')})"
    if name == "environment":
        return f" (torch {out['torch']}, CUDA {out['torch_cuda']}, GPUs {out['gpus']})"
    if name == "methods":
        return f" ({out['ok']}/{out['of']} ok, share {out['gpu_share']}, {out['client_devices']})"
    if name == "cells":
        one, apart = out["jobs_1"], out[f"jobs_{out['cells']}"]
        return (
            f" ({out['cells']} cells: {one['seconds']} s one after another, {apart['seconds']} s "
            f"at once, speedup {out['speedup']})"
        )
    if name in ("round", "cifar"):
        return (
            f" (rounds {out['round_seconds']} s, GPU util mean {out['gpu_util_mean']}, "
            f"steady rounds {out['gpu_util_steady_mean']}; phases {out['phases']})"
        )
    return ""


def check(ctx: Context, total_budget: float) -> dict[str, Any]:
    """Every step within its budget and the total; the JSON's content."""
    deadline = time.monotonic() + total_budget
    report: dict[str, Any] = {
        "mode": "cpu" if ctx.cpu else "gpu",
        "execution": ctx.execution,
        "engine": ctx.engine or "default",
        "partial_sums": ctx.partial_sums,
        "started": time.time(),
    }
    steps: dict[str, Any] = {}
    for name, fn in {**STEPS, **EXTRA_STEPS}.items():
        if name not in (ctx.steps or STEPS):
            continue
        ctx.budget = min(ctx.sizes.budgets[name], deadline - time.monotonic())
        if ctx.budget < 5:
            steps[name] = {"status": "skipped", "error": "out of the check's time budget"}
            log(f"{name}: skipped (out of time)")
            continue
        steps[name] = run_step(name, fn, ctx)
    report["steps"] = steps
    report["problems"] = ctx.problems
    report["ok"] = all(s["status"] == "ok" for s in steps.values()) and not ctx.problems
    report["seconds"] = round(time.time() - report["started"], 1)
    return report


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpu-check", description=__doc__.splitlines()[0])
    parser.add_argument("json_path", nargs="?", help="where to write the JSON")
    parser.add_argument("--json", dest="json_opt", help="where to write the JSON")
    parser.add_argument("--cpu", action="store_true", help="the same steps on CPU, tiny sizes")
    parser.add_argument("--methods", help="comma-separated methods (default: all registered)")
    parser.add_argument(
        "--budget", type=float, help="seconds for the whole check (default 470; --cpu 1500)"
    )
    parser.add_argument(
        "--steps",
        help=f"comma-separated steps (default: all of {list(STEPS)}; also {list(EXTRA_STEPS)})",
    )
    parser.add_argument(
        "--execution",
        choices=EXECUTIONS,
        default="per_client",
        help="simulation.execution of the round and CIFAR steps",
    )
    parser.add_argument(
        "--engine",
        choices=choices_of(AugmentSettings)["engine"],
        help="augment.engine of the round and CIFAR steps (default: the experiment's)",
    )
    parser.add_argument(
        "--partial-sums",
        action="store_true",
        help="simulation.partial_sums=true in the round and CIFAR steps (with --execution cohort)",
    )
    parser.add_argument(
        "--keep",
        metavar="DIR",
        help="keep every run's output under DIR (methods/<method>/, ...) instead of a "
        "temporary folder",
    )
    return parser.parse_args(argv)


@contextmanager
def work_folder(keep: str | None) -> Iterator[Path]:
    """``--keep``'s folder (created), else a temporary one removed at the end."""
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        yield Path(keep)
        return
    with tempfile.TemporaryDirectory(prefix="ssfl-gpu-check-") as work:
        yield Path(work)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    path = Path(args.json_opt or args.json_path or "gpu-check.json")
    methods = [m.strip() for m in (args.methods or "").split(",") if m.strip()]
    from ssfl.registry import METHODS

    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        print(f"gpu-check: error: unknown methods {unknown}", file=sys.stderr)
        return 2
    steps = tuple(s.strip() for s in (args.steps or "").split(",") if s.strip())
    known = [*STEPS, *EXTRA_STEPS]
    if sorted(set(steps) - set(known)) or (args.steps is not None and not steps):
        print(f"gpu-check: error: --steps {args.steps!r}: choose from {known}", file=sys.stderr)
        return 2
    with work_folder(args.keep) as work:
        ctx = Context(args.cpu, CPU if args.cpu else GPU, work, methods, problems=[])
        ctx.execution, ctx.engine, ctx.steps = args.execution, args.engine or "", steps
        ctx.partial_sums = args.partial_sums
        report = check(ctx, args.budget or TOTAL_BUDGET_S["cpu" if args.cpu else "gpu"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2))
    log(f"{'all ok' if report['ok'] else 'NOT all ok'} in {report['seconds']}s -> {path}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

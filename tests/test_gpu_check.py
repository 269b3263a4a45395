"""scripts/gpu-check.sh --cpu: every step of the GPU check at tiny sizes on the CPU, and the
fields of the one JSON it writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from benchmarks.gpu_check import CPU, GPU, Context, UtilSampler, phases, tiny_experiment
from benchmarks.gpu_step import significant
from ssfl.experiment import resolve_config
from ssfl.registry import METHODS
from tests.conftest import ROOT

STEPS = ("environment", "methods", "training_step", "round", "cifar")


@pytest.mark.process
@pytest.mark.slow
def test_gpu_check_cpu_runs_every_step_and_writes_one_json(tmp_path):
    out = tmp_path / "check.json"
    cmd = ["bash", "scripts/gpu-check.sh", "--cpu"]  # every registered method
    proc = subprocess.run(
        [*cmd, "--json", str(out)],
        cwd=ROOT,
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=1800,
    )
    report = json.loads(out.read_text())
    steps = report["steps"]
    assert proc.returncode == 0 and report["ok"], proc.stdout[-3000:]
    assert report["mode"] == "cpu" and tuple(steps) == STEPS
    assert all(f"gpu-check: {name}: ok in " in proc.stdout for name in STEPS)
    assert steps["environment"]["torch"] and steps["environment"]["cuda_available"] in (True, False)
    methods = steps["methods"]
    assert methods["ok"] == methods["of"] == len(METHODS) and methods["gpu_share"] == 0.0
    for name, run in methods["runs"].items():
        assert run["status"] == "ok" and len(run["round_seconds"]) == 2
        assert run["devices"]["server"] == "cpu"
        clients = {"cpu"} if METHODS[name].client else set()  # server_sl has no clients
        assert set(run["devices"]["clients"].values()) == clients
    for case in steps["training_step"]["cases"]:
        assert case["client_images_per_s"] > 0 and case["bare_images_per_s"] > 0
        assert case["client_setup_seconds"] > 0  # apart from the steady rate
        assert case["bare_graphed_images_per_s"] is None  # CUDA graphs: on a GPU only
        assert case["ratio"] == pytest.approx(
            case["client_images_per_s"] / case["bare_images_per_s"], rel=0.01
        )
    assert {c["model"] for c in steps["training_step"]["cases"]} == {"small_cnn", "resnet18"}
    assert len(steps["round"]["round_seconds"]) == 3 and steps["round"]["clients"] == 3
    for name in ("round", "cifar"):  # phases apart; no GPU samples on a CPU
        assert all(v > 0 for v in steps[name]["phases"].values()), steps[name]["phases"]
        assert steps[name]["gpu_util_steady_mean"] is None
    assert len(steps["cifar"]["round_seconds"]) == 2 and steps["cifar"]["test_images"] == 100
    assert all(step["seconds"] > 0 for step in steps.values())


@pytest.mark.parametrize(
    ("client", "bare"), [(3.06, 3.1), (0.4123, 0.4), (812.37, 1024.9), (12345.6, 12000.0)]
)
def test_a_training_step_case_keeps_its_ratio_at_any_rate(client, bare):
    """The rates are kept to 4 significant digits, so their quotient matches the ratio on a slow
    CPU too (one decimal turned 3.06 / 3.1 images/s into 3.1 / 3.1)."""
    client_rate, bare_rate = significant(client), significant(bare)
    assert client_rate == pytest.approx(client, rel=1e-3)
    assert bare_rate == pytest.approx(bare, rel=1e-3)
    assert round(client / bare, 3) == pytest.approx(client_rate / bare_rate, rel=0.01)


@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize("sizes", [CPU, GPU], ids=["cpu", "gpu"])
def test_every_methods_check_experiment_passes_the_methods_own_config_checks(
    method, sizes, tmp_path
):
    """The methods step runs each method's tiny experiment under `ssfl run`; one the method's
    settings refuse (fedossl's server keys were) fails there after minutes on a GPU box."""
    ctx = Context(cpu=sizes is CPU, sizes=sizes, work=tmp_path, methods=[])
    assert resolve_config(tiny_experiment(method, ctx))["method"] == method


def test_busy_time_counts_only_the_steady_rounds_samples():
    """Start-up, the first round and shut-down hold the GPU idle: a whole-run mean hides a
    busy steady round (the H200's 2.8% figure was such a mean)."""
    sampler = UtilSampler(enabled=False)
    sampler.samples = [(t, u, 100.0) for t, u in [(1, 0), (5, 10), (11, 80), (14, 90), (21, 0)]]
    timeline = {"first_round": 4.0, "first_round_ended": 10.0, "rounds_ended": 20.0}
    assert sampler.steady(timeline) == {"gpu_util_steady_mean": 85.0, "gpu_util_steady_samples": 2}
    assert sampler.summary()["gpu_util_mean"] == 36.0
    assert phases({**timeline, "finished": 22.5}, started=1.0) == {
        "startup_seconds": 3.0,
        "first_round_seconds": 6.0,
        "steady_rounds_seconds": 10.0,
        "shutdown_seconds": 2.5,
    }
    assert phases({}, started=1.0)["steady_rounds_seconds"] is None

"""scripts/gpu-check.sh --cpu: every step of the GPU check at tiny sizes on the CPU, and the
fields of the one JSON it writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.gpu_check import CPU, GPU, Context, UtilSampler, phases, tiny_experiment
from benchmarks.gpu_step import significant
from ssfl.cli import main
from ssfl.experiment import resolve_config
from ssfl.registry import METHODS
from tasks.data import dataset_info
from tasks.models import model_for, without_ssl_heads
from tasks.settings import ModelSettings
from tests.conftest import ROOT

STEPS = ("environment", "methods", "training_step", "round", "cifar")
ROUND_KEYS = {"round", "test_accuracy", "test_loss", "seconds", "bytes_s2c", "bytes_c2s"}
TOP_KEYS = {"method", "dataset", "scenario", "config", "seed", "split", "rounds"}
TOP_KEYS |= {"final_test_accuracy", "best_test_accuracy", "wall_seconds"}


def state_bytes(mcfg: ModelSettings) -> int:
    """Bytes of a synthetic28 model's state dict."""
    model = model_for(mcfg, dataset_info("synthetic28"))
    return sum(v.numel() * v.element_size() for v in model.state_dict().values())


def check_method_run(method: str, out: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One method's 2-round ``ssfl run`` of the check (CPU sizes: 3 clients of 16 images, every
    client a round): its results, files, kept model and bytes on the wire."""
    res = json.loads((out / "results.json").read_text())
    assert set(res) >= TOP_KEYS and res["method"] == method
    assert [r["round"] for r in res["rounds"]] == [1, 2]
    assert all(set(r) >= ROUND_KEYS for r in res["rounds"])
    assert 0.0 <= res["final_test_accuracy"] <= 1.0
    sizes = res["split"]["client_sizes"]  # FedoSSL's open world: its classes' samples
    assert sizes == [CPU.client_images] * CPU.clients if method != "fedossl" else len(sizes) == 3
    stages = ("server_main", "server_built", "nodes_found", "first_round", "finished")
    times = [res["timeline"][stage] for stage in stages]
    assert times == sorted(times)
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2
    assert len((out / "metrics.csv").read_text().splitlines()) == 3
    assert (out / "accuracy.png").stat().st_size > 0
    # The kept model gives back the run's final test accuracy (FedoSSL: its acc_all).
    assert main(["evaluate", str(out)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"test_accuracy={res['final_test_accuracy']:.4f}"
    )
    last = res["rounds"][-1]
    if method == "server_sl":
        assert last["bytes_c2s"] == 0 and "final_local_accuracy" not in res
        return
    assert res["final_local_accuracy"] == last["local_accuracy"]
    assert 0.0 <= last["local_accuracy"] <= 1.0
    assert last["clients"] == CPU.clients and last["bytes_c2s"] > 0
    check_bytes(method, res)


def check_bytes(method: str, res: dict) -> None:
    """What the server sends beyond the model, and FedMatch's sparse payloads."""
    last, n = res["rounds"][-1], CPU.clients
    extra = last["bytes_s2c"] - last["bytes_c2s"]
    if method == "fedseal":
        assert 0 < extra < n * 1000  # tau: 10 float32 per client, plus array headers
    elif method == "fedsup":  # f_Server travels down beside the online network
        teacher = n * state_bytes(without_ssl_heads(ModelSettings(**res["config"]["model"])))
        assert teacher <= extra <= teacher + n * 5000  # + array headers
        for protocol in ("finetune", "linear"):
            assert res[f"final_{protocol}_accuracy"] == last[f"{protocol}_accuracy"]
    elif method == "fedossl":  # global centroids down; local centroids and seen sums up
        roles = res["split"]["class_roles"]["roles"]
        seen, local = roles.count("S"), res["config"]["algo"]["local_centroids"]
        assert {"acc_seen", "acc_lu", "acc_gu", "best_acc_all"} <= set(last)
        up_minus_down = 4 * 128 * (local + seen - len(roles)) + seen * 4
        assert n * up_minus_down <= -extra <= n * (up_minus_down + 1000)  # + npy headers
    elif method == "fedmatch":  # sparse payloads: sigma + psi down, psi up
        assert last["bytes_c2s"] <= last["bytes_c2s_dense"] + n * 2000  # npy headers
        assert last["bytes_s2c_dense"] > 0 and 0 < last["c2s_ratio"] <= 1.01
    else:
        assert extra == 0


@pytest.mark.process
@pytest.mark.slow
def test_gpu_check_cpu_runs_every_step_and_writes_one_json(tmp_path, capsys):
    """The check in CPU mode, every registered method; each method's run is then checked as a
    complete ``ssfl run`` (CI's one run of every method through Flower's engine)."""
    out, kept = tmp_path / "check.json", tmp_path / "kept"
    cmd = ["bash", "scripts/gpu-check.sh", "--cpu", "--keep", str(kept)]  # every method
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
        assert case["client_compiled_images_per_s"] is None  # compiled: on a GPU only
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
    for name in sorted(METHODS):
        check_method_run(name, kept / "methods" / name, capsys)


def test_steps_execution_and_engine_reach_the_round_and_cifar_runs(tmp_path, monkeypatch):
    """``--steps round,cifar --execution cohort --engine batched``: those steps only, their
    runs made with those settings, recorded in the JSON (the runs themselves replaced)."""
    from benchmarks import gpu_check

    calls: list[tuple[str, tuple[str, ...]]] = []

    def fake_run(raw, out, timeout, sets=()):
        calls.append((out.name, tuple(sets)))
        timeline = {"first_round_ended": 2.0, "rounds_ended": [2.0, 3.0], "finished": 4.0}
        return {"status": "ok", "round_seconds": [1.0, 1.0], "timeline": timeline, "phases": {}}

    monkeypatch.setattr(gpu_check, "ssfl_run", fake_run)
    out = tmp_path / "check.json"
    args = ["--cpu", "--steps", "round,cifar", "--execution", "cohort", "--engine", "batched"]
    gpu_check.main([*args, "--partial-sums", "--json", str(out)])
    report = json.loads(out.read_text())
    assert list(report["steps"]) == ["round", "cifar"]
    assert (report["execution"], report["engine"], report["partial_sums"]) == (
        "cohort",
        "batched",
        True,
    )
    assert [name for name, _ in calls] == ["round", "cifar"]
    wanted = {
        "simulation.execution=cohort",
        "augment.engine=batched",
        "simulation.partial_sums=true",
    }
    for _, sets in calls:
        assert wanted <= set(sets)


@pytest.mark.parametrize("args", [["--steps", "nope"], ["--steps", ","], ["--methods", "x"]])
def test_a_bad_step_or_method_is_one_line_and_exit_2(args, capsys):
    from benchmarks.gpu_check import main

    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpu-check: error: ")


def test_a_failed_commands_error_keeps_each_cells_reason_not_only_the_last_line():
    """A sweep's last line only names its failed cells; their reasons come before it."""
    from benchmarks.gpu_check import failure_lines

    stderr = (
        "ssfl sweep: seed=0 -> out/seed=0\n"
        "ssfl sweep: seed=1 failed: RuntimeError: Ray did not start\n"
        "Traceback (most recent call last):\n"
        "ssfl: sweep failed: 1 cell(s) failed: seed=1 (their errors are above)\n"
    )
    assert failure_lines(stderr) == (
        "ssfl sweep: seed=1 failed: RuntimeError: Ray did not start | "
        "ssfl: sweep failed: 1 cell(s) failed: seed=1 (their errors are above)"
    )
    assert failure_lines("setup\nValueError: bad\n") == "ValueError: bad"
    assert failure_lines("") == "no output"


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


def test_the_compiled_client_is_timed_on_a_gpu_only_and_a_compiler_failure_is_recorded(
    monkeypatch,
):
    from benchmarks import gpu_step

    assert gpu_step.compiled_client_rate("small_cnn", "synthetic28", 8, "off", 2, "cpu") == (
        None,
        None,
    )
    asked = []

    def fails(*args):
        asked.append(args[-1])
        raise RuntimeError("inductor: no C++ compiler\nmore lines")

    monkeypatch.setattr(gpu_step, "client_rate", fails)
    rate = gpu_step.compiled_client_rate("small_cnn", "synthetic28", 8, "off", 2, "cuda")
    assert rate == (None, "inductor: no C++ compiler") and asked == ["reduce-overhead"]


def test_stacked_clients_train_as_each_client_would_alone():
    """K GroupNorm models trained at once with stacked weights move as K optimizers would
    move them one after another (same start, same batches, three SGD steps with momentum)."""
    import copy

    import torch

    from benchmarks.gpu_step import client_batches, gn_nets, sequential_steps, stacked_steps

    torch.manual_seed(0)
    nets = gn_nets("small_cnn", "synthetic28", 3, "cpu")
    alone = copy.deepcopy(nets)
    x, y = client_batches(3, 4, "synthetic28", "cpu")
    one_by_one = sequential_steps(alone, x, y)
    at_once, stacked = stacked_steps(nets, x, y)
    start = {name: p.detach().clone() for name, p in stacked.items()}
    for _ in range(3):
        one_by_one()
        at_once()
    for name, p in stacked.items():
        expected = torch.stack([dict(net.named_parameters())[name] for net in alone])
        assert p.shape[0] == 3
        assert torch.allclose(p, expected, atol=1e-6, rtol=0), name
    assert all(not torch.equal(stacked[n], start[n]) for n in stacked if n.endswith("weight"))


def test_stacked_clients_refuse_batchnorm_models_in_one_line():
    from benchmarks.gpu_step import client_batches, stacked_steps

    nets = [model_for(ModelSettings(name="small_cnn"), dataset_info("synthetic28"))]
    with pytest.raises(ValueError, match=r"^stacked clients need GroupNorm models"):
        stacked_steps(nets, *client_batches(1, 2, "synthetic28", "cpu"))


@pytest.mark.slow  # trains three ResNet-18s twice over (about 9 s on two cores)
def test_the_stacked_step_runs_only_where_named_and_reports_both_rates(tmp_path):
    from benchmarks import gpu_check

    out = tmp_path / "check.json"
    assert gpu_check.main(["--cpu", "--steps", "stacked", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert list(report["steps"]) == ["stacked"]
    cases = report["steps"]["stacked"]["cases"]
    assert [(c["model"], c["clients"], c["norm"]) for c in cases] == [
        ("small_cnn", CPU.round_clients, "gn"),
        ("resnet18", CPU.round_clients, "gn"),
    ]
    for c in cases:
        assert c["sequential_images_per_s"] > 0 and c["stacked_images_per_s"] > 0
        ratio = c["stacked_images_per_s"] / c["sequential_images_per_s"]
        assert abs(c["stacked_over_sequential"] - ratio) < 0.01
    assert "stacked" not in gpu_check.STEPS  # the default check leaves it out


def test_cells_at_once_records_the_speedup_and_flags_other_numbers(tmp_path, monkeypatch):
    """``--steps cells``: the same sweep with --jobs 1 and --jobs N (the sweeps replaced);
    another accuracy from the cells at once is a problem of the check."""
    from benchmarks import gpu_check

    calls = []

    def fake_sweep(exp, seeds, jobs, out, timeout, sets):
        calls.append((seeds, jobs))
        finals = [0.5, 0.6] if jobs == 1 else [0.5, 0.7]
        return {"status": "ok", "seconds": 80.0 / jobs, "final_test_accuracies": finals}

    monkeypatch.setattr(gpu_check, "ssfl_sweep", fake_sweep)
    out = tmp_path / "check.json"
    assert gpu_check.main(["--cpu", "--steps", "cells", "--json", str(out)]) == 1
    report = json.loads(out.read_text())
    assert calls == [(2, 1), (2, 2)]
    assert report["steps"]["cells"]["speedup"] == 2.0
    assert report["problems"] == ["cells at once gave other numbers than one after another"]


@pytest.mark.process
@pytest.mark.slow
def test_the_cells_step_runs_a_real_sweep_both_ways(tmp_path):
    """Four tiny runs under ``ssfl sweep``: two seeds one after another, then at once."""
    from benchmarks.gpu_check import main

    out = tmp_path / "check.json"
    assert main(["--cpu", "--steps", "cells", "--json", str(out)]) == 0
    cells = json.loads(out.read_text())["steps"]["cells"]
    assert cells["status"] == "ok" and cells["cells"] == 2
    assert cells["jobs_1"]["final_test_accuracies"] == cells["jobs_2"]["final_test_accuracies"]
    assert cells["speedup"] > 0

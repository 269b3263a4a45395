"""End-to-end runs through Flower's simulation engine (``ssfl run``)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from ssfl.cli import main
from ssfl.registry import METHODS
from ssfl.runner import APP_PACKAGES, descendants, stage_app
from tasks.config import deep_merge
from tasks.data import dataset_info
from tasks.models import model_for, without_ssl_heads
from tasks.settings import ModelSettings
from tests.conftest import ROOT
from tests.harness import alive, processes, ssfl_run

pytestmark = pytest.mark.e2e

ROUND_KEYS = {
    "round",
    "test_accuracy",
    "test_loss",
    "seconds",
    "bytes_s2c",
    "bytes_c2s",
    "bytes_c2s_dense",
}
TOP_KEYS = {
    "method",
    "dataset",
    "scenario",
    "config",
    "seed",
    "split",
    "rounds",
    "final_test_accuracy",
    "best_test_accuracy",
    "wall_seconds",
}


# FedoSSL's open world on the same data: labels at the clients (half of each seen class),
# no server training; 60 images a class give every client 6 x 20 seen + 20 LU + 60 GU = 200.
OPEN_WORLD = {
    "split": {"scenario": "open_world", "labeled_per_class": 0, "samples_per_class": 60},
    "server": {},
    "client": {"batch_size": 64},
    "algo": {"cluster_from_round": 2, "ce_from_round": 2, "local_centroids": 8},
}


def state_bytes(mcfg: ModelSettings) -> int:
    """Bytes of a synthetic28 model's state dict."""
    model = model_for(mcfg, dataset_info("synthetic28"))
    return sum(v.numel() * v.element_size() for v in model.state_dict().values())


@pytest.mark.parametrize("method", sorted(METHODS))
def test_two_rounds_of_every_method_on_synthetic_data(method, tmp_path, synthetic_raw, capsys):
    exp = tmp_path / "exp.yaml"
    raw = {**synthetic_raw, "method": method, "eval": {"local_models": True}}
    if method == "fedsup":  # FedSup 5.1.2's protocols, at the last round
        raw["eval"] = {**raw["eval"], "protocol_every": 5, "finetune_epochs": 1, "linear_epochs": 1}
    if METHODS[method].server_half().defaults().get("server", {}).get("local_steps"):
        raw = {**raw, "server": {"bootstrap_epochs": 1, "epochs": 0}}  # rounds of T steps
    if method == "fedossl":
        raw = deep_merge(raw, OPEN_WORLD)
        raw["server"] = {}
    exp.write_text(yaml.safe_dump(raw))
    res = ssfl_run(exp, tmp_path / "out", "--quiet")
    assert set(res) >= TOP_KEYS and res["method"] == method
    assert [r["round"] for r in res["rounds"]] == [1, 2]
    assert all(set(r) >= ROUND_KEYS for r in res["rounds"])
    assert 0.0 <= res["final_test_accuracy"] <= 1.0
    assert res["split"]["client_sizes"] == [200] * 3
    stages = ("server_main", "server_built", "nodes_found", "first_round", "finished")
    times = [res["timeline"][stage] for stage in stages]
    assert times == sorted(times)
    if method == "fedossl":  # every class's role recorded; seen/unseen accuracies each round
        roles = res["split"]["class_roles"]
        assert roles["roles"] == "SSSSSSLGGG" and roles["client_classes"][0] == [*range(7), 7]
        keys = {"acc_seen", "acc_lu", "acc_gu", "best_acc_all"}
        assert all(keys <= set(r) for r in res["rounds"])
    else:
        assert res["split"]["noniid_r"] == 0.0
    lines = (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2 and (tmp_path / "out" / "accuracy.png").stat().st_size > 0
    assert len((tmp_path / "out" / "metrics.csv").read_text().splitlines()) == 3
    # The kept model gives back the run's final test accuracy (FedoSSL: its acc_all).
    assert main(["evaluate", str(tmp_path / "out")]) == 0
    evaluated = capsys.readouterr().out.splitlines()
    assert evaluated[-1] == f"test_accuracy={res['final_test_accuracy']:.4f}"
    if method == "server_sl":
        assert res["rounds"][-1]["bytes_c2s"] == 0 and "final_local_accuracy" not in res
    else:
        last = res["rounds"][-1]
        assert res["final_local_accuracy"] == last["local_accuracy"]
        assert 0.0 <= last["local_accuracy"] <= 1.0
        assert last["clients"] == 3 and last["bytes_c2s"] > 0
        extra = last["bytes_s2c"] - last["bytes_c2s"]  # what the server sends beyond the model
        if method == "fedseal":
            assert 0 < extra < 3 * 1000  # tau: 10 float32 per client, plus array headers
        elif method == "fedsup":  # f_Server travels down beside the online network
            teacher = 3 * state_bytes(without_ssl_heads(ModelSettings(**res["config"]["model"])))
            assert teacher <= extra <= teacher + 3 * 5000  # + array headers
            for protocol in ("finetune", "linear"):
                assert res[f"final_{protocol}_accuracy"] == last[f"{protocol}_accuracy"]
        elif method == "fedossl":  # global centroids down; local centroids and sums up
            up_minus_down = 4 * 128 * (8 + 6 - 10) + 6 * 4  # 8 local, 6 seen sums; 10 global
            assert 3 * up_minus_down <= -extra <= 3 * (up_minus_down + 1000)  # + npy headers
        elif method == "fedmatch":  # sparse payloads: sigma + psi down, psi up
            assert last["bytes_c2s"] <= last["bytes_c2s_dense"] + 3 * 2000  # npy headers
            assert last["bytes_s2c_dense"] > 0 and 0 < last["c2s_ratio"] <= 1.01
        else:
            assert extra == 0


def test_one_round_on_real_fashion_mnist(tmp_path, data_dir):
    res = ssfl_run(
        ROOT / "experiments/fmnist-las/fedavg_fixmatch.yaml",
        tmp_path / "out",
        "--rounds",
        "1",
        "--set",
        f"dataset.root={data_dir}",
        "--quiet",
    )
    assert res["dataset"] == "fashion_mnist" and res["split"]["client_sizes"] == [1200] * 10
    assert res["rounds"][0]["clients"] == 10
    assert res["final_test_accuracy"] > 0.6  # bootstrap on 500 labels alone gives ~0.75


def test_compare_prints_a_table(tmp_path, synthetic_raw):
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump({**synthetic_raw, "method": "server_sl", "rounds": 1}))
    ssfl_run(exp, tmp_path / "a", "--quiet")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ssfl.cli",
            "compare",
            str(tmp_path / "a"),
            "--plot",
            str(tmp_path / "c.png"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 0 and "| server_sl |" in proc.stdout
    assert (tmp_path / "c.png").stat().st_size > 0


def started_by(pid: int, name: str) -> list[int]:
    """The processes whose parent is ``pid`` and whose command line holds ``name``."""
    return [p for p, ppid, cmd in processes() if ppid == pid and name in cmd]


def command(pid: int) -> str:
    """The command line of ``pid`` ("" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return ""


def test_sigterm_stops_the_superlink_and_all_it_started(tmp_path, synthetic_raw):
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump({**synthetic_raw, "method": "fedavg_sl", "rounds": 50}))
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "ssfl.cli", "run", str(exp), "--out", str(out), "--quiet"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not (out / "metrics.jsonl").is_file() and time.monotonic() < deadline:
            time.sleep(0.5)
        links = started_by(proc.pid, "flower-superlink")
        heads = started_by(proc.pid, "ssfl.ray_head")
        assert len(links) == 1 and len(heads) == 1
        # flower-superexec and the simulation; Ray's processes under the run's Ray head: the
        # simulation joined that cluster and started none of its own.
        under_link, under_head = descendants(links[0]), descendants(heads[0])
        assert under_link and not [p for p in under_link if "raylet" in command(p)]
        assert [p for p in under_head if "raylet" in command(p)]
        started = [*under_link, heads[0], *under_head]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
        time.sleep(1.0)
        assert not alive(links[0])
        assert [pid for pid in started if alive(pid)] == []
    finally:
        if proc.poll() is None:  # a failed assertion above must not leave the run going
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    assert (out / "superlink.log").stat().st_size > 0  # kept before its scratch home went


def test_the_staged_app_holds_the_packages_pyproject_lists(tmp_path):
    tomllib = pytest.importorskip("tomllib")
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert list(APP_PACKAGES) == meta["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    stage = stage_app(ROOT, tmp_path / "app")
    names = sorted(p.name for p in stage.iterdir())
    assert names == sorted([*APP_PACKAGES, "experiments", "pyproject.toml"])
    assert (stage / "experiments/fmnist-las/fedseal.yaml").is_file()
    assert not list(stage.rglob("__pycache__"))

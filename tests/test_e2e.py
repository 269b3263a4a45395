"""End-to-end runs through Flower's simulation engine (``ssfl run``)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from ssfl.runner import APP_PACKAGES, descendants, stage_app
from tests.conftest import ROOT
from tests.harness import alive, processes, ssfl_run, without_seconds

pytestmark = pytest.mark.e2e


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


def test_a_sweep_with_jobs_gives_the_numbers_of_one_after_another(tmp_path, synthetic_raw):
    """``--jobs 2``: the cells run at once, each in a process of its own, with the same
    rows as the same sweep run one cell after another."""
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump(synthetic_raw))
    rows, lines = {}, {}
    for jobs in ("1", "2"):
        out = tmp_path / f"jobs{jobs}"
        cmd = [sys.executable, "-m", "ssfl.cli", "sweep", str(exp), "--set-grid", "seed=0,1"]
        cmd += ["--out", str(out), "--jobs", jobs]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        lines[jobs] = [line for line in proc.stderr.splitlines() if "final_test_accuracy" in line]
        rows[jobs] = {
            cell: without_seconds(json.loads((out / cell / "results.json").read_text())["rounds"])
            for cell in ("seed=0", "seed=1")
        }
    assert rows["2"] == rows["1"]
    assert rows["1"]["seed=0"] != rows["1"]["seed=1"]
    assert len(lines["2"]) == 2 and all(line.startswith("ssfl sweep: seed=") for line in lines["2"])

"""``--jobs N`` of reproduce and sweep (ssfl.cells): at most N cells at once, results in the
cells' order, no new cell after a failure, Ctrl-C or SIGTERM passed on to the running ones.

The children here are small stand-ins (a Python script reading the cell from stdin, as
``python -m ssfl.cells`` does); tests/test_e2e.py runs real cells apart."""

from __future__ import annotations

import io
import json
import os
import signal
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

import ssfl.cells
from ssfl.cells import Cell, child_main, run_cells
from ssfl.experiment import CellFolders, resolve_config
from ssfl.lifecycle import TAG_VAR, RunInterrupted, run_tag, stop_signals
from ssfl.registry import settings_of
from ssfl.runner import RunFailed
from tasks.config import ConfigError
from tasks.settings import mapping
from tests.harness import tiny_raw

# A stand-in cell: logs its start and end, "fail" exits 1, "slow" takes longer, SIGTERM
# records an interrupted run after 3 rounds (as record_interruption does) and exits 143.
CHILD = r"""
import json, os, signal, sys, time
from pathlib import Path
spec = json.load(sys.stdin)
out, label = Path(spec["out"]), spec["label"]
out.mkdir(parents=True, exist_ok=True)
log = Path(os.environ["CELLS_LOG"])
def note(what):
    with log.open("a") as fh:
        fh.write(f"{what} {label} {time.monotonic()}\n")
def stop(*_):
    (out / "results.json").write_text(json.dumps({"status": "interrupted", "rounds_done": 3}))
    note("stopped")
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
note("start")
time.sleep(3.0 if label.startswith("slow") else 0.2 if label == "fail" else 1.0)
if label == "fail":
    sys.exit(1)
res = {"status": "completed", "method": "fedavg_sl", "rounds": [], "label": label,
       "tag": os.environ.get("SSFL_RUN_TAG"), "resume": spec["resume"]}
(out / "results.json").write_text(json.dumps(res))
note("end")
"""


@pytest.fixture
def log(tmp_path, monkeypatch) -> Path:
    """The stand-in children's log; ssfl.cells starts them instead of real cells."""
    path = tmp_path / "cells.log"
    monkeypatch.setenv("CELLS_LOG", str(path))
    monkeypatch.setattr(ssfl.cells, "child_command", lambda: [sys.executable, "-c", CHILD])
    return path


def tiny_settings(**keys):
    return settings_of(resolve_config({**tiny_raw("fedavg_sl"), **keys}))


def cells(tmp_path: Path, labels: list[str]) -> list[Cell]:
    settings = tiny_settings()
    return [
        Cell("sweep", label, settings, tmp_path / label, CellFolders(resume=i == 1))
        for i, label in enumerate(labels)
    ]


def events(log: Path) -> list[tuple[str, str, float]]:
    return [
        (w, label, float(t))
        for w, label, t in (line.split() for line in log.read_text().splitlines())
    ]


def most_at_once(log: Path) -> int:
    """The most cells running at one time, from the log's starts and ends."""
    level, top = 0, 0
    for what, _, _ in sorted(events(log), key=lambda e: e[2]):
        level += 1 if what == "start" else -1
        top = max(top, level)
    return top


def test_jobs_run_at_most_n_at_once_and_return_results_in_the_cells_order(tmp_path, log):
    labels = ["a", "b", "c", "d", "e"]
    results = run_cells(cells(tmp_path, labels), jobs=2)
    assert [r["label"] for r in results] == labels
    assert most_at_once(log) == 2
    assert [r["resume"] for r in results] == [False, True, False, False, False]  # as given
    assert {r["tag"] for r in results} == {run_tag()[TAG_VAR]}  # a killed parent ends them


def fake_results(settings) -> dict:
    return {
        "status": "completed",
        "method": settings.method,
        "config": mapping(settings),
        "rounds": [{"round": 1, "test_accuracy": 0.5}],
        "final_test_accuracy": 0.5,
        "best_test_accuracy": 0.5,
        "wall_seconds": 1.0,
    }


def test_one_job_runs_in_this_process_one_after_another(tmp_path, log, monkeypatch):
    ran = []

    def fake_run(settings, out, stream, resume):
        ran.append((out.name, resume))
        return fake_results(settings)

    monkeypatch.setattr(ssfl.cells, "run_simulation", fake_run)
    run_cells(cells(tmp_path, ["a", "b"]), jobs=1)
    assert ran == [("a", False), ("b", False)]  # b may resume, but holds no run
    assert not log.exists()  # no child started


def test_a_cell_finished_by_another_command_meanwhile_is_reused_not_run(tmp_path, monkeypatch):
    (cell,) = cells(tmp_path, ["a"])
    cell.out.mkdir()
    (cell.out / "results.json").write_text(json.dumps(fake_results(cell.settings)))
    monkeypatch.setattr(ssfl.cells, "run_simulation", pytest.fail)
    (res,) = run_cells([cell])
    assert res["status"] == "completed" and res["final_test_accuracy"] == 0.5


def test_a_cell_whose_folder_took_another_run_meanwhile_is_refused(tmp_path, monkeypatch):
    (cell,) = cells(tmp_path, ["a"])
    cell.out.mkdir()
    other = {**fake_results(cell.settings), "config": {**mapping(cell.settings), "seed": 9}}
    (cell.out / "results.json").write_text(json.dumps(other))
    monkeypatch.setattr(ssfl.cells, "run_simulation", pytest.fail)
    with pytest.raises(ConfigError, match=r"^cell folder .* holds a fedavg_sl run \(completed"):
        run_cells([cell])
    replaced = replace(cell, folders=CellFolders(overwrite=True))
    monkeypatch.setattr(ssfl.cells, "run_simulation", lambda *a, **kw: fake_results(cell.settings))
    assert run_cells([replaced])[0]["config"]["seed"] == cell.settings.seed


def test_after_a_failure_no_cell_starts_and_the_running_ones_finish(tmp_path, log):
    with pytest.raises(RunFailed) as err:
        run_cells(cells(tmp_path, ["fail", "slow", "c", "d"]), jobs=2)
    assert (
        str(err.value) == "1 cell(s) failed: fail (exit 1); 2 not started (their errors are above)"
    )
    started = [label for what, label, _ in events(log) if what == "start"]
    assert sorted(started) == ["fail", "slow"]
    assert json.loads((tmp_path / "slow" / "results.json").read_text())["status"] == "completed"


def test_an_interrupted_parent_stops_its_children_which_record_their_runs(tmp_path, log):
    def interrupt_once_both_run() -> None:
        while not log.exists() or log.read_text().count("start") < 2:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(RunInterrupted) as err, stop_signals():
        threading.Thread(target=interrupt_once_both_run, daemon=True).start()
        run_cells(cells(tmp_path, ["slow", "slow2", "c"]), jobs=2)
    assert err.value.signum == signal.SIGTERM
    assert err.value.rounds_done == 3 and err.value.out == tmp_path / "slow"
    stopped = sorted(label for what, label, _ in events(log) if what == "stopped")
    assert stopped == ["slow", "slow2"]
    assert not (tmp_path / "c").exists()  # never started


@pytest.mark.parametrize(
    "raised, code, line",
    [
        (None, 0, None),
        (
            RunFailed("the run wrote no results"),
            1,
            "ssfl sweep: x failed: the run wrote no results",
        ),
    ],
)
def test_a_child_runs_the_cell_it_is_given(tmp_path, monkeypatch, capsys, raised, code, line):
    """``python -m ssfl.cells``: the cell from stdin, its config and folder as given."""
    settings = tiny_settings(seed=7)
    out = tmp_path / "x"
    spec = {"tool": "sweep", "label": "x", "out": str(out), "resume": True, "overwrite": False}
    monkeypatch.setattr(
        sys, "stdin", io.StringIO(json.dumps({**spec, "config": mapping(settings)}))
    )
    got = []

    def fake_run_here(cell):
        got.append(cell)
        if raised is not None:
            raise raised

    monkeypatch.setattr(ssfl.cells, "run_here", fake_run_here)
    assert child_main() == code
    assert got == [Cell("sweep", "x", settings, out, CellFolders(resume=True))]
    assert capsys.readouterr().err.strip() == (line or "")

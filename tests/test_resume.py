"""Checkpoint and resume (the reliability issue's rule 1).

In-process, every method: 4 rounds straight, and what a kill in round 3 leaves (round 2's
checkpoint, round 3's client files) resumed by a fresh strategy with fresh node contexts:
the same rows. End to end: ``ssfl run`` SIGKILLed after round 2 and resumed gives
the uninterrupted run's results. The command line refuses a resume it cannot do."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from flwr.app import ArrayRecord, RecordDict

from client_app.state import restore_state, save_state, saved_rounds
from ssfl import cli as cli_module
from ssfl import runner
from ssfl.experiment import resolve_experiment
from ssfl.registry import METHODS
from ssfl.runner import descendant_groups
from tasks.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from tests.conftest import ROOT
from tests.harness import (
    InProcessGrid,
    build_strategy,
    cli,
    everyday_first,
    ssfl_run,
    tiny_raw,
    without_seconds,
)


def run_rounds(
    raw: dict, folder: Path, snapshot: Path | None = None, resume: bool = False, nodes: int = 3
):
    """Rows of a run whose checkpoint and client state go to ``folder``. ``snapshot``: when
    round 3's row is recorded (round 2's checkpoint, round 3's client files written: what a
    run killed then leaves), ``folder`` is copied there. ``resume``: go on from the
    checkpoint in ``folder`` with a fresh strategy and fresh node contexts (``nodes`` of
    them: the clients, or a cohort run's workers)."""

    def on_round(row: dict) -> None:
        if snapshot is not None and row["round"] == 3:
            shutil.copytree(folder, snapshot)

    strategy = build_strategy(raw, on_round)
    strategy.checkpoint_path = folder / "checkpoint.pt"
    if resume:
        assert strategy.resume_from(load_checkpoint(strategy.checkpoint_path)) == 2
    grid = InProcessGrid(nodes, state_path=str(folder / "client-state"))
    strategy.start(grid, num_rounds=raw["rounds"])
    return strategy.rows


@pytest.mark.parametrize("method", everyday_first(sorted(METHODS), keep=2))
def test_a_resumed_run_gives_the_rows_of_an_uninterrupted_one(method, tmp_path):
    raw = tiny_raw(method)
    straight = run_rounds(raw, tmp_path / "straight", snapshot=tmp_path / "killed")
    assert [r["round"] for r in straight] == [1, 2, 3, 4]
    resumed = run_rounds(raw, tmp_path / "killed", resume=True)
    assert without_seconds(resumed) == without_seconds(straight)


def test_checkpoint_every_keeps_those_rounds_models_and_changes_no_row(tmp_path):
    raw = tiny_raw("fedavg_fixmatch")
    plain = run_rounds(raw, tmp_path / "plain")
    raw["federation"]["checkpoint_every"] = 2
    kept = run_rounds(raw, tmp_path / "kept")
    assert without_seconds(kept) == without_seconds(plain)
    assert sorted(p.name for p in (tmp_path / "kept").glob("checkpoint*.pt")) == [
        "checkpoint-r002.pt",
        "checkpoint-r004.pt",
        "checkpoint.pt",
    ]
    second = load_checkpoint(tmp_path / "kept" / "checkpoint-r002.pt")
    last = load_checkpoint(tmp_path / "kept" / "checkpoint.pt")
    assert second["round"] == 2 and last["round"] == 4
    assert torch.equal(
        last["model"]["1.features.0.weight"],
        load_checkpoint(tmp_path / "kept" / "checkpoint-r004.pt")["model"]["1.features.0.weight"],
    )
    assert not (tmp_path / "plain" / "checkpoint-r002.pt").exists()


def test_client_state_is_never_taken_from_the_round_being_run_or_later(tmp_path):
    folder = tmp_path / "partition-0"
    for rnd in (1, 3, 4):
        save_state(RecordDict({"k": ArrayRecord({"r": torch.tensor(rnd)})}), folder, rnd)
    assert sorted(saved_rounds(folder)) == [3, 4]  # the newest two are kept
    state = RecordDict()
    assert restore_state(state, folder, 4) == 3
    assert int(state["k"]["r"].numpy()) == 3
    assert sorted(saved_rounds(folder)) == [3]  # round 4's file was of an unfinished round
    kept = RecordDict({"k": ArrayRecord({"r": torch.tensor(9)})})
    assert restore_state(kept, folder, 5) is None  # a node's live state is never replaced
    assert restore_state(RecordDict(), folder, 3) is None


def test_a_damaged_checkpoint_is_one_line_naming_it(tmp_path):
    path = tmp_path / "checkpoint.pt"
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        load_checkpoint(path)
    save_checkpoint({"round": 1}, path)
    path.write_bytes(path.read_bytes()[:20])
    with pytest.raises(CheckpointError, match=f"unreadable checkpoint {path}"):
        load_checkpoint(path)
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]  # no temporary left


# ----- The command line ---------------------------------------------------------------
@pytest.fixture
def fedseal_exp(tmp_path: Path) -> Path:
    raw = tiny_raw("fedseal")
    raw["server"]["bootstrap_epochs"] = 0  # nothing before round 1 to wait for
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize("command", ["run", "deploy-local"])
def test_resume_without_a_checkpoint_is_exit_2_and_one_line(command, fedseal_exp, tmp_path):
    out = tmp_path / "out"
    code, lines = cli(command, str(fedseal_exp), "--out", str(out), "--resume")
    assert code == 2 and len(lines) == 1
    assert lines[0].startswith(f"ssfl: error: --resume: no checkpoint at {out / 'checkpoint.pt'}")


@pytest.mark.parametrize("command", ["run", "deploy-local"])
def test_resume_with_another_config_is_exit_2_naming_the_keys(
    command, fedseal_exp, tmp_path, monkeypatch
):
    out = tmp_path / "out"
    cfg = resolve_experiment(fedseal_exp)
    save_checkpoint({"round": 2, "config": json.dumps(cfg)}, out / "checkpoint.pt")
    code, lines = cli(
        command, str(fedseal_exp), "--out", str(out), "--resume", "--rounds", "6",
        "--set", "client.lr=0.5", "--set", "federation.timeout_s=60",
    )  # fmt: skip
    assert code == 2 and len(lines) == 1
    assert "the config differs from the checkpoint's" in lines[0]
    assert lines[0].split(" in ", 1)[1].startswith("client.lr, rounds;")  # timeout: execution
    started = []
    monkeypatch.setattr(runner, "run_simulation", lambda *a, **kw: started.append(kw))
    monkeypatch.setattr(cli_module, "report", lambda *a: None)
    code, _ = cli("run", str(fedseal_exp), "--out", str(out), "--resume")
    assert code == 0 and started[0]["resume"] is True


def run_killed_after_round(exp: Path, out: Path, rnd: int) -> int:
    """``ssfl run`` SIGKILLed with everything it started (SuperLink, simulation, Ray) once
    round ``rnd``'s checkpoint is written; returns the checkpoint's round."""
    cmd = [sys.executable, "-m", "ssfl.cli", "run", str(exp), "--out", str(out), "--quiet"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            path = out / "checkpoint.pt"
            if path.is_file() and load_checkpoint(path)["round"] >= rnd:
                break
            time.sleep(0.2)
    finally:
        for group in [proc.pid, *descendant_groups(proc.pid)]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
        proc.wait(timeout=60)
    return load_checkpoint(out / "checkpoint.pt")["round"]


@pytest.mark.e2e
def test_ssfl_run_killed_after_round_2_resumes_to_the_uninterrupted_numbers(fedseal_exp, tmp_path):
    killed_at = run_killed_after_round(fedseal_exp, tmp_path / "killed", 2)
    assert 2 <= killed_at < 4
    assert sorted(p.name for p in (tmp_path / "killed" / "client-state").iterdir())
    resumed = ssfl_run(fedseal_exp, tmp_path / "killed", "--resume", "--quiet")
    straight = ssfl_run(fedseal_exp, tmp_path / "straight", "--quiet")
    assert resumed["status"] == "completed"
    assert without_seconds(resumed["rounds"]) == without_seconds(straight["rounds"])
    excluded = {"rounds", "wall_seconds", "timeline"}
    assert {k: v for k, v in resumed.items() if k not in excluded} == {
        k: v for k, v in straight.items() if k not in excluded
    }


def test_a_round_appends_its_row_and_the_checkpoint_only_counts_the_rows(tmp_path, monkeypatch):
    """The rows go to checkpoint-rows.jsonl, one line a round, each round appending only its
    own (no re-dump of every row: quadratic over a 19,200-round cell); the checkpoint holds
    their count, and a resumed run's rows are read back from the file."""
    from tasks import checkpoint as ckpt

    appended: list[int] = []
    real_append = ckpt.append_rows
    monkeypatch.setattr(
        "strategies.loop.append_rows",
        lambda f, rows: (appended.append(len(rows)), real_append(f, rows)),
    )
    rows = run_rounds(tiny_raw("fedavg_fixmatch"), tmp_path / "run")
    lines = (tmp_path / "run" / ckpt.ROWS_FILE).read_text().splitlines()
    assert [json.loads(line) for line in lines] == json.loads(json.dumps(rows))
    assert appended == [1, 1, 1]  # round 1 writes the file, rounds 2-4 append one row each
    state = load_checkpoint(tmp_path / "run" / "checkpoint.pt")
    assert state["rows"] == 4 and ckpt.checkpoint_rows(tmp_path / "run" / "checkpoint.pt", state)
    (tmp_path / "run" / ckpt.ROWS_FILE).write_text("\n".join(lines[:3]) + "\n")
    with pytest.raises(CheckpointError, match=r"holds 3 rows; the checkpoint .* needs 4$"):
        ckpt.checkpoint_rows(tmp_path / "run" / "checkpoint.pt", state)


def test_a_checkpoint_holding_its_rows_as_json_text_still_resumes(tmp_path):
    """Checkpoints written before the rows file held the rows as one JSON text."""
    from tasks.checkpoint import checkpoint_rows

    rows = [{"round": 1, "test_accuracy": 0.5}, {"round": 2, "test_accuracy": 0.625}]
    assert checkpoint_rows(tmp_path / "checkpoint.pt", {"rows": json.dumps(rows)}) == rows


# Holds the run lock of the folder in argv[1] (as `ssfl run` does while its run goes on),
# prints "held", and keeps it until its stdin closes.
HOLDER = """
import sys
from pathlib import Path
from ssfl.run_lock import holding_out
with holding_out(Path(sys.argv[1])):
    print("held", flush=True)
    sys.stdin.read()
"""


def hold_out(out: Path) -> subprocess.Popen:
    """A process that holds ``out``'s run lock (as a running command does) until its stdin
    closes; returned once it holds it."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(out)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_folder_whose_run_goes_on_is_refused_whatever_the_flags(tmp_path):
    """Another command's run in --out (its lock held): ssfl run, reproduce and sweep refuse it
    in one line naming its pid, with --resume and --overwrite too; once it ends, the folder
    is free again (the kernel drops the lock, however the holder ended)."""
    from ssfl.experiment import REFUSE, CellFolders, check_out
    from ssfl.run_lock import holding_out, running_pid
    from tasks.config import ConfigError

    out = tmp_path / "run"
    holder = hold_out(out)
    try:
        assert running_pid(out) == holder.pid
        line = re.escape(f"{out} holds a run that is going on (pid {holder.pid}); wait for it")
        for resume, overwrite in ((False, False), (True, False), (False, True)):
            with pytest.raises(ConfigError, match=f"^--out {line}"):
                check_out(out, resume, overwrite)
        settings = settings_of_fedseal()
        for folders in (REFUSE, CellFolders(resume=True), CellFolders(overwrite=True)):
            with pytest.raises(ConfigError, match=f"^cell folder {line}"):
                folders.action(out, settings)
        with pytest.raises(ConfigError, match=f"^--out {line}"), holding_out(out):
            pass
    finally:
        holder.kill()
        holder.wait()
    assert running_pid(out) is None
    check_out(out, False, False)
    with holding_out(out):
        assert running_pid(out) == os.getpid()
    assert running_pid(out) is None


def settings_of_fedseal():
    from ssfl.registry import settings_of

    return settings_of(resolve_experiment(ROOT / "experiments/quickstart.yaml"))


def test_a_run_refused_by_a_held_folder_still_closes_the_superlink_it_was_given(tmp_path):
    """Another command took the folder between the checks and the run: run_simulation
    refuses it in one line and closes the SuperLink (and Ray head) booted for it."""
    from types import SimpleNamespace

    from ssfl.run_lock import holding_out
    from tasks.config import ConfigError

    out = tmp_path / "run"
    closed: list[Path] = []
    link = SimpleNamespace(close=closed.append)
    holder = hold_out(out)
    try:
        with pytest.raises(ConfigError, match="holds a run that is going on"):
            runner.run_simulation(settings_of_fedseal(), out, link=link)
    finally:
        holder.kill()
        holder.wait()
    assert closed == [out.resolve()]
    assert not (out / "config.yaml").exists()  # nothing written under the other run
    with holding_out(out):
        pass

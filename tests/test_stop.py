"""How a run ends: Ctrl-C and SIGTERM stop it resumably, a killed CLI leaves no process or
temporary folder behind, and an --out that holds a run is never silently replaced."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from ssfl import lifecycle, runner
from ssfl.cli import resume_command
from ssfl.experiment import resolve_experiment
from ssfl.lifecycle import (
    OWNER_FILE,
    TAG_VAR,
    RunInterrupted,
    end_processes,
    interrupted_results,
    owner_line,
    record_interruption,
    remove_stale_folders,
    runs_server_app,
    stop_signals,
)
from ssfl.lifecycle import run_processes as tagged_processes
from ssfl.reproduce import TABLES, cell_dir
from tasks.checkpoint import load_checkpoint, save_checkpoint
from tests.conftest import ROOT
from tests.harness import cli, tiny_raw, without_seconds

HELD = {
    "status": "completed",
    "method": "fedseal",
    "config": {"rounds": 4},
    "rounds": [{"round": r} for r in (1, 2, 3, 4)],
}


@pytest.fixture(autouse=True)
def own_tempdir(tmp_path, monkeypatch) -> Path:
    """Temporary folders of the commands run here go to this test's folder."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


@pytest.fixture
def exp(tmp_path: Path) -> Path:
    """Two rounds of FedSEAL on synthetic data (kept momentum: resuming must restore it)."""
    raw = tiny_raw("fedseal")
    raw["rounds"] = 2
    raw["server"]["bootstrap_epochs"] = 0
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def hold_run(out: Path) -> str:
    out.mkdir(parents=True)
    text = json.dumps(HELD)
    (out / "results.json").write_text(text)
    return text


@pytest.fixture
def nothing_starts(monkeypatch) -> None:
    """Fail the test if a command gets as far as starting a SuperLink or a run."""

    def refuse(*args, **kwargs):
        raise AssertionError("a process was started")

    monkeypatch.setattr(runner.LocalSuperLink, "launch", refuse)
    monkeypatch.setattr(runner, "run_simulation", refuse)
    monkeypatch.setattr("ssfl.deploy.run_deployment", refuse)
    monkeypatch.setattr("ssfl.cells.run_simulation", refuse)


# ----- --out that holds a run ----------------------------------------------------------
@pytest.mark.parametrize("command", ["run", "deploy-local"])
def test_an_out_holding_a_run_is_exit_2_naming_it_and_the_choices(
    command, exp, tmp_path, nothing_starts
):
    out = tmp_path / "out"
    before = hold_run(out)
    code, lines = cli(command, str(exp), "--out", str(out))
    assert code == 2 and len(lines) == 1
    assert lines[0] == (
        f"ssfl: error: --out {out} holds a fedseal run (completed, 4 of 4 rounds done); "
        "continue it with --resume, replace it with --overwrite, or choose another --out"
    )
    assert (out / "results.json").read_text() == before


def test_a_killed_run_is_named_from_its_checkpoint_and_metrics(exp, tmp_path, nothing_starts):
    out = tmp_path / "out"
    out.mkdir()
    (out / "checkpoint.pt").write_bytes(b"x")
    (out / "metrics.jsonl").write_text('{"round": 1}\n{"round": 2}\n')
    code, lines = cli("run", str(exp), "--out", str(out))
    assert code == 2 and len(lines) == 1
    assert "holds a killed run (a checkpoint, 2 rounds in metrics.jsonl" in lines[0]


def test_resume_and_overwrite_together_are_refused(exp, tmp_path, nothing_starts):
    code, lines = cli("run", str(exp), "--out", str(tmp_path), "--resume", "--overwrite")
    assert (code, lines) == (
        2,
        ["ssfl: error: --resume and --overwrite exclude each other; give one"],
    )


def test_overwrite_replaces_the_run(exp, tmp_path, monkeypatch):
    out = tmp_path / "out"
    hold_run(out)
    (out / "checkpoint-r002.pt").write_bytes(b"x")
    started = []
    monkeypatch.setattr(runner.LocalSuperLink, "launch", lambda self: None)
    monkeypatch.setattr(runner.LocalSuperLink, "close", lambda self, out=None: None)
    monkeypatch.setattr(runner, "run_simulation", lambda *a, **kw: started.append(kw) or HELD)
    monkeypatch.setattr("ssfl.cli.report", lambda *a: None)
    code, _ = cli("run", str(exp), "--out", str(out), "--overwrite")
    assert code == 0 and started[0]["resume"] is False
    runner.prepare_out(out, resume=False)
    assert not (out / "checkpoint-r002.pt").exists()


@pytest.mark.parametrize("command", ["run", "deploy-local", "sweep", "reproduce"])
def test_an_out_under_a_regular_file_is_one_line(command, exp, tmp_path, nothing_starts):
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = blocker / "sub"
    args = {
        "run": ["run", str(exp)],
        "deploy-local": ["deploy-local", str(exp)],
        "sweep": ["sweep", str(exp), "--set-grid", "client.lr=0.1,0.2"],
        "reproduce": ["reproduce", "fedseal-table1"],
    }[command]
    code, lines = cli(*args, "--out", str(out))
    assert (code, lines) == (
        2,
        [f"ssfl: error: --out {out} is under the file {blocker}; choose a folder"],
    )


def test_a_sweep_cell_holding_another_run_is_refused_before_any_runs(exp, tmp_path, nothing_starts):
    out = tmp_path / "sweep"
    before = hold_run(out / "client.lr=0.2")
    code, lines = cli("sweep", str(exp), "--set-grid", "client.lr=0.1,0.2", "--out", str(out))
    assert code == 2 and len(lines) == 1
    assert lines[0].startswith(
        f"ssfl: error: cell folder {out / 'client.lr=0.2'} holds a fedseal run"
    )
    assert lines[0].endswith("--resume, replace it with --overwrite, or choose another --out")
    assert (out / "client.lr=0.2" / "results.json").read_text() == before


def test_a_sweep_reuses_finished_cells_and_reruns_others_with_overwrite(exp, tmp_path, monkeypatch):
    from ssfl import sweep as sweep_module

    out = tmp_path / "sweep"
    cfg = resolve_experiment(exp, None, None, ["client.lr=0.1"])
    done = {
        **HELD,
        "config": cfg,
        "rounds": [{"round": 1, "test_accuracy": 0.5}],
        "final_test_accuracy": 0.5,
    }
    (out / "client.lr=0.1").mkdir(parents=True)
    (out / "client.lr=0.1" / "results.json").write_text(json.dumps(done))
    hold_run(out / "client.lr=0.2")
    ran = []
    monkeypatch.setattr(
        sweep_module,
        "run_cells",
        lambda cells, jobs: [ran.append((c.out.name, c.folders.overwrite)) or done for c in cells],
    )
    for name in ("sweep_table", "plot_sweep", "plot_curves"):
        monkeypatch.setattr(sweep_module, name, lambda *a, **kw: "")
    code, _ = cli(
        "sweep", str(exp), "--set-grid", "client.lr=0.1,0.2", "--out", str(out), "--overwrite"
    )
    assert code == 0
    assert ran == [("client.lr=0.2", True)]  # client.lr=0.1 is reused


def test_a_reproduce_cell_holding_another_run_is_refused_before_any_runs(tmp_path, nothing_starts):
    table = TABLES["fedseal-table1"]
    row, column = table.rows[-1], list(table.columns)[-1]
    out = tmp_path / "rep"
    held = cell_dir(out, row, column)
    before = hold_run(held)
    code, lines = cli("reproduce", "fedseal-table1", "--out", str(out), "--rounds", "1")
    assert code == 2 and len(lines) == 1
    assert lines[0].startswith(f"ssfl: error: cell folder {held} holds a fedseal run (completed")
    assert (held / "results.json").read_text() == before


# ----- Stale temporary folders ----------------------------------------------------------
def test_a_second_command_removes_stale_temporary_folders_and_keeps_live_ones(own_tempdir):
    live, reused, dead, foreign = (
        own_tempdir / name
        for name in ("ssfl-flwr-home-a", "ssfl-app-b", "ssfl-deploy-c", "ssfl-flwr-home-d")
    )
    for path in (live, reused, dead, foreign):
        path.mkdir()
    (live / OWNER_FILE).write_text(owner_line())
    (reused / OWNER_FILE).write_text(f"{os.getpid()} 1")  # this pid, another process's start
    (dead / OWNER_FILE).write_text(f"{unused_pid()} 5")
    code, _ = cli("compare", str(own_tempdir / "no-such-run"))
    assert code == 2
    assert sorted(p.name for p in own_tempdir.iterdir()) == [live.name, foreign.name]


def unused_pid() -> int:
    """A pid no process has now."""
    pid = os.getpid() + 100_000
    while Path(f"/proc/{pid}").exists():
        pid += 1
    return pid


def test_remove_stale_folders_leaves_other_folders_alone(own_tempdir):
    other = own_tempdir / "something-else"
    other.mkdir()
    (other / OWNER_FILE).write_text(f"{unused_pid()} 5")
    assert remove_stale_folders() == [] and other.is_dir()


# ----- Signals and the interrupted record ----------------------------------------------
def test_sigint_and_sigterm_raise_run_interrupted_and_the_handlers_come_back():
    before = signal.getsignal(signal.SIGINT)
    for sig, code in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
        with pytest.raises(RunInterrupted) as caught, stop_signals():
            os.kill(os.getpid(), sig)
            time.sleep(1)
        assert caught.value.exit_code == code
    assert signal.getsignal(signal.SIGINT) is before


ROWS = [{"round": 1, "test_accuracy": 0.25}, {"round": 2, "test_accuracy": 0.5}]


def checkpointed_out(exp: Path, tmp_path: Path) -> Path:
    """A run folder whose checkpoint holds round 2 of ``exp`` (rows ROWS)."""
    out = tmp_path / "out"
    state = {"round": 2, "config": json.dumps(resolve_experiment(exp)), "rows": json.dumps(ROWS)}
    save_checkpoint(state, out / "checkpoint.pt")
    return out


def test_an_interrupted_run_records_its_checkpoint_rounds(exp, tmp_path):
    out, rows = checkpointed_out(exp, tmp_path), ROWS
    with pytest.raises(RunInterrupted) as caught, record_interruption(out):
        raise RunInterrupted(signal.SIGINT)
    assert (caught.value.out, caught.value.rounds_done) == (out, 2)
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "interrupted" and results["rounds"] == rows
    assert (results["method"], results["rounds_done"], results["final_test_accuracy"]) == (
        "fedseal",
        2,
        0.5,
    )


def test_a_checkpoint_of_older_code_records_its_rounds_with_the_new_keys_defaults(exp, tmp_path):
    """A checkpoint written before a setting existed (here simulation.partial_sums) is read
    with that setting's default; one whose config no longer resolves gives no record."""
    out = tmp_path / "out"
    old = resolve_experiment(exp)
    del old["simulation"]["partial_sums"]
    state = {"round": 2, "config": json.dumps(old), "rows": json.dumps(ROWS)}
    save_checkpoint(state, out / "checkpoint.pt")
    results = interrupted_results(out)
    assert results is not None and results["rounds_done"] == 2
    assert results["config"]["simulation"]["partial_sums"] is False
    gone = {**old, "no_such_section": {"x": 1}}
    save_checkpoint({**state, "config": json.dumps(gone)}, out / "checkpoint.pt")
    assert interrupted_results(out) is None


def test_a_signal_after_the_run_completed_keeps_its_results(exp, tmp_path):
    """Ctrl-C while a finished run shuts down: its completed record stays as written."""
    out, rows = checkpointed_out(exp, tmp_path), ROWS
    old = {"status": "completed", "rounds": rows[:1], "final_test_accuracy": 0.25}
    (out / "results.json").write_text(json.dumps(old))
    stale = (out / "results.json").stat().st_mtime_ns
    with pytest.raises(RunInterrupted), record_interruption(out):
        raise RunInterrupted(signal.SIGINT)
    assert json.loads((out / "results.json").read_text())["status"] == "interrupted"

    done = {"status": "completed", "rounds": rows, "final_local_accuracy": 0.4}
    with pytest.raises(RunInterrupted) as caught, record_interruption(out):
        (out / "results.json").write_text(json.dumps(done))
        os.utime(out / "results.json", ns=(stale + 10**9, stale + 10**9))
        raise RunInterrupted(signal.SIGINT)
    assert (caught.value.out, caught.value.rounds_done) == (out, 2)
    assert json.loads((out / "results.json").read_text()) == done

    with pytest.raises(RunInterrupted), record_interruption(out):
        (out / "results.json").write_text("[]")
        os.utime(out / "results.json", ns=(stale + 2 * 10**9, stale + 2 * 10**9))
        raise RunInterrupted(signal.SIGINT)
    assert json.loads((out / "results.json").read_text())["status"] == "interrupted"


def test_the_resume_command_adds_resume_and_out_and_drops_overwrite():
    argv = ["run", "exp.yaml", "--set", "client.lr=0.1 x", "--overwrite"]
    assert resume_command(argv, Path("runs/a")) == (
        "ssfl run exp.yaml --set 'client.lr=0.1 x' --resume --out runs/a"
    )
    argv = ["sweep", "e.yaml", "--out", "s", "--resume"]
    assert resume_command(argv, Path("s/cell")) == "ssfl sweep e.yaml --out s --resume"


# ----- End to end: the real processes ---------------------------------------------------
def run_processes(tempdir: Path) -> list[int]:
    """Pids of the processes whose FLWR_HOME lies in ``tempdir`` (a run's own scratch homes:
    SuperLink, SuperExecs, SuperNodes, the simulation, Ray's processes)."""
    needle = f"FLWR_HOME={tempdir}".encode()
    pids = []
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if needle in (entry / "environ").read_bytes():
                pids.append(int(entry.name))
    return pids


# A session leader carrying the tag starts a child whose environment lacks it (as Ray's
# agents look once setproctitle has written their title over their environment), then waits.
LEADER = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env={})
print(child.pid, flush=True)
time.sleep(120)
"""


def alive(pid: int) -> bool:
    """Whether ``pid`` is running (a zombie waiting to be reaped counts as ended)."""
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_bytes().rpartition(b")")[2].split()[0] != b"Z"
    return False


def start_tagged_leader() -> tuple[str, subprocess.Popen]:
    """A fresh tag and a process carrying it that leads its own session and prints the pid of
    the untagged child it starts (``LEADER``)."""
    tag = f"test-{os.getpid()}-{time.monotonic_ns()}"
    leader = subprocess.Popen(
        [sys.executable, "-c", LEADER],
        env={**os.environ, TAG_VAR: tag},
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    return tag, leader


@pytest.mark.process
def test_the_watchdog_ends_an_untagged_child_by_its_session_and_spares_other_sessions():
    tag, leader = start_tagged_leader()
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        child = int(leader.stdout.readline())
        sessions: set[int] = set()
        assert sorted(tagged_processes(tag, sessions)) == sorted([leader.pid, child])
        assert sessions == {leader.pid}
        end_processes(tag, grace=2.0, sweep=3.0)
        assert leader.wait(timeout=5) == -signal.SIGTERM
        assert not alive(child)
        assert bystander.poll() is None  # untagged and in the test's session: untouched
    finally:
        for proc in (leader, bystander):
            proc.kill()
            proc.wait()


@pytest.mark.process
def test_a_session_seen_once_still_names_its_members_after_its_leader_ended():
    tag, leader = start_tagged_leader()
    try:
        child = int(leader.stdout.readline())
        sessions: set[int] = set()
        tagged_processes(tag, sessions)
        leader.kill()
        leader.wait(timeout=5)
        assert tagged_processes(tag, sessions) == [child]  # orphaned, untagged, still found
        assert tagged_processes(tag, set()) == []  # a first scan now cannot see it
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
        leader.kill()
        leader.wait()


@pytest.fixture
def short_tmp() -> Path:
    """A temporary folder for the CLI's runs with a short path (Ray's socket paths under it
    must stay within 107 bytes)."""
    folder = Path(tempfile.mkdtemp(prefix="stop-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def start_cli(command: str, exp: Path, out: Path, tempdir: Path, *args: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "ssfl.cli", command, str(exp), "--out", str(out), "--quiet"]
    env = {**os.environ, "TMPDIR": str(tempdir)}
    return subprocess.Popen(
        [*cmd, *args],
        cwd=ROOT,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def wait_for_round(proc: subprocess.Popen, out: Path, rnd: int, timeout: float = 400) -> None:
    """Until round ``rnd``'s checkpoint is written (the next round is then in flight)."""
    deadline = time.monotonic() + timeout
    path = out / "checkpoint.pt"
    while time.monotonic() < deadline and proc.poll() is None:
        with contextlib.suppress(Exception):
            if path.is_file() and load_checkpoint(path)["round"] >= rnd:
                return
        time.sleep(0.2)
    raise AssertionError(f"round {rnd} was not checkpointed (exit {proc.poll()})")


def left_after(tempdir: Path, seconds: float) -> list[str]:
    """What of the run is still there after up to ``seconds`` (its processes' command lines
    and its temporary folders); empty as soon as nothing is."""
    deadline = time.monotonic() + seconds
    while True:
        left = [command_line(pid) for pid in run_processes(tempdir)]
        left += [folder.name for folder in tempdir.glob("ssfl-*")]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.2)


def command_line(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:160].decode()
    return f"pid {pid} (gone)"


def finish(command: str, exp: Path, out: Path, tempdir: Path, *args: str) -> tuple[dict, str]:
    """The results of a command run to its end, and what it said of failures: its standard
    error and the lines of its Flower log that name a failed or rejected client."""
    proc = start_cli(command, exp, out, tempdir, *args)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    log = out / "flower.log"
    lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
    told = [line for line in lines if any(w in line for w in ("failed", "rejected", "ERROR"))]
    return json.loads((out / "results.json").read_text()), "\n".join([err[-3000:], *told[-20:]])


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> list[dict]:
    """The rows of the uninterrupted run (shared by the end-to-end tests)."""
    folder = tmp_path_factory.mktemp("straight")
    raw = tiny_raw("fedseal")
    raw["rounds"] = 2
    raw["server"]["bootstrap_epochs"] = 0
    (folder / "exp.yaml").write_text(yaml.safe_dump(raw))
    runs_tmp = Path(tempfile.mkdtemp(prefix="stop-", dir="/tmp"))
    try:
        results, _ = finish("run", folder / "exp.yaml", folder / "out", runs_tmp)
    finally:
        shutil.rmtree(runs_tmp, ignore_errors=True)
    return without_seconds(results["rounds"])


@pytest.mark.e2e
@pytest.mark.process
def test_ctrl_c_stops_the_run_resumably_and_the_resume_gives_the_straight_numbers(
    exp, tmp_path, short_tmp, straight
):
    out = tmp_path / "out"
    proc = start_cli("run", exp, out, short_tmp)
    wait_for_round(proc, out, 1)
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C does
    sent = time.monotonic()
    _, err = proc.communicate(timeout=60)
    assert time.monotonic() - sent < 10 and proc.returncode == 130
    assert left_after(short_tmp, 1) == []
    results = json.loads((out / "results.json").read_text())
    if results["status"] == "completed":  # the tiny round 2 ended as the run stopped:
        assert without_seconds(results["rounds"]) == straight  # its finished record is kept
        return
    done = results["rounds_done"]
    assert results["status"] == "interrupted" and done in (1, 2)
    assert err.strip().splitlines()[-1] == (
        f"ssfl: interrupted (SIGINT) after round {done}; continue with: ssfl run {exp} "
        f"--out {out} --quiet --resume"
    )
    assert without_seconds(results["rounds"]) == straight[:done]
    resumed, err = finish("run", exp, out, short_tmp, "--resume")
    assert resumed["status"] == "completed"
    assert without_seconds(resumed["rounds"]) == straight, err


@pytest.mark.e2e
@pytest.mark.process
@pytest.mark.parametrize(
    ("command", "whom"), [("run", "cli"), ("run", "group"), ("deploy-local", "cli")]
)
def test_a_sigkilled_cli_leaves_nothing_running_and_resumes(
    command, whom, exp, tmp_path, short_tmp, straight
):
    out = tmp_path / "out"
    proc = start_cli(command, exp, out, short_tmp)
    wait_for_round(proc, out, 1)
    assert run_processes(short_tmp)  # the test sees the run's processes
    if whom == "cli":
        proc.kill()
    else:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert left_after(short_tmp, 30) == []
    resumed, err = finish(command, exp, out, short_tmp, "--resume")
    assert resumed["status"] == "completed"
    assert without_seconds(resumed["rounds"]) == straight, err


def stand_in_simulation(folder: Path) -> tuple[Path, Path]:
    """A script named like Flower's simulation that, as the ServerApp's thread finishing the
    round in flight would, writes a row when it gets SIGTERM; returns it and the row's path."""
    row, server = folder / "row", folder / "flwr-simulation"
    server.write_text(f"trap 'echo round > {row}; exit 0' TERM\nwhile :; do sleep 0.05; done\n")
    return server, row


@pytest.mark.process
def test_the_watchdog_kills_the_serverapp_process_before_it_can_record_a_round(tmp_path):
    """A process named like Flower's simulation that would write a row on SIGTERM (as the
    ServerApp's thread finishes the round in flight) gets SIGKILL first and writes nothing;
    the run's other processes still get SIGTERM."""
    tag = f"test-{os.getpid()}-{time.monotonic_ns()}"
    server, row = stand_in_simulation(tmp_path)
    env = {**os.environ, TAG_VAR: tag}
    simulation = subprocess.Popen(["bash", str(server)], env=env)
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env=env)
    try:
        deadline = time.monotonic() + 10
        while not runs_server_app(simulation.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert runs_server_app(simulation.pid) and not runs_server_app(worker.pid)
        end_processes(tag, grace=2.0, sweep=3.0)
        assert simulation.wait(timeout=5) == -signal.SIGKILL
        assert worker.wait(timeout=5) == -signal.SIGTERM
        time.sleep(0.3)
        assert not row.exists()
    finally:
        for proc in (simulation, worker):
            proc.kill()
            proc.wait()


@pytest.mark.process
@pytest.mark.parametrize(("interrupted", "recorded"), [(True, False), (False, True)])
def test_a_stop_after_ctrl_c_kills_the_serverapp_first_and_a_normal_stop_terms_it(
    tmp_path, monkeypatch, interrupted, recorded
):
    """After Ctrl-C or SIGTERM (``lifecycle.interrupted``) the command's stop gives a process
    named like Flower's simulation SIGKILL before it can write the round in flight; a stop at
    the run's end still gives it SIGTERM, so it finishes what it writes."""
    monkeypatch.setattr(lifecycle, "interrupted", interrupted)
    server, row = stand_in_simulation(tmp_path)
    shell = subprocess.Popen(["bash", "-c", f"bash {server} & wait"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        # The shell's own child: each `sleep` the script forks bears its name until it execs.
        while not (
            found := [p for p in runner.process_tree().get(shell.pid, []) if runs_server_app(p)]
        ):
            assert time.monotonic() < deadline, "the fake simulation did not start"
            time.sleep(0.05)
        (simulation,) = found
        runner.stop_processes([shell], grace=2.0)
        assert not alive(simulation)
        time.sleep(0.3)
        assert row.exists() == recorded
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(shell.pid, signal.SIGKILL)
        shell.wait()

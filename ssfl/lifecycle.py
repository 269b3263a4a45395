"""How a run ends: signals, the processes it started and its temporary folders.

- SIGINT (Ctrl-C) and SIGTERM raise :class:`RunInterrupted` in the CLI, so the code that
  started processes stops them on the way out; the command exits 128 + the signal.
- A watchdog (``python -m ssfl.lifecycle``, in a session of its own) holds the read end of
  a pipe whose write end only the CLI holds. When the CLI ends, however it ends (SIGKILL
  included), the pipe closes and the watchdog ends every process that carries the CLI's
  ``SSFL_RUN_TAG`` in its environment (every Flower and Ray process the run started, and
  theirs), then removes the CLI's temporary folders.
- A temporary folder names its owner (pid and start time) in ``.ssfl-owner``; any later
  ``ssfl`` command removes those whose owner is gone (:func:`remove_stale_folders`).

This module imports neither torch nor Flower: the watchdog starts in a few milliseconds.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

TAG_VAR = "SSFL_RUN_TAG"
OWNER_FILE = ".ssfl-owner"
TEMP_PREFIX = "ssfl-"
# Seconds a process of a run gets to end after SIGTERM before SIGKILL: after the CLI
# ended (the watchdog), after Ctrl-C or SIGTERM (the user is waiting), and otherwise.
TERM_GRACE_S = 3.0
KILL_SWEEP_S = 10.0  # how long the watchdog keeps killing what a dying run still starts
# Flower's processes that run the ServerApp (see ``end_processes``)
SERVER_APP_COMMANDS = ("flwr-simulation", "flwr-serverapp")
QUIET_SCANS = 5  # scans in a row (0.1 s apart) that find none of the run's processes: done
INTERRUPTED_GRACE_S = 1.0
STOP_GRACE_S = 10.0


class RunInterrupted(BaseException):
    """SIGINT or SIGTERM reached the CLI. A BaseException, as KeyboardInterrupt is, so that
    no ``except Exception`` on the way holds it up. ``out``/``rounds_done``: the run it
    interrupted and its last complete round (set by :func:`record_interruption`)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.out: Path | None = None
        self.rounds_done: int | None = None

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def interrupt(signum: int, frame: FrameType | None) -> None:
    """Signal handler: raise RunInterrupted once; later signals are ignored so the
    clean-up it starts (bounded by the stop timeouts) is not cut short."""
    global interrupted
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    interrupted = True
    raise RunInterrupted(signum)


interrupted = False  # whether SIGINT or SIGTERM reached this process (see ``interrupt``)


def stop_grace() -> float:
    """Seconds a stopped process gets between SIGTERM and SIGKILL: a round in flight is
    dropped anyway once the user interrupted the run, so then only a short one."""
    return INTERRUPTED_GRACE_S if interrupted else STOP_GRACE_S


@contextlib.contextmanager
def stop_signals() -> Iterator[None]:
    """Within it, Ctrl-C and SIGTERM raise RunInterrupted (also when the shell started the
    CLI with SIGINT ignored, as a non-interactive shell does for a background job); the
    previous handlers come back on the way out (and stops get their usual grace again)."""
    global interrupted
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in previous:
        signal.signal(sig, interrupt)
    try:
        yield
    finally:
        interrupted = False
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# ----- Owners ---------------------------------------------------------------------------
def start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (Linux), '' elsewhere or when
    the process is gone: with the pid it names one process, even after pid reuse."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]


def owner_line(pid: int | None = None) -> str:
    pid = os.getpid() if pid is None else pid
    return f"{pid} {start_time(pid)}"


def owner_alive(line: str) -> bool:
    """Whether the process an owner line names still runs (the same process, not a reuse)."""
    pid_text, _, started = line.strip().partition(" ")
    if not pid_text.isdigit():
        return False
    pid = int(pid_text)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not started or start_time(pid) == started


def owned_temp_dir(prefix: str) -> Path:
    """A new folder in the temporary directory that names this process as its owner."""
    path = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{prefix}"))
    (path / OWNER_FILE).write_text(owner_line())
    return path


@contextlib.contextmanager
def owned_temp(prefix: str) -> Iterator[Path]:
    """:func:`owned_temp_dir`, removed on the way out."""
    path = owned_temp_dir(prefix)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def remove_stale_folders(root: Path | None = None) -> list[Path]:
    """Remove ssfl's temporary folders whose owner process is gone; return them. Folders
    without an owner file (being made, or not ssfl's) are left alone."""
    root = Path(tempfile.gettempdir()) if root is None else root
    removed = []
    with contextlib.suppress(OSError):
        for path in root.iterdir():
            owner = path / OWNER_FILE
            if not path.name.startswith(TEMP_PREFIX) or not owner.is_file():
                continue
            with contextlib.suppress(OSError):
                if not owner_alive(owner.read_text()):
                    shutil.rmtree(path, ignore_errors=True)
                    removed.append(path)
    return removed


# ----- Interrupted runs -----------------------------------------------------------------
def interrupted_results(out: Path) -> dict | None:
    """results.json of a run interrupted in ``out``: its last checkpoint's rows, with
    ``"status": "interrupted"`` (None when no round completed: nothing to resume)."""
    import json

    from ssfl.experiment import resolve_config
    from ssfl.registry import settings_of
    from tasks.checkpoint import (
        CHECKPOINT_FILE,
        CheckpointError,
        checkpoint_rows,
        load_checkpoint,
    )
    from tasks.config import ConfigError
    from tasks.settings import mapping

    try:
        checkpoint = load_checkpoint(out / CHECKPOINT_FILE)
        rows = checkpoint_rows(out / CHECKPOINT_FILE, checkpoint)
    except CheckpointError:
        return None
    try:  # resolved: a key added to the settings since the checkpoint takes its default
        settings = settings_of(resolve_config(json.loads(checkpoint["config"])))
    except ConfigError:  # a config this code no longer reads: no record, as unreadable
        return None
    accs = [r["test_accuracy"] for r in rows if "test_accuracy" in r]
    return {
        "status": "interrupted",
        "method": settings.method,
        "name": settings.name,
        "dataset": settings.dataset.name,
        "seed": settings.seed,
        "config": mapping(settings),
        "rounds_done": int(checkpoint["round"]),
        "rounds": rows,
        "final_test_accuracy": accs[-1] if accs else None,
        "best_test_accuracy": max(accs) if accs else None,
    }


def results_stamp(out: Path) -> int | None:
    """When ``out/results.json`` was last written (ns), None when there is none."""
    try:
        return (out / "results.json").stat().st_mtime_ns
    except OSError:
        return None


def completed_since(out: Path, stamp: int | None) -> int | None:
    """The last round of a completed run's results.json written in ``out`` after ``stamp``
    (a signal that came while the finished run shut down); None when there is none."""
    import json

    from tasks.results import completed

    if results_stamp(out) in (None, stamp):
        return None
    try:
        results = json.loads((out / "results.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(results, dict) or not completed(results) or not results.get("rounds"):
        return None
    return int(results["rounds"][-1]["round"])


@contextlib.contextmanager
def record_interruption(out: Path) -> Iterator[None]:
    """On RunInterrupted (raised after the run's processes were stopped inside), write
    ``out/results.json`` with ``"status": "interrupted"`` and note the run on the error.

    A results.json the run completed before the signal came (while it shut down) is kept:
    the finished run's record is never replaced by an interrupted one."""
    stamp = results_stamp(out)
    try:
        yield
    except RunInterrupted as err:
        import json

        done = completed_since(out, stamp)
        if done is not None:
            err.out, err.rounds_done = out, done
            raise
        results = interrupted_results(out)
        if results is not None:
            partial = out / "results.json.partial"
            partial.write_text(json.dumps(results, indent=2))
            partial.replace(out / "results.json")
        err.out, err.rounds_done = out, None if results is None else results["rounds_done"]
        raise


# ----- The watchdog ---------------------------------------------------------------------
def session_of(pid: int) -> int | None:
    """The session id of process ``pid`` (field 6 of /proc/PID/stat), or None if it is gone."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        stat = Path(f"/proc/{pid}/stat").read_bytes()
        return int(stat.rpartition(b")")[2].split()[3])
    return None


def run_processes(tag: str, sessions: set[int]) -> list[int]:
    """Pids of the run's processes (other than this one): those whose environment holds
    ``SSFL_RUN_TAG=tag``, and every process in a session that one of them leads.

    A process may overwrite its environment's memory with a long title (Ray's agents do,
    with setproctitle), so its tag is no longer readable; it stays in the session of the
    Ray head that started it. ``sessions`` gathers the sessions led by tagged processes
    across calls, so a process is still found after its leader ended (Linux's /proc; none
    elsewhere)."""
    needle = f"{TAG_VAR}={tag}".encode()
    scanned = [(int(entry.name), entry) for entry in Path("/proc").glob("[0-9]*")]
    table = [(pid, session_of(pid), tagged(entry, needle)) for pid, entry in scanned]
    sessions.update(pid for pid, sid, is_tagged in table if is_tagged and sid == pid)
    return [
        pid
        for pid, sid, is_tagged in table
        if pid != os.getpid() and (is_tagged or sid in sessions)
    ]


def tagged(entry: Path, needle: bytes) -> bool:
    """Whether the environment of the process at ``entry`` (/proc/PID) holds ``needle``."""
    with contextlib.suppress(OSError):
        return needle in (entry / "environ").read_bytes()
    return False


def end_processes(tag: str, grace: float = TERM_GRACE_S, sweep: float = KILL_SWEEP_S) -> None:
    """SIGTERM every process of the run, then SIGKILL those left after ``grace`` seconds,
    sweeping again until QUIET_SCANS scans in a row find none (for up to ``sweep`` seconds):
    a process being ended may still start one (a Ray worker, an actor), and one scan can
    miss a process whose /proc entry is being rewritten.

    The processes that run the ServerApp get SIGKILL first: on SIGTERM Flower's simulation
    ends its main thread while the ServerApp's thread finishes the round in flight, whose
    clients are being ended, and would record and checkpoint it with every client failed.
    The last complete round's checkpoint is already written (atomically)."""
    sessions: set[int] = set()
    pids = run_processes(tag, sessions)
    kill_server_apps(pids)
    signal_all(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while run_processes(tag, sessions) and time.monotonic() < deadline:
        time.sleep(0.1)
    deadline, empty_scans = time.monotonic() + sweep, 0
    while empty_scans < QUIET_SCANS and time.monotonic() < deadline:
        pids = run_processes(tag, sessions)
        empty_scans = 0 if pids else empty_scans + 1
        signal_all(pids, signal.SIGKILL)
        time.sleep(0.1)


def runs_server_app(pid: int) -> bool:
    """Whether process ``pid`` is one of Flower's ServerApp processes (``flwr-simulation``,
    ``flwr-serverapp``): a console script, so its name is the first or second argument."""
    with contextlib.suppress(OSError):
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:2]
        return any(Path(os.fsdecode(arg)).name in SERVER_APP_COMMANDS for arg in argv)
    return False


def kill_server_apps(pids: list[int]) -> None:
    """SIGKILL those of ``pids`` that run the ServerApp (see ``end_processes``)."""
    signal_all([pid for pid in pids if runs_server_app(pid)], signal.SIGKILL)


def signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def watch(tag: str) -> None:
    """The watchdog's body: wait for stdin to close (the CLI ended), then end the run's
    processes and remove the temporary folders it left."""
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    sys.stdin.buffer.read()
    end_processes(tag)
    remove_stale_folders()


class Guard:
    """This process's watchdog and the tag its processes carry (started once, lazily)."""

    _current: Guard | None = None

    def __init__(self) -> None:
        self.tag = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "ssfl.lifecycle", self.tag],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env={k: v for k, v in os.environ.items() if k != TAG_VAR},
        )

    @classmethod
    def current(cls) -> Guard:
        if cls._current is None or cls._current.process.poll() is not None:
            cls._current = cls()
        return cls._current


def run_tag() -> dict[str, str]:
    """The environment entry every process of this CLI's runs carries (starts the watchdog)."""
    return {TAG_VAR: Guard.current().tag}


if __name__ == "__main__":
    watch(sys.argv[1])

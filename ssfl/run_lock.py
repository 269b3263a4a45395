"""One run at a time in a folder: the command running a run holds a lock in its ``--out``, and
every command that would write there first asks whether one is held (docs/reliability.md,
"Checkpoint and resume").

Imports only the standard library (and tasks.config for its error), like ssfl.lifecycle.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

RUN_LOCK = ".ssfl-run.lock"
"""The file in a run's ``--out`` that the running command holds locked (``flock``) while the
run goes on: the kernel frees it when the command ends, however it ends."""


@contextlib.contextmanager
def holding_out(out: Path) -> Iterator[None]:
    """Hold ``out``'s run lock (this process's pid written in it) while the run goes on; a
    one-line ConfigError where another command holds it."""
    import fcntl

    from tasks.config import ConfigError

    out.mkdir(parents=True, exist_ok=True)
    with (out / RUN_LOCK).open("a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(busy_out(out, running_pid(out))) from None
        lock.truncate(0)
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        try:
            yield
        finally:
            lock.truncate(0)


def running_pid(out: Path) -> int | None:
    """The pid of the command running a run in ``out`` (0 when it wrote none yet), None
    when no run goes on there."""
    import fcntl

    path = out / RUN_LOCK
    if not path.is_file():
        return None
    with path.open("r") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = lock.read().strip()
            return int(text) if text.isdigit() else 0
        fcntl.flock(lock, fcntl.LOCK_UN)
    return None


def busy_out(out: Path, pid: int | None, what: str = "--out") -> str:
    """The one line refusing a folder whose run goes on (``what``: how the folder is named)."""
    who = f" (pid {pid})" if pid else ""
    return (
        f"{what} {out} holds a run that is going on{who}; wait for it to end, "
        "or choose another --out"
    )

"""The cells of ``ssfl reproduce`` and ``ssfl sweep``: run one after another in this
process, or ``--jobs N`` at once, each in a process of its own. Just before a cell runs,
its folder is looked at again (another command may have finished it, or be running it).

A cell apart is ``python -m ssfl.cells``, given its resolved config on stdin: the same
run as in process (``run_simulation``, the same config, so the same numbers), with its
own signal handling and watchdog. The parent starts at most N, starts no more once one
has failed (those running finish; finished cells are kept and reused by the next
command), and on Ctrl-C or SIGTERM stops those running, which record their interrupted
runs for ``--resume``. The children carry the parent's run tag, so a parent killed
outright takes them with it (:mod:`ssfl.lifecycle`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ssfl.experiment import REFUSE, CellFolders, reusable_run
from ssfl.lifecycle import RunInterrupted, run_tag, stop_signals
from ssfl.progress import results_line
from ssfl.runner import RunFailed, run_simulation
from tasks.results import load_results
from tasks.settings import Settings, mapping

POLL_S = 0.2  # how often the parent looks at its children
STOP_WAIT_S = 60.0  # how long stopped children get to record their runs before SIGKILL


@dataclass(frozen=True)
class Cell:
    """One run of a table or grid: ``tool`` (reproduce, sweep) and ``label`` name it in
    the lines printed; ``folders``: what to do with a run its folder holds."""

    tool: str
    label: str
    settings: Settings
    out: Path
    folders: CellFolders = REFUSE


def run_here(cell: Cell) -> dict[str, Any]:
    """Run the cell in this process; its results (RunFailed when it fails).

    The folder is looked at again first: another command may have finished the cell
    (reused), or left another run there (resumed, replaced or refused as ``folders``
    says), since the cells were planned."""
    previous = reusable_run(cell.out, cell.settings)
    if previous is not None:
        print(f"ssfl {cell.tool}: {cell.label}: reusing {cell.out}", file=sys.stderr, flush=True)
        return previous
    resume = cell.folders.action(cell.out, cell.settings) == "resume"
    print(f"ssfl {cell.tool}: {cell.label} -> {cell.out}", file=sys.stderr, flush=True)
    results = run_simulation(cell.settings, cell.out, stream=False, resume=resume)
    line = results_line(results, cell.out / "results.json")
    print(f"ssfl {cell.tool}: {cell.label}: {line}", file=sys.stderr, flush=True)
    return results


def run_cells(cells: Sequence[Cell], jobs: int = 1) -> list[dict[str, Any]]:
    """Every cell's results, in order: one after another here, or ``jobs`` at once apart."""
    if jobs <= 1 or len(cells) <= 1:
        return [run_here(cell) for cell in cells]
    return run_apart(cells, jobs)


def child_command() -> list[str]:
    """The command of a cell run apart (its spec comes on stdin)."""
    return [sys.executable, "-m", "ssfl.cells"]


def start_child(cell: Cell) -> subprocess.Popen:
    """Start the cell's process, carrying this process's run tag, and hand it the cell."""
    spec = {
        "tool": cell.tool,
        "label": cell.label,
        "out": str(cell.out),
        "resume": cell.folders.resume,
        "overwrite": cell.folders.overwrite,
        "config": mapping(cell.settings),
    }
    proc = subprocess.Popen(
        child_command(), stdin=subprocess.PIPE, text=True, env={**os.environ, **run_tag()}
    )
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(spec))
    proc.stdin.close()
    return proc


def run_apart(cells: Sequence[Cell], jobs: int) -> list[dict[str, Any]]:
    """Run the cells at most ``jobs`` at a time, each in its own process; their results.

    After a failure no other cell starts; RunFailed names the failed ones once those
    running are done. RunInterrupted (Ctrl-C, SIGTERM): the running ones are stopped
    first, and the error names the furthest interrupted run."""
    waiting = list(range(len(cells)))
    running: dict[int, subprocess.Popen] = {}
    failed: list[tuple[Cell, int]] = []
    started: list[Cell] = []
    try:
        while running or (waiting and not failed):
            while waiting and not failed and len(running) < jobs:
                index = waiting.pop(0)
                running[index] = start_child(cells[index])
                started.append(cells[index])
            time.sleep(POLL_S)
            for index, proc in list(running.items()):
                if proc.poll() is not None:
                    del running[index]
                    if proc.returncode != 0:
                        failed.append((cells[index], proc.returncode))
    except RunInterrupted as err:
        stop_children(list(running.values()))
        note_interrupted(err, started)
        raise
    if failed:
        raise RunFailed(failure_line(failed, len(waiting)))
    return [load_results(cell.out) for cell in cells]


def failure_line(failed: list[tuple[Cell, int]], not_started: int) -> str:
    """What failed, and what was left: one line."""
    names = ", ".join(f"{cell.label} (exit {code})" for cell, code in failed)
    left = f"; {not_started} not started" if not_started else ""
    return f"{len(failed)} cell(s) failed: {names}{left} (their errors are above)"


def stop_children(procs: list[subprocess.Popen]) -> None:
    """SIGTERM every child still running, then wait for it to record its run (SIGKILL
    after ``STOP_WAIT_S``: its watchdog then ends what it started)."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_WAIT_S
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def note_interrupted(err: RunInterrupted, cells: Sequence[Cell]) -> None:
    """Point ``err`` at the interrupted cell with the most rounds done (for the resume
    line), where one recorded a round."""
    best: tuple[int, Path] | None = None
    for cell in cells:
        path = cell.out / "results.json"
        if not path.is_file():
            continue
        res = json.loads(path.read_text())
        done = res.get("rounds_done")
        if res.get("status") != "interrupted" or not isinstance(done, int):
            continue
        if best is None or done > best[0]:
            best = (done, cell.out)
    if best is not None:
        err.rounds_done, err.out = best


def child_main() -> int:
    """``python -m ssfl.cells``: run the cell given on stdin; 0, 1 (failed), 2 (refused)
    or 128 + the signal that interrupted it."""
    from ssfl.registry import settings_of
    from tasks.config import ConfigError

    spec = json.load(sys.stdin)
    folders = CellFolders(resume=spec["resume"], overwrite=spec["overwrite"])
    cell = Cell(
        spec["tool"], spec["label"], settings_of(spec["config"]), Path(spec["out"]), folders
    )
    try:
        with stop_signals():
            run_here(cell)
    except RunFailed as err:
        print(f"ssfl {cell.tool}: {cell.label} failed: {err}", file=sys.stderr)
        return 1
    except (ConfigError, FileNotFoundError) as err:
        print(f"ssfl {cell.tool}: {cell.label}: error: {err}", file=sys.stderr)
        return 2
    except RunInterrupted as err:
        return err.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(child_main())

"""Peak memory of one ``ssfl run``: the summed RSS of the run's whole process tree.

Samples, every ``--interval`` seconds, the resident memory of the ``ssfl run`` process and
of every process below it (SuperLink, SuperExec, the simulation, Ray's workers and actors)
and records the peak, the round count and the client count. With 100 clients and 5 a round
it shows whether memory follows the clients that train at once or all the clients of the
federation. Writes ``--out/memory.json`` and prints one markdown row.

    python benchmarks/peak_memory.py experiments/fmnist-fedsup/fedsup.yaml --rounds 2 \
        --out results/memory-fedsup
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

GIB = 1024**3


def rss_bytes(pid: int) -> int:
    """Resident memory of one process (0 when it has gone)."""
    try:
        with open(f"/proc/{pid}/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return 0


def parents() -> dict[int, int]:
    """pid -> parent pid of every live process."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                # the command name (field 2) may hold spaces: split after its ')'
                out[int(entry)] = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
    return out


def tree(root: int) -> set[int]:
    """``root`` and all its descendants."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents().items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        found.add(pid)
        todo.extend(children.get(pid, []))
    return found


class TreePeak:
    """Peak summed RSS of a process tree, sampled on a thread."""

    def __init__(self, root: int, interval: float):
        self.root, self.interval = root, interval
        self.peak, self.processes = 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.is_set():
            pids = tree(self.root)
            total = sum(rss_bytes(p) for p in pids)
            if total > self.peak:
                self.peak, self.processes = total, len(pids)
            time.sleep(self.interval)

    def __enter__(self) -> TreePeak:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiment")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--interval", type=float, default=0.25, help="seconds between samples")
    parser.add_argument("--out", default="results/memory")
    args = parser.parse_args()
    out = Path(args.out)
    cmd = [sys.executable, "-m", "ssfl.cli", "run", args.experiment, "--rounds", str(args.rounds)]
    cmd += [f"--set={kv}" for kv in args.set] + [
        "--out",
        str(out / "run"),
        "--overwrite",
        "--quiet",
    ]
    started = time.perf_counter()
    proc = subprocess.Popen(cmd)
    with TreePeak(proc.pid, args.interval) as peak:
        rc = proc.wait()
    if rc != 0:
        sys.exit(f"peak_memory: ssfl run exited {rc}")
    res = json.loads((out / "run" / "results.json").read_text())
    result = {
        "experiment": args.experiment,
        "sets": args.set,
        "rounds": len(res["rounds"]),
        "num_clients": res["config"]["split"]["num_clients"],
        "clients_per_round": res["config"]["federation"]["clients_per_round"],
        "peak_rss_bytes": peak.peak,
        "processes_at_peak": peak.processes,
        "wall_seconds": time.perf_counter() - started,
    }
    (out / "memory.json").write_text(json.dumps(result, indent=2))
    print("| experiment | clients (per round) | rounds | peak RSS, whole tree | processes |")
    print("|---|---|---|---|---|")
    print(
        f"| {args.experiment} | {result['num_clients']} ({result['clients_per_round']}) | "
        f"{result['rounds']} | {peak.peak / GIB:.2f} GiB | {peak.processes} |"
    )


if __name__ == "__main__":
    main()

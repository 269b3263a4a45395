"""Run results: metrics.jsonl (one row per round), results.json, accuracy.png, tables."""

from __future__ import annotations

import csv
import io
import json
import logging
import platform
import time
from collections.abc import Mapping, Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

from tasks.config import ConfigError
from tasks.settings import Settings, mapping

log = logging.getLogger("flwr.ssfl")


def pyplot():
    """matplotlib's pyplot on the Agg backend, imported on first use (0.6 s: not at the
    start of every command and process)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# Round metrics that results.json also gives as final_<name> when the last round has them.
FINAL_OF_LAST_ROUND = (
    "aggregate_accuracy",  # the clients' average before the server's step
    "local_accuracy",
    "finetune_accuracy",
    "linear_accuracy",
    # FedoSSL's open-world accuracies and their best over the run (the paper's best round).
    *(
        f"{best}acc_{part}"
        for best in ("", "best_")
        for part in ("all", "seen", "unseen", "lu", "gu")
    ),
)


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo; the platform's processor string elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host() -> dict[str, Any]:
    """What a run's CPU numbers depend on besides seed and config: the packages that compute
    them, and the float rounding of torch's CPU kernels, which changes with the instruction
    set they dispatch to and with the recording (server) process's thread count
    (docs/reference.md, "Determinism")."""
    import torch

    return {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu": cpu_model(),
        "torch": torch.__version__,
        **{name: version(name) for name in ("numpy", "kornia", "flwr")},
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
    }


def csv_value(value: Any) -> Any:
    """A CSV cell: numbers and text as they are, lists and mappings as JSON."""
    return json.dumps(value) if isinstance(value, (list, dict)) else value


def write_csv(rows: Sequence[Mapping[str, Any]], path: Path) -> None:
    """metrics.csv: one row per round, one column per metric (first seen first; a round
    without a metric leaves its cell empty), rewritten whole after each round."""
    columns = list(dict.fromkeys(key for row in rows for key in row))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, restval="", lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: csv_value(v) for k, v in row.items()} for row in rows)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(buffer.getvalue())
    partial.replace(path)


class Recorder:
    """Collects one row per round and writes the run's files into ``out_dir``."""

    def __init__(self, out_dir: Path, settings: Settings, split_summary: Mapping[str, Any]):
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.settings = settings
        self.split = dict(split_summary)
        self.rows: list[dict[str, Any]] = []
        self.started = time.time()
        self.jsonl = self.out_dir / "metrics.jsonl"
        self.jsonl.write_text("")
        self.csv = self.out_dir / "metrics.csv"
        self.csv.unlink(missing_ok=True)  # a previous run's rows are not this run's
        # Wall-clock ends of the start-up stages (the ServerApp's), "finished" added last.
        self.timeline: dict[str, float] = {}
        # The server's device and each client's ({"server": "cuda:0", "clients": {...}}).
        self.devices: dict[str, Any] = {}
        # The commit the run was launched from (ssfl.runner.code_version; "" = not known).
        self.code_version = ""

    def add_round(self, row: Mapping[str, Any]) -> None:
        """Append a round's row to metrics.jsonl and log one progress line."""
        row = dict(row)
        self.rows.append(row)
        with self.jsonl.open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        write_csv(self.rows, self.csv)
        tested = (
            f"  test_accuracy {row['test_accuracy']:.4f}  test_loss {row['test_loss']:.4f}"
            if "test_accuracy" in row
            else ""
        )
        log.info("round %d/%d%s  %.1fs", row["round"], self.settings.rounds, tested, row["seconds"])

    def resume(self, rows: list[dict[str, Any]]) -> None:
        """Start from a checkpoint's rows (a resumed run): kept, and metrics.jsonl rewritten."""
        self.rows = [dict(row) for row in rows]
        self.jsonl.write_text("".join(json.dumps(row) + "\n" for row in self.rows))
        write_csv(self.rows, self.csv)

    def results(self, failure: str | None = None) -> dict[str, Any]:
        """The run's record; ``failure``: the one line of a run that stopped (rule 3 of the
        reliability issue), None for a completed run."""
        accs = [r["test_accuracy"] for r in self.rows if "test_accuracy" in r]
        s = self.settings
        return {
            "status": "failed" if failure else "completed",
            **({"failure": failure} if failure else {}),
            "method": s.method,
            "name": s.name,
            "dataset": s.dataset.name,
            "scenario": s.split.scenario,
            "model": s.model.name,
            "seed": s.seed,
            "config": mapping(s),
            "split": self.split,
            "rounds": self.rows,
            "final_test_accuracy": accs[-1] if accs else None,
            "best_test_accuracy": max(accs) if accs else None,
            **self.final_of_last_round(),
            **self.privacy_spent(),
            "wall_seconds": time.time() - self.started,
            "timeline": {**self.timeline, "finished": time.time()},
            "devices": self.devices,
            "host": host(),
            "code_version": self.code_version or None,
        }

    def final_of_last_round(self) -> dict[str, float]:
        """final_<metric> of the last round's local_accuracy (eval.local_models) and protocol
        accuracies (eval.protocol_every), when recorded."""
        last = self.rows[-1] if self.rows else {}
        return {f"final_{k}": last[k] for k in FINAL_OF_LAST_ROUND if k in last}

    def privacy_spent(self) -> dict[str, Any]:
        """privacy.mode on: the last round's ``epsilon`` (null: no noise, no guarantee) at
        its ``delta`` (strategies/privacy.py)."""
        last = next((r for r in reversed(self.rows) if "delta" in r), None)
        if self.settings.privacy.mode == "none" or last is None:
            return {}
        return {"epsilon": last["epsilon"], "delta": last["delta"]}

    def finish(self, failure: str | None = None) -> dict[str, Any]:
        """Write accuracy.png, then results.json (atomically: a reader that sees the file
        sees the run's every file); return the results (see ``results``)."""
        results = self.results(failure)
        plot_curves([results], self.out_dir / "accuracy.png")
        partial = self.out_dir / "results.json.partial"
        partial.write_text(json.dumps(results, indent=2))
        partial.replace(self.out_dir / "results.json")
        return results


# What every results.json holds (tables and plots read these).
RESULTS_KEYS = ("method", "rounds")


def load_results(path: str | Path) -> dict[str, Any]:
    """results.json of a run directory (or the file itself); a one-line ConfigError when it
    is not JSON or not a run's results."""
    path = Path(path)
    if path.is_dir():
        path = path / "results.json"
    if not path.is_file():
        raise FileNotFoundError(f"no results.json at {path}")
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"{path}: not a readable results.json ({err}); run it again") from err
    missing = [k for k in RESULTS_KEYS if not isinstance(results, dict) or k not in results]
    if missing or not isinstance(results["rounds"], list):
        what = ", ".join(missing) or "rounds as a list"
        raise ConfigError(f"{path}: not an ssfl run's results.json (no {what})")
    return results


def check_metric(runs: Sequence[Mapping[str, Any]], metric: str) -> list[str]:
    """The labels of the runs that lack per-round ``metric``; a one-line ConfigError naming
    the metrics there are when no run has it."""
    lacking = [run_label(r) for r in runs if not any(metric in row for row in r["rounds"])]
    if len(lacking) == len(runs):
        there = sorted(
            {
                k
                for r in runs
                for row in r["rounds"]
                for k, v in row.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "round"
            }
        )
        raise ConfigError(
            f"--metric {metric}: no run records it per round; choose one of {', '.join(there)}"
        )
    return lacking


def completed(results: Mapping[str, Any]) -> bool:
    """Whether a results.json is of a completed run (files from before runs could fail are)."""
    return results.get("status", "completed") == "completed"


def run_label(results: Mapping[str, Any]) -> str:
    return results.get("name") or results["method"]


def plot_curves(
    runs: Sequence[Mapping[str, Any]], path: Path, title: str = "", metric: str = "test_accuracy"
) -> None:
    """A per-round metric (test accuracy by default) of one or more runs in one figure."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for res in runs:
        rows = [r for r in res["rounds"] if metric in r]
        ax.plot([r["round"] for r in rows], [r[metric] for r in rows], label=run_label(res))
    ax.set_xlabel("round")
    ax.set_ylabel(metric.replace("_", " "))
    ax.grid(alpha=0.3)
    if title:
        ax.set_title(title)
    if runs:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def accuracy_at(results: Mapping[str, Any], rnd: int) -> float | None:
    """Test accuracy after round ``rnd`` (None when the run is shorter or did not test it)."""
    return next((r.get("test_accuracy") for r in results["rounds"] if r["round"] == rnd), None)


def cell(value: float | None, spec: str = ".4f") -> str:
    """A table cell: the number formatted, "-" when the run has none (a failed run)."""
    return "-" if value is None else format(value, spec)


def markdown_table(runs: Sequence[Mapping[str, Any]]) -> str:
    """One row per run: method, data, rounds, final accuracy of the global model and of the
    clients' average before the server's step ("-": no server step), best accuracy, time,
    traffic."""
    head = (
        "| run | method | dataset | partitioner | R | rounds | final acc | before server step "
        "| best acc | wall s | MB c2s / round |"
    )
    lines = [head, "|" + "---|" * 11]
    for res in runs:
        rows, split = res["rounds"], res.get("split", {})
        mb = sum(r.get("bytes_c2s", 0) for r in rows) / max(len(rows), 1) / 1e6
        lines.append(
            f"| {run_label(res)} | {res['method']} | {res.get('dataset', '')} | "
            f"{split.get('partitioner', '')} | {split.get('noniid_r', 0):.3f} | "
            f"{len(rows)} | {cell(res.get('final_test_accuracy'))} | "
            f"{cell(res.get('final_aggregate_accuracy'))} | "
            f"{cell(res.get('best_test_accuracy'))} | {cell(res.get('wall_seconds'), '.0f')} | "
            f"{mb:.2f} |"
        )
    return "\n".join(lines)


def plot_sweep(
    series: Mapping[str, Sequence[tuple[Any, float]]], xlabel: str, path: Path, title: str = ""
) -> None:
    """Final test accuracy against a swept value, one line per series.

    Numeric values are placed on a numeric axis; any other values (method names) are
    placed evenly in the order of the first series.
    """
    xs = [x for points in series.values() for x, _ in points]
    numeric = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in xs)
    order = list(dict.fromkeys(xs))
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, points in series.items():
        pos = [x if numeric else order.index(x) for x, _ in points]
        ax.plot(pos, [y for _, y in points], marker="o", label=label or None)
    if not numeric:
        ax.set_xticks(range(len(order)), [str(x) for x in order])
    ax.set_xlabel(xlabel)
    ax.set_ylabel("final test accuracy")
    ax.grid(alpha=0.3)
    if title:
        ax.set_title(title)
    if any(series):
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

"""What ``ssfl run`` and ``ssfl deploy-local`` show and log while a run goes on: one line per
round (round k/N, test accuracy, seconds a round, time left), followed from the run's
OUT/metrics.jsonl, and, with ``--log tensorboard``, every per-round metric as TensorBoard
scalars in OUT/tensorboard/.

Plain text only: the lines carry no terminal codes, so pipes and log files stay readable.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

# Terminal colour and cursor codes (Flower colours its log lines).
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
LOGGERS = ("tensorboard",)
TENSORBOARD_DIR = "tensorboard"

Row = dict[str, Any]


def strip_ansi(text: str) -> str:
    """``text`` without terminal escape codes."""
    return ANSI.sub("", text)


def duration(seconds: float) -> str:
    """A short human duration: 45s, 3m 05s, 1h 02m."""
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m {whole % 60:02d}s"
    return f"{whole // 3600}h {whole % 3600 // 60:02d}m"


def results_line(results: dict[str, Any], path: Path) -> str:
    """A finished run's line: ``final_test_accuracy 0.8240  best_test_accuracy 0.8360
    wall_seconds 10.2  -> PATH`` (``ssfl run``'s last line, each cell's in ``ssfl reproduce``
    and ``ssfl sweep``)."""
    return (
        f"final_test_accuracy {results['final_test_accuracy']:.4f}  "
        f"best_test_accuracy {results['best_test_accuracy']:.4f}  "
        f"wall_seconds {results['wall_seconds']:.1f}  -> {path}"
    )


def progress_line(row: Row, total: int | None, seconds: Sequence[float]) -> str:
    """One round's line: ``round 3/50  test_accuracy 0.8123  12.3 s/round  9m 38s left``;
    ``seconds``: the round times seen so far (their mean estimates the time left);
    ``total`` None: the run's length is unknown (no time left shown). With privacy.mode
    on, the privacy spent follows the accuracy: ``epsilon 2.31 (delta 1e-05)``."""
    rnd = int(row["round"])
    acc = f"  test_accuracy {row['test_accuracy']:.4f}" if "test_accuracy" in row else ""
    acc += privacy_text(row)
    per_round = sum(seconds) / len(seconds) if seconds else 0.0
    line = f"round {rnd}{'' if total is None else f'/{total}'}{acc}  {per_round:.1f} s/round"
    if total is None:
        return line
    return f"{line}  {'done' if rnd >= total else duration(per_round * (total - rnd)) + ' left'}"


def privacy_text(row: Row) -> str:
    """``  epsilon 2.31 (delta 1e-05)`` for a row with the privacy spent (``inf``: no
    noise), else ""."""
    if "delta" not in row:
        return ""
    spent = row.get("epsilon")
    shown = "inf" if spent is None else f"{spent:.2f}"
    return f"  epsilon {shown} (delta {row['delta']:g})"


class MetricsFollower:
    """The rows a run appends to metrics.jsonl, each handed once to every sink (in round
    order). The file as it was when the follower started (a previous run's) is not read: it
    is read once its text differs (the new run's Recorder rewrites it).
    """

    def __init__(self, path: Path, sinks: Sequence[Callable[[Row], None]]):
        self.path = Path(path)
        self.sinks = list(sinks)
        self.last_round = 0
        self.stale = self.text()

    def poll(self) -> None:
        """Hand every complete new row (round above the last handed) to the sinks."""
        for row in self.read_rows():
            if int(row["round"]) > self.last_round:
                self.last_round = int(row["round"])
                for sink in self.sinks:
                    sink(row)

    def close(self) -> None:
        """Hand the last rows on, then close the sinks that hold files."""
        self.poll()
        for sink in self.sinks:
            if isinstance(sink, TensorBoardSink):
                sink.close()

    def text(self) -> str | None:
        """The file's text, None while it cannot be read."""
        try:
            return self.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None

    def read_rows(self) -> list[Row]:
        """The file's complete, parseable rows (a line being written is left for later);
        none while the file is the previous run's, unchanged. Compared by text, not by
        modification time: the file system's clock lags time.time() by up to a tick, so a row
        written just after the follower started could look older than it."""
        text = self.text()
        if text is None or (self.stale is not None and text == self.stale):
            return []
        self.stale = None
        rows = []
        for line in text.splitlines(keepends=True):
            if not line.endswith("\n"):
                break
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and "round" in row:
                rows.append(row)
        return rows


class ProgressPrinter:
    """A sink printing :func:`progress_line` for each row to ``stream`` (stderr)."""

    def __init__(self, total: int | None, stream: TextIO | None = None):
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.seconds: list[float] = []

    def __call__(self, row: Row) -> None:
        if isinstance(row.get("seconds"), (int, float)):
            self.seconds.append(float(row["seconds"]))
        self.stream.write(progress_line(row, self.total, self.seconds) + "\n")
        self.stream.flush()


def scalars(row: Row) -> dict[str, float]:
    """A row's numeric metrics (booleans, lists and the round number left out)."""
    return {
        key: float(value)
        for key, value in row.items()
        if key != "round" and isinstance(value, (int, float)) and not isinstance(value, bool)
    }


class TensorBoardSink:
    """A sink writing each row's metrics as TensorBoard scalars (step = round) into
    ``folder``, through torch's SummaryWriter."""

    def __init__(self, folder: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(folder))

    def __call__(self, row: Row) -> None:
        for key, value in scalars(row).items():
            self.writer.add_scalar(key, value, int(row["round"]))
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def check_loggers(names: Sequence[str]) -> list[str]:
    """The --log values, checked (a ConfigError names the known ones) and importable."""
    from tasks.config import ConfigError

    for name in names:
        if name not in LOGGERS:
            raise ConfigError(f"--log {name}: unknown logger; choose {', '.join(LOGGERS)}")
    if "tensorboard" in names:
        try:
            import tensorboard  # noqa: F401
        except ImportError as err:
            raise ConfigError(
                "--log tensorboard needs the tensorboard package: pip install tensorboard"
            ) from err
    return list(names)


def follow_run(exp: Path, out: Path, stream: bool, loggers: Sequence[str] = ()) -> MetricsFollower:
    """The follower of the run of ``exp`` (its resolved config.yaml) writing into ``out``:
    progress lines when ``stream``, plus the ``loggers`` (see :data:`LOGGERS`)."""
    total = run_rounds(exp)
    sinks: list[Callable[[Row], None]] = [ProgressPrinter(total)] if stream else []
    if "tensorboard" in loggers:
        sinks.append(TensorBoardSink(Path(out) / TENSORBOARD_DIR))
    return MetricsFollower(Path(out) / "metrics.jsonl", sinks)


def run_rounds(exp: Path) -> int | None:
    """The ``rounds`` of a resolved experiment file (None when it cannot be read)."""
    import yaml

    try:
        return int(yaml.safe_load(Path(exp).read_text())["rounds"])
    except (OSError, yaml.YAMLError, TypeError, KeyError, ValueError):
        return None

"""Logs people read: the progress line per round, metrics.csv, TensorBoard scalars, and no
terminal codes in files or pipes."""

from __future__ import annotations

import csv
import io
import json
import os

import pytest

from ssfl.progress import (
    MetricsFollower,
    ProgressPrinter,
    TensorBoardSink,
    check_loggers,
    duration,
    follow_run,
    progress_line,
    strip_ansi,
)
from tasks.config import ConfigError
from tasks.results import write_csv


def test_progress_line_counts_rounds_and_time_left():
    row = {"round": 3, "test_accuracy": 0.81234, "seconds": 12.0}
    assert progress_line(row, 50, [10.0, 12.0, 14.0]) == (
        "round 3/50  test_accuracy 0.8123  12.0 s/round  9m 24s left"
    )
    assert progress_line({"round": 50}, 50, [2.0]) == "round 50/50  2.0 s/round  done"
    assert progress_line({"round": 4}, None, [1.0]) == "round 4  1.0 s/round"


def test_duration():
    assert [duration(s) for s in (4.6, 65, 3725)] == ["5s", "1m 05s", "1h 02m"]


def test_strip_ansi():
    assert strip_ansi("\x1b[92mINFO \x1b[0m:  round 1\x1b[?25l") == "INFO :  round 1"


def append(path, *rows):
    with path.open("a") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)


def test_follower_hands_each_new_complete_row_once(tmp_path):
    path = tmp_path / "metrics.jsonl"
    got: list[int] = []
    follower = MetricsFollower(path, [lambda row: got.append(row["round"])])
    follower.poll()  # no file yet
    append(path, {"round": 1}, {"round": 2})
    with path.open("a") as fh:
        fh.write('{"round": 3')  # being written
    follower.poll()
    follower.poll()
    assert got == [1, 2]
    with path.open("a") as fh:
        fh.write("}\n")
    follower.close()
    assert got == [1, 2, 3]


def test_follower_skips_a_previous_runs_file(tmp_path):
    path = tmp_path / "metrics.jsonl"
    append(path, {"round": 1}, {"round": 2})
    os.utime(path, (1_000_000, 1_000_000))
    got: list[int] = []
    follower = MetricsFollower(path, [lambda row: got.append(row["round"])])
    follower.poll()
    assert got == []
    path.write_text(json.dumps({"round": 1}) + "\n")  # the new run's Recorder rewrites it
    follower.poll()
    assert got == [1]


def test_follower_reads_a_new_runs_file_whatever_its_modification_time(tmp_path):
    """The file system's clock lags time.time() by up to a tick: a first row written just
    after the follower started can carry an earlier mtime; it is still this run's."""
    path = tmp_path / "metrics.jsonl"
    got: list[int] = []
    follower = MetricsFollower(path, [lambda row: got.append(row["round"])])
    append(path, {"round": 1})
    os.utime(path, (1_000_000, 1_000_000))
    follower.poll()
    assert got == [1]


def test_printer_writes_plain_lines(tmp_path):
    stream = io.StringIO()
    printer = ProgressPrinter(2, stream)
    printer({"round": 1, "test_accuracy": 0.5, "seconds": 3.0})
    printer({"round": 2, "seconds": 5.0})
    assert stream.getvalue() == (
        "round 1/2  test_accuracy 0.5000  3.0 s/round  3s left\nround 2/2  4.0 s/round  done\n"
    )


def test_follow_run_reads_the_rounds_of_the_resolved_config(tmp_path, capsys):
    exp = tmp_path / "config.yaml"
    exp.write_text("method: fedseal\nrounds: 7\n")
    follower = follow_run(exp, tmp_path, stream=True)
    append(tmp_path / "metrics.jsonl", {"round": 1, "seconds": 1.0})
    follower.close()
    assert capsys.readouterr().err == "round 1/7  1.0 s/round  6s left\n"


def test_metrics_csv_has_a_column_per_metric(tmp_path):
    rows = [
        {"round": 1, "seconds": 1.5, "failed_partitions": [2]},
        {"round": 2, "seconds": 1.0, "test_accuracy": 0.5},
    ]
    write_csv(rows, tmp_path / "metrics.csv")
    with (tmp_path / "metrics.csv").open() as fh:
        read = list(csv.DictReader(fh))
    assert list(read[0]) == ["round", "seconds", "failed_partitions", "test_accuracy"]
    assert read[0] == {
        "round": "1",
        "seconds": "1.5",
        "failed_partitions": "[2]",
        "test_accuracy": "",
    }
    assert read[1]["test_accuracy"] == "0.5" and read[1]["failed_partitions"] == ""


def test_an_unknown_logger_is_refused():
    with pytest.raises(ConfigError, match="--log wandb: unknown logger; choose tensorboard"):
        check_loggers(["wandb"])


def test_tensorboard_gets_every_numeric_metric(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sink = TensorBoardSink(tmp_path / "tb")
    sink({"round": 1, "test_accuracy": 0.25, "bytes_c2s": 100, "failed_partitions": [1]})
    sink({"round": 2, "test_accuracy": 0.5, "bytes_c2s": 100, "stalled": False})
    sink.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert sorted(events.Tags()["scalars"]) == ["bytes_c2s", "test_accuracy"]
    assert [(e.step, e.value) for e in events.Scalars("test_accuracy")] == [(1, 0.25), (2, 0.5)]


@pytest.mark.parametrize(
    ("value", "text"), [(-0.0, "0.000"), (-0.0004, "0.000"), (0.4, "0.400"), (-0.25, "-0.250")]
)
def test_the_header_prints_no_negative_zero(value, text):
    from ssfl.cli import fixed

    assert fixed(value, 3) == text

"""benchmarks/scale.py: its arguments refused with one line, and (slow tier) the JSON of two
client counts from real `ssfl run` processes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

SCRIPT = str(ROOT / "benchmarks/scale.py")


def scale(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, SCRIPT, *args], capture_output=True, text=True, cwd=ROOT, timeout=900
    )


@pytest.mark.parametrize(
    ("clients", "message"),
    [
        ("10,ten", "expected integers separated by commas"),
        ("0,10", "every count must be at least 1"),
        ("5,10", "every client count must be at least --per-round (10)"),
    ],
)
def test_bad_client_counts_exit_with_one_line(tmp_path, clients, message):
    proc = scale(
        "experiments/quickstart.yaml", "--clients", clients, "--json", str(tmp_path / "s.json")
    )
    assert proc.returncode != 0
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "s.json").exists()


@pytest.mark.slow  # two `ssfl run` processes of 2 rounds each
@pytest.mark.process
def test_two_client_counts_give_one_row_each_with_the_same_round_work(tmp_path):
    target = tmp_path / "scale.json"
    proc = scale(
        "experiments/quickstart.yaml",
        "--clients", "3,6",
        "--per-round", "3",
        "--client-size", "100",
        "--json", str(target),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(target.read_text())
    assert [r["clients"] for r in report["runs"]] == [3, 6]
    assert (report["rounds"], report["per_round"], report["client_size"]) == (2, 3, 100)
    for run in report["runs"]:
        assert 0.1 < run["peak_rss_gib"] < 20
        assert run["startup_seconds"] > 0 and run["round_seconds"] > 0
        assert len(run["rounds_seconds"]) == 2
        assert run["wall_seconds"] == pytest.approx(
            run["startup_seconds"] + sum(run["rounds_seconds"])
        )
    assert target.with_suffix(".png").stat().st_size > 0
    assert "| 6 |" in proc.stdout

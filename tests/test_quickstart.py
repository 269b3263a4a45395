"""The quickstart as a newcomer runs it: from another folder, through the installed
``ssfl`` command; plain progress lines in a pipe, the files a run keeps, TensorBoard events."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from ssfl.runner import code_version

pytestmark = [pytest.mark.e2e, pytest.mark.process, pytest.mark.slow]


def test_the_quickstart_runs_from_any_folder_with_plain_logs(tmp_path):
    pytest.importorskip("tensorboard")
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "ssfl.cli", "run", "quickstart", "--rounds", "2"]
    cmd += ["--out", str(out), "--log", "tensorboard"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "\x1b" not in proc.stderr and "\x1b" not in (out / "flower.log").read_text()
    progress = [line for line in proc.stderr.splitlines() if line.startswith("round ")]
    assert len(progress) == 2
    assert re.fullmatch(
        r"round 1/2  test_accuracy 0\.\d{4}  \d+\.\d s/round  \S+ left", progress[0]
    )
    assert progress[1].endswith("done")
    results = json.loads((out / "results.json").read_text())
    assert results["name"] == "quickstart" and len(results["rounds"]) == 2
    assert results["code_version"] == (code_version() or None)  # this checkout's commit
    assert (out / "model.pt").stat().st_size > 0
    assert len((out / "metrics.csv").read_text().splitlines()) == 3
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    assert proc.stdout.startswith(f"final_test_accuracy {results['final_test_accuracy']:.4f}")

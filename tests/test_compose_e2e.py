"""scripts/compose-e2e.sh: the containers for real. The image built offline, the SuperLink,
two SuperNodes (one an edge machine set up by the steps of docs/deployment.md, training on
its own data folder) and their SuperExecs as containers with TLS and node authentication;
2 rounds equal to simulation to 4 decimals; a SuperNode container killed mid-run and counted
again once restarted.

Slow tier and ``process``: it builds images and trains for minutes. Without a Docker engine
it skips, except in CI, where .ci/run starts one and a missing engine fails the test.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from tests.conftest import ROOT


def docker_engine() -> bool:
    return (
        shutil.which("docker") is not None
        and subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode == 0
    )


@pytest.mark.slow
@pytest.mark.process
def test_compose_e2e_script_runs_the_containers_as_simulation_does():
    if not docker_engine():
        if os.environ.get("CI"):
            pytest.fail("no Docker engine answers: .ci/run installs docker.io and starts dockerd")
        pytest.skip("no Docker engine here")
    proc = subprocess.run(
        ["bash", "scripts/compose-e2e.sh"], cwd=ROOT, capture_output=True, text=True, timeout=2400
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    rounds = re.findall(
        r"round (\d): test accuracy containers (\d\.\d{4}), simulation (\d\.\d{4}); clients 2",
        proc.stdout,
    )
    assert [r[0] for r in rounds] == ["1", "2"], proc.stdout[-4000:]
    assert all(deployed == simulated for _, deployed, simulated in rounds)
    assert "round 4 counted it again (clients 2, failures 0)" in proc.stdout

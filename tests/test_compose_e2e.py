"""scripts/compose-e2e.sh: the containers for real. The image built offline, the SuperLink,
two SuperNodes (one an edge machine set up by the steps of docs/deployment.md, training on
its own data folder) and their SuperExecs as containers with TLS and node authentication;
2 rounds equal to simulation to 4 decimals; a SuperNode container killed mid-run and counted
again once restarted.

Slow tier and ``process``: it builds images and trains for minutes. Without a Docker engine
it skips, except in CI, where .ci/run starts one and a missing engine fails the test. The
script's start-up cleanup of killed earlier runs is checked in the everyday tier, against a
fake ``docker``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

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


def test_only_the_projects_of_killed_runs_are_removed_before_a_run(tmp_path):
    """compose-e2e.sh's start: a project whose script process is gone is removed (its containers
    restart with the engine), a live run's project and other projects are left alone."""
    script = (ROOT / "scripts" / "compose-e2e.sh").read_text()
    functions = re.findall(
        r"^(?:remove_projects|stale_projects)\(\) \{\n.*?^\}$", script, re.S | re.M
    )
    assert len(functions) == 2
    dead = int((Path("/proc/sys/kernel/pid_max")).read_text()) + 1  # no process has it
    live = os.getpid()
    # one project per container: a killed run's twice, a live run's, another tool's
    labels = [f"ssfl-e2e-edge-{dead}", f"ssfl-e2e-server-{live}", f"other-{dead}"] * 2
    calls = tmp_path / "calls"
    fake = tmp_path / "docker"
    fake.write_text(
        "#!/bin/bash\n"
        f'echo "$*" >> {calls}\n'
        'if [ "$1 $2 $3" = "ps -a --format" ]; then\n'
        f"  printf '%s\\n' {' '.join(labels)}\n"
        'elif [ "$1 $2" = "ps -aq" ]; then echo container-of-${4##*=}; fi\n'
    )
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    proc = subprocess.run(
        [
            "bash",
            "-euo",
            "pipefail",
            "-c",
            "\n".join(functions) + "\nremove_projects $(stale_projects)",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    removed = [line for line in calls.read_text().splitlines() if " rm" in f" {line}"]
    assert removed == [
        f"rm -f container-of-ssfl-e2e-edge-{dead}",
        f"network rm ssfl-e2e-edge-{dead}_default",
    ]

"""scripts/setup.sh picks the torch build (cpu, cuda, system) from SSFL_TORCH, a wheelhouse's
record or nvidia-smi; it and scripts/wheelhouse.sh refuse bad input with one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.process]

SETUP = ROOT / "scripts" / "setup.sh"
WHEELHOUSE = ROOT / "scripts" / "wheelhouse.sh"


def fake_nvidia_smi(folder: Path, output: str, code: int = 0) -> Path:
    """A folder holding an ``nvidia-smi`` that prints ``output`` and exits with ``code``."""
    folder.mkdir()
    exe = folder / "nvidia-smi"
    exe.write_text(f"#!/bin/sh\necho '{output}'\nexit {code}\n")
    exe.chmod(0o755)
    return folder


def run(
    script: Path, *args: str, path: str, timeout: float = 30, **env: str
) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k != "SSFL_TORCH"}
    return subprocess.run(
        ["bash", str(script), *args],
        env={**base, "PATH": path, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def bare_path(tmp_path) -> str:
    """A PATH with no nvidia-smi: the system's tools only."""
    return f"{tmp_path / 'empty'}:/usr/bin:/bin"


def choice(*args: str, path: str, **env: str) -> str:
    done = run(SETUP, "--print-choice", *args, path=path, **env)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_no_nvidia_smi_is_cpu(bare_path):
    assert choice(path=bare_path) == "cpu"


def test_an_nvidia_smi_listing_a_gpu_is_cuda(tmp_path, bare_path):
    gpu = fake_nvidia_smi(tmp_path / "gpu", "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)")
    assert choice(path=f"{gpu}:{bare_path}") == "cuda"


def test_an_nvidia_smi_without_a_driver_is_cpu(tmp_path, bare_path):
    broken = fake_nvidia_smi(tmp_path / "broken", "NVIDIA-SMI has failed", code=9)
    assert choice(path=f"{broken}:{bare_path}") == "cpu"


@pytest.mark.parametrize("forced", ["cpu", "cuda", "system"])
def test_ssfl_torch_forces_the_build(tmp_path, bare_path, forced):
    gpu = fake_nvidia_smi(tmp_path / "gpu", "GPU 0: NVIDIA H100 (UUID: GPU-0)")
    assert choice(path=f"{gpu}:{bare_path}", SSFL_TORCH=forced) == forced


@pytest.mark.parametrize(
    ("recorded", "picked"), [("cpu", "cpu"), ("cuda", "cuda"), ("none", "system")]
)
def test_offline_takes_the_wheelhouse_build(tmp_path, bare_path, recorded, picked):
    house = tmp_path / "wheels"
    house.mkdir()
    (house / "ssfl-torch.txt").write_text(f"{recorded}\n")
    assert choice("--offline", str(house), path=bare_path) == picked
    assert choice("--offline", str(house), path=bare_path, SSFL_TORCH="cpu") == "cpu"


@pytest.mark.parametrize(
    ("script", "args", "env", "message"),
    [
        (SETUP, ["--print-choice"], {"SSFL_TORCH": "rocm"}, "SSFL_TORCH=rocm: expected"),
        (SETUP, ["--offline", "/nonexistent/wheels"], {}, "--offline /nonexistent/wheels: no"),
        (SETUP, ["--fast"], {}, "unknown argument '--fast'"),
        (WHEELHOUSE, [], {}, "usage: wheelhouse.sh DIR"),
        (WHEELHOUSE, ["w", "--torch", "rocm"], {}, "--torch rocm: expected"),
        (WHEELHOUSE, ["w", "--python-version", "3"], {}, "--python-version 3: expected"),
        (WHEELHOUSE, ["w", "--platform", "win_amd64"], {}, "--platform win_amd64: expected"),
        (WHEELHOUSE, ["w", "--platform"], {}, "--platform needs a value"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(bare_path, script, args, env, message):
    done = run(script, *args, path=bare_path, **env)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and message in done.stderr
    assert not done.stdout


def test_system_without_a_torch_to_reuse_is_one_line_and_exit_2(tmp_path, bare_path):
    """A copy of the script in a bare folder: the .venv it makes sees no torch."""
    base = subprocess.run(
        [sys.executable, "-c", "import sys; print(sys.base_prefix)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    python = Path(base) / "bin" / "python3"
    if subprocess.run([str(python), "-c", "import torch"], capture_output=True).returncode == 0:
        pytest.skip("the base interpreter has torch: setup would install from it")
    (tmp_path / "scripts").mkdir()
    script = tmp_path / "scripts" / "setup.sh"
    script.write_text(SETUP.read_text())
    (tmp_path / "scripts" / "pins.sh").write_text((SETUP.parent / "pins.sh").read_text())
    done = run(script, path=bare_path, timeout=300, SSFL_TORCH="system", PYTHON=str(python))
    assert done.returncode == 2
    assert done.stderr.startswith("setup.sh: SSFL_TORCH=system: .venv cannot import torch")
    assert done.stderr.count("\n") == 1
    assert (
        (tmp_path / ".venv" / "pyvenv.cfg").read_text().count("include-system-site-packages = true")
    )

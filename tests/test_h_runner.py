"""What ``ssfl run`` hands Flower's simulation and keeps of its output."""

from __future__ import annotations

import io
import subprocess
import sys
from types import SimpleNamespace

import pytest

from ssfl.experiment import resolve_config
from ssfl.runner import SIZE_WARNING, _copy_lines, federation_config, flwr_env


def test_federation_config_runs_one_supernode_per_client():
    cfg = resolve_config(
        {"split": {"num_clients": 3}, "simulation": {"num_cpus": 2, "num_gpus": 0.5}}
    )
    pairs = dict(item.split("=") for item in federation_config(cfg).split())
    assert pairs == {
        "num-supernodes": "3",
        "client-resources-num-cpus": "2",
        "client-resources-num-gpus": "0.5",
    }


def test_flowers_federation_size_warning_is_neither_logged_nor_echoed(capsys):
    output = (
        "Successfully started run 7\n"
        "\x1b[93mWARNING \x1b[0m:   Since flwr 1.32, default simulated SuperNodes changed "
        "from 10 to 2.\n"
        "\x1b[92mINFO \x1b[0m:      Federation `@none/default` (3 simulated SuperNodes)\n"
        "\x1b[92mINFO \x1b[0m:      round 1/1  test_accuracy 0.1000\n"
    )
    lines: list[str] = []
    log = io.StringIO()
    _copy_lines(SimpleNamespace(stdout=io.StringIO(output)), lines, log, echo=True)
    echoed = capsys.readouterr().err
    kept = output.splitlines(keepends=True)
    del kept[1]
    assert lines == kept and log.getvalue() == "".join(kept)
    assert SIZE_WARNING not in echoed and "round 1/1" in echoed and "started run 7" in echoed


RAY_WORKERS = """
import os, sys
import ray
ray.init(runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(sys.path)}},
         include_dashboard=False, num_cpus=2, logging_level="ERROR")
actor = ray.remote(num_cpus=1)(type("Actor", (), {"pid": lambda self: os.getpid()})).remote()
ray.get(actor.pid.remote())
logs = ray._private.worker._global_node.get_logs_dir_path()
print(sum(name.startswith("python-core-worker") for name in os.listdir(logs)))
ray.shutdown()
"""


@pytest.mark.e2e
def test_ray_under_flowers_environment_starts_only_the_workers_the_actors_use(
    tmp_path, monkeypatch
):
    # Flower's RayBackend gives its actors a runtime_env; Ray's default would also start two
    # idle workers (one per CPU) for the driver. Under flwr_env: the actor's worker only.
    monkeypatch.delenv("RAY_prestart_worker_first_driver", raising=False)
    run = subprocess.run(
        [sys.executable, "-c", RAY_WORKERS],
        env=flwr_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split()[-1] == "1"

"""Clients get the GPU: the share arithmetic, the refusals of device 'cuda', the devices
results.json records, and (with a fake GPU resource in Ray) what an actor then sees."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ssfl import cli, gpu, runner
from ssfl.experiment import resolve_config
from ssfl.gpu import AUTO_SHARE, auto_share, check_run_device, client_gpu_share
from ssfl.registry import settings_of
from tasks.config import ConfigError
from tasks.results import Recorder
from tasks.settings import Settings
from tasks.train import device_name
from tests.harness import InProcessGrid, run_method, tiny_raw


def cfg_of(**sections) -> Settings:
    return settings_of(resolve_config({"method": "fedavg_fixmatch", **sections}))


@pytest.mark.parametrize(
    ("gpus", "clients", "share"),
    [(1, 4, 0.25), (1, 3, 0.3333), (1, 10, 0.1), (2, 4, 0.5), (1, 1, 1.0), (4, 2, 1.0)],
)
def test_auto_share_divides_the_gpus_among_a_rounds_clients(gpus, clients, share):
    assert auto_share(gpus, clients) == pytest.approx(share, abs=1e-12)
    assert clients * auto_share(gpus, clients) <= max(gpus, clients) + 1e-9


def test_auto_share_is_never_below_rays_resource_step():
    assert auto_share(1, 100_000) == gpu.SHARE_STEP


def test_the_default_share_is_auto_and_follows_device_gpus_and_clients_a_round():
    assert cfg_of().simulation.num_gpus == AUTO_SHARE
    assert client_gpu_share(cfg_of(), gpus=0) == 0.0
    assert client_gpu_share(cfg_of(device="cpu"), gpus=1) == 0.0
    assert client_gpu_share(cfg_of(split={"num_clients": 10}), gpus=1) == 0.1
    sampled = cfg_of(split={"num_clients": 10}, federation={"clients_per_round": 4})
    assert client_gpu_share(sampled, gpus=1) == 0.25


def test_an_explicit_share_wins_on_any_device():
    assert client_gpu_share(cfg_of(simulation={"num_gpus": 0.5}), gpus=1) == 0.5
    assert client_gpu_share(cfg_of(device="cpu", simulation={"num_gpus": 0.2}), gpus=0) == 0.2


@pytest.mark.parametrize("bad", [-0.5, -2.0, 1.5])
def test_a_share_neither_auto_nor_a_fraction_is_refused(bad):
    with pytest.raises(ConfigError, match=r"simulation\.num_gpus"):
        cfg_of(simulation={"num_gpus": bad})


def test_device_cuda_needs_a_gpu_and_a_nonzero_share():
    with pytest.raises(ConfigError, match="no CUDA GPU"):
        check_run_device(cfg_of(device="cuda"), gpus=0)
    with pytest.raises(ConfigError, match="zero GPU share"):
        check_run_device(cfg_of(device="cuda", simulation={"num_gpus": 0.0}), gpus=1)
    assert check_run_device(cfg_of(device="cuda", split={"num_clients": 4}), gpus=1) == 0.25
    assert check_run_device(cfg_of(device="auto"), gpus=0) == 0.0


def test_federation_config_carries_the_auto_share(monkeypatch):
    monkeypatch.setattr(gpu, "gpu_count", lambda: 1)
    pairs = dict(item.split("=") for item in runner.federation_config(cfg_of()).split())
    assert pairs["client-resources-num-gpus"] == "0.1"  # 10 clients share one GPU
    assert "client-resources-num-gpus=0.0" in runner.federation_config(cfg_of(device="cpu"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_ssfl_run_device_cuda_without_a_gpu_is_one_line_and_exit_2_before_any_process(
    monkeypatch, capsys
):
    def no_process(*args, **kwargs):
        raise AssertionError("a process was started")

    monkeypatch.setattr(runner.LocalSuperLink, "booting", no_process)
    code = cli.main(["run", "experiments/fmnist-las/fedseal.yaml", "--set", "device=cuda"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "no CUDA GPU" in err


def test_ssfl_run_device_cuda_with_a_zero_share_is_refused_before_any_process(monkeypatch, capsys):
    monkeypatch.setattr(gpu, "gpu_count", lambda: 1)
    monkeypatch.setattr(runner.LocalSuperLink, "booting", lambda: pytest.fail("started"))
    sets = ["--set", "device=cuda", "--set", "simulation.num_gpus=0"]
    assert cli.main(["run", "experiments/fmnist-las/fedseal.yaml", *sets]) == 2
    assert "zero GPU share" in capsys.readouterr().err


@pytest.mark.slow
def test_clients_report_their_device_and_the_server_its_own(tmp_path):
    raw = tiny_raw("fedavg_fixmatch")
    raw["rounds"] = 1
    _, strategy = run_method(raw, InProcessGrid(3))
    assert strategy.devices["server"] == "cpu"
    assert set(strategy.devices["clients"]) == {"0", "1"}  # 2 of 3 clients a round
    assert set(strategy.devices["clients"].values()) == {"cpu"}
    recorder = Recorder(tmp_path, strategy.server.settings, {})
    recorder.devices = strategy.devices
    recorder.finish()
    assert json.loads((tmp_path / "results.json").read_text())["devices"] == strategy.devices


def test_device_name_names_cpu_and_cuda_with_their_index():
    assert device_name(torch.device("cpu")) == "cpu"
    assert device_name(torch.device("cuda", 2)) == "cuda:2"


# Ray with a fake GPU resource: actors asking for the share the run would give see the GPU.
FAKE_GPU = """
import json, os, sys
import ray
from ssfl.experiment import resolve_config
from ssfl.gpu import client_gpu_share

from ssfl.registry import settings_of
cfg = resolve_config({"method": "fedavg_fixmatch", "split": {"num_clients": 4}})
share = client_gpu_share(settings_of(cfg), gpus=1)
ray.init(num_cpus=4, num_gpus=1, include_dashboard=False, logging_level="ERROR",
         runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(sys.path)}})

@ray.remote
class Client:
    def visible(self):
        return os.environ.get("CUDA_VISIBLE_DEVICES"), [str(g) for g in ray.get_gpu_ids()]

shared = [Client.options(num_cpus=1, num_gpus=share).remote() for _ in range(4)]
hidden = Client.options(num_cpus=0, num_gpus=0).remote()
seen = ray.get([c.visible.remote() for c in shared] + [hidden.visible.remote()])
print(json.dumps({"share": share, "shared": seen[:4], "hidden": seen[4]}))
ray.shutdown()
"""


@pytest.mark.process
def test_with_a_fake_gpu_every_client_actor_gets_a_share_and_sees_the_gpu():
    proc = subprocess.run(
        [sys.executable, "-c", FAKE_GPU],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["share"] == 0.25
    assert seen["shared"] == [["0", ["0"]]] * 4  # four actors at once on the one GPU
    assert seen["hidden"][0] == ""  # a zero share hides the GPU

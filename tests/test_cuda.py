"""On a CUDA GPU (skipped without one): every registered method for one round in process
with server and clients on the GPU, in float32 and in bf16 + channels-last; a resumed run
within the GPU tolerance of an uninterrupted one; the speed options."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from benchmarks.gpu_step import experiment
from client_app.base import client_data
from client_app.fixmatch import FixMatchClient
from ssfl.experiment import resolve_config
from ssfl.registry import METHODS, method, settings_of
from strategies.loop import RoundLoop
from strategies.parts import ServerSide
from tasks.checkpoint import load_checkpoint
from tasks.data import dataset_info
from tasks.models import model_for
from tasks.partition import get_split
from tasks.settings import ModelSettings
from tests.harness import InProcessGrid, tiny_raw

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

CUDA = torch.device("cuda")
# A resumed GPU run may differ from an uninterrupted one by float rounding (atomic adds in
# e.g. adaptive pooling's backward have no fixed order): on the 40 test images, at most 2
# predictions (0.05 accuracy) and 5% of the test loss.
ACCURACY_TOLERANCE = 0.05
LOSS_TOLERANCE = 0.05
SPEED = {"train": {"amp": "bf16"}, "model": {"channels_last": True}}


def cuda_raw(name: str, rounds: int, speed: bool = False) -> dict:
    raw = {**tiny_raw(name), "rounds": rounds, "device": "cuda"}
    for key, values in (SPEED if speed else {}).items():
        raw[key] = {**raw.get(key, {}), **values}
    return raw


def cuda_strategy(raw: dict) -> RoundLoop:
    cfg = resolve_config(raw)
    dataset, split = get_split(settings_of(cfg))
    server = ServerSide.build(settings_of(cfg), dataset, split, CUDA)
    return method(cfg["method"]).server_half().strategy(server, lambda row: None)


def run_rounds(raw: dict, folder: Path, resume: bool = False) -> list[dict]:
    strategy = cuda_strategy(raw)
    strategy.checkpoint_path = folder / "checkpoint.pt"
    if resume:
        strategy.resume_from(load_checkpoint(strategy.checkpoint_path))
    strategy.start(
        InProcessGrid(3, state_path=str(folder / "client-state")), num_rounds=raw["rounds"]
    )
    return strategy.rows


@pytest.mark.slow
@pytest.mark.parametrize("speed", [False, True], ids=["fp32", "bf16-channels-last"])
@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_runs_a_round_with_server_and_clients_on_the_gpu(name, speed):
    strategy = cuda_strategy(cuda_raw(name, rounds=1, speed=speed))
    strategy.start(InProcessGrid(3), num_rounds=1)
    (row,) = strategy.rows
    assert 0.0 <= row["test_accuracy"] <= 1.0 and math.isfinite(row["test_loss"])
    assert next(strategy.server.model.parameters()).is_cuda
    clients = strategy.devices["clients"]
    assert strategy.devices["server"] == "cuda:0"
    assert METHODS[name].client is None or (clients and set(clients.values()) == {"cuda:0"})


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fedavg_fixmatch", "fedmatch", "fedseal"])
def test_a_resumed_gpu_run_is_within_the_tolerance_of_an_uninterrupted_one(name, tmp_path):
    raw = cuda_raw(name, rounds=3)
    straight = run_rounds(raw, tmp_path / "straight")
    two = run_rounds({**raw, "rounds": 2}, tmp_path / "killed")
    resumed = run_rounds(raw, tmp_path / "killed", resume=True)
    assert [r["round"] for r in resumed] == [1, 2, 3] and two[-1]["round"] == 2
    for a, b in zip(straight, resumed):
        assert abs(a["test_accuracy"] - b["test_accuracy"]) <= ACCURACY_TOLERANCE
        assert abs(a["test_loss"] - b["test_loss"]) <= LOSS_TOLERANCE * a["test_loss"]


@pytest.mark.slow
def test_bf16_and_channels_last_reach_the_clients_model():
    cfg = resolve_config(cuda_raw("fedavg_fixmatch", rounds=1, speed=True))
    net = model_for(ModelSettings(**cfg["model"]), client_data(settings_of(cfg), 0, CUDA)).to(CUDA)
    conv = next(p for p in net.parameters() if p.dim() == 4)
    assert conv.is_contiguous(memory_format=torch.channels_last)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = net(
            torch.rand(4, 1, 28, 28, device=CUDA).contiguous(memory_format=torch.channels_last)
        )
    assert out.dtype == torch.bfloat16


@pytest.mark.slow
def test_a_fixmatch_client_round_does_not_wait_for_the_gpu_every_step():
    """Host syncs in the client's loop (its augmentations replaced by identities, whose
    RandAugment syncs once per op per group of batches) stay below one per step: the loss,
    counts and pseudo-label statistics stay on the device until the round ends."""
    steps = 16
    cfg = experiment("small_cnn", "synthetic28", 32, "off", steps, "cuda")
    net = model_for(ModelSettings(**cfg["model"]), dataset_info("synthetic28"))
    config = ConfigRecord({"ssfl-config": json.dumps(cfg, sort_keys=True), "round": 1, "lr": 0.01})
    content = RecordDict({"arrays": ArrayRecord(net.state_dict()), "config": config})
    FixMatchClient(content, RecordDict(), 0).run()  # data cached, kernels warm
    client = FixMatchClient(content, RecordDict(), 0)
    client.augmenters = lambda: (torch.nn.Identity(), torch.nn.Identity())
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            metrics = client.run()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert metrics["local_steps"] == steps
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    assert len(syncs) < steps

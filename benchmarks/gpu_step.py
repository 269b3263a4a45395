"""A client's training step against a bare torch loop (the physical-limit anchor).

``client_images_per_s``: FedAvg-FixMatch's client half (client_app/fixmatch.py) runs one
local epoch of ``steps`` unlabeled batches: weak and strong views drawn on the device,
one forward and backward of both views, its pseudo-label bookkeeping. ``bare_images_per_s``:
the same model, batch (both views), precision and memory layout, on one fixed tensor,
cross-entropy, SGD. Both count images through the forward and backward (both views) per
second, after a warm-up round.
"""

from __future__ import annotations

import json
import time
from typing import Any

import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from ssfl.experiment import resolve_config
from ssfl.registry import settings_of
from tasks.data import dataset_info
from tasks.models import model_for
from tasks.settings import Settings, mapping
from tasks.train import autocast, make_sgd

LR = 0.01


def experiment(model: str, dataset: str, batch: int, amp: str, steps: int, device: str) -> Settings:
    """One client holding exactly ``steps`` unlabeled batches of ``batch`` images."""
    images = batch * steps
    raw = {
        "method": "fedavg_fixmatch",
        "device": device,
        "dataset": {
            "name": dataset,
            "synthetic_train_size": images + 100,
            "synthetic_test_size": 40,
        },
        "split": {
            "labeled_per_class": 2,
            "val_size": 20,
            "test_size": 40,
            "num_clients": 1,
            "client_size": images,
        },
        "model": {"name": model, "channels_last": amp == "bf16"},
        "train": {"amp": amp},
        "client": {"batch_size": batch, "lr": LR},
    }
    return settings_of(resolve_config(raw))


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def client_images_per_s(
    model: str, dataset: str, batch: int, amp: str, steps: int, device: str
) -> float:
    """Images/s (both views) of the FixMatch client's round (its second: the first warms up
    the data cache, the augmentations and the kernels)."""
    from client_app.fixmatch import FixMatchClient

    settings = experiment(model, dataset, batch, amp, steps, device)
    net = model_for(settings.model, dataset_info(settings.dataset.name))
    content = RecordDict(
        {
            "arrays": ArrayRecord(net.state_dict()),
            "config": ConfigRecord(
                {"ssfl-config": json.dumps(mapping(settings), sort_keys=True), "round": 1, "lr": LR}
            ),
        }
    )
    seconds = 0.0
    for _ in range(2):
        synchronize(device)
        started = time.perf_counter()
        client = FixMatchClient(content, RecordDict(), 0)
        metrics = client.run()
        synchronize(device)
        seconds = time.perf_counter() - started
    return 2 * batch * int(metrics["local_steps"]) / seconds


def bare_images_per_s(
    model: str, dataset: str, batch: int, amp: str, steps: int, device: str
) -> float:
    """Images/s of a plain loop: one fixed input of both views' size, cross-entropy, SGD."""
    settings = experiment(model, dataset, batch, amp, steps, device)
    info = dataset_info(settings.dataset.name)
    dev = torch.device(device)
    net = model_for(settings.model, info).to(dev)
    layout = torch.channels_last if settings.model.channels_last else torch.contiguous_format
    x = torch.rand(2 * batch, info.channels, info.image_size, info.image_size, device=dev)
    x = x.contiguous(memory_format=layout)
    y = torch.randint(0, info.num_classes, (2 * batch,), device=dev)
    opt = make_sgd(net.parameters(), LR, 0.9, 0.0)
    net.train()

    def step() -> None:
        with autocast(settings.train.amp, dev):
            loss = F.cross_entropy(net(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(max(2, steps // 5)):
        step()
    synchronize(device)
    started = time.perf_counter()
    for _ in range(steps):
        step()
    synchronize(device)
    return 2 * batch * steps / (time.perf_counter() - started)


def significant(rate: float, digits: int = 4) -> float:
    """``rate`` to ``digits`` significant digits: a slow CPU's 3.1 images/s keeps its ratio."""
    return float(f"{rate:.{digits}g}")


def case(model: str, dataset: str, batch: int, amp: str, steps: int, device: str) -> dict[str, Any]:
    """Both rates and their ratio for one model, batch and precision."""
    project = client_images_per_s(model, dataset, batch, amp, steps, device)
    bare = bare_images_per_s(model, dataset, batch, amp, steps, device)
    return {
        "model": model,
        "batch": batch,
        "amp": amp,
        "client_images_per_s": significant(project),
        "bare_images_per_s": significant(bare),
        "ratio": round(project / bare, 3),
    }

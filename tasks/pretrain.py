"""SimCLR pretraining of a model's encoder (the second stage's freezing: tasks.models).

FedoSSL section 5: "All compared methods are implemented based on the pre-trained model
using the contrastive learning algorithm SimCLR", and "we only update the parameters of the
last block of ResNet in the second training stage" (as ORCA). The official code loads a
SimCLR checkpoint trained on the whole training set without labels (GitHub cugzj/FedoSSL,
fedossl_cifar.py: ``pretrained/simclr_cifar_10.pth.tar``); here that stage runs once on the
images the run's clients hold, with the project's one NT-Xent (tasks/ssl.py, FedSup eq. 3.3)
on a projector that is thrown away afterwards. Its result is kept on disk
(tasks.partition.split_cache_dir), keyed by every input, so the cells of a table share it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tasks.augment import grouped_views
from tasks.models import embedding, head_of, mlp
from tasks.partition import split_cache_dir
from tasks.ssl import nt_xent
from tasks.train import make_sgd, running_sum, set_lr, step_batches

# Bumped whenever the pretraining's arithmetic changes, so no stale encoder is reused.
PRETRAIN_VERSION = 1


@dataclass(frozen=True)
class SimCLRSettings:
    """One SimCLR stage: epochs over the pooled images, batch, SGD rate (cosine-decayed to
    0 over the stage, momentum 0.9, weight decay 5e-4), NT-Xent temperature, projector
    width."""

    epochs: int
    batch_size: int
    lr: float
    temperature: float
    projector_dim: int


def encoder_parameters(model: nn.Module) -> list[nn.Parameter]:
    """Every parameter of a built model but its head's (the classifier is not pretrained)."""
    head = {id(p) for p in head_of(model).parameters()}
    return [p for p in model.parameters() if id(p) not in head]


def simclr_pretrain(
    model: nn.Module,
    images: torch.Tensor,
    augment: Callable[[torch.Tensor], torch.Tensor],
    settings: SimCLRSettings,
    generator: torch.Generator,
) -> list[float]:
    """Train ``model``'s encoder in place with NT-Xent between two augmented views of each
    image (SimCLR; FedSup eq. 3.3, tau = settings.temperature) through a fresh projector
    D -> P -> P; returns the mean loss of every epoch. The head is left as it was."""
    width = head_of(model).in_features
    device = images.device
    projector = mlp((width, settings.projector_dim, settings.projector_dim)).to(device)
    params = encoder_parameters(model) + list(projector.parameters())
    opt = make_sgd(params, settings.lr, 0.9, 5e-4)
    per_epoch = -(-len(images) // settings.batch_size)
    total = per_epoch * settings.epochs
    model.train()
    projector.train()
    losses: list[float] = []
    step = 0
    for _ in range(settings.epochs):
        batches = step_batches(len(images), settings.batch_size, generator, 1, device=device)
        running = running_sum(device)
        for _, (view1, view2) in grouped_views(images, batches, (augment, augment)):
            z = projector(embedding(model, torch.cat([view1, view2])))
            loss = nt_xent(*z.chunk(2), settings.temperature)
            set_lr(opt, settings.lr * 0.5 * (1 + math.cos(math.pi * step / total)))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            running += loss.detach().double()
            step += 1
        losses.append(float(running) / per_epoch)
    return losses


def cache_path(key: Mapping[str, Any]) -> Path:
    """The file a pretraining with these inputs is kept in."""
    text = json.dumps({**key, "version": PRETRAIN_VERSION}, sort_keys=True)
    return split_cache_dir() / f"simclr-{hashlib.sha256(text.encode()).hexdigest()[:24]}.pt"


def cached_pretrain(
    model: nn.Module,
    key: Mapping[str, Any],
    run: Callable[[], list[float]],
) -> tuple[list[float], bool]:
    """``run()`` (which pretrains ``model`` in place), or the state a run with the same
    ``key`` left on disk; returns the per-epoch losses and whether they came from disk."""
    path = cache_path(key)
    if path.exists():
        saved = torch.load(path, map_location="cpu", weights_only=True)
        model.load_state_dict(saved["state"])
        return [float(v) for v in saved["losses"]], True
    losses = run()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.part")
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    torch.save({"state": state, "losses": list(losses)}, partial)
    partial.replace(path)
    return losses, False


def settings_from(algo: Any) -> SimCLRSettings:
    """The SimCLR stage a method's ``algo`` settings ask for (its ``pretrain_*`` keys)."""
    return SimCLRSettings(
        epochs=algo.pretrain_epochs,
        batch_size=algo.pretrain_batch_size,
        lr=algo.pretrain_lr,
        temperature=algo.pretrain_temperature,
        projector_dim=algo.pretrain_projector_dim,
    )

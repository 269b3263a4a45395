"""FedSup's evaluation protocols (FedSup section 5.1.2, Tables 6.1 and 6.2).

Both attach a freshly initialised linear head to the trained encoder and train it on the
server's labeled set: **finetuning** trains the whole model end to end (Table 6.1),
**linear evaluation** trains the head alone on the frozen encoder's features (Table 6.2).
The model passed in is never changed: both work on a copy.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tasks.models import embedding, head_of
from tasks.train import evaluate, make_sgd, minibatches, seeded, set_lr, supervised_epochs


@dataclass(frozen=True)
class ProtocolSettings:
    """SGD on the server's labeled set: passes, rate, batch size, and the rate's schedule
    (``cosine``: annealed from lr to 0 over the protocol's steps; ``constant``)."""

    epochs: int
    lr: float
    batch_size: int
    momentum: float = 0.9
    weight_decay: float = 0.0
    schedule: str = "cosine"

    def check(self, labeled: int) -> None:
        if self.epochs < 1:
            raise ValueError(f"protocol epochs must be >= 1, got {self.epochs}")
        if self.lr <= 0:
            raise ValueError(f"protocol lr must be > 0, got {self.lr}")
        if labeled == 0:
            raise ValueError("the evaluation protocols need labeled data at the server")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"protocol schedule must be one of {SCHEDULES}, got {self.schedule}")

    def lr_at(self, labeled: int) -> Callable[[int], float]:
        """The rate of each SGD step of the protocol on ``labeled`` examples."""
        if self.schedule == "constant":
            return lambda step: self.lr
        total = self.epochs * math.ceil(labeled / self.batch_size)
        return lambda step: 0.5 * self.lr * (1 + math.cos(math.pi * step / total))


SCHEDULES = ("cosine", "constant")


def with_fresh_head(model: nn.Module, seed: int) -> nn.Module:
    """A copy of ``model`` whose head is re-initialised (seeded)."""
    fresh = copy.deepcopy(model)
    with seeded(seed):
        head_of(fresh).reset_parameters()
    return fresh


def finetune_accuracy(
    model: nn.Module,
    labeled_x: torch.Tensor,
    labeled_y: torch.Tensor,
    test_x: torch.Tensor,
    test_y: torch.Tensor,
    settings: ProtocolSettings,
    seed: int,
    augment: nn.Module | None = None,
    eval_batch_size: int = 512,
) -> float:
    """Test accuracy after finetuning the encoder and a fresh linear head end to end on the
    labeled set (FedSup 5.1.2, Table 6.1)."""
    settings.check(len(labeled_x))
    tuned = with_fresh_head(model, seed)
    opt = make_sgd(tuned.parameters(), settings.lr, settings.momentum, settings.weight_decay)
    with seeded(seed) as gen:
        supervised_epochs(
            tuned,
            labeled_x,
            labeled_y,
            epochs=settings.epochs,
            optimizer=opt,
            batch_size=settings.batch_size,
            generator=gen,
            augment=augment,
            lr_at=settings.lr_at(len(labeled_x)),
        )
    return evaluate(tuned, test_x, test_y, eval_batch_size)[0]


@torch.no_grad()
def frozen_features(model: nn.Module, x: torch.Tensor, batch_size: int) -> torch.Tensor:
    """The encoder's embeddings in eval mode (BatchNorm running statistics, no dropout)."""
    was_training = model.training
    model.eval()
    out = torch.cat([embedding(model, x[i : i + batch_size]) for i in range(0, len(x), batch_size)])
    model.train(was_training)
    return out


def linear_accuracy(
    model: nn.Module,
    labeled_x: torch.Tensor,
    labeled_y: torch.Tensor,
    test_x: torch.Tensor,
    test_y: torch.Tensor,
    settings: ProtocolSettings,
    seed: int,
    eval_batch_size: int = 512,
) -> float:
    """Test accuracy of a fresh linear head trained on the frozen encoder's features of the
    labeled set (linear evaluation, FedSup 5.1.2, Table 6.2)."""
    settings.check(len(labeled_x))
    probe = with_fresh_head(model, seed)
    train_z = frozen_features(probe, labeled_x, eval_batch_size)
    test_z = frozen_features(probe, test_x, eval_batch_size)
    head = head_of(probe)
    opt = make_sgd(head.parameters(), settings.lr, settings.momentum, settings.weight_decay)
    lr_at, step = settings.lr_at(len(train_z)), 0
    with seeded(seed) as gen:
        for _ in range(settings.epochs):
            for idx in minibatches(len(train_z), settings.batch_size, gen):
                idx = idx.to(train_z.device)
                set_lr(opt, lr_at(step))
                step += 1
                loss = F.cross_entropy(head(train_z[idx]), labeled_y[idx])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
    with torch.no_grad():
        return float((head(test_z).argmax(dim=1) == test_y).float().mean())

"""Client halves of federated SimCLR, SimSiam and BYOL (FedSup section 3.2, Fig. 4.3).

Each step takes a batch of unlabeled images, two stochastic views of it (the strong
augmentation: flip, shift, RandAugment, Cutout), and the method's self-supervised loss on
the projector (and predictor) outputs. A round is client.epochs passes over the local
data, or client.local_steps steps. The server trains the aggregate on its labels.
"""

from __future__ import annotations

import copy
from abc import abstractmethod
from dataclasses import dataclass

import torch
from torch import nn

from client_app.base import ClientHalf
from tasks.augment import grouped_views
from tasks.models import ssl_outputs
from tasks.settings import POSITIVE, UNIT, RandAugmentSettings, setting
from tasks.ssl import ema_update, nt_xent, symmetric_negative_cosine
from tasks.train import running_sum, set_lr


@dataclass(frozen=True)
class SimCLRSettings(RandAugmentSettings):
    """Federated SimCLR's keys (its views: the strong view, RandAugment(n, m))."""

    temperature: float = setting(
        0.5, "SimCLR's NT-Xent tau (FedSup eq. 3.3)", rule=POSITIVE, ref="FedSup 5.1.1: 0.5"
    )
    decoupled: bool = setting(
        False,
        "true: eq. 3.3 as printed in FedSup (the positive pair left out of the denominator); "
        "false: Chen et al.'s NT-Xent",
        ref="FedSup eq. 3.3",
    )


@dataclass(frozen=True)
class BYOLSettings(RandAugmentSettings):
    """Federated BYOL's keys."""

    ema: float = setting(
        0.99,
        "mu of BYOL's target update xi <- mu xi + (1 - mu) theta, per local step (FedSup does "
        "not state it; BYOL's 0.996 is for long runs, ours 0.99: the target lives one round)",
        rule=UNIT,
        ref="FedSup 3.2.4",
    )


class SSLClient(ClientHalf):
    """The local loop of a two-view self-supervised method."""

    honours = ClientHalf.honours | {"client.local_steps", "lr_schedule.name"}

    @abstractmethod
    def loss(self, view1: torch.Tensor, view2: torch.Tensor) -> torch.Tensor:
        """The method's loss on two views of one batch."""

    def after_step(self) -> None:
        """Work after each optimizer step (BYOL's target update)."""

    def train(self) -> dict[str, float]:
        d = self.data
        _, strong = self.augmenters()
        opt = self.optimizer()
        round_steps = self.round_steps()
        total, steps = running_sum(d.x.device), 0
        self.model.train()
        batches = self.round_batches()
        for _, (view1, view2) in grouped_views(d.x, batches, (strong, strong)):
            loss = self.loss(view1, view2)
            set_lr(opt, self.lr_at(steps, round_steps))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            self.after_step()
            total += loss.detach().double()
            steps += 1
        return {"train_loss": float(total) / max(steps, 1), "local_steps": steps}

    def outputs(self, model: nn.Module, view1: torch.Tensor, view2: torch.Tensor):
        """The SSL outputs of both views in one forward pass, split back into two."""
        out = ssl_outputs(model, torch.cat([view1, view2]))
        z1, z2 = out.projection.chunk(2)
        if out.prediction is None:
            return (z1, z2), None
        return (z1, z2), out.prediction.chunk(2)


class SimCLRClient(SSLClient):
    """NT-Xent between the projections of the two views (FedSup eq. 3.3)."""

    def loss(self, view1: torch.Tensor, view2: torch.Tensor) -> torch.Tensor:
        (z1, z2), _ = self.outputs(self.model, view1, view2)
        return nt_xent(z1, z2, self.algo.temperature, self.algo.decoupled)


class SimSiamClient(SSLClient):
    """Each view's prediction regresses the other's stop-gradient projection (eq. 3.6)."""

    def loss(self, view1: torch.Tensor, view2: torch.Tensor) -> torch.Tensor:
        (z1, z2), (p1, p2) = self.outputs(self.model, view1, view2)
        return symmetric_negative_cosine(p1, p2, z1, z2)


class BYOLClient(SSLClient):
    """Eq. 3.6 with the projections of an EMA target network (FedSup section 3.2.4).

    Clients are stateless (FedSup section 1): the target starts each round as a copy of
    the received model and follows the online network by xi <- mu xi + (1 - mu) theta
    after every step (mu = algo.ema).
    """

    def train(self) -> dict[str, float]:
        self.target = copy.deepcopy(self.model)
        self.target.requires_grad_(False)
        return super().train()

    def loss(self, view1: torch.Tensor, view2: torch.Tensor) -> torch.Tensor:
        _, (p1, p2) = self.outputs(self.model, view1, view2)
        with torch.no_grad():
            (z1, z2), _ = self.outputs(self.target, view1, view2)
        return symmetric_negative_cosine(p1, p2, z1, z2)

    def after_step(self) -> None:
        ema_update(self.target, self.model, self.algo.ema)

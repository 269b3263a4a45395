"""Client half of FedSup (FedSup section 4.1.1, Fig. 4.1-4.2).

The client receives the online network (encoder + projector + predictor) and the server's
supervised network f_Server (the frozen target). Per step, on a batch of its unlabeled
images x and their augmented view A(x) (the strong augmentation):

- L_Con (eq. 3.6 form, symmetrised): the online prediction of A(x) regresses the target's
  stop-gradient representation of x, and the prediction of x that of A(x); the target's
  representation is its pooled feature, the input of its classifier (ours: the paper
  leaves it open);
- L_MSE: the mean squared error between the feature maps of the first N conv blocks of
  the two networks on x, summed over blocks, weighted by lambda_s^(t/T).

Loss = algo.consistency_weight * L_Con + lambda_s^(t/T) * L_MSE; only the online network
learns and only it is sent back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from client_app.base import ClientHalf
from tasks.augment import grouped_views
from tasks.models import model_for, ssl_outputs, without_ssl_heads
from tasks.settings import (
    MAX_CLIENTS,
    MAX_ROUNDS,
    NON_NEGATIVE,
    POSITIVE,
    RandAugmentSettings,
    between,
    setting,
)
from tasks.ssl import layerwise_mse, mse_weight, symmetric_negative_cosine
from tasks.train import set_lr


@dataclass(frozen=True)
class FedSupSettings(RandAugmentSettings):
    """FedSup's keys; the augmented view A(x) is FixMatch's strong view."""

    lambda_s: float = setting(
        1e-4,
        "L_MSE is weighted lambda_s^(t/T) in round t (4.1.1: lambda_s in {1, 1e-2, 1e-4}, "
        "1e-4 chosen)",
        rule=POSITIVE,
        ref="FedSup 4.1.1",
    )
    mse_horizon: int = setting(
        0,
        "T of lambda_s^(t/T): 0 = the run's own rounds (4.1.1: T is the total rounds); 100 "
        "= the paper's CIFAR-10 run, so a shorter run follows its first rounds of the fade",
        rule=between(0, MAX_ROUNDS),
        ref="FedSup 4.1.1, 5.1",
    )
    feature_blocks: int = setting(
        2,
        "N, the conv blocks whose feature maps enter L_MSE (the small CNN's 2; ResNet-18: 4, "
        "Table 6.3; 0 = without L_MSE; at most the model's blocks)",
        rule=NON_NEGATIVE,
        ref="FedSup Table 6.3",
    )
    first_block: int = setting(
        0,
        "index of the first of those blocks (1 on `resnet18` skips the stem: the paper's four "
        "blocks)",
        rule=NON_NEGATIVE,
    )
    consistency_weight: float = setting(
        1.0,
        'weight of L_Con (0 = "without consistency", Table 6.4)',
        rule=NON_NEGATIVE,
        ref="FedSup Table 6.4",
    )
    groups: int = setting(
        2,
        "S, the number of groups of eq. 7 (4.1.1: 5 clients in groups of 2 and 3)",
        rule=between(1, MAX_CLIENTS),
        ref="FedSup 4.1.1",
    )


class FedSupClient(ClientHalf):
    """The online network learns from f_Server's representation and feature maps."""

    honours = ClientHalf.honours | {"client.local_steps", "lr_schedule.name"}

    def teacher(self) -> nn.Module:
        """f_Server from the message, frozen, in eval mode (its BatchNorm statistics)."""
        model = model_for(without_ssl_heads(self.settings.model), self.data).to(self.device)
        model.load_state_dict(self.content["teacher"].to_torch_state_dict())
        return model.eval().requires_grad_(False)

    def step_loss(
        self, teacher: nn.Module, x: torch.Tensor, x_aug: torch.Tensor, mse_scale: float
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(loss, L_Con, L_MSE) of one batch; both networks see x and A(x) in one pass."""
        algo, n = self.algo, len(x)
        first, blocks = algo.first_block, algo.feature_blocks
        online = ssl_outputs(self.model, torch.cat([x, x_aug]))
        with torch.no_grad():
            target = ssl_outputs(teacher, torch.cat([x, x_aug]))
        p_raw, p_aug = online.prediction.chunk(2)
        t_raw, t_aug = target.embedding.chunk(2)
        l_con = symmetric_negative_cosine(p_aug, p_raw, t_aug, t_raw)
        l_mse = layerwise_mse(
            [m[:n] for m in online.maps[first:]], [m[:n] for m in target.maps[first:]], blocks
        )
        return algo.consistency_weight * l_con + mse_scale * l_mse, l_con, l_mse

    def train(self) -> dict[str, float]:
        d = self.data
        teacher = self.teacher()
        _, strong = self.augmenters()
        opt = self.optimizer()
        horizon = self.algo.mse_horizon or self.settings.rounds
        scale = mse_weight(self.algo.lambda_s, self.round, horizon)
        round_steps = self.round_steps()
        totals = torch.zeros(3, device=d.x.device)
        steps = 0
        self.model.train()
        batches = self.round_batches()
        for idx, (x_aug,) in grouped_views(d.x, batches, (strong,)):
            loss, l_con, l_mse = self.step_loss(teacher, d.x[idx], x_aug, scale)
            set_lr(opt, self.lr_at(steps, round_steps))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            totals += torch.stack([loss.detach(), l_con.detach(), l_mse.detach()]).float()
            steps += 1
        mean = (totals / max(steps, 1)).tolist()
        return {
            "train_loss": mean[0],
            "consistency_loss": mean[1],
            "mse_loss": mean[2],
            "mse_weight": scale,
            "local_steps": steps,
        }

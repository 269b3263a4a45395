"""Client half of FedAvg-FixMatch: FixMatch's unlabeled loss (Sohn et al. 2020, eq. 4)."""

from __future__ import annotations

import torch

from client_app.consistency import ConsistencyClient
from tasks.losses import fixmatch_loss


class FixMatchClient(ConsistencyClient):
    """Pseudo-label from the weak view where confident, cross-entropy on the strong view."""

    def unlabeled_loss(
        self, logits_weak: torch.Tensor, logits_strong: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return fixmatch_loss(logits_weak, logits_strong, self.algo.threshold)

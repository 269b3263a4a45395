"""Client half of FedAvg-UDA: UDA's consistency loss (Xie et al. 2020, eq. 3)."""

from __future__ import annotations

import torch

from client_app.consistency import ConsistencyClient
from tasks.losses import uda_loss


class UDAClient(ConsistencyClient):
    """KL between the sharpened weak-view prediction and the strong view, where confident."""

    def unlabeled_loss(
        self, logits_weak: torch.Tensor, logits_strong: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return uda_loss(
            logits_weak, logits_strong, self.algo["threshold"], self.algo["temperature"]
        )

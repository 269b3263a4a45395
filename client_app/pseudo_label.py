"""Client half of the SSFL benchmark (fedavg_with_server and fedrgd): T local steps of eq. 3 or 6.

``algo.loss: crl`` is the consistency regularization loss (eq. 6): pseudo-label from
the weak view alpha(x) where max p >= tau, cross-entropy on the strong view A(x)
(RandAugment n = 2, m = 10 with flip, crop and Cutout). ``algo.loss: selftrain`` is
traditional self-training (eq. 3): pseudo-label and prediction from the same weak view.
``algo.distribution_alignment`` (ours, not in the paper) takes the pseudo-labels and their
confidence from the weak-view probabilities aligned to a uniform class distribution
(ReMixMatch's distribution alignment, tasks/losses.py), for both losses.
"""

from __future__ import annotations

import torch

from client_app.consistency import ConsistencyClient
from tasks.losses import DistributionAligner, crl_loss, selftrain_loss


class PseudoLabelClient(ConsistencyClient):
    """One user of the SSFL benchmark: client.local_steps SGD steps on its unlabeled data."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.aligner = (
            DistributionAligner(self.data.num_classes)
            if self.algo["distribution_alignment"]
            else None
        )

    def view_augments(self, weak, strong) -> tuple:
        """Self-training (eq. 3) needs the weak view alone."""
        return (weak,) if self.algo["loss"] == "selftrain" else (weak, strong)

    def logits(self, views: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits the pseudo-labels come from, logits the loss trains)."""
        if self.algo["loss"] == "selftrain":
            logits = self.model(views[0])
            logits_weak, logits_trained = logits, logits
        else:
            logits_weak, logits_trained = super().logits(views)
        if self.aligner is not None:
            logits_weak = self.aligner(logits_weak)
        return logits_weak, logits_trained

    def unlabeled_loss(
        self, logits_weak: torch.Tensor, logits_trained: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.algo["loss"] == "selftrain":
            return selftrain_loss(logits_trained, self.algo["threshold"], logits_weak)
        return crl_loss(logits_weak, logits_trained, self.algo["threshold"])

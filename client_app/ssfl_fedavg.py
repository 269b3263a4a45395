"""Client half of the SSFL benchmark (ssfl_fedavg and fedrgd): T local steps of eq. 3 or 6.

``algo.loss: crl`` is the consistency regularization loss (eq. 6): pseudo-label from
the weak view alpha(x) where max p >= tau, cross-entropy on the strong view A(x)
(RandAugment n = 2, m = 10 with flip, crop and Cutout). ``algo.loss: selftrain`` is
traditional self-training (eq. 3): pseudo-label and prediction from the same weak view.
"""

from __future__ import annotations

import torch

from client_app.consistency import ConsistencyClient
from tasks.losses import crl_loss, selftrain_loss


class SSFLClient(ConsistencyClient):
    """One user of the SSFL benchmark: client.local_steps SGD steps on its unlabeled data."""

    def views(self, xb: torch.Tensor, weak, strong) -> tuple[torch.Tensor, torch.Tensor]:
        if self.algo["loss"] == "selftrain":
            logits = self.model(weak(xb))
            return logits, logits
        return super().views(xb, weak, strong)

    def unlabeled_loss(
        self, logits_weak: torch.Tensor, logits_strong: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.algo["loss"] == "selftrain":
            return selftrain_loss(logits_weak, self.algo["threshold"])
        return crl_loss(logits_weak, logits_strong, self.algo["threshold"])

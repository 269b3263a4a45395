"""Client half of FedAvg-FixMatch: FixMatch's unlabeled loss (Sohn et al. 2020, eq. 4)."""

from __future__ import annotations

from client_app.consistency import ConsistencyClient, UnlabeledLoss
from tasks.losses import fixmatch_loss
from tasks.settings import ConsistencySettings


class FixMatchClient(ConsistencyClient):
    """Pseudo-label from the weak view where confident, cross-entropy on the strong view."""

    @staticmethod
    def loss_of(algo: ConsistencySettings) -> UnlabeledLoss:
        return lambda weak, strong: fixmatch_loss(weak, strong, algo.threshold)

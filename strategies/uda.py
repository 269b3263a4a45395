"""FedAvg-UDA (labels-at-server): server trains with TSA, clients run UDA's consistency loss."""

from __future__ import annotations

from typing import Any

from strategies.base import SSFLStrategy
from strategies.server_sl import labels_at_server_defaults
from tasks.losses import tsa_cross_entropy, tsa_threshold


class FedAvgUDA(SSFLStrategy):
    """FedAvg of UDA clients; the server's supervised loss uses training-signal annealing."""

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        # FedSEAL 5.2.1: threshold 0.9; UDA (Xie et al. 2020) 3.2: sharpening temperature 0.4,
        # and the 'exp' TSA schedule when labeled data is scarce.
        return labels_at_server_defaults(threshold=0.9, temperature=0.4, tsa_schedule="exp")

    def server_update(self, server_round: int) -> dict[str, float]:
        """E_s epochs on the labeled set, ignoring samples above the TSA threshold eta_t."""
        eta = tsa_threshold(
            server_round / self.cfg["rounds"],
            self.cfg["algo"]["tsa_schedule"],
            self.server.dataset.num_classes,
        )
        out = self.server_train(
            server_round,
            self.cfg["server"]["epochs"],
            loss_fn=lambda logits, y: tsa_cross_entropy(logits, y, eta),
        )
        return {**out, "tsa_eta": eta}

"""FedAvg-FixMatch (labels-at-server): server trains on labels, clients run FixMatch."""

from __future__ import annotations

from typing import Any

from strategies.base import SSFLStrategy
from strategies.server_sl import SERVER_SCHEDULE
from tasks.config import deep_merge


class FedAvgFixMatch(SSFLStrategy):
    """FedAvg of FixMatch clients; ``client.proximal_mu`` > 0 gives FedProx-FixMatch."""

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        return deep_merge(
            SERVER_SCHEDULE,
            {
                "algo": {
                    # FedSEAL 5.2.1: "For FixMatch and UDA, the fixed confidence threshold is 0.9".
                    "threshold": 0.9,
                    # FixMatch (Sohn et al. 2020) eq. 5: weight of the unlabeled loss.
                    "lambda_u": 1.0,
                    # RandAugment n ops of magnitude up to m (FixMatch's strong view).
                    "randaugment_n": 2,
                    "randaugment_m": 10.0,
                }
            },
        )

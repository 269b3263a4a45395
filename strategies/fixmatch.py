"""FedAvg-FixMatch (labels-at-server): server trains on labels, clients run FixMatch."""

from __future__ import annotations

from typing import Any

from strategies.loop import ServerHalf
from strategies.server_sl import LABELS_AT_SERVER_RULES, labels_at_server_defaults
from tasks.config import Range


class FedAvgFixMatch(ServerHalf):
    """FedAvg of FixMatch clients; ``client.proximal_mu`` > 0 gives FedProx-FixMatch."""

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        # FedSEAL 5.2.1: "For FixMatch and UDA, the fixed confidence threshold is 0.9".
        return labels_at_server_defaults(threshold=0.9)

    @classmethod
    def rules(cls) -> dict[str, Range]:
        return LABELS_AT_SERVER_RULES

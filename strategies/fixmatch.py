"""FedAvg-FixMatch (labels-at-server): server trains on labels, clients run FixMatch."""

from __future__ import annotations

from typing import Any

from strategies.loop import ServerHalf
from strategies.server_sl import SERVER_SCHEDULE


class FedAvgFixMatch(ServerHalf):
    """FedAvg of FixMatch clients; ``client.proximal_mu`` > 0 gives FedProx-FixMatch.
    Its ``algo`` keys: tasks.settings.ConsistencySettings (threshold 0.9, FedSEAL 5.2.1)."""

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        return SERVER_SCHEDULE

"""Server-SL: the lower bound; the server trains on its labeled set only (FedSEAL Table 1)."""

from __future__ import annotations

from typing import Any

from strategies.base import SSFLStrategy

# Server schedule shared by every labels-at-server method: bootstrap on the labeled set
# (FedSEAL 4.1.3), then E_s epochs a round (FedSEAL eq. 3-4).
SERVER_SCHEDULE: dict[str, Any] = {"server": {"bootstrap_epochs": 20, "epochs": 2}}


class ServerSL(SSFLStrategy):
    """No client takes part; each round is E_s epochs on the server's labeled data."""

    uses_clients = False

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        return SERVER_SCHEDULE

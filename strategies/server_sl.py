"""Server-SL: the lower bound; the server trains on its labeled set only (FedSEAL Table 1)."""

from __future__ import annotations

from typing import Any

from strategies.loop import ServerHalf
from strategies.parts import DenseCodec, Parts, ServerSide, SupervisedTrainer, TestAccuracy
from tasks.config import ConfigError
from tasks.settings import Settings

# Server schedule shared by every labels-at-server method: bootstrap on the labeled set
# (FedSEAL 4.1.3), then E_s epochs a round (FedSEAL eq. 3-4).
SERVER_SCHEDULE: dict[str, Any] = {"server": {"bootstrap_epochs": 20, "epochs": 2}}


class ServerSL(ServerHalf):
    """No client takes part; each round is E_s epochs on the server's labeled data."""

    averages_models = False  # no clients
    privacy_refusal = "has no clients: no client privacy to spend"

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        return SERVER_SCHEDULE

    @classmethod
    def check_config(cls, settings: Settings) -> None:
        if settings.server.epochs == 0 and settings.server.local_steps == 0:
            raise ConfigError(
                "config keys 'server.epochs' and 'server.local_steps': server_sl trains only "
                "on the server; one of them must be > 0"
            )

    @classmethod
    def parts(cls, server: ServerSide) -> Parts:
        return Parts(SupervisedTrainer(server), None, TestAccuracy(server), DenseCodec())

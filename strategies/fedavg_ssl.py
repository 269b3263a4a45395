"""Federated SimCLR, SimSiam and BYOL, the baselines of FedSup (section 3.2, Fig. 4.3).

The server trains the aggregate on its labels each round (as every labels-at-server
method here); the clients run the self-supervised method on their unlabeled data; the
projector and predictor travel with the model and are averaged like every other layer.
"""

from __future__ import annotations

from typing import Any

from strategies.loop import ServerHalf
from strategies.server_sl import SERVER_SCHEDULE
from tasks.config import ConfigError, deep_merge
from tasks.settings import Settings

# SSL heads sized for the small CNN's 128-d feature (ours; FedSup 5.1.1: 512 with ResNet-18).
PROJECTOR = {"model": {"projector_dim": 128}}
PROJECTOR_PREDICTOR = {"model": {"projector_dim": 128, "predictor_dim": 128}}


class FedAvgSSL(ServerHalf):
    """FedAvg of self-supervised clients; the model needs the method's SSL heads."""

    needs_predictor = False
    ssl_heads = frozenset({"model.projector_dim"})

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        heads = PROJECTOR_PREDICTOR if cls.needs_predictor else PROJECTOR
        return deep_merge(SERVER_SCHEDULE, heads)

    @classmethod
    def check_config(cls, settings: Settings) -> None:
        model, name = settings.model, settings.method
        if not model.projector_dim:
            raise ConfigError(
                f"config key 'model.projector_dim': {name} trains a projector: set it > 0"
            )
        if cls.needs_predictor and not model.predictor_dim:
            raise ConfigError(
                f"config key 'model.predictor_dim': {name} trains a predictor: set it > 0"
            )


class FedAvgSimCLR(FedAvgSSL):
    """NT-Xent clients (FedSup eq. 3.3); keys: client_app.ssl.SimCLRSettings."""


class FedAvgSimSiam(FedAvgSSL):
    """Stop-gradient Siamese clients (FedSup eq. 3.6)."""

    needs_predictor = True
    ssl_heads = frozenset({"model.projector_dim", "model.predictor_dim"})


class FedAvgBYOL(FedAvgSSL):
    """Clients with a per-round EMA target (FedSup section 3.2.4); keys:
    client_app.ssl.BYOLSettings."""

    needs_predictor = True
    ssl_heads = frozenset({"model.projector_dim", "model.predictor_dim"})

"""FedAvg-UDA (labels-at-server): server trains with TSA, clients run UDA's consistency loss."""

from __future__ import annotations

from typing import Any

from strategies.loop import ServerHalf
from strategies.parts import (
    DenseCodec,
    FedAvg,
    Metrics,
    Parts,
    ServerSide,
    SupervisedTrainer,
    TestAccuracy,
)
from strategies.server_sl import SERVER_SCHEDULE
from tasks.losses import tsa_cross_entropy, tsa_threshold
from tasks.train import LossFn


class TSATrainer(SupervisedTrainer):
    """The server's epochs ignore samples above the TSA threshold eta_t (UDA 3.2)."""

    def loss(self, server_round: int) -> tuple[LossFn | None, Metrics]:
        eta = tsa_threshold(
            server_round / self.settings.rounds,
            self.settings.algo.tsa_schedule,
            self.server.dataset.num_classes,
        )
        if server_round == 0:  # the bootstrap trains on plain cross-entropy
            return None, {}
        return (lambda logits, y: tsa_cross_entropy(logits, y, eta)), {"tsa_eta": eta}


class FedAvgUDA(ServerHalf):
    """FedAvg of UDA clients; the server's supervised loss uses training-signal annealing."""

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        return SERVER_SCHEDULE

    @classmethod
    def parts(cls, server: ServerSide) -> Parts:
        return Parts(TSATrainer(server), FedAvg(server), TestAccuracy(server), DenseCodec())

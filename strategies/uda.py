"""FedAvg-UDA (labels-at-server): server trains with TSA, clients run UDA's consistency loss."""

from __future__ import annotations

from typing import Any

from strategies.loop import Parts, ServerHalf
from strategies.parts import (
    DenseCodec,
    FedAvg,
    Metrics,
    ServerSide,
    SupervisedTrainer,
    TestAccuracy,
)
from strategies.server_sl import LABELS_AT_SERVER_RULES, labels_at_server_defaults
from tasks.config import ConfigError, Range
from tasks.losses import tsa_cross_entropy, tsa_threshold
from tasks.train import LossFn

TSA_SCHEDULES = ("exp", "linear", "log")  # tasks.losses.tsa_threshold


class TSATrainer(SupervisedTrainer):
    """The server's epochs ignore samples above the TSA threshold eta_t (UDA 3.2)."""

    def loss(self, server_round: int) -> tuple[LossFn | None, Metrics]:
        eta = tsa_threshold(
            server_round / self.cfg["rounds"],
            self.cfg["algo"]["tsa_schedule"],
            self.server.dataset.num_classes,
        )
        if server_round == 0:  # the bootstrap trains on plain cross-entropy
            return None, {}
        return (lambda logits, y: tsa_cross_entropy(logits, y, eta)), {"tsa_eta": eta}


class FedAvgUDA(ServerHalf):
    """FedAvg of UDA clients; the server's supervised loss uses training-signal annealing."""

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        # FedSEAL 5.2.1: threshold 0.9; UDA (Xie et al. 2020) 3.2: sharpening temperature 0.4,
        # and the 'exp' TSA schedule when labeled data is scarce.
        return labels_at_server_defaults(threshold=0.9, temperature=0.4, tsa_schedule="exp")

    @classmethod
    def rules(cls) -> dict[str, Range]:
        # A sharpening temperature: softmax(logits / T) with T in (0, 1] (1 = no sharpening).
        return {**LABELS_AT_SERVER_RULES, "algo.temperature": Range(0, 1, low_open=True)}

    @classmethod
    def check_config(cls, cfg: dict[str, Any]) -> None:
        if cfg["algo"]["tsa_schedule"] not in TSA_SCHEDULES:
            raise ConfigError(
                f"config key 'algo.tsa_schedule': {cfg['algo']['tsa_schedule']!r} is not one "
                f"of {', '.join(TSA_SCHEDULES)}"
            )

    @classmethod
    def parts(cls, server: ServerSide) -> Parts:
        return Parts(TSATrainer(server), FedAvg(), TestAccuracy(server), DenseCodec())

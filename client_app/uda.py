"""Client half of FedAvg-UDA: UDA's consistency loss (Xie et al. 2020, eq. 3)."""

from __future__ import annotations

from dataclasses import dataclass

from client_app.consistency import ConsistencyClient, UnlabeledLoss
from tasks.losses import TSA_SCHEDULES, uda_loss
from tasks.settings import ConsistencySettings, Range, setting


@dataclass(frozen=True)
class UDASettings(ConsistencySettings):
    """FedAvg-UDA's keys: threshold 0.9 (FedSEAL 5.2.1) and UDA's own two."""

    temperature: float = setting(
        0.4,
        "UDA's sharpening temperature T of softmax(logits / T) (1 = no sharpening)",
        rule=Range(0, 1, low_open=True),
        ref="UDA (Xie et al. 2020) 3.2: 0.4",
    )
    tsa_schedule: str = setting(
        "exp",
        "training-signal annealing of the server's supervised loss",
        choices=TSA_SCHEDULES,
        ref="UDA 3.2: exp when labeled data is scarce",
    )


class UDAClient(ConsistencyClient):
    """KL between the sharpened weak-view prediction and the strong view, where confident."""

    @staticmethod
    def loss_of(algo: UDASettings) -> UnlabeledLoss:
        return lambda weak, strong: uda_loss(weak, strong, algo.threshold, algo.temperature)

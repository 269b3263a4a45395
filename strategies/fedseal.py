"""FedSEAL's server half (Bian et al.): bootstrap, server training, class-wise thresholds.

Every round: average the clients' models (eq. 2), E_s epochs of SGD on the labeled
set with weak augmentation (eq. 3-4), then the class-wise thresholds tau on the
validation set (eq. 5), sent to the next round's clients with the model.
"""

from __future__ import annotations

from typing import Any

import torch
from flwr.app import ArrayRecord

from strategies.loop import ServerHalf
from strategies.parts import Metrics, Parts, ServerSide
from strategies.server_sl import SERVER_SCHEDULE
from tasks.config import ConfigError
from tasks.selfensemble import class_thresholds
from tasks.settings import Settings
from tasks.train import predict_logits


class ClassThresholds:
    """tau of eq. 5 on the validation set, clipped to tau_max (or one fixed value); sent to
    every client with the model."""

    def __init__(self, server: ServerSide):
        self.server = server
        self.algo = server.settings.algo
        self.tau = torch.zeros(0)

    def update(self, server_round: int) -> Metrics:
        srv, algo = self.server, self.algo
        k = srv.dataset.num_classes
        if not algo.classwise_threshold:
            self.tau = torch.full((k,), algo.fixed_threshold)
        else:
            logits = predict_logits(srv.model, srv.val_x, srv.settings.eval.batch_size)
            tau = class_thresholds(torch.softmax(logits, dim=1), srv.val_y, k)
            self.tau = tau.clamp(max=algo.tau_max).cpu()
        return {"tau": [round(float(t), 4) for t in self.tau]}

    def records(self, server_round: int, pid: int) -> dict[str, Any]:
        return {"tau": ArrayRecord({"tau": self.tau.float()})}

    def state(self) -> dict[str, Any]:
        return {"tau": self.tau}

    def restore(self, state: dict[str, Any]) -> None:
        self.tau = state["tau"]


class FedSEAL(ServerHalf):
    """Server half of FedSEAL; the client half keeps the self-ensemble in context.state."""

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        # FedSEAL 5.2.1: server and client lr 0.001, decay 0.995 per round, momentum 0.9.
        # 4.1.3: bootstrap on the labeled set (epochs not given: ours).
        return {
            "server": {**SERVER_SCHEDULE["server"], "lr": 0.001, "lr_decay": 0.995},
            "client": {"lr": 0.001, "lr_decay": 0.995},
        }

    @classmethod
    def check_config(cls, settings: Settings) -> None:
        if settings.algo.classwise_threshold and settings.split.val_size == 0:
            raise ConfigError(
                "config key 'split.val_size': fedseal's class-wise thresholds (eq. 5) come "
                "from the validation set; set it > 0 (or algo.classwise_threshold to false)"
            )

    @classmethod
    def parts(cls, server: ServerSide) -> Parts:
        return Parts.standard(server, payloads=[ClassThresholds(server)])

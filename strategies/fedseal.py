"""FedSEAL's server half (Bian et al.): bootstrap, server training, class-wise thresholds.

Every round: average the clients' models (eq. 2), E_s epochs of SGD on the labeled
set with weak augmentation (eq. 3-4), then the class-wise thresholds tau on the
validation set (eq. 5), sent to the next round's clients with the model.
"""

from __future__ import annotations

from typing import Any

import torch
from flwr.app import ArrayRecord

from strategies.loop import Parts, ServerHalf
from strategies.parts import Metrics, ServerSide
from strategies.server_sl import RANDAUGMENT_RULES
from tasks.config import MAX_ROUNDS, UNIT, ConfigError, Range, between
from tasks.selfensemble import class_thresholds
from tasks.train import predict_logits


class ClassThresholds:
    """tau of eq. 5 on the validation set, clipped to tau_max (or one fixed value); sent to
    every client with the model."""

    def __init__(self, server: ServerSide):
        self.server = server
        self.algo = server.cfg["algo"]
        self.tau = torch.zeros(0)

    def update(self, server_round: int) -> Metrics:
        srv, algo = self.server, self.algo
        k = srv.dataset.num_classes
        if not algo["classwise_threshold"]:
            self.tau = torch.full((k,), algo["fixed_threshold"])
        else:
            logits = predict_logits(srv.model, srv.val_x, srv.cfg["eval"]["batch_size"])
            tau = class_thresholds(torch.softmax(logits, dim=1), srv.val_y, k)
            self.tau = tau.clamp(max=algo["tau_max"]).cpu()
        return {"tau": [round(float(t), 4) for t in self.tau]}

    def records(self, server_round: int, pid: int) -> dict[str, Any]:
        return {"tau": ArrayRecord({"tau": self.tau.float()})}


class FedSEAL(ServerHalf):
    """Server half of FedSEAL; the client half keeps the self-ensemble in context.state."""

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        return {
            # FedSEAL 5.2.1: server and client lr 0.001, decay 0.995 per round, momentum 0.9.
            # 4.1.3: bootstrap on the labeled set (epochs not given: ours).
            "server": {"bootstrap_epochs": 20, "epochs": 2, "lr": 0.001, "lr_decay": 0.995},
            "client": {"lr": 0.001, "lr_decay": 0.995},
            "algo": {
                "theta": 0.05,  # 5.2.1: complementary threshold theta of eq. 11
                # eq. 13: lambda grows over rounds (no formula given): linear ramp, ours.
                "lambda_start": 0.1,
                "lambda_end": 1.0,
                "lambda_ramp_rounds": 20,
                # Ablations (5.2.3-5.2.5): self-ensemble, negative learning, class-wise tau.
                "self_ensemble": True,
                "negative_learning": True,
                "classwise_threshold": True,
                "fixed_threshold": 0.9,  # used when classwise_threshold is false
                # Diagnostic, not the paper: the positive set keeps its members but takes the
                # hidden true labels instead of eq. 9's pseudo-labels (the ceiling of better
                # pseudo-labels; simulation only, where the labels are known).
                "oracle_labels": False,
                # Eq. 5 exceeds 1 for a class the model over-predicts (the paper states
                # tau in [0, 1]); tau is clipped to tau_max (1.0: the paper's range).
                "tau_max": 1.0,
                # 4.2.3: RandAugment as the strong augmentation A(.) of eq. 14.
                "randaugment_n": 2,
                "randaugment_m": 10.0,
            },
        }

    @classmethod
    def rules(cls) -> dict[str, Range]:
        # theta, tau and the weight lambda of eq. 13 are probabilities or fractions.
        unit = ("theta", "fixed_threshold", "tau_max", "lambda_start", "lambda_end")
        return {
            **{f"algo.{key}": UNIT for key in unit},
            "algo.lambda_ramp_rounds": between(0, MAX_ROUNDS),
            **RANDAUGMENT_RULES,
        }

    @classmethod
    def check_config(cls, cfg: dict[str, Any]) -> None:
        if cfg["algo"]["classwise_threshold"] and cfg["split"]["val_size"] == 0:
            raise ConfigError(
                "config key 'split.val_size': fedseal's class-wise thresholds (eq. 5) come "
                "from the validation set; set it > 0 (or algo.classwise_threshold to false)"
            )

    @classmethod
    def parts(cls, server: ServerSide) -> Parts:
        return Parts.standard(server, payloads=[ClassThresholds(server)])

"""The SSFL benchmark's FedAvg (Zhang, Yao et al. 2020, eq. 4-5): the server's model joins.

Each round, from the current average w_avg: the sampled users train T = client.local_steps
SGD steps on their unlabeled data (eq. 3 or 6, client_app/ssfl_fedavg.py) and the server
trains T = server.local_steps steps on its labeled data (eq. 2) in the same rhythm; then
w_avg = (w_s + sum_k w_k) / (C_k + 1) (eq. 4; eq. 5 when C_k < K). The test accuracy is
that of w_avg. The weight diversity of eq. 8 on the classifier layer is recorded each round.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, Message

from strategies.base import ServerSide, SSFLStrategy
from tasks.aggregate import average_with_server, weight_diversity
from tasks.config import ConfigError
from tasks.models import classifier_keys

LOSSES = ("crl", "selftrain")


def numpy_state(record: ArrayRecord) -> dict[str, np.ndarray]:
    return dict(zip(record.keys(), record.to_numpy_ndarrays()))


def to_record(state: dict[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()})


class SSFLFedAvg(SSFLStrategy):
    """FedAvg including the server's model, server and users training T steps a round."""

    trains_after_aggregation = False  # the server trains beside the users (eq. 4-5)

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        # SSFL benchmark App. A.3 / Table A.1 and the official code: SGD with Nesterov
        # momentum 0.9, weight decay 1e-4, batch 64, cosine schedule eq. 9; T = 16 (3.3).
        # Every rank of the official code keeps its SGD state for the whole run.
        sgd = {
            "keep_momentum": True,
            "bootstrap_epochs": 0,
            "epochs": 0,
            "local_steps": 16,
            "lr": 0.03,
            "momentum": 0.9,
            "nesterov": True,
            "weight_decay": 0.0001,
            "batch_size": 64,
        }
        client = {k: v for k, v in sgd.items() if k not in ("bootstrap_epochs",)}
        return {
            "server": sgd,
            "client": client,
            "lr_schedule": {"name": "cosine", "cycles": 0.4375, "floor": 0.0001},
            "algo": {
                "loss": "crl",  # eq. 6; "selftrain" = eq. 3
                "threshold": 0.95,  # tau of eq. 3 and 6 (3.3, as FixMatch)
                "lambda_u": 1.0,
                "randaugment_n": 2,  # A(.) of eq. 6: RandAugment(n = 2, m = 10)
                "randaugment_m": 10.0,
                # ours, not in the paper: pseudo-labels from weak-view probabilities
                # aligned to uniform (ReMixMatch's distribution alignment)
                "distribution_alignment": False,
            },
        }

    @classmethod
    def check_config(cls, cfg: dict[str, Any]) -> None:
        algo = cfg["algo"]
        if algo["loss"] not in LOSSES:
            raise ConfigError(
                f"config key 'algo.loss': {algo['loss']!r} is not one of crl, selftrain"
            )
        if not 0.0 <= algo["threshold"] <= 1.0:
            raise ConfigError(
                f"config key 'algo.threshold': must be in [0, 1], got {algo['threshold']}"
            )
        if cfg["server"]["local_steps"] < 1 or cfg["client"]["local_steps"] < 1:
            raise ConfigError(
                "config keys 'server.local_steps' and 'client.local_steps': the SSFL methods "
                "count the communication period T in SGD steps; both must be >= 1"
            )

    def __init__(self, server: ServerSide, on_round):
        super().__init__(server, on_round)
        self.classifier = classifier_keys(server.model)
        self.started_from: dict[int, ArrayRecord] = {}
        self.server_trained = 0
        self.server_metrics: dict[str, float] = {}

    def start_model(self, server_round: int, pid: int, arrays: ArrayRecord) -> ArrayRecord:
        """The model user ``pid`` trains from this round: w_avg (FedRGD: its group's)."""
        return arrays

    def client_arrays(self, server_round: int, pid: int, arrays: ArrayRecord) -> ArrayRecord:
        sent = self.start_model(server_round, pid, arrays)
        self.started_from[pid] = sent
        return sent

    def train_server(self, server_round: int) -> None:
        """w_s: T steps of eq. 2 from w_avg, at most once a round."""
        if self.server_trained != server_round:
            self.server_metrics = self.server_train(server_round, self.cfg["server"]["epochs"])
            self.server_trained = server_round

    def aggregate_arrays(self, server_round: int, replies: list[Message]) -> ArrayRecord:
        """Train the server from w_avg, then average it with the users' models (eq. 4-5)."""
        self.train_server(server_round)
        server = numpy_state(self.server.arrays())
        users = {
            int(r.content["metrics"]["partition-id"]): numpy_state(r.content["arrays"])
            for r in replies
        }
        self.round_metrics["weight_diversity"] = self.diversity(users)
        return to_record(self.combine(server_round, server, users))

    def combine(
        self, server_round: int, server: dict[str, np.ndarray], users: dict[int, dict]
    ) -> dict[str, np.ndarray]:
        """The new w_avg: eq. 4-5 (users sorted by partition id)."""
        return average_with_server(server, [users[k] for k in sorted(users)])

    def diversity(self, users: dict[int, dict[str, np.ndarray]]) -> float:
        """Eq. 8 on the classifier layer, u_k = w_k - the model user k started from."""
        updates = []
        for pid in sorted(users):
            start = self.started_from[pid]
            updates.append(
                np.concatenate(
                    [(users[pid][k] - start[k].numpy()).ravel() for k in self.classifier]
                )
            )
        return weight_diversity(updates)

    def server_update(self, server_round: int) -> dict[str, float]:
        """Trained inside the aggregation; alone when no user replied (eq. 5 with C_k = 0)."""
        self.train_server(server_round)
        return self.server_metrics

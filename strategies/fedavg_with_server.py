"""FedAvg with the server's model joining (SSFL benchmark, Zhang, Yao et al. 2020, eq. 4-5).

Each round, from the current average w_avg: the sampled users train T = client.local_steps
SGD steps on their unlabeled data (eq. 3 or 6, client_app/pseudo_label.py) and the server
trains T = server.local_steps steps on its labeled data (eq. 2) in the same rhythm; then
w_avg = (w_s + sum_k w_k) / (C_k + 1) (eq. 4; eq. 5 when C_k < K). The test accuracy is
that of w_avg. The weight diversity of eq. 8 on the classifier layer is recorded each round.
"""

from __future__ import annotations

from typing import Any

from strategies.loop import ServerHalf
from strategies.parts import (
    AverageWithServer,
    DenseCodec,
    Parts,
    ServerSide,
    SupervisedTrainer,
    TestAccuracy,
)
from tasks.config import ConfigError
from tasks.settings import Settings


class FedAvgWithServer(ServerHalf):
    """FedAvg including the server's model; server and users train T steps a round."""

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
        }

    @classmethod
    def check_config(cls, settings: Settings) -> None:
        if settings.server.local_steps < 1 or settings.client.local_steps < 1:
            raise ConfigError(
                "config keys 'server.local_steps' and 'client.local_steps': the SSFL methods "
                "count the communication period T in SGD steps; both must be >= 1"
            )
        algo = settings.algo
        if algo.loss != "selftrain" and algo.selftrain_labels != "eval":
            raise ConfigError(
                f"config key 'algo.selftrain_labels': applies to algo.loss: selftrain only, "
                f"not {algo.loss!r} (CRL reads its pseudo-labels off its training pass)"
            )

    @classmethod
    def aggregator(cls, server: ServerSide) -> AverageWithServer:
        return AverageWithServer(server, server.settings.algo.server_weight)

    @classmethod
    def parts(cls, server: ServerSide) -> Parts:
        return Parts(
            SupervisedTrainer(server, beside_clients=True),
            cls.aggregator(server),
            TestAccuracy(server),
            DenseCodec(),
        )

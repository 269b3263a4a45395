"""Server-SL: the lower bound; the server trains on its labeled set only (FedSEAL Table 1)."""

from __future__ import annotations

from typing import Any

from strategies.loop import Parts, ServerHalf
from strategies.parts import DenseCodec, ServerSide, SupervisedTrainer, TestAccuracy

# Server schedule shared by every labels-at-server method: bootstrap on the labeled set
# (FedSEAL 4.1.3), then E_s epochs a round (FedSEAL eq. 3-4).
SERVER_SCHEDULE: dict[str, Any] = {"server": {"bootstrap_epochs": 20, "epochs": 2}}


def labels_at_server_defaults(**algo: Any) -> dict[str, Any]:
    """The shared server schedule plus a consistency method's ``algo`` keys.

    Every such method has a strong view: RandAugment with n ops of magnitude up to m
    (FixMatch's variant, n = 2, m = 10) and an unlabeled-loss weight lambda_u = 1.
    """
    return {
        **SERVER_SCHEDULE,
        "algo": {"lambda_u": 1.0, "randaugment_n": 2, "randaugment_m": 10.0, **algo},
    }


class ServerSL(ServerHalf):
    """No client takes part; each round is E_s epochs on the server's labeled data."""

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        return SERVER_SCHEDULE

    @classmethod
    def parts(cls, server: ServerSide) -> Parts:
        return Parts(SupervisedTrainer(server), None, TestAccuracy(server), DenseCodec())

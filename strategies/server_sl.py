"""Server-SL: the lower bound; the server trains on its labeled set only (FedSEAL Table 1)."""

from __future__ import annotations

from typing import Any

from strategies.loop import Parts, ServerHalf
from strategies.parts import DenseCodec, ServerSide, SupervisedTrainer, TestAccuracy
from tasks.config import NON_NEGATIVE, UNIT, ConfigError, Range, between

# Server schedule shared by every labels-at-server method: bootstrap on the labeled set
# (FedSEAL 4.1.3), then E_s epochs a round (FedSEAL eq. 3-4).
SERVER_SCHEDULE: dict[str, Any] = {"server": {"bootstrap_epochs": 20, "epochs": 2}}


# RandAugment: n ops per sample (0 = the weak view alone), magnitude m of 10 (tasks.augment).
RANDAUGMENT_RULES: dict[str, Range] = {
    "algo.randaugment_n": between(0, 16),
    "algo.randaugment_m": between(0, 10),
}

# The keys of labels_at_server_defaults: a weight, RandAugment and a confidence threshold.
LABELS_AT_SERVER_RULES: dict[str, Range] = {
    "algo.lambda_u": NON_NEGATIVE,
    "algo.threshold": UNIT,
    **RANDAUGMENT_RULES,
}


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
    def check_config(cls, cfg: dict[str, Any]) -> None:
        scfg = cfg["server"]
        if scfg["epochs"] == 0 and scfg["local_steps"] == 0:
            raise ConfigError(
                "config keys 'server.epochs' and 'server.local_steps': server_sl trains only "
                "on the server; one of them must be > 0"
            )

    @classmethod
    def parts(cls, server: ServerSide) -> Parts:
        return Parts(SupervisedTrainer(server), None, TestAccuracy(server), DenseCodec())

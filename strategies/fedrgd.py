"""FedRGD: grouping-based model averaging of the SSFL benchmark (Zhang, Yao et al., eq. 7).

Each round the users that replied are shuffled at random (seeded per round) into
S = algo.groups groups; the server's model w_s joins every group:
w_avg,i = (w_s + sum_{k in G_i} w_k) / (|G_i| + 1), and w_avg = sum_i w_avg,i / S is
what the server trains from next and what is evaluated. Users of group G_i start the
next round from w_avg,i (a per-client payload). A user that did not take part in the
previous round starts from w_avg (ours: the paper has every user in every round).
With fewer users than S, there are as many groups as users.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.app import ArrayRecord

from strategies.base import ServerSide
from strategies.ssfl_fedavg import SSFLFedAvg, to_record
from tasks.aggregate import assign_groups, group_average
from tasks.config import ConfigError, deep_merge
from tasks.train import derive_seed


class FedRGD(SSFLFedAvg):
    """SSFL FedAvg with eq. 7 in place of eq. 4."""

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        # S = 2 groups on CIFAR-10 and SVHN (SSFL benchmark 3.3 and 4.3).
        return deep_merge(super().defaults(), {"algo": {"groups": 2}})

    @classmethod
    def check_config(cls, cfg: dict[str, Any]) -> None:
        super().check_config(cfg)
        if cfg["algo"]["groups"] < 1:
            raise ConfigError(
                f"config key 'algo.groups': must be >= 1, got {cfg['algo']['groups']}"
            )

    def __init__(self, server: ServerSide, on_round):
        super().__init__(server, on_round)
        self.group_models: dict[int, ArrayRecord] = {}

    def start_model(self, server_round: int, pid: int, arrays: ArrayRecord) -> ArrayRecord:
        return self.group_models.get(pid, arrays)

    def combine(
        self, server_round: int, server: dict[str, np.ndarray], users: dict[int, dict]
    ) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(derive_seed(self.cfg["seed"], "groups", server_round))
        groups = assign_groups(sorted(users), self.cfg["algo"]["groups"], rng)
        per_group, overall = group_average(server, users, groups)
        self.group_models = {}
        for group, state in zip(groups, per_group):
            record = to_record(state)
            self.group_models.update({pid: record for pid in group})
        self.round_metrics["groups"] = groups
        return overall

"""FedSup (FedSup section 4.1.1, Fig. 4.2, Algorithm 3).

Per round: (1) the server trains its supervised network f_Server on the labeled set
(never overwritten by the clients); (2) the online network and f_Server go to the sampled
clients; (3) each client trains the online network on its unlabeled data
(client_app/fedsup.py); (4) the online networks come back; (5) the server updates the
online network by group-wise averaging (FedRGD, SSFL benchmark eq. 7) with f_Server
joining every group. The global model, evaluated every round, is the online network;
``teacher_accuracy`` is f_Server's.

Round order here: the bootstrap (server.bootstrap_epochs) trains f_Server before round 1
and each round's server.epochs after aggregation, so the f_Server sent in round t has
trained as in step (1) of round t.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.app import ArrayRecord
from torch import nn

from ssfl.records import record_arrays
from strategies.loop import ServerHalf
from strategies.parts import (
    DenseCodec,
    GroupedAverage,
    Metrics,
    Parts,
    ServerSide,
    SupervisedTrainer,
    TestAccuracy,
)
from tasks.config import ConfigError
from tasks.data import dataset_info
from tasks.models import classifier_keys, has_ssl_heads, model_for, num_blocks, without_ssl_heads
from tasks.settings import Settings
from tasks.train import derive_seed, evaluate, seeded


def build_teacher(server: ServerSide) -> nn.Module:
    """f_Server: the online network's architecture without the SSL heads, initialised as
    Server-SL's model (same seed), so it trains exactly as the Centralized baseline."""
    with seeded(derive_seed(server.settings.seed, "init")):
        model = model_for(without_ssl_heads(server.settings.model), server.dataset)
    return model.to(server.device)


class TeacherTrainer(SupervisedTrainer):
    """Trains f_Server on the labels (cross-entropy, weak view); the online network is
    not touched, so the loop records no separate aggregate accuracy."""

    def __init__(self, server: ServerSide, teacher: nn.Module):
        super().__init__(server)
        self.model = teacher

    def trains(self) -> bool:
        return False


class Teacher:
    """The payload: f_Server's weights, sent with the online network every round."""

    def __init__(self, server: ServerSide, teacher: nn.Module):
        self.server, self.teacher = server, teacher
        self.record = ArrayRecord(teacher.state_dict())

    def update(self, server_round: int) -> Metrics:
        self.record = ArrayRecord(self.teacher.state_dict())
        acc, _ = evaluate(
            self.teacher,
            self.server.test_x,
            self.server.test_y,
            self.server.settings.eval.batch_size,
        )
        return {"teacher_accuracy": acc}

    def records(self, server_round: int, pid: int) -> dict[str, Any]:
        return {"teacher": self.record}

    def state(self) -> dict[str, Any]:
        """f_Server's weights as last sent (the trainer keeps the network itself)."""
        return {"record": self.record.to_torch_state_dict()}

    def restore(self, state: dict[str, Any]) -> None:
        self.record = ArrayRecord(state["record"])


class SupervisedGroups(GroupedAverage):
    """Eq. 7 with f_Server as w_s: the layers f_Server has come from it, the SSL heads
    (which it lacks) from the server's online network. Every client starts from the
    online network (the paper sends one online network; FedRGD's per-group start models
    are for users that take part every round)."""

    def __init__(self, server: ServerSide, num_groups: int, teacher: nn.Module):
        super().__init__(server, num_groups)
        self.teacher = teacher
        # Eq. 8 over the layers the clients train: FedSup's clients never train the classifier.
        head = set(classifier_keys(server.model))
        self.diversity_keys = [
            k for k, p in server.model.named_parameters() if k not in head and p.requires_grad
        ]

    def joining(self) -> dict[str, np.ndarray]:
        return {
            **record_arrays(self.server.arrays()),
            **record_arrays(ArrayRecord(self.teacher.state_dict())),
        }

    def model_for(self, server_round: int, pid: int, arrays: ArrayRecord) -> ArrayRecord:
        return arrays


class FedSup(ServerHalf):
    """f_Server trained on the labels, online network from the clients, grouped average."""

    ssl_heads = frozenset({"model.projector_dim", "model.predictor_dim"})
    privacy_refusal = (
        "averages in groups (one model a group, each of fewer clients), which the one noised "
        "mean of DP-FedAvg does not calibrate"
    )

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        return {
            # f_Server: 1 epoch a round (ours: the paper's Centralized baseline trains
            # 100 epochs over 100 rounds), one epoch before round 1 (step 1 of round 1).
            "server": {"bootstrap_epochs": 1, "epochs": 1},
            # P = the small CNN's 128-d feature, which the prediction regresses (ResNet-18:
            # 512); H = 128 (ours; FedSup 5.1.1: 512 with ResNet-18).
            "model": {"projector_dim": 128, "predictor_dim": 128},
        }

    @classmethod
    def check_config(cls, settings: Settings) -> None:
        algo, mcfg = settings.algo, settings.model
        model = model_for(mcfg, dataset_info(settings.dataset.name))
        if not has_ssl_heads(model, predictor=True):
            raise ConfigError(
                "config key 'model.projector_dim': fedsup's online network needs a projector "
                "and a predictor: set model.projector_dim and model.predictor_dim > 0"
            )
        width = model[1].head.in_features
        if mcfg.projector_dim != width:
            raise ConfigError(
                f"config key 'model.projector_dim': fedsup's prediction regresses f_Server's "
                f"{width}-d feature: set it to {width}"
            )
        blocks = num_blocks(model) - algo.first_block
        if algo.first_block < 0 or not 0 <= algo.feature_blocks <= blocks:
            raise ConfigError(
                f"config key 'algo.feature_blocks': {mcfg.name} has {num_blocks(model)} conv "
                f"blocks, {blocks} from algo.first_block; got N = {algo.feature_blocks}"
            )

    @classmethod
    def parts(cls, server: ServerSide) -> Parts:
        teacher = build_teacher(server)
        return Parts(
            TeacherTrainer(server, teacher),
            SupervisedGroups(server, server.settings.algo.groups, teacher),
            TestAccuracy(server),
            DenseCodec([Teacher(server, teacher)]),
        )

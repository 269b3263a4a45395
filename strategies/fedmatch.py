"""FedMatch's server half (Jeong et al. 2021): decomposed model, helpers, sparse traffic.

Labels-at-server (Algorithm 2): the server trains sigma on its labeled data with psi
frozen (eq. 4); clients train psi on their unlabeled data (eq. 5) and upload psi only.
Labels-at-client (Algorithm 1): clients train both parts and upload both. The server
averages what it receives uniformly (official code). After each round it embeds every
replying client's model by its softmax output on one fixed noise image; every
``helper_interval``-th round a sampled client also receives the unlabeled parts of its
H nearest other clients (KD-tree, eq. 1-3). Both directions carry only the elements
that moved by more than ``delta`` (``tasks.sparse``), and the round's row reports the
bytes sent beside the dense cost of one model per message.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from torch import nn

from strategies.base import ServerSide, SSFLStrategy
from tasks.aggregate import weighted_average
from tasks.config import ConfigError
from tasks.decompose import (
    BUFFER,
    Decomposed,
    buffer_arrays,
    dense_model_bytes,
    uploaded_parts,
)
from tasks.fedmatch import HelperIndex, is_helper_round, noise_input
from tasks.sparse import Broadcast, decode, encode_changes, payload_arrays, payload_from
from tasks.train import derive_seed, seed_torch, supervised_epochs


def to_record(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    """An ArrayRecord of numpy arrays (sparse payloads keep their index dtype)."""
    return ArrayRecord(
        array_dict={key: Array(np.ascontiguousarray(v)) for key, v in arrays.items()}
    )


class FedMatch(SSFLStrategy):
    """Server half of FedMatch for both scenarios (``split.scenario``)."""

    keeps_momentum = False  # sigma's optimizer is built every round (official code)

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        # The official code's labels-at-server values (reference-implementations.md; paper
        # Table 4): SGD lr 1e-3 without momentum, wd 1e-4, batch 100, server pretraining
        # 1 epoch and 1 epoch a round. Labels-at-client experiments set their own values.
        return {
            "server": {
                "bootstrap_epochs": 1,
                "epochs": 1,
                "lr": 1e-3,
                "momentum": 0.0,
                "weight_decay": 1e-4,
                "batch_size": 100,
            },
            "client": {"lr": 1e-3, "momentum": 0.0, "weight_decay": 1e-4, "batch_size": 100},
            "algo": {
                "decomposition": True,  # false: the "FedMatch (w/o)" ablation, theta = sigma
                "psi_factor": 0.2,  # psi starts as 0.2 sigma (official code)
                "num_helpers": 2,  # H (Table 1-2); 0: the no-helper ablation
                "helper_interval": 10,  # helpers every 10th round (section 3.1)
                "confidence": 0.75,  # tau of the pseudo-labels (official code)
                "lambda_s": 10.0,  # eq. 4 (Table 4)
                "lambda_i": 1e-2,  # inter-client KL of eq. 1 (official lambda_i)
                "lambda_a": 1e-2,  # agreement cross-entropy of eq. 2 (official lambda_a)
                "lambda_l1": 1e-5,  # eq. 5 (Table 4, labels-at-server; 1e-4 at client)
                "lambda_l2": 10.0,  # eq. 5 (Table 4)
                "l1_threshold": 1e-5,  # |psi| at or below is zeroed (official; 5e-6 at client)
                "delta": 1e-5,  # sparse-transmission threshold (official; 5e-5 at client)
                "labeled_batch_size": 10,  # labels-at-client labeled batch (official)
                "randaugment_n": 2,  # RandAugment view pi(u) of eq. 2
                "randaugment_m": 5.0,  # official: magnitude drawn in 2..5 of 10
            },
        }

    @classmethod
    def check_config(cls, cfg: dict[str, Any]) -> None:
        if cfg["server"]["local_steps"]:
            raise ConfigError(
                "config key 'server.local_steps': fedmatch trains sigma in epochs "
                "(server.epochs); set it to 0"
            )

    def __init__(self, server: ServerSide, on_round):
        super().__init__(server, on_round)
        algo = self.cfg["algo"]
        server.model = Decomposed(server.model, algo["psi_factor"], algo["decomposition"])
        server.model.to(server.device)
        self.model: Decomposed = server.model
        self.uploaded = uploaded_parts(
            self.model, self.cfg["split"]["scenario"] == "labels_at_client"
        )
        self.public = {part: Broadcast() for part in self.model.parts()}
        self.synced: dict[int, int] = {}  # partition -> round whose public copy it holds
        self.latest: dict[int, torch.Tensor] = {}  # partition -> its last unlabeled part
        self.embeddings: dict[int, np.ndarray] = {}
        self.index: HelperIndex | None = None
        self.sent_to: set[int] = set()
        self.replied: set[int] = set()
        ds = server.dataset
        self.noise = noise_input(
            ds.channels, ds.image_size, derive_seed(self.cfg["seed"], "fedmatch-noise")
        ).to(server.device)
        self.dense_bytes = dense_model_bytes(self.model)

    # ----- Server training of sigma (eq. 4) -------------------------------------------
    def server_train(self, server_round: int, epochs: int, loss_fn=None) -> dict[str, float]:
        """lambda_s CE on the labeled set, sigma trained, psi frozen (eq. 4, Algorithm 2)."""
        if epochs == 0 or len(self.server.labeled_x) == 0:
            return {}
        scfg, lam = self.cfg["server"], self.cfg["algo"]["lambda_s"]
        self.model.train_only("sigma")
        opt = torch.optim.SGD(
            self.model.params("sigma"),
            lr=self.server_lr(server_round),
            momentum=scfg["momentum"],
            weight_decay=scfg["weight_decay"],
        )
        out = supervised_epochs(
            self.model,
            self.server.labeled_x,
            self.server.labeled_y,
            epochs=epochs,
            optimizer=opt,
            batch_size=scfg["batch_size"],
            generator=seed_torch(derive_seed(self.cfg["seed"], "server", server_round)),
            augment=self.weak,
            loss_fn=lambda logits, y: lam * F.cross_entropy(logits, y),
        )
        return {"server_loss": out["loss"]}

    # ----- Messages to clients --------------------------------------------------------
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Publish the round's model (changes > delta), choose helpers, build the messages."""
        delta = self.cfg["algo"]["delta"]
        for part in self.model.parts():
            self.public[part].publish(self.model.flat(part), delta, server_round)
        helper_round = is_helper_round(server_round, self.cfg["algo"]["helper_interval"])
        use_helpers = helper_round and self.cfg["algo"]["num_helpers"] > 0 and self.embeddings
        self.index = HelperIndex(self.embeddings) if use_helpers else None
        self.sent_to = set()
        messages = list(super().configure_train(server_round, arrays, config, grid))
        self.round_metrics["helper_round"] = float(self.index is not None)
        self.round_metrics["bytes_s2c_dense"] = self.dense_bytes * len(messages)
        self.round_metrics["s2c_ratio"] = self.stats.bytes_s2c / max(
            self.round_metrics["bytes_s2c_dense"], 1
        )
        return messages

    def helpers_of(self, pid: int) -> list[int]:
        if self.index is None:
            return []
        return self.index.helpers(pid, self.cfg["algo"]["num_helpers"])

    def client_arrays(self, server_round: int, pid: int, arrays: ArrayRecord) -> ArrayRecord:
        """The public model as a payload against the copy the client holds (dense if none)."""
        since = self.synced.get(pid)
        out: dict[str, np.ndarray] = {}
        for part in self.model.parts():
            out.update(payload_arrays(self.public[part].payload(since), part))
        out.update(buffer_arrays(self.model))
        self.sent_to.add(pid)
        return to_record(out)

    def client_config(self, server_round: int, pid: int) -> ConfigRecord:
        """Base config plus the round of the client's copy (-1: dense) and its helpers."""
        config = super().client_config(server_round, pid)
        config["sync-since"] = self.synced.get(pid, -1)
        helpers = self.helpers_of(pid)
        if helpers:
            config["helpers"] = helpers
        return config

    def client_extras(self, server_round: int, pid: int) -> dict[str, Any]:
        """On helper rounds: the helpers' unlabeled parts, sparse against the public copy."""
        helpers = self.helpers_of(pid)
        if not helpers:
            return {}
        ref = self.public[self.model.unlabeled_part].value
        delta = self.cfg["algo"]["delta"]
        out: dict[str, np.ndarray] = {}
        for j, helper in enumerate(helpers):
            out.update(payload_arrays(encode_changes(self.latest[helper], ref, delta), f"h{j}"))
        return {"helpers": to_record(out)}

    # ----- Replies --------------------------------------------------------------------
    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Base aggregation; a client that did not reply may hold any copy: dense next time."""
        self.replied = set()
        result = super().aggregate_train(server_round, replies)
        for pid in self.sent_to - self.replied:
            self.synced.pop(pid, None)
        return result

    def aggregate_arrays(self, server_round: int, replies: list[Message]) -> ArrayRecord:
        """Decode each upload against the public copy, embed it, average uniformly."""
        uploads: dict[str, list[torch.Tensor]] = {part: [] for part in self.uploaded}
        buffers = []
        for reply in replies:
            pid = int(reply.content["metrics"]["partition-id"])
            vectors, reply_buffers = self.decode_reply(reply)
            for part, vector in vectors.items():
                uploads[part].append(vector)
            buffers.append(reply_buffers)
            self.latest[pid] = vectors[self.model.unlabeled_part]
            self.embeddings[pid] = self.embed(vectors)
            self.synced[pid] = server_round
            self.replied.add(pid)
        for part, vectors in uploads.items():
            self.model.load_flat(part, torch.stack(vectors).mean(dim=0))
        if buffers[0]:
            average = weighted_average(buffers, [1.0] * len(buffers))
            self.model.net.load_state_dict({k: torch.from_numpy(v) for k, v in average.items()})
        self.round_metrics["c2s_ratio"] = self.stats.bytes_c2s / max(self.stats.bytes_c2s_dense, 1)
        if self.model.decomposed:
            self.round_metrics["psi_nonzero"] = float((self.model.flat("psi") != 0).float().mean())
        return ArrayRecord(self.model.state_dict())

    def decode_reply(self, reply: Message) -> tuple[dict[str, torch.Tensor], dict[str, np.ndarray]]:
        """A reply's uploaded parts, decoded against the public copy, and its buffers."""
        arrays = {k: v.numpy() for k, v in reply.content["arrays"].items()}
        n = self.model.numel()
        vectors = {
            part: decode(self.public[part].value, payload_from(arrays, part), n)
            for part in self.uploaded
        }
        buffers = {k[len(BUFFER) :]: v for k, v in arrays.items() if k.startswith(BUFFER)}
        return vectors, buffers

    def load_local(self, model: nn.Module, reply: Message) -> None:
        """A client's model: its uploaded parts, the public copy of the others (sigma with
        labels at the server: the one it received), its buffers."""
        vectors, buffers = self.decode_reply(reply)
        for part in self.model.parts():
            model.load_flat(part, vectors.get(part, self.public[part].value))
        if buffers:
            model.net.load_state_dict({k: torch.from_numpy(v) for k, v in buffers.items()})

    def embed(self, vectors: dict[str, torch.Tensor]) -> np.ndarray:
        """m^k = p(y | a) of the client's model on the fixed noise input a (section 3.1).

        Labels-at-server: the server's sigma plus the client's psi; at client: its own sigma.
        """
        unlabeled = vectors[self.model.unlabeled_part]
        sigma = vectors.get("sigma") if self.model.decomposed else None
        logits = self.model.forward_with(unlabeled, self.noise, sigma)
        return torch.softmax(logits, dim=1)[0].cpu().numpy()

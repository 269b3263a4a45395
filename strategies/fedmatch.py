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

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord
from torch import nn

from client_app.fedmatch import FedMatchSettings
from ssfl.records import to_record
from strategies.loop import ServerHalf
from strategies.parts import (
    DenseCodec,
    Metrics,
    Parts,
    ServerSide,
    SupervisedTrainer,
    TestAccuracy,
    Update,
)
from tasks.aggregate import array_problem, weighted_average
from tasks.config import ConfigError
from tasks.decompose import BUFFER, Decomposed, buffer_arrays, dense_model_bytes, uploaded_parts
from tasks.fedmatch import HelperIndex, is_helper_round, noise_input
from tasks.settings import Settings
from tasks.sparse import (
    PAYLOAD_KEYS,
    Broadcast,
    decode,
    encode_changes,
    payload_arrays,
    payload_from,
)
from tasks.train import LossFn, derive_seed


class SigmaTrainer(SupervisedTrainer):
    """Eq. 4 (Algorithm 2): lambda_s CE on the labeled set, sigma trained, psi frozen."""

    def __init__(self, server: ServerSide, model: Decomposed):
        super().__init__(server)
        self.model = model

    def parameters(self) -> list[nn.Parameter]:
        return self.model.params("sigma")

    def loss(self, server_round: int) -> tuple[LossFn | None, Metrics]:
        self.model.train_only("sigma")
        lam = self.settings.algo.lambda_s
        return (lambda logits, y: lam * F.cross_entropy(logits, y)), {}


class SparseSync(DenseCodec):
    """FedMatch's payload codec and aggregator: sparse traffic both ways, helpers.

    Both directions carry only the elements that moved by more than ``delta``
    (``tasks.sparse``) against the copy the other side holds. Uploaded parts are decoded
    against the public copy and averaged uniformly (official code); every replying
    client's model is embedded by its softmax on one fixed noise image, and on helper
    rounds a client also receives the unlabeled parts of its H nearest others (eq. 1-3).
    """

    def __init__(self, server: ServerSide, model: Decomposed):
        super().__init__()
        settings, self.model = server.settings, model
        self.algo = settings.algo
        self.uploaded = uploaded_parts(model, settings.split.scenario == "labels_at_client")
        self.public = {part: Broadcast() for part in model.parts()}
        self.synced: dict[int, int] = {}  # partition -> round whose public copy it holds
        self.latest: dict[int, torch.Tensor] = {}  # partition -> its last unlabeled part
        self.embeddings: dict[int, np.ndarray] = {}
        self.index: HelperIndex | None = None
        ds = server.dataset
        self.noise = noise_input(
            ds.channels, ds.image_size, derive_seed(settings.seed, "fedmatch-noise")
        ).to(server.device)
        self.dense_model_bytes = dense_model_bytes(model)

    # ----- Server -> client -----------------------------------------------------------
    def begin_round(self, server_round: int) -> Metrics:
        """Publish the round's model (changes > delta); on helper rounds index the clients."""
        for part in self.model.parts():
            self.public[part].publish(self.model.flat(part), self.algo.delta, server_round)
        helper_round = is_helper_round(server_round, self.algo.helper_interval)
        use_helpers = helper_round and self.algo.num_helpers > 0 and self.embeddings
        self.index = HelperIndex(self.embeddings) if use_helpers else None
        return {"helper_round": float(self.index is not None)}

    def helpers_of(self, pid: int) -> list[int]:
        if self.index is None:
            return []
        return self.index.helpers(pid, self.algo.num_helpers)

    def config(self, server_round: int, pid: int) -> dict[str, Any]:
        """The round of the client's copy (-1: dense) and its helpers."""
        helpers = self.helpers_of(pid)
        return {"sync-since": self.synced.get(pid, -1), **({"helpers": helpers} if helpers else {})}

    def encode(self, server_round: int, pid: int, start: ArrayRecord) -> dict[str, Any]:
        """The public model against the client's copy, and on helper rounds its helpers'
        unlabeled parts against the public copy."""
        since = self.synced.get(pid)
        model: dict[str, np.ndarray] = {}
        for part in self.model.parts():
            model.update(payload_arrays(self.public[part].payload(since), part))
        model.update(buffer_arrays(self.model))
        out: dict[str, Any] = {"arrays": to_record(model)}
        helpers = self.helpers_of(pid)
        if helpers:
            ref = self.public[self.model.unlabeled_part].value
            arrays: dict[str, np.ndarray] = {}
            for j, helper in enumerate(helpers):
                changes = encode_changes(self.latest[helper], ref, self.algo.delta)
                arrays.update(payload_arrays(changes, f"h{j}"))
            out["helpers"] = to_record(arrays)
        return out

    # ----- Client -> server -----------------------------------------------------------
    def start_model(self, server_round: int, pid: int, arrays: ArrayRecord) -> ArrayRecord:
        return arrays

    def aggregate(self, server_round: int, updates: list[Update]) -> tuple[ArrayRecord, Metrics]:
        """Decode each upload against the public copy, embed it, average uniformly."""
        uploads: dict[str, list[torch.Tensor]] = {part: [] for part in self.uploaded}
        buffers = []
        for update in updates:
            vectors, update_buffers = self.decode(update)
            for part, vector in vectors.items():
                uploads[part].append(vector)
            buffers.append(update_buffers)
            self.latest[update.pid] = vectors[self.model.unlabeled_part]
            self.embeddings[update.pid] = self.embed(vectors)
            self.synced[update.pid] = server_round
        for part, vectors in uploads.items():
            self.model.load_flat(part, torch.stack(vectors).mean(dim=0))
        if buffers[0]:
            average = weighted_average(buffers, [1.0] * len(buffers))
            self.model.net.load_state_dict({k: torch.from_numpy(v) for k, v in average.items()})
        metrics: Metrics = {}
        if self.model.decomposed:
            metrics["psi_nonzero"] = float((self.model.flat("psi") != 0).float().mean())
        return ArrayRecord(self.model.state_dict()), metrics

    def end_round(self, sent: set[int], replied: set[int]) -> None:
        """A client that did not reply may hold any copy: dense next time."""
        for pid in sent - replied:
            self.synced.pop(pid, None)

    # ----- Checkpoint -----------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """The public copies (values and the round each element changed), the round each
        client's copy is from, every client's last unlabeled part and its embedding."""
        return {
            "public": {
                part: {"value": b.value, "changed_at": b.changed_at}
                for part, b in self.public.items()
            },
            "synced": dict(self.synced),
            "latest": dict(self.latest),
            "embeddings": {pid: torch.from_numpy(e) for pid, e in self.embeddings.items()},
        }

    def restore(self, state: dict[str, Any]) -> None:
        for part, kept in state["public"].items():
            self.public[part].value = kept["value"]
            self.public[part].changed_at = kept["changed_at"]
        self.synced = dict(state["synced"])
        self.latest = dict(state["latest"])
        self.embeddings = {pid: e.numpy() for pid, e in state["embeddings"].items()}

    def decode(self, update: Update) -> tuple[dict[str, torch.Tensor], dict[str, np.ndarray]]:
        """An update's uploaded parts, decoded against the public copy, and its buffers."""
        arrays = {k: v.numpy() for k, v in update.content["arrays"].items()}
        n = self.model.numel()
        vectors = {
            part: decode(self.public[part].value, payload_from(arrays, part), n)
            for part in self.uploaded
        }
        buffers = {k[len(BUFFER) :]: v for k, v in arrays.items() if k.startswith(BUFFER)}
        return vectors, buffers

    def validate(self, update: Update, global_state: Mapping[str, torch.Tensor]) -> str | None:
        """Why a sparse reply is unusable (None: usable): every array must be a payload of an
        uploaded part or one of the model's buffers (keys, shapes, dtypes, finite), and every
        payload must decode against the public copy to finite values."""
        record = update.content.array_records.get("arrays")
        if record is None:
            return "no 'arrays' record"
        payloads = {f"{part}.{key}" for part in self.uploaded for key in PAYLOAD_KEYS}
        unknown = sorted(k for k in record if not k.startswith(BUFFER) and k not in payloads)
        if unknown:
            return f"unknown arrays {unknown[:3]}"
        buffers = {k[len(BUFFER) :]: v.numpy() for k, v in record.items() if k.startswith(BUFFER)}
        problem = array_problem(buffers, self.model.buffer_state())
        if problem is not None:
            return f"buffers: {problem}"
        try:
            vectors, _ = self.decode(update)
        except (ValueError, RuntimeError, IndexError) as err:
            return f"sparse payload does not decode ({err})"
        bad = sorted(part for part, vector in vectors.items() if not torch.isfinite(vector).all())
        return f"part '{bad[0]}' decodes to non-finite values" if bad else None

    def dense_bytes(self, update: Update) -> int:
        """What one dense model per reply costs, as the client reports it (``dense-bytes``;
        the sparse arrays' own shapes say nothing of it), else the arrays' dense size."""
        reported = update.content["metrics"].get("dense-bytes")
        return int(reported) if reported is not None else super().dense_bytes(update)

    def load_local(self, model: nn.Module, update: Update) -> None:
        """A client's model: its uploaded parts, the public copy of the others (sigma with
        labels at the server: the one it received), its buffers."""
        vectors, buffers = self.decode(update)
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


def check_official_view(algo: FedMatchSettings) -> None:
    """The official view draws its own ops and levels: a RandAugment key set away from its
    default would be ignored, so it is refused."""
    if algo.strong_view != "official":
        return
    declared = FedMatchSettings()
    for key in ("randaugment_n", "randaugment_m"):
        if getattr(algo, key) != getattr(declared, key):
            raise ConfigError(
                f"config key 'algo.{key}': unused with algo.strong_view official (it draws 6 "
                f"ops at levels in 0..M-1, M in 2..5); leave it at {getattr(declared, key)!r}"
            )


class FedMatch(ServerHalf):
    """Server half of FedMatch for both scenarios (``split.scenario``)."""

    averages_models = False  # sparse psi decoded against the public copy, not a model average
    privacy_refusal = (
        "sends a sparse decomposed update (psi) and helper models, not one dense model update "
        "that DP-FedAvg clips"
    )

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
        }

    @classmethod
    def check_config(cls, settings: Settings) -> None:
        if settings.eval.protocol_every:
            raise ConfigError(
                "config key 'eval.protocol_every': fedmatch's model is sigma + psi, not an "
                "encoder with one head; the protocols do not apply (set it to 0)"
            )
        if settings.server.local_steps:
            raise ConfigError(
                "config key 'server.local_steps': fedmatch trains sigma in epochs "
                "(server.epochs); set it to 0"
            )
        check_official_view(settings.algo)

    @classmethod
    def parts(cls, server: ServerSide) -> Parts:
        """The global model becomes sigma + psi (tasks.decompose) before any part sees it."""
        algo = server.settings.algo
        model = Decomposed(server.model, algo.psi_factor, algo.decomposition)
        server.model = model.to(server.device)
        sync = SparseSync(server, model)
        return Parts(SigmaTrainer(server, model), sync, TestAccuracy(server), sync)

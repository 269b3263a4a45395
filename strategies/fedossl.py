"""FedoSSL (Zhang et al., ICML 2023; Fig. 1, Algorithm 1) and its open-world baselines.

Per round: (1) sampled clients train on their labeled seen data and unlabeled data with
eq. 4 and compute 32 local centroids by Sinkhorn-Knopp clustering (client_app/fedossl.py);
(2) they upload the model and the centroids (with per-class sums of their labeled
features); (3) the server averages the models (FedAvg); (4) it clusters all local
centroids into the C global centroids (Sinkhorn-Knopp, the seen classes claiming their
rows by their labeled-feature means); (5) the model and the global centroids go to the
next round's clients. The evaluator gives the Hungarian-matched open-world accuracies.

The baselines of Table 2 are configs of this code (experiments/fmnist-open/): Fed-AO =
FedAvg + ORCA (beta = gamma = 0: no centroids travel), Fed-RO = FedRep + ORCA
(``algo.personal: head``: the classifier stays on each client), Local-O (``personal:
all``: no federation, the clients' own models evaluated and averaged), Cen-O (one client
holding every role-client's data), the same four with NACH's objective (``algo.objective:
nach``: Fed-AN, Fed-RN, Local-N, Cen-N), SemiFL* (``algo.objective: semifl``), and the
ablations of Tables 3-4.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, fields
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord
from torch import nn

from client_app.fedossl import FedoSSLSettings
from ssfl.records import record_arrays, to_record
from strategies.loop import ServerHalf
from strategies.parts import DenseCodec, Evaluator, Metrics, NoTrainer, Parts, ServerSide, Update
from tasks.aggregate import weighted_average
from tasks.augment import concrete_engine, strong_augment
from tasks.config import ConfigError
from tasks.data import dataset_info
from tasks.models import classifier_keys, head_of, model_for
from tasks.openworld import claim_seen_rows, cluster_global_centroids, open_world_accuracy, predict
from tasks.partition import class_roles
from tasks.pretrain import cached_pretrain, settings_from, simclr_pretrain
from tasks.settings import Settings, mapping
from tasks.train import autocast, derive_seed, seeded, to_float

log = logging.getLogger(__name__)

METRICS = ("acc_all", "acc_seen", "acc_unseen", "acc_lu", "acc_gu")


def uses_centroids(algo: FedoSSLSettings) -> bool:
    """Whether the calibration module runs (gamma != 0): only then do centroids travel."""
    return algo.gamma != 0.0


class GlobalCentroids:
    """The payload: the global centroids m (C x d), kept across rounds and sent to every
    client; refined each round from the clients' local centroids (Fig. 1 step 4)."""

    def __init__(self, server: ServerSide):
        self.server, self.algo = server, server.settings.algo
        head = head_of(server.model)
        count = self.algo.global_centroids or head.out_features
        gen = torch.Generator().manual_seed(derive_seed(server.settings.seed, "centroids"))
        self.m = F.normalize(torch.randn(count, head.in_features, generator=gen), dim=1)
        roles = roles_of(server.settings, server.dataset.num_classes)
        self.seen = [c for c, r in enumerate(roles) if r == "S"]

    def update(self, server_round: int) -> Metrics:
        return {}

    def records(self, server_round: int, pid: int) -> dict[str, Any]:
        return {"centroids": to_record({"global": self.m.numpy().astype(np.float32)})}

    def state(self) -> dict[str, Any]:
        """The global centroids m."""
        return {"m": self.m}

    def restore(self, state: dict[str, Any]) -> None:
        self.m = state["m"]

    def cluster(self, updates: list[Update]) -> Metrics:
        """New m from every local centroid of the round, then the seen rows claimed."""
        a = self.algo

        def stacked(key: str) -> list[torch.Tensor]:
            return [torch.from_numpy(u.content["centroids"][key].numpy()) for u in updates]

        local = torch.cat(stacked("local"))
        m = cluster_global_centroids(
            self.m,
            local,
            steps=a.server_cluster_steps,
            lr=a.server_cluster_lr,
            temperature=a.centroid_temperature,
            sharpness=a.sinkhorn_sharpness,
            weight_decay=a.server_cluster_weight_decay,
        )
        sums, counts = sum(stacked("seen_sums")), sum(stacked("seen_counts"))
        present = counts > 0
        if present.any() and max(self.seen) < len(m):
            seen = [c for c, p in zip(self.seen, present.tolist()) if p]
            m = claim_seen_rows(m, sums[present] / counts[present, None], seen)
        self.m = m
        return {"local_centroids": len(local)}


def roles_of(settings: Settings, num_classes: int) -> str:
    """The role letter of every class (tasks.partition.class_roles)."""
    return class_roles(settings.split.class_roles, num_classes)


class SimCLRStart(NoTrainer):
    """Section 5's SimCLR-pretrained start (algo.pretrain_epochs > 0): before round 1 the
    server's model is pretrained (tasks/pretrain.py) on every image the clients hold,
    labeled or not, as the official code's checkpoint is trained on the training set
    without labels; round 1's row records the stage (``pretrain_*``)."""

    def __init__(self, server: ServerSide):
        self.server = server
        self.settings = settings_from(server.settings.algo)
        self.record: Metrics = {}

    def key(self) -> dict[str, Any]:
        """Every input of the stage (tasks.pretrain.cached_pretrain keeps its result)."""
        s = self.server.settings
        engine = self.engine()
        return {
            "dataset": mapping(s.dataset),
            "split": mapping(s.split),
            "seed": s.seed,
            "model": mapping(s.model),
            "simclr": asdict(self.settings),
            "views": [s.algo.randaugment_n, s.algo.randaugment_m, s.augment.weak_shift],
            "device": self.server.device.type,
            # Only when on, so that the float32 stages kept before amp existed stay valid.
            **({"amp": s.train.amp} if s.train.amp != "off" else {}),
            # Only when not kornia's, so that the stages kept before the engines stay valid.
            **({"engine": engine} if engine != "kornia" else {}),
        }

    def engine(self) -> str:
        """The augmentation engine of the stage's views (``augment.engine`` on its device)."""
        return concrete_engine(self.server.settings.augment.engine, self.server.device)

    def bootstrap(self) -> None:
        s = self.server
        pool = np.unique(np.concatenate([*s.split.clients, *s.split.client_labeled]))
        started = time.perf_counter()
        losses, cached = cached_pretrain(s.model, self.key(), lambda: self._pretrain(pool))
        self.record = {
            "pretrain_loss": losses[-1],
            "pretrain_first_loss": losses[0],
            "pretrain_epochs": len(losses),
            "pretrain_images": len(pool),
            "pretrain_seconds": time.perf_counter() - started,
            "pretrain_cached": int(cached),
        }
        log.info(
            "SimCLR start: %d epochs on %d images, NT-Xent %.4f -> %.4f%s",
            len(losses),
            len(pool),
            losses[0],
            losses[-1],
            " (from the cache)" if cached else "",
        )

    def _pretrain(self, pool: np.ndarray) -> list[float]:
        """SimCLR on the images ``pool`` indexes, with the strong views of the run (under
        bf16 autocast when train.amp is bf16)."""
        s, settings = self.server, self.server.settings
        algo, ds = settings.algo, s.dataset
        augment = strong_augment(
            self.engine(),
            ds.image_size,
            ds.flip,
            ds.channels,
            algo.randaugment_n,
            algo.randaugment_m,
            settings.augment.weak_shift,
        ).to(s.device)
        images = to_float(ds.train_x[pool], s.device)
        seed = derive_seed(settings.seed, "pretrain")
        with seeded(seed) as generator, autocast(settings.train.amp, s.device):
            return simclr_pretrain(s.model, images, augment, self.settings, generator)

    def after_aggregate(self, server_round: int) -> Metrics:
        """Round 1's row records the stage."""
        return self.record if server_round == 1 else {}


class OpenWorldAverage:
    """FedAvg of the models (size-weighted as the paper, or uniform as the official code:
    ``algo.weighted_average``), personalised starts (``algo.personal``), and the global
    centroids refined from the local ones when the calibration module runs."""

    def __init__(self, server: ServerSide, centroids: GlobalCentroids | None):
        self.server, self.centroids = server, centroids
        self.algo = server.settings.algo
        self.head_keys = set(classifier_keys(server.model))
        self.kept: dict[int, dict[str, np.ndarray]] = {}  # per client: its head or model

    def start_model(self, server_round: int, pid: int, arrays: ArrayRecord) -> ArrayRecord:
        """The global model; with personal head (FedRep) the client's own classifier, with
        personal all (Local-O) the client's own model, once it has one."""
        if pid not in self.kept:
            return arrays
        return to_record({**record_arrays(arrays), **self.kept[pid]})

    def aggregate(self, server_round: int, updates: list[Update]) -> tuple[ArrayRecord, Metrics]:
        states = {u.pid: u.arrays for u in updates}
        weights = [float(u.num_examples) if self.algo.weighted_average else 1.0 for u in updates]
        average = weighted_average([states[u.pid] for u in updates], weights, self.server.device)
        personal = self.algo.personal
        for pid, state in states.items():
            if personal == "head":
                self.kept[pid] = {k: v for k, v in state.items() if k in self.head_keys}
            elif personal == "all":
                self.kept[pid] = state
        metrics = self.centroids.cluster(updates) if self.centroids is not None else {}
        return to_record(average), metrics

    def state(self) -> dict[str, Any]:
        """The clients' kept heads or models (the centroids are the codec's payload)."""
        kept = {pid: {k: torch.from_numpy(v) for k, v in s.items()} for pid, s in self.kept.items()}
        return {"kept": kept}

    def restore(self, state: dict[str, Any]) -> None:
        self.kept = {pid: {k: v.numpy() for k, v in s.items()} for pid, s in state["kept"].items()}

    def local_models(self) -> list[dict[str, np.ndarray]]:
        """The clients' own models (personal all), in partition order."""
        if self.algo.personal != "all":
            return []
        return [self.kept[pid] for pid in sorted(self.kept)]


class OpenWorldAccuracy(Evaluator):
    """Section 5's metrics on the test set (Hungarian-matched, tasks.openworld), each with its
    best over the run so far (``best_acc_*``: the paper reports the best round).
    ``test_accuracy`` is acc_all. Local-O: the mean over the clients' own models."""

    def __init__(self, server: ServerSide, aggregator: OpenWorldAverage):
        super().__init__(server)
        self.aggregator = aggregator
        settings = server.settings
        roles = roles_of(settings, server.dataset.num_classes)
        self.groups = [[c for c, r in enumerate(roles) if r == letter] for letter in "SLG"]
        self.scale, self.batch = settings.algo.logit_scale, settings.eval.batch_size
        self.best: dict[str, float] = {}
        self.scratch: nn.Module | None = None

    def metrics_of(self, model: nn.Module) -> Metrics:
        s = self.server
        _, logits = predict(model, s.test_x, self.scale, self.batch)
        y, pred = s.test_y.cpu().numpy(), logits.argmax(1).cpu().numpy()
        out: Metrics = open_world_accuracy(y, pred, *self.groups)
        out["test_loss"] = float(F.cross_entropy(logits, s.test_y))
        return out

    def evaluate(self, model: nn.Module) -> Metrics:
        local = self.aggregator.local_models() if model is self.server.model else []
        out = self.mean_over(local) if local else self.metrics_of(model)
        out["test_accuracy"] = out["acc_all"]
        if model is self.server.model:
            for key in METRICS:
                self.best[key] = max(self.best.get(key, 0.0), out[key])
                out[f"best_{key}"] = self.best[key]
        return out

    def state(self) -> dict[str, Any]:
        """The best of each metric so far."""
        return {"best": dict(self.best)}

    def restore(self, state: dict[str, Any]) -> None:
        self.best = dict(state["best"])

    def mean_over(self, states: list[dict[str, np.ndarray]]) -> Metrics:
        if self.scratch is None:
            self.scratch = model_for(self.server.settings.model, self.server.dataset)
        rows = []
        for state in states:
            self.scratch.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
            rows.append(self.metrics_of(self.scratch.to(self.server.device)))
        return {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}


class CentroidCodec(DenseCodec):
    """Dense models both ways; with the calibration module the global centroids go down
    and each reply must hold its local centroids and labeled-feature sums (counted in
    bytes_s2c / bytes_c2s like every array of a message)."""

    def __init__(self, server: ServerSide, centroids: GlobalCentroids | None):
        super().__init__([centroids] if centroids is not None else [])
        self.centroids = centroids
        self.algo = server.settings.algo
        self.width = head_of(server.model).in_features

    def validate(self, update: Update, global_state) -> str | None:
        problem = super().validate(update, global_state)
        if problem is not None or self.centroids is None:
            return problem
        record = update.content.array_records.get("centroids")
        if record is None:
            return "no 'centroids' record"
        seen = len(self.centroids.seen)
        shapes = {
            "local": (self.algo.local_centroids, self.width),
            "seen_sums": (seen, self.width),
            "seen_counts": (seen,),
        }
        for key, shape in shapes.items():
            if key not in record:
                return f"'centroids' has no '{key}'"
            if tuple(record[key].shape) != shape:
                return f"'centroids.{key}' has shape {tuple(record[key].shape)}, expected {shape}"
            if not np.isfinite(record[key].numpy()).all():
                return f"'centroids.{key}' holds non-finite values"
        return None


class FedoSSL(ServerHalf):
    """FedAvg of the models + Sinkhorn-Knopp global centroids; open-world evaluation."""

    open_world = True
    averages_models = False  # kept personal heads and clustered centroids beside the average
    privacy_refusal = (
        "sends cluster centroids beside its model, which clipping a model update does not bound"
    )

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        return {
            # Definition 1: the labels are at the clients (split.labeled_fraction of each
            # seen class), none at the server.
            "split": {"scenario": "open_world", "labeled_per_class": 0, "val_size": 0},
            # Section 5: SGD lr 0.1, momentum 0.9, weight decay 5e-4, batch 512, E = 5. The
            # official code keeps each client's optimizer across rounds and decays its rate
            # by 10 at 70% and 90% of training (MultiStepLR at epochs 140 and 180 of 200).
            "client": {
                "lr": 0.1,
                "momentum": 0.9,
                "weight_decay": 5e-4,
                "batch_size": 512,
                "keep_momentum": True,
            },
            "lr_schedule": {"name": "multistep"},
        }

    @classmethod
    def check_config(cls, settings: Settings) -> None:
        algo, split = settings.algo, settings.split
        if split.scenario != "open_world":
            raise ConfigError("config key 'split.scenario': fedossl needs open_world")
        if split.labeled_per_class or split.client_labeled_per_class:
            raise ConfigError(
                "config key 'split.labeled_per_class': open_world labels are at the clients "
                "(split.labeled_fraction); set labeled_per_class and client_labeled_per_class to 0"
            )
        changed = [
            f.name for f in fields(settings.server) if getattr(settings.server, f.name) != f.default
        ]
        if changed:
            raise ConfigError(f"config key 'server.{changed[0]}': fedossl's server does not train")
        classes = dataset_info(settings.dataset.name).num_classes
        if "S" not in class_roles(split.class_roles, classes):
            raise ConfigError("config key 'split.class_roles': needs at least one seen class (S)")
        if algo.objective == "semifl" and (algo.beta or algo.gamma):
            raise ConfigError(
                "config key 'algo.objective': semifl uses neither R_i nor L_cal; "
                "set algo.beta and algo.gamma to 0"
            )
        if algo.mix_weight and algo.objective != "semifl":
            raise ConfigError(
                "config key 'algo.mix_weight': SemiFL's term; needs algo.objective semifl"
            )
        if algo.ood_threshold > algo.pseudo_threshold:
            raise ConfigError(
                "config key 'algo.ood_threshold': must be at most algo.pseudo_threshold"
            )
        if algo.global_centroids > classes:
            raise ConfigError(
                f"config key 'algo.global_centroids': {algo.global_centroids} global "
                f"centroids for {classes} classes; at most one per class (0 = {classes})"
            )
        if algo.local_centroids > algo.centroid_samples:
            raise ConfigError(
                "config key 'algo.local_centroids': must be in [1, algo.centroid_samples]"
            )

    @classmethod
    def parts(cls, server: ServerSide) -> Parts:
        centroids = GlobalCentroids(server) if uses_centroids(server.settings.algo) else None
        aggregator = OpenWorldAverage(server, centroids)
        trainer = SimCLRStart(server) if server.settings.algo.pretrain_epochs else NoTrainer()
        return Parts(
            trainer,
            aggregator,
            OpenWorldAccuracy(server, aggregator),
            CentroidCodec(server, centroids),
        )

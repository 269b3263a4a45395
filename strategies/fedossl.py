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
from dataclasses import asdict
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord
from torch import nn

from strategies.loop import Parts, ServerHalf
from strategies.parts import (
    DenseCodec,
    Metrics,
    NoTrainer,
    ServerSide,
    Update,
    numpy_state,
    to_record,
)
from tasks.aggregate import weighted_average
from tasks.augment import StrongAugment
from tasks.config import (
    DEFAULTS,
    MAX_BATCH,
    MAX_CLIENTS,
    MAX_EPOCHS,
    MAX_IMAGES,
    MAX_ROUNDS,
    MAX_STEPS,
    MAX_WIDTH,
    NON_NEGATIVE,
    POSITIVE,
    UNIT,
    ConfigError,
    Range,
    between,
)
from tasks.data import dataset_info
from tasks.models import TRAINABLE, classifier_keys, head_of, model_for
from tasks.openworld import (
    claim_seen_rows,
    cluster_global_centroids,
    open_world_accuracy,
    predict,
)
from tasks.partition import class_roles
from tasks.pretrain import cached_pretrain, settings_from, simclr_pretrain
from tasks.train import autocast, derive_seed, seeded, to_float

log = logging.getLogger(__name__)

PERSONAL = ("none", "head", "all")
OBJECTIVES = ("orca", "nach", "semifl")
METRICS = ("acc_all", "acc_seen", "acc_unseen", "acc_lu", "acc_gu")


def uses_centroids(algo: dict[str, Any]) -> bool:
    """Whether the calibration module runs (gamma != 0): only then do centroids travel."""
    return algo["gamma"] != 0.0


class GlobalCentroids:
    """The payload: the global centroids m (C x d), kept across rounds and sent to every
    client; refined each round from the clients' local centroids (Fig. 1 step 4)."""

    def __init__(self, server: ServerSide):
        self.server, self.algo = server, server.cfg["algo"]
        head = head_of(server.model)
        count = self.algo["global_centroids"] or head.out_features
        gen = torch.Generator().manual_seed(derive_seed(server.cfg["seed"], "centroids"))
        self.m = F.normalize(torch.randn(count, head.in_features, generator=gen), dim=1)
        roles = roles_of(server.cfg, server.dataset.num_classes)
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
            steps=a["server_cluster_steps"],
            lr=a["server_cluster_lr"],
            temperature=a["centroid_temperature"],
            sharpness=a["sinkhorn_sharpness"],
        )
        sums, counts = sum(stacked("seen_sums")), sum(stacked("seen_counts"))
        present = counts > 0
        if present.any() and max(self.seen) < len(m):
            seen = [c for c, p in zip(self.seen, present.tolist()) if p]
            m = claim_seen_rows(m, sums[present] / counts[present, None], seen)
        self.m = m
        return {"local_centroids": len(local)}


def roles_of(cfg: dict[str, Any], num_classes: int) -> str:
    """The role letter of every class (tasks.partition.class_roles)."""
    return class_roles(cfg["split"]["class_roles"], num_classes)


class SimCLRStart(NoTrainer):
    """Section 5's SimCLR-pretrained start (algo.pretrain_epochs > 0): before round 1 the
    server's model is pretrained (tasks/pretrain.py) on every image the clients hold,
    labeled or not, as the official code's checkpoint is trained on the training set
    without labels; round 1's row records the stage (``pretrain_*``)."""

    def __init__(self, server: ServerSide):
        self.server = server
        self.settings = settings_from(server.cfg["algo"])
        self.record: Metrics = {}

    def key(self) -> dict[str, Any]:
        """Every input of the stage (tasks.pretrain.cached_pretrain keeps its result)."""
        cfg, algo = self.server.cfg, self.server.cfg["algo"]
        return {
            "dataset": cfg["dataset"],
            "split": cfg["split"],
            "seed": cfg["seed"],
            "model": cfg["model"],
            "simclr": asdict(self.settings),
            "views": [algo["randaugment_n"], algo["randaugment_m"], cfg["augment"]["weak_shift"]],
            "device": self.server.device.type,
            # Only when on, so that the float32 stages kept before amp existed stay valid.
            **({"amp": cfg["train"]["amp"]} if cfg["train"]["amp"] != "off" else {}),
        }

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
        s, cfg = self.server, self.server.cfg
        algo, ds = cfg["algo"], s.dataset
        augment = StrongAugment(
            ds.image_size,
            ds.flip,
            ds.channels,
            algo["randaugment_n"],
            algo["randaugment_m"],
            cfg["augment"]["weak_shift"],
        ).to(s.device)
        images = to_float(ds.train_x[pool], s.device)
        with seeded(derive_seed(cfg["seed"], "pretrain")) as generator, autocast(cfg, s.device):
            return simclr_pretrain(s.model, images, augment, self.settings, generator)

    def train(self, server_round: int) -> Metrics:
        return self.record if server_round == 1 else {}


class OpenWorldAverage:
    """FedAvg of the models (size-weighted as the paper, or uniform as the official code:
    ``algo.weighted_average``), personalised starts (``algo.personal``), and the global
    centroids refined from the local ones when the calibration module runs."""

    def __init__(self, server: ServerSide, centroids: GlobalCentroids | None):
        self.server, self.centroids = server, centroids
        self.algo = server.cfg["algo"]
        self.head_keys = set(classifier_keys(server.model))
        self.kept: dict[int, dict[str, np.ndarray]] = {}  # per client: its head or model

    def start_model(self, server_round: int, pid: int, arrays: ArrayRecord) -> ArrayRecord:
        """The global model; with personal head (FedRep) the client's own classifier, with
        personal all (Local-O) the client's own model, once it has one."""
        if pid not in self.kept:
            return arrays
        return to_record({**numpy_state(arrays), **self.kept[pid]})

    def aggregate(self, server_round: int, updates: list[Update]) -> tuple[ArrayRecord, Metrics]:
        states = {u.pid: numpy_state(u.content["arrays"]) for u in updates}
        weights = [float(u.num_examples) if self.algo["weighted_average"] else 1.0 for u in updates]
        average = weighted_average([states[u.pid] for u in updates], weights)
        personal = self.algo["personal"]
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
        if self.algo["personal"] != "all":
            return []
        return [self.kept[pid] for pid in sorted(self.kept)]


class OpenWorldAccuracy:
    """Section 5's metrics on the test set (Hungarian-matched, tasks.openworld), each with its
    best over the run so far (``best_acc_*``: the paper reports the best round).
    ``test_accuracy`` is acc_all. Local-O: the mean over the clients' own models."""

    def __init__(self, server: ServerSide, aggregator: OpenWorldAverage):
        self.server, self.aggregator = server, aggregator
        cfg = server.cfg
        roles = roles_of(cfg, server.dataset.num_classes)
        self.groups = [[c for c, r in enumerate(roles) if r == letter] for letter in "SLG"]
        self.scale, self.batch = cfg["algo"]["logit_scale"], cfg["eval"]["batch_size"]
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
            self.scratch = model_for(self.server.cfg["model"], self.server.dataset)
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
        self.algo = server.cfg["algo"]
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
            "local": (self.algo["local_centroids"], self.width),
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

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        return {
            "split": {
                "scenario": "open_world",
                "labeled_per_class": 0,  # Definition 1: the labels are at the clients
                "val_size": 0,
                # One letter per class (S seen, L locally unseen, G globally unseen);
                # "" = section 5: 60% seen, one locally unseen, the rest globally unseen.
                "class_roles": "",
                "labeled_fraction": 0.5,  # section 5: 50% of each seen class labeled
                "role_clients": 0,  # clients the roles are laid over (0 = num_clients)
                "samples_per_class": 0,  # 0 = every training image of each class
            },
            # Section 5: SGD lr 0.1, momentum 0.9, weight decay 5e-4, batch 512, E = 5.
            "client": {"lr": 0.1, "momentum": 0.9, "weight_decay": 5e-4, "batch_size": 512},
            "algo": {
                "alpha": 1.0,  # eq. 1: weight of the pairwise objective L_u
                "beta": 1.0,  # eq. 4: weight of R_i
                "flip_suppressed": False,  # true: R_i maximised (the code's commented-out sign)
                "gamma": 1.0,  # eq. 4: weight of L_cal (Fig. 5: 0.5 best); 0 = no centroids
                "ce_weight": 1.0,  # eq. 7: L_ce (0: Table 3's ablation without L_ce)
                "cluster_weight": 1.0,  # eq. 7: L_cluster (code: 0.5)
                "entropy_weight": 1.0,  # code: -H(mean p), ORCA's regulariser
                "tau": 0.2,  # eq. 6: tau in (0, 1] (code: 0.2)
                "logit_scale": 10.0,  # code: the cosine head 10 * <z^, w^_c>
                "max_margin": 0.5,  # code: margin = min(u_bar, 0.5) (ORCA)
                "calibration_threshold": 0.95,  # code: L_ce on q > 0.95
                "centroid_temperature": 0.1,  # eq. 8-9: q = softmax(z^ . m / T), code T = 0.1
                "cluster_from_round": 5,  # code: L_cluster from round 5
                "ce_from_round": 7,  # code: L_ce from round 7
                "local_centroids": 32,  # Fig. 1 step 1: L = 32 for 10 classes
                "global_centroids": 0,  # 0 = the class count (10 for CIFAR-10)
                "centroid_samples": 1024,  # code: a 1,024-feature memory
                "kmeans_iters": 5,  # code: models/resnet_s.py, 5 iterations (SemiFL*'s too)
                "sinkhorn_sharpness": 25.0,  # code: lambda 25
                "server_cluster_steps": 500,  # code: 500 SGD steps on m
                "server_cluster_lr": 0.01,  # code: lr 0.01, momentum 0.9
                "weighted_average": True,  # section 3.1: n_i / n weights (code: uniform)
                "personal": "none",  # head: FedRep (Fed-RO); all: Local-O
                # Table 2 baselines: orca (ORCA, FedoSSL), nach (NACH), semifl (SemiFL*)
                "objective": "orca",
                "pseudo_threshold": 0.95,  # NACH: seen threshold; SemiFL: fixed threshold
                "ood_threshold": 0.5,  # SemiFL* (ours): OOD when no seen class reaches it
                # SemiFL* (ours): pseudo-labels from this round on; SemiFL's server trains on
                # the labels before clients pseudo-label, here round 1 trains on them alone
                "pseudo_from_round": 2,
                "self_training_weight": 1.0,  # NACH / SemiFL*: weight of the strong-view CE
                # SemiFL's fix-mix term (official code: modules.py, Beta(0.75, 0.75)): its
                # weight (0: the fix term alone, as the Table 2 cells ran) and mixup's alpha
                "mix_weight": 0.0,
                "mixup_alpha": 0.75,
                "randaugment_n": 2,  # NACH / SemiFL*: the strong view, RandAugment (n, m)
                "randaugment_m": 10.0,
                # Section 5: every method starts from a SimCLR-pretrained model; epochs of
                # SimCLR on the clients' pooled images before round 1 (0: from scratch)
                "pretrain_epochs": 0,
                "pretrain_batch_size": 512,  # ours (the official checkpoint's not given)
                "pretrain_lr": 0.5,  # ours: SGD, cosine-decayed (SimCLR: 0.3 x batch / 256, LARS)
                "pretrain_temperature": 0.5,  # SimCLR's tau (FedSup section 5.1.1: 0.5)
                "pretrain_projector_dim": 128,  # ours: the projector thrown away after
                # Section 5 (as ORCA): last_block = only the last block and the head train
                "trainable": "all",
            },
        }

    @classmethod
    def rules(cls) -> dict[str, Range]:
        # global_centroids' upper bound is the class count, local_centroids' the samples
        # (check_config).
        return {
            "split.labeled_fraction": Range(0, 1, low_open=True, high_open=True),
            "split.role_clients": between(0, MAX_CLIENTS),
            "split.samples_per_class": between(0, MAX_IMAGES),
            "algo.alpha": NON_NEGATIVE,
            "algo.beta": NON_NEGATIVE,
            "algo.gamma": NON_NEGATIVE,
            "algo.ce_weight": NON_NEGATIVE,
            "algo.cluster_weight": NON_NEGATIVE,
            "algo.entropy_weight": NON_NEGATIVE,
            "algo.tau": Range(0, 1, low_open=True),
            "algo.logit_scale": POSITIVE,
            "algo.max_margin": NON_NEGATIVE,
            "algo.calibration_threshold": UNIT,
            "algo.centroid_temperature": POSITIVE,
            "algo.cluster_from_round": between(1, MAX_ROUNDS),
            "algo.ce_from_round": between(1, MAX_ROUNDS),
            "algo.local_centroids": between(1, MAX_IMAGES),
            "algo.global_centroids": between(0, MAX_WIDTH),
            "algo.centroid_samples": between(1, MAX_IMAGES),
            "algo.kmeans_iters": between(0, MAX_STEPS),
            "algo.sinkhorn_sharpness": POSITIVE,
            "algo.server_cluster_steps": between(0, MAX_STEPS),
            "algo.server_cluster_lr": POSITIVE,
            "algo.pseudo_threshold": UNIT,
            "algo.ood_threshold": UNIT,
            "algo.pseudo_from_round": between(1, MAX_ROUNDS),
            "algo.self_training_weight": NON_NEGATIVE,
            "algo.mix_weight": NON_NEGATIVE,
            "algo.mixup_alpha": POSITIVE,
            "algo.randaugment_n": between(0, 16),
            "algo.randaugment_m": between(0, 10),
            "algo.pretrain_epochs": between(0, MAX_EPOCHS),
            "algo.pretrain_batch_size": between(2, MAX_BATCH),
            "algo.pretrain_lr": POSITIVE,
            "algo.pretrain_temperature": POSITIVE,
            "algo.pretrain_projector_dim": between(1, MAX_WIDTH),
        }

    @classmethod
    def check_config(cls, cfg: dict[str, Any]) -> None:
        algo, split = cfg["algo"], cfg["split"]
        if split["scenario"] != "open_world":
            raise ConfigError("config key 'split.scenario': fedossl needs open_world")
        if split["labeled_per_class"] or split["client_labeled_per_class"]:
            raise ConfigError(
                "config key 'split.labeled_per_class': open_world labels are at the clients "
                "(split.labeled_fraction); set labeled_per_class and client_labeled_per_class to 0"
            )
        if not 0.0 < split["labeled_fraction"] < 1.0:
            raise ConfigError("config key 'split.labeled_fraction': must be in (0, 1)")
        server = {k: v for k, v in cfg["server"].items() if v != DEFAULTS["server"][k]}
        if server:
            raise ConfigError(
                f"config key 'server.{next(iter(server))}': fedossl's server does not train"
            )
        classes = dataset_info(cfg["dataset"]["name"]).num_classes
        if "S" not in class_roles(split["class_roles"], classes):
            raise ConfigError("config key 'split.class_roles': needs at least one seen class (S)")
        if algo["objective"] not in OBJECTIVES:
            raise ConfigError(f"config key 'algo.objective': one of {', '.join(OBJECTIVES)}")
        if algo["objective"] == "semifl" and (algo["beta"] or algo["gamma"]):
            raise ConfigError(
                "config key 'algo.objective': semifl uses neither R_i nor L_cal; "
                "set algo.beta and algo.gamma to 0"
            )
        if algo["mix_weight"] and algo["objective"] != "semifl":
            raise ConfigError(
                "config key 'algo.mix_weight': SemiFL's term; needs algo.objective semifl"
            )
        if algo["ood_threshold"] > algo["pseudo_threshold"]:
            raise ConfigError(
                "config key 'algo.ood_threshold': must be at most algo.pseudo_threshold"
            )
        if algo["trainable"] not in TRAINABLE:
            raise ConfigError(f"config key 'algo.trainable': one of {', '.join(TRAINABLE)}")
        if algo["personal"] not in PERSONAL:
            raise ConfigError(f"config key 'algo.personal': one of {', '.join(PERSONAL)}")
        for key in ("alpha", "beta", "gamma", "ce_weight", "cluster_weight", "entropy_weight"):
            if algo[key] < 0:
                raise ConfigError(f"config key 'algo.{key}': must be >= 0, got {algo[key]}")
        if not 0.0 < algo["tau"] <= 1.0:
            raise ConfigError(f"config key 'algo.tau': must be in (0, 1], got {algo['tau']}")
        if algo["global_centroids"] > classes or algo["global_centroids"] < 0:
            raise ConfigError(
                f"config key 'algo.global_centroids': {algo['global_centroids']} global "
                f"centroids for {classes} classes; at most one per class (0 = {classes})"
            )
        if algo["local_centroids"] < 1 or algo["local_centroids"] > algo["centroid_samples"]:
            raise ConfigError(
                "config key 'algo.local_centroids': must be in [1, algo.centroid_samples]"
            )

    @classmethod
    def parts(cls, server: ServerSide) -> Parts:
        centroids = GlobalCentroids(server) if uses_centroids(server.cfg["algo"]) else None
        aggregator = OpenWorldAverage(server, centroids)
        trainer = SimCLRStart(server) if server.cfg["algo"]["pretrain_epochs"] else NoTrainer()
        return Parts(
            trainer,
            aggregator,
            OpenWorldAccuracy(server, aggregator),
            CentroidCodec(server, centroids),
        )

"""The parts a method's server half is composed of, each reusable by any method.

A method (``strategies/<method>.py``) picks one of each and hands them to
:class:`strategies.loop.RoundLoop`, which drives them:

- a **server trainer**: the supervised step on the labeled set (:class:`SupervisedTrainer`,
  :class:`NoTrainer`), run after aggregation or beside the clients;
- an **aggregator**: turns the round's client updates into the next global model and
  chooses the model each client starts from (:class:`FedAvg`, :class:`AverageWithServer`
  of SSFL eq. 4-5, :class:`GroupedAverage` of eq. 7); the model-averaging ones take the
  robust options of ``aggregate.*`` through :class:`RobustAveraging`;
- an **evaluator**: a dict of metrics of a model (:class:`TestAccuracy`);
- a **payload codec**: which records travel each way, how replies are read and which
  replies are well formed (:class:`DenseCodec` with optional extra :class:`Payload`
  records such as FedSEAL's thresholds).

Parts hold their own state and return their metrics; nothing is passed through
shared mutable attributes. What a part keeps across rounds it gives to the run's checkpoint
(``state``) and takes back on resume (``restore``): tensors and plain values only.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Protocol

import numpy as np
import torch
from flwr.app import ArrayRecord, Message, RecordDict
from torch import nn

from ssfl.cohort import SumRequest
from ssfl.records import record_arrays, record_dtypes, to_record
from tasks.aggregate import (
    PartialSum,
    State,
    array_problem,
    assign_groups,
    average_with_server,
    classifier_update,
    clip_update,
    coordinate_median,
    diversity_of_partial_sums,
    group_average,
    keep_own_buffers,
    krum_select,
    mean_of_partial_sums,
    partial_sum,
    trimmed_mean,
    update_norm,
    weight_diversity,
    weighted_average,
)
from tasks.augment import concrete_engine, weak_augment
from tasks.data import Dataset
from tasks.models import classifier_keys, model_for
from tasks.partition import Split
from tasks.protocols import ProtocolSettings, finetune_accuracy, linear_accuracy
from tasks.settings import Settings
from tasks.train import (
    LossFn,
    autocast,
    derive_seed,
    evaluate,
    make_sgd,
    scheduled_lr,
    seeded,
    steps_per_round,
    supervised_epochs,
    to_float,
)

# Keys of a client's MetricRecord that are bookkeeping, not metrics to average.
BOOKKEEPING = ("partition-id", "num-examples", "dense-bytes")

Metrics = dict[str, Any]


@dataclass
class ServerSide:
    """What the server holds: the run's settings, data on the device, and the global
    model."""

    settings: Settings
    dataset: Dataset
    split: Split
    device: torch.device
    model: nn.Module
    labeled_x: torch.Tensor
    labeled_y: torch.Tensor
    val_x: torch.Tensor
    val_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor

    @classmethod
    def build(
        cls, settings: Settings, dataset: Dataset, split: Split, device: torch.device
    ) -> ServerSide:
        with seeded(derive_seed(settings.seed, "init")):
            model = model_for(settings.model, dataset).to(device)
        train_x, train_y = dataset.train_x, dataset.train_y
        return cls(
            settings=settings,
            dataset=dataset,
            split=split,
            device=device,
            model=model,
            labeled_x=to_float(train_x[split.server_labeled], device),
            labeled_y=train_y[split.server_labeled].to(device),
            val_x=to_float(train_x[split.val], device),
            val_y=train_y[split.val].to(device),
            test_x=to_float(dataset.test_x[split.test], device),
            test_y=dataset.test_y[split.test].to(device),
        )

    def arrays(self) -> ArrayRecord:
        return ArrayRecord(self.model.state_dict())

    def load(self, arrays: ArrayRecord) -> None:
        self.model.load_state_dict(arrays.to_torch_state_dict())

    def adopt(self, arrays: ArrayRecord) -> None:
        """Take the round's aggregate as the global model: all of it, or with
        federation.average ``parameters`` its parameters only (the model keeps its own
        buffers, as the SSFL benchmark's official code)."""
        if self.settings.federation.average == "all":
            self.load(arrays)
            return
        own = record_arrays(self.arrays())
        buffers = [name for name, _ in self.model.named_buffers() if name in own]
        kept = keep_own_buffers(record_arrays(arrays), own, buffers)
        self.model.load_state_dict({k: torch.from_numpy(v) for k, v in kept.items()})

    def weak_augment(self) -> nn.Module:
        """The weak view of the server's labeled batches (flip + shift; augment.engine's)."""
        ds, augment = self.dataset, self.settings.augment
        engine = concrete_engine(augment.engine, self.device)
        view = weak_augment(engine, ds.image_size, ds.flip, augment.weak_shift)
        return view.to(self.device)


# ----- Records -------------------------------------------------------------------------
def record_bytes(content: RecordDict) -> int:
    """Bytes of every array in a message, as serialised (what actually travels)."""
    return sum(len(arr.data) for rec in content.array_records.values() for arr in rec.values())


def dense_bytes(content: RecordDict) -> int:
    """What the arrays of a message would cost as dense float32 tensors."""
    return sum(
        4 * int(np.prod(arr.shape))
        for rec in content.array_records.values()
        for arr in rec.values()
    )


@dataclass(frozen=True)
class Update:
    """One accepted client reply: who sent it, how many examples, what it holds."""

    pid: int
    num_examples: int
    content: RecordDict

    @cached_property
    def arrays(self) -> dict[str, np.ndarray]:
        """The reply's ``arrays`` record decoded, once for validation, aggregation and the
        local models' evaluation (each Array.numpy() call deserialises anew)."""
        return record_arrays(self.content["arrays"])

    @property
    def metrics(self) -> dict[str, float]:
        record = self.content["metrics"]
        return {k: float(v) for k, v in record.items() if k not in BOOKKEEPING}

    @classmethod
    def of(cls, reply: Message) -> Update:
        return cls.of_content(reply.content)

    @classmethod
    def of_content(cls, content: RecordDict) -> Update:
        """The update of one client's reply records."""
        metrics = content["metrics"]
        return cls(int(metrics["partition-id"]), int(metrics["num-examples"]), content)


def mean_metrics(updates: list[Update]) -> Metrics:
    """Example-weighted mean of every client metric (a metric some clients lack: theirs)."""
    names = sorted({k for u in updates for k in u.metrics})
    out = {}
    for name in names:
        vals = [(u.num_examples, u.metrics[name]) for u in updates if name in u.metrics]
        total = sum(w for w, _ in vals)
        out[name] = sum(w * v for w, v in vals) / total if total else 0.0
    return out


# ----- Evaluators ----------------------------------------------------------------------
class Evaluator(ABC):
    """What a round measures of the server's models. A method's evaluator defines
    ``evaluate``; every evaluator runs the evaluation protocols when due and can score the
    models the clients uploaded."""

    def __init__(self, server: ServerSide):
        self.server = server
        self.protocols = Protocols(server)
        self.local_scratch: nn.Module | None = None  # holds one client's model at a time

    @abstractmethod
    def evaluate(self, model: nn.Module) -> Metrics:
        """Metrics of ``model``; ``test_accuracy`` is always one of them."""

    def after_round(self, model: nn.Module, server_round: int, last_round: int) -> Metrics:
        """The evaluation protocols' accuracies when due (eval.protocol_every), else none."""
        if not self.protocols.due(server_round, last_round):
            return {}
        return self.protocols.evaluate(model, server_round)

    def local_accuracy(self, updates: list[Update], codec: DenseCodec) -> float:
        """Mean test accuracy of the models the clients uploaded, each loaded by ``codec``
        (eval.local_models; FedMatch Table 2's averaged local model accuracy: in the
        official code every client evaluates its model on the shared test set right after
        local training)."""
        if self.local_scratch is None:
            self.local_scratch = copy.deepcopy(self.server.model)
        accuracies = []
        for update in updates:
            codec.load_local(self.local_scratch, update)
            accuracies.append(self.evaluate(self.local_scratch)["test_accuracy"])
        return float(np.mean(accuracies))


class TestAccuracy(Evaluator):
    """Top-1 accuracy and cross-entropy on the server's test set."""

    def __init__(self, server: ServerSide):
        super().__init__(server)
        self.x, self.y = server.test_x, server.test_y
        self.batch_size = server.settings.eval.batch_size
        self.amp, self.device = server.settings.train.amp, server.device

    def evaluate(self, model: nn.Module) -> Metrics:
        with autocast(self.amp, self.device):
            acc, loss = evaluate(model, self.x, self.y, self.batch_size)
        return {"test_accuracy": acc, "test_loss": loss}


class Protocols:
    """FedSup 5.1.2's evaluation protocols of the global model on the server's labels: a
    fresh linear head finetuned end to end (Table 6.1) and a linear probe on the frozen
    encoder (Table 6.2), every eval.protocol_every rounds and at the last round."""

    def __init__(self, server: ServerSide):
        self.server = server
        ev, sv = server.settings.eval, server.settings.server
        self.every = ev.protocol_every
        common = {
            "batch_size": sv.batch_size,
            "momentum": sv.momentum,
            "schedule": ev.protocol_schedule,
        }
        self.finetune = ProtocolSettings(ev.finetune_epochs, ev.finetune_lr, **common)
        self.linear = ProtocolSettings(ev.linear_epochs, ev.linear_lr, **common)

    def due(self, server_round: int, last_round: int) -> bool:
        return self.every > 0 and (server_round % self.every == 0 or server_round == last_round)

    def evaluate(self, model: nn.Module, server_round: int) -> Metrics:
        s = self.server
        data = (s.labeled_x, s.labeled_y, s.test_x, s.test_y)
        seed = derive_seed(s.settings.seed, "protocols", server_round)
        batch = s.settings.eval.batch_size
        return {
            "finetune_accuracy": finetune_accuracy(
                model, *data, self.finetune, seed, s.weak_augment(), batch
            ),
            "linear_accuracy": linear_accuracy(model, *data, self.linear, seed, batch),
        }


# ----- Server trainers -----------------------------------------------------------------
class NoTrainer:
    """A method whose server does not train (after its optional bootstrap)."""

    def trains(self) -> bool:
        return False

    def trains_aggregate(self) -> bool:
        """Whether the round's server step changes the clients' aggregate."""
        return False

    def bootstrap(self) -> None:
        """Nothing to do."""

    def before_aggregate(self, server_round: int) -> Metrics:
        """The server's step while the clients train, from the model they start from."""
        return {}

    def after_aggregate(self, server_round: int) -> Metrics:
        """The server's step on the clients' aggregate."""
        return {}

    def state(self) -> dict[str, Any]:
        return {}

    def restore(self, state: dict[str, Any]) -> None:
        """Nothing kept."""


class SupervisedTrainer:
    """SGD with weak augmentation on the server's labeled set (FedSEAL eq. 3-4).

    Each round is server.epochs epochs, or T = server.local_steps steps when > 0 (SSFL
    benchmark eq. 2). ``beside_clients``: the server trains from the model the clients
    start from, before aggregation (SSFL eq. 4-5); otherwise it trains the clients'
    aggregate. The bootstrap (round 0) is server.bootstrap_epochs epochs (FedSEAL 4.1.3).
    """

    def __init__(self, server: ServerSide, beside_clients: bool = False):
        self.server = server
        self.model = server.model  # what the server trains (FedSup: its own network)
        self.settings = server.settings
        self.half = server.settings.server
        self.beside_clients = beside_clients
        self.weak = server.weak_augment()
        self.kept_optimizer: torch.optim.Optimizer | None = None

    def trains(self) -> bool:
        """Whether a round changes the model (labeled data and E_s or T > 0)."""
        return len(self.server.labeled_x) > 0 and (
            self.half.epochs > 0 or self.half.local_steps > 0
        )

    def trains_aggregate(self) -> bool:
        """Whether the round's server step changes the clients' aggregate (FedSEAL eq. 3-4),
        not the model they started from."""
        return self.trains() and not self.beside_clients

    def bootstrap(self) -> None:
        """Counted in epochs even when rounds count T steps (server.local_steps)."""
        if self.half.bootstrap_epochs:
            self.fit(0, self.half.bootstrap_epochs)

    def train(self, server_round: int) -> Metrics:
        return self.fit(server_round, self.half.epochs)

    def before_aggregate(self, server_round: int) -> Metrics:
        """The round's training when the server trains beside the clients (SSFL eq. 4-5)."""
        return self.train(server_round) if self.beside_clients else {}

    def after_aggregate(self, server_round: int) -> Metrics:
        """The round's training on the clients' aggregate (FedSEAL eq. 3-4)."""
        return {} if self.beside_clients else self.train(server_round)

    def lr(self, server_round: int, step: int = 0, round_steps: int = 0) -> float:
        """The rate at ``step`` of a round (``lr_schedule``; SSFL eq. 9 when cosine)."""
        s = self.settings
        return scheduled_lr(s.server, s.lr_schedule, s.rounds, server_round, step, round_steps)

    def parameters(self) -> Iterable[nn.Parameter]:
        """What the server's SGD updates."""
        return self.model.parameters()

    def loss(self, server_round: int) -> tuple[LossFn | None, Metrics]:
        """The round's supervised loss (None: cross-entropy) and what to record of it."""
        return None, {}

    def optimizer(self, server_round: int) -> torch.optim.Optimizer:
        """A fresh SGD a round, or with server.keep_momentum one for the whole run."""
        if self.kept_optimizer is not None:
            return self.kept_optimizer
        s = self.half
        opt = make_sgd(
            self.parameters(), self.lr(server_round), s.momentum, s.weight_decay, s.nesterov
        )
        if s.keep_momentum:
            self.kept_optimizer = opt
        return opt

    def state(self) -> dict[str, Any]:
        """The kept optimizer's state (server.keep_momentum) and, when the trainer trains a
        model of its own (FedSup's f_Server), that model's weights."""
        out: dict[str, Any] = {}
        if self.kept_optimizer is not None:
            out["optimizer"] = self.kept_optimizer.state_dict()
        if self.model is not self.server.model:
            out["model"] = self.model.state_dict()
        return out

    def restore(self, state: dict[str, Any]) -> None:
        if "model" in state:
            self.model.load_state_dict(state["model"])
        if "optimizer" in state:
            self.optimizer(0).load_state_dict(state["optimizer"])

    def fit(self, server_round: int, epochs: int) -> Metrics:
        """``epochs`` epochs on the labeled set, or T steps from round 1 on."""
        n = len(self.server.labeled_x)
        steps = self.half.local_steps if server_round > 0 else 0
        round_steps = steps_per_round(n, self.half.batch_size, epochs, steps)
        if n == 0 or round_steps == 0:
            return {}
        opt = self.optimizer(server_round)
        loss_fn, loss_metrics = self.loss(server_round)
        seed = derive_seed(self.settings.seed, "server", server_round)
        with seeded(seed) as gen, autocast(self.settings.train.amp, self.server.device):
            out = supervised_epochs(
                self.model,
                self.server.labeled_x,
                self.server.labeled_y,
                epochs=epochs,
                optimizer=opt,
                batch_size=self.half.batch_size,
                generator=gen,
                augment=self.weak,
                local_steps=steps,
                lr_at=lambda step: self.lr(server_round, step, round_steps),
                **({"loss_fn": loss_fn} if loss_fn is not None else {}),
            )
        return {"server_loss": out["loss"], "server_steps": out["steps"], **loss_metrics}


# ----- Aggregators ---------------------------------------------------------------------
class Aggregator(Protocol):
    def start_model(self, server_round: int, pid: int, arrays: ArrayRecord) -> ArrayRecord:
        """The model client ``pid`` trains from this round."""

    def aggregate(self, server_round: int, updates: list[Update]) -> tuple[ArrayRecord, Metrics]:
        """The next global model from the round's updates, and metrics of the step."""

    def state(self) -> dict[str, Any]:
        """What it keeps across rounds, for the run's checkpoint."""

    def restore(self, state: dict[str, Any]) -> None:
        """Take back what ``state`` gave."""


class RobustAveraging:
    """The robust options of the averaging step (``aggregate.*``), for every aggregator that
    averages models: clip each update (client model minus the model it received) to
    ``clip_norm``, drop those that lose validation accuracy (``validate_on_server``), then
    combine the rest by ``rule`` in place of the mean. Inactive with the defaults: the
    aggregator then averages exactly as without it."""

    def __init__(self, server: ServerSide):
        self.server = server
        self.options = server.settings.aggregate
        self.scratch: nn.Module | None = None  # holds one model at a time for validation
        self.device = server.device  # where the means are summed (tasks.aggregate)

    def active(self) -> bool:
        o = self.options
        return o.rule != "mean" or o.clip_norm > 0 or o.validate_on_server

    def screen(
        self, users: dict[int, State], starts: Mapping[int, ArrayRecord]
    ) -> tuple[dict[int, State], Metrics]:
        """The users' models clipped and validated (dropped ones left out), and the
        partitions clipped and dropped (``clipped_partitions``, ``dropped_partitions``)."""
        metrics: Metrics = {}
        bound = self.options.clip_norm
        if bound > 0:
            decoded = {id(start): record_arrays(start) for start in starts.values()}
            received = {pid: decoded[id(starts[pid])] for pid in users}  # one global: once
            metrics["clipped_partitions"] = [
                pid for pid in sorted(users) if update_norm(users[pid], received[pid]) > bound
            ]
            users = {pid: clip_update(users[pid], received[pid], bound) for pid in users}
        if self.options.validate_on_server:
            dropped = self.validation_drops(users, starts)
            metrics["dropped_partitions"] = dropped
            users = {pid: state for pid, state in users.items() if pid not in dropped}
        return users, metrics

    def validation_drops(
        self, users: dict[int, State], starts: Mapping[int, ArrayRecord]
    ) -> list[int]:
        """The partitions whose model's accuracy on the server's validation set is more than
        ``validation_margin`` below its reference (``validation_reference``)."""
        scores = {pid: self.validation_accuracy(users[pid]) for pid in sorted(users)}
        if self.options.validation_reference == "median":
            middle = float(np.median(list(scores.values()))) if scores else 0.0
            references = {pid: middle for pid in scores}
        else:
            received: dict[int, float] = {}  # by the id of the start record (often shared)
            for pid in scores:
                start = starts[pid]
                if id(start) not in received:
                    received[id(start)] = self.validation_accuracy(record_arrays(start))
            references = {pid: received[id(starts[pid])] for pid in scores}
        margin = self.options.validation_margin
        return [pid for pid, score in scores.items() if score < references[pid] - margin]

    def validation_accuracy(self, state: State) -> float:
        """Accuracy of a model on the server's labeled validation set."""
        s = self.server
        if self.scratch is None:
            self.scratch = copy.deepcopy(s.model)
        self.scratch.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()})
        with autocast(s.settings.train.amp, s.device):
            acc, _ = evaluate(self.scratch, s.val_x, s.val_y, s.settings.eval.batch_size)
        return acc

    def combine(
        self, users: dict[int, State], weights: Mapping[int, float]
    ) -> tuple[dict[str, np.ndarray], Metrics]:
        """The users' models combined by ``rule`` (partition order); ``mean`` and
        ``multi_krum`` weight them by ``weights``, the others count each once. Krum's picks
        are recorded as ``krum_selected``."""
        pids = sorted(users)
        states = [users[pid] for pid in pids]
        rule, o = self.options.rule, self.options
        if rule == "mean":
            return weighted_average(states, [weights[pid] for pid in pids], self.device), {}
        if rule == "median":
            return coordinate_median(states), {}
        if rule == "trimmed_mean":
            return trimmed_mean(states, o.trim_fraction), {}
        m = 1 if rule == "krum" else o.krum_m or max(len(states) - o.krum_f, 1)
        chosen = sorted(pids[i] for i in krum_select(states, o.krum_f, min(m, len(states))))
        average = weighted_average(
            [users[pid] for pid in chosen], [weights[pid] for pid in chosen], self.device
        )
        return average, {"krum_selected": chosen}

    def with_server(
        self, server: State, users: dict[int, State], server_weight: float
    ) -> tuple[dict[str, np.ndarray], Metrics]:
        """SSFL eq. 4 with the users' mean replaced by ``rule``: (a w_s + K r(w_k)) / (a + K)
        for the K users (w_s alone when none is left)."""
        if not users:
            return dict(server), {}
        combined, metrics = self.combine(users, {pid: 1.0 for pid in users})
        joined = weighted_average(
            [server, combined], [server_weight, float(len(users))], self.device
        )
        return joined, metrics


class FedAvg:
    """FedAvg weighted by the clients' example counts (McMahan et al.; FedSEAL eq. 2), or
    with ``aggregate.*`` a robust rule in place of the mean (:class:`RobustAveraging`)."""

    def __init__(self, server: ServerSide):
        self.server = server
        self.robust = RobustAveraging(server)
        self.device = server.device  # where the mean is summed (tasks.aggregate)
        self.started_from: dict[int, ArrayRecord] = {}  # this round's start of each client

    def start_model(self, server_round: int, pid: int, arrays: ArrayRecord) -> ArrayRecord:
        sent = self.model_for(server_round, pid, arrays)
        self.started_from[pid] = sent
        return sent

    def model_for(self, server_round: int, pid: int, arrays: ArrayRecord) -> ArrayRecord:
        """The model client ``pid`` trains from: the global model."""
        return arrays

    def aggregate(self, server_round: int, updates: list[Update]) -> tuple[ArrayRecord, Metrics]:
        states = {u.pid: u.arrays for u in updates}
        weights = {u.pid: float(u.num_examples) for u in updates}
        if not self.robust.active():
            avg = weighted_average(
                [states[u.pid] for u in updates], [weights[u.pid] for u in updates], self.device
            )
            return to_record(avg), {}
        kept, metrics = self.robust.screen(states, self.started_from)
        if not kept:  # every update dropped: the global model stays
            return self.started_from[updates[0].pid], metrics
        avg, more = self.robust.combine(kept, weights)
        return to_record(avg), {**metrics, **more}

    def sum_request(self) -> SumRequest | None:
        """What a cohort worker may sum for this rule (simulation.partial_sums): the models
        weighted by their examples; None for a robust rule (it needs every model)."""
        return None if self.robust.active() else SumRequest("examples")

    def aggregate_sums(
        self, server_round: int, updates: list[Update], sums: list[PartialSum]
    ) -> tuple[ArrayRecord, Metrics]:
        """FedAvg (eq. 2) from the workers' partial sums: sum_k n_k w_k / sum_k n_k."""
        parts = self.with_unsummed(updates, sums, "examples")
        dtypes = record_dtypes(self.started_from[updates[0].pid])
        return to_record(mean_of_partial_sums(parts, dtypes, self.device)), {}

    def with_unsummed(
        self, updates: list[Update], sums: list[PartialSum], weights: str, keys: tuple = ()
    ) -> list[PartialSum]:
        """``sums``, plus one partial sum of the accepted updates that no worker summed
        (weighted by ``weights``; eq. 8's terms over ``keys`` if given)."""
        summed = {pid for part in sums for pid in part.pids}
        rest = [u for u in updates if u.pid not in summed]
        if not rest:
            return list(sums)
        starts = [record_arrays(self.started_from[u.pid]) for u in rest] if keys else []
        w = [float(u.num_examples) if weights == "examples" else 1.0 for u in rest]
        pids = [u.pid for u in rest]
        return [*sums, partial_sum(pids, [u.arrays for u in rest], w, starts, keys)]

    def state(self) -> dict[str, Any]:
        """Nothing outlives a round (AverageWithServer's start models are set each round)."""
        return {}

    def restore(self, state: dict[str, Any]) -> None:
        """Nothing kept."""


class AverageWithServer(FedAvg):
    """SSFL benchmark eq. 4-5: w_avg = (w_s + sum_k w_k) / (C_k + 1), equal weights.

    w_s is the server's model after its step beside the clients; ``server_weight`` a
    (ours, default 1 = eq. 4) weights it a against each user's 1. Each round also records
    the weight diversity of eq. 8 on the classifier, u_k = w_k - the model k started from.
    """

    def __init__(self, server: ServerSide, server_weight: float = 1.0):
        super().__init__(server)
        self.server_weight = server_weight
        self.diversity_keys = classifier_keys(server.model)  # eq. 8: the classifier's

    def joining(self) -> dict[str, np.ndarray]:
        """w_s, the model that joins the users' average: the server's."""
        return record_arrays(self.server.arrays())

    def aggregate(self, server_round: int, updates: list[Update]) -> tuple[ArrayRecord, Metrics]:
        server = self.joining()
        users = {u.pid: u.arrays for u in updates}
        metrics = {"weight_diversity": self.diversity(users)}
        if self.robust.active():
            users, screened = self.robust.screen(users, self.started_from)
            metrics.update(screened)
        state, more = self.combine(server_round, server, users)
        return to_record(state), {**metrics, **more}

    def sum_request(self) -> SumRequest | None:
        """Equal weights (eq. 4-5) and eq. 8's classifier keys; None for a robust rule."""
        return None if self.robust.active() else SumRequest("equal", tuple(self.diversity_keys))

    def aggregate_sums(
        self, server_round: int, updates: list[Update], sums: list[PartialSum]
    ) -> tuple[ArrayRecord, Metrics]:
        """Eq. 4-5 and eq. 8 from the workers' partial sums: (a w_s + sum_k w_k) / (a + K)."""
        users = self.with_unsummed(updates, sums, "equal", tuple(self.diversity_keys))
        server = self.joining()
        joined = [partial_sum([-1], [server], [self.server_weight]), *users]
        metrics = {"weight_diversity": diversity_of_partial_sums(users)}
        dtypes = {key: array.dtype for key, array in server.items()}
        return to_record(mean_of_partial_sums(joined, dtypes, self.device)), metrics

    def combine(
        self, server_round: int, server: dict[str, np.ndarray], users: dict[int, dict]
    ) -> tuple[dict[str, np.ndarray], Metrics]:
        """The new w_avg (eq. 4-5, users sorted by partition id; ``aggregate.rule`` in place
        of the users' mean)."""
        if self.robust.active():
            return self.robust.with_server(server, users, self.server_weight)
        users_sorted = [users[k] for k in sorted(users)]
        return average_with_server(server, users_sorted, self.server_weight, self.device), {}

    def diversity(self, users: dict[int, dict[str, np.ndarray]]) -> float:
        """Eq. 8 over the users' updates of ``diversity_keys``."""
        keys = self.diversity_keys
        updates = []
        for pid in sorted(users):
            start = {k: self.started_from[pid][k].numpy() for k in keys}
            updates.append(classifier_update(users[pid], start, keys))
        return weight_diversity(updates)


class GroupedAverage(AverageWithServer):
    """FedRGD, SSFL benchmark eq. 7: random groups, the server's model joins every group.

    The users that replied are shuffled (seeded per round) into S = algo.groups groups;
    w_avg,i = (w_s + sum_{k in G_i} w_k) / (|G_i| + 1) and w_avg = sum_i w_avg,i / S.
    Users of G_i start the next round from w_avg,i; a user not in the previous round
    starts from w_avg (ours: the paper has every user in every round).
    """

    def __init__(self, server: ServerSide, num_groups: int, server_weight: float = 1.0):
        super().__init__(server, server_weight)
        self.num_groups = num_groups
        self.group_models: dict[int, ArrayRecord] = {}

    def model_for(self, server_round: int, pid: int, arrays: ArrayRecord) -> ArrayRecord:
        return self.group_models.get(pid, arrays)

    def sum_request(self) -> SumRequest | None:
        """None: the groups are drawn from the replies, so every model comes back."""
        return None

    def state(self) -> dict[str, Any]:
        """Each user's group model w_avg,i, the start of its next round."""
        return {
            "group_models": {
                pid: record.to_torch_state_dict() for pid, record in self.group_models.items()
            }
        }

    def restore(self, state: dict[str, Any]) -> None:
        self.group_models = {pid: ArrayRecord(s) for pid, s in state["group_models"].items()}

    def combine(
        self, server_round: int, server: dict[str, np.ndarray], users: dict[int, dict]
    ) -> tuple[dict[str, np.ndarray], Metrics]:
        seed = derive_seed(self.server.settings.seed, "groups", server_round)
        groups = assign_groups(sorted(users), self.num_groups, np.random.default_rng(seed))
        metrics: Metrics = {"groups": groups}
        if self.robust.active():
            per_group, overall, robust = self.robust_groups(server, users, groups)
            metrics.update(robust)
        else:
            per_group, overall = group_average(
                server, users, groups, self.server_weight, self.device
            )
        self.group_models = {}
        for group, state in zip(groups, per_group):
            record = to_record(state)
            self.group_models.update({pid: record for pid in group})
        return overall, metrics

    def robust_groups(
        self, server: dict[str, np.ndarray], users: dict[int, dict], groups: list[list[int]]
    ) -> tuple[list[dict[str, np.ndarray]], dict[str, np.ndarray], Metrics]:
        """Eq. 7 with ``aggregate.rule`` in place of each group's users' mean; Krum's picks
        of every group together."""
        per_group, chosen = [], []
        for group in groups:
            own = {pid: users[pid] for pid in group}
            state, metrics = self.robust.with_server(server, own, self.server_weight)
            per_group.append(state)
            chosen += metrics.get("krum_selected", [])
        overall = weighted_average(per_group, [1.0] * len(per_group), self.device)
        return per_group, overall, ({"krum_selected": sorted(chosen)} if chosen else {})


# ----- Payload codecs ------------------------------------------------------------------
class Payload(Protocol):
    """An extra record sent to clients with the model (thresholds, centroids, a teacher)."""

    def update(self, server_round: int) -> Metrics:
        """Recompute from the server's model after its training (round 0: the bootstrap)."""

    def records(self, server_round: int, pid: int) -> dict[str, Any]:
        """The records for client ``pid``'s message."""

    def state(self) -> dict[str, Any]:
        """What it holds between rounds, for the run's checkpoint."""

    def restore(self, state: dict[str, Any]) -> None:
        """Take back what ``state`` gave."""


class DenseCodec:
    """Dense state dicts both ways, plus the method's extra payload records."""

    dense_model_bytes: int | None = None  # a sparse codec reports the dense cost it saves

    def __init__(self, payloads: Iterable[Payload] = ()):
        self.payloads = list(payloads)

    def update_payloads(self, server_round: int) -> Metrics:
        """Recompute every payload after the server's step (round 0: after the bootstrap);
        the metrics they give."""
        out: Metrics = {}
        for payload in self.payloads:
            out.update(payload.update(server_round))
        return out

    def saved_bytes(self, direction: str, sent: int, dense: int) -> Metrics:
        """For a codec that sends less than dense models (``dense_model_bytes`` set): the
        dense cost and the ratio. s2c: ``dense`` is the number of messages (each costs one
        dense model); c2s: the dense bytes the clients reported."""
        if self.dense_model_bytes is None:
            return {}
        if direction == "s2c":
            dense = self.dense_model_bytes * dense
            return {"bytes_s2c_dense": dense, "s2c_ratio": sent / max(dense, 1)}
        return {"c2s_ratio": sent / max(dense, 1)}

    def begin_round(self, server_round: int) -> Metrics:
        return {}

    def config(self, server_round: int, pid: int) -> dict[str, Any]:
        """Method entries of the client's round config."""
        return {}

    def encode(self, server_round: int, pid: int, start: ArrayRecord) -> dict[str, Any]:
        """Records of client ``pid``'s message: its start model and the payloads."""
        out: dict[str, Any] = {"arrays": start}
        for payload in self.payloads:
            out.update(payload.records(server_round, pid))
        return out

    def end_round(self, sent: set[int], replied: set[int]) -> None:
        """After aggregation: what to forget about clients that did not reply."""

    def state(self) -> dict[str, Any]:
        """The payloads' states, in order."""
        return {"payloads": [payload.state() for payload in self.payloads]}

    def restore(self, state: dict[str, Any]) -> None:
        for payload, kept in zip(self.payloads, state["payloads"], strict=True):
            payload.restore(kept)

    def dense_bytes(self, update: Update) -> int:
        """What the reply would cost as dense float32 tensors."""
        return dense_bytes(update.content)

    def load_local(self, model: nn.Module, update: Update) -> None:
        """Load the model client ``update.pid`` trained into ``model``."""
        model.load_state_dict({k: torch.from_numpy(v) for k, v in update.arrays.items()})

    def validate(self, update: Update, global_state: Mapping[str, torch.Tensor]) -> str | None:
        """Why the reply's model is unusable (None: usable): its ``arrays`` must hold exactly
        the global model's keys, shapes and dtypes, and only finite values."""
        if update.content.array_records.get("arrays") is None:
            return "no 'arrays' record"
        return array_problem(update.arrays, global_state)


# ----- A method's parts ------------------------------------------------------------------
@dataclass
class Parts:
    """What a method is made of: the parts above. ``aggregator`` None: no clients."""

    trainer: SupervisedTrainer | NoTrainer
    aggregator: Aggregator | None
    evaluator: Evaluator
    codec: DenseCodec

    @classmethod
    def standard(cls, server: ServerSide, payloads: Iterable[Payload] = ()) -> Parts:
        """FedAvg clients, the server trains their aggregate, test accuracy, dense models
        with the method's extra payload records."""
        return cls(
            SupervisedTrainer(server), FedAvg(server), TestAccuracy(server), DenseCodec(payloads)
        )

    def stateful(self) -> dict[str, Any]:
        """The parts that keep state across rounds (those with ``state``/``restore``), by
        role (a part in two roles once)."""
        out: dict[str, Any] = {}
        for role in ("trainer", "aggregator", "evaluator", "codec"):
            part = getattr(self, role)
            if hasattr(part, "state") and all(part is not kept for kept in out.values()):
                out[role] = part
        return out

    def state(self) -> dict[str, Any]:
        """Every stateful part's checkpoint (see ``stateful``)."""
        return {role: part.state() for role, part in self.stateful().items()}

    def restore(self, state: dict[str, Any]) -> None:
        """Give every stateful part back what ``state`` holds."""
        for role, part in self.stateful().items():
            part.restore(state[role])

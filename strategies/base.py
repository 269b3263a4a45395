"""The server half every method shares: round loop, sampling, FedAvg, server training.

A method subclasses :class:`SSFLStrategy` and overrides the hooks it needs:
``client_arrays`` (a per-client model), ``client_extras`` (more records per client
message), ``aggregate_arrays``, ``server_update`` (the supervised step on the labeled
set) and ``defaults``.
The round is: clients train from the current global model -> aggregate ->
server update -> test evaluation -> one results row.
"""

from __future__ import annotations

import copy
import json
import logging
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from torch import nn

from tasks.aggregate import weighted_average
from tasks.augment import WeakAugment
from tasks.data import Dataset
from tasks.models import model_for
from tasks.partition import Split
from tasks.train import (
    derive_seed,
    evaluate,
    make_sgd,
    scheduled_lr,
    seed_torch,
    steps_per_round,
    supervised_epochs,
    to_float,
)

log = logging.getLogger("flwr.ssfl")  # a child of Flower's logger: streamed with the run

# Keys of a client's MetricRecord that are bookkeeping, not metrics to average.
BOOKKEEPING = ("partition-id", "num-examples", "dense-bytes")


@dataclass
class ServerSide:
    """What the server holds: config, data on the device, and the global model."""

    cfg: dict[str, Any]
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
    def build(cls, cfg: dict[str, Any], dataset: Dataset, split: Split, device: torch.device):
        torch.manual_seed(derive_seed(cfg["seed"], "init"))
        model = model_for(cfg["model"], dataset).to(device)
        train_x, train_y = dataset.train_x, dataset.train_y
        return cls(
            cfg=cfg,
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


@dataclass
class RoundStats:
    """Communication and participation of one round."""

    bytes_s2c: int = 0
    bytes_c2s: int = 0
    bytes_c2s_dense: int = 0
    replies: int = 0
    failures: int = 0
    failed_partitions: list[int] = field(default_factory=list)


class SSFLStrategy(Strategy):
    """Base server half: FedAvg of client models plus an optional supervised server step."""

    uses_clients = True
    # Whether server training honours server.keep_momentum (checked by the config).
    keeps_momentum = True
    # Whether server_update trains the clients' aggregate (FedSEAL eq. 3-4); then each round
    # also records aggregate_accuracy, the test accuracy of that aggregate before the step.
    trains_after_aggregation = True

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Method-specific defaults merged over tasks.config.DEFAULTS (algo keys included)."""
        return {}

    @classmethod
    def check_config(cls, cfg: dict[str, Any]) -> None:
        """Raise ConfigError for method-specific values that make no sense."""

    def __init__(self, server: ServerSide, on_round: Callable[[dict[str, Any]], None]):
        self.server = server
        self.cfg = server.cfg
        self.on_round = on_round
        self.nodes: dict[int, int] = {}
        self.sampler = random.Random(derive_seed(self.cfg["seed"], "sampling"))
        self.stats = RoundStats()
        self.round_metrics: dict[str, float] = {}
        self.config_json = json.dumps(self.cfg, sort_keys=True)
        self.server_opt: torch.optim.Optimizer | None = None
        self.scratch: nn.Module | None = None  # a copy of the model for clients' models
        self.weak = WeakAugment(
            server.dataset.image_size, server.dataset.flip, self.cfg["augment"]["weak_shift"]
        ).to(server.device)

    # ----- Flower Strategy interface -------------------------------------------------
    def summary(self) -> None:
        log.info(
            "method %s, %d clients, %s rounds",
            self.cfg["method"],
            self.cfg["split"]["num_clients"],
            self.cfg["rounds"],
        )

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """One message per sampled client: the global model, the round config, method extras."""
        messages = []
        for pid in self.sample_partitions(server_round):
            content = RecordDict(
                {
                    "arrays": self.client_arrays(server_round, pid, arrays),
                    "config": self.client_config(server_round, pid),
                }
            )
            for key, record in self.client_extras(server_round, pid).items():
                content[key] = record
            self.stats.bytes_s2c += record_bytes(content)
            messages.append(
                Message(
                    content=content, message_type=MessageType.TRAIN, dst_node_id=self.nodes[pid]
                )
            )
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Sort good replies by partition, average their models and metrics; count failures."""
        good = []
        for reply in replies:
            if reply.has_error():
                pid = self.partition_of(reply.metadata.src_node_id)
                self.stats.failures += 1
                self.stats.failed_partitions.append(pid)
                log.warning("round %d: client %s failed: %s", server_round, pid, reply.error.reason)
                continue
            good.append(reply)
        good.sort(key=lambda m: int(m.content["metrics"]["partition-id"]))
        self.stats.replies = len(good)
        for reply in good:
            self.stats.bytes_c2s += record_bytes(reply.content)
            metrics = reply.content["metrics"]
            extra = metrics.get("dense-bytes")
            self.stats.bytes_c2s_dense += (
                int(extra) if extra is not None else dense_bytes(reply.content)
            )
        if not good:
            return None, None
        arrays = self.aggregate_arrays(server_round, good)
        if self.cfg["eval"]["local_models"]:
            self.round_metrics["local_accuracy"] = self.local_accuracy(good)
        metrics = self.aggregate_metrics(good)
        return arrays, metrics

    def configure_evaluate(self, server_round, arrays, config, grid) -> Iterable[Message]:
        """Evaluation is centralised on the server's test set: no client messages."""
        return []

    def aggregate_evaluate(self, server_round, replies) -> MetricRecord | None:
        return None

    # ----- Hooks for methods ---------------------------------------------------------
    def client_config(self, server_round: int, pid: int) -> ConfigRecord:
        """Round number, client learning rate (decayed per round) and the full config."""
        ccfg = self.cfg["client"]
        return ConfigRecord(
            {
                "round": server_round,
                "lr": ccfg["lr"] * ccfg["lr_decay"] ** (server_round - 1),
                "ssfl-config": self.config_json,
            }
        )

    def client_arrays(self, server_round: int, pid: int, arrays: ArrayRecord) -> ArrayRecord:
        """The model one client starts from: the global model unless a method sends its own."""
        return arrays

    def client_extras(self, server_round: int, pid: int) -> dict[str, Any]:
        """More records for one client's message (thresholds, helpers, ...)."""
        return {}

    def aggregate_arrays(self, server_round: int, replies: list[Message]) -> ArrayRecord:
        """FedAvg weighted by the clients' example counts (replies sorted by partition)."""
        states = [r.content["arrays"].to_numpy_ndarrays() for r in replies]
        keys = list(replies[0].content["arrays"].keys())
        weights = [float(r.content["metrics"]["num-examples"]) for r in replies]
        avg = weighted_average([dict(zip(keys, s)) for s in states], weights)
        return ArrayRecord({k: torch.from_numpy(v) for k, v in avg.items()})

    def aggregate_metrics(self, replies: list[Message]) -> MetricRecord:
        """Example-weighted mean of every client metric."""
        weights = np.array([float(r.content["metrics"]["num-examples"]) for r in replies])
        names = sorted({k for r in replies for k in r.content["metrics"]} - set(BOOKKEEPING))
        out = {}
        for name in names:
            vals = [
                (w, float(r.content["metrics"][name]))
                for w, r in zip(weights, replies)
                if name in r.content["metrics"]
            ]
            total = sum(w for w, _ in vals)
            out[name] = sum(w * v for w, v in vals) / total if total else 0.0
        return MetricRecord(out)

    def server_lr(self, server_round: int, step: int = 0, round_steps: int = 0) -> float:
        """The server's rate at ``step`` of a round (cfg ``lr_schedule``; eq. 9 when cosine)."""
        return scheduled_lr(
            self.cfg["server"],
            self.cfg["lr_schedule"],
            self.cfg["rounds"],
            server_round,
            step,
            round_steps,
        )

    def server_update(self, server_round: int) -> dict[str, float]:
        """E_s epochs of SGD on the labeled set with weak augmentation (FedSEAL eq. 3-4)."""
        return self.server_train(server_round, self.cfg["server"]["epochs"])

    def server_optimizer(self, server_round: int) -> torch.optim.Optimizer:
        """The SGD optimizer of a round of server training: a fresh one, or with
        server.keep_momentum one for the whole run (its rate is set at every step)."""
        if self.server_opt is not None:
            return self.server_opt
        scfg = self.cfg["server"]
        opt = make_sgd(
            self.server.model,
            self.server_lr(server_round),
            scfg["momentum"],
            scfg["weight_decay"],
            scfg["nesterov"],
        )
        if scfg["keep_momentum"]:
            self.server_opt = opt
        return opt

    def server_train(self, server_round: int, epochs: int, loss_fn=None) -> dict[str, float]:
        """``epochs`` epochs on the labeled set, or T = server.local_steps steps when > 0.

        Round 0 (the bootstrap) always counts epochs.
        """
        scfg = self.cfg["server"]
        n = len(self.server.labeled_x)
        steps = scfg["local_steps"] if server_round > 0 else 0
        round_steps = steps_per_round(n, scfg["batch_size"], epochs, steps)
        if n == 0 or round_steps == 0:
            return {}
        gen = seed_torch(derive_seed(self.cfg["seed"], "server", server_round))
        opt = self.server_optimizer(server_round)
        kwargs = {"loss_fn": loss_fn} if loss_fn is not None else {}
        out = supervised_epochs(
            self.server.model,
            self.server.labeled_x,
            self.server.labeled_y,
            epochs=epochs,
            optimizer=opt,
            batch_size=scfg["batch_size"],
            generator=gen,
            augment=self.weak,
            local_steps=steps,
            lr_at=lambda step: self.server_lr(server_round, step, round_steps),
            **kwargs,
        )
        return {"server_loss": out["loss"], "server_steps": out["steps"]}

    def bootstrap(self) -> None:
        """Initial model: server.bootstrap_epochs epochs on the labeled data (FedSEAL 4.1.3).

        Counted in epochs even when rounds count T steps (server.local_steps).
        """
        epochs = self.cfg["server"]["bootstrap_epochs"]
        if epochs:
            self.server_train(0, epochs)

    # ----- Sampling and node discovery -----------------------------------------------
    def sample_partitions(self, server_round: int) -> list[int]:
        """Deterministic sample of clients_per_round partitions (0 = all)."""
        available = sorted(self.nodes)
        k = self.cfg["federation"]["clients_per_round"] or len(available)
        if k >= len(available):
            return available
        return sorted(self.sampler.sample(available, k))

    def partition_of(self, node_id: int) -> int:
        return next((p for p, n in self.nodes.items() if n == node_id), -1)

    def discover(self, grid: Grid, timeout: float) -> dict[int, int]:
        """Ask every node for its partition id (a QUERY round); wait for enough nodes."""
        fed = self.cfg["federation"]
        wanted = fed["min_clients"] or self.cfg["split"]["num_clients"]
        deadline = time.monotonic() + timeout
        while len(list(grid.get_node_ids())) < wanted:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"only {len(list(grid.get_node_ids()))} nodes connected, "
                    f"{wanted} needed (federation.min_clients, 0 = split.num_clients)"
                )
            time.sleep(0.5)
        messages = [
            Message(
                content=RecordDict({"config": ConfigRecord({"ssfl-config": self.config_json})}),
                message_type=MessageType.QUERY,
                dst_node_id=nid,
            )
            for nid in sorted(grid.get_node_ids())
        ]
        nodes: dict[int, int] = {}
        for reply in grid.send_and_receive(messages, timeout=timeout):
            if reply.has_error():
                log.warning(
                    "node %s did not answer the discovery query: %s",
                    reply.metadata.src_node_id,
                    reply.error.reason,
                )
                continue
            pid = int(reply.content["metrics"]["partition-id"])
            if pid in nodes:
                raise RuntimeError(f"two nodes report partition-id {pid}")
            nodes[pid] = reply.metadata.src_node_id
        if not nodes:
            raise RuntimeError("no node answered the discovery query")
        return nodes

    # ----- The round loop ------------------------------------------------------------
    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord | None = None,
        num_rounds: int = 1,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
    ) -> Result:
        """Bootstrap, then per round: clients -> aggregate -> server update -> evaluate."""
        self.summary()
        if initial_arrays is not None:
            self.server.load(initial_arrays)
        if self.uses_clients:
            self.nodes = self.discover(grid, timeout)
            log.info("clients: partitions %s", sorted(self.nodes))
        self.bootstrap()
        result = Result()
        for rnd in range(1, num_rounds + 1):
            started = time.perf_counter()
            self.stats, self.round_metrics = RoundStats(), {}
            metrics = self.client_round(rnd, grid, timeout)
            server_metrics = self.server_update(rnd)
            acc, loss = self.evaluate_test()
            row = {
                "round": rnd,
                "test_accuracy": acc,
                "test_loss": loss,
                "seconds": time.perf_counter() - started,
                "bytes_s2c": self.stats.bytes_s2c,
                "bytes_c2s": self.stats.bytes_c2s,
                "bytes_c2s_dense": self.stats.bytes_c2s_dense,
                "clients": self.stats.replies,
                "failures": self.stats.failures,
                **(
                    {"failed_partitions": self.stats.failed_partitions}
                    if self.stats.failures
                    else {}
                ),
                **metrics,
                **server_metrics,
                **self.round_metrics,
            }
            result.evaluate_metrics_serverapp[rnd] = MetricRecord({"accuracy": acc, "loss": loss})
            self.on_round(row)
        result.arrays = self.server.arrays()
        return result

    def client_round(self, rnd: int, grid: Grid, timeout: float) -> dict[str, float]:
        """Send the round's messages, aggregate the replies into the global model."""
        if not self.uses_clients:
            return {}
        messages = list(self.configure_train(rnd, self.server.arrays(), ConfigRecord(), grid))
        replies = list(grid.send_and_receive(messages, timeout=timeout)) if messages else []
        arrays, metrics = self.aggregate_train(rnd, replies)
        if arrays is None:
            log.warning("round %d: no client update arrived; the global model is unchanged", rnd)
            return {}
        self.server.load(arrays)
        if self.server_trains():
            self.round_metrics["aggregate_accuracy"] = self.evaluate_test()[0]
        return dict(metrics.items()) if metrics is not None else {}

    def server_trains(self) -> bool:
        """Whether server_update changes the aggregated model (labeled data and E_s or T > 0)."""
        scfg = self.cfg["server"]
        return (
            self.trains_after_aggregation
            and len(self.server.labeled_x) > 0
            and (scfg["epochs"] > 0 or scfg["local_steps"] > 0)
        )

    def evaluate_test(self, model: nn.Module | None = None) -> tuple[float, float]:
        """Accuracy and loss of the global model (or ``model``) on the server's test set."""
        srv = self.server
        model = srv.model if model is None else model
        return evaluate(model, srv.test_x, srv.test_y, self.cfg["eval"]["batch_size"])

    def local_accuracy(self, replies: list[Message]) -> float:
        """Mean test accuracy of the clients' trained local models (eval.local_models).

        FedMatch Table 2's "averaged local model accuracy": in the official code every
        client evaluates its model on the shared test set right after local training.
        """
        if self.scratch is None:
            self.scratch = copy.deepcopy(self.server.model)
        accuracies = []
        for reply in replies:
            self.load_local(self.scratch, reply)
            accuracies.append(self.evaluate_test(self.scratch)[0])
        return float(np.mean(accuracies))

    def load_local(self, model: nn.Module, reply: Message) -> None:
        """Load the model one client trained (its reply) into ``model``."""
        model.load_state_dict(reply.content["arrays"].to_torch_state_dict())

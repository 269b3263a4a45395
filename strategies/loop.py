"""The one round loop every method runs, driving the parts the method picks; it knows no
method.

Per round, through Flower's Strategy interface: ``configure_train`` samples clients and
the codec encodes each one's message (its start model from the aggregator, the payloads)
-> clients train -> ``aggregate_train`` counts failed replies, rejects malformed ones and
has the aggregator build the next global model from the rest -> the trainer's step
before and after aggregation -> payloads are recomputed -> the evaluator -> one results
row -> the round's checkpoint (``checkpoint_path``). federation.max_failed_rounds rounds
in a row without an accepted update stop the run (:class:`RunStalled`). A run resumed
from a checkpoint (:meth:`RoundLoop.resume_from`) goes on from the round after it with
every piece of state the uninterrupted run would hold.
"""

from __future__ import annotations

import json
import logging
import random
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from ssfl import cohort
from ssfl.gpu import cohort_workers, gpu_count
from strategies.messaging import ClientReply, ask_each, exchange, failure_cause, one_line
from strategies.parts import (
    FedAvg,
    Metrics,
    Parts,
    ServerSide,
    Update,
    mean_metrics,
    record_bytes,
)
from strategies.privacy import PrivateAggregator
from tasks.attack import attackers
from tasks.checkpoint import (
    append_rows,
    checkpoint_rows,
    kept_checkpoint,
    save_checkpoint,
    write_rows,
)
from tasks.settings import Settings, mapping
from tasks.train import DEVICE_RECORD, derive_seed, device_name, steps_per_round, torch_threads

log = logging.getLogger("flwr.ssfl")  # a child of Flower's logger: streamed with the run

# A node with its own image folder (node-config data-path) holds images the server never
# sees: its num-examples is bounded by this constant instead of a partition's size.
OWN_DATA_MAX_EXAMPLES = 10_000_000


class RunStalled(RuntimeError):
    """federation.max_failed_rounds rounds in a row accepted no client update; the message
    is one line naming the last round's failure reasons."""


@dataclass
class RoundStats:
    """Communication and participation of one round."""

    bytes_s2c: int = 0
    bytes_c2s: int = 0
    bytes_c2s_dense: int = 0
    replies: int = 0
    failures: int = 0
    failed_partitions: list[int] = field(default_factory=list)
    rejections: list[tuple[int, str]] = field(default_factory=list)  # (partition, reason)
    problems: list[tuple[int, str]] = field(default_factory=list)  # failed or rejected, why
    attackers: list[int] = field(default_factory=list)  # told to attack (federation.attack)

    def fail(self, pid: int, reason: str) -> None:
        self.failures += 1
        self.failed_partitions.append(pid)
        self.problems.append((pid, failure_cause(reason)))

    def reject(self, pid: int, reason: str) -> None:
        self.rejections.append((pid, reason))
        self.problems.append((pid, f"rejected, {reason}"))

    def row(self) -> Metrics:
        """The counters of the results row; the partition lists only when non-empty."""
        out: Metrics = {
            "bytes_s2c": self.bytes_s2c,
            "bytes_c2s": self.bytes_c2s,
            "bytes_c2s_dense": self.bytes_c2s_dense,
            "clients": self.replies,
            "failures": self.failures,
            "rejected": len(self.rejections),
        }
        if self.failures:
            out["failed_partitions"] = sorted(self.failed_partitions)
        if self.rejections:
            ordered = sorted(self.rejections)
            out["rejected_partitions"] = [pid for pid, _ in ordered]
            out["rejected_reasons"] = [reason for _, reason in ordered]
        if self.attackers:
            out["attackers"] = list(self.attackers)
        return out


class RoundLoop(Strategy):
    """A method's server half: the round loop over its parts."""

    def __init__(
        self, server: ServerSide, parts: Parts, on_round: Callable[[dict[str, Any]], None]
    ):
        self.server = server
        self.settings = server.settings
        self.privacy: PrivateAggregator | None = None  # privacy.mode: the DP aggregator
        if self.settings.privacy.mode != "none" and parts.aggregator is not None:
            self.privacy = parts.aggregator = PrivateAggregator(server, parts.aggregator)
        self.parts = parts
        self.on_round = on_round
        self.nodes: dict[int, int] = {}
        self.node_partitions: dict[int, int] = {}
        self.own_data: set[int] = set()  # partitions whose node trains on its own folder
        self.state_in_memory: set[int] = set()  # partitions whose node keeps states in memory
        self.sampler = random.Random(derive_seed(self.settings.seed, "sampling"))
        self.config_json = json.dumps(mapping(self.settings), sort_keys=True)  # clients get it
        self.train_config = ConfigRecord()  # start's train_config: every client gets it
        self.evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None
        self.stats = RoundStats()  # the current round's counts
        self.sent_ids: dict[str, list[int]] = {}  # the round's messages' partitions by id
        self.message_pids: dict[int, list[int]] = {}  # the same, by message object
        self.node_pids: dict[int, list[int]] = {}  # and by the node they went to
        # simulation.execution: cohort: the worker SuperNodes, in worker order.
        self.cohort = self.settings.simulation.execution == "cohort"
        self.workers: list[int] = []
        self.updates: list[Update] = []  # the current round's accepted updates
        self.sums: list[cohort.ReturnedSum] = []  # and its workers' partial sums (cohort)
        self.aggregation_metrics: Metrics = {}  # what the current round's aggregation measured
        self.rows: list[dict[str, Any]] = []  # every round's results row, as on_round got it
        self.rows_written = 0  # rows in the checkpoint's rows file from this process (0: none)
        self.failed_in_a_row = 0  # rounds in a row without an accepted client update
        self.first_round = 1  # the round after the checkpoint a resumed run starts from
        self.checkpoint_path: Path | None = None  # where each round's checkpoint goes
        # Wall-clock time (time.time()) at which each start-up stage ended.
        self.timeline: dict[str, float] = {}
        # The server's device and the one each client last reported training on.
        self.devices: dict[str, Any] = {"server": device_name(server.device), "clients": {}}

    # ----- Flower Strategy interface -------------------------------------------------
    def summary(self) -> None:
        log.info(
            "method %s, %d clients, %s rounds",
            self.settings.method,
            self.settings.split.num_clients,
            self.settings.rounds,
        )

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """One message per sampled client: its start model, the round config with
        ``config``'s entries, the payloads (bytes counted in the round's stats)."""
        return self.messages(server_round, arrays, config, self.stats)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The next global model from the accepted replies (None when none was) and the
        clients' metrics, example-weighted. What the aggregation itself measures (the
        aggregator's metrics, which may be lists, the local models' accuracy with
        eval.local_models, the codec's byte ratio) goes to ``aggregation_metrics``."""
        assert self.parts.aggregator is not None
        stats = self.stats
        self.updates = self.accept(server_round, replies, stats, self.sent_ids)
        if not self.updates and self.sampled_none():
            assert self.privacy is not None
            arrays, metrics = self.privacy.aggregate_none(server_round, self.server.arrays())
            self.aggregation_metrics = metrics
            return arrays, MetricRecord({})
        if not self.updates:
            return None, None
        aggregator = self.parts.aggregator
        if self.sums and isinstance(aggregator, FedAvg):
            sums = [returned.part for returned in self.sums]
            arrays, metrics = aggregator.aggregate_sums(server_round, self.updates, sums)
        else:
            arrays, metrics = aggregator.aggregate(server_round, self.updates)
        if self.settings.eval.local_models and self.tested(server_round):
            evaluator = self.parts.evaluator
            metrics["local_accuracy"] = evaluator.local_accuracy(self.updates, self.parts.codec)
        metrics.update(self.parts.codec.saved_bytes("c2s", stats.bytes_c2s, stats.bytes_c2s_dense))
        self.aggregation_metrics = metrics
        return arrays, MetricRecord(mean_metrics(self.updates))

    def sampled_none(self) -> bool:
        """A round of privacy.sampling poisson that sampled no client (not a failed one)."""
        return self.privacy is not None and self.privacy.poisson and not self.sent_ids

    def configure_evaluate(self, server_round, arrays, config, grid) -> Iterable[Message]:
        """Evaluation is centralised on the server's test set: no client messages."""
        return []

    def aggregate_evaluate(self, server_round, replies) -> MetricRecord | None:
        """No client evaluates (see ``configure_evaluate``)."""
        return None

    # ----- Messages ------------------------------------------------------------------
    def client_config(
        self, server_round: int, pid: int, config: ConfigRecord, attacker: bool = False
    ) -> ConfigRecord:
        """``config``'s entries, then the round number, client learning rate (decayed per
        round), the full config, the codec's entries and, for a client told to attack
        (federation.attack), ``attack``; privacy.mode ``client_*``: the clipping norm."""
        half = self.settings.client
        return ConfigRecord(
            {
                **config,
                "round": server_round,
                "lr": half.lr * half.lr_decay ** (server_round - 1),
                "ssfl-config": self.config_json,
                **self.parts.codec.config(server_round, pid),
                **(self.privacy.client_config() if self.privacy else {}),
                **({"attack": True} if attacker else {}),
            }
        )

    def attackers_of(self, server_round: int, sampled: list[int]) -> list[int]:
        """The round's attackers among the ``sampled`` partitions (federation.attack: its
        partitions, and its fraction drawn from the seed and the round)."""
        attack = self.settings.federation.attack
        if attack.kind == "none":
            return []
        rng = np.random.default_rng(derive_seed(self.settings.seed, "attack", server_round))
        return attackers(sampled, attack.partitions, attack.fraction, rng)

    def messages(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, stats: RoundStats
    ) -> list[Message]:
        """One message per sampled client: its start model, the round config, payloads."""
        aggregator, codec = self.parts.aggregator, self.parts.codec
        assert aggregator is not None
        sampled = self.sample_partitions(server_round)
        stats.attackers = self.attackers_of(server_round, sampled)
        contents: dict[int, RecordDict] = {}
        for pid in sampled:
            start = aggregator.start_model(server_round, pid, arrays)
            attacker = pid in stats.attackers
            contents[pid] = RecordDict(
                {
                    **codec.encode(server_round, pid, start),
                    "config": self.client_config(server_round, pid, config, attacker),
                }
            )
            stats.bytes_s2c += record_bytes(contents[pid])
        if not self.cohort:
            return [self.train_message(c, self.nodes[p], [p]) for p, c in contents.items()]
        request = self.sum_request(server_round)
        out = []
        shares = cohort.assign(sampled, len(self.workers), self.client_costs(sampled))
        for node, pids in zip(self.workers, shares):
            if pids:
                content = cohort.pack({p: contents[p] for p in pids})
                if request is not None:
                    cohort.ask_for_sums(content, request)
                out.append(self.train_message(content, node, pids))
        return out

    def client_costs(self, sampled: list[int]) -> dict[int, float] | None:
        """Each sampled client's expected work, its SGD steps this round (``client.local_steps``,
        else its epochs over its images), for balancing a round over the cohort workers; None
        (each client keeps worker p mod W) while any worker keeps its clients' states in its
        context.state, which only that worker holds."""
        if self.state_in_memory:
            return None
        half, split = self.settings.client, self.server.split
        return {
            pid: float(
                steps_per_round(
                    len(split.clients[pid]),
                    half.batch_size,
                    half.epochs,
                    half.local_steps,
                )
            )
            for pid in sampled
        }

    def sum_request(self, server_round: int) -> cohort.SumRequest | None:
        """The partial sum the round's cohorts return (simulation.partial_sums): where the
        aggregator is a plain mean (FedAvg, SSFL eq. 4-5), without privacy, in a round that
        does not evaluate the clients' own models (eval.local_models)."""
        aggregator = self.parts.aggregator
        if not (self.cohort and self.settings.simulation.partial_sums):
            return None
        if self.settings.eval.local_models and self.tested(server_round):
            return None
        return aggregator.sum_request() if isinstance(aggregator, FedAvg) else None

    def train_message(self, content: RecordDict, node: int, pids: list[int]) -> Message:
        """A TRAIN message to ``node`` for the partitions ``pids`` (one, or a cohort)."""
        message = Message(content=content, message_type=MessageType.TRAIN, dst_node_id=node)
        self.message_pids[id(message)] = self.node_pids[node] = pids
        return message

    def client_replies(
        self, replies: Iterable[Message], sent: Mapping[str, list[int]] | None = None
    ) -> tuple[list[ClientReply], list[cohort.ReturnedSum]]:
        """Each client's reply, decoded once: a node's own, or each of a cohort's; an error
        reply is one failure per partition its message carried (``sent``: the partitions of
        each sent message by id, for error replies the SuperLink makes in a node's place).
        Also the cohorts' partial sums (simulation.partial_sums)."""
        out: list[ClientReply] = []
        sums: list[cohort.ReturnedSum] = []
        for reply in replies:
            node = reply.metadata.src_node_id
            if reply.has_error():
                pids = self.node_pids.get(node) if self.cohort else [self.partition_of(node)]
                if not pids or pids == [-1]:
                    pids = (sent or {}).get(reply.metadata.reply_to_message_id)
                for pid in pids or [-1]:
                    out.append(ClientReply(pid, node, error=reply.error.reason))
            elif self.cohort and cohort.is_cohort(reply.content):
                contents, errors = cohort.unpack(reply.content)
                returned = cohort.returned_sum(reply.content)
                sizes = returned.sizes if returned else {}
                out += [
                    ClientReply(pid, node, content=c, summed=sizes.get(pid))
                    for pid, c in contents.items()
                ]
                out += [ClientReply(pid, node, error=e) for pid, e in errors.items()]
                sums += [returned] if returned else []
            else:
                out.append(ClientReply(self.partition_of(node), node, content=reply.content))
        return out, sums

    def accept(
        self,
        server_round: int,
        replies: Iterable[Message],
        stats: RoundStats,
        sent: Mapping[str, list[int]] | None = None,
    ) -> list[Update]:
        """Count failed replies and reject malformed ones; the rest as updates sorted by
        partition, their bytes counted (a rejected reply's are not). ``sent``: the partition
        of each sent message by id, for error replies the SuperLink makes in a node's place
        (a node that stopped answering: Flower's NODE_UNAVAILABLE). The cohorts' partial
        sums go to ``self.sums``; a partial sum one of whose clients is rejected goes with
        all of them."""
        updates: list[Update] = []
        global_state = self.server.model.state_dict()
        decoded, self.sums = self.client_replies(replies, sent)
        sizes: dict[int, tuple[int, int]] = {}
        for reply in decoded:
            pid = reply.pid
            if reply.error is not None:
                stats.fail(pid, reply.error)
                reason = failure_cause(reply.error)
                log.warning("round %d: client %s failed: %s", server_round, pid, reason)
                continue
            problem = self.problem(reply, {u.pid for u in updates}, global_state)
            if problem is not None:
                stats.reject(pid, problem)
                log.warning("round %d: reply of client %s rejected: %s", server_round, pid, problem)
                continue
            updates.append(Update.of_content(reply.content))
            if reply.summed is not None:
                sizes[pid] = reply.summed
        updates = self.drop_spoilt_sums(updates, stats)
        updates.sort(key=lambda u: u.pid)
        stats.replies = len(updates)
        self.note_devices(updates)
        for update in updates:
            serialised, dense = sizes.get(update.pid, (0, 0))
            stats.bytes_c2s += record_bytes(update.content) + serialised
            stats.bytes_c2s_dense += self.parts.codec.dense_bytes(update) + dense
        return updates

    def drop_spoilt_sums(self, updates: list[Update], stats: RoundStats) -> list[Update]:
        """Keep the partial sums all of whose clients were accepted; reject the accepted
        clients of the others (their models cannot be taken out of the sum)."""
        accepted = {u.pid for u in updates}
        kept, spoilt = [], set()
        for returned in self.sums:
            left_out = [pid for pid in returned.part.pids if pid not in accepted]
            if not left_out:
                kept.append(returned)
                continue
            for pid in returned.part.pids:
                if pid in accepted:
                    spoilt.add(pid)
                    stats.reject(pid, f"summed in its worker with client {left_out[0]}'s reply")
        self.sums = kept
        return [u for u in updates if u.pid not in spoilt]

    def note_devices(self, updates: list[Update]) -> None:
        """Keep the device each client reports in its reply's ``device`` record."""
        for update in updates:
            record = update.content.config_records.get(DEVICE_RECORD)
            if record is not None:
                self.devices["clients"][str(update.pid)] = str(record.get("device", "unknown"))

    # ----- Update validation (the reliability issue's rule 2) ---------------------------
    def problem(
        self, reply: ClientReply, accepted: set[int], global_state: dict[str, torch.Tensor]
    ) -> str | None:
        """Why a reply must not reach the aggregate (None: it may): its bookkeeping, then
        its payload as the method's codec reads it (a summed model: its worker checked it
        by the same rule, tasks.aggregate.array_problem)."""
        try:
            bookkeeping = self.bookkeeping_problem(reply, accepted)
            if bookkeeping or reply.summed is not None:  # a summed model: checked by its worker
                return bookkeeping
            return self.parts.codec.validate(Update.of_content(reply.content), global_state)
        except Exception as err:  # whatever a malformed reply breaks, it is rejected
            return one_line(f"unreadable ({type(err).__name__}: {err})")

    def bookkeeping_problem(self, reply: ClientReply, accepted: set[int]) -> str | None:
        """The partition id the server mapped to the node (or its place in a cohort), one
        reply per client, num-examples an integer in [1, the partition's size]."""
        pid = reply.pid
        metrics = reply.content.metric_records.get("metrics")
        if metrics is None:
            return "no 'metrics' record"
        if pid < 0:
            return f"node {reply.node} is not one of the run's nodes"
        if pid in accepted:
            return "a second reply from its node"
        reported = metrics.get("partition-id")
        if reported != pid:
            return f"partition-id {reported!r}, but its node holds partition {pid}"
        n, bound = metrics.get("num-examples"), self.max_examples(pid)
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= bound:
            return f"num-examples {n!r} outside [1, {bound}]"
        return None

    def max_examples(self, pid: int) -> int:
        """The most examples partition ``pid`` may report: its size in the split (what every
        client half counts: unlabeled plus labeled samples; a streamed chunk counts fewer),
        or OWN_DATA_MAX_EXAMPLES for a node with its own folder (a size the server cannot
        know). 0 for a partition the split does not have."""
        if pid in self.own_data:
            return OWN_DATA_MAX_EXAMPLES
        clients = self.server.split.clients
        return len(clients[pid]) if 0 <= pid < len(clients) else 0

    # ----- Sampling and node discovery -----------------------------------------------
    def sample_partitions(self, server_round: int) -> list[int]:
        """Deterministic sample of clients_per_round partitions (0 = all); with
        privacy.sampling poisson each partition independently with probability
        clients_per_round / split.num_clients."""
        available = sorted(self.nodes)
        k = self.settings.federation.clients_per_round or len(available)
        if self.privacy is not None and self.privacy.poisson:
            rate = k / self.settings.split.num_clients
            return [pid for pid in available if self.sampler.random() < rate]
        if k >= len(available):
            return available
        return sorted(self.sampler.sample(available, k))

    def partition_of(self, node_id: int) -> int:
        """The partition a node holds (-1: not one the discovery found), in O(1) per reply."""
        return self.node_partitions.get(node_id, -1)

    def discover(self, grid: Grid, timeout: float) -> dict[int, int]:
        """Ask every node for its partition id (a QUERY round; a node that does not answer
        is asked again, see ``ask_each``); wait for enough nodes. Nodes
        that report training on their own folder go to ``own_data``."""
        wanted = self.settings.federation.min_clients or self.settings.split.num_clients
        if self.cohort:
            wanted = cohort_workers(self.settings, gpu_count())
        deadline = time.monotonic() + timeout
        while len(list(grid.get_node_ids())) < wanted:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"only {len(list(grid.get_node_ids()))} nodes connected, "
                    f"{wanted} needed (federation.min_clients, 0 = split.num_clients)"
                )
            time.sleep(0.1)

        # The query carries nothing: a node answers from its own node config, so the
        # discovery of N nodes costs N empty messages, not N copies of the config.
        def query(nid: int) -> Message:
            return Message(content=RecordDict(), message_type=MessageType.QUERY, dst_node_id=nid)

        queried = sorted(grid.get_node_ids())
        replies = ask_each(grid, queried, query, timeout)
        silent = sorted(set(queried) - set(replies))
        if silent:
            log.warning("nodes %s did not answer the discovery query in %g s", silent, timeout)
        nodes: dict[int, int] = {}
        for node, reply in sorted(replies.items()):
            if reply.has_error():
                log.warning(
                    "node %s did not answer the discovery query: %s", node, reply.error.reason
                )
                continue
            metrics = reply.content["metrics"]
            pid = int(metrics["partition-id"])
            if pid in nodes:
                raise RuntimeError(f"two nodes report partition-id {pid}")
            nodes[pid] = node
            if metrics.get("own-data"):
                self.own_data.add(pid)
            if not metrics.get("state-on-disk"):
                self.state_in_memory.add(pid)
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
        """Bootstrap, then per round: clients -> aggregate -> server step -> evaluate.

        ``train_config``'s entries reach every client's round config; ``evaluate_fn``, when
        given, is called after each round with the global model and its metrics join the
        round's row. Evaluation is centralised, so there is no client to take an
        ``evaluate_config``: a non-empty one is refused. Raises RunStalled after
        federation.max_failed_rounds rounds in a row without an accepted client update
        (their rows recorded)."""
        if evaluate_config:
            raise ValueError(
                "evaluate_config: evaluation runs on the server's test set, no client gets it"
            )
        self.train_config = train_config if train_config is not None else ConfigRecord()
        self.evaluate_fn = evaluate_fn
        self.summary()
        if initial_arrays is not None:
            self.server.load(initial_arrays)
        if self.parts.aggregator is not None:
            self.nodes = self.discover(grid, timeout)
            self.node_partitions = {node: pid for pid, node in self.nodes.items()}
            if self.cohort:
                self.workers = [self.nodes[i] for i in sorted(self.nodes)]
                clients = range(self.settings.split.num_clients)
                self.nodes = {pid: self.workers[pid % len(self.workers)] for pid in clients}
                self.node_partitions = {}
                log.info("clients: partitions on %d cohort workers", len(self.workers))
            log.info("clients: partitions %s", sorted(self.nodes))
        self.timeline["nodes_found"] = time.time()
        if self.first_round == 1:
            self.parts.trainer.bootstrap()
            self.parts.codec.update_payloads(0)
        self.timeline["first_round"] = time.time()
        result = Result()
        limit = self.settings.federation.max_failed_rounds
        for rnd in range(self.first_round, num_rounds + 1):
            started = time.perf_counter()
            stats = RoundStats()
            row = self.run_round(rnd, grid, timeout, stats)
            row["seconds"] = time.perf_counter() - started
            row.update(self.parts.evaluator.after_round(self.server.model, rnd, num_rounds))
            if self.evaluate_fn is not None:
                row.update(self.evaluate_fn(rnd, self.server.arrays()) or {})
            if "test_accuracy" in row:
                result.evaluate_metrics_serverapp[rnd] = MetricRecord(
                    {"accuracy": row["test_accuracy"], "loss": row["test_loss"]}
                )
            self.rows.append(row)
            self.on_round(row)
            progressed = stats.replies > 0 or self.parts.aggregator is None or self.sampled_none()
            self.failed_in_a_row = 0 if progressed else self.failed_in_a_row + 1
            self.save_checkpoint(rnd)
            self.timeline["rounds_ended"] = time.time()  # steady rounds: after the first's end
            if rnd == self.first_round:
                self.timeline["first_round_ended"] = self.timeline["rounds_ended"]
            if self.failed_in_a_row >= limit:
                raise RunStalled(stalled_message(rnd, limit, stats))
        result.arrays = self.server.arrays()
        return result

    # ----- Checkpoint and resume (the reliability issue's rule 1) ------------------------
    def state(self, rnd: int) -> dict[str, Any]:
        """What a resumed run needs after round ``rnd``: the global model, the sampler's RNG
        state, the failure count, how many rows of the rows file it covers (tasks.checkpoint
        ROWS_FILE), the devices the clients trained on so far and every part's state. The
        node map is not kept: a resumed run discovers its nodes again."""
        return {
            "round": rnd,
            "config": self.config_json,
            "rows": len(self.rows),
            "client_devices": json.dumps(self.devices["clients"]),
            "failed_in_a_row": self.failed_in_a_row,
            "sampler": self.sampler.getstate(),
            "model": self.server.model.state_dict(),
            "parts": self.parts.state(),
        }

    def save_checkpoint(self, rnd: int) -> None:
        """Write the round's checkpoint atomically (when ``checkpoint_path`` is set), and a
        kept copy of every federation.checkpoint_every-th round's; log its write time (the
        overhead docs/reliability.md measures). The rows file gets the rows not yet in it; a
        process's first write replaces it (a resumed run's rows after the checkpoint's go)."""
        if self.checkpoint_path is None:
            return
        started = time.perf_counter()
        folder = self.checkpoint_path.parent
        if self.rows_written:
            append_rows(folder, self.rows[self.rows_written :])
        else:
            write_rows(folder, self.rows)
        self.rows_written = len(self.rows)
        state = self.state(rnd)
        save_checkpoint(state, self.checkpoint_path)
        every = self.settings.federation.checkpoint_every
        if every and rnd % every == 0:
            save_checkpoint(state, kept_checkpoint(self.checkpoint_path, rnd))
        log.info("round %d: checkpoint written in %.3fs", rnd, time.perf_counter() - started)

    def resume_from(self, state: dict[str, Any]) -> int:
        """Take the state of the checkpoint at ``checkpoint_path`` (see ``state``); the run
        goes on from the round after its round, without the bootstrap. Returns its round."""
        self.server.model.load_state_dict(state["model"])
        self.parts.restore(state["parts"])
        self.sampler.setstate(state["sampler"])
        self.failed_in_a_row = int(state["failed_in_a_row"])
        self.rows = checkpoint_rows(self.checkpoint_path, state)
        self.devices["clients"] = json.loads(state.get("client_devices", "{}"))
        self.first_round = int(state["round"]) + 1
        return int(state["round"])

    def run_round(self, rnd: int, grid: Grid, timeout: float, stats: RoundStats) -> dict[str, Any]:
        """One round, counted in ``stats``; returns its results row (without the wall time)."""
        trainer, aggregator, codec = self.parts.trainer, self.parts.aggregator, self.parts.codec
        self.stats, self.sent_ids, self.updates, self.aggregation_metrics = stats, {}, [], {}
        self.sums = []
        self.message_pids, self.node_pids = {}, {}
        client_metrics: Metrics = {}
        round_metrics: Metrics = {}
        messages: list[Message] = []
        if aggregator is not None:
            round_metrics.update(codec.begin_round(rnd))
            messages = list(
                self.configure_train(rnd, self.server.arrays(), self.train_config, grid)
            )
            round_metrics.update(codec.saved_bytes("s2c", stats.bytes_s2c, len(messages)))
            # The server's step beside the clients (SSFL eq. 4-5) runs while they train,
            # on the CPU threads they leave free.
            threads = threads_beside_clients(
                grid, len(messages), self.settings.simulation.num_cpus, self.server.device
            )

            def beside() -> Metrics:
                with torch_threads(threads):
                    return trainer.before_aggregate(rnd)

            replies, server_metrics = exchange(grid, messages, timeout, beside)
            self.sent_ids = self.message_partitions(messages)
            arrays, record = self.aggregate_train(rnd, replies)
            if arrays is not None:
                client_metrics = dict(record or {})
                round_metrics.update(self.aggregation_metrics)
                self.server.adopt(arrays)
                if trainer.trains_aggregate() and self.tested(rnd):
                    aggregate = self.parts.evaluator.evaluate(self.server.model)
                    round_metrics["aggregate_accuracy"] = aggregate["test_accuracy"]
            else:
                log.warning(
                    "round %d: no client update arrived; the global model is unchanged", rnd
                )
            codec.end_round(self.sent(messages), {u.pid for u in self.updates})
        else:
            server_metrics = trainer.before_aggregate(rnd)
        server_metrics.update(trainer.after_aggregate(rnd))
        round_metrics.update(codec.update_payloads(rnd))
        evaluation = self.parts.evaluator.evaluate(self.server.model) if self.tested(rnd) else {}
        return {
            "round": rnd,
            **evaluation,
            **stats.row(),
            **client_metrics,
            **server_metrics,
            **round_metrics,
        }

    def tested(self, rnd: int) -> bool:
        """Whether round ``rnd`` evaluates on the test set (eval.every, and the last round)."""
        return rnd % self.settings.eval.every == 0 or rnd == self.settings.rounds

    def sent(self, messages: list[Message]) -> set[int]:
        """The partitions the round's messages carried."""
        return {pid for m in messages for pid in self.message_pids.get(id(m), [])}

    def message_partitions(self, messages: list[Message]) -> dict[str, list[int]]:
        """The partitions of each sent message by the id the grid gave it when sending."""
        return {m.metadata.message_id: self.message_pids.get(id(m), []) for m in messages}


def threads_beside_clients(
    grid: Grid, clients: int, cpus_each: int, device: torch.device
) -> int | None:
    """Torch threads for the server's work while a simulation's clients train on this
    machine's CPU: the server's threads less the CPUs the round's clients reserve, at least
    one (on 2 cores, the step on 2 threads beside two training clients cost a T = 1 round
    about 0.07 s; docs/benchmarks.md). None (as they are) when the
    clients are not on this CPU: a deployment's grid, or a server on a GPU."""
    if not is_simulation_grid(grid) or device.type != "cpu":
        return None
    return max(1, torch.get_num_threads() - clients * cpus_each)


def is_simulation_grid(grid: Grid) -> bool:
    """Whether ``grid`` is the simulation's in-memory grid. Read from ``sys.modules``: a
    process that never loaded Flower's in-memory grid (the CLI resolving a config, a deployed
    ServerApp) cannot hold one, and importing it (its LinkState, SQLAlchemy) costs about
    0.85 s of the CLI's start before the SuperLink boots."""
    module = sys.modules.get("flwr.superlink.grid.inmemory_grid")
    return module is not None and isinstance(grid, module.InMemoryGrid)


def stalled_message(rnd: int, limit: int, stats: RoundStats) -> str:
    """One line: how many rounds failed and why the last one did."""
    why = "; ".join(f"partition {pid}: {text}" for pid, text in sorted(stats.problems))
    why = why or "no client replied"
    return one_line(
        f"no client update accepted in {limit} rounds in a row (rounds {rnd - limit + 1}-{rnd}, "
        f"federation.max_failed_rounds); round {rnd}: {why}",
        limit=1000,
    )


class ServerHalf:
    """A method's server half: its config defaults and checks, and the parts it picks."""

    # The SSL heads its clients train (model.projector_dim, model.predictor_dim); the config
    # refuses the others.
    ssl_heads: frozenset[str] = frozenset()
    # Whether it trains on the open-world split (split.scenario: open_world).
    open_world: bool = False
    # Whether its aggregator averages models (then aggregate.* applies; else it is refused).
    averages_models: bool = True
    # Why privacy.mode is refused for it ("": its clients send a dense model update that the
    # DP mean clips and noises, strategies/privacy.py); completes "method NAME ...".
    privacy_refusal: str = ""

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """The method's own values of shared keys, merged over their declared defaults
        (its ``algo`` keys are declared in its settings class, ssfl.registry)."""
        return {}

    @classmethod
    def check_config(cls, settings: Settings) -> None:
        """Raise ConfigError for method-specific values that make no sense together (each
        value's own range and choices are checked from its declaration)."""

    @classmethod
    def parts(cls, server: ServerSide) -> Parts:
        return Parts.standard(server)

    @classmethod
    def strategy(cls, server: ServerSide, on_round: Callable[[dict[str, Any]], None]) -> RoundLoop:
        """The Flower Strategy running this method on ``server``."""
        return RoundLoop(server, cls.parts(server), on_round)

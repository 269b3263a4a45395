"""The round's message exchange: replies are seen soon after they arrive, the timeout holds."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable

import pytest
import torch
from flwr.app import Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity
from flwr.superlink.grid import InMemoryGrid

import strategies.messaging
from strategies.loop import is_simulation_grid, threads_beside_clients
from strategies.messaging import REPLY_POLL_MAX_S, ask_each, exchange
from tasks.train import torch_threads
from tests.harness import build_strategy, tiny_raw


class DelayedGrid(Grid):
    """Node ``i``'s reply can be pulled ``delays[i]`` seconds after the push (None: never)."""

    def __init__(self, delays: list[float | None]):
        self.delays = delays
        self.ready_at: dict[str, tuple[float, Message]] = {}
        self.pulls = 0

    def set_run(self, run_id: int) -> None:
        raise NotImplementedError

    @property
    def run(self):
        raise NotImplementedError

    def create_message(self, *args, **kwargs) -> Message:
        raise NotImplementedError

    def get_node_ids(self) -> Iterable[int]:
        return list(range(len(self.delays)))

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        now, ids = time.monotonic(), []
        for msg in messages:
            nid = msg.metadata.dst_node_id
            mid = f"m{nid}"
            msg.metadata.__dict__["_message_id"] = mid
            if self.delays[nid] is not None:
                self.ready_at[mid] = (now + self.delays[nid], Message(RecordDict(), reply_to=msg))
            ids.append(mid)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        self.pulls += 1
        now = time.monotonic()
        ready = [m for m in message_ids if m in self.ready_at and self.ready_at[m][0] <= now]
        return [self.ready_at.pop(mid)[1] for mid in ready]

    def send_and_receive(self, messages, *, timeout=None):
        raise AssertionError("exchange pulls Flower grids itself")


def messages(n: int) -> list[Message]:
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    return [
        Message(content=RecordDict(), message_type=MessageType.TRAIN, dst_node_id=i)
        for i in range(n)
    ]


def test_every_reply_is_pulled_soon_after_it_arrives():
    grid = DelayedGrid([0.0, 0.2, 0.5])
    started = time.monotonic()
    replies, _ = exchange(grid, messages(3), timeout=30)
    waited = time.monotonic() - started
    assert sorted(r.metadata.reply_to_message_id for r in replies) == ["m0", "m1", "m2"]
    assert 0.5 <= waited < 0.5 + 0.1  # Flower's HttpGrid would return at 3 s
    assert grid.pulls <= 0.5 / 0.01 + 2  # never busier than one pull per REPLY_POLL_MIN_S


def test_the_timeout_ends_the_wait_with_the_replies_that_came():
    grid = DelayedGrid([0.05, None])
    started = time.monotonic()
    replies, _ = exchange(grid, messages(2), timeout=0.4)
    waited = time.monotonic() - started
    assert [r.metadata.reply_to_message_id for r in replies] == ["m0"]
    assert 0.4 <= waited < 0.4 + REPLY_POLL_MAX_S


def test_a_grid_that_is_not_flowers_is_asked_with_send_and_receive():
    class Plain:
        def send_and_receive(self, msgs, timeout=None):
            return [Message(RecordDict(), reply_to=m) for m in msgs]

    sent = messages(2)
    for i, msg in enumerate(sent):
        msg.metadata.__dict__["_message_id"] = f"m{i}"
    replies, _ = exchange(Plain(), sent, timeout=1)
    assert [r.metadata.reply_to_message_id for r in replies] == ["m0", "m1"]


def test_work_needing_no_reply_runs_while_the_clients_work_and_its_result_comes_back():
    """The server's step beside the clients (SSFL eq. 4-5) runs after the push, before the
    last reply: a round takes max(clients, server), not their sum."""
    grid = DelayedGrid([0.3, 0.3])
    started = time.monotonic()

    def server_step() -> dict[str, float]:
        time.sleep(0.25)
        return {"server_loss": 1.5, "pulls_before": grid.pulls}

    replies, done = exchange(grid, messages(2), timeout=30, meanwhile=server_step)
    waited = time.monotonic() - started
    assert len(replies) == 2 and done == {"server_loss": 1.5, "pulls_before": 0}
    assert 0.3 <= waited < 0.3 + 0.1  # not 0.55: the two waits overlapped


def test_the_server_step_beside_simulated_cpu_clients_gets_the_threads_they_leave():
    """In a simulation on the CPU the server's beside-clients step shares the cores with the
    round's clients: it gets the server's threads less theirs, at least one."""
    simulation = object.__new__(InMemoryGrid)  # the simulation's grid type; no state needed
    cpu = torch.device("cpu")
    with torch_threads(16):
        assert threads_beside_clients(simulation, 4, 2, cpu) == 8
        assert threads_beside_clients(simulation, 10, 1, cpu) == 6
        assert threads_beside_clients(simulation, 16, 1, cpu) == 1
        assert threads_beside_clients(simulation, 20, 1, cpu) == 1
        # Clients elsewhere (a deployment's grid) or a server on a GPU: threads untouched.
        assert threads_beside_clients(DelayedGrid([0.1]), 10, 1, cpu) is None
        assert threads_beside_clients(simulation, 10, 1, torch.device("cuda")) is None


def test_only_the_simulations_grid_counts_as_one_and_a_process_without_it_has_none(
    monkeypatch,
):
    assert is_simulation_grid(object.__new__(InMemoryGrid))
    assert not is_simulation_grid(DelayedGrid([0.1]))
    monkeypatch.delitem(sys.modules, "flwr.superlink.grid.inmemory_grid")
    assert not is_simulation_grid(object.__new__(InMemoryGrid))  # never loaded: none exists


def test_torch_threads_sets_the_count_for_the_block_and_restores_it():
    before = torch.get_num_threads()
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError), torch_threads(1):
        raise RuntimeError("the step failed")
    assert torch.get_num_threads() == before
    with torch_threads(None):
        assert torch.get_num_threads() == before


class LossyGrid(DelayedGrid):
    """Node ``i``'s k-th query is answered ``answers[i][k]`` seconds after its push (None:
    lost, never answered; past the list: as its last entry), with its partition id."""

    def __init__(self, answers: list[list[float | None]]):
        super().__init__([a[0] for a in answers])
        self.answers = answers
        self.pushed: list[int] = []

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        now, ids = time.monotonic(), []
        for msg in messages:
            nid = msg.metadata.dst_node_id
            asked = self.answers[nid]
            delay = asked[min(self.pushed.count(nid), len(asked) - 1)]
            mid = f"q{len(self.pushed)}"
            self.pushed.append(nid)
            msg.metadata.__dict__["_message_id"] = mid
            if delay is not None:
                metrics = MetricRecord({"partition-id": nid})
                reply = Message(RecordDict({"metrics": metrics}), reply_to=msg)
                self.ready_at[mid] = (now + delay, reply)
            ids.append(mid)
        return ids


def query(nid: int) -> Message:
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    return Message(content=RecordDict(), message_type=MessageType.QUERY, dst_node_id=nid)


def test_a_node_whose_query_was_lost_is_asked_again_and_its_answer_kept():
    grid = LossyGrid([[0.0], [None, 0.05], [0.0]])
    started = time.monotonic()
    replies = ask_each(grid, [0, 1, 2], query, timeout=30, retry_after=0.2)
    waited = time.monotonic() - started
    assert {n: r.metadata.reply_to_message_id for n, r in replies.items()} == {
        0: "q0",
        1: "q3",
        2: "q2",
    }
    assert grid.pushed == [0, 1, 2, 1]  # only the silent node was asked again
    assert 0.25 <= waited < 0.25 + 0.1  # not the 30 s timeout


def test_a_slow_first_answer_still_counts_and_each_node_answers_once():
    """Node 1 answers its first query after the second was sent: that answer is taken and
    the second query's is not waited for."""
    grid = LossyGrid([[0.0], [0.3, 5.0]])
    started = time.monotonic()
    replies = ask_each(grid, [0, 1], query, timeout=30, retry_after=0.2)
    waited = time.monotonic() - started
    assert {n: r.metadata.reply_to_message_id for n, r in replies.items()} == {0: "q0", 1: "q1"}
    assert grid.pushed == [0, 1, 1]
    assert 0.3 <= waited < 0.3 + 0.1


def test_a_node_that_never_answers_is_asked_at_doubling_waits_until_the_timeout():
    grid = LossyGrid([[0.0], [None]])
    started = time.monotonic()
    replies = ask_each(grid, [0, 1], query, timeout=1.0, retry_after=0.1)
    waited = time.monotonic() - started
    assert list(replies) == [0]
    assert grid.pushed == [0, 1, 1, 1, 1]  # asked at 0, then 0.1, 0.3 and 0.7 s
    assert 1.0 <= waited < 1.0 + REPLY_POLL_MAX_S


def test_the_discovery_asks_a_silent_node_again_and_names_one_that_never_answers(
    monkeypatch, caplog
):
    loop = build_strategy(tiny_raw("fedavg_sl"))
    monkeypatch.setattr(strategies.messaging, "QUERY_RETRY_S", 0.1)
    with caplog.at_level("WARNING", logger="flwr.ssfl"):
        assert loop.discover(LossyGrid([[0.0], [None, 0.0], [0.0]]), timeout=30) == {
            0: 0,
            1: 1,
            2: 2,
        }
    assert "no answer after 0.1 s from nodes [1]: asking them again" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="flwr.ssfl"):
        assert loop.discover(LossyGrid([[0.0], [None], [0.0]]), timeout=0.5) == {0: 0, 2: 2}
    assert "nodes [1] did not answer the discovery query in 0.5 s" in caplog.text

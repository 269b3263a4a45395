"""An in-process Grid for tests: the real ClientApp handlers, no Ray, no SuperLink.

Replies come back in a shuffled order (seeded per grid; the strategy must sort them),
and chosen partitions fail the way a crashing ClientApp does in Flower: an error reply.
``node_data`` gives chosen nodes a ``data-path`` (their own image folder) in node-config;
``state_path`` gives every node a ``state-path`` (its persisted context.state).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from flwr.app import Context, Error, Message, MessageType, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from client_app import app as client_app
from ssfl.experiment import resolve_config
from ssfl.registry import method
from strategies.loop import RoundLoop
from strategies.parts import ServerSide
from tasks.partition import get_split


class InProcessGrid:
    def __init__(
        self,
        num_nodes: int,
        fail_partitions: Iterable[int] = (),
        node_data: Mapping[int, str] | None = None,
        order_seed: int = 0,
        state_path: str = "",
    ):
        TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
        self.partition = {7000 + 13 * i: i for i in range(num_nodes)}
        self.fail = set(fail_partitions)
        self.order = random.Random(order_seed)
        self.contexts = {
            nid: Context(
                run_id=1,
                node_id=nid,
                state=RecordDict(),
                run_config={},
                node_config={
                    "partition-id": pid,
                    "num-partitions": num_nodes,
                    **({"data-path": node_data[pid]} if pid in (node_data or {}) else {}),
                    **({"state-path": state_path} if state_path else {}),
                },
            )
            for nid, pid in self.partition.items()
        }
        self.sent: list[Message] = []
        self.replies: list[Message] = []  # every reply, in the order the handlers ran

    def get_node_ids(self) -> list[int]:
        return list(self.partition)

    def handle(self, msg: Message) -> Message:
        nid = msg.metadata.dst_node_id
        handler = (
            client_app.query if msg.metadata.message_type == MessageType.QUERY else client_app.train
        )
        try:
            if self.partition[nid] in self.fail and msg.metadata.message_type == MessageType.TRAIN:
                raise RuntimeError(f"injected failure of partition {self.partition[nid]}")
            return handler(msg, self.contexts[nid])
        except Exception as err:  # what Flower does with a ClientApp exception
            return Message(Error(code=1, reason=f"{type(err).__name__}: {err}"), reply_to=msg)

    def send_and_receive(self, messages: Iterable[Message], timeout: float | None = None):
        messages = list(messages)
        self.sent.extend(messages)
        replies = [self.handle(m) for m in messages]
        self.order.shuffle(replies)
        self.replies.extend(replies)
        return replies


def build_strategy(raw: Mapping[str, Any], on_round=None) -> RoundLoop:
    """A method's server half on CPU for a raw experiment mapping (resolved here)."""
    cfg = resolve_config(raw)
    ds, split = get_split(cfg)
    server = ServerSide.build(cfg, ds, split, torch.device("cpu"))
    return method(cfg["method"]).server_half().strategy(server, on_round or (lambda row: None))


def run_method(raw: Mapping[str, Any], grid: InProcessGrid) -> tuple[list[dict], RoundLoop]:
    """Run an experiment through ``grid``: (its rows, its strategy)."""
    rows: list[dict] = []
    strategy = build_strategy(raw, rows.append)
    strategy.start(grid, num_rounds=strategy.cfg["rounds"])
    return rows, strategy

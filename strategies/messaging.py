"""Messaging with the clients, Flower-facing and method-free: pushing a round's messages and
pulling their replies, and turning a failed client's relayed traceback into one line."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from flwr.app import Message, RecordDict
from flwr.serverapp import Grid


@dataclass(frozen=True)
class ClientReply:
    """One client's reply, decoded once: its records, or the reason it failed. ``node``:
    the SuperNode that sent it (a cohort's worker sends several). ``summed``: its model is
    in its worker's partial sum (serialised and dense bytes), not in its records."""

    pid: int
    node: int
    content: RecordDict | None = None
    error: str | None = None
    summed: tuple[int, int] | None = None


# Replies are pulled after a wait of this share of the time already waited, kept within
# [REPLY_POLL_MIN_S, REPLY_POLL_MAX_S]: a reply is seen at most ~1% of the round late.
# (Flower's HttpGrid, the ServerApp's grid under a SuperLink, pulls every 3 s.)
REPLY_POLL_SHARE = 0.01
REPLY_POLL_MIN_S = 0.01
REPLY_POLL_MAX_S = 0.25

T = TypeVar("T")
log = logging.getLogger("flwr.ssfl")  # as the round loop's: streamed with the run


def exchange(
    grid: Grid,
    messages: list[Message],
    timeout: float,
    meanwhile: Callable[[], T] = lambda: None,
) -> tuple[list[Message], T]:
    """Push ``messages``, run ``meanwhile`` (work that needs no reply: the server's step
    beside the clients) while the clients work, then pull the replies until all arrived or
    ``timeout`` seconds after the push passed (Grid.send_and_receive's contract, polled as
    REPLY_POLL_SHARE says). Returns the replies and what ``meanwhile`` returned. A grid that
    is not Flower's (the tests' in-process one) is asked with its send_and_receive first."""
    if not isinstance(grid, Grid):
        replies = list(grid.send_and_receive(messages, timeout=timeout))
        return replies, meanwhile()
    pending = set(grid.push_messages(messages))
    started = time.monotonic()
    done = meanwhile()
    replies: list[Message] = []
    while pending:
        pulled = list(grid.pull_messages(pending))
        replies.extend(pulled)
        pending.difference_update(m.metadata.reply_to_message_id for m in pulled)
        waited = time.monotonic() - started
        if not pending or waited >= timeout:
            break
        pause = min(max(waited * REPLY_POLL_SHARE, REPLY_POLL_MIN_S), REPLY_POLL_MAX_S)
        time.sleep(min(pause, timeout - waited))
    return replies, done


# A node whose answer to a query has not come this many seconds after the query is asked
# again (the wait doubling each time): a query lost on its way, or a ClientApp that died
# before replying, costs a minute, not the whole round timeout.
QUERY_RETRY_S = 60.0


def ask_each(
    grid: Grid,
    nodes: list[int],
    query: Callable[[int], Message],
    timeout: float,
    retry_after: float | None = None,
) -> dict[int, Message]:
    """Send ``query(node)`` to each node and pull until every node answered or ``timeout``
    seconds passed; a node not answered ``retry_after`` seconds (default QUERY_RETRY_S)
    after the first query is asked again, then after twice that, and so on, its earlier
    queries still pulled. For idempotent messages only (a node may answer twice): the first
    reply per node is kept, by the node asked (an error reply may come from the SuperLink's
    own node id). A grid that is not Flower's (the tests' in-process one) is asked once."""
    if not isinstance(grid, Grid):
        queries = [query(n) for n in nodes]
        replies = grid.send_and_receive(queries, timeout=timeout)
        return {reply.metadata.src_node_id: reply for reply in replies}
    asked: dict[str, int] = {}

    def ask(targets: list[int]) -> None:
        queries = [query(n) for n in targets]
        pushed = set(grid.push_messages(queries))  # a message it could not push is left out
        asked.update(
            {
                q.metadata.message_id: n
                for q, n in zip(queries, targets)
                if q.metadata.message_id in pushed
            }
        )

    ask(nodes)
    started = time.monotonic()
    wait = QUERY_RETRY_S if retry_after is None else retry_after
    ask_again = started + wait
    answers: dict[int, Message] = {}
    while asked:
        for reply in grid.pull_messages(list(asked)):
            answers.setdefault(asked.pop(reply.metadata.reply_to_message_id), reply)
        asked = {mid: node for mid, node in asked.items() if node not in answers}
        now = time.monotonic()
        waited = now - started
        if not asked or waited >= timeout:
            break
        if now >= ask_again:
            silent = sorted(set(asked.values()))
            log.warning("no answer after %.1f s from nodes %s: asking them again", waited, silent)
            ask(silent)
            wait *= 2
            ask_again = now + wait
        pause = min(max(waited * REPLY_POLL_SHARE, REPLY_POLL_MIN_S), REPLY_POLL_MAX_S)
        time.sleep(min(pause, timeout - waited, max(ask_again - now, 0.0)))
    return answers


# A traceback's exception line: "ValueError: bad lr", "flwr.x.ClientAppException: ...".
EXCEPTION_LINE = re.compile(r"^\s*(?:[\w.]*\.)?(\w*(?:Error|Exception|Exit|Interrupt)): (\S.*)$")
# A deployed ClientApp's exception as Flower relays it: "<class 'a.b.ConfigError'>:<'...'>".
RELAYED = re.compile(r"^<class '(?:[\w.]*\.)?(\w+)'>:<'(.*)'>$", re.S)


def failure_cause(reason: str) -> str:
    """A failed client's reason cut to its cause: the last exception line with a message in
    the traceback Flower relays (Ray wraps the client's own error), else the exception of a
    deployed ClientApp, else the whole text."""
    causes = [
        m.group(1) + ": " + m.group(2) for m in map(EXCEPTION_LINE.match, reason.splitlines()) if m
    ]
    relayed = RELAYED.match(reason.strip())
    if not causes and relayed:
        causes = [relayed.group(1) + ": " + relayed.group(2)]
    return one_line(causes[-1] if causes else reason)


def one_line(text: str, limit: int = 300) -> str:
    """``text`` on one line (a traceback's lines joined), at most ``limit`` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."

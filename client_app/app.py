"""ClientApp: dispatches each TRAIN message to the method's client half; the node's
context.state is persisted per round (client_app/state.py).

A cohort message (simulation.execution: cohort, ssfl/cohort.py) carries several clients:
the node, a worker, trains them one after another, each with its own seeds, data, state
and attack role, and replies for all of them; a client that raises is a failure of that
client only. A client's state is persisted per partition as a client's own and read back
from its file when the client is next sampled, so that the worker's context.state, which
travels with every message to the worker (Ray, both ways), does not carry the states of all
its clients; without a state folder it stays in context.state under the client's prefix. A
worker writes its clients' state files while it trains the next client and waits for them
before it replies; a client whose file cannot be written fails.
"""

from __future__ import annotations

import traceback

import torch
from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from client_app.base import node_from_config, parse_config
from client_app.state import STORE, restore_state, save_state, state_folder, state_root
from ssfl import cohort
from ssfl.records import record_arrays
from ssfl.registry import method, settings_of
from tasks.aggregate import State, array_problem, partial_sum
from tasks.train import keep_freed_memory

app = ClientApp()


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Tell the server which partition this node holds (its id, also with its own data),
    whether it trains on its own folder (then the server cannot know its size) and whether
    its clients' states persist in partition folders (then a cohort's client may go to
    any worker: ``state-on-disk``)."""
    node = node_from_config(context.node_config)
    on_disk = bool(state_root(context.node_config, context.run_config))
    metrics = MetricRecord(
        {
            "partition-id": node.partition_id,
            "own-data": int(bool(node.data_path)),
            "state-on-disk": int(on_disk),
        }
    )
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Local training of the method named in the round's config (of each client of a
    cohort)."""
    keep_freed_memory()
    if cohort.is_cohort(msg.content):
        return Message(content=train_cohort(msg.content, context), reply_to=msg)
    node = node_from_config(context.node_config)
    content = train_client(msg.content, context, context.state, node.partition_id, node.data_path)
    return Message(content=content, reply_to=msg)


def train_client(
    content: RecordDict,
    context: Context,
    state: RecordDict,
    pid: int,
    data_path: str = "",
    background: bool = False,
) -> RecordDict:
    """One client's round: its state restored when empty, its half's reply, its state kept
    (``background``: its file written on the writer thread, see ``STORE.flush``)."""
    name = settings_of(parse_config(str(content["config"]["ssfl-config"]))).method
    client_class = method(name).client_half()
    if client_class is None:
        raise ValueError(f"method {name!r} has no client half")
    folder = state_folder(context.node_config, context.run_config, pid)
    server_round = int(content["config"]["round"])
    if folder is not None:
        restore_state(state, folder, server_round)
    reply = client_class(content, state, pid, data_path).reply()
    if folder is not None:
        save_state(state, folder, server_round, background)
    return reply


def train_cohort(content: RecordDict, context: Context) -> RecordDict:
    """Every client of a cohort message, one after another; their replies in one."""
    contents, _ = cohort.unpack(content)
    replies: dict[int, RecordDict] = {}
    errors: dict[int, str] = {}
    folders = {}
    for pid, client_content in contents.items():
        state = client_state(context.state, pid)
        try:
            replies[pid] = train_client(client_content, context, state, pid, background=True)
        except Exception:  # the client fails, its cohort goes on (the server counts it)
            errors[pid] = traceback.format_exc()
        folders[pid] = state_folder(context.node_config, context.run_config, pid)
        keep_client_state(context.state, pid, RecordDict() if folders[pid] else state)
    failed = STORE.flush()
    for pid, folder in folders.items():
        if folder in failed and pid in replies:  # its state is not on disk: it fails
            del replies[pid]
            err = failed[folder]
            errors[pid] = f"client state of partition {pid} not written: {err!r}"
    request = cohort.sum_request(content)
    returned = summed(request, contents, replies) if request else None
    out = cohort.pack(replies, errors)
    if returned is not None:
        cohort.attach_sum(out, returned)
    return out


def summed(
    request: cohort.SumRequest, messages: dict[int, RecordDict], replies: dict[int, RecordDict]
) -> cohort.ReturnedSum | None:
    """The partial sum of the replies whose models pass the server's check (``arrays`` like
    the start model: its keys, shapes and dtypes, finite) with a valid num-examples; their
    ``arrays`` leave their replies (in place). The others keep their models, for the server
    to judge. None when fewer than two qualify: one model travels smaller as it is (float32)
    than as a float64 sum."""
    decoded: dict[int, State] = {}  # each start model decoded once (a cohort shares one)
    pids, states, starts, weights, sizes = [], [], [], [], {}
    for pid, reply in replies.items():
        record, n = reply.array_records.get("arrays"), reply["metrics"].get("num-examples")
        if record is None or not isinstance(n, int) or isinstance(n, bool) or n < 1:
            continue
        start_record = messages[pid]["arrays"]
        if id(start_record) not in decoded:
            decoded[id(start_record)] = record_arrays(start_record)
        start, state = decoded[id(start_record)], record_arrays(record)
        if array_problem(state, {k: torch.from_numpy(v) for k, v in start.items()}):
            continue
        pids.append(pid)
        states.append(state)
        starts.append(start)
        weights.append(float(n) if request.weights == "examples" else 1.0)
        sizes[pid] = cohort.array_sizes(record)
    if len(pids) < 2:
        return None
    for pid in pids:
        del replies[pid]["arrays"]
    part = partial_sum(pids, states, weights, starts, request.diversity_keys)
    return cohort.ReturnedSum(part, sizes)


def client_state(state: RecordDict, pid: int) -> RecordDict:
    """Client ``pid``'s part of a worker's context.state (its keys without the prefix)."""
    prefix = cohort.client_key(pid, "")
    return RecordDict({k[len(prefix) :]: r for k, r in state.items() if k.startswith(prefix)})


def keep_client_state(state: RecordDict, pid: int, own: RecordDict) -> None:
    """Put client ``pid``'s state back into the worker's context.state."""
    prefix = cohort.client_key(pid, "")
    for key in [k for k in state if k.startswith(prefix)]:
        del state[key]
    for key, record in own.items():
        state[prefix + key] = record

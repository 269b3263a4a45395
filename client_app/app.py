"""ClientApp: dispatches each TRAIN message to the method's client half; the node's
context.state is persisted per round (client_app/state.py)."""

from __future__ import annotations

from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from client_app.base import node_from_config, parse_config
from client_app.state import restore_state, save_state, state_folder
from ssfl.registry import method, settings_of
from tasks.train import keep_freed_memory

app = ClientApp()


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Tell the server which partition this node holds (its id, also with its own data) and
    whether it trains on its own folder (then the server cannot know its size)."""
    node = node_from_config(context.node_config)
    metrics = MetricRecord(
        {"partition-id": node.partition_id, "own-data": int(bool(node.data_path))}
    )
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Local training of the method named in the round's config."""
    keep_freed_memory()
    name = settings_of(parse_config(str(msg.content["config"]["ssfl-config"]))).method
    client_class = method(name).client_half()
    if client_class is None:
        raise ValueError(f"method {name!r} has no client half")
    node = node_from_config(context.node_config)
    folder = state_folder(context.node_config, context.run_config, node.partition_id)
    server_round = int(msg.content["config"]["round"])
    if folder is not None:
        restore_state(context.state, folder, server_round)
    half = client_class(msg.content, context.state, node.partition_id, node.data_path)
    content = half.reply()
    if folder is not None:
        save_state(context.state, folder, server_round)
    return Message(content=content, reply_to=msg)

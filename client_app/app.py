"""ClientApp: dispatches each TRAIN message to the method's client half."""

from __future__ import annotations

from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from client_app.base import parse_config
from strategies import METHODS

app = ClientApp()


def partition_id(context: Context) -> int:
    """The node's partition (simulation sets it; deployment passes --node-config)."""
    if "partition-id" not in context.node_config:
        raise ValueError(
            "node-config has no 'partition-id' (start the SuperNode with "
            '--node-config "partition-id=K num-partitions=N")'
        )
    return int(context.node_config["partition-id"])


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Tell the server which partition this node holds."""
    return Message(
        content=RecordDict({"metrics": MetricRecord({"partition-id": partition_id(context)})}),
        reply_to=msg,
    )


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Local training of the method named in the round's config."""
    cfg = parse_config(str(msg.content["config"]["ssfl-config"]))
    client_class = METHODS[cfg["method"]].client
    if client_class is None:
        raise ValueError(f"method {cfg['method']!r} has no client half")
    half = client_class(msg.content, context.state, partition_id(context))
    return Message(content=half.reply(), reply_to=msg)

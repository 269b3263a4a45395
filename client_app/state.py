"""A node's ``context.state`` persisted per partition, so that a resumed run or a restarted
node goes on with the state it had (FedSEAL's self-ensemble, kept client momentum,
FedMatch's copy of the public model).

After each round it trains in, a node writes its state to ``<folder>/partition-<k>/
round-<r>.bin`` (Flower's RecordDict protobuf, written atomically). A node whose
``context.state`` is empty when round r arrives (a new run resumed from a checkpoint, a
restarted SuperNode) takes the newest file of a round before r, never one of r or later: a
file of a round the server did not complete (it died after the node replied) is never read,
and it is deleted. The newest ``KEPT_ROUNDS`` files are kept (a node is at
most one round ahead of the server's checkpoint).

The folder: the node-config's ``state-path`` (a deployed node's own disk), else the run
config's ``client-state-dir`` (a simulation: ``OUT/client-state``); neither: nothing is
persisted.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flwr.app import RecordDict
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict

from tasks.checkpoint import write_atomic

KEPT_ROUNDS = 2
ROUND_FILE = re.compile(r"^round-(\d+)\.bin$")


def state_folder(
    node_config: Mapping[str, Any], run_config: Mapping[str, Any], partition_id: int
) -> Path | None:
    """Where partition ``partition_id`` keeps its state (None: not persisted)."""
    root = str(node_config.get("state-path", "") or run_config.get("client-state-dir", ""))
    return Path(root) / f"partition-{partition_id}" if root else None


def saved_rounds(folder: Path) -> dict[int, Path]:
    """The state files in ``folder`` by round."""
    if not folder.is_dir():
        return {}
    found = (ROUND_FILE.match(p.name) for p in folder.iterdir())
    return {int(m.group(1)): folder / m.group(0) for m in found if m}


def restore_state(state: RecordDict, folder: Path, server_round: int) -> int | None:
    """Fill an empty ``state`` from the newest file of a round before ``server_round`` and
    drop the files of that round and later (an unfinished round's); returns the round
    loaded (None: the state was not empty, or no such file)."""
    if len(state) > 0:
        return None
    saved = saved_rounds(folder)
    for rnd, path in saved.items():
        if rnd >= server_round:
            path.unlink(missing_ok=True)
    earlier = [r for r in saved if r < server_round]
    if not earlier:
        return None
    proto = ProtoRecordDict()
    proto.ParseFromString((folder / f"round-{max(earlier)}.bin").read_bytes())
    for key, record in recorddict_from_proto(proto).items():
        state[key] = record
    return max(earlier)


def save_state(state: RecordDict, folder: Path, server_round: int) -> None:
    """Write a non-empty ``state`` as the round's file; keep the newest KEPT_ROUNDS files."""
    if len(state) == 0:
        return
    data = recorddict_to_proto(state).SerializeToString()
    write_atomic(folder / f"round-{server_round}.bin", data)
    rounds = sorted(saved_rounds(folder))
    for old in rounds[:-KEPT_ROUNDS]:
        (folder / f"round-{old}.bin").unlink(missing_ok=True)

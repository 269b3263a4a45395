"""A node's ``context.state`` persisted per partition, so that a resumed run or a restarted
node goes on with the state it had (FedSEAL's self-ensemble, kept client momentum,
FedMatch's copy of the public model).

After each round it trains in, a node writes its state to ``<folder>/partition-<k>/
round-<r>.bin`` (written atomically; :func:`encode_state`'s layout: each array's bytes as
they are, after a JSON header, where Flower's protobuf took over 10x longer to build for
ResNet-18's kept momentum; a file in that protobuf, as earlier versions wrote, is still
read). A node whose
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

import json
import re
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flwr.app import Array, ArrayRecord, RecordDict
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict
from google.protobuf.message import DecodeError

from tasks.checkpoint import write_atomic

KEPT_ROUNDS = 2
ROUND_FILE = re.compile(r"^round-(\d+)\.bin$")
MAGIC = b"ssfl-state 1\n"
HEADER_SIZE = struct.Struct("<Q")


class StateFileError(RuntimeError):
    """A client state file cannot be read (the message is one line naming it)."""


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
    for key, record in read_state(folder / f"round-{max(earlier)}.bin").items():
        state[key] = record
    return max(earlier)


def save_state(state: RecordDict, folder: Path, server_round: int) -> None:
    """Write a non-empty ``state`` as the round's file; keep the newest KEPT_ROUNDS files."""
    if len(state) == 0:
        return
    write_atomic(folder / f"round-{server_round}.bin", encode_state(state))
    rounds = sorted(saved_rounds(folder))
    for old in rounds[:-KEPT_ROUNDS]:
        (folder / f"round-{old}.bin").unlink(missing_ok=True)


def encode_state(state: RecordDict) -> list[bytes]:
    """``state`` as the chunks of a state file: MAGIC, the header's length (8 bytes, little
    endian), a JSON header, then each ArrayRecord's arrays' bytes as Flower holds them, in
    the header's order, and last the other records as one protobuf RecordDict."""
    records, chunks = [], []
    others = RecordDict()
    for key, record in state.items():
        if isinstance(record, ArrayRecord):
            items = []
            for name, array in record.items():
                items.append([name, array.dtype, list(array.shape), array.stype, len(array.data)])
                chunks.append(array.data)
            records.append({"key": key, "arrays": items})
        else:
            others[key] = record
    rest = recorddict_to_proto(others).SerializeToString() if len(others) else b""
    header = json.dumps({"records": records, "others": len(rest)}).encode()
    return [MAGIC, HEADER_SIZE.pack(len(header)), header, *chunks, rest]


def decode_state(data: bytes) -> RecordDict:
    """The RecordDict of a state file's bytes (:func:`encode_state`'s layout, or a protobuf
    RecordDict as earlier versions wrote); ValueError when they are neither."""
    if not data.startswith(MAGIC):
        proto = ProtoRecordDict()
        proto.ParseFromString(data)
        return recorddict_from_proto(proto)
    start = len(MAGIC) + HEADER_SIZE.size
    (size,) = HEADER_SIZE.unpack_from(data, len(MAGIC))
    header = json.loads(data[start : start + size])
    view, offset = memoryview(data), start + size
    state = RecordDict()
    for record in header["records"]:
        arrays = {}
        for name, dtype, shape, stype, length in record["arrays"]:
            chunk = bytes(view[offset : offset + length])
            if len(chunk) != length:
                raise ValueError("the file ends inside an array")
            arrays[name] = Array(dtype=dtype, shape=tuple(shape), stype=stype, data=chunk)
            offset += length
        state[record["key"]] = ArrayRecord(arrays)
    if offset + header["others"] != len(data):
        raise ValueError(
            f"{len(data) - offset} bytes after the arrays, {header['others']} expected"
        )
    if header["others"]:
        for key, record in decode_state(bytes(view[offset:])).items():
            state[key] = record
    return state


def read_state(path: Path) -> RecordDict:
    """The state in the file at ``path``; StateFileError (one line naming it) when it is
    damaged."""
    try:
        return decode_state(path.read_bytes())
    except (ValueError, KeyError, TypeError, struct.error, DecodeError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise StateFileError(f"client state file {path} is damaged: {reason}") from err

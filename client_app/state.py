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

Each process also keeps the states it wrote last (:data:`STORE`, at most ``KEPT_BYTES``):
a state is restored from memory when the newest file is the one this process wrote (its
header's random token says so; a file written by another process, or a newer one, is read),
so a client sampled again by the same worker skips decoding its file. A cohort worker writes
its clients' files in the background while it trains the next client, and waits for them
before it replies (``STORE.flush``): a reply still means its states are on disk.
"""

from __future__ import annotations

import json
import re
import struct
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flwr.app import Array, ArrayRecord, RecordDict
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict
from google.protobuf.message import DecodeError

from tasks.checkpoint import write_atomic

KEPT_ROUNDS = 2
KEPT_BYTES = 1 << 30  # the states a process keeps in memory after writing them
ROUND_FILE = re.compile(r"^round-(\d+)\.bin$")
MAGIC = b"ssfl-state 1\n"
HEADER_SIZE = struct.Struct("<Q")


class StateFileError(RuntimeError):
    """A client state file cannot be read (the message is one line naming it)."""


def state_root(node_config: Mapping[str, Any], run_config: Mapping[str, Any]) -> str:
    """The folder of the partitions' state folders ("": states are not persisted)."""
    return str(node_config.get("state-path", "") or run_config.get("client-state-dir", ""))


def state_folder(
    node_config: Mapping[str, Any], run_config: Mapping[str, Any], partition_id: int
) -> Path | None:
    """Where partition ``partition_id`` keeps its state (None: not persisted)."""
    root = state_root(node_config, run_config)
    return Path(root) / f"partition-{partition_id}" if root else None


def saved_rounds(folder: Path) -> dict[int, Path]:
    """The state files in ``folder`` by round."""
    if not folder.is_dir():
        return {}
    found = (ROUND_FILE.match(p.name) for p in folder.iterdir())
    return {int(m.group(1)): folder / m.group(0) for m in found if m}


@dataclass(frozen=True)
class Written:
    """A state as this process wrote it: its round, its file's token, its records, its bytes."""

    round: int
    token: str
    state: RecordDict
    size: int


class StateStore:
    """The states this process wrote last, one per folder (least recently used dropped past
    ``budget`` bytes), and its background writes of state files."""

    def __init__(self, budget: int = KEPT_BYTES) -> None:
        self.budget = budget
        self.kept: OrderedDict[Path, Written] = OrderedDict()
        self.pending: dict[Path, Future] = {}
        self.writer: ThreadPoolExecutor | None = None

    def keep(self, folder: Path, written: Written) -> None:
        """Remember ``written`` as ``folder``'s last state (not when over the budget)."""
        self.kept.pop(folder, None)
        if written.size > self.budget:
            return
        self.kept[folder] = written
        while sum(w.size for w in self.kept.values()) > self.budget:
            self.kept.popitem(last=False)

    def lookup(self, folder: Path, rnd: int, token: str | None) -> RecordDict | None:
        """``folder``'s kept state when it is the one of round ``rnd`` with file token
        ``token`` (a copy of its records' mapping), else None."""
        written = self.kept.get(folder)
        if written is None or token is None or (written.round, written.token) != (rnd, token):
            return None
        self.kept.move_to_end(folder)
        return copy_records(written.state)

    def submit(self, folder: Path, job: Any) -> None:
        """Run ``job`` (a file write for ``folder``) on this process's writer thread."""
        self.wait(folder)
        if self.writer is None:
            self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ssfl-state")
        self.pending[folder] = self.writer.submit(job)

    def wait(self, folder: Path) -> None:
        """Wait for ``folder``'s write in progress, if any; raise its error."""
        future = self.pending.pop(folder, None)
        if future is not None:
            future.result()

    def flush(self) -> dict[Path, BaseException]:
        """Wait for every write in progress; the folders whose write failed, with why."""
        failed: dict[Path, BaseException] = {}
        for folder in list(self.pending):
            try:
                self.wait(folder)
            except Exception as err:  # the caller fails that folder's client
                failed[folder] = err
                self.kept.pop(folder, None)
        return failed


STORE = StateStore()


def copy_records(state: RecordDict) -> RecordDict:
    """A new RecordDict of new ArrayRecords over the same (immutable) array bytes, so that a
    client's changes to its state never reach the kept one."""
    out = RecordDict()
    for key, record in state.items():
        out[key] = ArrayRecord(dict(record.items())) if isinstance(record, ArrayRecord) else record
    return out


def restore_state(state: RecordDict, folder: Path, server_round: int) -> int | None:
    """Fill an empty ``state`` from the newest file of a round before ``server_round`` (from
    memory when this process wrote that file) and drop the files of that round and later (an
    unfinished round's); returns the round loaded (None: the state was not empty, or no
    such file)."""
    if len(state) > 0:
        return None
    STORE.wait(folder)
    saved = saved_rounds(folder)
    for rnd, path in saved.items():
        if rnd >= server_round:
            path.unlink(missing_ok=True)
    earlier = [r for r in saved if r < server_round]
    if not earlier:
        return None
    path = folder / f"round-{max(earlier)}.bin"
    records = STORE.lookup(folder, max(earlier), read_token(path))
    for key, record in (records if records is not None else read_state(path)).items():
        state[key] = record
    return max(earlier)


def save_state(
    state: RecordDict, folder: Path, server_round: int, background: bool = False
) -> None:
    """Write a non-empty ``state`` as the round's file and keep the newest KEPT_ROUNDS files
    (``background``: on the writer thread; ``STORE.flush`` waits for it); the process keeps
    the state in memory for the client's next round."""
    if len(state) == 0:
        return
    token = uuid.uuid4().hex
    chunks = encode_state(state, token)
    size = sum(len(c) for c in chunks)
    STORE.keep(folder, Written(server_round, token, copy_records(state), size))
    if background:
        STORE.submit(folder, lambda: write_state_file(chunks, folder, server_round))
    else:
        STORE.wait(folder)
        write_state_file(chunks, folder, server_round)


def write_state_file(chunks: list[bytes], folder: Path, server_round: int) -> None:
    """The round's state file from :func:`encode_state`'s chunks; the older ones past
    KEPT_ROUNDS deleted."""
    write_atomic(folder / f"round-{server_round}.bin", chunks)
    rounds = sorted(saved_rounds(folder))
    for old in rounds[:-KEPT_ROUNDS]:
        (folder / f"round-{old}.bin").unlink(missing_ok=True)


def read_token(path: Path) -> str | None:
    """The token in the header of the state file at ``path`` (None: none there, as in
    earlier versions' files, or the file is not readable as a state file)."""
    try:
        with path.open("rb") as fh:
            head = fh.read(len(MAGIC) + HEADER_SIZE.size)
            if not head.startswith(MAGIC) or len(head) < len(MAGIC) + HEADER_SIZE.size:
                return None
            (size,) = HEADER_SIZE.unpack_from(head, len(MAGIC))
            token = json.loads(fh.read(size)).get("token")
    except (OSError, ValueError, struct.error):
        return None
    return token if isinstance(token, str) else None


def encode_state(state: RecordDict, token: str = "") -> list[bytes]:
    """``state`` as the chunks of a state file: MAGIC, the header's length (8 bytes, little
    endian), a JSON header (with ``token``, which names this write), then each ArrayRecord's
    arrays' bytes as Flower holds them, in the header's order, and last the other records as
    one protobuf RecordDict."""
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
    header = json.dumps({"records": records, "others": len(rest), "token": token}).encode()
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

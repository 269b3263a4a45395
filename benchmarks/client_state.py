"""What persisting a client's state costs per round: the state file's layout against Flower's
protobuf, which earlier versions wrote.

A client that keeps its SGD momentum (client.keep_momentum; the SSFL benchmark's default)
writes one buffer per parameter of its model after every round it trains
(client_app/state.py: ``save_state``), and a resumed or restarted node reads it back
(``restore_state``). For ``--model`` (random values, the real shapes) this times, best of
``--repeat`` on one thread, writing the state (encoding and an fsync'd atomic write) and
reading it back, both ways, in a scratch folder under ``--dir``; and what a cohort worker's
critical path holds since it keeps written states in memory and writes their files in the
background: the caller's part of a background save (encoding, keeping, queueing) and a
restore from memory (the file's token read, the records copied). Writes ``--json`` and
prints it.

    python benchmarks/client_state.py --model resnet18 --json results/client-state/resnet18.json
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from flwr.app import RecordDict
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict

from benchmarks.partial_sums import best_of, report
from client_app.base import MOMENTUM_KEY, host_record
from client_app.state import STORE, read_state, restore_state, save_state
from tasks.checkpoint import write_atomic
from tasks.models import build_model
from tasks.results import host

SIZES = {"small_cnn": (1, 28), "resnet18": (3, 32)}  # (channels, image size)


def momentum_state(model: str) -> RecordDict:
    """A kept-momentum state of ``model``: one random float32 buffer per parameter, as
    ``client_app.base`` keeps it."""
    channels, size = SIZES[model]
    net = build_model(model, channels, 10, size, "bn", [0.5] * channels, [0.5] * channels)
    generator = torch.Generator().manual_seed(0)
    buffers = {
        str(i): torch.randn(p.shape, generator=generator) for i, p in enumerate(net.parameters())
    }
    return RecordDict({MOMENTUM_KEY: host_record(buffers)})


def measure(model: str, repeat: int, folder: Path) -> dict:
    """Seconds to write and to read ``model``'s momentum state, both layouts."""
    state = momentum_state(model)
    proto_file, state_file = folder / "proto.bin", folder / "round-1.bin"

    def write_proto() -> None:
        write_atomic(proto_file, recorddict_to_proto(state).SerializeToString())

    def read_proto() -> RecordDict:
        proto = ProtoRecordDict()
        proto.ParseFromString(proto_file.read_bytes())
        return recorddict_from_proto(proto)

    write_proto()
    save_state(state, folder, 1)
    kept = [a.numpy() for a in state[MOMENTUM_KEY].values()]
    back = [a.numpy() for a in read_state(state_file)[MOMENTUM_KEY].values()]
    back_proto = [a.numpy() for a in read_proto()[MOMENTUM_KEY].values()]
    same = all(
        np.array_equal(a, b) and np.array_equal(a, c)
        for a, b, c in zip(kept, back, back_proto, strict=True)
    )
    return {
        "model": model,
        "buffers": len(state[MOMENTUM_KEY]),
        "state_bytes": sum(len(a.data) for a in state[MOMENTUM_KEY].values()),
        "file_bytes": state_file.stat().st_size,
        "protobuf_file_bytes": proto_file.stat().st_size,
        "write_seconds": best_of(repeat, lambda: save_state(state, folder, 1)),
        "protobuf_write_seconds": best_of(repeat, write_proto),
        "read_seconds": best_of(repeat, lambda: read_state(state_file)),
        "protobuf_read_seconds": best_of(repeat, read_proto),
        "background_save_caller_seconds": background_save_seconds(state, folder, repeat),
        "memory_restore_seconds": memory_restore_seconds(folder, repeat),
        "same_values": same,
    }


def background_save_seconds(state: RecordDict, folder: Path, repeat: int) -> float:
    """The caller's part of a cohort worker's save, best of ``repeat``: the write is queued
    on the writer thread and waited for after the clock stops (as the worker waits before
    it replies, while it trains its next client)."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        save_state(state, folder, 1, background=True)
        times.append(time.perf_counter() - start)
        if STORE.flush():
            raise RuntimeError("a background state write failed")
    return min(times)


def memory_restore_seconds(folder: Path, repeat: int) -> float:
    """A restore of the state this process wrote last, best of ``repeat``; refuses to time
    one that decoded the file."""
    kept = STORE.kept[folder].state
    times = []
    for _ in range(repeat):
        state = RecordDict()
        start = time.perf_counter()
        restore_state(state, folder, 2)
        times.append(time.perf_counter() - start)
        if any(state[k][n].data is not kept[k][n].data for k in kept for n in kept[k]):
            raise RuntimeError("the state was read from its file, not from memory")
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(SIZES), default="resnet18")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="scratch folder's parent")
    parser.add_argument("--json", type=Path, help="write the result here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="ssfl-state-", dir=args.dir) as scratch:
        result = {**measure(args.model, args.repeat, Path(scratch)), "host": host()}
    report(result, args.json)


if __name__ == "__main__":
    main()

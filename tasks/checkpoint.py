"""Atomic checkpoint files: written to a temporary file beside the target, then renamed.

A reader sees the previous complete file or the new complete one, never a partial one,
whatever kills the writer (the rename is atomic on one file system). Checkpoints hold
tensors, numbers, strings, lists, tuples and dicts only, and are read with torch's
``weights_only`` loader (no arbitrary objects are unpickled).
"""

from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

# The server's checkpoint in a run's output folder (ssfl run/deploy-local --resume).
CHECKPOINT_FILE = "checkpoint.pt"
# The clients' persisted context.state in a simulation's output folder.
CLIENT_STATE_DIR = "client-state"


class CheckpointError(RuntimeError):
    """A checkpoint file is missing or unreadable (the message is one line naming it)."""


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_checkpoint(state: dict[str, Any], path: Path) -> None:
    """``state`` (tensors and plain values) serialised by torch, written atomically."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    write_atomic(path, buffer.getvalue())


def kept_checkpoint(path: Path, rnd: int) -> Path:
    """Where round ``rnd``'s kept copy of the checkpoint ``path`` goes
    (federation.checkpoint_every): checkpoint-r007.pt beside checkpoint.pt."""
    return path.with_name(f"{path.stem}-r{rnd:03d}{path.suffix}")


def load_checkpoint(path: Path) -> dict[str, Any]:
    """A checkpoint written by :func:`save_checkpoint`; CheckpointError if missing or unreadable."""
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # a damaged file, whatever torch's loader makes of it
        raise CheckpointError(f"unreadable checkpoint {path} ({type(err).__name__})") from err

"""Atomic checkpoint files: written to a temporary file beside the target, then renamed.

A reader sees the previous complete file or the new complete one, never a partial one,
whatever kills the writer (the rename is atomic on one file system). Checkpoints hold
tensors, numbers, strings, lists, tuples and dicts only, and are read with torch's
``weights_only`` loader (no arbitrary objects are unpickled).
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

# The server's checkpoint in a run's output folder (ssfl run/deploy-local --resume).
CHECKPOINT_FILE = "checkpoint.pt"
# The rows the checkpoints of a run cover, one JSON line a round, beside them: a checkpoint
# records how many it covers, so a round appends its row instead of re-dumping every row
# (which grows quadratically over a long run).
ROWS_FILE = "checkpoint-rows.jsonl"
# The clients' persisted context.state in a simulation's output folder.
CLIENT_STATE_DIR = "client-state"


class CheckpointError(RuntimeError):
    """A checkpoint file is missing or unreadable (the message is one line naming it)."""


def write_atomic(path: Path, data: bytes | list[bytes]) -> None:
    """Write ``data`` (or its chunks, one after another) to ``path`` through a temporary file
    in the same folder and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            for chunk in [data] if isinstance(data, bytes) else data:
                fh.write(chunk)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_checkpoint(state: dict[str, Any], path: Path) -> None:
    """``state`` (tensors and plain values) serialised by torch, written atomically."""
    import torch  # here: the CLI reads this module's names without torch

    buffer = io.BytesIO()
    torch.save(state, buffer)
    write_atomic(path, buffer.getvalue())


def kept_checkpoint(path: Path, rnd: int) -> Path:
    """Where round ``rnd``'s kept copy of the checkpoint ``path`` goes
    (federation.checkpoint_every): checkpoint-r007.pt beside checkpoint.pt."""
    return path.with_name(f"{path.stem}-r{rnd:03d}{path.suffix}")


def load_checkpoint(path: Path) -> dict[str, Any]:
    """A checkpoint written by :func:`save_checkpoint`; CheckpointError if missing or unreadable."""
    import torch

    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # a damaged file, whatever torch's loader makes of it
        raise CheckpointError(f"unreadable checkpoint {path} ({type(err).__name__})") from err


def write_rows(folder: Path, rows: list[dict[str, Any]]) -> None:
    """Replace ``folder``'s rows file by ``rows`` (atomically)."""
    write_atomic(folder / ROWS_FILE, "".join(row_line(row) for row in rows).encode())


def append_rows(folder: Path, rows: list[dict[str, Any]]) -> None:
    """Append ``rows`` to ``folder``'s rows file, synced before a checkpoint counts them."""
    with open(folder / ROWS_FILE, "a", encoding="utf-8") as fh:
        fh.write("".join(row_line(row) for row in rows))
        fh.flush()
        os.fsync(fh.fileno())


def row_line(row: dict[str, Any]) -> str:
    return json.dumps(row) + "\n"


def checkpoint_rows(path: Path, state: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows the checkpoint ``state`` (read from ``path``) covers: the first
    ``state["rows"]`` lines of the rows file beside it (a checkpoint written before the rows
    file existed holds its rows as one JSON text). CheckpointError when the file has fewer."""
    if isinstance(state["rows"], str):
        return json.loads(state["rows"])
    wanted = int(state["rows"])
    rows_file = Path(path).parent / ROWS_FILE
    lines = rows_file.read_text(encoding="utf-8").splitlines() if rows_file.is_file() else []
    if len(lines) < wanted:
        raise CheckpointError(
            f"{rows_file} holds {len(lines)} rows; the checkpoint {path} needs {wanted}"
        )
    return [json.loads(line) for line in lines[:wanted]]

"""Sparse transmission of weight changes (FedMatch, Jeong et al. 2021, section 3.2, App. B.1).

Only the elements that changed by more than a threshold delta travel, as a real sparse
payload: their flat indices and their new values. The receiver overwrites those elements
of its own copy. The paper sends the differences; sending the new values instead makes
sender and receiver end with bit-identical tensors whatever the float rounding (the
official code also replaces the changed elements). Where the indices would cost more
than the dense tensor, the dense values are sent.

Server to client, the server keeps one public copy of each vector and the round in
which every element last changed (:class:`Broadcast`), so a client that last synced in
round s receives exactly the elements changed since s, and a client seen for the first
time receives the dense vector.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

# A payload: {"idx": flat indices, "val": values}, {"mask": packed bits, "val": values}
# or {"dense": all values}.
Payload = dict[str, np.ndarray]
PAYLOAD_KEYS = ("dense", "idx", "mask", "val")


def changed(new: torch.Tensor, ref: torch.Tensor, delta: float) -> torch.Tensor:
    """Mask of the elements that moved by more than ``delta`` (the paper's delta threshold)."""
    return (new - ref).abs() > delta


def index_dtype(numel: int) -> np.dtype:
    """The smallest unsigned integer type that indexes a vector of ``numel`` elements."""
    return np.dtype(np.uint16) if numel <= 1 << 16 else np.dtype(np.uint32)


def encode(values: torch.Tensor, mask: torch.Tensor | None) -> Payload:
    """The masked elements of a flat vector with their positions; dense when that is cheaper.

    ``mask`` None means the receiver holds nothing yet: the dense vector is sent.
    """
    values = values.detach().reshape(-1).float().cpu()
    numel = values.numel()
    if mask is None:
        return {"dense": values.numpy().copy()}
    mask = mask.reshape(-1).cpu()
    idx = torch.from_numpy(np.flatnonzero(mask.numpy()))  # on the host copy: no device sync
    dtype = index_dtype(numel)
    index_bytes = min(idx.numel() * dtype.itemsize, (numel + 7) // 8)
    if index_bytes + 4 * idx.numel() >= 4 * numel:
        return {"dense": values.numpy().copy()}
    kept = values[idx].numpy().copy()
    if idx.numel() * dtype.itemsize <= (numel + 7) // 8:
        return {"idx": idx.numpy().astype(dtype), "val": kept}
    return {"mask": np.packbits(mask.numpy()), "val": kept}


def encode_changes(new: torch.Tensor, ref: torch.Tensor | None, delta: float) -> Payload:
    """``new`` as a payload against the receiver's copy ``ref`` (elements moved > delta)."""
    if ref is None:
        return encode(new, None)
    return encode(new, changed(new.detach().reshape(-1).cpu(), ref.reshape(-1).cpu(), delta))


def decode(ref: torch.Tensor | None, payload: Mapping[str, np.ndarray], numel: int) -> torch.Tensor:
    """The receiver's copy after applying a payload (a new CPU float32 vector)."""
    if "dense" in payload:
        dense = torch.from_numpy(np.asarray(payload["dense"], dtype=np.float32).copy())
        if dense.numel() != numel:
            raise ValueError(f"dense payload has {dense.numel()} values, expected {numel}")
        return dense
    if ref is None:
        raise ValueError("a sparse payload needs the receiver's copy of the vector")
    if "mask" in payload:
        bits = np.unpackbits(np.asarray(payload["mask"], dtype=np.uint8), count=numel)
        idx = np.flatnonzero(bits)
    else:
        idx = np.asarray(payload["idx"]).astype(np.int64)
    if idx.size and not 0 <= idx.min() <= idx.max() < numel:  # checked in numpy, on the host
        raise ValueError(f"sparse payload indexes outside the {numel} elements")
    out = ref.detach().reshape(-1).float().cpu().clone()
    out[torch.from_numpy(idx)] = torch.from_numpy(
        np.asarray(payload["val"], dtype=np.float32).copy()
    )
    return out


def payload_arrays(payload: Payload, prefix: str) -> dict[str, np.ndarray]:
    """Keys of a message's ArrayRecord for one payload: '<prefix>.idx', '<prefix>.val', ..."""
    return {f"{prefix}.{key}": value for key, value in payload.items()}


def payload_from(arrays: Mapping[str, np.ndarray], prefix: str) -> Payload:
    """The payload stored under ``prefix`` by :func:`payload_arrays`."""
    start = f"{prefix}."
    found = {key[len(start) :]: value for key, value in arrays.items() if key.startswith(start)}
    if "dense" not in found and not ("val" in found and {"idx", "mask"} & set(found)):
        raise ValueError(f"message has no payload '{prefix}'")
    return found


class Broadcast:
    """The server's public copy of a flat vector and the round each element last changed."""

    def __init__(self) -> None:
        self.value: torch.Tensor | None = None
        self.changed_at: torch.Tensor | None = None

    def publish(self, new: torch.Tensor, delta: float, server_round: int) -> None:
        """Take the elements of ``new`` that moved by more than delta into the public copy."""
        new = new.detach().reshape(-1).float().cpu()
        if self.value is None or self.changed_at is None:
            self.value = new.clone()
            self.changed_at = torch.full(new.shape, server_round, dtype=torch.int32)
            return
        mask = changed(new, self.value, delta)
        self.value[mask] = new[mask]
        self.changed_at[mask] = server_round

    def payload(self, since: int | None) -> Payload:
        """What a client that last synced in round ``since`` (None: never) must receive."""
        if self.value is None or self.changed_at is None:
            raise ValueError("nothing published yet")
        return encode(self.value, None if since is None else self.changed_at > since)

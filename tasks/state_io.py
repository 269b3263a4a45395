"""A model's tensors to and from host arrays in one copy per dtype, not tensor by tensor: on
an accelerator each tensor's own copy is a transfer and, device to host, a host sync (the
GPU-speed work's "the start model goes in and the reply comes out as whole flat copies").
The values are those of ``state_dict()`` / ``load_state_dict()``; on the CPU the copies are
plain memory copies."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import nn


def by_dtype(tensors: Mapping[str, torch.Tensor]) -> dict[torch.dtype, list[str]]:
    """The keys of ``tensors`` grouped by dtype, in their order."""
    groups: dict[torch.dtype, list[str]] = {}
    for key, tensor in tensors.items():
        groups.setdefault(tensor.dtype, []).append(key)
    return groups


def host_arrays(tensors: Mapping[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """``tensors`` as host arrays, in their order: per dtype one concatenation on their
    device and one copy to the host; each array a C-contiguous view of that copy."""
    out: dict[str, np.ndarray] = {}
    for keys in by_dtype(tensors).values():
        flat = torch.cat([tensors[k].detach().reshape(-1) for k in keys]).cpu().numpy()
        offset = 0
        for key in keys:
            shape = tuple(tensors[key].shape)
            size = int(np.prod(shape, dtype=np.int64))
            out[key] = flat[offset : offset + size].reshape(shape)
            offset += size
    return {key: out[key] for key in tensors}


def load_host_arrays(model: nn.Module, arrays: Mapping[str, np.ndarray]) -> None:
    """``model.load_state_dict`` (strict) from host arrays: per dtype one concatenation on
    the host and one copy to the model's device, then each tensor filled from its slice. As
    there, a one-element array fills a 0-d tensor (BatchNorm's counter)."""
    state = model.state_dict()
    missing, extra = sorted(set(state) - set(arrays)), sorted(set(arrays) - set(state))
    if missing or extra:
        raise RuntimeError(
            f"state keys differ from the model's (missing {missing[:3]}, unexpected {extra[:3]})"
        )
    for key, tensor in state.items():
        given = tuple(np.shape(arrays[key]))
        if given != tuple(tensor.shape) and not (tensor.dim() == 0 and given == (1,)):
            raise RuntimeError(
                f"size mismatch for {key}: {given} given, {tuple(tensor.shape)} in the model"
            )
    with torch.no_grad():
        for keys in by_dtype(state).values():
            host = np.concatenate([np.asarray(arrays[k]).reshape(-1) for k in keys])
            flat = torch.from_numpy(host).to(state[keys[0]].device)
            parts = flat.split([state[k].numel() for k in keys])
            for key, part in zip(keys, parts, strict=True):
                state[key].copy_(part.view(state[key].shape))


def device_tensors(
    arrays: Mapping[str, np.ndarray], device: torch.device
) -> dict[str, torch.Tensor]:
    """Host arrays as tensors on ``device``, in their order: per dtype one concatenation on
    the host and one copy, each tensor a view of its slice (independent of the others)."""
    out: dict[str, torch.Tensor] = {}
    groups: dict[np.dtype, list[str]] = {}
    for key, array in arrays.items():
        groups.setdefault(np.asarray(array).dtype, []).append(key)
    for keys in groups.values():
        host = np.concatenate([np.asarray(arrays[k]).reshape(-1) for k in keys])
        flat = torch.from_numpy(host).to(device)
        sizes = [int(np.asarray(arrays[k]).size) for k in keys]
        for key, part in zip(keys, flat.split(sizes), strict=True):
            out[key] = part.view(np.shape(arrays[key]))
    return {key: out[key] for key in arrays}

"""Aggregation rules on plain arrays (no Flower inside)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


def weighted_average(
    updates: Sequence[Mapping[str, np.ndarray]], weights: Sequence[float]
) -> dict[str, np.ndarray]:
    """FedAvg (McMahan et al. 2017; FedSEAL eq. 2 with equal weights): sum_k w_k x_k / sum_k w_k.

    Floating arrays are averaged in float64 and cast back; integer buffers (BatchNorm's
    num_batches_tracked) take the maximum. Order of ``updates`` does not change the result
    beyond float rounding; callers sort them for bit-identical runs.
    """
    if not updates:
        raise ValueError("weighted_average needs at least one update")
    if len(updates) != len(weights):
        raise ValueError("one weight per update")
    w = np.asarray(weights, dtype=np.float64)
    if np.any(w < 0) or w.sum() <= 0:
        raise ValueError("weights must be non-negative and not all zero")
    w = w / w.sum()
    out: dict[str, np.ndarray] = {}
    for key, first in updates[0].items():
        if np.issubdtype(first.dtype, np.floating):
            acc = np.zeros(first.shape, dtype=np.float64)
            for wk, update in zip(w, updates):
                acc += wk * update[key]
            out[key] = acc.astype(first.dtype)
        else:
            out[key] = np.asarray(np.max(np.stack([u[key] for u in updates]), axis=0))
    return out

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


State = Mapping[str, np.ndarray]


def average_with_server(
    server: State, users: Sequence[State], server_weight: float = 1.0
) -> dict[str, np.ndarray]:
    """SSFL benchmark eq. 4-5: w_avg = (w_s + sum_{k in U} w_k) / (|U| + 1), equal weights.

    ``server_weight`` a (ours; 1 is eq. 4) gives (a w_s + sum_k w_k) / (a + |U|).
    """
    return weighted_average([server, *users], [server_weight] + [1.0] * len(users))


def keep_own_buffers(
    averaged: Mapping[str, np.ndarray], own: Mapping[str, np.ndarray], buffers: Sequence[str]
) -> dict[str, np.ndarray]:
    """The averaged model with the keys ``buffers`` (BatchNorm's running statistics and
    counter) taken from ``own``: the SSFL benchmark's official code averages only
    ``model.parameters()`` (its SyncAllreduce), so each model keeps its own statistics."""
    missing = sorted(set(buffers) - set(own))
    if missing:
        raise KeyError(f"buffers not in the model's own state: {missing[:3]}")
    return {key: (own[key] if key in buffers else value) for key, value in averaged.items()}


def assign_groups(ids: Sequence[int], num_groups: int, rng: np.random.Generator) -> list[list[int]]:
    """Shuffle ``ids`` into min(num_groups, len(ids)) groups of near-equal size (FedRGD).

    Every id lands in exactly one group; each group is sorted.
    """
    if num_groups < 1:
        raise ValueError("num_groups must be >= 1")
    order = rng.permutation(np.asarray(ids, dtype=np.int64))
    parts = np.array_split(order, min(num_groups, max(len(order), 1)))
    return [sorted(int(i) for i in part) for part in parts]


def group_average(
    server: State,
    users: Mapping[int, State],
    groups: Sequence[Sequence[int]],
    server_weight: float = 1.0,
) -> tuple[list[dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """FedRGD, SSFL benchmark eq. 7: the server's model joins every group.

    w_avg,i = (w_s + sum_{k in G_i} w_k) / (|G_i| + 1) for each group i, and
    w_avg = sum_i w_avg,i / S (the server's model weighted ``server_weight`` within each
    group, as in ``average_with_server``). Returns ([w_avg,1, ..., w_avg,S], w_avg).
    """
    if not groups:
        raise ValueError("group_average needs at least one group")
    per_group = [
        average_with_server(server, [users[k] for k in group], server_weight) for group in groups
    ]
    overall = weighted_average(per_group, [1.0] * len(per_group))
    return per_group, overall


def weight_diversity(updates: Sequence[np.ndarray]) -> float:
    """SSFL benchmark eq. 8: sum_i ||u_i||^2 / ||sum_i u_i||^2 over the users' updates u_i.

    u_i = w_i - (the model user i started the round from): the accumulated local
    gradient, so this is the gradient diversity of Yin et al. (2018): 1/n for n equal
    updates, 1 for orthogonal ones, inf when they cancel exactly.
    """
    if not updates:
        raise ValueError("weight_diversity needs at least one update")
    flat = np.stack([np.asarray(u, dtype=np.float64).ravel() for u in updates])
    spread = float((flat**2).sum())
    together = float((flat.sum(axis=0) ** 2).sum())
    if together == 0.0:
        return 0.0 if spread == 0.0 else float("inf")
    return spread / together

"""Aggregation rules on plain arrays (no Flower inside)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch


def weighted_average(
    updates: Sequence[Mapping[str, np.ndarray]],
    weights: Sequence[float],
    device: torch.device | str = "cpu",
) -> dict[str, np.ndarray]:
    """FedAvg (McMahan et al. 2017; FedSEAL eq. 2 with equal weights): sum_k w_k x_k / sum_k w_k.

    Floating arrays are summed in float64 torch tensors on ``device`` (the training device:
    the server's GPU in a GPU run), one update after another in the given order, and cast
    back: the same IEEE operations as float64 numpy, so the same bits on any device. Integer
    buffers (BatchNorm's num_batches_tracked) take the maximum. Callers sort the updates for
    bit-identical runs.
    """
    if not updates:
        raise ValueError("weighted_average needs at least one update")
    if len(updates) != len(weights):
        raise ValueError("one weight per update")
    w = np.asarray(weights, dtype=np.float64)
    if np.any(w < 0) or w.sum() <= 0:
        raise ValueError("weights must be non-negative and not all zero")
    shares = (w / w.sum()).tolist()
    out: dict[str, np.ndarray] = {}
    for key, first in updates[0].items():
        if np.issubdtype(first.dtype, np.floating):
            acc = torch.zeros(first.shape, dtype=torch.float64, device=device)
            for share, update in zip(shares, updates):
                acc += torch.as_tensor(update[key]).to(device, torch.float64) * share
            out[key] = acc.to(torch.as_tensor(first).dtype).cpu().numpy()
        else:
            out[key] = np.asarray(np.max(np.stack([u[key] for u in updates]), axis=0))
    return out


State = Mapping[str, np.ndarray]


@dataclass
class PartialSum:
    """A cohort worker's share of a plain mean (simulation.partial_sums): for its clients
    ``pids``, sum_k w_k x_k in float64 (integer buffers: their maximum) and sum_k w_k, so that
    the server divides the workers' sums instead of summing every client's model. With eq. 8
    requested, also sum_k ||u_k||^2 (``spread``) and sum_k u_k (``update_sum``) over the
    classifier's keys, u_k = w_k - the model k started from."""

    pids: list[int]
    sums: dict[str, np.ndarray]
    weight: float
    spread: float = 0.0
    update_sum: np.ndarray | None = None


def array_problem(
    arrays: Mapping[str, np.ndarray], expected: Mapping[str, torch.Tensor]
) -> str | None:
    """Why the decoded ``arrays`` are not a state dict like ``expected`` (the reliability
    issue's rule 2: exactly its keys, with the same shapes and dtypes, only finite values);
    None if they are."""
    missing, extra = sorted(set(expected) - set(arrays)), sorted(set(arrays) - set(expected))
    if missing or extra:
        return f"keys differ from the global model's (missing {missing[:3]}, extra {extra[:3]})"
    for key, tensor in expected.items():
        arr, dtype = arrays[key], numpy_dtype(tensor)
        if tuple(arr.shape) != tuple(tensor.shape):
            return f"'{key}' has shape {tuple(arr.shape)}, expected {tuple(tensor.shape)}"
        if arr.dtype != dtype:
            return f"'{key}' has dtype {arr.dtype}, expected {dtype}"
        if not np.isfinite(arr).all():
            return f"'{key}' holds non-finite values"
    return None


def numpy_dtype(tensor: torch.Tensor) -> str:
    """The dtype name an ArrayRecord gives ``tensor`` (e.g. float32, int64)."""
    return str(torch.empty(0, dtype=tensor.dtype).numpy().dtype)


def classifier_update(state: State, start: State, keys: Sequence[str]) -> np.ndarray:
    """u = w - w_start over ``keys``, flattened (eq. 8's update; float32 as the models)."""
    return np.concatenate([(state[k] - start[k]).ravel() for k in keys])


def partial_sum(
    pids: Sequence[int],
    states: Sequence[State],
    weights: Sequence[float],
    starts: Sequence[State] = (),
    diversity_keys: Sequence[str] = (),
) -> PartialSum:
    """The :class:`PartialSum` of ``states`` (one per partition in ``pids``, in that order)
    weighted by ``weights``; ``starts`` (each state's start model) only for eq. 8's terms,
    with ``diversity_keys``."""
    if not states or len(states) != len(weights) or len(states) != len(pids):
        raise ValueError("partial_sum needs one partition and one weight per state")
    sums: dict[str, np.ndarray] = {}
    for key, first in states[0].items():
        if np.issubdtype(first.dtype, np.floating):
            acc = np.zeros(first.shape, dtype=np.float64)
            for weight, state in zip(weights, states):
                acc += np.asarray(state[key], dtype=np.float64) * weight
            sums[key] = acc
        else:
            sums[key] = np.asarray(np.max(np.stack([s[key] for s in states]), axis=0))
    part = PartialSum(list(pids), sums, float(sum(weights)))
    if diversity_keys:
        updates = [
            classifier_update(state, start, diversity_keys).astype(np.float64)
            for state, start in zip(states, starts, strict=True)
        ]
        part.spread = float(sum((u**2).sum() for u in updates))
        part.update_sum = np.sum(updates, axis=0)
    return part


def mean_of_partial_sums(
    parts: Sequence[PartialSum], dtypes: Mapping[str, np.dtype], device: torch.device | str = "cpu"
) -> dict[str, np.ndarray]:
    """sum over the parts of their sums / sum of their weights, per key of ``dtypes`` (the
    model's, in its order) cast to its dtype (FedAvg, SSFL eq. 4-5 as one weighted mean);
    integer buffers take the maximum. Summed in float64 on ``device``, part after part in
    the given order."""
    if not parts:
        raise ValueError("mean_of_partial_sums needs at least one part")
    total = sum(p.weight for p in parts)
    if total <= 0:
        raise ValueError("the parts' weights must not sum to zero")
    out: dict[str, np.ndarray] = {}
    for key, dtype in dtypes.items():
        if np.issubdtype(dtype, np.floating):
            acc = torch.zeros(parts[0].sums[key].shape, dtype=torch.float64, device=device)
            for part in parts:
                acc += torch.as_tensor(part.sums[key]).to(device, torch.float64)
            out[key] = (acc / total).cpu().numpy().astype(dtype)
        else:
            out[key] = np.asarray(np.max(np.stack([p.sums[key] for p in parts]), axis=0))
    return out


def diversity_of_partial_sums(parts: Sequence[PartialSum]) -> float:
    """SSFL eq. 8 from the parts' terms: sum ||u_k||^2 / ||sum u_k||^2 (as
    :func:`weight_diversity` over every client's update)."""
    vectors = [p.update_sum for p in parts if p.update_sum is not None]
    if not vectors:
        raise ValueError("no part carries eq. 8's terms")
    spread = sum(p.spread for p in parts)
    together = float((np.sum(vectors, axis=0) ** 2).sum())
    if together == 0.0:
        return 0.0 if spread == 0.0 else float("inf")
    return spread / together


def average_with_server(
    server: State,
    users: Sequence[State],
    server_weight: float = 1.0,
    device: torch.device | str = "cpu",
) -> dict[str, np.ndarray]:
    """SSFL benchmark eq. 4-5: w_avg = (w_s + sum_{k in U} w_k) / (|U| + 1), equal weights.

    ``server_weight`` a (ours; 1 is eq. 4) gives (a w_s + sum_k w_k) / (a + |U|).
    """
    return weighted_average([server, *users], [server_weight] + [1.0] * len(users), device)


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
    device: torch.device | str = "cpu",
) -> tuple[list[dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """FedRGD, SSFL benchmark eq. 7: the server's model joins every group.

    w_avg,i = (w_s + sum_{k in G_i} w_k) / (|G_i| + 1) for each group i, and
    w_avg = sum_i w_avg,i / S (the server's model weighted ``server_weight`` within each
    group, as in ``average_with_server``). Returns ([w_avg,1, ..., w_avg,S], w_avg).
    """
    if not groups:
        raise ValueError("group_average needs at least one group")
    per_group = [
        average_with_server(server, [users[k] for k in group], server_weight, device)
        for group in groups
    ]
    overall = weighted_average(per_group, [1.0] * len(per_group), device)
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


# ----- Robust rules (the averaging step's options, aggregate.*) --------------------------
def coordinatewise(
    states: Sequence[State], reduce: Callable[[np.ndarray], np.ndarray]
) -> dict[str, np.ndarray]:
    """``reduce`` over the stacked floating arrays (float64, axis 0; cast back); integer
    buffers take the maximum, as in :func:`weighted_average`."""
    if not states:
        raise ValueError("a robust rule needs at least one update")
    out: dict[str, np.ndarray] = {}
    for key, first in states[0].items():
        stacked = np.stack([np.asarray(s[key]) for s in states])
        if np.issubdtype(first.dtype, np.floating):
            out[key] = np.asarray(reduce(stacked.astype(np.float64))).astype(first.dtype)
        else:
            out[key] = np.asarray(np.max(stacked, axis=0))
    return out


def coordinate_median(states: Sequence[State]) -> dict[str, np.ndarray]:
    """Coordinate-wise median of the models (Yin et al. 2018, Byzantine-robust distributed
    learning, median); an even count takes the mean of the two middle values."""
    return coordinatewise(states, lambda x: np.median(x, axis=0))


def trimmed_mean(states: Sequence[State], beta: float) -> dict[str, np.ndarray]:
    """Coordinate-wise beta-trimmed mean (Yin et al. 2018): per coordinate, drop the
    floor(beta n) largest and smallest values and average the rest (at least one stays)."""
    if not 0 <= beta < 0.5:
        raise ValueError("beta must be in [0, 0.5)")
    n = len(states)
    cut = min(int(np.floor(beta * n)), (n - 1) // 2)
    return coordinatewise(states, lambda x: np.sort(x, axis=0)[cut : n - cut].mean(axis=0))


def flat_vector(state: State) -> np.ndarray:
    """The floating arrays of a state, in key order, as one float64 vector."""
    parts = [
        np.asarray(v, dtype=np.float64).ravel()
        for v in state.values()
        if np.issubdtype(np.asarray(v).dtype, np.floating)
    ]
    return np.concatenate(parts) if parts else np.zeros(0)


def krum_scores(states: Sequence[State], f: int) -> np.ndarray:
    """Krum's score of each model (Blanchard et al. 2017): the sum of its squared distances
    to its n - f - 2 nearest other models (at least 1, at most n - 1)."""
    vectors = np.stack([flat_vector(s) for s in states])
    n = len(vectors)
    if n == 1:
        return np.zeros(1)
    dist = np.array([[float(((a - b) ** 2).sum()) for b in vectors] for a in vectors])
    neighbours = min(max(n - f - 2, 1), n - 1)
    return np.array([np.sort(np.delete(dist[i], i))[:neighbours].sum() for i in range(n)])


def krum_select(states: Sequence[State], f: int, m: int = 1) -> list[int]:
    """The indices of the m models with the lowest Krum scores, best first (ties: the
    lower index); m = 1 is Krum, m > 1 multi-Krum (Blanchard et al. 2017)."""
    if not 1 <= m <= len(states):
        raise ValueError("m must be in [1, the number of models]")
    order = np.argsort(krum_scores(states, f), kind="stable")
    return [int(i) for i in order[:m]]


def update_norm(model: State, start: State) -> float:
    """L2 norm of the update ``model - start`` over the floating arrays."""
    return float(np.linalg.norm(flat_vector(model) - flat_vector(start)))


def clip_update(model: State, start: State, bound: float) -> dict[str, np.ndarray]:
    """``start`` plus the update scaled to norm at most ``bound`` (norm bounding, Sun et al.
    2019, Can you really backdoor federated learning?); integer buffers are kept."""
    norm = update_norm(model, start)
    if norm <= bound:
        return dict(model)
    scale = bound / norm
    out: dict[str, np.ndarray] = {}
    for key, value in model.items():
        if np.issubdtype(value.dtype, np.floating):
            delta = np.asarray(value, np.float64) - np.asarray(start[key], np.float64)
            out[key] = (np.asarray(start[key], np.float64) + scale * delta).astype(value.dtype)
        else:
            out[key] = value
    return out

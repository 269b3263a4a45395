"""Simulated attacks of malicious clients (federation.attack), on plain arrays and tensors.

Who attacks is decided by the server each round (:func:`attackers`) and told to the client
in its round config; the client half applies the attack: to what it sends
(:func:`poisoned`: scale, sign_flip, noise, nan) or to the pseudo-labels it trains on
(:func:`flipped_labels`, :func:`flipped_logits`: label_flip).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import torch

# Kinds that change the model a client sends (the rest act during training).
MODEL_ATTACKS = ("scale", "sign_flip", "noise", "nan")


def attackers(
    sampled: Sequence[int], partitions: Sequence[int], fraction: float, rng: np.random.Generator
) -> list[int]:
    """The round's attackers among the ``sampled`` partitions: those in ``partitions``, and
    fraction x len(sampled) (rounded half up) more drawn by ``rng`` from the rest (all of it when
    fewer are left), sorted."""
    chosen = sorted(set(sampled) & set(partitions))
    rest = [pid for pid in sorted(sampled) if pid not in chosen]
    count = min(math.floor(fraction * len(sampled) + 0.5), len(rest))
    drawn = rng.choice(np.asarray(rest, dtype=np.int64), size=count, replace=False) if count else []
    return sorted(chosen + [int(pid) for pid in drawn])


def poisoned(
    kind: str,
    factor: float,
    sent: Mapping[str, np.ndarray],
    received: Mapping[str, np.ndarray],
    rng: np.random.Generator,
) -> dict[str, np.ndarray]:
    """The model an attacker sends instead of ``sent`` (its trained model), with update
    u = sent - received on the floating arrays; integer buffers are kept.

    scale: received + factor u (model-replacement boosting, Bagdasaryan et al. 2020);
    sign_flip: received - factor u (the sign-flipping attack, e.g. Li et al. 2019, RSA);
    noise: received + u + factor rms(u) N(0, 1) per coordinate (a Gaussian attack);
    nan: every floating value NaN (a broken client; the server's reply validation rejects it).
    """
    if kind not in MODEL_ATTACKS:
        raise ValueError(f"not a model attack: {kind!r}")
    floats = [k for k, v in sent.items() if np.issubdtype(v.dtype, np.floating)]
    update = {
        k: np.asarray(sent[k], np.float64) - np.asarray(received[k], np.float64) for k in floats
    }
    out = dict(sent)
    std = factor * update_rms(update.values()) if kind == "noise" else 0.0
    for key in floats:
        base, u = np.asarray(received[key], np.float64), update[key]
        if kind == "scale":
            value = base + factor * u
        elif kind == "sign_flip":
            value = base - factor * u
        elif kind == "noise":
            value = base + u + std * rng.standard_normal(u.shape)
        else:
            value = np.full(u.shape, np.nan)
        out[key] = value.astype(sent[key].dtype)
    return out


def update_rms(arrays: Iterable[np.ndarray]) -> float:
    """Root mean square over every coordinate of ``arrays`` (0 when there are none)."""
    parts = list(arrays)
    size = sum(a.size for a in parts)
    return float(np.sqrt(sum(float((a**2).sum()) for a in parts) / size)) if size else 0.0


def flipped_labels(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Label flipping c -> C - 1 - c (Fang et al. 2020, Local model poisoning attacks)."""
    return num_classes - 1 - labels


def flipped_logits(logits: torch.Tensor) -> torch.Tensor:
    """Logits whose class order is reversed: their argmax (the pseudo-label) is flipped as
    :func:`flipped_labels` and their confidence kept."""
    return logits.flip(dims=(1,))

"""Calibration of a classifier's confidence (issue 18's check of the server model).

A reliability diagram bins the predictions by their confidence max_k p_k and compares
each bin's mean confidence with its accuracy (Guo et al. 2017, "On Calibration of Modern
Neural Networks", section 2); the expected calibration error (ECE) is their gap weighted
by the bins' shares. The confident share is what FixMatch's and CRL's mask keeps
(max p >= tau, SSFL benchmark eq. 6), with the accuracy of its pseudo-labels.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def reliability_bins(probs: Tensor, labels: Tensor, bins: int) -> list[dict[str, float]]:
    """Per confidence bin of equal width over [0, 1] (the last one closed): its bounds, how
    many predictions fall in it, their mean confidence and their accuracy (0 when empty)."""
    conf, pred = probs.max(dim=1)
    right = (pred == labels).float()
    index = (conf * bins).long().clamp(max=bins - 1)
    count = torch.bincount(index, minlength=bins).float()
    conf_sum = torch.bincount(index, weights=conf, minlength=bins)
    right_sum = torch.bincount(index, weights=right, minlength=bins)
    filled = count.clamp(min=1.0)
    return [
        {
            "lower": i / bins,
            "upper": (i + 1) / bins,
            "count": int(count[i]),
            "confidence": float(conf_sum[i] / filled[i]),
            "accuracy": float(right_sum[i] / filled[i]),
        }
        for i in range(bins)
    ]


def expected_calibration_error(rows: list[dict[str, float]]) -> float:
    """ECE = sum_b (n_b / n) |acc_b - conf_b| over the bins of :func:`reliability_bins`."""
    total = sum(r["count"] for r in rows)
    if total == 0:
        return 0.0
    return sum(r["count"] * abs(r["accuracy"] - r["confidence"]) for r in rows) / total


def confident_share(probs: Tensor, labels: Tensor, threshold: float) -> dict[str, Any]:
    """The predictions with max p >= ``threshold``: their share, how many, the fraction of
    them that is right, and per predicted class how many are kept and right."""
    conf, pred = probs.max(dim=1)
    kept = conf >= threshold
    k = probs.shape[1]
    right = kept & (pred == labels)
    count = int(kept.sum())
    return {
        "threshold": threshold,
        "rate": count / max(len(labels), 1),
        "count": count,
        "accuracy": float(right.sum()) / count if count else 0.0,
        "kept_per_class": torch.bincount(pred[kept], minlength=k).tolist(),
        "right_per_class": torch.bincount(pred[right], minlength=k).tolist(),
    }


def calibration(probs: Tensor, labels: Tensor, threshold: float, bins: int) -> dict[str, Any]:
    """Accuracy, predictions per class, reliability diagram, ECE and the confident share of
    one set of predictions."""
    rows = reliability_bins(probs, labels, bins)
    conf, pred = probs.max(dim=1)
    some = len(labels) > 0
    return {
        "images": len(labels),
        "predicted_per_class": torch.bincount(pred, minlength=probs.shape[1]).tolist(),
        "accuracy": float((pred == labels).float().mean()) if some else 0.0,
        "mean_confidence": float(conf.mean()) if some else 0.0,
        "ece": expected_calibration_error(rows),
        "bins": rows,
        "confident": confident_share(probs, labels, threshold),
    }

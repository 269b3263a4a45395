"""FedSEAL's equations (Bian et al., FedSEAL): thresholds, self-ensemble, filtered sets, losses.

All functions work on batched tensors; equation numbers refer to the FedSEAL paper.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def class_thresholds(probs: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Class-wise confidence thresholds tau_m on the validation set (eq. 5).

    tau_m = sum_i p_m(x_i) 1{argmax p(x_i) = m} / #{i : y_i = m}. A class absent
    from the validation set gets tau = 1 (nothing of it passes the filter).
    """
    pred = probs.argmax(dim=1)
    conf = probs.gather(1, pred[:, None]).squeeze(1)
    numerator = torch.zeros(num_classes, dtype=probs.dtype, device=probs.device)
    numerator.index_add_(0, pred, conf)
    denominator = torch.bincount(labels, minlength=num_classes).to(probs.dtype)
    return torch.where(
        denominator > 0, numerator / denominator.clamp_min(1), torch.ones_like(numerator)
    )


def update_ensemble(previous: torch.Tensor | None, probs: torch.Tensor, count: int) -> torch.Tensor:
    """Running mean of predictions over the ``count`` models received so far (eq. 7-8).

    p_bar^t = (t - 1)/t p_bar^{t-1} + p^t / t, with t = ``count`` (1 for the first model).
    """
    if previous is None or count <= 1:
        return probs.clone()
    return previous * ((count - 1) / count) + probs / count


def positive_set(ensemble: torch.Tensor, tau: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Pseudo-labels y+ = argmax p_bar (eq. 9) and the mask p_bar[y+] >= tau[y+] (eq. 10)."""
    conf, labels = ensemble.max(dim=1)
    return labels, conf >= tau[labels]


def complementary_labels(
    ensemble: torch.Tensor, positive: torch.Tensor, theta: float, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Complementary labels y- drawn uniformly from {m : p_bar_m <= theta} (eq. 11).

    Returns the labels and the negative-set mask (eq. 12): not positive and at least
    one class at or below theta. Labels outside the mask are meaningless.
    """
    candidates = ensemble <= theta
    scores = torch.rand(ensemble.shape, generator=generator).to(ensemble.device)
    labels = torch.where(candidates, scores, torch.full_like(scores, -1.0)).argmax(dim=1)
    return labels, candidates.any(dim=1) & ~positive


def negative_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Complementary negative-learning loss: mean -log(1 - p_{y-}(x)) (eq. 15)."""
    p = torch.softmax(logits, dim=1).gather(1, labels[:, None]).squeeze(1)
    return -torch.log((1.0 - p).clamp_min(1e-7)).mean()


def positive_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy on the strongly augmented positives (eq. 14)."""
    return F.cross_entropy(logits, labels)


def lambda_ramp(round_: int, start: float, end: float, ramp_rounds: int) -> float:
    """lambda of eq. 13: linear from ``start`` at round 1 to ``end`` at round ramp_rounds + 1.

    The paper only says lambda starts small and grows; this linear ramp is our choice.
    """
    if ramp_rounds <= 0:
        return end
    frac = min(max(round_ - 1, 0) / ramp_rounds, 1.0)
    return start + (end - start) * frac


def split_batches(
    batches: list[torch.Tensor], positive: torch.Tensor, negative: torch.Tensor
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each batch's indices in D+ and in D- (eq. 10, 12: disjoint sets), in batch order: the
    same tensors as ``idx[positive[idx]]`` and ``idx[negative[idx]]``, with one host read for
    all the batches (their sizes) instead of two a batch."""
    if not batches:
        return []
    inside = [(positive[idx], negative[idx]) for idx in batches]
    sizes = torch.stack([torch.stack([p.sum(), n.sum()]) for p, n in inside]).tolist()
    out = []
    for idx, (pos, neg), (n_pos, n_neg) in zip(batches, inside, sizes, strict=True):
        group = torch.where(pos, 0, torch.where(neg, 1, 2))  # D+ first, then D-, then neither
        ordered = idx[torch.sort(group, stable=True).indices]
        out.append((ordered[:n_pos], ordered[n_pos : n_pos + n_neg]))
    return out

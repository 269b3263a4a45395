"""Losses of the baselines, on logits; every function returns a scalar tensor.

References: FixMatch (Sohn et al. 2020, eq. 4), UDA (Xie et al. 2020, eq. 3 and
training-signal annealing, section 3.2), FedProx (Li et al. 2020, eq. 2), the SSFL
benchmark (Zhang, Yao et al. 2020): self-training eq. 3 and the consistency loss eq. 6.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def confidence_mask(logits: torch.Tensor, threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Hard pseudo-labels argmax p and the mask max p >= threshold (no gradient)."""
    probs = torch.softmax(logits.detach(), dim=1)
    conf, labels = probs.max(dim=1)
    return labels, (conf >= threshold).float()


def fixmatch_loss(
    logits_weak: torch.Tensor, logits_strong: torch.Tensor, threshold: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """FixMatch unlabeled loss: mean_b 1(max p_weak >= tau) CE(argmax p_weak, p_strong).

    Returns the loss and the per-sample mask.
    """
    labels, mask = confidence_mask(logits_weak, threshold)
    per_sample = F.cross_entropy(logits_strong, labels, reduction="none")
    return (per_sample * mask).mean(), mask


# SSFL benchmark eq. 6 (CRL): pseudo-label from the weak view alpha(x) where max p >= tau,
# cross-entropy on the strong view A(x), averaged over the whole batch; FixMatch's loss.
crl_loss = fixmatch_loss


def selftrain_loss(
    logits: torch.Tensor, threshold: float, label_logits: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """SSFL benchmark eq. 3: mean_b 1(max p >= tau) CE(argmax p, p), p = f(alpha(x)).

    Pseudo-label and prediction come from the same weakly augmented view (traditional
    self-training): CRL with the strong view replaced by the weak one. ``label_logits``
    (default: ``logits``) are the same view's logits the pseudo-labels are read from,
    e.g. after distribution alignment.
    """
    return fixmatch_loss(logits if label_logits is None else label_logits, logits, threshold)


def uda_loss(
    logits_weak: torch.Tensor, logits_strong: torch.Tensor, threshold: float, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """UDA consistency: mean_b 1(max p_weak >= beta) KL(sharpen(p_weak, T) || p_strong)."""
    _, mask = confidence_mask(logits_weak, threshold)
    target = torch.softmax(logits_weak.detach() / temperature, dim=1)
    log_strong = F.log_softmax(logits_strong, dim=1)
    per_sample = (target * (torch.log(target.clamp_min(1e-12)) - log_strong)).sum(dim=1)
    return (per_sample * mask).mean(), mask


TSA_SCHEDULES = ("exp", "linear", "log")


def tsa_threshold(progress: float, schedule: str, num_classes: int) -> float:
    """UDA training-signal annealing eta_t = alpha_t (1 - 1/K) + 1/K for progress t/T in [0, 1]."""
    progress = min(max(progress, 0.0), 1.0)
    if schedule == "linear":
        alpha = progress
    elif schedule == "log":
        alpha = 1.0 - math.exp(-progress * 5.0)
    elif schedule == "exp":
        alpha = math.exp((progress - 1.0) * 5.0)
    else:
        raise ValueError(f"unknown TSA schedule {schedule!r} (allowed: linear, log, exp)")
    return alpha * (1.0 - 1.0 / num_classes) + 1.0 / num_classes


def tsa_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, eta: float) -> torch.Tensor:
    """Cross-entropy that ignores samples whose true-class probability already exceeds eta."""
    per_sample = F.cross_entropy(logits, labels, reduction="none")
    p_true = torch.softmax(logits.detach(), dim=1).gather(1, labels[:, None]).squeeze(1)
    keep = (p_true <= eta).float()
    return (per_sample * keep).sum() / keep.sum().clamp_min(1.0)


def proximal_term(model: nn.Module, anchor: list[torch.Tensor], mu: float) -> torch.Tensor:
    """FedProx: (mu / 2) * ||w - w_global||^2 over trainable parameters."""
    total = sum(((p - a) ** 2).sum() for p, a in zip(model.parameters(), anchor))
    return 0.5 * mu * total


class DistributionAligner:
    """Distribution alignment (ReMixMatch, Berthelot et al. 2020, section 3.2) on logits.

    p~ = Normalize(p * u / mean(p)), with u the uniform class distribution and mean(p) the
    running mean of the weak-view class probabilities over every batch seen so far (the
    current one included). Softmax is invariant to a shift of the logits, so the aligned
    logits are logits + log u - log mean(p): the pseudo-label and its confidence come
    from p~, without gradient.
    """

    def __init__(self, num_classes: int) -> None:
        self.total = torch.zeros(num_classes)
        self.count = 0

    def mean(self) -> torch.Tensor:
        """The running mean of the class probabilities (uniform before any batch)."""
        if self.count == 0:
            return torch.full_like(self.total, 1.0 / len(self.total))
        return self.total / self.count

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        logits = logits.detach()
        probs = torch.softmax(logits, dim=1)
        self.total = self.total.to(probs.device) + probs.sum(dim=0)
        self.count += len(probs)
        uniform = torch.full_like(self.total, 1.0 / len(self.total))
        return logits + torch.log(uniform) - torch.log(self.mean().clamp_min(1e-8))

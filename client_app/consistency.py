"""The local loop FixMatch and UDA share: weak/strong views of unlabeled batches.

Per step: a batch of unlabeled images, its weak and strong views in one forward
pass (views drawn ahead, about AUGMENT_GROUP images per augmentation call), the
method's unlabeled loss; plus cross-entropy on a labeled batch when the client has
labels (labels-at-client) and the FedProx term when proximal_mu > 0. A round is
client.epochs passes, or client.local_steps SGD steps when that is > 0.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from client_app.base import ClientHalf
from tasks.attack import flipped_logits
from tasks.augment import grouped_views
from tasks.losses import proximal_term
from tasks.train import cycled_batch, running_sum, set_lr

# (logits the pseudo-labels come from, logits the loss trains) -> (loss, per-sample mask)
UnlabeledLoss = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class PseudoLabelStats:
    """Counts for mask rate and pseudo-label accuracy against the hidden labels.

    Without labels (a node's own images) only the mask rate is reported. The counts stay
    on the device until :meth:`metrics` reads them (no host sync per step).
    """

    def __init__(self, labels_known: bool = True) -> None:
        self.seen = 0
        self.counts: torch.Tensor | None = None  # kept, kept and right, right
        self.labels_known = labels_known

    def update(
        self, logits_weak: torch.Tensor, mask: torch.Tensor, true_y: torch.Tensor | None
    ) -> None:
        kept = mask.bool()
        self.seen += mask.numel()
        right = kept.new_zeros(kept.shape)
        if true_y is not None:
            right = logits_weak.detach().argmax(dim=1) == true_y
        step = torch.stack([kept.sum(), (right & kept).sum(), right.sum()])
        self.counts = step if self.counts is None else self.counts + step

    def metrics(self) -> dict[str, float]:
        kept, kept_correct, correct = [0, 0, 0] if self.counts is None else self.counts.tolist()
        out = {"mask_rate": kept / max(self.seen, 1)}
        if self.labels_known:
            out["pseudo_label_accuracy"] = kept_correct / max(kept, 1)
            out["pseudo_label_accuracy_all"] = correct / max(self.seen, 1)
        return out


class ConsistencyClient(ClientHalf):
    """Local epochs (or steps) over the unlabeled data with a weak/strong consistency loss."""

    honours = ClientHalf.honours | {"client.local_steps", "lr_schedule.name", "client.proximal_mu"}
    attacks = ClientHalf.attacks | {"label_flip"}

    @staticmethod
    @abstractmethod
    def loss_of(algo: Any) -> UnlabeledLoss:
        """The method's unlabeled loss with its ``algo`` settings (also what ``ssfl sanity``
        trains centrally)."""

    @staticmethod
    def trains_strong_view(algo: Any) -> bool:
        """Whether the loss trains the strong view's logits (else the weak view's)."""
        return True

    @staticmethod
    def labels_in_eval_mode(algo: Any) -> bool:
        """Whether the pseudo-labels come from a separate eval-mode pass
        (``tasks.train.eval_mode_logits``) instead of the training pass."""
        return False

    def view_augments(self, weak, strong) -> tuple:
        """The augmentations whose views of each unlabeled batch :meth:`logits` takes."""
        return (weak, strong) if self.trains_strong_view(self.algo) else (weak,)

    def logits(self, views: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits of the weak and the strong view of a batch, in one forward pass."""
        return self.model(torch.cat(views)).chunk(2)

    def unlabeled_loss(
        self, logits_weak: torch.Tensor, logits_trained: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss, per-sample mask) of the method (:meth:`loss_of` its settings); a label_flip
        attacker's pseudo-labels are flipped (tasks.attack.flipped_logits)."""
        if self.attack == "label_flip":
            logits_weak = flipped_logits(logits_weak)
        return self.loss_of(self.algo)(logits_weak, logits_trained)

    def labeled_loss(self, step: int, weak) -> torch.Tensor:
        """Cross-entropy on one labeled batch (labels-at-client), cycling through the set."""
        d = self.data
        idx = cycled_batch(
            step, self.settings.client.batch_size, len(d.labeled_x), d.labeled_x.device
        )
        return F.cross_entropy(self.model(weak(d.labeled_x[idx])), d.labeled_y[idx])

    def train(self) -> dict[str, float]:
        d, ccfg = self.data, self.settings.client
        weak, strong = self.augmenters()
        opt = self.optimizer()
        mu = ccfg.proximal_mu
        anchor = [p.detach().clone() for p in self.model.parameters()] if mu > 0 else []
        stats, total, steps = PseudoLabelStats(d.true_y is not None), running_sum(d.x.device), 0
        round_steps = self.round_steps()
        self.model.train()
        batches = self.round_batches()
        for idx, views in grouped_views(d.x, batches, self.view_augments(weak, strong)):
            logits_weak, logits_strong = self.logits(views)
            loss_u, mask = self.unlabeled_loss(logits_weak, logits_strong)
            loss = self.algo.lambda_u * loss_u
            if len(d.labeled_x):
                loss = loss + self.labeled_loss(steps, weak)
            if mu > 0:
                loss = loss + proximal_term(self.model, anchor, mu)
            set_lr(opt, self.lr_at(steps, round_steps))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            stats.update(logits_weak, mask, None if d.true_y is None else d.true_y[idx])
            total += loss.detach().double()
            steps += 1
        return {
            "train_loss": float(total) / max(steps, 1),
            "local_steps": steps,
            **stats.metrics(),
        }

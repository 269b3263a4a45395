"""Client half of the SSFL benchmark (fedavg_with_server and fedrgd): T local steps of eq. 3 or 6.

``algo.loss: crl`` is the consistency regularization loss (eq. 6): pseudo-label from
the weak view alpha(x) where max p >= tau, cross-entropy on the strong view A(x)
(RandAugment n = 2, m = 10 with flip, crop and Cutout). ``algo.loss: selftrain`` is
traditional self-training (eq. 3): pseudo-label and prediction from the same weak view;
by default (``algo.selftrain_labels: eval``, the official code's ``--ue_loss SF``) the
pseudo-labels come from a gradient-free pass in eval mode (BatchNorm's running statistics)
before the training pass, ``train`` reads them off the training pass itself.
``algo.distribution_alignment`` (ours, not in the paper) takes the pseudo-labels and their
confidence from the weak-view probabilities aligned to a uniform class distribution
(ReMixMatch's distribution alignment, tasks/losses.py), for both losses.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from client_app.consistency import ConsistencyClient, UnlabeledLoss
from tasks.losses import DistributionAligner, crl_loss, selftrain_loss
from tasks.settings import MAX_CLIENTS, POSITIVE, ConsistencySettings, again, between, setting
from tasks.train import eval_mode_logits


@dataclass(frozen=True)
class PseudoLabelSettings(ConsistencySettings):
    """The SSFL benchmark's user keys (eq. 3 and 6): A(.) of eq. 6 is RandAugment(2, 10)."""

    threshold: float = again(ConsistencySettings, "threshold", 0.95)  # tau of eq. 3, 6 (3.3)
    loss: str = setting(
        "crl",
        "user loss: `crl` (eq. 6) or `selftrain` (eq. 3)",
        choices=("crl", "selftrain"),
        ref="SSFL benchmark eq. 3, 6",
    )
    selftrain_labels: str = setting(
        "eval",
        "self-training (eq. 3): the pass the pseudo-labels come from, `eval` (a separate "
        "gradient-free pass in eval mode, BatchNorm's running statistics: the official code's "
        "`--ue_loss SF`) or `train` (the training pass's own logits, batch statistics); CRL "
        "reads them off its training pass (as the official code)",
        choices=("eval", "train"),
        ref="SSFL benchmark eq. 3; official code train_LocalSGD.py",
    )
    distribution_alignment: bool = setting(
        False,
        "ours, not in the paper: pseudo-labels from weak-view probabilities aligned to "
        "uniform (ReMixMatch's distribution alignment)",
    )
    server_weight: float = setting(
        1.0,
        "ours: the server's model weighs a against each user's 1 in eq. 4 / eq. 7, "
        "(a w_s + sum_k w_k) / (a + C_k); 1 is the paper's",
        rule=POSITIVE,
        ref="SSFL benchmark eq. 4, 7",
    )


@dataclass(frozen=True)
class FedRGDSettings(PseudoLabelSettings):
    """FedRGD's keys: the benchmark's user keys and the number of groups."""

    groups: int = setting(
        2,
        "S, the number of groups of eq. 7 (SSFL benchmark 3.3 and 4.3: 2 on CIFAR-10 and SVHN)",
        rule=between(1, MAX_CLIENTS),
        ref="SSFL benchmark eq. 7",
    )


class PseudoLabelClient(ConsistencyClient):
    """One user of the SSFL benchmark: client.local_steps SGD steps on its unlabeled data."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.aligner = (
            DistributionAligner(self.data.num_classes) if self.algo.distribution_alignment else None
        )

    @staticmethod
    def trains_strong_view(algo: PseudoLabelSettings) -> bool:
        """Self-training (eq. 3) trains the weak view; CRL (eq. 6) the strong one."""
        return algo.loss != "selftrain"

    @staticmethod
    def loss_of(algo: PseudoLabelSettings) -> UnlabeledLoss:
        if algo.loss == "selftrain":
            return lambda weak, trained: selftrain_loss(trained, algo.threshold, weak)
        return lambda weak, trained: crl_loss(weak, trained, algo.threshold)

    @staticmethod
    def labels_in_eval_mode(algo: PseudoLabelSettings) -> bool:
        """Self-training with ``selftrain_labels: eval`` (eq. 3 as the official code)."""
        return algo.loss == "selftrain" and algo.selftrain_labels == "eval"

    def logits(self, views: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits the pseudo-labels come from, logits the loss trains)."""
        if not self.trains_strong_view(self.algo):
            eval_pass = self.labels_in_eval_mode(self.algo)
            labels = eval_mode_logits(self.model, views[0]) if eval_pass else None
            logits_trained = self.model(views[0])
            logits_weak = logits_trained if labels is None else labels
        else:
            logits_weak, logits_trained = super().logits(views)
        if self.aligner is not None:
            logits_weak = self.aligner(logits_weak)
        return logits_weak, logits_trained

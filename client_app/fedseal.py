"""FedSEAL's client half: self-ensemble filtering and positive/negative learning (eq. 7-16).

The ensemble is a running mean of the class probabilities of every global model
this client has received (eq. 8); it lives in the node's ``context.state`` and is
updated once per round in which the client is sampled. Rounds in which the client
is not sampled add nothing: the mean is over the models it actually received, so
``t`` in eq. 7-8 counts the client's own participations, not the server's rounds.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from flwr.app import ArrayRecord
from torch import nn

from client_app.base import ClientHalf
from tasks.attack import flipped_labels
from tasks.augment import augment_grouped, engine_class
from tasks.losses import proximal_term
from tasks.selfensemble import (
    complementary_labels,
    lambda_ramp,
    negative_loss,
    positive_loss,
    positive_set,
    split_batches,
    update_ensemble,
)
from tasks.settings import MAX_ROUNDS, UNIT, RandAugmentSettings, between, setting
from tasks.train import minibatches, predict_logits, running_sum

STATE_KEY = "fedseal"


@dataclass(frozen=True)
class FedSEALSettings(RandAugmentSettings):
    """FedSEAL's keys; the strong view A(.) of eq. 14 is RandAugment (4.2.3)."""

    strong_view: str = setting(
        "paper",
        "A(.) of eq. 14: `paper` = RandAugment(`randaugment_n`, `randaugment_m`) alone, as "
        "4.2.3 states it; `fixmatch` = FixMatch's strong view, the weak view (flip, shift by "
        "`augment.weak_shift`), RandAugment, then Cutout (ours, the default until 2026-11)",
        choices=("fixmatch", "paper"),
        ref="FedSEAL 4.2.3",
    )

    theta: float = setting(
        0.05, "complementary threshold theta of eq. 11", rule=UNIT, ref="FedSEAL 5.2.1"
    )
    lambda_start: float = setting(
        0.1,
        "lambda of eq. 13 at round 1 (the paper gives no formula for its growth: a linear "
        "ramp, ours)",
        rule=UNIT,
        ref="FedSEAL eq. 13",
    )
    lambda_end: float = setting(1.0, "lambda after the ramp", rule=UNIT, ref="FedSEAL eq. 13")
    lambda_ramp_rounds: int = setting(
        20,
        "rounds of the linear ramp (0: `lambda_end` from round 1)",
        rule=between(0, MAX_ROUNDS),
    )
    self_ensemble: bool = setting(
        True, "false: the current model only (Fig. 5 ablation)", ref="FedSEAL 5.2.5, Fig. 5"
    )
    negative_learning: bool = setting(
        True, "false: no negative set (5.2.3 ablation)", ref="FedSEAL 5.2.3"
    )
    classwise_threshold: bool = setting(
        True,
        "false: one `fixed_threshold` for all classes (5.2.4 ablation)",
        ref="FedSEAL eq. 5, 5.2.4",
    )
    fixed_threshold: float = setting(
        0.9, "the threshold when `classwise_threshold` is false", rule=UNIT
    )
    oracle_labels: bool = setting(
        False,
        "diagnostic, not the paper: label the positive set with the hidden true labels (the "
        "ceiling of better pseudo-labels; simulation only)",
    )
    tau_max: float = setting(
        1.0,
        "clip of eq. 5's tau, which exceeds 1 for a class the model over-predicts (1.0: the "
        "paper's range [0, 1])",
        rule=UNIT,
        ref="FedSEAL eq. 5",
    )


@functools.lru_cache(maxsize=4)
def paper_view(n: int, m: float, channels: int, device: str, engine: str = "kornia") -> nn.Module:
    """A(.) as FedSEAL 4.2.3 states it, RandAugment(n, m) alone, built once per process
    (``engine``: ``augment.engine``)."""
    return engine_class(engine, "randaugment")(n, m, channels).to(device)


class FedSEALClient(ClientHalf):
    """Local training on D+ (strong view, cross-entropy) and D- (complementary labels)."""

    honours = ClientHalf.honours | {"client.proximal_mu"}
    attacks = ClientHalf.attacks | {"label_flip"}

    def strong_view(self) -> nn.Module:
        """A(.) of eq. 14, as ``algo.strong_view`` names it."""
        algo = self.algo
        if algo.strong_view == "paper":
            return paper_view(
                algo.randaugment_n,
                algo.randaugment_m,
                self.data.channels,
                str(self.device),
                self.engine(),
            )
        return self.augmenters()[1]

    def ensemble(self, probs: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Update the stored self-ensemble with this round's predictions (eq. 8)."""
        if not self.algo.self_ensemble:
            return probs, 1
        previous, count = None, 0
        if STATE_KEY in self.state:
            record = self.state[STATE_KEY]
            previous = record["ensemble"].numpy()
            count = int(record["count"].numpy())
            previous = torch.from_numpy(previous).to(probs.device)
        count += 1
        ensemble = update_ensemble(previous, probs, count)
        self.state[STATE_KEY] = ArrayRecord(
            {"ensemble": ensemble.cpu(), "count": torch.tensor(count)}
        )
        return ensemble, count

    def train(self) -> dict[str, float]:
        d, algo = self.data, self.algo
        tau = self.content["tau"]["tau"].numpy()
        tau = torch.from_numpy(tau).to(self.device)
        logits = predict_logits(self.model, d.x, self.settings.eval.batch_size)
        ensemble, count = self.ensemble(torch.softmax(logits, dim=1))
        pos_labels, pos = positive_set(ensemble, tau)
        if algo.oracle_labels:
            pos_labels = self.true_labels()
        neg_labels, neg = complementary_labels(ensemble, pos, algo.theta, self.generator)
        if self.attack == "label_flip":  # both label sets, flipped c -> C - 1 - c
            pos_labels = flipped_labels(pos_labels, d.num_classes)
            neg_labels = flipped_labels(neg_labels, d.num_classes)
        if not algo.negative_learning:
            neg = torch.zeros_like(pos)
        lam = lambda_ramp(self.round, algo.lambda_start, algo.lambda_end, algo.lambda_ramp_rounds)
        loss_sum, steps = self.local_epochs(pos, pos_labels, neg, neg_labels, lam)
        known = d.true_y is not None  # label quality is measurable only where labels are known
        right = (pos_labels == d.true_y, neg_labels != d.true_y) if known else (pos, neg)
        values = torch.stack(  # read in one host sync; float32 means as float(...) gives them
            [
                loss_sum,
                pos.float().mean().double(),
                neg.float().mean().double(),
                *(t.sum().double() for t in (pos, right[0] & pos, neg, right[1] & neg)),
            ]
        ).tolist()
        total, pos_mean, neg_mean, n_pos, pos_right, n_neg, neg_right = values
        metrics = {
            "train_loss": total / max(steps, 1),
            "positive_fraction": pos_mean,
            "negative_fraction": neg_mean,
            "ensemble_size": float(count),
            "lambda": lam,
        }
        if known:
            metrics["pseudo_label_accuracy"] = pos_right / n_pos if n_pos else 0.0
            metrics["complementary_label_accuracy"] = neg_right / n_neg if n_neg else 0.0
        return metrics

    def true_labels(self) -> torch.Tensor:
        """The hidden labels of the local data (the oracle_labels diagnostic)."""
        if self.data.true_y is None:
            raise ValueError("algo.oracle_labels needs known labels; this node's images have none")
        return self.data.true_y

    def local_epochs(self, pos, pos_labels, neg, neg_labels, lam) -> tuple[torch.Tensor, int]:
        """E_c epochs of mini-batch SGD on lambda L+ + L- (eq. 13-16), plus the FedProx term
        when client.proximal_mu > 0 (ours: FedSEAL has none; off by default).

        Each batch of the local data contributes the mean loss of its positives (strong
        view, drawn for a group of batches at once) and of its negatives (plain view);
        batches with neither are skipped. Each epoch reads its batches' D+ and D- sizes
        in one host sync (tasks.selfensemble.split_batches); the loss sum stays on the
        device (float64).
        """
        d, ccfg = self.data, self.settings.client
        strong = self.strong_view()
        opt = self.optimizer()
        mu = ccfg.proximal_mu
        anchor = [p.detach().clone() for p in self.model.parameters()] if mu > 0 else []
        self.model.train()
        total, steps = running_sum(d.x.device), 0
        for _ in range(ccfg.epochs):
            batches = [
                idx.to(d.x.device) for idx in minibatches(len(d.x), ccfg.batch_size, self.generator)
            ]
            split = split_batches(batches, pos, neg)
            positives = augment_grouped(d.x, [p_idx for p_idx, _ in split], strong)
            for (_, n_idx), (p_idx, p_view) in zip(split, positives, strict=True):
                if len(p_idx) + len(n_idx) == 0:
                    continue
                logits = self.model(torch.cat([p_view, d.x[n_idx]]))
                loss = logits.new_zeros(())
                if len(p_idx):
                    loss = loss + lam * positive_loss(logits[: len(p_idx)], pos_labels[p_idx])
                if len(n_idx):
                    loss = loss + negative_loss(logits[len(p_idx) :], neg_labels[n_idx])
                if mu > 0:
                    loss = loss + proximal_term(self.model, anchor, mu)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                total += loss.detach().double()
                steps += 1
        return total, steps

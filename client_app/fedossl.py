"""Client half of FedoSSL (FedoSSL eq. 1-9, Algorithm 1 client update) and its baselines.

Per step, on a labeled batch of seen classes and an unlabeled batch (sizes in proportion
to the client's labeled and unlabeled counts, as ORCA's loaders), two weak views of each:

    L* = L_s + alpha L_u - w_H H(mean p) + beta R_i + gamma (w_ce L_ce + w_cl L_cluster)

L_s: eq. 2 with ORCA's uncertainty-adaptive margin; L_u: eq. 3 (pairs: same-class labeled
partner, nearest unlabeled neighbour); H: the official code's entropy regulariser;
R_i: eq. 5-6 with n^c from the round's start model on the unlabeled data; L_cal: eq. 7-9
against the global centroids from the server (from algo.cluster_from_round /
algo.ce_from_round). After training, 32 local centroids of 1,024 random local features by
Sinkhorn-balanced k-means, and per seen class the sum and count of labeled features, go
back with the model (when gamma != 0).

``algo.objective`` swaps the unsupervised part for a Table 2 baseline: ``nach`` (NACH's
filtered pairs and adaptive-threshold, distribution-aligned self-training on a strong
view, beside the supervised loss and -H) and ``semifl`` (SemiFL*: cross-entropy on the
labeled data and on a strong view of the unlabeled samples the round's global model
pseudo-labels, seen classes by confidence, unseen ones by clustering its
out-of-distribution samples; with algo.mix_weight, SemiFL's mixup term on them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord

from client_app.base import ClientHalf
from tasks.models import TRAINABLE, freeze_before_last_block
from tasks.openworld import (
    agreement_metrics,
    aligned_self_training,
    balanced_kmeans,
    beta_draw,
    calibration_loss,
    centroid_assignment,
    entropy_of_mean,
    filtered_pair_indices,
    forward,
    hard_pseudo_labels,
    learning_gap,
    margin_cross_entropy,
    mean_uncertainty,
    mixup_pseudo_loss,
    open_world_pseudo_labels,
    pair_indices,
    pairwise_loss,
    predict,
    role_agreement,
    role_codes,
    suppressed_loss,
)
from tasks.partition import SEEN, class_roles
from tasks.settings import (
    MAX_BATCH,
    MAX_EPOCHS,
    MAX_IMAGES,
    MAX_ROUNDS,
    MAX_STEPS,
    MAX_WIDTH,
    NON_NEGATIVE,
    POSITIVE,
    UNIT,
    RandAugmentSettings,
    Range,
    between,
    setting,
)
from tasks.train import set_lr, step_batches

OBJECTIVES = ("orca", "nach", "semifl")
PERSONAL = ("none", "head", "all")


@dataclass(frozen=True)
class FedoSSLSettings(RandAugmentSettings):
    """FedoSSL's keys (and its Table 2 baselines'); "code" is the official code (cugzj/FedoSSL).
    The strong view of NACH and SemiFL* is RandAugment (n, m)."""

    alpha: float = setting(
        1.0, "weight of the pairwise objective L_u", rule=NON_NEGATIVE, ref="FedoSSL eq. 1"
    )
    beta: float = setting(
        0.0,
        "weight of R_i, at the official code's scale (its L1 loss averages over the C "
        "classes); 0: R_i off, as the code (its term is commented out; paper: 1)",
        rule=NON_NEGATIVE,
        ref="FedoSSL eq. 4-6",
    )
    flip_suppressed: bool = setting(
        False, "true: R_i maximised, the official code's commented-out sign"
    )
    gamma: float = setting(
        1.0,
        "weight of L_cal (Fig. 5: 0.5 best); 0 = no calibration module, no centroids travel",
        rule=NON_NEGATIVE,
        ref="FedoSSL eq. 4, Fig. 5",
    )
    ce_weight: float = setting(
        1.0,
        "L_ce inside L_cal (0: Table 3's ablation without L_ce)",
        rule=NON_NEGATIVE,
        ref="FedoSSL eq. 7",
    )
    cluster_weight: float = setting(
        0.5, "L_cluster inside L_cal (code: 0.5; eq. 7: 1)", rule=NON_NEGATIVE, ref="FedoSSL eq. 7"
    )
    cluster_rows: str = setting(
        "batch",
        "the rows of L_cluster: `batch` = every sample of the batch with L_u's partners "
        "(labeled: a sample of its class; unlabeled: its nearest sample of the whole batch), "
        "as the code; `unlabeled` = the unlabeled samples and partners among them, eq. 9's "
        "wording",
        choices=("batch", "unlabeled"),
        ref="FedoSSL eq. 9",
    )
    entropy_weight: float = setting(
        1.0, "the official code's -H(mean p) regulariser (ORCA's)", rule=NON_NEGATIVE
    )
    tau: float = setting(
        0.2, "eq. 6's tau (code: 0.2)", rule=Range(0, 1, low_open=True), ref="FedoSSL eq. 6"
    )
    logit_scale: float = setting(
        10.0, "the cosine head's scale: 10 * <z^, w^_c> (code)", rule=POSITIVE
    )
    max_margin: float = setting(
        0.5,
        "cap of ORCA's adaptive margin u_bar: min(u_bar, 0.5) (code)",
        rule=NON_NEGATIVE,
        ref="FedoSSL eq. 2",
    )
    calibration_threshold: float = setting(
        0.95, "L_ce only on samples whose centroid assignment q exceeds it (code)", rule=UNIT
    )
    centroid_temperature: float = setting(
        0.1,
        "T of q = softmax(z^ . m / T) and of the server's clustering (code: 0.1)",
        rule=POSITIVE,
        ref="FedoSSL eq. 8-9",
    )
    cluster_from_round: int = setting(
        6,
        "L_cluster from this round on, whatever client.epochs is (code: `global_round > 4`, "
        "rounds counted from 0: the 6th round; Algorithm 1 has no gate: 1)",
        rule=between(1, MAX_ROUNDS),
        ref="FedoSSL Algorithm 1",
    )
    ce_from_round: int = setting(
        8,
        "L_ce from this round on (code: `global_round > 6`: the 8th round)",
        rule=between(1, MAX_ROUNDS),
        ref="FedoSSL Algorithm 1",
    )
    local_centroids: int = setting(
        32,
        "L local centroids per client (Fig. 1 step 1: 32 for 10 classes; at most "
        "`centroid_samples`)",
        rule=between(1, MAX_IMAGES),
        ref="FedoSSL Fig. 1",
    )
    global_centroids: int = setting(
        0,
        "global centroids (0 = the class count; more than one per class is refused)",
        rule=between(0, MAX_WIDTH),
    )
    centroid_samples: int = setting(
        1024,
        "local features the local centroids come from (code: a 1,024-feature memory)",
        rule=between(1, MAX_IMAGES),
    )
    kmeans_iters: int = setting(
        5,
        "iterations of the Sinkhorn-balanced k-means of the local centroids (code: "
        "models/resnet_s.py; SemiFL*'s too)",
        rule=between(0, MAX_STEPS),
    )
    local_sinkhorn_iters: int = setting(
        10,
        "Sinkhorn-Knopp rounds of each k-means assignment (code: `sknopp(..., max_iters=10)` "
        "in local_clustering); members are hard, each row to its largest weight (code)",
        rule=between(1, MAX_STEPS),
    )
    sinkhorn_sharpness: float = setting(25.0, "Sinkhorn's lambda (code: 25)", rule=POSITIVE)
    server_cluster_steps: int = setting(
        500, "SGD steps refining the global centroids (code: 500)", rule=between(0, MAX_STEPS)
    )
    server_cluster_lr: float = setting(
        0.01, "their rate (code: lr 0.01, momentum 0.9)", rule=POSITIVE
    )
    server_cluster_weight_decay: float = setting(
        1e-4, "their SGD weight decay (code: 1e-4)", rule=NON_NEGATIVE
    )
    weighted_average: bool = setting(
        True,
        "FedAvg by example counts n_i / n (section 3.1); false: uniform (code)",
        ref="FedoSSL 3.1",
    )
    personal: str = setting(
        "none",
        "`head`: FedRep, the classifier stays on each client (Fed-RO); `all`: no federation "
        "(Local-O)",
        choices=PERSONAL,
        ref="FedoSSL Table 2",
    )
    objective: str = setting(
        "orca",
        "the unsupervised part: `orca` (ORCA's pairs, FedoSSL's R_i and L_cal), `nach` "
        "(NACH's filtered pairs and self-training), `semifl` (SemiFL*: pseudo-labels from the "
        "round's global model; beta and gamma must be 0)",
        choices=OBJECTIVES,
        ref="FedoSSL Table 2",
    )
    pseudo_threshold: float = setting(
        0.95, "NACH's seen-class threshold; SemiFL's fixed one", rule=UNIT
    )
    ood_threshold: float = setting(
        0.5,
        "SemiFL* (ours): out of distribution when no seen class reaches it (at most "
        "`pseudo_threshold`)",
        rule=UNIT,
    )
    pseudo_from_round: int = setting(
        2,
        "SemiFL* (ours): the first round that pseudo-labels (SemiFL's server trains on the "
        "labels before clients pseudo-label; here round 1 trains on them alone)",
        rule=between(1, MAX_ROUNDS),
    )
    self_training_weight: float = setting(
        1.0, "NACH / SemiFL*: weight of the strong-view cross-entropy", rule=NON_NEGATIVE
    )
    mix_weight: float = setting(
        0.0,
        "SemiFL's mix term (semifl only; official code: modules.py): each pseudo-labeled sample "
        "mixed with a random unlabeled one; 0 = the fix term alone, as the Table 2 cells ran",
        rule=NON_NEGATIVE,
    )
    mixup_alpha: float = setting(
        0.75, "mixup's lambda ~ Beta(alpha, alpha) (official: 0.75)", rule=POSITIVE
    )
    pretrain_epochs: int = setting(
        0,
        "epochs of SimCLR on the clients' pooled images before round 1 (section 5's pretrained "
        "start; 0: from scratch), kept in the cache",
        rule=between(0, MAX_EPOCHS),
        ref="FedoSSL section 5",
    )
    pretrain_batch_size: int = setting(
        512,
        "that stage's batch (ours: the official checkpoint's is not given)",
        rule=between(2, MAX_BATCH),
    )
    pretrain_lr: float = setting(
        0.5,
        "that stage's SGD rate, cosine-decayed to 0 (ours; SimCLR: 0.3 x batch / 256, LARS)",
        rule=POSITIVE,
    )
    pretrain_temperature: float = setting(
        0.5, "that stage's NT-Xent tau (FedSup 5.1.1: 0.5)", rule=POSITIVE
    )
    pretrain_projector_dim: int = setting(
        128, "that stage's projector width (ours; thrown away after)", rule=between(1, MAX_WIDTH)
    )
    trainable: str = setting(
        "all",
        "`last_block`: section 5's second stage (as ORCA), everything before the model's last "
        "block frozen",
        choices=TRAINABLE,
        ref="FedoSSL section 5",
    )


LOSSES = {
    "orca": (
        "train_loss",
        "supervised_loss",
        "pairwise_loss",
        "suppressed_loss",
        "ce_loss",
        "cluster_loss",
    ),
    "nach": (
        "train_loss",
        "supervised_loss",
        "pairwise_loss",
        "suppressed_loss",
        "self_training_loss",
        "mask_rate",
        "pairs_kept",
    ),
    "semifl": ("train_loss", "supervised_loss", "pseudo_loss", "mix_loss", "mask_rate"),
}


@dataclass(frozen=True)
class RoundStart:
    """What the round's start model fixes for every step: n^c (eq. 6), ORCA's margin,
    NACH's learning gap, SemiFL*'s pseudo-labels and its mix partners' labels, the global
    centroids m, and which classes are seen (one flag per class)."""

    counts: torch.Tensor
    margin: torch.Tensor
    gap: float
    pseudo: torch.Tensor | None
    hard: torch.Tensor | None
    centroids: torch.Tensor | None
    seen: torch.Tensor
    agreement: torch.Tensor | None


class FedoSSLClient(ClientHalf):
    """Eq. 4 on the client's labeled seen and unlabeled data; local centroids back."""

    honours = ClientHalf.honours | {"client.local_steps", "lr_schedule.name"}

    def build_model(self) -> torch.nn.Module:
        """The model; with algo.trainable last_block, all before its last block frozen
        (section 5's second stage)."""
        model = super().build_model()
        if self.algo.trainable == "last_block":
            freeze_before_last_block(model)
        return model

    def seen_classes(self) -> list[int]:
        roles = class_roles(self.settings.split.class_roles, self.data.num_classes)
        return [c for c, r in enumerate(roles) if r == SEEN]

    def global_centroids(self) -> torch.Tensor | None:
        """m from the message (None: the calibration module is off)."""
        record = self.content.array_records.get("centroids")
        if record is None:
            return None
        return torch.from_numpy(record["global"].numpy()).to(self.device)

    def seen_flags(self) -> torch.Tensor:
        """One flag per class: seen or not."""
        flags = torch.zeros(self.data.num_classes, dtype=torch.bool, device=self.device)
        flags[self.seen_classes()] = True
        return flags

    def round_start(self) -> RoundStart:
        """n^c (argmax counts), ORCA's u_bar, NACH's gap and SemiFL*'s pseudo-labels, all
        from the round's start model on the unlabeled data."""
        a = self.algo
        seen = self.seen_flags()
        z, logits = predict(self.model, self.data.x, a.logit_scale, 1024)
        probs = F.softmax(logits, dim=1)
        predicted = probs.argmax(1)
        counts = torch.zeros(probs.shape[1], dtype=torch.long, device=probs.device)
        counts.scatter_add_(0, predicted, torch.ones_like(predicted))
        pseudo = None
        if a.objective == "semifl" and self.round < a.pseudo_from_round:
            pseudo = torch.full((len(probs),), -1, dtype=torch.long, device=probs.device)
        elif a.objective == "semifl":
            pseudo = open_world_pseudo_labels(
                probs,
                z,
                self.seen_classes(),
                a.pseudo_threshold,
                a.ood_threshold,
                a.kmeans_iters,
                self.generator,
            )
        centroids = self.global_centroids()
        return RoundStart(
            counts=counts,
            margin=mean_uncertainty(probs).clamp(max=a.max_margin),
            gap=learning_gap(probs, seen) if a.objective == "nach" else 0.0,
            pseudo=pseudo,
            hard=None if pseudo is None else hard_pseudo_labels(probs, pseudo),
            centroids=centroids,
            seen=seen,
            agreement=self.agreement(z, logits, centroids),
        )

    def agreement(
        self, z: torch.Tensor, logits: torch.Tensor, centroids: torch.Tensor | None
    ) -> torch.Tensor | None:
        """The calibration's diagnostic on the unlabeled samples (:func:`role_agreement`;
        None before global centroids exist or when the hidden labels are unknown)."""
        if centroids is None or self.data.true_y is None:
            return None
        q = centroid_assignment(z, centroids, self.algo.centroid_temperature)
        roles = class_roles(self.settings.split.class_roles, self.data.num_classes)
        return role_agreement(q, logits, role_codes(self.data.true_y, roles))

    def batch_sizes(self) -> tuple[int, int]:
        """(labeled, unlabeled) per step: client.batch_size shared by the counts (ORCA)."""
        n_l, n_u = len(self.data.labeled_x), len(self.data.x)
        batch = self.settings.client.batch_size
        lab = min(max(1, round(batch * n_l / max(n_l + n_u, 1))), n_l, batch - 1)
        return lab, batch - lab

    def step_loss(
        self, xl: torch.Tensor, yl: torch.Tensor, idx: torch.Tensor, start: RoundStart
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The objective's loss on one batch (``idx``: the unlabeled samples) and its terms
        in LOSSES order."""
        objective = self.algo.objective
        if objective == "semifl":
            return self.semifl_loss(xl, yl, idx, start)
        xu = self.data.x[idx.to(self.data.x.device)]
        if objective == "nach":
            return self.nach_loss(xl, yl, xu, start)
        return self.orca_loss(xl, yl, xu, start)

    def orca_loss(
        self, xl: torch.Tensor, yl: torch.Tensor, xu: torch.Tensor, start: RoundStart
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Eq. 4 on one batch."""
        a, weak = self.algo, self.weak_view()
        nl, scale = len(xl), a.logit_scale
        x = torch.cat([xl, xu])
        z, logits = forward(self.model, torch.cat([weak(x), weak(x)]), scale)
        z1, z2 = z.chunk(2)
        l1, l2 = logits.chunk(2)
        p1, p2 = F.softmax(l1, dim=1), F.softmax(l2, dim=1)
        l_s = margin_cross_entropy(l1[:nl], yl, start.margin, scale)
        pair = pair_indices(z1, yl, nl, self.generator)
        l_u = pairwise_loss(p1, p2, pair)
        r = suppressed_loss(p1[nl:], start.counts, a.tau)
        loss = l_s + a.alpha * l_u - a.entropy_weight * entropy_of_mean(p1)
        loss = loss + self.beta() * r
        zero = loss.new_zeros(())
        l_ce, l_cluster = zero, zero
        m = start.centroids
        if m is not None:
            w_ce = a.ce_weight * (self.round >= a.ce_from_round)
            w_cl = a.cluster_weight * (self.round >= a.cluster_from_round)
            if w_ce or w_cl:
                temp = a.centroid_temperature
                q1 = centroid_assignment(z1, m, temp)
                q2 = centroid_assignment(z2, m, temp)
                rows = slice(None)
                if a.cluster_rows == "unlabeled":
                    rows, pair = slice(nl, None), pair_indices(z1[nl:], yl[:0], 0)
                l_cal, ce, cluster = calibration_loss(
                    l1[nl:], q1[nl:], q1[rows], q2[rows], pair, a.calibration_threshold, w_ce, w_cl
                )
                loss = loss + a.gamma * l_cal
                l_ce = ce if w_ce else zero  # a term logs 0 while its gate is shut
                l_cluster = cluster if w_cl else zero
        return loss, [loss, l_s, l_u, r, l_ce, l_cluster]

    def nach_loss(
        self, xl: torch.Tensor, yl: torch.Tensor, xu: torch.Tensor, start: RoundStart
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """NACH on one batch: supervised loss (ORCA's margin; 0 in the NACH configs) +
        alpha x filtered pairwise loss - H(mean p) + beta R_i + the adaptive-threshold,
        distribution-aligned self-training on a strong view of the unlabeled samples
        (pseudo-labels from the second weak view)."""
        a = self.algo
        weak, strong = self.augmenters()
        nl, scale = len(xl), a.logit_scale
        x = torch.cat([xl, xu])
        z, logits = forward(self.model, torch.cat([weak(x), weak(x), strong(xu)]), scale)
        z1 = z[: len(x)]
        l1, l2, l_strong = logits[: len(x)], logits[len(x) : 2 * len(x)], logits[2 * len(x) :]
        p1, p2 = F.softmax(l1, dim=1), F.softmax(l2, dim=1)
        l_s = margin_cross_entropy(l1[:nl], yl, start.margin, scale)
        pair, kept = filtered_pair_indices(z1, yl, nl, self.generator)
        l_u = pairwise_loss(p1, p2, pair)
        r = suppressed_loss(p1[nl:], start.counts, a.tau)
        l_st, mask = aligned_self_training(
            l_strong, p2[nl:], start.seen, start.gap, a.pseudo_threshold
        )
        loss = l_s + a.alpha * l_u - a.entropy_weight * entropy_of_mean(p1)
        loss = loss + self.beta() * r + a.self_training_weight * l_st
        rates = [mask.float().mean(), kept.float().mean()]
        return loss, [loss, l_s, l_u, r, l_st, *rates]

    def semifl_loss(
        self, xl: torch.Tensor, yl: torch.Tensor, idx: torch.Tensor, start: RoundStart
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """SemiFL* on one batch: cross-entropy on a weak view of the labeled samples, plus
        self_training_weight x cross-entropy on a strong view of the pseudo-labeled
        unlabeled samples (averaged over all unlabeled samples, as FixMatch), plus
        mix_weight x SemiFL's mix term: each pseudo-labeled sample's weak view mixed with
        the weak view of a random unlabeled sample of the client, lambda ~ Beta(mixup_alpha,
        mixup_alpha) once a step (official code: modules.py ``fix-mix``, alpha 0.75),
        summed over them and divided by the unlabeled batch as the term before it."""
        a, d = self.algo, self.data
        weak, strong = self.augmenters()
        xu = d.x[idx.to(d.x.device)]
        pseudo = start.pseudo[idx.to(start.pseudo.device)]
        mask = pseudo >= 0
        views = [weak(xl), strong(xu)]
        mix = a.mix_weight > 0 and bool(mask.any())
        if mix:
            lam = beta_draw(a.mixup_alpha, self.generator)
            partner = torch.randint(len(d.x), (int(mask.sum()),), generator=self.generator)
            x_partner = d.x[partner.to(d.x.device)]
            views.append(lam * weak(xu[mask]) + (1.0 - lam) * weak(x_partner))
        _, logits = forward(self.model, torch.cat(views), a.logit_scale)
        nl, nu = len(xl), len(xu)
        l_s = F.cross_entropy(logits[:nl], yl)
        ce = F.cross_entropy(logits[nl : nl + nu], pseudo.clamp_min(0), reduction="none")
        l_p = (ce * mask).mean()
        l_mix = logits.new_zeros(())
        if mix:
            y_partner = start.hard[partner.to(start.hard.device)]
            l_mix = mixup_pseudo_loss(logits[nl + nu :], pseudo[mask], y_partner, lam).sum() / nu
        loss = l_s + a.self_training_weight * l_p + a.mix_weight * l_mix
        return loss, [loss, l_s, l_p, l_mix, mask.float().mean()]

    def beta(self) -> float:
        """R_i's weight with its sign (algo.flip_suppressed: R_i maximised)."""
        return -self.algo.beta if self.algo.flip_suppressed else self.algo.beta

    def train(self) -> dict[str, float]:
        d, ccfg = self.data, self.settings.client
        start = self.round_start()
        names = LOSSES[self.algo.objective]
        opt = self.optimizer()
        lab, unl = self.batch_sizes()
        round_steps = self.round_steps(len(d.x))
        totals = torch.zeros(len(names), device=d.x.device)
        steps = 0
        self.model.train()
        batches = step_batches(len(d.x), unl, self.generator, ccfg.epochs, ccfg.local_steps)
        for idx in batches:
            lidx = torch.randperm(len(d.labeled_x), generator=self.generator)[:lab]
            lidx = lidx.to(d.labeled_x.device)
            loss, terms = self.step_loss(d.labeled_x[lidx], d.labeled_y[lidx], idx, start)
            set_lr(opt, self.lr_at(steps, round_steps))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            totals += torch.stack([t.detach().float() for t in terms])
            steps += 1
        losses, agreement = self.round_metrics(names, totals / max(steps, 1), start)
        return losses | {"local_steps": steps} | agreement

    @staticmethod
    def round_metrics(
        names: Sequence[str], means: torch.Tensor, start: RoundStart
    ) -> tuple[dict[str, float], dict[str, float]]:
        """The loss terms' means with the margin, and the agreement table's metrics, read in
        one host copy."""
        parts = [means.float(), start.margin.reshape(1).float().to(means.device)]
        if start.agreement is not None:
            parts.append(start.agreement.flatten().to(means.device))
        values = torch.cat(parts).tolist()
        losses = dict(zip(names, values)) | {"margin": values[len(names)]}
        return losses, agreement_metrics(values[len(names) + 1 :])

    def local_centroids(self) -> dict[str, torch.Tensor]:
        """Fig. 1 step 1: L centroids of algo.centroid_samples random local features
        (labeled and unlabeled), and per seen class the sum and count of labeled features."""
        a, d = self.algo, self.data
        x = torch.cat([d.labeled_x, d.x])
        pick = torch.randperm(len(x), generator=self.generator)[: a.centroid_samples]
        z, _ = predict(self.model, x[pick.to(x.device)], a.logit_scale, 1024)
        local = balanced_kmeans(
            z,
            a.local_centroids,
            a.kmeans_iters,
            a.sinkhorn_sharpness,
            self.generator,
            a.local_sinkhorn_iters,
        )
        zl, _ = predict(self.model, d.labeled_x, a.logit_scale, 1024)
        zl = F.normalize(zl, dim=1)
        seen = torch.tensor(self.seen_classes(), device=zl.device)
        member = (d.labeled_y[:, None] == seen[None, :]).to(zl.dtype)
        return {"local": local, "seen_sums": member.T @ zl, "seen_counts": member.sum(0)}

    def reply_arrays(self) -> dict[str, ArrayRecord]:
        out = super().reply_arrays()
        if self.algo.gamma != 0.0:
            centroids = self.local_centroids()
            out["centroids"] = ArrayRecord({k: v.detach().cpu() for k, v in centroids.items()})
        return out

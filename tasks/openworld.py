"""Open-world semi-supervised learning of FedoSSL (Zhang et al., ICML 2023), Flower-free.

Equations are those of the FedoSSL paper (../shared/papers/fedossl.txt): the ORCA-style
supervised loss (eq. 2 with ORCA's uncertainty-adaptive margin), the pairwise objective
(eq. 3), the uncertainty-aware suppressed loss R_i (eq. 5-6), the calibration loss
L_cal = L_ce + L_cluster (eq. 7-9), Sinkhorn-Knopp clustering of local and global
centroids (Fig. 1 steps 1 and 4) and the Hungarian-matched accuracies of section 5; and
the parts of two Table 2 baselines: NACH's filtered pairs and adaptive-threshold
self-training (Fed-AN, Fed-RN, Local-N, Cen-N) and SemiFL's pseudo-labels extended to
unseen classes (SemiFL*).
Open choices follow the official code, GitHub cugzj/FedoSSL (fedossl_cifar.py,
models/resnet_s.py), as ../shared/notes/fedossl-fedsup.md records them.
SciPy is imported inside the functions that use it: a process starts without it (about
0.4 s of every client's and the CLI's start; docs/benchmarks.md, start-up).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tasks.models import embedding, head_of
from tasks.train import torch_threads

EPS = 1e-7


# ----- Model outputs -------------------------------------------------------------------
def cosine_logits(z: Tensor, weight: Tensor, scale: float) -> Tensor:
    """The cosine head of ORCA and FedoSSL: scale * <z^, w^_c> over all C classes."""
    return scale * F.normalize(z, dim=1) @ F.normalize(weight, dim=1).T


def forward(model: nn.Module, x: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """(embedding z, cosine logits) of images ``x`` (the head's bias is not used)."""
    z = embedding(model, x)
    return z, cosine_logits(z, head_of(model).weight, scale)


@torch.no_grad()
def predict(model: nn.Module, x: Tensor, scale: float, batch_size: int) -> tuple[Tensor, Tensor]:
    """(embeddings, logits) of ``x`` in eval mode, batched; empty ones for no images (a client
    without labeled images)."""
    model.eval()
    starts = range(0, max(len(x), 1), batch_size)
    parts = [forward(model, x[i : i + batch_size], scale) for i in starts]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


# ----- Sinkhorn-Knopp ------------------------------------------------------------------
def sinkhorn(scores: Tensor, iters: int = 3, tol: float = 0.0) -> Tensor:
    """Equal-size soft assignment of N rows to K columns (Cuturi 2013; Genevay et al. 2019).

    Returns P (N x K) proportional to exp(scores) with every row summing to 1/N and every
    column to 1/K, by alternate normalisation in the log domain: ``iters`` rounds, or fewer
    once the largest column-marginal error (relative to 1/K) is below ``tol`` (read off the
    column sums each round computes anyway).
    """
    n, k = scores.shape
    log_p = scores - scores.max()
    log_r, log_c = -float(np.log(n)), -float(np.log(k))
    for _ in range(iters):
        col = torch.logsumexp(log_p, dim=0, keepdim=True)
        if tol and (col - log_c).exp().sub(1).abs().max() < tol:
            break
        log_p = log_p - col + log_c
        log_p = log_p - torch.logsumexp(log_p, dim=1, keepdim=True) + log_r
    return log_p.exp()


def balanced_kmeans(
    x: Tensor,
    k: int,
    iters: int = 5,
    sharpness: float = 25.0,
    generator=None,
    sinkhorn_iters: int = 10,
) -> Tensor:
    """k unit-norm centroids of the rows of ``x`` by Sinkhorn-balanced spherical k-means.

    The local-centroid step of Fig. 1 (1), as the official code's ``local_clustering``
    (models/resnet_s.py): centroids start at k random rows; each of ``iters`` rounds assigns
    every row to its column of largest Sinkhorn-Knopp weight (``sinkhorn_iters`` rounds on
    ``sharpness`` * cosine: near-equal clusters) and moves each centroid to the normalised
    mean of its hard members; a centroid without members takes a random row. The random
    rows are drawn every round, used or not, so that no value is read back to the host.
    """
    x = F.normalize(x, dim=1)
    start = torch.randperm(len(x), generator=generator)[:k].to(x.device)
    centroids = x[start]
    for _ in range(iters):
        assignment = sinkhorn(sharpness * x @ centroids.T, iters=sinkhorn_iters)
        members = F.one_hot(assignment.argmax(1), k).to(x.dtype)
        sums = members.T @ x
        spare = x[torch.randint(len(x), (k,), generator=generator).to(x.device)]
        empty = members.sum(0)[:, None] == 0
        centroids = F.normalize(torch.where(empty, spare, sums), dim=1)
    return centroids


def cluster_global_centroids(
    centroids: Tensor,
    local: Tensor,
    steps: int = 500,
    lr: float = 0.01,
    temperature: float = 0.1,
    sharpness: float = 25.0,
    weight_decay: float = 1e-4,
) -> Tensor:
    """Server step (4) of Fig. 1: the global centroids m (C x d) refined on all local ones.

    ``steps`` SGD steps (momentum 0.9, ``weight_decay``: the code's 1e-4) on
    -cos(SK(m . Z^), softmax(m . Z^ / T)) with Z^ the normalised local centroids, Sinkhorn
    to error < 1e-2 (at most 100 iterations), rows of m renormalised after each step
    (official code, models/resnet_s.py global_clustering).
    """
    m = F.normalize(centroids.detach().clone(), dim=1).requires_grad_(True)
    z = F.normalize(local.detach(), dim=1)
    opt = torch.optim.SGD([m], lr=lr, momentum=0.9, weight_decay=weight_decay)
    with torch_threads(1):  # (C x d) matrices: threads only add synchronisation
        for _ in range(steps):
            scores = z @ m.T
            with torch.no_grad():
                target = sinkhorn(sharpness * scores, iters=100, tol=1e-2)
            probs = F.softmax(scores / temperature, dim=1)
            loss = -F.cosine_similarity(target, probs, dim=1).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            with torch.no_grad():
                m.copy_(F.normalize(m, dim=1))
    return m.detach()


def claim_seen_rows(centroids: Tensor, seen_means: Tensor, seen: Sequence[int]) -> Tensor:
    """Reorder the global centroids so that row c of seen class c is the centroid nearest
    (cosine, one-to-one by the Hungarian algorithm) to class c's labeled-feature mean; the
    other centroids keep their order in the remaining rows (ours: the code is greedy)."""
    from scipy.optimize import linear_sum_assignment

    sim = F.normalize(seen_means, dim=1) @ F.normalize(centroids, dim=1).T
    _, cols = linear_sum_assignment(-sim.cpu().numpy())
    order = [-1] * len(centroids)
    for c, col in zip(seen, cols):
        order[c] = int(col)
    rest = iter(i for i in range(len(centroids)) if i not in set(cols.tolist()))
    order = [o if o >= 0 else next(rest) for o in order]
    return centroids[order]


# ----- Losses --------------------------------------------------------------------------
def mean_uncertainty(probs: Tensor) -> Tensor:
    """ORCA's u_bar = 1 - mean max-softmax over unlabeled predictions (a 0-dim tensor: no
    host sync)."""
    return 1.0 - probs.max(dim=1).values.mean()


def margin_cross_entropy(logits: Tensor, y: Tensor, margin: Tensor | float, scale: float) -> Tensor:
    """Eq. 2 with ORCA's uncertainty-adaptive margin: CE after adding scale * margin to the
    target logit (official code fedossl_cifar.py: margin = min(u_bar, 0.5), scale 10). The
    product is formed in float64 and rounded once to the logits' dtype, whether ``margin``
    is a Python float or a device tensor."""
    shift = torch.as_tensor(margin, dtype=torch.float64, device=logits.device) * scale
    one_hot = F.one_hot(y, logits.shape[1]).to(logits.dtype)
    return F.cross_entropy(logits + one_hot * shift.to(logits.dtype), y)


def pair_indices(features: Tensor, labels: Tensor, num_labeled: int, generator=None) -> Tensor:
    """The partner of each sample for eq. 3: for a labeled sample a random other labeled
    sample of its class (itself when it is alone), for an unlabeled one its nearest other
    sample in the batch by cosine (ORCA's rule)."""
    f = F.normalize(features.detach(), dim=1)
    sim = f @ f.T
    sim.fill_diagonal_(-2.0)
    pair = sim.argmax(dim=1)
    if num_labeled:
        y = labels[:num_labeled]
        same = (y[:, None] == y[None, :]).float()
        same.fill_diagonal_(0.0)
        same.diagonal().copy_(same.sum(dim=1) == 0)  # alone: itself, without a host sync
        noise = torch.rand(same.shape, generator=generator).to(same.device)
        pair[:num_labeled] = (same * (noise + 1.0)).argmax(dim=1)
    return pair


def pairwise_loss(probs: Tensor, probs_other_view: Tensor, pair: Tensor) -> Tensor:
    """Eq. 3 as the code computes it: BCE(<p(x_j), p'(x_pair(j))>, 1) = -log of the inner
    product of a sample's prediction and its partner's prediction on the second view."""
    inner = (probs * probs_other_view[pair]).sum(dim=1)
    return -torch.log(inner.clamp_min(EPS)).mean()


def entropy_of_mean(probs: Tensor) -> Tensor:
    """H(mean_j p(x_j)): ORCA's and the official code's regulariser, subtracted from the
    loss (weight algo.entropy_weight) so that not all samples fall in a few classes."""
    mean = probs.mean(dim=0)
    return -(mean * torch.log(mean.clamp_min(EPS))).sum()


def suppressed_loss(probs: Tensor, counts: Tensor, tau: float) -> Tensor:
    """R_i of eq. 5-6 at the official code's scale: mean_j |rho(n^c) (1 - max_c p(x_j))| / C,
    rho(n^c) = -tau^(1 - n^c/n_max) for c = argmax p(x_j); ``counts`` holds n^c, the samples
    predicted as each class. The code's L1 loss between p(x_j) and p(x_j) with its top entry
    set to 1 averages over the C classes, hence the 1 / C."""
    conf, cls = probs.max(dim=1)
    share = counts.to(probs.dtype) / counts.max().clamp_min(1)
    rho = -torch.pow(torch.as_tensor(tau, dtype=probs.dtype), 1.0 - share[cls])
    return (rho * (1.0 - conf)).abs().mean() / probs.shape[1]


def centroid_assignment(z: Tensor, centroids: Tensor, temperature: float) -> Tensor:
    """q(z; m) of eq. 8-9: softmax(z^ . m / T) over the global centroids."""
    return F.softmax(F.normalize(z, dim=1) @ centroids.T / temperature, dim=1)


def calibration_ce(logits: Tensor, q: Tensor, threshold: float) -> Tensor:
    """L_ce of eq. 8: CE between the centroid assignment's argmax and the classifier on the
    unlabeled samples whose max q exceeds ``threshold`` (code: 0.95); 0 when none does. A
    masked mean over the batch, so the kept count never goes to the host."""
    conf, target = q.detach().max(dim=1)
    keep = (conf > threshold).to(logits.dtype)
    ce = F.cross_entropy(logits, target, reduction="none")
    return (ce * keep).sum() / keep.sum().clamp_min(1.0)


def cluster_loss(q: Tensor, q_other_view: Tensor, pair: Tensor) -> Tensor:
    """L_cluster of eq. 9: H(q(z_j), q(z_bar_j)), the cross-entropy between a sample's
    centroid assignment and its partner's on the second view (gradients through both)."""
    return -(q * torch.log(q_other_view[pair].clamp_min(EPS))).sum(dim=1).mean()


ROLE_NAMES = ("seen", "lu", "gu")


def role_codes(true_y: Tensor, roles: str) -> Tensor:
    """Each sample's class role as 0 (seen), 1 (locally unseen) or 2 (globally unseen), from
    ``roles``: one letter S, L or G per class."""
    table = torch.tensor(["SLG".index(r) for r in roles], device=true_y.device)
    return table[true_y]


def role_agreement(q: Tensor, logits: Tensor, codes: Tensor) -> Tensor:
    """How often argmax q (L_ce's target, eq. 8) equals the classifier's argmax, per class
    role of the samples' hidden labels (``codes``: :func:`role_codes`). Returns a (2, 3)
    tensor, no host sync: the share of agreeing samples and the sample count for seen, LU
    and GU; :func:`agreement_metrics` reads it."""
    same = (q.argmax(1) == logits.argmax(1)).float()
    member = (codes.to(same.device)[:, None] == torch.arange(3, device=same.device)).float()
    counts = member.sum(dim=0)
    return torch.stack([same @ member / counts.clamp_min(1.0), counts])


def agreement_metrics(values: Sequence[float]) -> dict[str, float]:
    """:func:`role_agreement`'s table read back (shares, then counts) as q_agree_seen,
    q_agree_lu and q_agree_gu; a role no sample has is left out."""
    shares, counts = values[:3], values[3:]
    return {f"q_agree_{n}": s for n, s, c in zip(ROLE_NAMES, shares, counts) if c > 0}


def calibration_loss(
    logits: Tensor,
    q_unlabeled: Tensor,
    q: Tensor,
    q_other_view: Tensor,
    pair: Tensor,
    threshold: float,
    ce_weight: float = 1.0,
    cluster_weight: float = 1.0,
) -> tuple[Tensor, Tensor, Tensor]:
    """Eq. 7: L_cal = L_ce + L_cluster (each weighted: the ablations of Table 3 set one to
    0); L_ce on the unlabeled samples' ``logits`` and ``q_unlabeled``, L_cluster on the rows
    of ``q`` with their partners ``pair`` in ``q_other_view``; returns (L_cal, L_ce,
    L_cluster)."""
    l_ce = calibration_ce(logits, q_unlabeled, threshold)
    l_cluster = cluster_loss(q, q_other_view, pair)
    return ce_weight * l_ce + cluster_weight * l_cluster, l_ce, l_cluster


# ----- NACH (Guo et al., NeurIPS 2022), the Fed-AN / Fed-RN baselines --------------------
# NACH has no official code; open choices follow the third-party version the note names,
# GitHub pitlover/OpenWorldSSL (model/nach.py, model/others/loss.py, wrapper/NACHWrapper.py).
def filtered_pair_indices(
    features: Tensor, labels: Tensor, num_labeled: int, generator=None
) -> tuple[Tensor, Tensor]:
    """NACH's filtered pairs: as :func:`pair_indices`, except that an unlabeled sample keeps
    its nearest neighbour j only when it is at least as close to j (cosine) as j's second
    closest labeled sample is; otherwise its partner is itself (its own second view).
    Returns (pair, kept) with ``kept`` one flag per unlabeled sample."""
    pair = pair_indices(features, labels, num_labeled, generator)
    unlabeled = torch.arange(num_labeled, len(features), device=pair.device)
    kept = torch.ones(len(unlabeled), dtype=torch.bool, device=pair.device)
    if num_labeled == 0 or len(unlabeled) == 0:
        return pair, kept
    f = F.normalize(features.detach(), dim=1)
    neighbour = pair[num_labeled:]
    own = (f[unlabeled] * f[neighbour]).sum(dim=1)
    to_labeled = f[:num_labeled] @ f[neighbour].T
    k = min(2, num_labeled)
    bar = to_labeled.topk(k, dim=0).values[k - 1]
    kept = own >= bar
    pair[num_labeled:] = torch.where(kept, neighbour, unlabeled)
    return pair, kept


def learning_gap(probs: Tensor, seen: Tensor) -> float:
    """NACH's gap between the learning of seen and unseen classes: the mean max-softmax of
    the samples predicted as a seen class minus that of the samples predicted as an unseen
    class (0 for a side no sample falls on). ``seen``: one flag per class."""
    conf, cls = probs.max(dim=1)
    on_seen = seen[cls]
    seen_conf = conf[on_seen].mean() if on_seen.any() else conf.new_zeros(())
    unseen_conf = conf[~on_seen].mean() if (~on_seen).any() else conf.new_zeros(())
    return float(seen_conf - unseen_conf)


def nach_thresholds(targets: Tensor, seen: Tensor, gap: float, threshold: float) -> Tensor:
    """NACH's adaptive thresholds per pseudo-label: ``threshold`` for a seen class,
    threshold - min(2 gap, 0.5) for an unseen one (easier while unseen classes lag)."""
    unseen = threshold - min(2.0 * gap, 0.5)
    return torch.where(seen[targets], threshold, unseen)


def aligned_self_training(
    logits_strong: Tensor, probs_weak: Tensor, seen: Tensor, gap: float, threshold: float
) -> tuple[Tensor, Tensor]:
    """NACH's self-training: CE(strong logits + log(p_bar / uniform), argmax of the weak
    view) on the samples whose confidence reaches their class's threshold
    (:func:`nach_thresholds`), averaged over all samples as FixMatch; p_bar is the mean
    weak prediction of the kept samples (the distribution alignment of the third-party
    code). Returns (loss, kept mask)."""
    probs = probs_weak.detach()
    conf, targets = probs.max(dim=1)
    kept = conf >= nach_thresholds(targets, seen, gap, threshold)
    if not kept.any():
        return logits_strong.sum() * 0.0, kept
    p_bar = probs[kept].sum(dim=0) / probs[kept].sum()
    align = torch.log(p_bar.clamp_min(EPS) * probs.shape[1])
    ce = F.cross_entropy(logits_strong + align, targets, reduction="none")
    return (ce * kept).mean(), kept


# ----- SemiFL extended to the open world (FedoSSL section 5, Table 2's SemiFL*) -----------
def spherical_kmeans(x: Tensor, k: int, iters: int = 10, generator=None) -> Tensor:
    """Hard cluster index of every row of ``x`` by spherical k-means (cosine), ``k``
    centroids started at random rows."""
    x = F.normalize(x, dim=1)
    start = torch.randperm(len(x), generator=generator)[:k].to(x.device)
    centroids = x[start]
    for _ in range(iters):
        member = (x @ centroids.T).argmax(dim=1)
        sums = torch.zeros_like(centroids).index_add_(0, member, x)
        empty = sums.norm(dim=1) == 0
        centroids = torch.where(empty[:, None], centroids, F.normalize(sums, dim=1))
    return (x @ centroids.T).argmax(dim=1)


def clusters_to_classes(clusters: Tensor, probs: Tensor, classes: Sequence[int]) -> Tensor:
    """The class of each cluster: clusters matched one-to-one to ``classes`` by the
    Hungarian algorithm on the probability mass the model gives each class over the
    cluster's members (ours). Returns one class per sample."""
    from scipy.optimize import linear_sum_assignment

    k = int(clusters.max()) + 1
    mass = torch.zeros(k, len(classes), dtype=probs.dtype, device=probs.device)
    mass.index_add_(0, clusters, probs[:, list(classes)])
    rows, cols = linear_sum_assignment(-mass.cpu().numpy())
    table = torch.full((k,), -1, dtype=torch.long)
    table[torch.as_tensor(rows)] = torch.as_tensor(np.asarray(classes)[cols], dtype=torch.long)
    return table.to(clusters.device)[clusters]


def open_world_pseudo_labels(
    probs: Tensor,
    features: Tensor,
    seen: Sequence[int],
    threshold: float,
    ood_threshold: float,
    iters: int = 10,
    generator=None,
) -> Tensor:
    """SemiFL* pseudo-labels of unlabeled samples from the round's global model (-1: not
    used): a seen class when its softmax reaches ``threshold`` (SemiFL's fixed-threshold
    pseudo-labels); out of distribution when no seen class reaches ``ood_threshold``
    (the paper: OOD by softmax confidence), those clustered by spherical k-means into as
    many clusters as there are unseen classes and each cluster given an unseen class by
    :func:`clusters_to_classes`."""
    classes = probs.shape[1]
    unseen = [c for c in range(classes) if c not in set(seen)]
    labels = torch.full((len(probs),), -1, dtype=torch.long, device=probs.device)
    conf, cls = probs.max(dim=1)
    seen_mask = torch.zeros(classes, dtype=torch.bool, device=probs.device)
    seen_mask[list(seen)] = True
    confident = (conf >= threshold) & seen_mask[cls]
    labels[confident] = cls[confident]
    ood = probs[:, list(seen)].max(dim=1).values < ood_threshold
    if unseen and ood.any():
        k = min(len(unseen), int(ood.sum()))
        clusters = spherical_kmeans(features[ood], k, iters, generator)
        labels[ood] = clusters_to_classes(clusters, probs[ood], unseen)
    return labels


def mixup_pseudo_loss(logits: Tensor, y_fix: Tensor, y_partner: Tensor, lam: float) -> Tensor:
    """SemiFL's mix term per sample, on the logits of lam x_fix + (1 - lam) x_partner:
    lam CE(., y_fix) + (1 - lam) CE(., y_partner) (official code, models/wresnet.py
    ``fix-mix``)."""
    ce_fix = F.cross_entropy(logits, y_fix, reduction="none")
    return lam * ce_fix + (1.0 - lam) * F.cross_entropy(logits, y_partner, reduction="none")


def beta_draw(alpha: float, generator=None) -> float:
    """One draw of mixup's lambda ~ Beta(alpha, alpha), by the inverse CDF of a uniform from
    ``generator`` (so the client's seeded stream decides it)."""
    from scipy.special import betaincinv

    u = float(torch.rand((), generator=generator))
    return float(betaincinv(alpha, alpha, u))


def hard_pseudo_labels(probs: Tensor, pseudo: Tensor) -> Tensor:
    """SemiFL's mix partners' labels: the pseudo-label where one was given, else the start
    model's argmax (the official mix set labels every sample by its argmax)."""
    return torch.where(pseudo >= 0, pseudo, probs.argmax(dim=1))


# ----- Metrics -------------------------------------------------------------------------
def matched_accuracy(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Accuracy after mapping predicted labels one-to-one to classes by the Hungarian
    algorithm (ORCA's cluster_acc); 0 on an empty set."""
    from scipy.optimize import linear_sum_assignment

    if len(y_true) == 0:
        return 0.0
    size = int(max(y_true.max(), y_pred.max())) + 1
    counts = np.zeros((size, size), dtype=np.int64)
    np.add.at(counts, (y_pred, y_true), 1)
    rows, cols = linear_sum_assignment(-counts)
    return float(counts[rows, cols].sum() / len(y_true))


def open_world_accuracy(
    y_true: np.ndarray,
    y_pred: np.ndarray,
    seen: Sequence[int],
    locally_unseen: Sequence[int],
    globally_unseen: Sequence[int],
) -> dict[str, float]:
    """Section 5's metrics: seen = plain accuracy on seen-class samples; all = matched over
    every sample; unseen = matched over all unseen-class samples jointly, so that an LU and
    a GU class whose samples fall mostly on one label cannot both take it (the paper: one of
    them takes the label with the next largest count); LU and GU each matched alone."""

    def subset(classes: Sequence[int]) -> np.ndarray:
        return np.isin(y_true, np.asarray(classes, dtype=y_true.dtype))

    s, lu, gu = subset(seen), subset(locally_unseen), subset(globally_unseen)
    unseen = lu | gu
    return {
        "acc_all": matched_accuracy(y_true, y_pred),
        "acc_seen": float((y_pred[s] == y_true[s]).mean()) if s.any() else 0.0,
        "acc_unseen": matched_accuracy(y_true[unseen], y_pred[unseen]),
        "acc_lu": matched_accuracy(y_true[lu], y_pred[lu]),
        "acc_gu": matched_accuracy(y_true[gu], y_pred[gu]),
    }

"""FedoSSL's Flower-free parts on hand-made tensors: split roles, Sinkhorn-Knopp, matching,
each loss (tasks/openworld.py, tasks/partition.py: open_world_split)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from tasks.config import ConfigError
from tasks.data import dataset_info, make_synthetic
from tasks.models import head_of, model_for
from tasks.openworld import (
    agreement_metrics,
    aligned_self_training,
    balanced_kmeans,
    beta_draw,
    calibration_ce,
    calibration_loss,
    claim_seen_rows,
    cluster_global_centroids,
    clusters_to_classes,
    cosine_logits,
    entropy_of_mean,
    filtered_pair_indices,
    hard_pseudo_labels,
    learning_gap,
    margin_cross_entropy,
    matched_accuracy,
    mixup_pseudo_loss,
    nach_thresholds,
    open_world_accuracy,
    open_world_pseudo_labels,
    pair_indices,
    pairwise_loss,
    predict,
    role_agreement,
    role_codes,
    sinkhorn,
    spherical_kmeans,
    suppressed_loss,
)
from tasks.partition import class_roles, make_split
from tasks.settings import ModelSettings, SplitSettings
from tasks.syncs import SyncCounter

SCFG = SplitSettings(
    scenario="open_world",
    val_size=0,
    test_size=100,
    num_clients=10,
    class_roles="SSSSSSLGGG",
    labeled_fraction=0.5,
    role_clients=0,
    samples_per_class=0,
)


@pytest.fixture(scope="module")
def synthetic():
    return make_synthetic(28, 2000, 200, 1)


# ----- Split ---------------------------------------------------------------------------
def test_open_world_split_gives_every_class_its_role(synthetic):
    split = make_split(synthetic, SCFG, seed=0)
    labels = synthetic.train_y.numpy()
    roles = split.summary["class_roles"]
    assert roles["seen"] == [0, 1, 2, 3, 4, 5]
    assert roles["locally_unseen"] == [6] and roles["globally_unseen"] == [7, 8, 9]
    gu_at = {7: range(0, 4), 8: range(4, 8), 9: range(8, 10)}
    for k, (idx, lab) in enumerate(zip(split.clients, split.client_labeled)):
        present = set(labels[idx].tolist())
        expected = {0, 1, 2, 3, 4, 5, 6} | {c for c, ks in gu_at.items() if k in ks}
        assert present == expected
        assert set(labels[lab].tolist()) == set(range(6))  # labels only of seen classes
        assert np.isin(lab, idx).all()
    everything = np.concatenate(split.clients)
    assert len(everything) == len(set(everything.tolist()))  # disjoint clients
    for c in range(6):  # half of each seen class labeled
        n = (labels == c).sum()
        assert sum((labels[lab] == c).sum() for lab in split.client_labeled) == round(0.5 * n)
    assert len(split.server_labeled) == 0


def test_open_world_split_is_deterministic_and_roles_default_to_sixty_percent_seen(synthetic):
    a, b = make_split(synthetic, SCFG, 3), make_split(synthetic, SCFG, 3)
    assert all(np.array_equal(x, y) for x, y in zip(a.clients, b.clients))
    assert class_roles("", 10) == "SSSSSSLGGG"


def test_centralized_merges_the_role_clients_into_one(synthetic):
    split = make_split(synthetic, replace(SCFG, num_clients=1, role_clients=10), 0)
    federated = make_split(synthetic, SCFG, 0)
    assert sorted(split.clients[0].tolist()) == sorted(np.concatenate(federated.clients).tolist())


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"class_roles": "SSSSSSSSSS"}, "no unseen class"),
        ({"class_roles": "SSSSSSSGGG", "num_clients": 2}, "need at least 3 clients"),
        ({"class_roles": "SSX"}, "one of S, L, G"),
        ({"class_roles": "SSSSSSSSSG"}, "at every client"),
    ],
)
def test_bad_open_world_splits_are_one_line_config_errors(synthetic, changes, match):
    with pytest.raises(ConfigError, match=match):
        make_split(synthetic, replace(SCFG, **changes), 0)


# ----- Sinkhorn-Knopp and centroids ----------------------------------------------------
def test_sinkhorn_rows_and_columns_reach_their_marginals():
    scores = torch.tensor([[5.0, 0.0, 0.0], [4.0, 0.0, 1.0], [3.0, 1.0, 0.0], [6.0, 2.0, 0.0]])
    p = sinkhorn(scores, iters=200)
    torch.testing.assert_close(p.sum(1), torch.full((4,), 1 / 4))
    torch.testing.assert_close(p.sum(0), torch.full((3,), 1 / 3), atol=1e-5, rtol=0)


def test_balanced_kmeans_finds_two_well_separated_groups():
    x = torch.tensor([[1.0, 0.0], [0.99, 0.1], [0.98, -0.1], [0.0, 1.0], [0.1, 0.99], [-0.1, 0.98]])
    c = balanced_kmeans(x, 2, iters=5, generator=torch.Generator().manual_seed(0))
    members = (torch.nn.functional.normalize(x, dim=1) @ c.T).argmax(1)
    assert members[:3].unique().numel() == 1 and members[3:].unique().numel() == 1
    assert members[0] != members[3]
    torch.testing.assert_close(c.norm(dim=1), torch.ones(2))


def test_balanced_kmeans_moves_each_centroid_to_the_mean_of_its_hard_members():
    """The official code's local_clustering: argmax members, no soft pull from the other
    group (soft members would tilt each centroid towards the other group)."""
    x = torch.tensor([[1.0, 0.0], [1.0, 0.2], [0.0, 1.0], [0.2, 1.0]])
    xn = torch.nn.functional.normalize(x, dim=1)
    c = balanced_kmeans(x, 2, iters=3, generator=torch.Generator().manual_seed(0))
    group_a = torch.nn.functional.normalize(xn[:2].mean(0), dim=0)
    group_b = torch.nn.functional.normalize(xn[2:].mean(0), dim=0)
    first_is_a = bool(c[0, 0] > c[0, 1])
    expected = torch.stack([group_a, group_b] if first_is_a else [group_b, group_a])
    torch.testing.assert_close(c, expected)


def test_balanced_kmeans_gives_an_empty_cluster_a_row_not_nan():
    x = torch.tensor([[3.0, 4.0]]).repeat(5, 1)  # one point: every member goes to column 0
    c = balanced_kmeans(x, 3, iters=2, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(c, torch.tensor([[0.6, 0.8]]).repeat(3, 1))


def test_global_centroid_weight_decay_shrinks_the_step_before_renormalising():
    local = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    start = torch.tensor([[0.8, 0.6], [0.6, 0.8]])
    plain = cluster_global_centroids(start, local, steps=1, lr=0.5, weight_decay=0.0)
    decayed = cluster_global_centroids(start, local, steps=1, lr=0.5, weight_decay=0.5)
    torch.testing.assert_close(decayed.norm(dim=1), torch.ones(2))
    assert not torch.allclose(plain, decayed)  # the decay enters the step (code: 1e-4)


def test_global_centroids_move_onto_the_local_ones_and_stay_unit_norm():
    local = torch.tensor([[1.0, 0.0], [0.95, 0.05], [0.0, 1.0], [0.05, 0.95]])
    start = torch.tensor([[0.8, 0.6], [0.6, 0.8]])
    m = cluster_global_centroids(start, local, steps=300, lr=0.1)
    torch.testing.assert_close(m.norm(dim=1), torch.ones(2))
    assert m[0, 0] > 0.9 and m[1, 1] > 0.9  # each took the group it was nearer


def test_seen_classes_claim_their_nearest_centroid_rows():
    m = torch.eye(3)
    means = torch.tensor([[0.0, 0.0, 1.0]])  # class 0's features lie on centroid 2
    out = claim_seen_rows(m, means, seen=[0])
    torch.testing.assert_close(out, torch.tensor([[0.0, 0.0, 1.0], [1.0, 0, 0], [0, 1.0, 0]]))


# ----- Metrics -------------------------------------------------------------------------
def test_matched_accuracy_maps_clusters_to_classes_one_to_one():
    y = np.array([0, 0, 1, 1, 2, 2])
    assert matched_accuracy(y, np.array([2, 2, 0, 0, 1, 1])) == 1.0
    assert matched_accuracy(y, np.array([0, 0, 0, 0, 1, 1])) == pytest.approx(4 / 6)


def test_lu_and_gu_on_one_label_are_matched_alone_but_not_in_all_unseen():
    """Class 1 (LU) and class 2 (GU) both fall mostly on label 5: each alone takes it, the
    joint unseen matching gives it to one and the other its next-largest label (section 5)."""
    y = np.array([0, 0, 1, 1, 1, 1, 2, 2, 2, 2])
    p = np.array([0, 3, 5, 5, 5, 4, 5, 5, 5, 6])
    out = open_world_accuracy(y, p, seen=[0], locally_unseen=[1], globally_unseen=[2])
    assert out["acc_seen"] == 0.5
    assert out["acc_lu"] == 0.75 and out["acc_gu"] == 0.75
    assert out["acc_unseen"] == pytest.approx(4 / 8)  # 3 on label 5, 1 on label 4 (or 6)
    assert out["acc_all"] == pytest.approx(5 / 10)


# ----- Losses --------------------------------------------------------------------------
def test_cosine_logits_are_scaled_cosines():
    z = torch.tensor([[3.0, 0.0]])
    w = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    torch.testing.assert_close(cosine_logits(z, w, 10.0), torch.tensor([[10.0, 0.0, 10 / 2**0.5]]))


def test_margin_cross_entropy_adds_the_scaled_margin_to_the_target_logit():
    logits = torch.tensor([[1.0, 2.0]])
    y = torch.tensor([0])
    expected = -math.log(math.exp(1 + 10 * 0.3) / (math.exp(1 + 10 * 0.3) + math.exp(2)))
    assert margin_cross_entropy(logits, y, 0.3, 10.0).item() == pytest.approx(expected, rel=1e-6)
    assert margin_cross_entropy(logits, y, 0.0, 10.0).item() == pytest.approx(
        -math.log(math.exp(1) / (math.exp(1) + math.exp(2))), rel=1e-6
    )


def test_pairs_are_same_class_for_labeled_and_nearest_for_unlabeled():
    feats = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.1], [0.1, 1.0], [1.0, 0.2]])
    labels = torch.tensor([0, 1, 0, -1, -1])
    pair = pair_indices(feats, labels, num_labeled=3, generator=torch.Generator().manual_seed(0))
    assert pair[0] == 2 and pair[2] == 0  # the other labeled 0
    assert pair[1] == 1  # alone in its class: itself
    assert pair[3] == 1 and pair[4] == 2  # nearest other sample


def test_pairs_of_a_batch_with_lone_classes_read_nothing_back_to_the_host():
    """A lone labeled sample pairs with itself through the diagonal, not a boolean index and
    ``nonzero`` (two host syncs a step on a GPU); the pairs equal that indexed rule's."""
    feats = torch.randn(64, 16, generator=torch.Generator().manual_seed(1))
    labels = torch.cat([torch.arange(10), torch.randint(10, 20, (22,)), torch.full((32,), -1)])
    with SyncCounter() as counter:
        pair = pair_indices(
            feats, labels, num_labeled=32, generator=torch.Generator().manual_seed(2)
        )
    assert counter.total == 0, counter.counts
    y = labels[:32]
    same = (y[:, None] == y[None, :]).float()
    same.fill_diagonal_(0.0)
    alone = same.sum(dim=1) == 0
    same[alone, torch.nonzero(alone).flatten()] = 1.0
    noise = torch.rand(same.shape, generator=torch.Generator().manual_seed(2))
    assert torch.equal(pair[:32], (same * (noise + 1.0)).argmax(dim=1))
    assert torch.equal(pair[:10][alone[:10]], torch.arange(10)[alone[:10]])


def test_predict_of_no_images_is_empty_features_and_logits():
    """A client without labeled images (a tiny split) computes its seen-class sums over none."""
    model = model_for(ModelSettings(), dataset_info("synthetic28"))
    dim = head_of(model).weight.shape[1]
    z, logits = predict(model, torch.zeros(0, 1, 28, 28), 10.0, batch_size=8)
    assert z.shape == (0, dim) and logits.shape == (0, 10)
    z, logits = predict(model, torch.rand(9, 1, 28, 28), 10.0, batch_size=4)
    assert z.shape == (9, dim) and logits.shape == (9, 10)


def test_pairwise_loss_is_minus_log_inner_product_with_the_partner():
    p = torch.tensor([[0.5, 0.5], [1.0, 0.0]])
    q = torch.tensor([[0.2, 0.8], [0.6, 0.4]])
    pair = torch.tensor([1, 0])
    expected = -(math.log(0.5 * 0.6 + 0.5 * 0.4) + math.log(0.2)) / 2
    assert pairwise_loss(p, q, pair).item() == pytest.approx(expected, rel=1e-6)


def test_entropy_of_mean_is_log_c_for_a_uniform_mean():
    p = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    assert entropy_of_mean(p).item() == pytest.approx(math.log(2), rel=1e-6)


def test_suppressed_loss_weights_uncertainty_by_tau_to_the_class_share():
    p = torch.tensor([[0.6, 0.4], [0.3, 0.7]])
    counts = torch.tensor([10, 5])  # class 0 the largest: rho = -1; class 1: -0.2^0.5
    # The code's L1 loss: |p - p with its top entry set to 1| averaged over the 2 classes.
    expected = (1.0 * 0.4 + 0.2**0.5 * 0.3) / 2 / 2
    assert suppressed_loss(p, counts, 0.2).item() == pytest.approx(expected, rel=1e-6)
    target = p.clone()
    target[torch.arange(2), p.argmax(1)] = 1.0
    rho = torch.tensor([1.0, 0.2**0.5])
    code = (torch.nn.functional.l1_loss(p, target, reduction="none").mean(1) * rho).mean()
    assert suppressed_loss(p, counts, 0.2).item() == pytest.approx(code.item(), rel=1e-6)


def test_calibration_loss_is_ce_on_confident_assignments_plus_cluster_cross_entropy():
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
    q = torch.tensor([[0.99, 0.01], [0.6, 0.4]])  # only row 0 passes 0.95
    q2 = torch.tensor([[0.5, 0.5], [0.9, 0.1]])
    pair = torch.tensor([1, 0])
    total, l_ce, l_cluster = calibration_loss(logits, q, q, q2, pair, threshold=0.95)
    assert l_ce.item() == pytest.approx(-math.log(math.exp(2) / (math.exp(2) + 1)), rel=1e-6)
    row0 = 0.99 * math.log(0.9) + 0.01 * math.log(0.1)  # q of 0, q2 of its partner 1
    expected = -(row0 + math.log(0.5)) / 2
    assert l_cluster.item() == pytest.approx(expected, rel=1e-6)
    no_ce, _, _ = calibration_loss(logits, q, q, q2, pair, threshold=0.95, ce_weight=0.0)
    assert total.item() == pytest.approx(l_ce.item() + l_cluster.item(), rel=1e-6)
    assert no_ce.item() == pytest.approx(l_cluster.item(), rel=1e-6)


def test_calibration_ce_is_a_masked_mean_without_host_syncs_and_zero_when_none_is_kept():
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(64, 10, generator=g, requires_grad=True)
    q = torch.softmax(5 * torch.randn(64, 10, generator=g), dim=1)
    with SyncCounter() as counter:
        l_ce = calibration_ce(logits, q, 0.95)
    assert counter.total == 0, counter.counts
    conf, target = q.max(dim=1)
    keep = conf > 0.95
    assert 0 < int(keep.sum()) < 64
    expected = torch.nn.functional.cross_entropy(logits[keep], target[keep])
    assert l_ce.item() == pytest.approx(expected.item(), rel=1e-6)
    none = calibration_ce(logits, q, 1.0)
    none.backward()
    assert none.item() == 0.0 and torch.count_nonzero(logits.grad) == 0


def test_margin_as_a_device_tensor_gives_the_float_margins_loss_to_the_bit():
    g = torch.Generator().manual_seed(5)
    logits, y = torch.randn(32, 10, generator=g), torch.randint(0, 10, (32,), generator=g)
    u = 1.0 - torch.rand(32, generator=g).mean()
    by_float = margin_cross_entropy(logits, y, min(float(u), 0.5), 10.0)
    assert torch.equal(margin_cross_entropy(logits, y, u.clamp(max=0.5), 10.0), by_float)


def test_calibration_ce_reads_the_unlabeled_rows_and_cluster_every_row():
    # Row 0 labeled, rows 1-2 unlabeled: L_ce sees rows 1-2 only; L_cluster all three.
    q = torch.tensor([[0.99, 0.01], [0.2, 0.8], [0.97, 0.03]])
    q2 = torch.tensor([[0.5, 0.5], [0.9, 0.1], [0.7, 0.3]])
    logits = torch.tensor([[0.0, 3.0], [1.0, 0.0]])  # the unlabeled rows' logits
    pair = torch.tensor([0, 2, 1])
    _, l_ce, l_cluster = calibration_loss(logits, q[1:], q, q2, pair, threshold=0.95)
    assert l_ce.item() == pytest.approx(-math.log(math.e / (math.e + 1)), rel=1e-6)  # row 2
    rows = [q[j] @ torch.log(q2[pair[j]]) for j in range(3)]
    assert l_cluster.item() == pytest.approx(-float(sum(rows)) / 3, rel=1e-6)


def test_role_agreement_counts_matching_argmaxes_per_class_role():
    roles = "SSLG"
    true_y = torch.tensor([0, 1, 1, 2, 2])  # seen, seen, seen, LU, LU; no GU sample
    q = torch.tensor(
        [[0.9, 0.1, 0, 0], [0.8, 0.2, 0, 0], [0, 1.0, 0, 0], [0, 0, 1.0, 0], [0, 0, 0, 1.0]]
    )
    logits = torch.tensor(
        [[2.0, 0, 0, 0], [0, 2.0, 0, 0], [0, 2.0, 0, 0], [0, 0, 0, 2.0], [0, 0, 0, 2.0]]
    )
    codes = role_codes(true_y, roles)
    assert codes.tolist() == [0, 0, 0, 1, 1]
    with SyncCounter() as counter:
        table = role_agreement(q, logits, codes)
    assert counter.total == 0, counter.counts
    assert table.flatten().tolist() == pytest.approx([2 / 3, 0.5, 0.0, 3.0, 2.0, 0.0])
    out = agreement_metrics(table.flatten().tolist())
    assert out == pytest.approx({"q_agree_seen": 2 / 3, "q_agree_lu": 0.5})  # no GU: left out


def test_role_agreement_shares_equal_the_boolean_indexed_means_to_the_bit():
    """The sync-free shares (sums over one-hot role members / counts) are float32 means of
    0/1 values, as the boolean-indexed ``same[mine].float().mean()`` they replace."""
    g = torch.Generator().manual_seed(3)
    q, logits = torch.rand(997, 10, generator=g), torch.rand(997, 10, generator=g)
    true_y = torch.randint(0, 10, (997,), generator=g)
    codes = role_codes(true_y, "SSSSSSLLGG")
    shares = role_agreement(q, logits, codes)[0]
    same = q.argmax(1) == logits.argmax(1)
    for code in range(3):
        assert shares[code].item() == same[codes == code].float().mean().item()


# ----- NACH (Fed-AN / Fed-RN) and SemiFL* ------------------------------------------------
def test_nach_keeps_a_pair_only_when_closer_than_the_neighbours_labeled_samples():
    """Two labeled (class 0) samples, two unlabeled ones close to each other, and one whose
    nearest sample is labeled but farther from it than that sample's labeled neighbour."""
    feats = torch.tensor([[1.0, 0.0], [1.0, 0.05], [0.0, 1.0], [0.05, 1.0], [1.0, 0.2]])
    pair, kept = filtered_pair_indices(feats, torch.tensor([0, 0]), 2)
    assert pair.tolist() == [1, 0, 3, 2, 4]  # the last one is paired with itself
    assert kept.tolist() == [True, True, False]
    pair0, kept0 = filtered_pair_indices(feats, torch.tensor([], dtype=torch.long), 0)
    assert pair0.tolist() == [1, 0, 3, 2, 1] and bool(kept0.all())


def test_learning_gap_is_seen_minus_unseen_mean_confidence():
    seen = torch.tensor([True, False])
    probs = torch.tensor([[0.9, 0.1], [0.7, 0.3], [0.4, 0.6]])
    assert learning_gap(probs, seen) == pytest.approx(0.8 - 0.6)
    assert learning_gap(probs[:2], seen) == pytest.approx(0.8)  # nothing on an unseen class


def test_nach_thresholds_lower_the_unseen_ones_by_twice_the_gap_capped_at_half():
    seen, targets = torch.tensor([True, False]), torch.tensor([0, 1])
    assert nach_thresholds(targets, seen, 0.1, 0.95).tolist() == pytest.approx([0.95, 0.75])
    assert nach_thresholds(targets, seen, 0.4, 0.95).tolist() == pytest.approx([0.95, 0.45])


def test_aligned_self_training_is_logit_adjusted_ce_on_the_kept_samples():
    seen = torch.tensor([True, False])
    weak = torch.tensor([[0.97, 0.03], [0.9, 0.1], [0.4, 0.6]])  # kept, below 0.95, kept
    logits = torch.zeros(3, 2, requires_grad=True)
    loss, kept = aligned_self_training(logits, weak, seen, 0.3, 0.95)  # unseen at 0.35
    assert kept.tolist() == [True, False, True]
    # p_bar = (0.685, 0.315); softmax(0 + log(2 p_bar)) = p_bar
    assert float(loss.detach()) == pytest.approx(-(math.log(0.685) + math.log(0.315)) / 3, rel=1e-5)
    loss.backward()
    assert logits.grad[1].abs().sum() == 0 and logits.grad[0].abs().sum() > 0
    none, kept_none = aligned_self_training(logits, weak * 0 + 0.5, seen, 0.0, 0.95)
    assert float(none.detach()) == 0.0 and not kept_none.any()


def test_spherical_kmeans_separates_two_directions():
    gen = torch.Generator().manual_seed(0)
    x = torch.cat([torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])]).view(2, 1, 2)
    x = (x + 0.05 * torch.randn(2, 10, 2, generator=gen)).view(20, 2)
    labels = spherical_kmeans(x, 2, 10, gen)
    assert len(set(labels[:10].tolist())) == 1 and len(set(labels[10:].tolist())) == 1
    assert labels[0] != labels[10]


def test_clusters_take_the_unseen_class_their_members_lean_to_one_to_one():
    probs = torch.tensor(
        [[0.1, 0.1, 0.2, 0.6], [0.1, 0.1, 0.3, 0.5], [0.1, 0.1, 0.5, 0.3], [0.1, 0.1, 0.6, 0.2]]
    )
    labels = clusters_to_classes(torch.tensor([0, 0, 1, 1]), probs, [2, 3])
    assert labels.tolist() == [3, 3, 2, 2]


def test_semifl_pseudo_labels_seen_by_confidence_and_clustered_ood_as_unseen():
    probs = torch.tensor(
        [
            [0.97, 0.01, 0.01, 0.01],  # confident seen -> 0
            [0.60, 0.30, 0.05, 0.05],  # neither confident nor OOD -> unused
            [0.10, 0.10, 0.70, 0.10],  # OOD, leans to 2
            [0.10, 0.10, 0.10, 0.70],  # OOD, leans to 3
        ]
    )
    feats = torch.tensor([[1.0, 1.0], [1.0, -1.0], [1.0, 0.0], [0.0, 1.0]])
    gen = torch.Generator().manual_seed(0)
    labels = open_world_pseudo_labels(probs, feats, [0, 1], 0.95, 0.5, 10, gen)
    assert labels.tolist() == [0, -1, 2, 3]


def test_semifl_mix_term_weighs_both_labels_by_lambda():
    logits = torch.tensor(
        [[0.0, math.log(3.0)], [math.log(3.0), 0.0]]
    )  # p = (.25, .75), (.75, .25)
    y_fix, y_partner = torch.tensor([1, 1]), torch.tensor([0, 1])
    loss = mixup_pseudo_loss(logits, y_fix, y_partner, 0.5)
    expected = [0.5 * -math.log(0.75) + 0.5 * -math.log(0.25), -math.log(0.25)]
    assert loss.tolist() == pytest.approx(expected, abs=1e-6)
    assert mixup_pseudo_loss(logits, y_fix, y_partner, 1.0).tolist() == pytest.approx(
        [-math.log(0.75), -math.log(0.25)], abs=1e-6
    )


def test_semifl_mix_partners_keep_their_pseudo_label_else_the_argmax():
    probs = torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.7, 0.1], [0.1, 0.2, 0.7]])
    assert hard_pseudo_labels(probs, torch.tensor([-1, 2, -1])).tolist() == [0, 2, 2]


def test_mixup_lambda_is_a_seeded_beta_draw():
    draws = [beta_draw(0.75, torch.Generator().manual_seed(s)) for s in range(2000)]
    assert all(0.0 <= d <= 1.0 for d in draws)
    assert np.mean(draws) == pytest.approx(0.5, abs=0.02)  # Beta(a, a): mean 1/2
    assert np.var(draws) == pytest.approx(1 / (4 * 2.5), abs=0.01)  # 1 / (4 (2a + 1))
    assert beta_draw(0.75, torch.Generator().manual_seed(3)) == draws[3]

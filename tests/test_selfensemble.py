"""FedSEAL's equations on hand-made tensors, and the ensemble's persistence in context.state."""

from __future__ import annotations

import math

import pytest
import torch

from tasks.selfensemble import (
    class_thresholds,
    complementary_labels,
    lambda_ramp,
    negative_loss,
    positive_loss,
    positive_set,
    split_batches,
    update_ensemble,
)
from tasks.syncs import SyncCounter


def test_class_thresholds_eq5():
    probs = torch.tensor([[0.8, 0.1, 0.1], [0.6, 0.3, 0.1], [0.2, 0.7, 0.1], [0.5, 0.4, 0.1]])
    labels = torch.tensor([0, 0, 1, 1])
    tau = class_thresholds(probs, labels, 3)
    # class 0: predicted-as-0 confidences 0.8 + 0.6 + 0.5 over 2 true class-0 samples
    assert tau.tolist() == pytest.approx([(0.8 + 0.6 + 0.5) / 2, 0.7 / 2, 1.0])


def test_update_ensemble_eq8_is_the_running_mean():
    p1, p2, p3 = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]]), torch.tensor([[0.5, 0.5]])
    e = update_ensemble(None, p1, 1)
    e = update_ensemble(e, p2, 2)
    e = update_ensemble(e, p3, 3)
    assert torch.allclose(e, torch.tensor([[0.5, 0.5]]))
    assert torch.allclose(
        update_ensemble(torch.tensor([[0.2, 0.8]]), p1, 4), torch.tensor([[0.4, 0.6]])
    )


def test_positive_set_eq9_10():
    ens = torch.tensor([[0.9, 0.05, 0.05], [0.5, 0.4, 0.1], [0.1, 0.6, 0.3]])
    labels, mask = positive_set(ens, torch.tensor([0.8, 0.7, 0.5]))
    assert labels.tolist() == [0, 0, 1] and mask.tolist() == [True, False, False]


def test_complementary_labels_eq11_12():
    ens = torch.tensor(
        [[0.9, 0.06, 0.04], [0.5, 0.48, 0.02], [0.34, 0.33, 0.33], [0.5, 0.01, 0.49]]
    )
    pos = torch.tensor([True, False, False, False])
    gen = torch.Generator().manual_seed(0)
    labels, mask = complementary_labels(ens, pos, theta=0.05, generator=gen)
    # sample 0 is positive (excluded), sample 2 has no class <= theta
    assert mask.tolist() == [False, True, False, True]
    assert labels[1] == 2 and labels[3] == 1


def test_complementary_label_is_uniform_over_candidates():
    ens = torch.tensor([[0.9, 0.02, 0.02, 0.02, 0.04]]).repeat(4000, 1)
    labels, mask = complementary_labels(
        ens, torch.zeros(4000, dtype=torch.bool), 0.05, torch.Generator().manual_seed(1)
    )
    counts = torch.bincount(labels[mask], minlength=5)
    assert counts[0] == 0 and all(abs(int(c) - 1000) < 120 for c in counts[1:])


def test_losses_eq14_15():
    logits = torch.tensor([[2.0, 0.0], [0.0, 0.0]])
    labels = torch.tensor([0, 1])
    p0 = math.e**2 / (math.e**2 + 1)
    assert float(positive_loss(logits, labels)) == pytest.approx((-math.log(p0) + math.log(2)) / 2)
    # complementary labels: sample 0 says "not class 0" (p = p0), sample 1 "not class 1" (0.5)
    expected = (-math.log(1 - p0) - math.log(0.5)) / 2
    assert float(negative_loss(logits, labels)) == pytest.approx(expected, rel=1e-6)


def test_lambda_ramp():
    assert lambda_ramp(1, 0.1, 1.0, 10) == pytest.approx(0.1)
    assert lambda_ramp(6, 0.1, 1.0, 10) == pytest.approx(0.55)
    assert lambda_ramp(50, 0.1, 1.0, 10) == pytest.approx(1.0)
    assert lambda_ramp(1, 0.1, 1.0, 0) == 1.0


def test_split_batches_gives_the_masked_indices_in_order_with_one_host_read():
    """The same tensors as idx[pos[idx]] and idx[neg[idx]] (eq. 10, 12), for batches in any
    order; no sync, one host copy (the sizes of every batch)."""
    pos = torch.tensor([True, False, False, True, False, True, True])
    neg = torch.tensor([False, True, False, False, True, False, False])
    batches = [torch.tensor([5, 0, 1, 6]), torch.tensor([3, 2, 4]), torch.tensor([2])]
    with SyncCounter() as counter:
        split = split_batches(batches, pos, neg)
    assert counter.total == 0 and sum(counter.host_copies.values()) == 1
    assert [(p.tolist(), n.tolist()) for p, n in split] == [
        ([5, 0, 6], [1]),
        ([3], [4]),
        ([], []),
    ]
    for idx, (p, n) in zip(batches, split):
        assert torch.equal(p, idx[pos[idx]]) and torch.equal(n, idx[neg[idx]])
    assert split_batches([], pos, neg) == []

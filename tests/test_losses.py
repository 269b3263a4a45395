from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from tasks.aggregate import weighted_average
from tasks.losses import (
    fixmatch_loss,
    proximal_term,
    tsa_cross_entropy,
    tsa_threshold,
    uda_loss,
)

# Weak-view logits: sample 0 confident (p = e^3 / (e^3 + 2) = 0.909 >= 0.9), sample 1 not.
WEAK = torch.tensor([[3.0, 0.0, 0.0], [1.0, 0.5, 0.0]])
STRONG = torch.tensor([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0]])


def test_fixmatch_loss_hand_computed():
    loss, mask = fixmatch_loss(WEAK, STRONG, threshold=0.9)
    assert mask.tolist() == [1.0, 0.0]
    ce0 = -math.log(math.e / (math.e + 2))  # CE of strong sample 0 against label 0
    assert float(loss) == pytest.approx(ce0 / 2, rel=1e-6)  # mean over the whole batch


def test_uda_loss_hand_computed():
    loss, mask = uda_loss(WEAK, STRONG, threshold=0.9, temperature=0.5)
    assert mask.tolist() == [1.0, 0.0]
    q = torch.softmax(WEAK[0] / 0.5, dim=0)
    logp = torch.log_softmax(STRONG[0], dim=0)
    kl = float((q * (q.log() - logp)).sum())
    assert float(loss) == pytest.approx(kl / 2, rel=1e-6)


def test_tsa_threshold_schedules():
    assert tsa_threshold(0.0, "linear", 10) == pytest.approx(0.1)
    assert tsa_threshold(1.0, "linear", 10) == pytest.approx(1.0)
    assert tsa_threshold(0.5, "linear", 10) == pytest.approx(0.55)
    assert tsa_threshold(1.0, "exp", 10) == pytest.approx(1.0)
    assert tsa_threshold(0.5, "exp", 10) == pytest.approx(math.exp(-2.5) * 0.9 + 0.1)
    assert tsa_threshold(0.5, "log", 10) == pytest.approx((1 - math.exp(-2.5)) * 0.9 + 0.1)


def test_tsa_cross_entropy_masks_confident_samples():
    logits = torch.tensor([[4.0, 0.0], [0.0, 0.0]])
    labels = torch.tensor([0, 0])
    # sample 0: p_true = 0.982 > eta = 0.6 -> ignored; sample 1: p_true = 0.5 kept
    assert float(tsa_cross_entropy(logits, labels, 0.6)) == pytest.approx(math.log(2), rel=1e-6)


def test_proximal_term_hand_computed():
    model = nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 2.0]]))
    anchor = [torch.tensor([[0.0, 0.0]])]
    assert float(proximal_term(model, anchor, mu=0.1)) == pytest.approx(0.05 * 5.0)


def test_weighted_average_hand_made():
    a = {"w": np.array([1.0, 2.0], dtype=np.float32), "n": np.array(3, dtype=np.int64)}
    b = {"w": np.array([3.0, 6.0], dtype=np.float32), "n": np.array(5, dtype=np.int64)}
    out = weighted_average([a, b], [1, 3])
    assert out["w"].dtype == np.float32 and out["w"].tolist() == [2.5, 5.0]
    assert int(out["n"]) == 5
    with pytest.raises(ValueError):
        weighted_average([a, b], [0, 0])


def test_weighted_average_in_torch_gives_the_bits_of_a_float64_numpy_sum():
    """The mean is summed in torch on the training device (an aggregation on the GPU); its
    bits equal the float64 numpy sum of the same updates in the same order."""
    rng = np.random.default_rng(0)
    updates = [{"w": rng.standard_normal((64, 33)).astype(np.float32)} for _ in range(7)]
    weights = [float(n) for n in rng.integers(1, 500, size=7)]
    shares = np.asarray(weights) / np.sum(weights)
    expected = np.zeros((64, 33))
    for share, update in zip(shares, updates):
        expected += share * update["w"]
    out = weighted_average(updates, weights, device="cpu")["w"]
    assert out.dtype == np.float32 and np.array_equal(out, expected.astype(np.float32))
    if torch.cuda.is_available():
        on_gpu = weighted_average(updates, weights, device="cuda")["w"]
        assert np.array_equal(on_gpu, out)

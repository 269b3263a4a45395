from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from torch import nn

from tasks.ssl import (
    ema_update,
    layerwise_mse,
    mse_weight,
    negative_cosine,
    nt_xent,
    symmetric_negative_cosine,
)


def nt_xent_reference(z1: np.ndarray, z2: np.ndarray, tau: float, decoupled: bool) -> float:
    """FedSup eq. 3.3 term by term in plain numpy, symmetrised over the 2B anchors."""
    views = {1: z1 / np.linalg.norm(z1, axis=1, keepdims=True)}
    views[2] = z2 / np.linalg.norm(z2, axis=1, keepdims=True)
    batch = z1.shape[0]

    def term(b: int, anchor: int, other: int) -> float:
        a = views[anchor][b]
        numerator = math.exp(a @ views[other][b] / tau)
        denominator = 0.0 if decoupled else numerator
        for b2 in range(batch):
            if b2 != b:
                denominator += math.exp(a @ views[anchor][b2] / tau)
                denominator += math.exp(a @ views[other][b2] / tau)
        return -math.log(numerator / denominator)

    return sum(term(b, 1, 2) + term(b, 2, 1) for b in range(batch)) / (2 * batch)


# B = 2 pairs of 2-d vectors, none parallel to another.
Z1 = np.array([[1.0, 0.0], [1.0, 2.0]])
Z2 = np.array([[2.0, 1.0], [-1.0, 1.0]])


def t(array: np.ndarray) -> torch.Tensor:
    return torch.tensor(array, dtype=torch.float64)


# negative_cosine / symmetric_negative_cosine


def test_negative_cosine_hand_values():
    p = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0], [0.0, 1.0]])
    # Parallel (D = -1), orthogonal (0), opposite (+1), at 45 degrees (-1/sqrt(2)).
    z = torch.tensor([[3.0, 0.0], [5.0, 0.0], [-2.0, -2.0], [4.0, 4.0]])
    expected = (-1.0 + 0.0 + 1.0 - 1 / math.sqrt(2)) / 4
    assert float(negative_cosine(p, z)) == pytest.approx(expected, rel=1e-6)
    assert float(negative_cosine(p[:1], z[:1])) == pytest.approx(-1.0)
    assert float(negative_cosine(p[1:2], z[1:2])) == pytest.approx(0.0, abs=1e-7)
    assert float(negative_cosine(p[2:3], z[2:3])) == pytest.approx(1.0)


def test_negative_cosine_has_gradient_on_both_inputs():
    p = torch.tensor([[1.0, 0.0]], requires_grad=True)
    z = torch.tensor([[1.0, 1.0]], requires_grad=True)
    negative_cosine(p, z).backward()
    assert p.grad is not None and p.grad.abs().sum() > 0
    assert z.grad is not None and z.grad.abs().sum() > 0


def test_symmetric_negative_cosine_hand_values():
    p1 = torch.tensor([[1.0, 0.0]])
    z2 = torch.tensor([[1.0, 1.0]])  # cos(p1, z2) = 1/sqrt(2)
    p2 = torch.tensor([[0.0, 2.0]])
    z1 = torch.tensor([[3.0, 0.0]])  # cos(p2, z1) = 0
    loss = symmetric_negative_cosine(p1, p2, z1, z2)
    assert float(loss) == pytest.approx(-0.5 / math.sqrt(2))
    # p1 || z2 and p2 || z1 give the minimum -1; orthogonal pairs give 0.
    assert float(symmetric_negative_cosine(z2 * 4, z1 * 0.5, z1, z2)) == pytest.approx(-1.0)
    assert float(symmetric_negative_cosine(p2, p2, z1, z1)) == pytest.approx(0.0, abs=1e-7)


def test_symmetric_negative_cosine_is_batch_average():
    p1 = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    z2 = torch.tensor([[2.0, 0.0], [1.0, 0.0]])  # rows: parallel (-1), orthogonal (0)
    p2, z1 = p1.clone(), p1.clone()  # D(p2, z1) = -1 on both rows
    loss = symmetric_negative_cosine(p1, p2, z1, z2)
    assert float(loss) == pytest.approx(0.5 * (-0.5) + 0.5 * (-1.0))


def test_symmetric_negative_cosine_stops_gradient_on_targets():
    p1 = torch.tensor([[1.0, 0.0], [0.5, -1.0]], requires_grad=True)
    p2 = torch.tensor([[0.0, 1.0], [2.0, 1.0]], requires_grad=True)
    z1 = torch.tensor([[1.0, 1.0], [1.0, 3.0]], requires_grad=True)
    z2 = torch.tensor([[-1.0, 2.0], [1.0, 0.0]], requires_grad=True)
    symmetric_negative_cosine(p1, p2, z1, z2).backward()
    assert z1.grad is None and z2.grad is None
    assert p1.grad is not None and p1.grad.abs().sum() > 0
    assert p2.grad is not None and p2.grad.abs().sum() > 0


# nt_xent


def test_nt_xent_hand_value_orthonormal_batch():
    # Positives identical (sim 1), negatives orthogonal (sim 0), tau = 0.5: every term is
    # -log(e^2 / (e^2 + 2)) by default and -log(e^2 / 2) decoupled.
    z = torch.eye(2)
    assert float(nt_xent(z, z.clone())) == pytest.approx(math.log(1 + 2 * math.exp(-2)))
    assert float(nt_xent(z, z.clone(), decoupled=True)) == pytest.approx(math.log(2) - 2)


@pytest.mark.parametrize("decoupled", [False, True])
@pytest.mark.parametrize("tau", [0.5, 0.1, 2.0])
def test_nt_xent_matches_numpy_formula_b2(decoupled: bool, tau: float):
    expected = nt_xent_reference(Z1, Z2, tau, decoupled)
    got = nt_xent(t(Z1), t(Z2), temperature=tau, decoupled=decoupled)
    assert float(got) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("decoupled", [False, True])
def test_nt_xent_matches_numpy_formula_b4(decoupled: bool):
    rng = np.random.default_rng(0)
    z1, z2 = rng.normal(size=(4, 3)), rng.normal(size=(4, 3))
    got = nt_xent(t(z1), t(z2), temperature=0.3, decoupled=decoupled)
    assert float(got) == pytest.approx(nt_xent_reference(z1, z2, 0.3, decoupled), rel=1e-9)


@pytest.mark.parametrize("decoupled", [False, True])
def test_nt_xent_symmetric_and_scale_invariant(decoupled: bool):
    loss = float(nt_xent(t(Z1), t(Z2), decoupled=decoupled))
    assert float(nt_xent(t(Z2), t(Z1), decoupled=decoupled)) == pytest.approx(loss, rel=1e-12)
    scaled = nt_xent(3 * t(Z1), 0.2 * t(Z2), decoupled=decoupled)
    assert float(scaled) == pytest.approx(loss, rel=1e-12)


def test_nt_xent_decoupled_differs_from_default():
    default = float(nt_xent(t(Z1), t(Z2)))
    decoupled = float(nt_xent(t(Z1), t(Z2), decoupled=True))
    assert decoupled < default  # a smaller denominator gives a smaller loss
    assert decoupled != pytest.approx(default)


def test_nt_xent_stable_at_small_temperature():
    loss = nt_xent(t(Z1), t(Z2), temperature=1e-3)
    assert torch.isfinite(loss)


def test_nt_xent_gradient_reaches_both_views():
    z1 = t(Z1).requires_grad_()
    z2 = t(Z2).requires_grad_()
    nt_xent(z1, z2).backward()
    assert z1.grad is not None and z1.grad.abs().sum() > 0
    assert z2.grad is not None and z2.grad.abs().sum() > 0


def test_nt_xent_rejects_bad_input():
    one = torch.ones(1, 2)
    with pytest.raises(ValueError, match="at least 2"):
        nt_xent(one, one)
    with pytest.raises(ValueError, match="temperature"):
        nt_xent(t(Z1), t(Z2), temperature=0.0)
    with pytest.raises(ValueError, match="temperature"):
        nt_xent(t(Z1), t(Z2), temperature=-1.0)
    with pytest.raises(ValueError, match="shape"):
        nt_xent(t(Z1), t(Z2)[:1])


# layerwise_mse


def feature_maps() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    online = [
        torch.tensor([[1.0, 2.0], [3.0, 4.0]]).reshape(1, 1, 2, 2).requires_grad_(),
        torch.ones(2, 3).requires_grad_(),
    ]
    target = [torch.zeros(1, 1, 2, 2, requires_grad=True), torch.full((2, 3), 3.0)]
    return online, target


def test_layerwise_mse_hand_values():
    online, target = feature_maps()
    # Block 1: (1 + 4 + 9 + 16) / 4 = 7.5; block 2: (1 - 3)^2 = 4 everywhere.
    assert float(layerwise_mse(online, target, 1).detach()) == pytest.approx(7.5)
    assert float(layerwise_mse(online, target, 2).detach()) == pytest.approx(11.5)


def test_layerwise_mse_gradient_only_to_online():
    online, target = feature_maps()
    layerwise_mse(online, target, 1).backward()
    assert target[0].grad is None
    # d/dx mean((x - 0)^2) = 2x / 4 on the first block; the second block is not used.
    assert online[0].grad is not None
    assert online[0].grad.flatten().tolist() == pytest.approx([0.5, 1.0, 1.5, 2.0])
    assert online[1].grad is None


def test_layerwise_mse_zero_blocks():
    online, target = feature_maps()
    online = [m.double().detach() for m in online]
    target = [m.double() for m in target]
    zero = layerwise_mse(online, target, 0)
    assert float(zero) == 0.0 and zero.dim() == 0
    assert zero.dtype == torch.float64 and zero.device == online[0].device
    w = torch.tensor(2.0, requires_grad=True)
    (w**2 + zero).backward()
    assert float(w.grad) == pytest.approx(4.0)
    assert float(layerwise_mse([], [], 0)) == 0.0


def test_layerwise_mse_rejects_bad_input():
    online, target = feature_maps()
    with pytest.raises(ValueError, match="n must be"):
        layerwise_mse(online, target, 3)
    with pytest.raises(ValueError, match="n must be"):
        layerwise_mse(online, target, -1)
    with pytest.raises(ValueError, match="feature maps"):
        layerwise_mse(online, target[:1], 1)
    with pytest.raises(ValueError, match="block 1"):
        layerwise_mse(online, [target[0], torch.zeros(3, 2)], 1)


# mse_weight


def test_mse_weight_schedule():
    assert mse_weight(1e-4, 0, 10) == pytest.approx(1.0)
    assert mse_weight(1e-4, 10, 10) == pytest.approx(1e-4)
    assert mse_weight(1e-4, 5, 10) == pytest.approx(1e-2)
    assert mse_weight(1.0, 7, 10) == pytest.approx(1.0)
    weights = [mse_weight(1e-2, r, 20) for r in range(21)]
    assert all(a > b for a, b in itertools.pairwise(weights))


def test_mse_weight_rejects_bad_input():
    with pytest.raises(ValueError, match="lambda_s"):
        mse_weight(0.0, 1, 10)
    with pytest.raises(ValueError, match="lambda_s"):
        mse_weight(-1e-4, 1, 10)
    with pytest.raises(ValueError, match="rounds"):
        mse_weight(1e-4, 0, 0)


# ema_update


def net(fill: float) -> nn.Module:
    model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    with torch.no_grad():
        for param in model.parameters():
            param.fill_(fill)
    return model


def trained_online() -> nn.Module:
    """Parameters 1, BatchNorm statistics moved by one training-mode forward pass."""
    online = net(1.0)
    online.train()
    online(torch.tensor([[1.0, -2.0], [3.0, 0.5], [0.0, 4.0]]))
    return online


@pytest.mark.parametrize(("mu", "expected"), [(0.0, 1.0), (1.0, 3.0), (0.5, 2.0), (0.9, 2.8)])
def test_ema_update_parameters(mu: float, expected: float):
    target, online = net(3.0), trained_online()
    ema_update(target, online, mu)
    for param in target.parameters():
        assert torch.allclose(param, torch.full_like(param, expected))
        assert param.requires_grad and param.grad_fn is None
    for param in online.parameters():  # the online network is left alone
        assert torch.equal(param, torch.ones_like(param))


def test_ema_update_copies_buffers():
    target, online = net(3.0), trained_online()
    assert int(online[1].num_batches_tracked) == 1
    ema_update(target, online, 1.0)
    for (name, buffer), (_, source) in zip(target.named_buffers(), online.named_buffers()):
        assert torch.equal(buffer, source), name
    assert target[1].num_batches_tracked.dtype == torch.long
    assert int(target[1].num_batches_tracked) == 1


def test_ema_update_rejects_bad_input():
    with pytest.raises(ValueError, match="mu"):
        ema_update(net(0.0), net(1.0), -0.1)
    with pytest.raises(ValueError, match="mu"):
        ema_update(net(0.0), net(1.0), 1.1)
    with pytest.raises(ValueError, match="differ"):
        ema_update(nn.Linear(2, 2), net(1.0), 0.5)

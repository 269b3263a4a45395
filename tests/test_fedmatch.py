"""FedMatch's pieces on hand-made tensors: sparse payloads, decomposition, eq. 1-3, helpers."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from tasks.decompose import Decomposed, decomposition_penalty
from tasks.fedmatch import (
    HelperIndex,
    agreement_labels,
    inter_client_kl,
    is_helper_round,
    noise_input,
)
from tasks.sparse import Broadcast, decode, encode, encode_changes, payload_arrays, payload_from

# ----- Sparse encode / decode ---------------------------------------------------------------


def test_sparse_round_trip_is_exact_with_and_without_threshold():
    gen = torch.Generator().manual_seed(0)
    ref = torch.randn(1000, generator=gen)
    new = ref.clone()
    new[::7] += torch.randn(len(new[::7]), generator=gen)  # 143 changed a lot
    new[3::50] += 1e-7  # tiny changes
    assert torch.equal(decode(ref, encode_changes(new, ref, 0.0), 1000), new)
    out = decode(ref, encode_changes(new, ref, 1e-5), 1000)
    assert torch.equal(out, torch.where((new - ref).abs() > 1e-5, new, ref))
    assert not torch.equal(out, new)  # the tiny changes stayed behind


def test_sparse_payload_picks_the_cheapest_position_format():
    ref = torch.zeros(1000)
    few, many, most = ref.clone(), ref.clone(), ref.clone()
    few[[3, 500]] = 1.0
    many[::4] = 1.0  # 250 changed: a 125-byte bitmask beats 500 bytes of indices
    most[:970] = 1.0  # 125 + 3880 bytes >= 4000 dense bytes
    p_few, p_many, p_most = (encode_changes(v, ref, 0.5) for v in (few, many, most))
    assert p_few["idx"].dtype == np.uint16 and p_few["idx"].tolist() == [3, 500]
    assert p_few["val"].tolist() == [1.0, 1.0]
    assert set(p_many) == {"mask", "val"} and p_many["mask"].nbytes == 125
    assert set(p_most) == {"dense"}
    for vector, payload in ((few, p_few), (many, p_many), (most, p_most)):
        assert torch.equal(decode(ref, payload, 1000), vector)
    assert set(encode(few, None)) == {"dense"}


def test_sparse_payload_needs_the_receivers_copy_and_the_right_size():
    payload = encode_changes(torch.ones(4), torch.zeros(4), 0.5)
    with pytest.raises(ValueError, match="dense payload has 4 values"):
        decode(None, payload, 5)
    new = torch.zeros(100)
    new[99] = 1.0
    sparse = encode_changes(new, torch.zeros(100), 0.5)
    with pytest.raises(ValueError, match="needs the receiver's copy"):
        decode(None, sparse, 100)
    arrays = payload_arrays(sparse, "psi")
    assert set(arrays) == {"psi.idx", "psi.val"}
    assert {k: v.tolist() for k, v in payload_from(arrays, "psi").items()} == {
        "idx": [99],
        "val": [1.0],
    }
    with pytest.raises(ValueError, match="no payload 'sigma'"):
        payload_from(arrays, "sigma")


def test_broadcast_sends_what_changed_since_the_clients_round():
    b = Broadcast()
    v1, v2 = torch.zeros(100), torch.zeros(100)
    v1[0], v1[1] = 1.0, 1e-6
    v2[0], v2[1], v2[2] = 1.0, 1e-6, 2.0
    b.publish(torch.zeros(100), 1e-5, 1)
    b.publish(v1, 1e-5, 2)
    b.publish(v2, 1e-5, 3)
    assert b.value[:4].tolist() == [1.0, 0.0, 2.0, 0.0]  # the 1e-6 change is below delta
    assert b.changed_at[:4].tolist() == [2, 1, 3, 1] and int(b.changed_at[4:].max()) == 1
    assert set(b.payload(None)) == {"dense"}
    assert b.payload(1)["idx"].tolist() == [0, 2]
    assert b.payload(2)["idx"].tolist() == [2] and b.payload(3)["idx"].tolist() == []
    held_since_1 = torch.zeros(100)
    assert torch.equal(decode(held_since_1, b.payload(1), 100), b.value)


# ----- Decomposition ------------------------------------------------------------------------


def tiny_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))


def test_decomposed_starts_at_theta_equal_1_2_sigma_and_keeps_buffers():
    reference = tiny_net()
    model = Decomposed(tiny_net(), psi_factor=0.2)
    with torch.no_grad():
        for p in reference.parameters():
            p.mul_(1.2)
    x = torch.randn(5, 3)
    reference.eval(), model.eval()
    torch.testing.assert_close(model(x), reference(x))
    assert set(model.state_dict()) == {
        *(f"sigma.{k}" for k in ("0-weight", "0-bias", "1-weight", "1-bias", "3-weight", "3-bias")),
        *(f"psi.{k}" for k in ("0-weight", "0-bias", "1-weight", "1-bias", "3-weight", "3-bias")),
        "net.1.running_mean",
        "net.1.running_var",
        "net.1.num_batches_tracked",
    }
    assert model.numel() == 12 + 4 + 4 + 4 + 8 + 2
    flat = model.flat("psi")
    model.load_flat("sigma", flat)
    assert torch.equal(model.flat("sigma"), flat)


@pytest.mark.parametrize(("trained", "frozen"), [("sigma", "psi"), ("psi", "sigma")])
def test_decomposition_freezes_the_other_part(trained, frozen):
    model = Decomposed(tiny_net())
    before = {part: model.flat(part) for part in ("sigma", "psi")}
    model.train_only(trained)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # an optimizer over both parts
    loss = model(torch.randn(8, 3)).pow(2).mean()
    loss.backward()
    opt.step()
    assert torch.equal(model.flat(frozen), before[frozen])
    assert not torch.equal(model.flat(trained), before[trained])
    assert all(p.grad is None for p in model.params(frozen))


def test_decomposition_penalty_by_hand():
    sigma = [torch.tensor([1.0, 2.0], requires_grad=True)]
    psi = [torch.tensor([0.5, -1.0], requires_grad=True)]
    loss = decomposition_penalty(sigma, psi, lambda_l1=0.1, lambda_l2=2.0)
    # 0.1 * (0.5 + 1) + 2 * (0.5^2 + 3^2) = 0.15 + 18.5
    assert float(loss.detach()) == pytest.approx(18.65)
    loss.backward()
    assert sigma[0].grad is None  # sigma* is frozen in eq. 5
    # d/dpsi: 0.1 * sign(psi) - 4 * (sigma - psi) = [0.1 - 2, -0.1 - 12]
    torch.testing.assert_close(psi[0].grad, torch.tensor([-1.9, -12.1]))


def test_prune_psi_and_the_undecomposed_ablation():
    model = Decomposed(tiny_net())
    model.load_flat("psi", torch.tensor([1e-6, -2e-5, 1e-5] * 10 + [0.0] * 4))
    model.prune_psi(1e-5)
    assert model.flat("psi")[:3].tolist() == pytest.approx([0.0, -2e-5, 0.0])
    plain = Decomposed(tiny_net(), decomposed=False)
    assert plain.parts() == ("sigma",) and plain.unlabeled_part == "sigma"
    reference = tiny_net().eval()
    x = torch.randn(5, 3)
    torch.testing.assert_close(plain.eval()(x), reference(x))


def test_forward_with_a_helper_uses_own_sigma_plus_helper_psi():
    model = Decomposed(tiny_net()).eval()
    helper = Decomposed(tiny_net()).eval()
    helper.load_flat("sigma", model.flat("sigma"))
    helper.load_flat("psi", torch.randn(model.numel()) * 0.1)
    x = torch.randn(4, 3)
    torch.testing.assert_close(model.forward_with(helper.flat("psi"), x), helper(x))


# ----- Agreement labels, inter-client KL (eq. 1-3) -------------------------------------------


def one_hot_probs(classes: list[int], k: int = 4) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(classes), k).float() * 0.7 + 0.3 / k


def test_agreement_label_is_the_majority_vote_ties_to_the_local_model():
    local = one_hot_probs([0, 1, 2, 3])
    h1 = one_hot_probs([1, 1, 0, 2])
    h2 = one_hot_probs([1, 2, 0, 1])
    # votes: s0 {0:1, 1:2} -> 1; s1 {1:2, 2:1} -> 1; s2 {2:1, 0:2} -> 0; s3 1-1-1 tie -> local 3
    assert agreement_labels(local, [h1, h2]).tolist() == [1, 1, 0, 3]
    assert agreement_labels(local, []).tolist() == [0, 1, 2, 3]


def test_inter_client_kl_by_hand():
    local_logits = torch.tensor([[0.0, math.log(3.0)]])  # p = [0.25, 0.75]
    helper = torch.tensor([[0.5, 0.5]])
    expected = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    assert float(inter_client_kl([helper], local_logits)) == pytest.approx(expected)
    same = torch.softmax(local_logits, dim=1)
    assert float(inter_client_kl([helper, same], local_logits)) == pytest.approx(expected / 2)
    assert float(inter_client_kl([], local_logits)) == 0.0


# ----- Helper selection ---------------------------------------------------------------------

EMBEDDINGS = {
    0: np.array([0.0, 0.0]),
    1: np.array([1.0, 0.0]),
    2: np.array([0.0, 3.0]),
    3: np.array([10.0, 10.0]),
    4: np.array([1.2, 0.1]),
}


def test_helpers_are_the_nearest_other_clients():
    index = HelperIndex(EMBEDDINGS)
    assert index.helpers(0, 2) == [1, 4]
    assert index.helpers(1, 2) == [4, 0]
    assert index.helpers(2, 1) == [0]
    assert index.helpers(3, 2) == [2, 4]  # distances 12.21, 13.25 (then 13.45, 14.14)
    assert index.helpers(0, 10) == [1, 4, 2, 3]  # asks for more than there are
    assert index.helpers(7, 2) == []  # never uploaded: no helpers (section 3.1)
    assert index.helpers(0, 0) == []


def test_a_client_is_never_its_own_helper_even_with_twins():
    twins = {**EMBEDDINGS, 5: np.array([0.0, 0.0]), 6: np.array([0.0, 0.0])}
    index = HelperIndex(twins)
    for pid in (0, 5, 6):
        helpers = index.helpers(pid, 2)
        assert pid not in helpers and sorted(helpers) == sorted({0, 5, 6} - {pid})


def test_helper_rounds_and_the_noise_input():
    assert [r for r in range(1, 31) if is_helper_round(r, 10)] == [10, 20, 30]
    assert not any(is_helper_round(r, 0) for r in range(1, 31))
    a, b = noise_input(3, 8, seed=1), noise_input(3, 8, seed=1)
    assert a.shape == (1, 3, 8, 8) and torch.equal(a, b)
    assert float(a.min()) >= 0.0 and float(a.max()) <= 1.0
    assert not torch.equal(a, noise_input(3, 8, seed=2))

"""FedSup's evaluation protocols: fresh head, finetuning, linear evaluation (section 5.1.2)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from tasks.models import build_model, head_of
from tasks.protocols import (
    ProtocolSettings,
    finetune_accuracy,
    linear_accuracy,
    with_fresh_head,
)


def separable(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Images of 4 classes told apart by which quadrant is bright."""
    gen = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 4
    x = 0.1 * torch.rand(n, 1, 28, 28, generator=gen)
    for k in range(4):
        r, c = divmod(k, 2)
        x[y == k, :, 14 * r : 14 * r + 14, 14 * c : 14 * c + 14] += 0.8
    return x, y


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("small_cnn", 1, 4, 28, "bn", (0.5,), (0.25,))


DATA = (*separable(64, 1), *separable(64, 2))
FAST = ProtocolSettings(epochs=3, lr=0.05, batch_size=16)


def test_the_model_passed_in_is_left_bit_identical():
    net = model()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    finetune_accuracy(net, *DATA, FAST, seed=3)
    linear_accuracy(net, *DATA, FAST, seed=3)
    after = net.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_same_seed_same_number_and_the_seed_matters():
    net = model()
    assert finetune_accuracy(net, *DATA, FAST, seed=3) == finetune_accuracy(net, *DATA, FAST, 3)
    heads = [head_of(with_fresh_head(net, seed)).weight for seed in (0, 0, 1)]
    assert torch.equal(heads[0], heads[1]) and not torch.equal(heads[0], heads[2])
    assert not torch.equal(heads[0], head_of(net).weight)


def test_linear_evaluation_trains_only_the_head(monkeypatch):
    """The probe's optimizer holds exactly the head's parameters."""
    import tasks.protocols as protocols

    seen = []
    real = protocols.make_sgd

    def spy(params, *args, **kwargs):
        params = list(params)
        seen.append(params)
        return real(params, *args, **kwargs)

    monkeypatch.setattr(protocols, "make_sgd", spy)
    net = model()
    linear_accuracy(net, *DATA, FAST, seed=0)
    finetune_accuracy(net, *DATA, FAST, seed=0)
    head = sum(p.numel() for p in head_of(net).parameters())
    assert sum(p.numel() for p in seen[0]) == head
    assert sum(p.numel() for p in seen[1]) == sum(p.numel() for p in net.parameters())


def test_both_protocols_learn_a_separable_task_far_above_chance():
    net = model()
    settings = ProtocolSettings(epochs=20, lr=0.05, batch_size=16)
    assert finetune_accuracy(net, *DATA, settings, seed=0) >= 0.9
    assert linear_accuracy(net, *DATA, settings, seed=0) >= 0.9


@pytest.mark.parametrize(
    "settings, n, match",
    [
        (ProtocolSettings(epochs=0, lr=0.1, batch_size=8), 64, "epochs"),
        (ProtocolSettings(epochs=1, lr=0.0, batch_size=8), 64, "lr"),
        (ProtocolSettings(epochs=1, lr=0.1, batch_size=8), 0, "labeled"),
        (ProtocolSettings(epochs=1, lr=0.1, batch_size=8, schedule="step"), 64, "schedule"),
    ],
)
def test_bad_settings_are_refused(settings, n, match):
    x, y, tx, ty = DATA
    with pytest.raises(ValueError, match=match):
        linear_accuracy(model(), x[:n], y[:n], tx, ty, settings, seed=0)


def test_cosine_schedule_anneals_from_lr_to_zero_and_constant_keeps_it():
    cosine = ProtocolSettings(epochs=2, lr=0.1, batch_size=16).lr_at(64)  # 8 steps
    rates = [cosine(step) for step in range(8)]
    assert rates[0] == pytest.approx(0.1)
    assert rates[4] == pytest.approx(0.05)  # half way
    assert rates[7] == pytest.approx(0.05 * (1 + math.cos(math.pi * 7 / 8)))
    assert all(a > b for a, b in itertools.pairwise(rates))
    constant = ProtocolSettings(epochs=2, lr=0.1, batch_size=16, schedule="constant").lr_at(64)
    assert [constant(step) for step in range(8)] == [0.1] * 8


def test_both_protocols_step_at_the_scheduled_rates(monkeypatch):
    import tasks.protocols
    import tasks.train

    seen: list[float] = []

    def record(optimizer, lr):
        seen.append(lr)
        for group in optimizer.param_groups:
            group["lr"] = lr

    monkeypatch.setattr(tasks.train, "set_lr", record)
    monkeypatch.setattr(tasks.protocols, "set_lr", record)
    settings = ProtocolSettings(epochs=2, lr=0.1, batch_size=16)  # 64 examples: 8 steps
    expected = [settings.lr_at(64)(step) for step in range(8)]
    for protocol in (finetune_accuracy, linear_accuracy):
        seen.clear()
        protocol(model(), *DATA, settings, seed=0)
        assert seen == pytest.approx(expected)

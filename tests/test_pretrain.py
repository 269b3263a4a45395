"""SimCLR pretraining (tasks/pretrain.py) and the second stage's frozen blocks
(tasks.models.freeze_before_last_block), on hand-made images and models."""

from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest
import torch

import tasks.pretrain as pretrain
from tasks.augment import WeakAugment
from tasks.models import build_model, freeze_before_last_block, head_of
from tasks.pretrain import SimCLRSettings, cache_path, cached_pretrain, simclr_pretrain
from tasks.train import seeded

SETTINGS = SimCLRSettings(epochs=3, batch_size=32, lr=0.1, temperature=0.5, projector_dim=16)


def small_cnn() -> torch.nn.Sequential:
    with seeded(0):
        return build_model("small_cnn", 1, 10, 28, "bn", [0.5], [0.25])


def images(n: int = 96) -> torch.Tensor:
    """n images of 4 kinds (a bright square in one corner) with a little noise."""
    with seeded(1) as gen:
        x = torch.rand(n, 1, 28, 28, generator=gen) * 0.2
    for i in range(n):
        r, c = divmod(i % 4, 2)
        x[i, :, r * 14 : r * 14 + 10, c * 14 : c * 14 + 10] += 0.8
    return x


def pretrained(settings: SimCLRSettings = SETTINGS) -> tuple[torch.nn.Module, list[float]]:
    model = small_cnn()
    with seeded(2) as gen:
        losses = simclr_pretrain(model, images(), WeakAugment(28, False, 0.125), settings, gen)
    return model, losses


def test_freezing_keeps_only_the_small_cnns_last_block_and_head_trainable():
    model = small_cnn()
    frozen = freeze_before_last_block(model)
    assert frozen == ["1.features.0.weight", "1.features.1.weight", "1.features.1.bias"]
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable[0] == "1.features.4.weight" and head_of(model).weight.requires_grad


def test_freezing_a_resnet18_leaves_layer4_and_the_head_as_orca():
    model = build_model("resnet18", 3, 10, 32, "bn", [0.5] * 3, [0.25] * 3)
    freeze_before_last_block(model)
    trainable = {n.split(".")[2] for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {"9", "10", "weight", "bias"}  # features.9-10: layer4; classifier
    assert head_of(model).weight.requires_grad and head_of(model).bias.requires_grad


def test_freezing_refuses_a_model_of_one_block_rather_than_freezing_nothing():
    model = small_cnn()
    model[1].block_ends = (len(model[1].features),)
    with pytest.raises(ValueError, match="2\\+ conv blocks, not 1"):
        freeze_before_last_block(model)
    assert all(p.requires_grad for p in model.parameters())


def test_a_frozen_block_gets_no_gradient_and_no_sgd_step():
    model = small_cnn()
    freeze_before_last_block(model)
    before = copy.deepcopy(model.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    model(images(8)).sum().backward()
    opt.step()
    after = model.state_dict()
    assert torch.equal(after["1.features.0.weight"], before["1.features.0.weight"])
    assert not torch.equal(after["1.features.4.weight"], before["1.features.4.weight"])


def test_simclr_moves_the_encoder_not_the_head_and_its_loss_falls():
    model, losses = pretrained()
    start = small_cnn().state_dict()
    state = model.state_dict()
    assert len(losses) == 3 and all(np.isfinite(losses))
    assert losses[-1] < losses[0]
    assert torch.equal(state["1.classifier.3.weight"], start["1.classifier.3.weight"])
    assert not torch.equal(state["1.features.0.weight"], start["1.features.0.weight"])
    assert not any(k.startswith("1.projector") for k in state)  # the projector is not kept
    # NT-Xent over 2B views is at most log(2B - 1) for any embedding; a trained one is lower
    assert losses[-1] < np.log(2 * SETTINGS.batch_size - 1)


def test_simclr_repeats_number_for_number():
    one_epoch = SimCLRSettings(1, 32, 0.1, 0.5, 16)
    first, losses1 = pretrained(one_epoch)
    second, losses2 = pretrained(one_epoch)
    assert losses1 == losses2
    for key, value in first.state_dict().items():
        assert torch.equal(value, second.state_dict()[key]), key


def test_the_cache_reuses_a_stage_and_keys_on_every_input():
    calls = []

    def run(model):
        def go():
            calls.append(1)
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(1.0)
            return [2.0, 1.5]

        return go

    key = {"seed": 0, "simclr": {"epochs": 2}}
    first = small_cnn()
    assert cached_pretrain(first, key, run(first)) == ([2.0, 1.5], False)
    second = small_cnn()
    assert cached_pretrain(second, key, run(second)) == ([2.0, 1.5], True)
    assert len(calls) == 1
    for k, v in first.state_dict().items():
        assert torch.equal(v, second.state_dict()[k]), k
    other = {**key, "seed": 1}
    assert cache_path(other) != cache_path(key)
    cached_pretrain(small_cnn(), other, run(small_cnn()))
    assert len(calls) == 2


@pytest.mark.parametrize("epochs", [1, 2])
def test_the_rate_decays_to_zero_over_the_stage(epochs, monkeypatch):
    rates = []
    real = pretrain.set_lr

    def spy(opt, lr):
        rates.append(lr)
        real(opt, lr)

    monkeypatch.setattr(pretrain, "set_lr", spy)
    settings = SimCLRSettings(epochs, 32, 0.2, 0.5, 16)
    pretrained(settings)
    assert len(rates) == 3 * epochs  # 96 images in batches of 32
    assert rates[0] == pytest.approx(0.2) and all(a > b for a, b in itertools.pairwise(rates))
    assert rates[-1] > 0.0

"""The strong views of FedMatch and FedSEAL on hand-made tensors (issue 42, items 1 and 4):
FedMatch's official draw (6 ops a view, levels in 0..M-1 with M in 2..5, rotation by
40 x level degrees) and FedSEAL's paper view (RandAugment alone, no Cutout)."""

from __future__ import annotations

import pytest
import torch
from kornia import augmentation as K
from torch import nn

from client_app.fedmatch import FedMatchSettings, strong_view
from client_app.fedseal import FedSEALSettings, paper_view
from ssfl.experiment import resolve_config
from tasks.augment import (
    OFFICIAL_OPS_PER_VIEW,
    OfficialRandAugment,
    RandAugment,
    StrongAugment,
    official_level_ops,
    randaugment_ops,
)
from tasks.config import ConfigError
from tasks.train import seeded
from tests.harness import tiny_raw


class AddStep(nn.Module):
    """A counting op: adds 0.01 to every pixel, so a view's shift counts the ops applied."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 0.01


def counting(ops: nn.ModuleList) -> nn.ModuleList:
    return nn.ModuleList(AddStep() for _ in ops)


def black(n: int = 64, channels: int = 1, size: int = 28) -> torch.Tensor:
    return torch.zeros(n, channels, size, size)


def one_image(n: int = 64, channels: int = 1, size: int = 28) -> torch.Tensor:
    torch.manual_seed(0)
    return torch.rand(1, channels, size, size).expand(n, -1, -1, -1).contiguous()


# ----- FedMatch: the official draw ---------------------------------------------------------
@pytest.mark.parametrize("channels, size", [(1, 28), (3, 32)])
def test_official_view_keeps_shape_and_range(channels, size):
    x = one_image(16, channels, size)
    out = OfficialRandAugment(channels)(x)
    assert out.shape == x.shape and out.min() >= 0 and out.max() <= 1


def test_official_view_applies_six_ops_to_every_image():
    view = OfficialRandAugment(1)
    view.ops = counting(view.ops)
    out = view(black(128))
    assert OFFICIAL_OPS_PER_VIEW == 6
    assert torch.allclose(out, torch.full_like(out, 0.06))


def test_ours_applies_n_ops_to_every_image():
    view = RandAugment(n=2, m=5.0, channels=1)
    view.ops = counting(view.ops)
    out = view(black(128))
    assert torch.allclose(out, torch.full_like(out, 0.02))


def test_official_levels_lie_below_one_bound_of_two_to_five_per_image():
    torch.manual_seed(0)
    ops, levels = OfficialRandAugment(1).draw(4096, torch.device("cpu"))
    assert ops.shape == levels.shape == (4096, 6)
    assert int(ops.min()) == 0 and int(ops.max()) == len(randaugment_ops(1.0, 1)) - 1
    # P(level l) = mean over M in 2..5 of 1/M where l < M: 0.321, 0.321, 0.196, 0.113, 0.05.
    expected = torch.tensor([0.3208, 0.3208, 0.1958, 0.1125, 0.05])
    share = torch.bincount(levels.flatten(), minlength=5) / levels.numel()
    assert share.shape == (5,) and torch.allclose(share, expected, atol=0.015)
    # One bound per image: a level 4 (M = 5) in slot 0 makes one in slot 1 four times as likely.
    top = levels[:, 0] == 4
    assert float((levels[top, 1] == 4).float().mean()) > 0.12


def top_bar(n: int = 2) -> torch.Tensor:
    bar = black(n)
    bar[:, :, 2:6, 10:18] = 1.0  # a bar at the top, centred
    return bar


def rotated(level: int) -> torch.Tensor:
    rotation = official_level_ops(level, 1)[3]
    assert isinstance(rotation, K.RandomRotation)
    return rotation(top_bar())[0, 0]


def test_official_rotation_turns_forty_degrees_a_level_counter_clockwise():
    assert torch.allclose(rotated(0), top_bar()[0, 0], atol=1e-5)
    at_40 = rotated(1)  # the bar's ends: top left, and a little below the middle right
    assert float(at_40[:14, :14].sum()) > 10 * float(at_40[:14, 14:].sum())
    at_160 = rotated(4)  # nearly upside down, just left of the centre
    assert float(at_160[14:, :14].sum()) > 10 * float(at_160[:14].sum())


def test_official_view_is_deterministic_under_the_clients_seeding():
    # A client draws its views inside tasks.train.seeded(seed of run, partition, round).
    x = one_image(16)
    view = OfficialRandAugment(1)
    with seeded(7):
        first = view(x)
    with seeded(7):
        assert torch.equal(first, view(x))
    with seeded(8):
        assert not torch.equal(first, view(x))


def test_fedmatch_picks_the_view_its_key_names():
    ours = strong_view(FedMatchSettings(strong_view="ours"), 1, "cpu")
    official = strong_view(FedMatchSettings(), 1, "cpu")
    assert type(ours) is RandAugment and (ours.n, len(ours.ops)) == (2, 13)
    assert type(official) is OfficialRandAugment and official.n == 6


# ----- FedSEAL: the paper's A(.) -------------------------------------------------------------
def test_paper_view_never_erases_a_patch_and_todays_does():
    # Every RandAugment op and the shift keep a black image black; Cutout paints 0.5.
    torch.manual_seed(0)
    paper = paper_view(2, 10.0, 1, "cpu")(black())
    today = StrongAugment(28, flip=True, channels=1, shift=0.0625)(black())
    assert float(paper.abs().max()) == 0.0
    assert bool(((today == 0.5).flatten(1).sum(dim=1) > 0).all())


def test_paper_view_keeps_shape_and_is_deterministic():
    x = one_image(32)
    view = paper_view(2, 10.0, 1, "cpu")
    with seeded(3):
        first = view(x)
    with seeded(3):
        assert first.shape == x.shape and torch.equal(first, view(x))


def test_the_papers_and_the_official_views_are_the_defaults():
    assert FedSEALSettings().strong_view == "paper"
    assert FedMatchSettings().strong_view == "official"
    assert resolve_config({"method": "fedseal"})["algo"]["strong_view"] == "paper"
    assert resolve_config({"method": "fedmatch"})["algo"]["strong_view"] == "official"


# ----- The keys refuse what they do not know -----------------------------------------------
@pytest.mark.parametrize(
    "method, value, allowed",
    [("fedmatch", "paper", "ours.*official"), ("fedseal", "official", "fixmatch.*paper")],
)
def test_strong_view_refuses_other_values_in_one_line(method, value, allowed):
    with pytest.raises(ConfigError, match=rf"'algo.strong_view'.*{allowed}") as err:
        resolve_config({"method": method, "algo": {"strong_view": value}})
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("method", ["fedmatch", "fedseal"])
def test_strong_view_refuses_a_non_string(method):
    with pytest.raises(ConfigError, match=r"'algo.strong_view': expected str") as err:
        resolve_config({"method": method, "algo": {"strong_view": 6}})
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("key", "value"), [("randaugment_n", 3), ("randaugment_m", 8.0)])
def test_the_official_view_refuses_the_randaugment_keys_it_would_ignore(key, value):
    raw = tiny_raw("fedmatch")
    raw["algo"] = {**raw.get("algo", {}), "strong_view": "official", key: value}
    with pytest.raises(ConfigError, match=f"'algo.{key}': unused with algo.strong_view official"):
        resolve_config(raw)
    raw["algo"][key] = getattr(FedMatchSettings(), key)
    assert resolve_config(raw)["algo"]["strong_view"] == "official"

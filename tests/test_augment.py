from __future__ import annotations

import pytest
import torch
from kornia import augmentation as K

from tasks.augment import (
    OfficialRandAugment,
    RandAugment,
    StrongAugment,
    WeakAugment,
    augment_grouped,
    grouped_views,
    randaugment_ops,
)
from tests.harness import STEP_METHODS, InProcessGrid, everyday_first, run_method, tiny_raw


def batch_of_one_image(n=64, channels=1, size=28):
    torch.manual_seed(0)
    img = torch.rand(1, channels, size, size)
    return img.expand(n, -1, -1, -1).contiguous()


def distinct_outputs(out: torch.Tensor) -> int:
    return len({tuple(o.flatten().round(decimals=4).tolist()) for o in out})


def test_weak_is_random_per_sample_and_in_range():
    x = batch_of_one_image()
    out = WeakAugment(28, flip=True)(x)
    assert out.shape == x.shape and out.min() >= 0 and out.max() <= 1
    assert distinct_outputs(out) > 10


def test_strong_is_random_per_sample_rgb():
    x = batch_of_one_image(channels=3, size=32)
    out = StrongAugment(32, flip=True, channels=3)(x)
    assert out.shape == x.shape and out.min() >= 0 and out.max() <= 1
    assert distinct_outputs(out) > 50


def test_randaugment_picks_ops_per_sample():
    x = batch_of_one_image(n=128)
    out = RandAugment(n=1, m=10, channels=1)(x)
    unchanged = (out - x).abs().flatten(1).amax(dim=1) < 1e-6
    # Identity is 1 of 13 ops: some samples stay as they were, most do not.
    assert 0 < int(unchanged.sum()) < 64


def test_a_black_image_stays_black_under_every_randaugment_op():
    # FixMatch's ops are PIL's: brightness and contrast blend with black / the mean, so
    # they cannot light up a black image (kornia's additive brightness lifts it to 0.9).
    for channels in (1, 3):
        torch.manual_seed(0)
        black = torch.zeros(64, channels, 28, 28)
        for op in randaugment_ops(1.0, channels):
            assert float(op(black).max()) == 0.0, type(op).__name__


def test_brightness_and_contrast_are_multiplicative_as_pil():
    torch.manual_seed(0)
    x = torch.zeros(256, 1, 28, 28)
    x[:, :, 10:18, 10:18] = 0.5
    contrast, brightness = (op for op in randaugment_ops(1.0, 1) if isinstance(op, K.ColorJitter))
    out = brightness(x)
    assert float(out[:, :, 0, 0].abs().max()) == 0.0  # background stays black
    assert 0.04 < float(out[:, 0, 12, 12].min()) < 0.1 and float(out[:, 0, 12, 12].max()) > 0.9
    mean = float(x[0].mean())
    low = contrast(x)[:, 0]  # blend with the mean: the background rises at most to it
    assert float(low[:, 0, 0].max()) <= mean + 1e-6


def test_seeded_augmentation_is_reproducible():
    x = batch_of_one_image()
    aug = StrongAugment(28, flip=False, channels=1)
    torch.manual_seed(3)
    a = aug(x)
    torch.manual_seed(3)
    assert torch.equal(a, aug(x))


def test_augment_grouped_pairs_each_batch_with_its_own_views_in_few_calls():
    calls = []

    def tag(xb):  # an "augmentation" that reveals which images it got
        calls.append(len(xb))
        return xb + 1000.0

    x = torch.arange(10.0)[:, None]
    batches = [torch.tensor([3, 1]), torch.tensor([], dtype=torch.long), torch.tensor([7, 0, 9])]
    out = list(augment_grouped(x, batches, tag, group_size=4))
    assert [idx.tolist() for idx, _ in out] == [[3, 1], [], [7, 0, 9]]
    assert [v.squeeze(1).tolist() for _, v in out] == [
        [1003.0, 1001.0],
        [],
        [1007.0, 1000.0, 1009.0],
    ]
    assert calls == [5]  # one call once the group reached 4 images


def test_augment_grouped_never_augments_an_empty_group():
    def refuse(xb):
        raise AssertionError("called on an empty group")

    empty = torch.tensor([], dtype=torch.long)
    out = list(augment_grouped(torch.zeros(4, 1), [empty, empty], refuse))
    assert [v.shape for _, v in out] == [(0, 1), (0, 1)]
    assert list(augment_grouped(torch.zeros(4, 1), [], refuse)) == []


def test_grouped_views_give_each_batch_every_view_of_its_own_images():
    x = torch.arange(6.0)[:, None]
    batches = [torch.tensor([4, 2]), torch.tensor([5]), torch.tensor([0, 1, 3])]
    out = list(grouped_views(x, batches, (lambda v: v + 100.0, lambda v: -v), group_size=3))
    assert [idx.tolist() for idx, _ in out] == [b.tolist() for b in batches]
    for (_, (plus, minus)), batch in zip(out, batches, strict=True):
        assert plus.squeeze(1).tolist() == (x[batch] + 100.0).squeeze(1).tolist()
        assert minus.squeeze(1).tolist() == (-x[batch]).squeeze(1).tolist()


STRONG_VIEW_METHODS = (
    "fedavg_fixmatch",
    "fedavg_uda",
    "fedavg_with_server",
    "fedrgd",
    "fedavg_simclr",
    "fedavg_simsiam",
    "fedavg_byol",
    "fedsup",
    "fedseal",
    "fedmatch",
)


@pytest.mark.parametrize("method", everyday_first(STRONG_VIEW_METHODS))
def test_a_client_round_draws_its_strong_views_in_grouped_calls(method, monkeypatch):
    """Six batches of 16 a round: one RandAugment call per strong view, not one per batch
    (issue 21: RandAugment runs all of its ops on every call)."""
    raw = tiny_raw(method)
    raw.update(rounds=1, federation={"clients_per_round": 0})
    raw["dataset"]["synthetic_train_size"] = 600
    raw["split"]["client_size"] = 96
    raw["client"] = {"batch_size": 16, **({"local_steps": 6} if method in STEP_METHODS else {})}
    calls: list[int] = []

    def counting(view: type) -> None:
        forward = view.forward

        def counted(self, x):
            calls.append(len(x))
            return forward(self, x)

        monkeypatch.setattr(view, "forward", counted)

    counting(RandAugment)
    counting(OfficialRandAugment)  # FedMatch's default view
    run_method(raw, InProcessGrid(3))
    views = 2 if method.startswith("fedavg_s") or method == "fedavg_byol" else 1
    assert calls and len(calls) <= 3 * views

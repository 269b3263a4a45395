from __future__ import annotations

import torch

from tasks.augment import RandAugment, StrongAugment, WeakAugment


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


def test_seeded_augmentation_is_reproducible():
    x = batch_of_one_image()
    aug = StrongAugment(28, flip=False, channels=1)
    torch.manual_seed(3)
    a = aug(x)
    torch.manual_seed(3)
    assert torch.equal(a, aug(x))

"""Batched augmentation on the training device, random per sample (kornia ops).

Weak: random horizontal flip (not for digits) and a random shift by pad-and-crop
(FixMatch: up to 12.5% of the side; ``augment.weak_shift`` in the config).
Strong: weak, then RandAugment (n ops per sample, each op and its magnitude drawn
per sample, magnitude up to m/10 of its range, as in FixMatch's RandAugment),
then Cutout. kornia's own ``auto.RandAugment`` draws one sub-policy per batch, so
the op choice per sample is done here; the image ops themselves are kornia's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

import torch
from kornia import augmentation as K
from torch import nn

# Images augmented per call by augment_grouped (the op count per call is fixed).
AUGMENT_GROUP = 1024


class WeakAugment(nn.Module):
    """Flip (optional) and a shift by up to ``shift`` of the side (zero padding), per sample."""

    def __init__(self, image_size: int, flip: bool, shift: float = 0.125):
        super().__init__()
        pad = max(1, round(image_size * shift))
        ops: list[nn.Module] = [K.RandomHorizontalFlip(p=0.5)] if flip else []
        ops.append(K.RandomCrop((image_size, image_size), padding=pad, padding_mode="constant"))
        self.ops = nn.Sequential(*ops)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops(x)


def randaugment_ops(magnitude: float, channels: int) -> list[nn.Module]:
    """The RandAugment op list with ranges scaled by magnitude in [0, 1]."""
    m = magnitude
    ops: list[nn.Module] = [
        nn.Identity(),
        K.RandomAutoContrast(p=1.0),
        K.RandomEqualize(p=1.0),
        K.RandomRotation(degrees=30.0 * m, p=1.0),
        K.RandomSolarize(thresholds=(0.5 * m), additions=0.0, p=1.0),
        K.RandomPosterize(bits=(max(1.0, 8.0 - 4.0 * m), 8.0), p=1.0),
        # PIL's ImageEnhance semantics, as FixMatch's RandAugment: contrast blends with the
        # image's mean, brightness with black (kornia's RandomBrightness adds the factor - 1
        # to every pixel instead, which turns a black background grey-white).
        K.ColorJitter(contrast=(1.0 - 0.9 * m, 1.0 + 0.9 * m), p=1.0),
        K.ColorJitter(brightness=(1.0 - 0.9 * m, 1.0 + 0.9 * m), p=1.0),
        K.RandomSharpness(sharpness=(0.0, 0.9 * m), p=1.0),
        K.RandomAffine(degrees=0.0, shear=(-17.0 * m, 17.0 * m, 0.0, 0.0), p=1.0),
        K.RandomAffine(degrees=0.0, shear=(0.0, 0.0, -17.0 * m, 17.0 * m), p=1.0),
        K.RandomAffine(degrees=0.0, translate=(0.3 * m, 0.0), p=1.0),
        K.RandomAffine(degrees=0.0, translate=(0.0, 0.3 * m), p=1.0),
    ]
    if channels == 3:
        ops.append(K.RandomSaturation(saturation=(1.0 - 0.9 * m, 1.0 + 0.9 * m), p=1.0))
    return ops


class RandAugment(nn.Module):
    """n random ops per sample, chosen independently for every sample."""

    def __init__(self, n: int = 2, m: float = 10.0, channels: int = 1):
        super().__init__()
        self.n = n
        self.ops = nn.ModuleList(randaugment_ops(m / 10.0, channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.n):
            choice = torch.randint(len(self.ops), (x.shape[0],), device=x.device)
            out = x.clone()
            for i, op in enumerate(self.ops):
                sel = torch.nonzero(choice == i).squeeze(1)
                if sel.numel():
                    out[sel] = op(x[sel]).clamp(0.0, 1.0)
            x = out
        return x


class StrongAugment(nn.Module):
    """Weak augmentation, RandAugment(n, m) and Cutout (FixMatch's strong view)."""

    def __init__(
        self,
        image_size: int,
        flip: bool,
        channels: int,
        n: int = 2,
        m: float = 10.0,
        shift: float = 0.125,
    ):
        super().__init__()
        self.weak = WeakAugment(image_size, flip, shift)
        self.randaugment = RandAugment(n, m, channels)
        self.cutout = K.RandomErasing(scale=(0.02, 0.15), ratio=(0.5, 2.0), value=0.5, p=1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cutout(self.randaugment(self.weak(x)))


def augment_grouped(
    x: torch.Tensor,
    batches: Iterable[torch.Tensor],
    augment: Callable[[torch.Tensor], torch.Tensor],
    group_size: int = AUGMENT_GROUP,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(idx, augment(x[idx])) for every index batch, augmenting about ``group_size``
    images per call.

    Every image still gets its own random ops; only the number of calls changes (each
    RandAugment call runs all of its ops once, so per-batch calls on small batches cost
    mostly call overhead).
    """
    pending: list[torch.Tensor] = []
    size = 0
    for idx in batches:
        pending.append(idx)
        size += len(idx)
        if size >= group_size:
            yield from _augment_pending(x, pending, size, augment)
            pending, size = [], 0
    yield from _augment_pending(x, pending, size, augment)


def _augment_pending(
    x: torch.Tensor,
    pending: list[torch.Tensor],
    size: int,
    augment: Callable[[torch.Tensor], torch.Tensor],
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    views = augment(x[torch.cat(pending)]) if size else x[:0]
    yield from zip(pending, views.split([len(i) for i in pending]), strict=True)


def grouped_views(
    x: torch.Tensor,
    batches: Iterable[torch.Tensor],
    augments: Sequence[Callable[[torch.Tensor], torch.Tensor]],
    group_size: int = AUGMENT_GROUP,
) -> Iterator[tuple[torch.Tensor, tuple[torch.Tensor, ...]]]:
    """(idx, (a(x[idx]) for a in augments)) for every index batch, each augmentation
    called on about ``group_size`` images at a time (see :func:`augment_grouped`)."""

    def every_view(images: torch.Tensor) -> torch.Tensor:
        return torch.stack([augment(images) for augment in augments], dim=1)

    for idx, views in augment_grouped(x, batches, every_view, group_size):
        yield idx, views.unbind(1)

"""Batched augmentation on the training device, random per sample (kornia ops).

Weak: random horizontal flip (not for digits) and a random shift by pad-and-crop
(FixMatch: up to 12.5% of the side; ``augment.weak_shift`` in the config).
Strong: weak, then RandAugment (n ops per sample, each op and its magnitude drawn
per sample, magnitude up to m/10 of its range, as in FixMatch's RandAugment),
then Cutout. kornia's own ``auto.RandAugment`` draws one sub-policy per batch, so
the op choice per sample is done here; the image ops themselves are kornia's.
FedMatch's official view (:class:`OfficialRandAugment`) draws the op count, the
magnitude levels and the rotations as the official code (randaug.py, loader.py).
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


def randaugment_ops(
    magnitude: float, channels: int, rotation: nn.Module | None = None
) -> list[nn.Module]:
    """The RandAugment op list with ranges scaled by magnitude in [0, 1] (``rotation``:
    another rotation op in place of the one up to 30 degrees either way)."""
    m = magnitude
    ops: list[nn.Module] = [
        nn.Identity(),
        K.RandomAutoContrast(p=1.0),
        K.RandomEqualize(p=1.0),
        K.RandomRotation(degrees=30.0 * m, p=1.0) if rotation is None else rotation,
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
            x = apply_chosen(x, choice, self.ops)
        return x


def apply_chosen(x: torch.Tensor, choice: torch.Tensor, ops: Sequence[nn.Module]) -> torch.Tensor:
    """Sample i through ``ops[choice[i]]`` (one call per op on its samples), clamped to [0, 1]."""
    out = x.clone()
    for i, op in enumerate(ops):
        sel = torch.nonzero(choice == i).squeeze(1)
        if sel.numel():
            out[sel] = op(x[sel]).clamp(0.0, 1.0)
    return out


# FedMatch official randaug.py: 13 ops, N = len(ops) // 2 of them a view.
OFFICIAL_OPS_PER_VIEW = 6
# FedMatch official loader.py draws M = random.randint(2, 5) per image; randaug.py then
# draws each op's level in 0..M-1 and reads its strength from np.linspace(0, max, 10).
OFFICIAL_BOUNDS = (2, 5)
OFFICIAL_LEVELS = 10
# randaug.py: rotate = np.linspace(0, 360, 10)[level] degrees, always the same way round
# (PIL's and kornia's positive angle: counter-clockwise); kornia fills with black, PIL 128.
OFFICIAL_DEGREES_PER_LEVEL = 40.0


def official_level_ops(level: int, channels: int) -> list[nn.Module]:
    """Our RandAugment ops at one official level: ranges at level / 9 of their maximum,
    rotation by exactly 40 x level degrees (FedMatch official randaug.py)."""
    degrees = OFFICIAL_DEGREES_PER_LEVEL * level
    rotation = K.RandomRotation(degrees=(degrees, degrees), p=1.0)
    return randaugment_ops(level / (OFFICIAL_LEVELS - 1), channels, rotation)


class OfficialRandAugment(nn.Module):
    """FedMatch's strong view as its official code draws it (loader.py, randaug.py): per
    image a bound M in 2..5, then 6 ops, each with its own level in 0..M-1; the ops are
    ours (:func:`randaugment_ops`) at that level (:func:`official_level_ops`)."""

    def __init__(self, channels: int = 1, n: int = OFFICIAL_OPS_PER_VIEW):
        super().__init__()
        self.n = n
        by_level = [official_level_ops(level, channels) for level in range(OFFICIAL_BOUNDS[1])]
        self.per_level = len(by_level[0])
        self.ops = nn.ModuleList(op for ops in by_level for op in ops)

    def draw(self, size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(ops, levels), each (size, n): every image's op indices and their levels."""
        low, high = OFFICIAL_BOUNDS
        bound = torch.randint(low, high + 1, (size, 1), device=device)
        ops = torch.randint(self.per_level, (size, self.n), device=device)
        levels = (torch.rand(size, self.n, device=device) * bound).long()
        return ops, levels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ops, levels = self.draw(x.shape[0], x.device)
        for k in range(self.n):
            x = apply_chosen(x, levels[:, k] * self.per_level + ops[:, k], self.ops)
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


def concrete_engine(engine: str, device: str | torch.device) -> str:
    """``augment.engine`` on ``device``: ``auto`` is ``batched`` on an accelerator (no host
    syncs) and ``kornia`` on the CPU (the views every committed CPU table was made with);
    ``kornia`` and ``batched`` are kept as named."""
    if engine != "auto":
        return engine
    return "kornia" if torch.device(device).type == "cpu" else "batched"


def engine_class(engine: str, name: str) -> type[nn.Module]:
    """``augment.engine``'s module ``name`` (``weak``, ``strong``, ``randaugment``,
    ``official``): this module's kornia one, or tasks.augment_batched's (``auto`` is
    resolved first, by :func:`concrete_engine`)."""
    from tasks import augment_batched as batched

    kornia = {
        "weak": WeakAugment,
        "strong": StrongAugment,
        "randaugment": RandAugment,
        "official": OfficialRandAugment,
    }
    engines = {
        "kornia": kornia,
        "batched": {
            "weak": batched.BatchedWeakAugment,
            "strong": batched.BatchedStrongAugment,
            "randaugment": batched.BatchedRandAugment,
            "official": batched.BatchedOfficialRandAugment,
        },
    }
    return engines[engine][name]


def weak_augment(engine: str, image_size: int, flip: bool, shift: float) -> nn.Module:
    """The weak view of ``augment.engine``."""
    return engine_class(engine, "weak")(image_size, flip, shift)


def strong_augment(
    engine: str, image_size: int, flip: bool, channels: int, n: int, m: float, shift: float
) -> nn.Module:
    """FixMatch's strong view of ``augment.engine``."""
    return engine_class(engine, "strong")(image_size, flip, channels, n, m, shift)


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

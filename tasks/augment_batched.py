"""The augmentations of :mod:`tasks.augment` without host syncs (``augment.engine: batched``).

:mod:`tasks.augment` picks each sample's RandAugment op with ``torch.nonzero`` and runs
every kornia op on its own samples: a device-to-host sync per op and step, each of which
drains a GPU's queue. Here every op's parameter is drawn as a tensor on the input's
device (the global torch RNG, so ``tasks.train.seeded`` makes a run reproducible), every
photometric op runs on the whole batch and each sample keeps its own op's result
(``torch.where``), and the geometric ops of a step (rotation, shear x and y, translation x
and y) are one 2x3 matrix per sample, applied by one ``F.affine_grid`` + ``F.grid_sample``
(bilinear, zero fill; the other samples get the identity and keep their photometric
result). No op reads a value back to the host.

Each op is a pure function of the images and per-sample parameters, matching the kornia
op that :func:`tasks.augment.randaugment_ops` builds for the same parameters:

- the photometric ops are kornia's formulas (equalize included: kornia's vectorised
  256-bin LUT, :func:`kornia.enhance.equalize`; posterize in floats), equal bit for bit
  but for float rounding in RGB contrast's grey mean (below 1e-7);
- the geometric ops map output pixels to input pixels as kornia's matrices do (rotation
  counter-clockwise about ((W-1)/2, (H-1)/2), shear by ``-tan`` about the same centre,
  translation in pixels). kornia's ``RandomRotation`` normalises with
  ``align_corners=True`` and ``RandomAffine`` with ``False``; either way the sampled pixel
  positions are the same, so one convention serves all, and the results differ only by
  the rounding of the sampling coordinates (about 1e-6 of a pixel);
- the weak view's flip and pad-and-crop shift (kornia ``RandomHorizontalFlip`` then
  ``RandomCrop`` with zero padding) is an integer translation and a mirror, sampled with
  ``mode="nearest"`` so that it is exact (bit for bit the crop);
- Cutout is kornia's ``RandomErasing`` box (area, aspect ratio and corner drawn as its
  generator draws them), filled with 0.5.

The parameters are drawn from the same distributions as :mod:`tasks.augment` but not from
the same random numbers: for a seed the two engines give different (equally likely)
views, so switching engines changes a run's numbers.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from tasks import syncs

# The op indices, in the order of tasks.augment.randaugment_ops (saturation for RGB only).
IDENTITY = 0
AUTOCONTRAST = 1
EQUALIZE = 2
ROTATE = 3
SOLARIZE = 4
POSTERIZE = 5
CONTRAST = 6
BRIGHTNESS = 7
SHARPNESS = 8
SHEAR_X = 9
SHEAR_Y = 10
TRANSLATE_X = 11
TRANSLATE_Y = 12
SATURATION = 13

# FedMatch's official view (tasks.augment's constants, kept here so that this module
# needs no kornia; tests/test_augment_batched.py checks that they agree).
OFFICIAL_OPS_PER_VIEW = 6
OFFICIAL_BOUNDS = (2, 5)
OFFICIAL_LEVELS = 10
OFFICIAL_DEGREES_PER_LEVEL = 40.0

# Cutout as tasks.augment.StrongAugment's K.RandomErasing: area share, aspect ratio, fill.
ERASE_SCALE = (0.02, 0.15)
ERASE_RATIO = (0.5, 2.0)
ERASE_VALUE = 0.5


def num_ops(channels: int) -> int:
    """The RandAugment op count: 13, and saturation for RGB."""
    return SATURATION + 1 if channels == 3 else SATURATION


def per_sample(values: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """(B,) values as (B, 1, 1, 1) in x's dtype, to broadcast over an image batch."""
    return values.to(x.dtype).view(-1, *([1] * (x.dim() - 1)))


# ----- Photometric ops --------------------------------------------------------------------
def autocontrast(x: torch.Tensor) -> torch.Tensor:
    """Every channel stretched to [0, 1] (kornia ``RandomAutoContrast``)."""
    flat = x.flatten(-2)
    low = flat.amin(-1, keepdim=True)
    high = flat.amax(-1, keepdim=True)
    return ((flat - low) / (high - low + 1e-6)).clamp(0.0, 1.0).view_as(x)


def equalize(x: torch.Tensor) -> torch.Tensor:
    """Histogram equalisation of every channel of every image on 256 levels (kornia
    ``RandomEqualize``: PIL's LUT, the level of a pixel being ``int(255 x)``)."""
    scaled = x.clamp(0.0, 1.0).flatten(0, 1).flatten(1) * 255.0
    planes = scaled.shape[0]
    counts_dtype = torch.promote_types(scaled.dtype, torch.float32)
    index = scaled.long()
    histogram = torch.zeros(planes, 256, device=x.device, dtype=counts_dtype)
    histogram.scatter_add_(1, index, torch.ones_like(scaled, dtype=counts_dtype))
    levels = torch.arange(256, device=x.device)
    last = torch.where(histogram > 0, levels, torch.zeros_like(levels)).amax(1, keepdim=True)
    spread = histogram.sum(1, keepdim=True) - histogram.gather(1, last)
    step = torch.div(spread, 255, rounding_mode="trunc")
    lut = torch.div(
        histogram.cumsum(1) + torch.div(step, 2, rounding_mode="trunc"),
        step.clamp(min=1),
        rounding_mode="trunc",
    )
    lut = torch.cat([torch.zeros_like(lut[:, :1]), lut[:, :-1]], 1).clamp(0, 255).to(scaled.dtype)
    out = torch.where(step == 0, scaled, lut.gather(1, index))
    return (out / 255.0).view_as(x)


def solarize(x: torch.Tensor, thresholds: torch.Tensor) -> torch.Tensor:
    """Pixels at or above the sample's threshold inverted (kornia ``RandomSolarize``,
    ``additions=0``)."""
    x = x.clamp(0.0, 1.0)
    return torch.where(x < per_sample(thresholds, x), x, 1.0 - x)


def posterize(x: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """The sample's ``bits`` high bits of every 8-bit level ``int(255 x)`` kept (kornia
    ``RandomPosterize``; in floats, bit for bit its uint8 arithmetic)."""
    x = x.clamp(0.0, 1.0)
    bits = per_sample(bits, x)
    scale = torch.pow(2.0, 8 - bits)
    out = torch.floor(torch.floor(x * 255) / scale) * scale / 255
    return torch.where(bits == 8, x, out)


def contrast(x: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    """A blend with the image's mean grey level (kornia ``ColorJitter(contrast=...)``,
    PIL's ``ImageEnhance.Contrast``)."""
    x = x.clamp(0.0, 1.0)
    if x.shape[-3] == 3:
        red, green, blue = x.unbind(-3)
        grey = 0.299 * red + 0.587 * green + 0.114 * blue
        mean = grey.mean((-2, -1), keepdim=True).unsqueeze(-3)
    else:
        mean = x.mean((-3, -2, -1), keepdim=True)
    factor = per_sample(factors, x)
    return (x * factor + mean * (1 - factor)).clamp(0.0, 1.0)


def brightness(x: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    """A blend with black, i.e. a product (kornia ``ColorJitter(brightness=...)``, PIL's
    ``ImageEnhance.Brightness``)."""
    return (x.clamp(0.0, 1.0) * per_sample(factors, x)).clamp(0.0, 1.0)


def smoothed(x: torch.Tensor) -> torch.Tensor:
    """PIL's SMOOTH filter (1 around a 5, over 13) on the inner pixels, as nine shifted
    sums: elementwise, so a sample's values do not depend on the batch it is in (a
    convolution's algorithm, and so its rounding, changes with the batch size)."""
    height, width = x.shape[-2:]
    total = 4 * x[..., 1 : height - 1, 1 : width - 1]
    for dy in range(3):
        for dx in range(3):
            total = total + x[..., dy : height - 2 + dy, dx : width - 2 + dx]
    return total / 13


def sharpness(x: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    """A blend with PIL's smoothed image, 0 = smoothed, 1 = the image (kornia
    ``RandomSharpness``; the border pixels stay)."""
    x = x.clamp(0.0, 1.0)
    smooth = smoothed(x).clamp(0.0, 1.0)
    inner = F.pad(torch.ones_like(smooth), [1, 1, 1, 1])
    blurred = torch.where(inner == 1, F.pad(smooth, [1, 1, 1, 1]), x)
    return (blurred + (x - blurred) * per_sample(factors, x)).clamp(0.0, 1.0)


def saturation(x: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    """HSV saturation scaled by the sample's factor, hue and value kept (kornia
    ``RandomSaturation``; RGB only)."""
    x = x.clamp(0.0, 1.0)
    high = x.amax(-3, keepdim=True)
    low = x.amin(-3, keepdim=True)
    delta = high - low
    value_divisor = torch.where(high == 0, torch.ones_like(high), high + 1e-8)
    scaled = (delta / value_divisor * per_sample(factors, x)).clamp(0.0, 1.0)
    adjusted = high * scaled
    delta_divisor = torch.where(delta == 0, torch.ones_like(delta), delta)
    return ((x - low) * (adjusted / delta_divisor) + (high - adjusted)).clamp(0.0, 1.0)


# ----- Geometric ops: per sample, the map from output pixels to input pixels -------------
def _matrix(entries: list[torch.Tensor]) -> torch.Tensor:
    """(B, 2, 3) from the six (B,) entries, row by row."""
    return torch.stack(entries, -1).view(-1, 2, 3)


def identity_source(size: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """(size, 2, 3) identity maps."""
    return torch.eye(2, 3, device=device, dtype=dtype).expand(size, 2, 3)


def rotation_source(degrees: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """A rotation by ``degrees`` counter-clockwise about the image centre (kornia
    ``RandomRotation``)."""
    radians = degrees * (math.pi / 180.0)
    cos, sin = torch.cos(radians), torch.sin(radians)
    cx, cy = (width - 1) / 2, (height - 1) / 2
    return _matrix([cos, -sin, cx - cos * cx + sin * cy, sin, cos, cy - sin * cx - cos * cy])


def shear_x_source(degrees: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """x' = x - tan(degrees) (y - cy) (kornia ``RandomAffine(shear=(s, s, 0, 0))``)."""
    tan = torch.tan(degrees * (math.pi / 180.0))
    one, zero = torch.ones_like(tan), torch.zeros_like(tan)
    return _matrix([one, tan, -tan * ((height - 1) / 2), zero, one, zero])


def shear_y_source(degrees: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """y' = y - tan(degrees) (x - cx) (kornia ``RandomAffine(shear=(0, 0, s, s))``)."""
    tan = torch.tan(degrees * (math.pi / 180.0))
    one, zero = torch.ones_like(tan), torch.zeros_like(tan)
    return _matrix([one, zero, zero, tan, one, -tan * ((width - 1) / 2)])


def translate_x_source(pixels: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """x' = x + pixels (kornia ``RandomAffine(translate=(t, 0))``, t times the width)."""
    one, zero = torch.ones_like(pixels), torch.zeros_like(pixels)
    return _matrix([one, zero, -pixels, zero, one, zero])


def translate_y_source(pixels: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """y' = y + pixels (kornia ``RandomAffine(translate=(0, t))``, t times the height)."""
    one, zero = torch.ones_like(pixels), torch.zeros_like(pixels)
    return _matrix([one, zero, zero, zero, one, -pixels])


def shift_source(
    dx: torch.Tensor, dy: torch.Tensor, flip: torch.Tensor, height: int, width: int
) -> torch.Tensor:
    """The weak view: output pixel (i, j) reads input (i + dy, j + dx), the columns first
    mirrored where ``flip`` (kornia ``RandomHorizontalFlip`` then ``RandomCrop`` with zero
    padding, the crop's corner at (pad + dy, pad + dx) of the padded image)."""
    dx, dy = dx.float(), dy.float()
    sign = torch.where(flip, -1.0, 1.0)
    one, zero = torch.ones_like(dx), torch.zeros_like(dx)
    return _matrix([sign, zero, torch.where(flip, width - 1 - dx, dx), zero, one, dy])


def warp(x: torch.Tensor, source: torch.Tensor, mode: str = "bilinear") -> torch.Tensor:
    """Output pixel p of every image sampled at ``source @ (p, 1)`` of its input (pixel
    coordinates, centres at integers), zero outside: one ``affine_grid`` + ``grid_sample``."""
    height, width = x.shape[-2:]
    source = source.to(x.dtype)
    a, b, c = source[:, 0].unbind(-1)
    d, e, f = source[:, 1].unbind(-1)
    # The same map on grid_sample's [-1, 1] coordinates (align_corners=False: pixel k of n
    # at (2k + 1) / n - 1).
    theta = _matrix(
        [
            a,
            b * (height / width),
            (a * (width - 1) + b * (height - 1) + 2 * c + 1) / width - 1,
            d * (width / height),
            e,
            (d * (width - 1) + e * (height - 1) + 2 * f + 1) / height - 1,
        ]
    )
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode=mode, padding_mode="zeros", align_corners=False)


def rotate(x: torch.Tensor, degrees: torch.Tensor) -> torch.Tensor:
    """Rotation by the sample's degrees, counter-clockwise (kornia ``RandomRotation``)."""
    return warp(x, rotation_source(degrees, *x.shape[-2:]))


def shear_x(x: torch.Tensor, degrees: torch.Tensor) -> torch.Tensor:
    """Horizontal shear by the sample's angle (kornia ``RandomAffine`` shear x)."""
    return warp(x, shear_x_source(degrees, *x.shape[-2:]))


def shear_y(x: torch.Tensor, degrees: torch.Tensor) -> torch.Tensor:
    """Vertical shear by the sample's angle (kornia ``RandomAffine`` shear y)."""
    return warp(x, shear_y_source(degrees, *x.shape[-2:]))


def translate_x(x: torch.Tensor, pixels: torch.Tensor) -> torch.Tensor:
    """Horizontal translation by the sample's pixels (kornia ``RandomAffine`` translate)."""
    return warp(x, translate_x_source(pixels, *x.shape[-2:]))


def translate_y(x: torch.Tensor, pixels: torch.Tensor) -> torch.Tensor:
    """Vertical translation by the sample's pixels (kornia ``RandomAffine`` translate)."""
    return warp(x, translate_y_source(pixels, *x.shape[-2:]))


def shift_and_flip(
    x: torch.Tensor, dx: torch.Tensor, dy: torch.Tensor, flip: torch.Tensor
) -> torch.Tensor:
    """The weak view for given integer shifts and flips (:func:`shift_source`), exact:
    nearest sampling at integer positions."""
    return warp(x, shift_source(dx, dy, flip, *x.shape[-2:]), mode="nearest")


def erase(
    x: torch.Tensor,
    top: torch.Tensor,
    left: torch.Tensor,
    height: torch.Tensor,
    width: torch.Tensor,
    value: float = ERASE_VALUE,
) -> torch.Tensor:
    """Every image's box (rows top..top+height-1, columns left..left+width-1) set to
    ``value`` (kornia ``RandomErasing`` for given boxes)."""
    rows = torch.arange(x.shape[-2], device=x.device, dtype=x.dtype).view(1, -1, 1)
    cols = torch.arange(x.shape[-1], device=x.device, dtype=x.dtype).view(1, 1, -1)
    top, left = top.to(x.dtype).view(-1, 1, 1), left.to(x.dtype).view(-1, 1, 1)
    bottom = top + height.to(x.dtype).view(-1, 1, 1)
    right = left + width.to(x.dtype).view(-1, 1, 1)
    inside = (rows >= top) & (rows < bottom) & (cols >= left) & (cols < right)
    return torch.where(inside.unsqueeze(1), value, x)


def erase_boxes(
    size: int, height: int, width: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(top, left, height, width) of every image's Cutout box, drawn as kornia's
    ``RectangleEraseGenerator`` draws them for ``tasks.augment.StrongAugment``'s Cutout:
    area a share in ``ERASE_SCALE`` of the image, aspect ratio in ``ERASE_RATIO`` (half of
    the boxes below 1, half above), corner uniform with the box inside the image."""
    share = ERASE_SCALE[0] + torch.rand(size, device=device) * (ERASE_SCALE[1] - ERASE_SCALE[0])
    area = share * (height * width)
    narrow = ERASE_RATIO[0] + torch.rand(size, device=device) * (1.0 - ERASE_RATIO[0])
    wide = 1.0 + torch.rand(size, device=device) * (ERASE_RATIO[1] - 1.0)
    ratio = torch.where(torch.rand(size, device=device).round().bool(), narrow, wide)
    box_height = (area * ratio).sqrt().round().clamp(1.0, height)
    box_width = (area / ratio).sqrt().round().clamp(1.0, width)
    left = (torch.rand(size, device=device) * (width - box_width + 1)).floor()
    top = (torch.rand(size, device=device) * (height - box_height + 1)).floor()
    return top, left, box_height, box_width


# ----- RandAugment --------------------------------------------------------------------------
# An op: (images, each image's parameter) -> images.
PhotometricOp = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

PHOTOMETRIC: dict[int, PhotometricOp] = {
    AUTOCONTRAST: lambda x, v: autocontrast(x),
    EQUALIZE: lambda x, v: equalize(x),
    SOLARIZE: solarize,
    POSTERIZE: posterize,
    CONTRAST: contrast,
    BRIGHTNESS: brightness,
    SHARPNESS: sharpness,
    SATURATION: saturation,
}
GEOMETRIC = {
    ROTATE: rotation_source,
    SHEAR_X: shear_x_source,
    SHEAR_Y: shear_y_source,
    TRANSLATE_X: translate_x_source,
    TRANSLATE_Y: translate_y_source,
}


def op_values(
    choice: torch.Tensor,
    u: torch.Tensor,
    magnitude: torch.Tensor,
    height: int,
    width: int,
    degrees: torch.Tensor | None = None,
) -> torch.Tensor:
    """Each sample's parameter for its op ``choice``, at ``u`` in [0, 1) of that op's range
    at its ``magnitude`` in [0, 1], the ranges of :func:`tasks.augment.randaugment_ops`:
    rotation +-30 m degrees (or ``degrees``: FedMatch's official view), solarize threshold
    0.5 +- 0.5 m, posterize bits in [max(1, 8 - 4 m), 8] rounded, contrast, brightness and
    saturation 1 +- 0.9 m, sharpness in [0, 0.9 m], shear +-17 m degrees, translation
    +-0.3 m of the side in pixels."""
    m = magnitude
    spread = 2.0 * u - 1.0
    fewest_bits = (8.0 - 4.0 * m).clamp(min=1.0)
    factor = 1.0 + spread * (0.9 * m)
    values = {
        ROTATE: spread * (30.0 * m) if degrees is None else degrees.to(u.dtype),
        SOLARIZE: 0.5 + spread * (0.5 * m),
        POSTERIZE: (fewest_bits + u * (8.0 - fewest_bits)).round(),
        CONTRAST: factor,
        BRIGHTNESS: factor,
        SHARPNESS: u * (0.9 * m),
        SHEAR_X: spread * (17.0 * m),
        SHEAR_Y: spread * (17.0 * m),
        TRANSLATE_X: spread * (0.3 * m) * width,
        TRANSLATE_Y: spread * (0.3 * m) * height,
        SATURATION: factor,
    }
    value = torch.zeros_like(u)
    for op, op_value in values.items():
        value = torch.where(choice == op, op_value, value)
    return value


def apply_chosen(x: torch.Tensor, choice: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """Sample i through op ``choice[i]`` with parameter ``value[i]``, clamped to [0, 1]
    (as tasks.augment.apply_chosen). On an accelerator every op runs on the whole batch
    and each sample keeps its own op's result (no host sync); on the CPU, where reading
    the choices back costs nothing, each op runs on its own samples only: the same values,
    bit for bit (tests/test_augment_batched.py), a strong view about 4x faster
    (benchmarks/augment_speed.py)."""
    if x.device.type == "cpu" and not syncs.counting():
        return apply_chosen_indexed(x, choice, value)
    return apply_chosen_masked(x, choice, value)


def geometric_sources(
    choice: torch.Tensor, value: torch.Tensor, height: int, width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(source, geometric): each sample's 2x3 warp matrix (the identity for a photometric
    op) and whether its op is geometric."""
    source = identity_source(choice.shape[0], choice.device, value.dtype)
    geometric = torch.zeros_like(choice, dtype=torch.bool)
    for op, matrix in GEOMETRIC.items():
        source = torch.where((choice == op).view(-1, 1, 1), matrix(value, height, width), source)
        geometric = geometric | (choice == op)
    return source, geometric


def photometric_ops(x: torch.Tensor) -> dict[int, PhotometricOp]:
    """The photometric ops that apply to ``x`` (saturation for RGB only)."""
    return {op: f for op, f in PHOTOMETRIC.items() if op != SATURATION or x.shape[-3] == 3}


def apply_chosen_masked(x: torch.Tensor, choice: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """:func:`apply_chosen` without host syncs: every op on the whole batch, selected by
    ``torch.where``; the geometric ops as one warp."""
    chosen = choice.view(-1, 1, 1, 1)
    out = x
    for op, apply in photometric_ops(x).items():
        out = torch.where(chosen == op, apply(x, value), out)
    source, geometric = geometric_sources(choice, value, *x.shape[-2:])
    out = torch.where(geometric.view(-1, 1, 1, 1), warp(x, source), out)
    return out.clamp(0.0, 1.0)


def apply_chosen_indexed(
    x: torch.Tensor, choice: torch.Tensor, value: torch.Tensor
) -> torch.Tensor:
    """:func:`apply_chosen` with each op run on the samples that chose it (index reads:
    host syncs on an accelerator, free on the CPU)."""
    out = x.clone()
    for op, apply in photometric_ops(x).items():
        index = (choice == op).nonzero().view(-1)
        if index.numel():
            out[index] = apply(x[index], value[index])
    source, geometric = geometric_sources(choice, value, *x.shape[-2:])
    index = geometric.nonzero().view(-1)
    if index.numel():
        out[index] = warp(x[index], source[index])
    return out.clamp(0.0, 1.0)


class BatchedWeakAugment(nn.Module):
    """Flip (optional) and a shift by up to ``shift`` of the side (zero fill), per sample
    (tasks.augment.WeakAugment)."""

    def __init__(self, image_size: int, flip: bool, shift: float = 0.125):
        super().__init__()
        self.flip = flip
        self.pad = max(1, round(image_size * shift))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size, device = x.shape[0], x.device
        dx = torch.randint(-self.pad, self.pad + 1, (size,), device=device)
        dy = torch.randint(-self.pad, self.pad + 1, (size,), device=device)
        if self.flip:
            flip = torch.rand(size, device=device) < 0.5
        else:
            flip = torch.zeros(size, dtype=torch.bool, device=device)
        return shift_and_flip(x, dx, dy, flip)


class BatchedRandAugment(nn.Module):
    """n random ops per sample, each op and its parameter drawn per sample, ranges at
    magnitude m / 10 (tasks.augment.RandAugment)."""

    def __init__(self, n: int = 2, m: float = 10.0, channels: int = 1):
        super().__init__()
        self.n = n
        self.magnitude = m / 10.0
        self.num_ops = num_ops(channels)

    def draw(self, size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(ops, u), each (size, n): every image's op indices and their draws in [0, 1)."""
        ops = torch.randint(self.num_ops, (size, self.n), device=device)
        return ops, torch.rand(size, self.n, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ops, u = self.draw(x.shape[0], x.device)
        magnitude = torch.full((x.shape[0],), self.magnitude, device=x.device)
        for k in range(self.n):
            value = op_values(ops[:, k], u[:, k], magnitude, *x.shape[-2:])
            x = apply_chosen(x, ops[:, k], value)
        return x


class BatchedOfficialRandAugment(nn.Module):
    """FedMatch's strong view as its official code draws it: per image a bound M in 2..5,
    then n ops, each with its own level in 0..M-1, at magnitude level / 9, rotation by
    exactly 40 x level degrees (tasks.augment.OfficialRandAugment)."""

    def __init__(self, channels: int = 1, n: int = OFFICIAL_OPS_PER_VIEW):
        super().__init__()
        self.n = n
        self.per_level = num_ops(channels)

    def draw(self, size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(ops, levels), each (size, n): every image's op indices and their levels."""
        low, high = OFFICIAL_BOUNDS
        bound = torch.randint(low, high + 1, (size, 1), device=device)
        ops = torch.randint(self.per_level, (size, self.n), device=device)
        levels = (torch.rand(size, self.n, device=device) * bound).long()
        return ops, levels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ops, levels = self.draw(x.shape[0], x.device)
        u = torch.rand(x.shape[0], self.n, device=x.device)
        for k in range(self.n):
            level = levels[:, k].float()
            value = op_values(
                ops[:, k],
                u[:, k],
                level / (OFFICIAL_LEVELS - 1),
                *x.shape[-2:],
                degrees=OFFICIAL_DEGREES_PER_LEVEL * level,
            )
            x = apply_chosen(x, ops[:, k], value)
        return x


class BatchedStrongAugment(nn.Module):
    """The weak view, RandAugment(n, m) and Cutout (tasks.augment.StrongAugment)."""

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
        self.weak = BatchedWeakAugment(image_size, flip, shift)
        self.randaugment = BatchedRandAugment(n, m, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.randaugment(self.weak(x))
        return erase(x, *erase_boxes(x.shape[0], *x.shape[-2:], x.device))

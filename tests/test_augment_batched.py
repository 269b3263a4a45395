"""The batched augmentation engine (tasks/augment_batched.py, ``augment.engine: batched``):
every op against the kornia op of tasks/augment.py for the same parameters, the per-sample
choice, the draws, and no device-to-host sync in any forward."""

from __future__ import annotations

from types import SimpleNamespace

import kornia
import pytest
import torch
from kornia import augmentation as K
from torch.utils._python_dispatch import TorchDispatchMode

from client_app import fedseal
from client_app.base import ClientHalf, augmenters, weak_augmenter
from client_app.fedmatch import FedMatchSettings, strong_view
from ssfl.experiment import resolve_config
from strategies.parts import ServerSide
from tasks import augment
from tasks import augment_batched as B
from tasks.augment import OfficialRandAugment, RandAugment, WeakAugment, randaugment_ops
from tasks.config import ConfigError
from tasks.settings import AugmentSettings
from tasks.syncs import SyncCounter
from tests.harness import InProcessGrid, run_method, tiny_raw

# Photometric ops are the same formulas as kornia's, so they agree to float rounding.
PHOTOMETRIC_TOL = 1e-5
# Geometric ops: the same pixel-space maps, but kornia builds its sampling grid through
# its own normalisation (align_corners=True for RandomRotation) and we through
# F.affine_grid (align_corners=False), so the sampling positions differ by rounding
# (about 1e-6 of a pixel) and the bilinear values by that times a neighbour difference.
GEOMETRIC_TOL = 2e-5


def images(n: int = 32, channels: int = 1, size: int = 28) -> torch.Tensor:
    """Random images with what the ops treat specially: a black border (zero fill,
    solarize), a few flat images (autocontrast, equalize's step 0) and few-level ones."""
    torch.manual_seed(0)
    x = torch.rand(n, channels, size, size)
    x[:, :, :3] = 0.0
    x[: n // 8] = 0.3
    x[n // 8 : n // 4] = (x[n // 8 : n // 4] * 4).floor() / 4
    return x


def close(a: torch.Tensor, b: torch.Tensor, tol: float) -> bool:
    return a.shape == b.shape and float((a - b).abs().max()) <= tol


# ----- Each op against kornia's for the parameters kornia drew ---------------------------
PARAMETRIC = [
    (B.SOLARIZE, K.RandomSolarize, "thresholds", B.solarize),
    (B.POSTERIZE, K.RandomPosterize, "bits_factor", B.posterize),
    (B.CONTRAST, K.ColorJitter, "contrast_factor", B.contrast),
    (B.BRIGHTNESS, K.ColorJitter, "brightness_factor", B.brightness),
    (B.SHARPNESS, K.RandomSharpness, "sharpness", B.sharpness),
    (B.SATURATION, K.RandomSaturation, "saturation_factor", B.saturation),
]


@pytest.mark.parametrize(
    "channels, op, kind, key, ours",
    [(c, *case) for c in (1, 3) for case in PARAMETRIC if c == 3 or case[0] != B.SATURATION],
)
def test_photometric_op_matches_kornia_per_sample(channels, op, kind, key, ours):
    x = images(channels=channels)
    theirs = randaugment_ops(1.0, channels)[op]
    assert isinstance(theirs, kind)  # our op index is the op's place in randaugment_ops
    expected = theirs(x)
    assert close(ours(x, theirs._params[key]), expected, PHOTOMETRIC_TOL)


@pytest.mark.parametrize("channels", [1, 3])
def test_autocontrast_and_equalize_match_kornia(channels):
    x = images(channels=channels)
    assert close(B.autocontrast(x), K.RandomAutoContrast(p=1.0)(x), PHOTOMETRIC_TOL)
    assert close(B.equalize(x), K.RandomEqualize(p=1.0)(x), PHOTOMETRIC_TOL)


def test_fixed_photometric_parameters_match_kornia():
    x = images()
    n = len(x)
    assert close(
        B.solarize(x, torch.full((n,), 0.4)),
        K.RandomSolarize(thresholds=(0.4, 0.4), additions=0.0, p=1.0)(x),
        PHOTOMETRIC_TOL,
    )
    for bits in (1, 3, 8):
        expected = K.RandomPosterize(bits=(bits, bits), p=1.0)(x)
        assert close(B.posterize(x, torch.full((n,), bits)), expected, PHOTOMETRIC_TOL)
    assert close(
        B.contrast(x, torch.full((n,), 0.3)),
        K.ColorJitter(contrast=(0.3, 0.3), p=1.0)(x),
        PHOTOMETRIC_TOL,
    )
    assert close(
        B.sharpness(x, torch.full((n,), 0.25)),
        K.RandomSharpness(sharpness=(0.25, 0.25), p=1.0)(x),
        PHOTOMETRIC_TOL,
    )


def test_posterize_is_kornias_bit_for_bit_at_every_level():
    levels = torch.arange(256) / 255.0
    values = torch.cat([torch.linspace(0, 1, 100_001), levels, levels + 1e-7, levels - 1e-7])
    x = values.clamp(0, 1).expand(9, -1).reshape(9, 1, 1, -1)
    bits = torch.arange(9)
    assert torch.equal(B.posterize(x, bits), kornia.enhance.posterize(x, bits))


def test_rotation_by_exactly_20_degrees_matches_kornia():
    x = images()
    expected = K.RandomRotation(degrees=(20.0, 20.0), p=1.0)(x)
    assert close(B.rotate(x, torch.full((len(x),), 20.0)), expected, GEOMETRIC_TOL)


@pytest.mark.parametrize("level", range(augment.OFFICIAL_LEVELS))
def test_official_rotation_levels_match_kornia(level):
    x = images(8)
    degrees = B.OFFICIAL_DEGREES_PER_LEVEL * level
    expected = augment.official_level_ops(level, 1)[B.ROTATE](x)
    assert close(B.rotate(x, torch.full((8,), degrees)), expected, GEOMETRIC_TOL)


@pytest.mark.parametrize("channels", [1, 3])
def test_geometric_ops_match_kornia_per_sample(channels):
    x = images(channels=channels)
    ops = randaugment_ops(1.0, channels)
    rotation = ops[B.ROTATE]
    expected = rotation(x)
    assert close(B.rotate(x, rotation._params["degrees"]), expected, GEOMETRIC_TOL)
    for op, key, ours in ((B.SHEAR_X, "shear_x", B.shear_x), (B.SHEAR_Y, "shear_y", B.shear_y)):
        expected = ops[op](x)
        assert close(ours(x, ops[op]._params[key]), expected, GEOMETRIC_TOL)
    for op, axis, ours in ((B.TRANSLATE_X, 0, B.translate_x), (B.TRANSLATE_Y, 1, B.translate_y)):
        expected = ops[op](x)
        shift = ops[op]._params["translations"][:, axis]
        assert close(ours(x, shift), expected, GEOMETRIC_TOL)


@pytest.mark.parametrize(
    "flip, shift, size", [(True, 0.125, 28), (False, 0.0625, 28), (True, 0.125, 32)]
)
def test_weak_view_equals_kornias_flip_and_crop_exactly(flip, shift, size):
    x = images(64, 3 if size == 32 else 1, size)
    weak = WeakAugment(size, flip, shift)
    expected = weak(x)
    pad = max(1, round(size * shift))
    corner = weak.ops[-1]._params["src"][:, 0].long()  # the crop's corner in the padded image
    flipped = weak.ops[0]._params["batch_prob"] > 0.5 if flip else torch.zeros(64, dtype=torch.bool)
    assert 0 < int(flipped.sum()) < 64 or not flip
    out = B.shift_and_flip(x, corner[:, 0] - pad, corner[:, 1] - pad, flipped)
    assert torch.equal(out, expected)  # nearest sampling at integer positions: exact


def test_cutout_box_equals_kornias_erasing_exactly():
    x = images()
    erasing = K.RandomErasing(scale=(0.02, 0.15), ratio=(0.5, 2.0), value=0.5, p=1.0)
    expected = erasing(x)
    p = erasing._params
    assert torch.equal(B.erase(x, p["ys"], p["xs"], p["heights"], p["widths"]), expected)


def test_cutout_boxes_are_drawn_as_kornias():
    torch.manual_seed(0)
    top, left, height, width = B.erase_boxes(20000, 28, 28, torch.device("cpu"))
    assert bool((top >= 0).all() and (top + height <= 28).all())
    assert bool((left >= 0).all() and (left + width <= 28).all())
    erasing = K.RandomErasing(scale=(0.02, 0.15), ratio=(0.5, 2.0), value=0.5, p=1.0)
    erasing(torch.zeros(20000, 1, 28, 28))
    for ours, key in ((height, "heights"), (width, "widths")):
        theirs = erasing._params[key]
        assert abs(float(ours.mean() - theirs.mean())) < 0.02 * float(theirs.mean())
        shares = [torch.bincount(side.long(), minlength=29) / len(side) for side in (ours, theirs)]
        assert float((shares[0] - shares[1]).abs().sum()) / 2 < 0.03  # total variation


# ----- The draws -----------------------------------------------------------------------------
PARAMETER_KEYS = {
    B.ROTATE: "degrees",
    B.SOLARIZE: "thresholds",
    B.POSTERIZE: "bits_factor",
    B.CONTRAST: "contrast_factor",
    B.BRIGHTNESS: "brightness_factor",
    B.SHARPNESS: "sharpness",
    B.SHEAR_X: "shear_x",
    B.SHEAR_Y: "shear_y",
    B.TRANSLATE_X: "translations",
    B.TRANSLATE_Y: "translations",
    B.SATURATION: "saturation_factor",
}


@pytest.mark.parametrize("magnitude", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("op", sorted(PARAMETER_KEYS))
def test_parameters_are_drawn_in_the_ranges_of_randaugment_ops(op, magnitude):
    n, size = 4000, 8
    theirs = randaugment_ops(magnitude, 3)[op]
    theirs(torch.rand(n, 3, size, size))
    expected = theirs._params[PARAMETER_KEYS[op]].float()
    if op in (B.TRANSLATE_X, B.TRANSLATE_Y):
        expected = expected[:, op - B.TRANSLATE_X]
    torch.manual_seed(1)
    choice = torch.full((n,), op)
    ours = B.op_values(choice, torch.rand(n), torch.full((n,), magnitude), size, size)
    width = float(expected.max() - expected.min())
    tol = 0.01 * width + 1e-6
    assert abs(float(ours.min() - expected.min())) <= tol
    assert abs(float(ours.max() - expected.max())) <= tol
    assert abs(float(ours.mean() - expected.mean())) <= 0.05 * width + 1e-6
    if op == B.POSTERIZE:
        assert set(ours.long().tolist()) == set(expected.long().tolist())


def test_official_parameters_rotate_by_exactly_40_degrees_a_level():
    levels = torch.arange(5).repeat(20)
    n = len(levels)
    magnitude = levels / (B.OFFICIAL_LEVELS - 1)
    degrees = B.OFFICIAL_DEGREES_PER_LEVEL * levels
    rotation = B.op_values(torch.full((n,), B.ROTATE), torch.rand(n), magnitude, 28, 28, degrees)
    assert torch.equal(rotation, 40.0 * levels)
    shear = B.op_values(
        torch.full((n,), B.SHEAR_X), torch.ones(n) - 1e-7, magnitude, 28, 28, degrees
    )
    assert close(shear, 17.0 * magnitude, 1e-4)  # the other ops at magnitude level / 9


def test_official_constants_are_tasks_augments():
    assert B.OFFICIAL_OPS_PER_VIEW == augment.OFFICIAL_OPS_PER_VIEW
    assert B.OFFICIAL_BOUNDS == augment.OFFICIAL_BOUNDS
    assert B.OFFICIAL_LEVELS == augment.OFFICIAL_LEVELS
    assert B.OFFICIAL_DEGREES_PER_LEVEL == augment.OFFICIAL_DEGREES_PER_LEVEL
    assert [B.num_ops(c) for c in (1, 3)] == [len(randaugment_ops(1.0, c)) for c in (1, 3)]


@pytest.mark.parametrize("channels", [1, 3])
def test_op_choices_are_uniform(channels):
    torch.manual_seed(0)
    ops, u = B.BatchedRandAugment(2, 10, channels).draw(13000, torch.device("cpu"))
    counts = torch.bincount(ops.flatten(), minlength=B.num_ops(channels))
    expected = ops.numel() / B.num_ops(channels)
    assert len(counts) == B.num_ops(channels)
    assert float((counts - expected).abs().max()) < 0.1 * expected
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0


def test_official_draw_is_tasks_augments():
    torch.manual_seed(5)
    theirs = OfficialRandAugment(1).draw(8192, torch.device("cpu"))
    torch.manual_seed(5)
    ours = B.BatchedOfficialRandAugment(1).draw(8192, torch.device("cpu"))
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))


# ----- Per-sample choice ---------------------------------------------------------------------
SINGLE = {
    B.IDENTITY: lambda x, v: x,
    B.AUTOCONTRAST: lambda x, v: B.autocontrast(x),
    B.EQUALIZE: lambda x, v: B.equalize(x),
    B.ROTATE: B.rotate,
    B.SOLARIZE: B.solarize,
    B.POSTERIZE: B.posterize,
    B.CONTRAST: B.contrast,
    B.BRIGHTNESS: B.brightness,
    B.SHARPNESS: B.sharpness,
    B.SHEAR_X: B.shear_x,
    B.SHEAR_Y: B.shear_y,
    B.TRANSLATE_X: B.translate_x,
    B.TRANSLATE_Y: B.translate_y,
    B.SATURATION: B.saturation,
}
VALUES = {
    B.ROTATE: 25.0,
    B.SOLARIZE: 0.6,
    B.POSTERIZE: 3.0,
    B.CONTRAST: 0.4,
    B.BRIGHTNESS: 1.6,
    B.SHARPNESS: 0.2,
    B.SHEAR_X: -12.0,
    B.SHEAR_Y: 9.0,
    B.TRANSLATE_X: 5.5,
    B.TRANSLATE_Y: -3.2,
    B.SATURATION: 1.7,
}


@pytest.mark.parametrize("channels", [1, 3])
def test_each_sample_gets_its_own_op(channels):
    ops = B.num_ops(channels)
    order = torch.randperm(3 * ops, generator=torch.Generator().manual_seed(0))
    choice = torch.arange(ops).repeat(3)[order]
    x = images(len(choice), channels)
    value = torch.tensor([VALUES.get(int(c), 0.0) for c in choice])
    out = B.apply_chosen(x, choice, value)
    for i, c in enumerate(choice.tolist()):
        alone = SINGLE[c](x[i : i + 1], value[i : i + 1]).clamp(0.0, 1.0)
        assert close(out[i : i + 1], alone, 1e-6), c
    assert torch.equal(out[choice == B.IDENTITY], x[choice == B.IDENTITY])


def test_official_view_equals_tasks_augments_for_the_same_draw(monkeypatch):
    """Both engines with one draw of ops and levels (ops whose result the draw fixes:
    identity, autocontrast and the exact official rotations)."""
    torch.manual_seed(2)
    size, n = 32, B.OFFICIAL_OPS_PER_VIEW
    ops = torch.tensor([B.IDENTITY, B.AUTOCONTRAST, B.ROTATE])[torch.randint(3, (size, n))]
    levels = torch.randint(5, (size, n))
    x = images(size)

    def fixed(self, size, device):
        return ops, levels

    monkeypatch.setattr(OfficialRandAugment, "draw", fixed)
    monkeypatch.setattr(B.BatchedOfficialRandAugment, "draw", fixed)
    expected = OfficialRandAugment(1)(x)
    assert close(B.BatchedOfficialRandAugment(1)(x), expected, n * GEOMETRIC_TOL)


# ----- The modules ---------------------------------------------------------------------------
def modules(channels: int, size: int) -> list[torch.nn.Module]:
    return [
        B.BatchedWeakAugment(size, flip=True),
        B.BatchedRandAugment(2, 10.0, channels),
        B.BatchedStrongAugment(size, True, channels),
        B.BatchedOfficialRandAugment(channels),
    ]


@pytest.mark.parametrize("channels, size", [(1, 28), (3, 32)])
def test_modules_keep_shape_dtype_and_range_and_are_seeded(channels, size):
    x = images(64, channels, size)
    for module in modules(channels, size):
        torch.manual_seed(3)
        out = module(x)
        assert out.shape == x.shape and out.dtype == x.dtype
        assert float(out.min()) >= 0.0 and float(out.max()) <= 1.0
        assert len({tuple(o.flatten().round(decimals=4).tolist()) for o in out[32:]}) > 20
        torch.manual_seed(3)
        assert torch.equal(out, module(x)), type(module).__name__


class HostSyncs(TorchDispatchMode):
    """Records every aten op that reads a device value back to the host."""

    READS = frozenset(
        {
            torch.ops.aten._local_scalar_dense,
            torch.ops.aten.item,
            torch.ops.aten.is_nonzero,
            torch.ops.aten.equal,
            torch.ops.aten.nonzero,
            torch.ops.aten.masked_select,
            torch.ops.aten._unique,
            torch.ops.aten._unique2,
            torch.ops.aten.unique_dim,
            torch.ops.aten.unique_consecutive,
        }
    )
    INDEXING = frozenset(
        {torch.ops.aten.index, torch.ops.aten.index_put, torch.ops.aten.index_put_}
    )

    def __init__(self) -> None:
        super().__init__()
        self.syncs: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        packet = func.overloadpacket
        if packet in self.READS or (packet in self.INDEXING and self.boolean(args[1])):
            self.syncs.append(str(func))
        return func(*args, **(kwargs or {}))

    @staticmethod
    def boolean(indices) -> bool:
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices)


@pytest.mark.parametrize("channels, size", [(1, 28), (3, 32)])
def test_no_module_reads_back_to_the_host(channels, size):
    """What an accelerator runs (the path taken while a SyncCounter counts) reads nothing
    back, by this test's own list of reads and by the project's counter."""
    x = images(32, channels, size)
    for module in modules(channels, size):
        with SyncCounter() as counter, HostSyncs() as mode:
            module(x)
        assert mode.syncs == [] and counter.total == 0, type(module).__name__


@pytest.mark.parametrize("channels, size", [(1, 28), (3, 32)])
@pytest.mark.parametrize("batch", [1, 5, 37, 256])
def test_the_cpus_indexed_ops_give_the_accelerators_masked_values_bit_for_bit(
    channels, size, batch
):
    """On the CPU each op runs on its own samples only; the values are those of the
    accelerator's path (every op on the whole batch), to the bit, whatever the batch."""
    x = images(batch, channels, size)
    for seed in range(4):
        torch.manual_seed(seed)
        choice = torch.randint(B.num_ops(channels), (batch,))
        u, magnitude = torch.rand(batch), torch.rand(batch)
        value = B.op_values(choice, u, magnitude, size, size)
        masked = B.apply_chosen_masked(x, choice, value)
        assert torch.equal(B.apply_chosen_indexed(x, choice, value), masked)


def test_the_cpu_takes_the_indexed_path_unless_syncs_are_counted(monkeypatch):
    taken: list[str] = []
    monkeypatch.setattr(B, "apply_chosen_indexed", lambda *a: taken.append("indexed") or a[0])
    monkeypatch.setattr(B, "apply_chosen_masked", lambda *a: taken.append("masked") or a[0])
    x = images(8)
    B.BatchedRandAugment(2, 10.0, 1)(x)
    with SyncCounter():
        B.BatchedRandAugment(2, 10.0, 1)(x)
    assert taken == ["indexed", "indexed", "masked", "masked"]


def test_the_sync_counter_catches_the_kornia_engine():
    with HostSyncs() as mode:
        RandAugment(2, 10.0, 1)(images(32))
    assert "aten.nonzero.default" in mode.syncs


# ----- The config and the client's modules --------------------------------------------------
def test_the_engine_is_a_config_key():
    assert resolve_config({"method": "fedavg_fixmatch"})["augment"]["engine"] == "auto"
    raw = {"method": "fedavg_fixmatch", "augment": {"engine": "batched"}}
    assert resolve_config(raw)["augment"]["engine"] == "batched"
    with pytest.raises(ConfigError, match=r"'augment.engine': 'fast' is not one of") as err:
        resolve_config({"method": "fedavg_fixmatch", "augment": {"engine": "fast"}})
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "engine, device, runs",
    [
        ("auto", "cpu", "kornia"),
        ("auto", "cuda", "batched"),
        ("auto", torch.device("cuda", 0), "batched"),
        ("auto", "mps", "batched"),
        ("kornia", "cuda", "kornia"),
        ("batched", "cpu", "batched"),
    ],
)
def test_auto_is_the_batched_engine_on_an_accelerator_and_kornia_on_the_cpu(engine, device, runs):
    assert augment.concrete_engine(engine, device) == runs


def test_auto_must_be_resolved_before_a_module_is_picked():
    with pytest.raises(KeyError):
        augment.engine_class("auto", "weak")


def test_each_half_picks_its_engine_by_its_own_device():
    settings = SimpleNamespace(augment=AugmentSettings())  # engine auto
    on = {
        kind: SimpleNamespace(settings=settings, device=torch.device(kind))
        for kind in ("cpu", "meta")
    }
    assert ClientHalf.engine(on["cpu"]) == "kornia" and ClientHalf.engine(on["meta"]) == "batched"
    dataset = SimpleNamespace(image_size=28, flip=True)
    server = {kind: SimpleNamespace(dataset=dataset, **vars(half)) for kind, half in on.items()}
    assert isinstance(ServerSide.weak_augment(server["cpu"]), WeakAugment)
    assert isinstance(ServerSide.weak_augment(server["meta"]), B.BatchedWeakAugment)


def test_the_client_builds_the_engines_modules():
    weak, strong = augmenters(28, True, 1, 2, 10.0, 0.125, "cpu", "batched")
    assert isinstance(weak, B.BatchedWeakAugment) and isinstance(strong, B.BatchedStrongAugment)
    assert isinstance(weak_augmenter(28, True, 0.125, "cpu", "kornia"), WeakAugment)
    official = strong_view(FedMatchSettings(), 1, "cpu", "batched")
    assert isinstance(official, B.BatchedOfficialRandAugment)
    ours = strong_view(FedMatchSettings(strong_view="ours"), 1, "cpu", "batched")
    assert isinstance(ours, B.BatchedRandAugment)
    assert isinstance(strong_view(FedMatchSettings(), 1, "cpu"), OfficialRandAugment)
    assert isinstance(fedseal.paper_view(2, 10.0, 1, "cpu", "batched"), B.BatchedRandAugment)
    assert isinstance(fedseal.paper_view(2, 10.0, 1, "cpu"), RandAugment)


def test_a_fixmatch_round_runs_on_the_batched_engine(monkeypatch):
    calls: list[int] = []
    forward = B.BatchedRandAugment.forward

    def counted(self, x):
        calls.append(len(x))
        return forward(self, x)

    monkeypatch.setattr(B.BatchedRandAugment, "forward", counted)
    raw = tiny_raw("fedavg_fixmatch")
    raw.update(rounds=1, augment={"engine": "batched"})
    rows, _ = run_method(raw, InProcessGrid(3))
    assert calls and rows


def test_fedseals_paper_view_follows_the_engine(monkeypatch):
    built: list[torch.nn.Module] = []
    original = fedseal.paper_view

    def recorded(*args):
        built.append(original(*args))
        return built[-1]

    monkeypatch.setattr(fedseal, "paper_view", recorded)
    raw = tiny_raw("fedseal")
    raw.update(rounds=1, augment={"engine": "batched"})
    run_method(raw, InProcessGrid(3))
    assert built and all(isinstance(view, B.BatchedRandAugment) for view in built)


@pytest.mark.parametrize("name", ["weak", "strong", "randaugment", "official"])
def test_each_engine_names_its_own_module(name):
    from tasks.augment import engine_class

    kornia, batched = engine_class("kornia", name), engine_class("batched", name)
    assert kornia.__module__ == "tasks.augment"
    assert batched.__module__ == "tasks.augment_batched"
    assert batched.__name__ == "Batched" + kornia.__name__


def test_the_speed_benchmark_times_both_paths_and_restores_the_cpus(monkeypatch):
    from benchmarks import augment_speed

    taken: list[str] = []
    monkeypatch.setattr(B, "apply_chosen_masked", lambda *a: taken.append("masked") or a[0])
    monkeypatch.setattr(B, "apply_chosen_indexed", lambda *a: taken.append("indexed") or a[0])
    with augment_speed.masked_path():
        B.BatchedRandAugment(1, 10.0, 1)(images(4))
    B.BatchedRandAugment(1, 10.0, 1)(images(4))
    assert taken == ["masked", "indexed"]
    seconds = augment_speed.shape_seconds(1, 28, images=8, repeat=1)
    assert set(seconds) == {"kornia", "batched", "batched_masked"}
    assert all(s > 0 for s in seconds.values())


def test_the_statistics_benchmark_compares_every_view_of_both_engines():
    from benchmarks import augment_stats

    result = augment_stats.measure("synthetic28", images=64, repeat=2, seed=0)
    ops = augment_stats.OP_NAMES[: B.num_ops(1)]
    assert list(result["views"]) == [*ops, "weak", "strong"]
    for stats in result["views"].values():
        assert set(stats) == set(augment_stats.STATS)
        assert all(set(v) == {"kornia", "batched", "z"} for v in stats.values())
    identity = result["views"]["identity"]
    assert identity["mean_abs_change"] == {"kornia": 0.0, "batched": 0.0, "z": 0.0}
    assert result["views"]["strong"]["mean_abs_change"]["batched"] > 0.05
    z, view, stat = augment_stats.largest_z(result)
    assert z == abs(result["views"][view][stat]["z"])
    assert "largest |z|" in augment_stats.report(result).splitlines()[-1]

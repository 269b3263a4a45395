from __future__ import annotations

import gzip
import hashlib
import os
from pathlib import Path

import numpy as np
import pytest
import torch

import ssfl.runner
from ssfl.cli import main
from tasks.config import ConfigError
from tasks.data import (
    IDX_FILES,
    IDX_RELEASES,
    DatasetRequest,
    IdxRelease,
    dataset_info,
    file_sha256,
    load_dataset,
    make_synthetic,
    read_idx,
)
from tests.conftest import ROOT


def test_fashion_mnist_from_idx_files(data_dir):
    ds = load_dataset(DatasetRequest("fashion_mnist", str(data_dir)))
    assert ds.train_x.shape == (60000, 1, 28, 28) and ds.train_x.dtype == torch.uint8
    assert ds.test_x.shape == (10000, 1, 28, 28)
    assert torch.equal(torch.bincount(ds.train_y), torch.full((10,), 6000))
    assert ds.flip and ds.num_classes == 10


def test_mnist_has_no_flip(data_dir):
    ds = load_dataset(DatasetRequest("mnist", str(data_dir)))
    assert not ds.flip and ds.train_x.shape[0] == 60000


def test_missing_files_offline_is_one_clear_line(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_dataset(DatasetRequest("fashion_mnist", str(tmp_path), download=False))
    msg = str(err.value)
    assert "\n" not in msg and str(tmp_path) in msg and "train-images-idx3-ubyte.gz" in msg


def write_idx(path: Path, data: np.ndarray) -> None:
    """``data`` as a gzipped IDX file of unsigned bytes."""
    header = bytes([0, 0, 8, data.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in data.shape)
    with gzip.open(path, "wb") as fh:
        fh.write(header + data.tobytes())


def test_read_idx_roundtrip(tmp_path):
    data = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    path = tmp_path / "x.gz"
    write_idx(path, data)
    assert np.array_equal(read_idx(path), data)


@pytest.fixture
def idx_set(tmp_path, monkeypatch) -> Path:
    """Four small IDX files in <tmp>/fashion-mnist, recorded as the official release."""
    folder = tmp_path / "fashion-mnist"
    folder.mkdir()
    rng = np.random.default_rng(0)
    arrays = {
        "train_x": rng.integers(0, 256, (20, 28, 28), dtype=np.uint8),
        "train_y": np.arange(20, dtype=np.uint8) % 10,
        "test_x": rng.integers(0, 256, (10, 28, 28), dtype=np.uint8),
        "test_y": np.arange(10, dtype=np.uint8),
    }
    for key, fname in IDX_FILES.items():
        write_idx(folder / fname, arrays[key])
    hashes = {f: hashlib.sha256((folder / f).read_bytes()).hexdigest() for f in IDX_FILES.values()}
    monkeypatch.setitem(IDX_RELEASES, "fashion_mnist", IdxRelease("Fashion-MNIST", hashes))
    return folder


def damage(path: Path, how: str) -> None:
    """Truncate a file to half, flip a byte in its middle or in its gzip header, or delete it."""
    raw = bytearray(path.read_bytes())
    if how == "truncated":
        path.write_bytes(raw[: len(raw) // 2])
    elif how == "delete":
        path.unlink()
    else:
        at = 4 if how == "header byte flipped" else len(raw) // 2  # 4: gzip's mtime, still valid
        raw[at] ^= 0xFF
        path.write_bytes(raw)


def load_fmnist(root: Path):
    return load_dataset(DatasetRequest("fashion_mnist", str(root), download=False))


def test_files_matching_the_recorded_hashes_load(idx_set):
    ds = load_fmnist(idx_set.parent)
    assert ds.train_x.shape == (20, 1, 28, 28) and ds.test_x.shape == (10, 1, 28, 28)
    assert ds.train_y.tolist() == [i % 10 for i in range(20)]


@pytest.mark.parametrize("fname", ["train-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"])
@pytest.mark.parametrize("how", ["truncated", "byte flipped", "header byte flipped"])
def test_a_damaged_file_is_one_line_naming_it(idx_set, fname, how):
    damage(idx_set / fname, how)
    with pytest.raises(ConfigError) as err:
        load_fmnist(idx_set.parent)
    assert str(err.value) == (
        f"{idx_set / fname}: SHA-256 differs from the official Fashion-MNIST release "
        "(truncated or altered?); replace it with the official file"
    )


def test_a_missing_file_beside_the_others_is_named(idx_set):
    damage(idx_set / "train-labels-idx1-ubyte.gz", "delete")
    with pytest.raises(ConfigError) as err:
        load_fmnist(idx_set.parent)
    assert str(err.value) == (
        f"{idx_set / 'train-labels-idx1-ubyte.gz'}: missing beside the other fashion_mnist "
        f"files in {idx_set}; put the official file there"
    )


def test_a_truncated_file_without_a_recorded_hash_is_one_line(idx_set, monkeypatch):
    monkeypatch.delitem(IDX_RELEASES, "fashion_mnist")
    path = idx_set / "train-images-idx3-ubyte.gz"
    damage(path, "truncated")
    with pytest.raises(ConfigError) as err:
        load_fmnist(idx_set.parent)
    msg = str(err.value)
    assert msg.startswith(f"{path}: cannot read it (") and "\n" not in msg
    assert msg.endswith("); replace it with a good copy")


@pytest.mark.parametrize(
    "content, reason",
    [
        (b"not gzip at all", "cannot read it (Not a gzipped file"),
        (b"", "not an IDX file of unsigned bytes"),
        (gzip.compress(bytes([0, 0, 8, 2, 0, 0])), "truncated IDX file"),
    ],
    ids=["not gzip", "empty", "cut in its header"],
)
def test_read_idx_refuses_a_bad_file_in_one_line(tmp_path, content, reason):
    path = tmp_path / "x.gz"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as err:
        read_idx(path)
    assert str(err.value).startswith(f"{path}: {reason}") and "\n" not in str(err.value)


def test_file_hash_is_computed_once_until_the_file_changes(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"a")
    assert file_sha256(path) == file_sha256(path) == hashlib.sha256(b"a").hexdigest()
    path.write_bytes(b"b")
    os.utime(path, ns=(0, 1))  # same size: the new mtime alone makes it hashed again
    assert file_sha256(path) == hashlib.sha256(b"b").hexdigest()


def test_cli_run_on_a_truncated_file_exits_2_with_one_line(idx_set, monkeypatch, capsys):
    def no_run(*args, **kwargs):
        raise AssertionError("a run started")

    monkeypatch.setattr(ssfl.runner, "run_simulation", no_run)
    path = idx_set / "train-images-idx3-ubyte.gz"
    damage(path, "truncated")
    out = idx_set.parent / "out"
    experiment = str(ROOT / "experiments/fmnist-las/server_sl.yaml")
    root, offline = f"dataset.root={idx_set.parent}", "dataset.download=false"
    code = main(["run", experiment, "--set", root, "--set", offline, "--out", str(out)])
    assert code == 2 and not out.exists()
    assert capsys.readouterr().err.splitlines() == [
        f"ssfl: error: {path}: SHA-256 differs from the official Fashion-MNIST release "
        "(truncated or altered?); replace it with the official file"
    ]


@pytest.mark.parametrize("name, folder", [("fashion_mnist", "fashion-mnist"), ("mnist", "mnist")])
def test_recorded_hashes_match_the_shared_files(data_dir, name, folder):
    assert set(IDX_RELEASES[name].sha256) == set(IDX_FILES.values())
    for fname, expected in IDX_RELEASES[name].sha256.items():
        assert file_sha256(data_dir / folder / fname) == expected


def test_synthetic_is_deterministic_and_balanced():
    a, b = make_synthetic(32, 500, 100, channels=3), make_synthetic(32, 500, 100, channels=3)
    assert torch.equal(a.train_x, b.train_x) and torch.equal(a.test_y, b.test_y)
    assert a.train_x.shape == (500, 3, 32, 32)
    assert torch.bincount(a.train_y).tolist() == [50] * 10


@pytest.mark.parametrize("name", ["synthetic28", "synthetic32", "fashion_mnist", "mnist"])
def test_dataset_info_matches_the_loaded_dataset(name, request):
    """DATASET_INFO lets a node with only its own images build the model; it must agree."""
    root = str(request.getfixturevalue("data_dir")) if "mnist" in name else ""
    ds = load_dataset(DatasetRequest(name, root, synthetic_train=20, synthetic_test=10))
    info = dataset_info(name)
    assert (info.num_classes, info.channels, info.image_size) == (
        ds.num_classes,
        ds.channels,
        ds.image_size,
    )
    assert (info.mean, info.std, info.flip) == (ds.mean, ds.std, ds.flip)
    assert info.num_classes == int(ds.train_y.max()) + 1


def test_dataset_info_of_unknown_name_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown dataset 'imagenet'"):
        dataset_info("imagenet")

from __future__ import annotations

import gzip

import numpy as np
import pytest
import torch

from tasks.config import ConfigError
from tasks.data import DatasetRequest, dataset_info, load_dataset, make_synthetic, read_idx


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


def test_read_idx_roundtrip(tmp_path):
    data = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    header = bytes([0, 0, 8, 3]) + b"".join(int(d).to_bytes(4, "big") for d in data.shape)
    path = tmp_path / "x.gz"
    with gzip.open(path, "wb") as fh:
        fh.write(header + data.tobytes())
    assert np.array_equal(read_idx(path), data)


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

"""``ssfl validate``: every shipped experiment builds its split, models and optimizers at its
dataset's real sizes; the stand-in datasets have the real counts and hold no images."""

from __future__ import annotations

import numpy as np
import pytest

from ssfl.cli import main
from ssfl.validate import REAL_CLASS_COUNTS, check_experiment, stand_in_dataset
from tasks.config import ConfigError
from tasks.data import DATASET_INFO, DATASETS, DatasetRequest, load_dataset
from tests.conftest import ROOT

EXPERIMENTS = sorted((ROOT / "experiments").rglob("*.yaml"))


@pytest.mark.parametrize("name", sorted(REAL_CLASS_COUNTS))
def test_stand_in_has_the_real_counts_and_shape_without_image_memory(name):
    ds = stand_in_dataset(name)
    train_counts, test_counts = REAL_CLASS_COUNTS[name]
    info = DATASET_INFO[name]
    assert np.bincount(ds.train_y.numpy()).tolist() == list(train_counts)
    assert np.bincount(ds.test_y.numpy()).tolist() == list(test_counts)
    assert tuple(ds.train_x.shape) == (sum(train_counts), info.channels, *[info.image_size] * 2)
    assert tuple(ds.test_x.shape[1:]) == (info.channels, info.image_size, info.image_size)
    image_bytes = info.channels * info.image_size**2
    assert ds.train_x.untyped_storage().nbytes() == image_bytes  # one shared zero image
    assert ds.num_classes == len(train_counts) == info.num_classes


def test_real_counts_of_the_known_sets_add_up_to_their_published_sizes():
    sizes = {name: (sum(tr), sum(te)) for name, (tr, te) in REAL_CLASS_COUNTS.items()}
    assert sizes["cifar10"] == (50_000, 10_000)
    assert sizes["fashion_mnist"] == sizes["mnist"] == (60_000, 10_000)
    assert sizes["svhn"] == (73_257, 26_032)


def test_every_registered_dataset_but_the_synthetic_ones_has_real_counts():
    synthetic = {name for name in DATASETS if name.startswith("synthetic")}
    assert set(REAL_CLASS_COUNTS) == set(DATASETS) - synthetic


def test_a_split_too_large_for_the_real_dataset_fails_with_one_line(tmp_path, capsys):
    """Fashion-MNIST's 6,000 images a class (stand-in: no files at the root) hold 500
    labeled + 91 clients x 60 of each class, not a 92nd client."""
    bad = tmp_path / "too_large.yaml"
    bad.write_text(
        "method: fedavg_sl\ndataset: {name: fashion_mnist, root: /nonexistent}\n"
        "split: {labeled_per_class: 500, num_clients: 100, client_size: 600, val_size: 0}\n"
    )
    result = check_experiment(bad)
    assert result.error == (
        "split: client 91 needs 60 samples of class 0, only 40 left; lower split sizes or "
        "change the split"
    )
    assert main(["validate", str(bad)]) == 2
    assert capsys.readouterr().out == f"FAIL  {bad}: {result.error}\n"


def test_a_passing_experiment_is_one_ok_line_and_exit_0(tmp_path, capsys):
    good = tmp_path / "small.yaml"
    good.write_text(
        "method: fedavg_sl\n"
        "dataset: {name: synthetic28, synthetic_train_size: 600, synthetic_test_size: 200}\n"
        "split: {labeled_per_class: 5, num_clients: 4, client_size: 100, val_size: 0,\n"
        "        test_size: 0}\n"
        "model: {name: small_cnn}\n"
    )
    assert main(["validate", str(good)]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"ok    {good}: fedavg_sl on synthetic28 (4 clients, 400 client")
    assert ", 50 labeled, " in line


def test_a_missing_file_fails_without_stopping_the_others(tmp_path):
    results = [check_experiment(tmp_path / name) for name in ("absent.yaml", "absent2.yaml")]
    assert [r.ok for r in results] == [False, False]
    assert all("absent" in r.error for r in results)


@pytest.mark.slow
def test_every_shipped_experiment_validates_at_real_sizes(capsys):
    """What `ssfl validate experiments/**/*.yaml` prints: one ok line per file."""
    assert EXPERIMENTS
    results = [check_experiment(path) for path in EXPERIMENTS]
    failed = [r.line() for r in results if not r.ok]
    assert not failed, "\n".join(failed)
    by_path = {r.path: r.summary for r in results}
    cifar = str(ROOT / "experiments/cifar10-fedsup/fedsup.yaml")
    assert "(100 clients, 45000 client images" in by_path[cifar]


@pytest.mark.parametrize("name", ["fashion_mnist", "mnist"])
def test_real_counts_are_those_of_the_real_files(data_dir, name):
    try:
        ds = load_dataset(DatasetRequest(name, str(data_dir)))
    except ConfigError as err:
        pytest.skip(str(err))
    train_counts, test_counts = REAL_CLASS_COUNTS[name]
    assert np.bincount(ds.train_y.numpy()).tolist() == list(train_counts)
    assert np.bincount(ds.test_y.numpy()).tolist() == list(test_counts)

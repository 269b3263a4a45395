"""Shared fixtures: where the real data is, and small configs."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tasks.train import keep_freed_memory

ROOT = Path(__file__).resolve().parents[1]

keep_freed_memory()  # as every training process of the app does


def pytest_configure(config: pytest.Config) -> None:
    """A pytest-xdist worker trains on one torch thread: the workers fill the cores between
    them, and two threads each on a 2-core machine made an 11 s test take 41 s."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(1)


def real_data_dir() -> Path | None:
    """The real Fashion-MNIST/MNIST files: $SSFL_DATA_DIR when set (only there, so that
    e.g. SSFL_DATA_DIR=/nonexistent runs the suite as a clone without data would), else
    ../shared/data beside the repo."""
    candidate = Path(os.environ.get("SSFL_DATA_DIR") or ROOT.parent / "shared" / "data")
    return candidate.resolve() if (candidate / "fashion-mnist").is_dir() else None


@pytest.fixture(scope="session", autouse=True)
def split_cache(tmp_path_factory) -> Path:
    """Partitions kept on disk go to this session's folder (never the user's cache)."""
    folder = tmp_path_factory.mktemp("split-cache")
    before = os.environ.get("SSFL_CACHE_DIR")
    os.environ["SSFL_CACHE_DIR"] = str(folder)
    yield folder
    if before is None:
        del os.environ["SSFL_CACHE_DIR"]
    else:
        os.environ["SSFL_CACHE_DIR"] = before


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """Torch on one thread for a module of tiny in-process runs: tiny models train fastest on
    one thread, and with two threads on a busy 2-core machine a run of three seconds took
    seventy (its threads wait for each other)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The real data folder; tests that use it check the real files and skip without them."""
    found = real_data_dir()
    if found is None:
        pytest.skip("real Fashion-MNIST files not found (set SSFL_DATA_DIR)")
    return found


@pytest.fixture
def synthetic_raw() -> dict:
    """A small labels-at-server experiment on the synthetic 28x28 dataset."""
    return synthetic_experiment()


def synthetic_experiment() -> dict:
    """The raw mapping behind the ``synthetic_raw`` fixture (a new one each call)."""
    return {
        "method": "fedavg_fixmatch",
        "rounds": 2,
        "dataset": {
            "name": "synthetic28",
            "synthetic_train_size": 2000,
            "synthetic_test_size": 400,
        },
        "split": {
            "labeled_per_class": 10,
            "val_size": 50,
            "test_size": 400,
            "num_clients": 3,
            "client_size": 200,
        },
        "server": {"bootstrap_epochs": 1, "epochs": 1},
    }

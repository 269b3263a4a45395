"""Paper-scale configs (CIFAR-10, ResNet-18) run on synthetic data of the same shape."""

from __future__ import annotations

import pytest
import torch

from strategies import METHODS
from strategies.base import ServerSide
from tasks.config import load_experiment
from tasks.partition import get_split
from tests.conftest import ROOT
from tests.harness import InProcessGrid

# The config's structure is kept (100 clients, 5 a round, ResNet-9, 32x32x3); only the
# sizes shrink so that one round takes seconds on a CPU.
SHRINK = [
    "dataset.name=synthetic32",
    "dataset.synthetic_train_size=2600",
    "dataset.synthetic_test_size=200",
    "split.labeled_per_class=4",
    "split.val_size=100",
    "split.test_size=100",
    "split.client_size=24",
    "server.bootstrap_epochs=1",
    "rounds=1",
    "device=cpu",
]


def test_cifar10_table2_config_on_synthetic_32x32():
    cfg = load_experiment(ROOT / "experiments/cifar10-las/fedseal.yaml", SHRINK)
    assert cfg["split"]["num_clients"] == 100 and cfg["federation"]["clients_per_round"] == 5
    ds, split = get_split(cfg)
    assert ds.train_x.shape[1:] == (3, 32, 32) and len(split.clients) == 100
    server = ServerSide.build(cfg, ds, split, torch.device("cpu"))
    rows: list[dict] = []
    grid = InProcessGrid(100)
    METHODS["fedseal"].strategy(server, rows.append).start(grid, num_rounds=1)
    trained = [m for m in grid.sent if m.metadata.message_type == "train"]
    assert len(trained) == 5 and rows[0]["clients"] == 5
    assert 0.0 <= rows[0]["test_accuracy"] <= 1.0


def test_resnet18_fmnist_config_resolves_with_paper_values():
    cfg = load_experiment(ROOT / "experiments/fmnist-las/fedseal_resnet18.yaml")
    assert cfg["model"]["name"] == "resnet18"
    assert cfg["server"]["lr"] == cfg["client"]["lr"] == 0.001
    assert cfg["algo"]["theta"] == 0.05


CIFAR_BATCH = ROOT / "experiments/cifar10-batch"


@pytest.mark.parametrize(
    "name", ["fedmatch_iid_las", "fedmatch_noniid_las", "fedmatch_iid_lac", "fedmatch_noniid_lac"]
)
def test_fedmatch_table1_configs_resolve_with_official_values(name):
    cfg = load_experiment(CIFAR_BATCH / f"{name}.yaml")
    assert cfg["split"]["num_clients"] == 100 and cfg["federation"]["clients_per_round"] == 5
    assert cfg["model"] == {"name": "resnet9", "norm": "none"} and cfg["rounds"] == 200
    assert cfg["algo"]["num_helpers"] == 2 and cfg["algo"]["helper_interval"] == 10
    assert cfg["client"]["lr"] == 1e-3 and cfg["algo"]["confidence"] == 0.75
    at_client = name.endswith("lac")
    assert cfg["split"]["client_labeled_per_class"] == (5 if at_client else 0)
    assert cfg["algo"]["delta"] == (5e-5 if at_client else 1e-5)


@pytest.mark.parametrize(
    ("name", "extra"),
    [("fedmatch_iid_las", []), ("fedmatch_noniid_lac", ["split.client_labeled_per_class=1"])],
)
def test_fedmatch_table1_config_on_synthetic_32x32(name, extra):
    cfg = load_experiment(CIFAR_BATCH / f"{name}.yaml", [*SHRINK, *extra])
    ds, split = get_split(cfg)
    assert ds.train_x.shape[1:] == (3, 32, 32) and len(split.clients) == 100
    server = ServerSide.build(cfg, ds, split, torch.device("cpu"))
    rows: list[dict] = []
    grid = InProcessGrid(100)
    METHODS["fedmatch"].strategy(server, rows.append).start(grid, num_rounds=1)
    trained = [m for m in grid.sent if m.metadata.message_type == "train"]
    assert len(trained) == 5 and rows[0]["clients"] == 5 and rows[0]["failures"] == 0
    assert rows[0]["bytes_s2c_dense"] == 5 * 4 * sum(p.numel() for p in server.model.sigma.values())
    assert 0.0 <= rows[0]["test_accuracy"] <= 1.0

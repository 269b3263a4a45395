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


# The SSFL benchmark's CIFAR-10 / SVHN settings (ResNet-18 GN, T = 16, K = 10 or 20) on
# synthetic 32x32 images: one round with one SGD step of 4 images per half.
SSFL_SHRINK = [
    "dataset.name=synthetic32",
    "dataset.synthetic_train_size=600",
    "dataset.synthetic_test_size=100",
    "split.labeled_per_class=2",
    "split.test_size=50",
    "server.local_steps=1",
    "client.local_steps=1",
    "server.batch_size=4",
    "client.batch_size=4",
    "rounds=1",
    "device=cpu",
]


def run_one_round(cfg: dict) -> list[dict]:
    ds, split = get_split(cfg)
    server = ServerSide.build(cfg, ds, split, torch.device("cpu"))
    rows: list[dict] = []
    grid = InProcessGrid(cfg["split"]["num_clients"])
    METHODS[cfg["method"]].strategy(server, rows.append).start(grid, num_rounds=1)
    return rows


@pytest.mark.parametrize(
    "experiment, method, clients",
    [("ssfl-cifar10/grouping_gn.yaml", "fedrgd", 10), ("ssfl-svhn/crl_gn.yaml", "ssfl_fedavg", 10)],
)
def test_ssfl_paper_configs_on_synthetic_32x32(experiment, method, clients):
    cfg = load_experiment(ROOT / "experiments" / experiment, SSFL_SHRINK)
    assert cfg["method"] == method and cfg["model"] == {
        "name": "resnet18",
        "norm": "gn",
        "dropout": 0.0,
    }
    rows = run_one_round(cfg)
    assert rows[0]["clients"] == clients and rows[0]["local_steps"] == 1.0
    assert rows[0]["server_steps"] == 1.0 and 0.0 <= rows[0]["test_accuracy"] <= 1.0
    assert rows[0]["weight_diversity"] >= 0.0  # eq. 8 recorded (0 when warm-up steps are tiny)
    if method == "fedrgd":
        assert sorted(k for g in rows[0]["groups"] for k in g) == list(range(clients))


@pytest.mark.parametrize(
    "experiment, k, rounds",
    [
        ("ssfl-cifar10/crl_gn.yaml", 10, 19200),
        ("ssfl-cifar10/grouping_gn.yaml", 10, 19200),
        ("ssfl-svhn/crl_gn.yaml", 10, 2560),
        ("ssfl-svhn/grouping_gn.yaml", 20, 2560),
    ],
)
def test_ssfl_paper_configs_carry_the_paper_values(experiment, k, rounds):
    cfg = load_experiment(ROOT / "experiments" / experiment)
    assert cfg["split"]["num_clients"] == k and cfg["rounds"] == rounds
    assert cfg["split"]["labeled_per_class"] * 10 == 1000 and cfg["split"]["target_r"] == 0.4
    for half in ("server", "client"):  # Table A.1 and T = 16
        assert cfg[half]["local_steps"] == 16 and cfg[half]["batch_size"] == 64
        assert cfg[half]["lr"] == 0.146 and cfg[half]["weight_decay"] == 0.0001
    assert cfg["lr_schedule"]["warmup_epochs"] == 5.0 and cfg["algo"]["threshold"] == 0.95


CIFAR_BATCH = ROOT / "experiments/cifar10-batch"


@pytest.mark.parametrize(
    "name", ["fedmatch_iid_las", "fedmatch_noniid_las", "fedmatch_iid_lac", "fedmatch_noniid_lac"]
)
def test_fedmatch_table1_configs_resolve_with_official_values(name):
    cfg = load_experiment(CIFAR_BATCH / f"{name}.yaml")
    assert cfg["split"]["num_clients"] == 100 and cfg["federation"]["clients_per_round"] == 5
    assert (
        cfg["model"] == {"name": "resnet9", "norm": "none", "dropout": 0.0} and cfg["rounds"] == 200
    )
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

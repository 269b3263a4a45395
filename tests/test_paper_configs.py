"""Paper-scale configs (CIFAR-10, ResNet-18) run on synthetic data of the same shape."""

from __future__ import annotations

import json

import pytest
import torch

from ssfl.experiment import resolve_config, resolve_experiment
from ssfl.registry import method, settings_of
from strategies.parts import ServerSide
from tasks.config import flatten, read_yaml
from tasks.partition import get_split
from tests.conftest import ROOT
from tests.harness import InProcessGrid

EXPERIMENTS = sorted((ROOT / "experiments").rglob("*.yaml"))

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


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_unset_keys_take_the_methods_defaults_and_set_ones_are_kept(path):
    """Resolving merges the YAML over the method's defaults, neither side lost."""
    raw = flatten(read_yaml(path))
    cfg = flatten(resolve_experiment(path))
    defaults = flatten(resolve_config({"method": raw["method"]}))
    assert set(cfg) == set(defaults)
    for key, value in cfg.items():
        if key in raw:
            assert value == raw[key], key
        elif key != "dataset.root":  # made absolute ($SSFL_DATA_DIR or ./data)
            assert value == defaults[key], key


def sampled_round(cfg: dict) -> tuple[list[dict], int, ServerSide]:
    """One round of a 100-client config on the in-process grid: rows, trained clients, server."""
    ds, split = get_split(settings_of(cfg))
    assert ds.train_x.shape[1:] == (3, 32, 32) and len(split.clients) == 100
    server = ServerSide.build(settings_of(cfg), ds, split, torch.device("cpu"))
    rows: list[dict] = []
    grid = InProcessGrid(100)
    method(cfg["method"]).server_half().strategy(server, rows.append).start(grid, num_rounds=1)
    trained = [m for m in grid.sent if m.metadata.message_type == "train"]
    return rows, len(trained), server


@pytest.mark.slow
def test_cifar10_table2_config_on_synthetic_32x32():
    cfg = resolve_experiment(ROOT / "experiments/cifar10-las/fedseal.yaml", sets=SHRINK)
    rows, trained, _ = sampled_round(cfg)
    per_round = cfg["federation"]["clients_per_round"]  # sampled of the 100
    assert trained == per_round and rows[0]["clients"] == per_round
    assert 0.0 <= rows[0]["test_accuracy"] <= 1.0


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
    ds, split = get_split(settings_of(cfg))
    server = ServerSide.build(settings_of(cfg), ds, split, torch.device("cpu"))
    rows: list[dict] = []
    grid = InProcessGrid(cfg["split"]["num_clients"])
    method(cfg["method"]).server_half().strategy(server, rows.append).start(grid, num_rounds=1)
    return rows


@pytest.mark.slow
@pytest.mark.parametrize("experiment", ["ssfl-cifar10/grouping_gn.yaml", "ssfl-svhn/crl_gn.yaml"])
def test_ssfl_paper_configs_on_synthetic_32x32(experiment):
    cfg = resolve_experiment(ROOT / "experiments" / experiment, sets=SSFL_SHRINK)
    clients = cfg["split"]["num_clients"]  # clients_per_round 0: every client, every round
    rows = run_one_round(cfg)
    assert rows[0]["clients"] == clients and rows[0]["local_steps"] == 1.0
    assert rows[0]["server_steps"] == 1.0 and 0.0 <= rows[0]["test_accuracy"] <= 1.0
    assert rows[0]["weight_diversity"] >= 0.0  # eq. 8 recorded (0 when warm-up steps are tiny)
    if cfg["method"] == "fedrgd":
        assert sorted(k for g in rows[0]["groups"] for k in g) == list(range(clients))


CIFAR_BATCH = ROOT / "experiments/cifar10-batch"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "extra"),
    [("fedmatch_iid_las", []), ("fedmatch_noniid_lac", ["split.client_labeled_per_class=1"])],
)
def test_fedmatch_table1_config_on_synthetic_32x32(name, extra):
    cfg = resolve_experiment(CIFAR_BATCH / f"{name}.yaml", sets=[*SHRINK, *extra])
    rows, trained, server = sampled_round(cfg)
    per_round = cfg["federation"]["clients_per_round"]
    assert trained == per_round and rows[0]["clients"] == per_round and rows[0]["failures"] == 0
    sigma_bytes = 4 * sum(p.numel() for p in server.model.sigma.values())
    assert rows[0]["bytes_s2c_dense"] == per_round * sigma_bytes
    assert 0.0 <= rows[0]["test_accuracy"] <= 1.0


# What every cell of one paper table must share, so that its cells compare like with like
# (keys starting with these): the data, the seed, the evaluation sets, the length of the
# run and its rate schedule; cells of one scenario also their labels, and cells of one
# scenario and partitioner also how the clients' data is cut.
SHARED = (
    "seed",
    "rounds",
    "dataset.",
    "split.val_size",
    "split.test_size",
    "lr_schedule.",
)
# Cells with as many clients also sample as many a round (a centralized cell has one client).
BY_CLIENTS = ("federation.clients_per_round",)
BY_SCENARIO = ("split.labeled_per_class", "split.client_labeled_per_class")
BY_PARTITIONER = ("split.client_size", "split.target_r", "split.dirichlet_alpha", "split.stream_")


def assert_shared(cfgs: list[dict], prefixes: tuple[str, ...], where: object) -> None:
    """Every flat key that starts with one of ``prefixes`` has one value in all ``cfgs``."""
    for key in cfgs[0]:
        if key.startswith(prefixes):
            assert len({json.dumps(c[key]) for c in cfgs}) == 1, (where, key)


@pytest.mark.parametrize(
    "table", sorted(p.name for p in (ROOT / "experiments").iterdir() if p.is_dir())
)
def test_the_cells_of_a_table_share_seed_data_and_split(table):
    cfgs = [
        flatten(resolve_experiment(p))
        for p in sorted((ROOT / "experiments" / table).glob("*.yaml"))
    ]
    assert_shared(cfgs, SHARED, table)
    for group_by, prefixes in (
        (("split.scenario",), BY_SCENARIO),
        (("split.scenario", "split.partitioner"), BY_PARTITIONER),
        (("split.num_clients",), BY_CLIENTS),
    ):
        groups: dict[tuple, list[dict]] = {}
        for c in cfgs:
            groups.setdefault(tuple(c[k] for k in group_by), []).append(c)
        for cell, group in groups.items():
            assert_shared(group, prefixes, (table, cell))

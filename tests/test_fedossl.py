"""FedoSSL and its open-world baselines on the in-process grid (synthetic data), its configs
and its bad-input rules."""

from __future__ import annotations

import functools
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
import yaml
from flwr.app import MetricRecord, RecordDict

from ssfl.experiment import resolve_config, resolve_experiment
from ssfl.records import record_arrays, to_record
from ssfl.reproduce import FEDOSSL_ROWS, TABLES, cell_dir, reproduce
from strategies.parts import Update
from tasks.config import ConfigError, deep_merge
from tasks.models import classifier_keys
from tasks.pretrain import cache_path
from tests.conftest import ROOT
from tests.harness import InProcessGrid, build_strategy, run_method

BASE = {
    "method": "fedossl",
    "rounds": 2,
    "dataset": {"name": "synthetic28", "synthetic_train_size": 1000, "synthetic_test_size": 100},
    "split": {"test_size": 100, "num_clients": 4, "samples_per_class": 40},
    "federation": {"clients_per_round": 3},
    "client": {"batch_size": 64, "lr": 0.05},
    "algo": {
        "cluster_from_round": 1,
        "ce_from_round": 1,
        "calibration_threshold": 0.2,
        "local_centroids": 8,
        "server_cluster_steps": 20,
    },
}
OPEN_WORLD_KEYS = ("acc_all", "acc_seen", "acc_unseen", "acc_lu", "acc_gu")


@functools.lru_cache(maxsize=16)
def cached_run(changes_json: str) -> tuple[list[dict], object]:
    raw = deep_merge(BASE, json.loads(changes_json))
    return run_method(raw, InProcessGrid(raw["split"]["num_clients"]))


def run(**changes) -> tuple[list[dict], object]:
    """Rows and strategy of BASE with ``changes`` (each distinct run once per session)."""
    return cached_run(json.dumps(changes, sort_keys=True))


@pytest.mark.slow
def test_fedossl_rounds_carry_the_open_world_metrics_and_their_best_so_far():
    rows, strategy = run()
    for row in rows:
        assert all(0.0 <= row[k] <= 1.0 for k in OPEN_WORLD_KEYS)
        assert row["test_accuracy"] == row["acc_all"]
    for key in OPEN_WORLD_KEYS:
        assert rows[-1][f"best_{key}"] == max(r[key] for r in rows)
    assert rows[-1]["local_centroids"] == 3 * 8  # every sampled client's centroids clustered
    assert all(r["cluster_loss"] > 0 for r in rows)  # calibration from round 1 here
    for name in ("seen", "lu", "gu"):  # the diagnostic, once centroids exist (round 2)
        assert 0.0 <= rows[-1][f"q_agree_{name}"] <= 1.0
    m = strategy.parts.codec.centroids.m
    assert m.shape == (10, 128)
    np.testing.assert_allclose(m.norm(dim=1).numpy(), 1.0, rtol=1e-5)


def test_centroids_travel_only_with_the_calibration_module_and_are_counted():
    with_cal, _ = run()
    without, _ = run(rounds=1, algo={"gamma": 0.0, "beta": 0.0})  # Fed-AO
    per_client_down = (with_cal[0]["bytes_s2c"] - without[0]["bytes_s2c"]) / 3
    per_client_up = (with_cal[0]["bytes_c2s"] - without[0]["bytes_c2s"]) / 3
    assert 10 * 128 * 4 <= per_client_down < 10 * 128 * 4 + 500  # m, one npy header
    assert (8 + 6) * 128 * 4 + 24 <= per_client_up < (8 + 6) * 128 * 4 + 24 + 1500
    assert "local_centroids" not in without[0] and without[0]["cluster_loss"] == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("epochs", [1, 5])
def test_calibration_gates_open_on_the_same_round_whatever_the_local_epochs(epochs):
    """The code's gates count rounds (`global_round > 4` / `> 6`), not local epochs: here
    L_cluster from round 2 and L_ce from round 3, at E = 1 and at E = 5."""
    rows, _ = run(
        rounds=3,
        client={"epochs": epochs},
        algo={"cluster_from_round": 2, "ce_from_round": 3, "calibration_threshold": 0.0},
    )
    assert [r["cluster_loss"] > 0.0 for r in rows] == [False, True, True]
    assert [r["ce_loss"] > 0.0 for r in rows] == [False, False, True]
    assert "q_agree_seen" in rows[0]  # the diagnostic reads m from round 1 on


@pytest.mark.parametrize("key", ["cluster_from_epoch", "ce_from_epoch"])
def test_the_retired_epoch_gates_name_their_round_keys(key):
    with pytest.raises(ConfigError, match=rf"'algo\.{key}' was removed: use algo\.\w+_from_round"):
        resolve_config({"method": "fedossl", "algo": {key: 25}})


def test_the_gates_default_to_the_codes_sixth_and_eighth_rounds():
    algo = resolve_config({"method": "fedossl"})["algo"]
    assert (algo["cluster_from_round"], algo["ce_from_round"]) == (6, 8)


@pytest.mark.slow
def test_same_seed_same_numbers():
    """A one-round run repeats the first round of the two-round run, number for number."""
    first, _ = run(rounds=1)
    second, _ = run()
    keys = [*OPEN_WORLD_KEYS, "test_loss", "train_loss", "suppressed_loss", "cluster_loss"]
    assert [first[0][k] for k in keys] == [second[0][k] for k in keys]


@pytest.mark.slow
def test_fedrep_keeps_each_clients_classifier_and_sends_it_back_to_it():
    _, strategy = run(rounds=1, algo={"gamma": 0.0, "personal": "head"})
    aggregator = strategy.parts.aggregator
    head = set(classifier_keys(strategy.server.model))
    assert len(aggregator.kept) == 3  # the round's sampled clients
    pid = next(iter(aggregator.kept))
    assert set(aggregator.kept[pid]) == head
    start = record_arrays(aggregator.start_model(2, pid, strategy.server.arrays()))
    server = record_arrays(strategy.server.arrays())
    for key in server:
        expected = aggregator.kept[pid][key] if key in head else server[key]
        np.testing.assert_array_equal(start[key], expected)


@pytest.mark.slow
def test_local_only_evaluates_the_mean_over_the_clients_own_models():
    rows, strategy = run(rounds=1, algo={"gamma": 0.0, "personal": "all"})
    evaluator, aggregator = strategy.parts.evaluator, strategy.parts.aggregator
    assert len(aggregator.local_models()) == 3
    each = [evaluator.mean_over([state]) for state in aggregator.local_models()]
    assert rows[0]["acc_all"] == pytest.approx(np.mean([e["acc_all"] for e in each]))


NACH = {"beta": 0.0, "gamma": 0.0, "objective": "nach", "max_margin": 0.0}
SEMIFL = {"beta": 0.0, "gamma": 0.0, "objective": "semifl"}


@pytest.mark.slow
def test_nach_rounds_report_self_training_and_filtered_pairs_without_centroids():
    rows, _ = run(algo=NACH)
    for row in rows:
        assert 0.0 <= row["mask_rate"] <= 1.0 and 0.0 < row["pairs_kept"] <= 1.0
        assert row["self_training_loss"] >= 0.0 and "ce_loss" not in row
        assert "local_centroids" not in row
    orca, _ = run(algo={k: v for k, v in NACH.items() if k != "objective"})
    assert [r["test_loss"] for r in rows] != [r["test_loss"] for r in orca]


def test_semifl_pseudo_labels_from_its_second_round():
    rows, _ = run(algo=SEMIFL)
    assert rows[0]["mask_rate"] == 0.0 and rows[0]["pseudo_loss"] == 0.0  # labels alone
    assert rows[1]["mask_rate"] > 0.0 and rows[1]["pseudo_loss"] > 0.0
    assert "pairwise_loss" not in rows[1]
    assert rows[1]["mix_loss"] == 0.0  # SemiFL's mix term off by default


def test_semifl_mix_term_acts_with_the_pseudo_labels():
    plain, _ = run(algo=SEMIFL)
    rows, _ = run(algo={**SEMIFL, "mix_weight": 1.0})
    assert rows[0]["mix_loss"] == 0.0 and rows[0]["test_loss"] == plain[0]["test_loss"]
    assert rows[1]["mix_loss"] > 0.0 and rows[1]["mask_rate"] == plain[1]["mask_rate"]
    assert rows[1]["test_loss"] != plain[1]["test_loss"]


PRETRAIN = {"pretrain_epochs": 1, "pretrain_batch_size": 128}


def test_a_simclr_start_is_recorded_and_the_second_stage_trains_only_the_last_block():
    frozen, strategy = run(rounds=1, algo={**PRETRAIN, "trainable": "last_block"})
    free, _ = run(rounds=1, algo={**PRETRAIN, "trainable": "all"})
    for row in (frozen[0], free[0]):
        assert row["pretrain_epochs"] == 1 and row["pretrain_images"] == 400
        assert np.isfinite(row["pretrain_loss"]) and row["pretrain_cached"] in (0, 1)
    assert frozen[0]["pretrain_loss"] == free[0]["pretrain_loss"]  # one stage, shared
    saved = torch.load(cache_path(strategy.parts.trainer.key()), weights_only=True)["state"]
    scratch = build_strategy(deep_merge(BASE, {"rounds": 1}), lambda row: None)
    start = scratch.server.model.state_dict()
    assert not torch.equal(saved["1.features.0.weight"], start["1.features.0.weight"])
    after = strategy.server.model.state_dict()
    torch.testing.assert_close(after["1.features.0.weight"], saved["1.features.0.weight"])
    assert not torch.equal(after["1.features.4.weight"], saved["1.features.4.weight"])
    assert "pretrain_loss" not in run()[0][0]  # from scratch by default


def test_the_simclr_starts_cache_key_names_the_engine_of_its_views():
    """A start drawn with the batched engine is not one drawn with kornia's (whose key, as
    before the engines, names none)."""
    keys = {}
    for engine in ("auto", "kornia", "batched"):
        raw = deep_merge(BASE, {"augment": {"engine": engine}, "algo": PRETRAIN})
        strategy = build_strategy(raw, lambda row: None)
        keys[engine] = strategy.parts.trainer.key()
    assert keys["auto"] == keys["kornia"] and "engine" not in keys["kornia"]  # auto on the CPU
    assert keys["batched"] == {**keys["kornia"], "engine": "batched"}


@pytest.mark.parametrize(
    "changes, key",
    [
        ({"algo": {"trainable": "layer4"}}, "algo.trainable"),
        ({"algo": {"pretrain_epochs": -1}}, "algo.pretrain_epochs"),
        ({"algo": {"pretrain_lr": 0.0}}, "algo.pretrain_lr"),
        ({"algo": {"objective": "fixmatch"}}, "algo.objective"),
        ({"algo": {"objective": "semifl", "beta": 0.0}}, "algo.objective"),
        ({"algo": {"ood_threshold": 0.99}}, "algo.ood_threshold"),
        ({"algo": {"mix_weight": 1.0}}, "algo.mix_weight"),
        ({"algo": {**SEMIFL, "mixup_alpha": 0.0}}, "algo.mixup_alpha"),
        ({"algo": {"global_centroids": 11}}, "algo.global_centroids"),
        ({"algo": {"personal": "some"}}, "algo.personal"),
        ({"algo": {"tau": 0.0}}, "algo.tau"),
        ({"algo": {"beta": -1.0}}, "algo.beta"),
        ({"server": {"epochs": 1}}, "server.epochs"),
        ({"split": {"labeled_per_class": 5}}, "split.labeled_per_class"),
        ({"split": {"scenario": "labels_at_server"}}, "split.scenario"),
        ({"split": {"class_roles": "LLLLLLLGGG"}}, "split.class_roles"),
    ],
)
def test_bad_fedossl_configs_are_refused_with_one_line(changes, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        resolve_config(deep_merge(BASE, changes))


@pytest.mark.process
def test_a_split_leaving_a_client_no_unseen_class_exits_2_with_one_line(tmp_path):
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump(deep_merge(BASE, {"split": {"class_roles": "SSSSSSSSSS"}})))
    proc = subprocess.run(
        [sys.executable, "-m", "ssfl.cli", "run", str(exp), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "no unseen class" in proc.stderr


@pytest.mark.parametrize("name", ["fedossl", "fedossl_50clients", "fed_ao", "fed_an", "semifl"])
def test_the_cifar10_paper_scale_configs_resolve(name):
    cfg = resolve_experiment(ROOT / "experiments" / "cifar10-open" / f"{name}.yaml")
    assert cfg["model"]["name"] == "resnet18" and cfg["rounds"] == 50
    assert cfg["client"]["batch_size"] == 512 and cfg["client"]["epochs"] == 5
    assert cfg["split"]["num_clients"] // cfg["federation"]["clients_per_round"] in (2, 10)
    assert cfg["algo"]["pretrain_epochs"] > 0 and cfg["algo"]["trainable"] == "last_block"


def test_the_fmnist_cells_share_their_data_and_differ_only_in_the_method_switches():
    cells = {
        p.stem: resolve_experiment(p) for p in (ROOT / "experiments/fmnist-open").glob("*.yaml")
    }
    assert {"fedossl", "fed_ao", "fed_ro", "local_o", "cen_o"} <= set(cells)
    assert cells["fed_ao"]["algo"]["gamma"] == 0.0 and cells["fed_ro"]["algo"]["personal"] == "head"
    assert cells["cen_o"]["split"]["num_clients"] == 1
    assert cells["cen_o"]["split"]["role_clients"] == 10
    nach = ("fed_an", "fed_rn", "local_n", "cen_n")
    assert all(cells[n]["algo"]["objective"] == "nach" for n in nach)
    assert [cells[n]["algo"]["personal"] for n in nach] == ["none", "head", "all", "none"]
    assert cells["cen_n"]["split"]["num_clients"] == 1
    assert cells["semifl"]["algo"]["objective"] == "semifl"
    for name, cell in cells.items():
        assert cell["split"] == cells["cen_o" if name.startswith("cen") else "fedossl"]["split"]


def test_table2_lists_every_fmnist_cell_beside_the_papers_numbers(tmp_path):
    text = reproduce("fedossl-table2", tmp_path, None, [], run=False, dataset="fmnist")
    assert "| FedoSSL | not run | 0.7626 |" in text  # All, best round
    assert "| Fed-AO | not run | 0.4203 |" in text  # GU, best round
    assert "| Fed-AN | not run | 0.6658 |" in text and "| SemiFL* | not run | 0.6491 |" in text
    assert text.count("### FedoSSL Table 2") == 10  # 5 accuracies x (best, final round)
    for name in FEDOSSL_ROWS.values():
        assert (ROOT / "experiments" / "fmnist-open" / name).is_file()
    table = TABLES["fedossl-table2"]
    for row in table.rows:  # one folder per cell, right under --out ('w/o', 'SemiFL*')
        folder = cell_dir(tmp_path, row, "Table 2")
        assert folder.parent == tmp_path and "*" not in folder.name


@pytest.mark.parametrize("weighted, expected", [(True, 0.75), (False, 0.5)])
def test_models_average_by_example_counts_or_uniformly(weighted, expected):
    """Section 3.1's n_i / n weights, or the official code's uniform average, on two
    hand-made models (all zeros with 1 example, all ones with 3)."""
    raw = deep_merge(BASE, {"algo": {"gamma": 0.0, "weighted_average": weighted}})
    strategy = build_strategy(raw)
    state = record_arrays(strategy.server.arrays())
    updates = [
        Update(
            pid,
            n,
            RecordDict(
                {
                    "arrays": to_record({k: np.full_like(v, fill) for k, v in state.items()}),
                    "metrics": MetricRecord({"partition-id": pid, "num-examples": n}),
                }
            ),
        )
        for pid, n, fill in ((0, 1, 0), (1, 3, 1))
    ]
    arrays, _ = strategy.parts.aggregator.aggregate(1, updates)
    weight = record_arrays(arrays)[classifier_keys(strategy.server.model)[0]]
    np.testing.assert_allclose(weight, expected)

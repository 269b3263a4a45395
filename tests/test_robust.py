"""Robust aggregation rules and simulated attacks on hand-made arrays, the keys' checks,
and short in-process runs: attackers recorded, robust rules used by every model-averaging
method and refused by the others."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
import yaml

from ssfl.experiment import resolve_config
from strategies.parts import RobustAveraging
from tasks.aggregate import (
    clip_update,
    coordinate_median,
    krum_scores,
    krum_select,
    trimmed_mean,
    update_norm,
    weighted_average,
)
from tasks.attack import attackers, flipped_labels, flipped_logits, poisoned
from tasks.config import ConfigError, deep_merge
from tasks.train import evaluate
from tests.conftest import ROOT, synthetic_experiment
from tests.harness import InProcessGrid, build_strategy, run_method, ssfl_run, tiny_raw


def states(*rows: list[float]) -> list[dict[str, np.ndarray]]:
    """One model per row: a float vector 'w' and an integer counter 'n' (its index)."""
    return [
        {"w": np.asarray(row, dtype=np.float32), "n": np.asarray(i, dtype=np.int64)}
        for i, row in enumerate(rows)
    ]


# ----- Rules -----------------------------------------------------------------------------
def test_median_of_three_and_of_four_vectors():
    odd = coordinate_median(states([1, 5, -2], [3, 4, 100], [2, -7, 0]))
    np.testing.assert_array_equal(odd["w"], np.float32([2, 4, 0]))
    assert odd["w"].dtype == np.float32 and int(odd["n"]) == 2  # integer buffers: the max
    even = coordinate_median(states([1, 0], [2, 0], [4, 0], [1000, 8]))
    np.testing.assert_array_equal(even["w"], np.float32([3, 0]))


def test_median_ignores_two_outliers_of_five():
    honest = [[1.0, 2.0], [1.1, 2.1], [0.9, 1.9]]
    out = coordinate_median(states(*honest, [1e6, -1e6], [1e6, -1e6]))
    np.testing.assert_allclose(out["w"], [1.1, 1.9], rtol=1e-6)


def test_trimmed_mean_cuts_beta_n_from_each_end():
    five = states([0, 10], [1, 20], [2, 30], [3, 40], [100, -1000])
    # beta 0.2 of 5: one cut per end; coordinate 0 keeps 1, 2, 3; coordinate 1 keeps 10, 20, 30
    np.testing.assert_allclose(trimmed_mean(five, 0.2)["w"], [2, 20])
    # beta 0.1 of 5 cuts nothing: the plain mean
    np.testing.assert_allclose(trimmed_mean(five, 0.1)["w"], [21.2, -180])
    # beta 0.4 of 5: two per end, the median
    np.testing.assert_allclose(trimmed_mean(five, 0.4)["w"], [2, 20])


def test_trimmed_mean_keeps_at_least_one_value():
    two = states([1, 1], [3, 5])
    np.testing.assert_allclose(trimmed_mean(two, 0.49)["w"], [2, 3])
    with pytest.raises(ValueError):
        trimmed_mean(two, 0.5)


def test_krum_picks_the_honest_update_closest_to_the_others():
    models = states([0, 0], [0.1, 0], [0, 0.1], [0.05, 0.05], [50, 50], [-40, 60])
    # f = 2, n = 6: each score sums the 2 nearest; index 3 sits amid the honest ones
    assert krum_select(models, f=2) == [3]
    scores = krum_scores(models, f=2)
    assert scores[3] == pytest.approx(0.01)  # two neighbours at squared distance 0.005
    assert scores[0] == pytest.approx(0.015)
    assert scores[4] > 1000 and scores[5] > 1000


def test_multi_krum_averages_the_m_best():
    models = states([0, 0], [0.1, 0], [0, 0.1], [0.05, 0.05], [50, 50], [-40, 60])
    chosen = krum_select(models, f=2, m=4)
    assert sorted(chosen) == [0, 1, 2, 3]
    average = weighted_average([models[i] for i in sorted(chosen)], [1.0] * 4)
    np.testing.assert_allclose(average["w"], [0.0375, 0.0375], rtol=1e-6)
    with pytest.raises(ValueError):
        krum_select(models, f=2, m=7)


def test_clipping_scales_an_update_to_the_bound():
    start = {"w": np.float32([1, 1]), "n": np.asarray(3)}
    model = {"w": np.float32([4, 5]), "n": np.asarray(4)}  # update (3, 4), norm 5
    assert update_norm(model, start) == pytest.approx(5.0)
    clipped = clip_update(model, start, 2.5)
    np.testing.assert_allclose(clipped["w"], [2.5, 3.0])
    assert update_norm(clipped, start) == pytest.approx(2.5)
    assert int(clipped["n"]) == 4  # integer buffers kept
    np.testing.assert_array_equal(clip_update(model, start, 6.0)["w"], model["w"])


# ----- Attacks ---------------------------------------------------------------------------
RECEIVED = {"w": np.float32([1, 2, 3]), "n": np.asarray(5, dtype=np.int64)}
TRAINED = {"w": np.float32([2, 2, 1]), "n": np.asarray(6, dtype=np.int64)}  # update (1, 0, -2)


@pytest.mark.parametrize(
    "kind, factor, expected",
    [
        ("scale", 100.0, [101, 2, -197]),
        ("sign_flip", 1.0, [0, 2, 5]),
        ("sign_flip", 3.0, [-2, 2, 9]),
    ],
)
def test_model_attacks_change_the_update(kind, factor, expected):
    out = poisoned(kind, factor, TRAINED, RECEIVED, np.random.default_rng(0))
    np.testing.assert_allclose(out["w"], expected)
    assert out["w"].dtype == np.float32 and int(out["n"]) == 6


def test_noise_is_seeded_and_scaled_by_the_updates_rms():
    rms = np.sqrt((1 + 0 + 4) / 3)
    a = poisoned("noise", 10.0, TRAINED, RECEIVED, np.random.default_rng(7))
    b = poisoned("noise", 10.0, TRAINED, RECEIVED, np.random.default_rng(7))
    np.testing.assert_array_equal(a["w"], b["w"])
    draw = np.random.default_rng(7).standard_normal(3)
    np.testing.assert_allclose(a["w"], TRAINED["w"] + 10 * rms * draw, rtol=1e-5)
    silent = poisoned("noise", 0.0, TRAINED, RECEIVED, np.random.default_rng(7))
    np.testing.assert_array_equal(silent["w"], TRAINED["w"])


def test_nan_attack_sends_nan_floats():
    out = poisoned("nan", 1.0, TRAINED, RECEIVED, np.random.default_rng(0))
    assert np.isnan(out["w"]).all() and int(out["n"]) == 6
    with pytest.raises(ValueError):
        poisoned("label_flip", 1.0, TRAINED, RECEIVED, np.random.default_rng(0))


def test_label_flip_maps_c_to_c_minus_one_minus_c():
    labels = torch.tensor([0, 3, 9])
    assert flipped_labels(labels, 10).tolist() == [9, 6, 0]
    logits = torch.tensor([[5.0, 1.0, 0.0, -1.0], [0.0, 0.2, 3.0, 0.1]])
    flipped = flipped_logits(logits)
    assert flipped.argmax(1).tolist() == flipped_labels(logits.argmax(1), 4).tolist()
    assert torch.equal(flipped.softmax(1).max(1).values, logits.softmax(1).max(1).values)


def test_attackers_are_the_partitions_sampled_plus_a_seeded_fraction():
    rng = np.random.default_rng
    assert attackers([0, 2, 3, 5], [0, 1], 0.0, rng(0)) == [0]
    drawn = attackers(list(range(10)), [], 0.2, rng(3))
    assert len(drawn) == 2 and drawn == attackers(list(range(10)), [], 0.2, rng(3))
    both = attackers(list(range(10)), [4], 0.25, rng(3))  # 2.5 rounds half up to 3 more
    assert 4 in both and len(both) == 4
    assert attackers([1, 2], [], 1.0, rng(0)) == [1, 2]


# ----- Keys -------------------------------------------------------------------------------
def refusal(raw: dict) -> str:
    with pytest.raises(ConfigError) as caught:
        resolve_config(raw)
    return str(caught.value)


def with_keys(name: str, **sections) -> dict:
    raw = tiny_raw(name)
    for section, values in sections.items():
        raw[section] = {**raw.get(section, {}), **values}
    return raw


def test_attack_keys_are_checked_with_one_line():
    bad = with_keys("fedavg_fixmatch", federation={"attack": {"kind": "scale", "partitions": [5]}})
    assert refusal(bad) == (
        "config key 'federation.attack.partitions': partition ids in [0, 3) "
        "(split.num_clients), each once; got [5]"
    )
    bad = with_keys("fedavg_fixmatch", federation={"attack": {"partitions": "0,1"}})
    assert refusal(bad) == (
        "config key 'federation.attack.partitions': expected a list of integers, got '0,1'"
    )
    bad = with_keys("fedavg_fixmatch", federation={"attack": {"kind": "scale"}})
    assert "needs attackers" in refusal(bad)
    bad = with_keys("fedavg_fixmatch", aggregate={"rule": "mode"})
    assert refusal(bad).startswith("config key 'aggregate.rule': 'mode' is not one of mean,")


def test_methods_that_do_not_average_models_refuse_the_robust_keys():
    for name in ("fedmatch", "fedossl"):
        message = refusal(with_keys(name, aggregate={"rule": "median"}))
        assert message == (
            f"config key 'aggregate.rule': method {name!r} does not aggregate by averaging "
            "models; leave aggregate.* at its defaults"
        )
    message = refusal(with_keys("fedmatch", aggregate={"clip_norm": 1.0}))
    assert message.startswith("config key 'aggregate.clip_norm': method 'fedmatch'")


def test_clients_refuse_attacks_they_cannot_apply():
    attack = {"attack": {"kind": "label_flip", "partitions": [0]}}
    assert refusal(with_keys("fedavg_simclr", federation=attack)) == (
        "config key 'federation.attack.kind': method 'fedavg_simclr''s clients cannot apply "
        "'label_flip' (they can: nan, noise, scale, sign_flip)"
    )
    attack = {"attack": {"kind": "scale", "partitions": [0]}}
    assert "(they can: none)" in refusal(with_keys("fedmatch", federation=attack))
    resolve_config(
        with_keys("fedseal", federation={"attack": {"kind": "label_flip", "fraction": 0.5}})
    )


# ----- Runs -------------------------------------------------------------------------------
def attacked(name: str, kind: str, **aggregate) -> dict:
    raw = with_keys(name, federation={"attack": {"kind": kind, "partitions": [0]}})
    raw["rounds"], raw["federation"]["clients_per_round"] = 2, 3
    if aggregate:
        raw["aggregate"] = aggregate
    return raw


def test_attackers_are_told_and_recorded_and_nan_replies_rejected():
    grid = InProcessGrid(3)
    rows, _ = run_method(attacked("fedavg_fixmatch", "nan"), grid)
    assert [row["attackers"] for row in rows] == [[0], [0]]
    assert [row["rejected_partitions"] for row in rows] == [[0], [0]]
    trains = [m for m in grid.sent if "config" in m.content]  # the discovery query has none
    told = [m.metadata.dst_node_id for m in trains if "attack" in m.content["config"]]
    assert {grid.partition[nid] for nid in told} == {0}


def test_clipping_and_krum_are_recorded_per_round():
    rows, _ = run_method(attacked("fedavg_fixmatch", "scale", clip_norm=1e-6), InProcessGrid(3))
    assert [row["clipped_partitions"] for row in rows] == [[0, 1, 2], [0, 1, 2]]
    assert "krum_selected" not in rows[0] and "dropped_partitions" not in rows[0]
    rows, _ = run_method(
        attacked("fedavg_fixmatch", "scale", rule="krum", krum_f=0), InProcessGrid(3)
    )
    assert all(len(row["krum_selected"]) == 1 and 0 not in row["krum_selected"] for row in rows)


def test_the_defaults_record_no_robust_keys():
    rows, _ = run_method(tiny_raw("fedavg_fixmatch"), InProcessGrid(3))
    robust = {"attackers", "clipped_partitions", "dropped_partitions", "krum_selected"}
    assert not robust & {key for row in rows for key in row}


@pytest.mark.parametrize("name", ["fedavg_with_server", "fedrgd", "fedsup", "fedavg_uda"])
def test_every_model_averaging_method_takes_the_robust_keys(name):
    rows, _ = run_method(
        attacked(name, "sign_flip", rule="trimmed_mean", clip_norm=10.0, validate_on_server=True),
        InProcessGrid(3),
    )
    assert all(row["attackers"] == [0] for row in rows)
    assert all("clipped_partitions" in row and "dropped_partitions" in row for row in rows)
    assert all(np.isfinite(row["test_accuracy"]) for row in rows)


def test_validation_drops_updates_that_lose_more_than_the_margin(monkeypatch):
    raw = with_keys("fedavg_fixmatch", aggregate={"validate_on_server": True})
    server = build_strategy(raw).server
    robust = RobustAveraging(server)
    start = server.arrays()
    model = {k: v.numpy() for k, v in server.model.state_dict().items()}
    assert (
        robust.validation_accuracy(model)
        == evaluate(server.model, server.val_x, server.val_y, 500)[0]
    )
    scores = {0: 0.80, 1: 0.76, 2: 0.74, 3: 0.60}  # the start scores 0.80; margin 0.05
    users = {pid: {**model, "pid": np.asarray(pid)} for pid in scores}
    monkeypatch.setattr(
        robust, "validation_accuracy", lambda s: scores[int(s["pid"])] if "pid" in s else 0.80
    )
    assert robust.validation_drops(users, {pid: start for pid in users}) == [2, 3]


def test_validation_against_the_median_client_keeps_a_round_that_lost_alike(monkeypatch):
    raw = with_keys(
        "fedavg_fixmatch",
        aggregate={"validate_on_server": True, "validation_reference": "median"},
    )
    server = build_strategy(raw).server
    robust = RobustAveraging(server)
    start = server.arrays()
    model = {k: v.numpy() for k, v in server.model.state_dict().items()}
    # Every honest client lost 0.08 against the model it was sent (0.80), an attacker 0.70:
    # `received` would drop all five; the median (0.72) drops only the attacker.
    scores = {0: 0.72, 1: 0.73, 2: 0.71, 3: 0.72, 4: 0.10}
    users = {pid: {**model, "pid": np.asarray(pid)} for pid in scores}
    monkeypatch.setattr(
        robust, "validation_accuracy", lambda s: scores[int(s["pid"])] if "pid" in s else 0.80
    )
    assert robust.validation_drops(users, {pid: start for pid in users}) == [4]
    robust.options = dataclasses.replace(robust.options, validation_reference="received")
    assert robust.validation_drops(users, {pid: start for pid in users}) == [0, 1, 2, 3, 4]


# ----- A scaled attacker against mean, median and Krum --------------------------------------
def scale_attack_raw(aggregate: dict | None) -> dict:
    """Five clients learning synthetic data in two rounds; partition 0 scales its update
    x100 unless ``aggregate`` is None (the attack-free run)."""
    raw = deep_merge(
        synthetic_experiment(),
        {
            "split": {"num_clients": 5},
            "server": {"bootstrap_epochs": 10},
            "algo": {"threshold": 0.5},
        },
    )
    if aggregate is not None:
        raw["federation"] = {"attack": {"kind": "scale", "partitions": [0], "factor": 100.0}}
        raw["aggregate"] = aggregate
    return raw


@pytest.mark.slow  # four two-round runs of five clients
def test_a_scaled_attacker_wrecks_the_mean_and_median_and_krum_survive():
    def accuracy(raw: dict) -> float:
        rows, _ = run_method(raw, InProcessGrid(5))
        return rows[-1]["test_accuracy"]

    clean = accuracy(scale_attack_raw(aggregate=None))
    assert clean > 0.5
    assert accuracy(scale_attack_raw({"rule": "mean"})) < 0.2
    assert accuracy(scale_attack_raw({"rule": "median"})) > clean - 0.1
    assert accuracy(scale_attack_raw({"rule": "krum", "krum_f": 1})) > clean - 0.1


# ----- Through Flower: simulation and deploy-local -----------------------------------------
@pytest.mark.e2e
def test_an_attacker_in_simulation_is_recorded_in_the_results(tmp_path):
    exp = tmp_path / "exp.yaml"
    raw = scale_attack_raw({"rule": "median", "clip_norm": 1.0})
    exp.write_text(yaml.safe_dump(raw))
    res = ssfl_run(exp, tmp_path / "out", "--quiet")
    assert [row["attackers"] for row in res["rounds"]] == [[0], [0]]
    assert all(0 in row["clipped_partitions"] for row in res["rounds"])
    assert res["config"]["federation"]["attack"]["partitions"] == [0]
    assert res["final_test_accuracy"] > 0.5


@pytest.mark.e2e
def test_a_nan_attacker_in_deploy_local_is_rejected_and_the_model_is_without_it(tmp_path):
    """Node 1 sends NaN every round: rejected, and the numbers are those of a deployment in
    which node 1 fails every round (its data folder is missing)."""
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump(scale_attack_raw(None)))
    common = ("deploy-local", str(exp), "--nodes", "2", "--rounds", "2", "--quiet")
    attack = ("--set", "federation.attack.kind=nan", "--set", "federation.attack.partitions=[1]")
    attacked = ssfl_cli(*common, *attack, "--out", str(tmp_path / "attacked"))
    assert attacked.returncode == 0, attacked.stderr[-3000:]
    missing = ("--node-data", f"1={tmp_path / 'no-such-folder'}")
    ssfl_cli(*common, *missing, "--out", str(tmp_path / "without"))
    att, without = (
        json.loads((tmp_path / d / "results.json").read_text()) for d in ("attacked", "without")
    )
    assert [row["attackers"] for row in att["rounds"]] == [[1], [1]]
    assert [row["rejected_partitions"] for row in att["rounds"]] == [[1], [1]]
    assert "non-finite values" in att["rounds"][0]["rejected_reasons"][0]
    assert [row["failed_partitions"] for row in without["rounds"]] == [[1], [1]]
    for key in ("test_accuracy", "test_loss", "train_loss"):
        assert [r[key] for r in att["rounds"]] == [r[key] for r in without["rounds"]], key


def ssfl_cli(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "ssfl.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=900)

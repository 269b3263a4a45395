"""FedSup and the federated SSL baselines on the in-process grid (synthetic data)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import client_app.fedsup as fedsup_client
from ssfl.experiment import resolve_config
from ssfl.records import record_arrays
from tasks.config import deep_merge
from tasks.models import SSLOutputs, classifier_keys
from tests.harness import InProcessGrid, build_strategy, run_method

HEADS = {"projector_dim": 128, "predictor_dim": 16}

BASE = {
    "method": "fedsup",
    "rounds": 2,
    "dataset": {"name": "synthetic28", "synthetic_train_size": 1200, "synthetic_test_size": 200},
    "split": {
        "labeled_per_class": 10,
        "val_size": 0,
        "test_size": 200,
        "num_clients": 4,
        "client_size": 64,
    },
    "federation": {"clients_per_round": 3},
    "model": HEADS,
    "server": {"bootstrap_epochs": 2, "epochs": 1, "batch_size": 32},
    "client": {"batch_size": 32, "lr": 0.05},
}


def run(**changes) -> list[dict]:
    rows, _ = run_method(deep_merge(BASE, changes), InProcessGrid(4))
    return rows


def test_f_server_trains_exactly_as_the_centralized_baseline():
    """f_Server never sees the clients: its accuracy is Server-SL's, round by round."""
    fedsup = run()
    plain = {"projector_dim": 0, "predictor_dim": 0}
    centralized, _ = run_method(
        deep_merge(BASE, {"method": "server_sl", "model": plain}), InProcessGrid(4)
    )
    assert [r["teacher_accuracy"] for r in fedsup] == [r["test_accuracy"] for r in centralized]


def test_the_teacher_travels_down_only_and_is_counted():
    rows = run()
    for row in rows:
        assert row["bytes_s2c"] > row["bytes_c2s"]  # online + f_Server down, online up
    strategy = build_strategy(BASE)
    teacher = strategy.parts.codec.payloads[0].record
    online = strategy.server.arrays()
    per_client = rows[0]["bytes_s2c"] - rows[0]["bytes_c2s"]
    assert per_client // rows[0]["clients"] >= sum(a.numpy().nbytes for a in teacher.values())
    assert set(teacher.keys()) < set(online.keys())


def test_f_server_joins_every_group_with_its_layers_and_the_heads_come_from_the_online_net():
    strategy = build_strategy(BASE)
    aggregator = strategy.parts.aggregator
    joining = aggregator.joining()
    teacher = record_arrays(strategy.parts.codec.payloads[0].record)
    online = record_arrays(strategy.server.arrays())
    assert list(joining) == list(online)
    for key, value in joining.items():
        expected = teacher[key] if key in teacher else online[key]
        np.testing.assert_array_equal(value, expected)
    assert any(k.startswith("1.projector") for k in joining)
    assert not set(classifier_keys(strategy.server.model)) & set(aggregator.diversity_keys)


def test_without_feature_maps_the_mse_term_is_zero_and_without_consistency_only_it_is_left():
    no_mse = run(algo={"feature_blocks": 0})
    assert all(r["mse_loss"] == 0.0 for r in no_mse)
    assert all(r["train_loss"] == pytest.approx(r["consistency_loss"]) for r in no_mse)
    no_con = run(algo={"consistency_weight": 0.0})
    for row in no_con:
        assert row["train_loss"] == pytest.approx(row["mse_weight"] * row["mse_loss"], rel=1e-5)
        assert row["mse_loss"] > 0


def test_the_mse_weight_decays_as_lambda_s_to_the_round_over_the_horizon():
    rows = run(algo={"lambda_s": 1e-2, "mse_horizon": 0})  # T = the run's 2 rounds
    assert [r["mse_weight"] for r in rows] == pytest.approx([1e-1, 1e-2])
    rows = run(algo={"lambda_s": 1e-2, "mse_horizon": 4})  # T = 4: 1e-2^(1/4), 1e-2^(2/4)
    assert [r["mse_weight"] for r in rows] == pytest.approx([10**-0.5, 1e-1])


def test_the_mse_horizon_is_the_runs_rounds_by_default():
    """4.1.1: lambda_s^(t/T), T the total number of rounds."""
    assert resolve_config({"method": "fedsup"})["algo"]["mse_horizon"] == 0


def test_the_consistency_loss_crosses_the_views(monkeypatch):
    """L_Con (4.1.1, eq. 3.6 form): the online prediction of A(x) against f_Server's output
    on x, and the prediction of x against its output on A(x), never the same view."""
    p_raw, p_aug = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]])
    t_raw, t_aug = torch.tensor([[1.0, 0.0]]), torch.tensor([[1.0, 1.0]])
    online, teacher = object(), object()

    def outputs(model, x):
        if model is online:
            return SSLOutputs([], p_raw, None, torch.cat([p_raw, p_aug]))
        return SSLOutputs([], torch.cat([t_raw, t_aug]), None, None)

    monkeypatch.setattr(fedsup_client, "ssl_outputs", outputs)
    algo = SimpleNamespace(first_block=0, feature_blocks=0, consistency_weight=1.0)
    half = SimpleNamespace(algo=algo, model=online)
    x = torch.zeros(1, 1, 2, 2)
    _, l_con, _ = fedsup_client.FedSupClient.step_loss(half, teacher, x, x, 0.0)
    crossed = 0.5 * (0.0 - 1 / math.sqrt(2))  # D(p_aug, t_raw) = 0, D(p_raw, t_aug) = -cos 45
    assert float(l_con) == pytest.approx(crossed)  # same views would give -0.8536


@pytest.mark.parametrize(
    "method, model",
    [
        ("fedavg_simclr", {"projector_dim": 16, "predictor_dim": 0}),
        ("fedavg_simsiam", {"projector_dim": 16, "predictor_dim": 8}),
        ("fedavg_byol", {"projector_dim": 16, "predictor_dim": 8}),
    ],
)
def test_ssl_baselines_train_their_heads_and_the_server_trains_the_aggregate(method, model):
    raw = deep_merge(BASE, {"method": method, "model": model})
    strategy = build_strategy(raw)
    before = record_arrays(strategy.server.arrays())
    rows, strategy = run_method(raw, InProcessGrid(4))
    after = record_arrays(strategy.server.arrays())
    moved = {k for k in before if not np.array_equal(before[k], after[k])}
    assert any(k.startswith("1.projector") for k in moved)
    assert all(np.isfinite(r["train_loss"]) for r in rows)
    assert all("aggregate_accuracy" in r for r in rows)


def test_protocols_run_every_k_rounds_and_at_the_last_round():
    rows = run(rounds=3, eval={"protocol_every": 2, "finetune_epochs": 1, "linear_epochs": 2})
    have = [("finetune_accuracy" in r, "linear_accuracy" in r) for r in rows]
    assert have == [(False, False), (True, True), (True, True)]
    assert all(0.0 <= rows[-1][k] <= 1.0 for k in ("finetune_accuracy", "linear_accuracy"))


@pytest.mark.parametrize(
    "raw, key",
    [
        ({"method": "fedsup", "algo": {"feature_blocks": 3}}, "algo.feature_blocks"),
        ({"method": "fedsup", "algo": {"lambda_s": 0.0}}, "algo.lambda_s"),
        ({"method": "fedsup", "model": {"projector_dim": 64}}, "model.projector_dim"),
        ({"method": "fedsup", "model": {"predictor_dim": 0}}, "model.projector_dim"),
        ({"method": "fedavg_simclr", "model": {"projector_dim": 0}}, "model.projector_dim"),
        ({"method": "fedavg_simclr", "model": {"predictor_dim": 8}}, "model.predictor_dim"),
        ({"method": "fedavg_byol", "model": {"predictor_dim": 0}}, "model.predictor_dim"),
        ({"method": "fedavg_fixmatch", "model": {"projector_dim": 8}}, "model.projector_dim"),
    ],
)
def test_bad_ssl_settings_are_refused_with_one_line_naming_the_key(raw, key):
    from ssfl.experiment import resolve_config
    from tasks.config import ConfigError

    with pytest.raises(ConfigError, match=f"config key '{key}'") as err:
        resolve_config(raw)
    assert "\n" not in str(err.value)

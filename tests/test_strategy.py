"""The server halves driven through the real ClientApp handlers in-process."""

from __future__ import annotations

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord

from ssfl.experiment import resolve_config
from ssfl.registry import settings_of
from strategies.loop import RoundStats
from tasks.models import model_for
from tasks.results import Recorder
from tasks.train import evaluate
from tests.harness import InProcessGrid, build_strategy, run_method


def run(raw: dict, grid: InProcessGrid) -> list[dict]:
    return run_method(raw, grid)[0]


def test_failing_client_is_reported_and_round_goes_on(synthetic_raw):
    grid = InProcessGrid(3, fail_partitions=[1])
    rows = run(synthetic_raw, grid)
    assert len(rows) == 2
    for row in rows:
        assert row["failures"] == 1 and row["failed_partitions"] == [1]
        assert row["clients"] == 2
        assert 0.0 <= row["test_accuracy"] <= 1.0


def test_replies_are_aggregated_in_partition_order_whatever_their_arrival(synthetic_raw):
    grid = InProcessGrid(3)
    _, strategy = run_method(synthetic_raw, grid)
    replies = [r for r in grid.replies if r.metadata.message_type == "train"][-3:]
    for order in ([2, 0, 1], [1, 2, 0], [2, 1, 0]):
        updates = strategy.accept(2, [replies[i] for i in order], RoundStats())
        assert [u.pid for u in updates] == [0, 1, 2]


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fedavg_fixmatch", "fedmatch"])
def test_same_seed_same_numbers_whatever_the_reply_order(synthetic_raw, method):
    raw = {**synthetic_raw, "method": method}

    def rows(order_seed: int) -> list[dict]:
        out = run(raw, InProcessGrid(3, order_seed=order_seed))
        return [{k: v for k, v in r.items() if k != "seconds"} for r in out]

    first = rows(0)
    assert all(rows(seed) == first for seed in (1, 2, 3))


@pytest.mark.slow
def test_sampling_is_deterministic_and_sized(synthetic_raw):
    raw = {**synthetic_raw, "federation": {"clients_per_round": 2}}
    grid = InProcessGrid(3)
    run(raw, grid)
    trained = [m.metadata.dst_node_id for m in grid.sent if m.metadata.message_type == "train"]
    assert len(trained) == 4
    grid2 = InProcessGrid(3)
    run(raw, grid2)
    assert trained == [
        m.metadata.dst_node_id for m in grid2.sent if m.metadata.message_type == "train"
    ]


def test_server_sl_sends_nothing(synthetic_raw):
    grid = InProcessGrid(3)
    rows = run({**synthetic_raw, "method": "server_sl"}, grid)
    assert grid.sent == [] and rows[-1]["bytes_s2c"] == 0 and rows[-1]["clients"] == 0


def fedseal_raw(synthetic_raw: dict, **algo) -> dict:
    return {
        **synthetic_raw,
        "method": "fedseal",
        "rounds": 3,
        "server": {"bootstrap_epochs": 1, "epochs": 1, "lr": 0.01},
        "client": {"lr": 0.01},
        "algo": algo,
    }


def test_fedseal_ensemble_persists_in_context_state(synthetic_raw):
    grid = InProcessGrid(3)
    rows = run(fedseal_raw(synthetic_raw), grid)
    for ctx in grid.contexts.values():
        record = ctx.state["fedseal"]
        assert int(record["count"].numpy()) == 3
        ens = torch.from_numpy(record["ensemble"].numpy())
        assert ens.shape == (200, 10) and torch.allclose(ens.sum(dim=1), torch.ones(200), atol=1e-5)
    assert [r["ensemble_size"] for r in rows] == [1.0, 2.0, 3.0]
    assert len(rows[-1]["tau"]) == 10
    assert 0 <= rows[-1]["positive_fraction"] + rows[-1]["negative_fraction"] <= 1.0


def test_fedseal_unsampled_rounds_do_not_grow_the_ensemble(synthetic_raw):
    raw = fedseal_raw(synthetic_raw)
    raw["federation"] = {"clients_per_round": 1}
    grid = InProcessGrid(3)
    run(raw, grid)
    counts = sorted(
        int(c.state["fedseal"]["count"].numpy())
        for c in grid.contexts.values()
        if "fedseal" in c.state
    )
    assert sum(counts) == 3  # one participation per round, whoever was sampled


def test_fedseal_ablations_switch_parts_off(synthetic_raw):
    grid = InProcessGrid(3)
    rows = run(
        fedseal_raw(
            synthetic_raw,
            self_ensemble=False,
            negative_learning=False,
            classwise_threshold=False,
            fixed_threshold=0.7,
        ),
        grid,
    )
    assert all("fedseal" not in c.state for c in grid.contexts.values())
    assert rows[-1]["negative_fraction"] == 0.0 and rows[-1]["tau"] == [0.7] * 10


def test_fedseal_tau_is_clipped_to_tau_max(synthetic_raw):
    rows = run(fedseal_raw(synthetic_raw, tau_max=0.3), InProcessGrid(3))
    assert all(0.0 <= t <= 0.3 for r in rows for t in r["tau"])
    assert max(t for r in rows for t in r["tau"]) == pytest.approx(0.3)


@pytest.mark.slow
def test_fedseal_oracle_labels_keep_the_positive_set_and_fix_its_labels(synthetic_raw):
    every = {"classwise_threshold": False, "fixed_threshold": 0.0}  # all samples positive
    plain = run(fedseal_raw(synthetic_raw, **every), InProcessGrid(3))
    oracle = run(fedseal_raw(synthetic_raw, oracle_labels=True, **every), InProcessGrid(3))
    assert [r["positive_fraction"] for r in oracle] == [1.0] * 3
    assert plain[0]["pseudo_label_accuracy"] < 1.0
    assert [r["pseudo_label_accuracy"] for r in oracle] == pytest.approx([1.0] * len(oracle))


@pytest.mark.slow
def test_aggregate_accuracy_is_the_model_before_the_server_step(synthetic_raw):
    # No BatchNorm and a server rate far below float32's resolution of the weights: the
    # server step leaves the aggregate unchanged.
    raw = {
        **synthetic_raw,
        "model": {"norm": "none"},
        "server": {"bootstrap_epochs": 1, "epochs": 1, "lr": 1e-30},
    }
    rows = run(raw, InProcessGrid(3))
    assert [r["aggregate_accuracy"] for r in rows] == [r["test_accuracy"] for r in rows]
    trained = run({**synthetic_raw, "model": {"norm": "none"}}, InProcessGrid(3))
    assert trained[-1]["aggregate_accuracy"] != trained[-1]["test_accuracy"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "raw_update",
    [
        {"server": {"bootstrap_epochs": 1, "epochs": 0}},  # no server step
        # the server trains beside the users, not after them
        {"method": "fedavg_with_server", "server": {"bootstrap_epochs": 1, "epochs": 0}},
    ],
)
def test_no_aggregate_accuracy_without_a_server_step(synthetic_raw, raw_update):
    rows = run({**synthetic_raw, **raw_update}, InProcessGrid(3))
    assert all("aggregate_accuracy" not in r for r in rows)


def one_client(raw: dict) -> dict:
    return {**raw, "split": {**raw["split"], "num_clients": 1}, "eval": {"local_models": True}}


@pytest.mark.parametrize("method", ["fedavg_fixmatch", "fedseal"])
def test_local_accuracy_of_a_lone_client_is_its_uploaded_model(synthetic_raw, method):
    raw = one_client({**synthetic_raw, "method": method, "model": {"norm": "none"}})
    rows = run({**raw, "server": {"bootstrap_epochs": 1, "epochs": 0}}, InProcessGrid(1))
    # No server step, one client: the global model is that client's model.
    assert [r["local_accuracy"] for r in rows] == [r["test_accuracy"] for r in rows]


@pytest.mark.slow
def test_local_accuracy_is_recorded_only_when_asked(synthetic_raw):
    assert all("local_accuracy" not in r for r in run(synthetic_raw, InProcessGrid(3)))
    trained = {
        "server": {"bootstrap_epochs": 10, "epochs": 1, "lr": 0.05},
        "client": {"lr": 0.02},  # 0.05 collapses every client to one class on these images
        "algo": {"threshold": 0.3},
    }
    grid = InProcessGrid(3)
    rows, strategy = run_method({**synthetic_raw, **trained, "eval": {"local_models": True}}, grid)
    server = strategy.server
    # The last round's three replies, each evaluated on its own: their mean is recorded.
    model = model_for(server.settings.model, server.dataset)
    accuracies = []
    for reply in grid.replies[-3:]:
        model.load_state_dict(reply.content["arrays"].to_torch_state_dict())
        accuracies.append(evaluate(model, server.test_x, server.test_y, 500)[0])
    assert rows[-1]["local_accuracy"] == pytest.approx(sum(accuracies) / 3)
    assert len(set(accuracies)) > 1  # the clients' models differ


@pytest.mark.slow
def test_eval_every_tests_only_the_asked_rounds_and_the_last_without_changing_training(
    synthetic_raw, tmp_path
):
    raw = {**synthetic_raw, "rounds": 3}
    every_round = run(raw, InProcessGrid(3))
    rows = run({**raw, "eval": {"every": 2, "local_models": True}}, InProcessGrid(3))
    tested = [r["round"] for r in rows if "test_accuracy" in r]
    assert tested == [2, 3]
    assert [r["round"] for r in rows if "aggregate_accuracy" in r] == [2, 3]
    assert [r["round"] for r in rows if "local_accuracy" in r] == [2, 3]
    for row, full in zip(rows, every_round, strict=True):
        assert row["train_loss"] == full["train_loss"]
        if row["round"] in tested:
            assert row["test_accuracy"] == full["test_accuracy"]
    recorder = Recorder(tmp_path, settings_of(resolve_config({**raw, "eval": {"every": 2}})), {})
    for row in rows:
        recorder.add_round(row)
    results = recorder.finish()
    assert results["final_test_accuracy"] == rows[-1]["test_accuracy"]
    assert results["best_test_accuracy"] == max(rows[i]["test_accuracy"] for i in (1, 2))


def test_start_sends_train_config_to_every_client_and_records_evaluate_fn(synthetic_raw):
    grid = InProcessGrid(3)
    rows: list[dict] = []
    strategy = build_strategy({**synthetic_raw, "method": "fedavg_fixmatch"}, rows.append)
    seen = []

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        seen.append((server_round, sorted(arrays.keys()) == sorted(strategy.server.arrays())))
        return MetricRecord({"outside_metric": float(server_round)})

    strategy.start(
        grid, num_rounds=2, train_config=ConfigRecord({"note": 7}), evaluate_fn=evaluate_fn
    )
    trained = [m for m in grid.sent if m.metadata.message_type == "train"]
    assert len(trained) == 6 and all(m.content["config"]["note"] == 7 for m in trained)
    assert [m.content["config"]["round"] for m in trained] == [1, 1, 1, 2, 2, 2]
    assert seen == [(1, True), (2, True)]
    assert [r["outside_metric"] for r in rows] == [1.0, 2.0]


def test_start_refuses_an_evaluate_config_before_any_message(synthetic_raw):
    grid = InProcessGrid(3)
    strategy = build_strategy(synthetic_raw)
    with pytest.raises(ValueError, match="evaluate_config"):
        strategy.start(grid, num_rounds=1, evaluate_config=ConfigRecord({"a": 1}))
    assert grid.sent == []


def test_aggregate_train_is_the_round_s_aggregate_and_its_metrics(synthetic_raw):
    grid = InProcessGrid(3)
    _, strategy = run_method(synthetic_raw, grid)
    replies = [r for r in grid.replies if r.metadata.message_type == "train"][-3:]
    strategy.stats, strategy.sent_ids = RoundStats(), {}
    arrays, metrics = strategy.aggregate_train(2, replies)
    assert sorted(arrays.keys()) == sorted(strategy.server.arrays().keys())
    assert 0.0 <= metrics["mask_rate"] <= 1.0 and strategy.stats.replies == 3
    assert [u.pid for u in strategy.updates] == [0, 1, 2]
    strategy.stats = RoundStats()
    assert strategy.aggregate_train(3, []) == (None, None)

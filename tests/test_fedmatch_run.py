"""FedMatch end to end through the real ClientApp handlers (in-process Grid, synthetic data)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from flwr.app import Message

from strategies.parts import Update
from tasks.decompose import BUFFER
from tests.harness import InProcessGrid, build_strategy, run_method


def fedmatch_raw(synthetic_raw: dict, rounds: int = 2, **algo) -> dict:
    return {
        **synthetic_raw,
        "split": {**synthetic_raw["split"], "client_size": 80},  # 2 batches a client
        "method": "fedmatch",
        "rounds": rounds,
        "device": "cpu",
        "server": {"bootstrap_epochs": 1, "epochs": 1, "lr": 0.01},
        "client": {"lr": 0.01, "batch_size": 50},
        "algo": {"helper_interval": 2, **algo},
    }


def run(raw: dict, grid: InProcessGrid):
    rows, strategy = run_method(raw, grid)
    return strategy, rows


def train_messages(grid: InProcessGrid) -> list[Message]:
    return [m for m in grid.sent if m.metadata.message_type == "train"]


def test_two_rounds_labels_at_server_helpers_sync_and_bytes(synthetic_raw):
    grid = InProcessGrid(3)
    strategy, rows = run(fedmatch_raw(synthetic_raw), grid)
    messages = train_messages(grid)
    assert len(rows) == 2 and len(messages) == 6
    first, second = messages[:3], messages[3:]
    # Round 1: dense model, no helpers. Round 2 (a helper round): sparse against round 1.
    for msg in first:
        assert "helpers" not in msg.content.array_records
        assert msg.content["config"]["sync-since"] == -1
        assert {"sigma.dense", "psi.dense"} <= set(msg.content["arrays"].keys())
    for msg in second:
        pid = grid.partition[msg.metadata.dst_node_id]
        helpers = list(msg.content["config"]["helpers"])
        assert len(helpers) == 2 and pid not in helpers and set(helpers) <= {0, 1, 2}
        assert msg.content["config"]["sync-since"] == 1
        assert len(msg.content["helpers"].keys()) >= 4  # positions + values of each helper
    # Labels at the server: clients upload psi (and buffers), never sigma.
    for reply in grid.replies:
        if reply.metadata.message_type == "train":
            keys = set(reply.content["arrays"].keys())
            assert any(k.startswith("psi.") for k in keys)
            assert not any(k.startswith("sigma.") for k in keys)
    # Every client ends holding exactly the server's public copy.
    for ctx in grid.contexts.values():
        record = ctx.state["fedmatch"]
        assert int(record["round"].numpy()) == 2
        for part in ("sigma", "psi"):
            held = torch.from_numpy(record[part].numpy())
            assert torch.equal(held, strategy.parts.codec.public[part].value)
    for row in rows:
        assert row["bytes_c2s"] <= row["bytes_c2s_dense"] + 3 * 2000  # npy headers
        assert row["bytes_s2c_dense"] == 3 * strategy.parts.codec.dense_model_bytes
        assert 0.0 <= row["mask_rate"] <= 1.0 and 0.0 <= row["psi_nonzero"] <= 1.0
    assert rows[1]["s2c_ratio"] < rows[0]["s2c_ratio"]  # sparse after the first contact
    assert rows[0]["helper_round"] == 0.0 and rows[1]["helper_round"] == 1.0
    assert rows[1]["helpers"] == 2.0


def test_server_trains_sigma_only(synthetic_raw):
    strategy = build_strategy(fedmatch_raw(synthetic_raw))
    before = {part: strategy.server.model.flat(part) for part in ("sigma", "psi")}
    out = strategy.parts.trainer.fit(1, 1)
    assert out["server_loss"] > 0
    assert torch.equal(strategy.server.model.flat("psi"), before["psi"])
    assert not torch.equal(strategy.server.model.flat("sigma"), before["sigma"])


@pytest.mark.slow
def test_labels_at_client_uploads_both_parts(synthetic_raw):
    raw = fedmatch_raw(synthetic_raw, rounds=1, delta=5.0e-5, lambda_l1=1.0e-4)
    raw["split"] = {**raw["split"], "scenario": "labels_at_client", "labeled_per_class": 0}
    raw["split"]["client_labeled_per_class"] = 1
    raw["server"] = {"bootstrap_epochs": 0, "epochs": 0}
    grid = InProcessGrid(3)
    strategy, rows = run(raw, grid)
    replies = [r for r in grid.replies if r.metadata.message_type == "train"]
    assert len(replies) == 3 and rows[0]["clients"] == 3
    for reply in replies:
        keys = set(reply.content["arrays"].keys())
        assert any(k.startswith("sigma.") for k in keys) and any(k.startswith("psi.") for k in keys)
    assert strategy.parts.codec.uploaded == ("sigma", "psi")


@pytest.mark.slow
def test_ablations_no_helpers_and_no_decomposition(synthetic_raw):
    grid = InProcessGrid(3)
    _, rows = run(fedmatch_raw(synthetic_raw, num_helpers=0), grid)
    assert all("helpers" not in m.content.array_records for m in train_messages(grid))
    assert rows[1]["helper_round"] == 0.0

    grid = InProcessGrid(3)
    strategy, rows = run(fedmatch_raw(synthetic_raw, decomposition=False), grid)
    assert strategy.server.model.parts() == ("sigma",) and "psi_nonzero" not in rows[-1]
    for msg in train_messages(grid):
        assert not any(k.startswith("psi.") for k in msg.content["arrays"])
    assert all(len(m.content["config"]["helpers"]) == 2 for m in train_messages(grid)[3:])
    assert np.isfinite(rows[-1]["test_loss"])


@pytest.mark.slow
def test_a_client_out_of_sync_fails_and_gets_the_dense_model_next(synthetic_raw):
    grid = InProcessGrid(3)
    lost = next(iter(grid.contexts))
    rows: list[dict] = []

    def on_round(row: dict) -> None:
        rows.append(row)
        if row["round"] == 1:
            del grid.contexts[lost].state["fedmatch"]  # the node loses its copy

    build_strategy(fedmatch_raw(synthetic_raw, rounds=3), on_round).start(grid, num_rounds=3)
    assert [r["failures"] for r in rows] == [0, 1, 0]
    assert rows[1]["failed_partitions"] == [grid.partition[lost]]
    last = {m.metadata.dst_node_id: m for m in train_messages(grid)[-3:]}
    assert last[lost].content["config"]["sync-since"] == -1
    assert sorted(m.content["config"]["sync-since"] for m in last.values()) == [-1, 2, 2]


@pytest.mark.slow
def test_load_local_rebuilds_the_client_model_from_its_reply(synthetic_raw):
    raw = fedmatch_raw(synthetic_raw, delta=0.0)  # delta 0: the public copy is exact
    raw["split"] = {**raw["split"], "num_clients": 1}
    raw["eval"] = {"local_models": True}
    grid = InProcessGrid(1)
    strategy, rows = run(raw, grid)
    reply = [r for r in grid.replies if r.metadata.message_type == "train"][-1]
    local = copy.deepcopy(strategy.server.model)
    strategy.parts.codec.load_local(local, Update.of(reply))
    # psi: the client's upload (the lone client's psi is the average; the server keeps
    # psi); sigma: the public copy the client received, not the one the server retrained.
    assert torch.equal(local.flat("psi"), strategy.server.model.flat("psi"))
    assert not torch.equal(local.flat("psi"), strategy.parts.codec.public["psi"].value)
    assert torch.equal(local.flat("sigma"), strategy.parts.codec.public["sigma"].value)
    assert not torch.equal(local.flat("sigma"), strategy.server.model.flat("sigma"))
    buffers = {
        k[len(BUFFER) :]: v.numpy()
        for k, v in reply.content["arrays"].items()
        if k.startswith(BUFFER)
    }
    assert buffers and all(
        np.array_equal(v.numpy(), buffers[k]) for k, v in local.buffer_state().items()
    )
    assert [r["local_accuracy"] for r in rows] == [r["aggregate_accuracy"] for r in rows]

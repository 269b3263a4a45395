"""The server halves driven through the real ClientApp handlers in-process."""

from __future__ import annotations

import torch

from strategies import METHODS
from strategies.base import ServerSide
from tasks.config import resolve
from tasks.partition import get_split
from tests.harness import InProcessGrid


def run(raw: dict, grid: InProcessGrid) -> list[dict]:
    cfg = resolve(raw)
    ds, split = get_split(cfg)
    server = ServerSide.build(cfg, ds, split, torch.device("cpu"))
    rows: list[dict] = []
    strategy = METHODS[cfg["method"]].strategy(server, rows.append)
    strategy.start(grid, num_rounds=cfg["rounds"])
    return rows


def test_failing_client_is_reported_and_round_goes_on(synthetic_raw):
    grid = InProcessGrid(3, fail_partitions=[1])
    rows = run(synthetic_raw, grid)
    assert len(rows) == 2
    for row in rows:
        assert row["failures"] == 1 and row["failed_partitions"] == [1]
        assert row["clients"] == 2
        assert 0.0 <= row["test_accuracy"] <= 1.0


def test_same_seed_same_numbers_whatever_the_reply_order(synthetic_raw):
    a = run(synthetic_raw, InProcessGrid(3))
    b = run(synthetic_raw, InProcessGrid(3))
    assert [r["test_accuracy"] for r in a] == [r["test_accuracy"] for r in b]
    assert a[-1]["bytes_c2s"] == a[-1]["bytes_s2c"] > 0
    assert 0.0 <= a[-1]["mask_rate"] <= 1.0 and 0.0 <= a[-1]["pseudo_label_accuracy"] <= 1.0


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

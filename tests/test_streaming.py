"""Streaming clients (FedMatch 6.1): round r trains on chunk (r - 1) // rounds_per_step."""

from __future__ import annotations

import pytest
import torch

from client_app.base import ClientData, streamed
from ssfl.experiment import resolve_experiment
from tasks.config import ConfigError
from tasks.partition import stream_slice, stream_step
from tasks.settings import SplitSettings
from tests.conftest import ROOT


def test_stream_steps_last_rounds_per_step_rounds_then_stay_on_the_last():
    rounds = (1, 10, 11, 20, 91, 100, 101, 150)
    assert [stream_step(r, 10, 10) for r in rounds] == [0, 0, 1, 1, 9, 9, 9, 9]
    assert [stream_step(r, 3, 1) for r in (1, 2, 3, 4)] == [0, 1, 2, 2]


def test_stream_slices_cover_the_data_once():
    parts = [stream_slice(23, t, 5) for t in range(5)]
    covered = [i for p in parts for i in range(23)[p]]
    assert covered == list(range(23))
    assert [p.stop - p.start for p in parts] == [4, 5, 4, 5, 5]
    with pytest.raises(ValueError, match="cannot be streamed in 5 steps"):
        stream_slice(4, 0, 5)


def fake_data(n: int) -> ClientData:
    x = torch.arange(n, dtype=torch.float32).view(n, 1, 1, 1)
    empty = torch.zeros(0)
    return ClientData(0, x, torch.arange(n), empty, empty, 10, 1, 1, False, (0.5,), (0.25,))


def test_a_client_trains_on_its_rounds_chunk_only():
    data = fake_data(20)
    scfg = SplitSettings(stream_steps=4, stream_rounds_per_step=2)
    chunks = [streamed(data, scfg, r).true_y.tolist() for r in (1, 2, 3, 8, 9)]
    assert chunks[0] == chunks[1] == list(range(5))
    assert chunks[2] == list(range(5, 10))
    assert chunks[3] == chunks[4] == list(range(15, 20))
    assert streamed(data, SplitSettings(stream_steps=0), 7) is data


def test_streaming_configs_reach_every_chunk_and_bad_values_are_refused():
    cfgs = [resolve_experiment(p) for p in sorted((ROOT / "experiments").rglob("*.yaml"))]
    streaming = [c for c in cfgs if c["split"]["stream_steps"] > 0]
    assert streaming
    for cfg in streaming:  # the run lasts long enough to train on the last chunk
        split = cfg["split"]
        assert split["stream_steps"] * split["stream_rounds_per_step"] <= cfg["rounds"], cfg["name"]
    refused = r"'split.stream_rounds_per_step': must be in \[1, 100000\], got 0"
    with pytest.raises(ConfigError, match=refused):
        resolve_experiment(
            ROOT / "experiments/fmnist-streaming/fedmatch_las.yaml",
            sets=["split.stream_rounds_per_step=0"],
        )

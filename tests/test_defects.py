"""Known defects stay fixed: shared state, one fact per key, refused options, log noise."""

from __future__ import annotations

import json

import pytest
import torch

from client_app.base import PARTITIONS_CACHED, ClientData, _client_data, parse_config, streamed
from ssfl.experiment import resolve_config
from tasks.config import ConfigError
from tasks.settings import SplitSettings
from tasks.train import make_sgd, seeded


def test_each_caller_gets_its_own_parsed_config():
    text = json.dumps({"algo": {"threshold": 0.9}})
    first = parse_config(text)
    first["algo"]["threshold"] = 0.1
    assert parse_config(text)["algo"]["threshold"] == 0.9


def test_seeded_work_leaves_the_callers_random_stream_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    with seeded(7) as gen:
        inside = torch.rand(2)
        order = torch.randperm(5, generator=gen)
    assert torch.equal(torch.rand(3), expected)  # as if the seeded work never ran
    with seeded(7) as gen:
        assert torch.equal(torch.rand(2), inside)
        assert torch.equal(torch.randperm(5, generator=gen), order)


def test_the_partition_cache_is_bounded():
    assert _client_data.cache_info().maxsize == PARTITIONS_CACHED <= 64


def test_nesterov_without_momentum_is_refused_not_dropped():
    with pytest.raises(ConfigError, match=r"'client.nesterov': Nesterov momentum needs"):
        resolve_config({"method": "fedavg_fixmatch", "client": {"nesterov": True, "momentum": 0.0}})
    with pytest.raises(ValueError, match="momentum > 0"):
        make_sgd([torch.nn.Parameter(torch.zeros(1))], 0.1, 0.0, 0.0, nesterov=True)
    opt = make_sgd([torch.nn.Parameter(torch.zeros(1))], 0.1, 0.9, 0.0, nesterov=True)
    assert opt.param_groups[0]["nesterov"] is True


@pytest.mark.parametrize(
    "split",
    [
        {"scenario": "labels_at_server", "client_labeled_per_class": 5},
        {"scenario": "labels_at_client", "client_labeled_per_class": 0},
    ],
)
def test_scenario_and_client_labels_must_agree(split):
    with pytest.raises(ConfigError, match=r"'split.scenario'.*disagree"):
        resolve_config({"method": "fedmatch", "split": split})


def test_streaming_a_node_whose_images_have_no_labels():
    data = ClientData(
        partition_id=0,
        x=torch.arange(20.0).reshape(20, 1, 1, 1),
        true_y=None,
        labeled_x=torch.zeros(0, 1, 1, 1),
        labeled_y=torch.zeros(0, dtype=torch.int64),
        num_classes=10,
        image_size=1,
        channels=1,
        flip=False,
        mean=(0.5,),
        std=(0.25,),
    )
    split = SplitSettings(stream_steps=4, stream_rounds_per_step=1)
    chunk = streamed(data, split, server_round=2)
    assert chunk.true_y is None and chunk.x.flatten().tolist() == [5.0, 6.0, 7.0, 8.0, 9.0]


def test_flowers_federation_size_warning_is_not_echoed():
    from ssfl.runner import _worth_echoing

    line = "WARNING :   Since flwr 1.32, default simulated SuperNodes changed from 10 to 2.\n"
    assert not _worth_echoing(line)
    assert _worth_echoing("WARNING :   round 3: client 2 failed: boom\n")


def test_a_normal_shut_downs_actor_warnings_are_not_echoed():
    from ssfl.runner import _worth_echoing

    line = "(ClientAppActor pid=4242) WARNING :   Manually terminating ClientAppActor\n"
    assert not _worth_echoing(line)
    assert _worth_echoing("(ClientAppActor pid=4242) WARNING :   CUDA out of memory\n")


@pytest.mark.parametrize("num_classes", [4, 7, 10, 100])
def test_fedmatch_imbalanced_split_for_any_class_count(num_classes):
    import numpy as np

    from tasks.partition import FEDMATCH_BASE_RATIOS, partition_class_counts

    counts = partition_class_counts(
        "fedmatch_imbalanced", 12, 200, num_classes, {}, np.random.default_rng(0)
    )
    assert counts.shape == (12, num_classes) and (counts.sum(axis=1) == 200).all()
    assert [int(np.argmax(row)) for row in counts] == [k % num_classes for k in range(12)]
    assert counts[0, 0] == 100 and counts[0, 1] == counts[0, -1] == 30  # 50%, 15%, 15%
    if num_classes == 10:  # the reference table itself
        assert counts[0].tolist() == [round(200 * r) for r in FEDMATCH_BASE_RATIOS]

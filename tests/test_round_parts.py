"""The round loop's hooks into the parts, on hand-made parts: the trainer's steps before and
after aggregation, the evaluator's protocols and local models, the codec's dense size, and
how the server adopts the aggregate (federation.average)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, MetricRecord, RecordDict
from torch import nn

from strategies.fedmatch import SparseSync
from strategies.parts import (
    DenseCodec,
    Evaluator,
    NoTrainer,
    ServerSide,
    SupervisedTrainer,
    Update,
)
from tasks.aggregate import keep_own_buffers


def trainer(beside: bool, labeled: int = 4, epochs: int = 1) -> SupervisedTrainer:
    """A SupervisedTrainer whose round of training is a recorded stand-in."""
    out = SupervisedTrainer.__new__(SupervisedTrainer)
    out.beside_clients = beside
    out.server = SimpleNamespace(labeled_x=torch.zeros(labeled, 1))
    out.half = SimpleNamespace(epochs=epochs, local_steps=0)
    out.train = lambda server_round: {"server_loss": float(server_round)}
    return out


def test_a_server_beside_the_clients_trains_before_aggregation_only():
    beside = trainer(beside=True)
    assert beside.before_aggregate(3) == {"server_loss": 3.0} and beside.after_aggregate(3) == {}
    assert not beside.trains_aggregate()


def test_a_server_on_the_aggregate_trains_after_aggregation_only():
    after = trainer(beside=False)
    assert after.before_aggregate(2) == {} and after.after_aggregate(2) == {"server_loss": 2.0}
    assert after.trains_aggregate()
    assert not trainer(beside=False, labeled=0).trains_aggregate()  # no labels: no step
    assert not trainer(beside=False, epochs=0).trains_aggregate()


def test_no_trainer_has_no_step():
    none = NoTrainer()
    assert none.before_aggregate(1) == {} and none.after_aggregate(1) == {}
    assert not none.trains() and not none.trains_aggregate()


class WeightAccuracy(Evaluator):
    """'Accuracy' = the model's single weight, to see which model was scored."""

    def evaluate(self, model: nn.Module) -> dict:
        return {"test_accuracy": float(model.weight.item())}


class WeightCodec(DenseCodec):
    """Loads client ``pid``'s model as the weight pid / 10."""

    def load_local(self, model: nn.Module, update: Update) -> None:
        with torch.no_grad():
            model.weight.fill_(update.pid / 10)


def evaluator(protocol_every: int = 0) -> WeightAccuracy:
    model = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(0.9)
    eval_settings = SimpleNamespace(
        protocol_every=protocol_every,
        finetune_epochs=1,
        finetune_lr=0.1,
        linear_epochs=1,
        linear_lr=0.1,
        protocol_schedule="constant",
    )
    server_settings = SimpleNamespace(batch_size=8, momentum=0.9)
    settings = SimpleNamespace(eval=eval_settings, server=server_settings)
    return WeightAccuracy(SimpleNamespace(model=model, settings=settings))


def test_local_accuracy_is_the_mean_over_the_uploaded_models_and_leaves_the_global_one():
    ev = evaluator()
    updates = [Update(pid, 10, RecordDict()) for pid in (1, 2, 6)]
    assert np.isclose(ev.local_accuracy(updates, WeightCodec()), 0.3)
    assert ev.server.model.weight.item() == np.float32(0.9)  # scored on a copy


def test_protocols_run_every_protocol_every_th_round_and_at_the_last():
    ev = evaluator(protocol_every=3)
    calls = []
    ev.protocols.evaluate = lambda model, rnd: calls.append(rnd) or {"linear_accuracy": 0.5}
    rows = [ev.after_round(ev.server.model, rnd, last_round=7) for rnd in range(1, 8)]
    assert calls == [3, 6, 7]
    assert [bool(r) for r in rows] == [False, False, True, False, False, True, True]
    off = evaluator(protocol_every=0)
    assert all(off.after_round(off.server.model, rnd, 7) == {} for rnd in range(1, 8))


def reply(metrics: dict) -> Update:
    arrays = ArrayRecord({"w": torch.zeros(3, 5), "i": torch.zeros(7, dtype=torch.int8)})
    return Update(0, 1, RecordDict({"arrays": arrays, "metrics": MetricRecord(metrics)}))


def test_a_dense_reply_costs_four_bytes_per_element_and_a_sparse_one_what_it_reports():
    assert DenseCodec().dense_bytes(reply({})) == 4 * (15 + 7)
    sparse = SparseSync.__new__(SparseSync)
    assert sparse.dense_bytes(reply({"dense-bytes": 1234.0})) == 1234
    assert sparse.dense_bytes(reply({})) == 4 * (15 + 7)


def test_keep_own_buffers_averages_parameters_only():
    averaged = {"w": np.full(2, 0.5), "bn.running_mean": np.full(2, 0.5), "bn.n": np.array(9)}
    own = {"w": np.zeros(2), "bn.running_mean": np.full(2, 3.0), "bn.n": np.array(4)}
    kept = keep_own_buffers(averaged, own, ["bn.running_mean", "bn.n"])
    assert kept["w"].tolist() == [0.5, 0.5]
    assert kept["bn.running_mean"].tolist() == [3.0, 3.0] and int(kept["bn.n"]) == 4
    assert keep_own_buffers(averaged, own, []) == averaged
    with pytest.raises(KeyError, match=r"bn\.other"):
        keep_own_buffers(averaged, own, ["bn.other"])


def bn_server(average: str) -> SimpleNamespace:
    model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    with torch.no_grad():
        model[1].running_mean.fill_(3.0)
    server = SimpleNamespace(
        model=model, settings=SimpleNamespace(federation=SimpleNamespace(average=average))
    )
    server.arrays = lambda: ArrayRecord(model.state_dict())
    server.load = lambda arrays: ServerSide.load(server, arrays)
    return server


@pytest.mark.parametrize(("average", "mean"), [("all", 0.5), ("parameters", 3.0)])
def test_the_server_adopts_the_aggregate_with_or_without_its_own_statistics(average, mean):
    server = bn_server(average)
    aggregate = {k: torch.full_like(v, 0.5) for k, v in server.model.state_dict().items()}
    aggregate["1.num_batches_tracked"] = torch.tensor(7)
    ServerSide.adopt(server, ArrayRecord(aggregate))
    assert torch.equal(server.model[0].weight, torch.full((2, 2), 0.5))  # parameters: averaged
    assert server.model[1].running_mean.tolist() == [mean, mean]
    assert int(server.model[1].num_batches_tracked) == (7 if average == "all" else 0)

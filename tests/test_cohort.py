"""Cohort execution (simulation.execution: cohort): its wire format, and runs whose rows equal
the per-client runs' for every method, with kept client state, attacks, streaming splits,
failing clients and resume."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict

import client_app.state as state_module
from client_app import app as client_app
from ssfl import cohort
from ssfl.experiment import resolve_config
from ssfl.gpu import cohort_workers
from ssfl.records import to_record
from ssfl.registry import METHODS, settings_of
from ssfl.runner import federation_config
from strategies.loop import RoundLoop, RoundStats
from strategies.parts import Update
from tasks.aggregate import (
    diversity_of_partial_sums,
    mean_of_partial_sums,
    partial_sum,
    weight_diversity,
    weighted_average,
)
from tasks.config import ConfigError, deep_merge
from tests.harness import InProcessGrid, everyday_first, run_method, tiny_raw, without_seconds
from tests.test_resume import run_rounds

pytestmark = pytest.mark.usefixtures("one_thread")

COHORT = {"simulation": {"execution": "cohort", "workers": 2}}


def cohort_raw(raw: dict) -> dict:
    return deep_merge(raw, COHORT)


def rows_of(raw: dict, nodes: int, **grid) -> list[dict]:
    rows, _ = run_method(raw, InProcessGrid(nodes, **grid))
    return without_seconds(rows)


# ----- The wire format ------------------------------------------------------------------
def test_a_shared_record_travels_once_and_each_client_gets_it_back():
    model = ArrayRecord([np.ones(3, dtype="float32")])
    contents = {
        4: RecordDict({"arrays": model, "config": ConfigRecord({"round": 1})}),
        2: RecordDict({"arrays": model, "config": ConfigRecord({"round": 1, "attack": True})}),
    }
    packed = cohort.pack(contents)
    assert [k for k in packed.array_records] == ["c4.arrays"]  # the model once
    assert packed["cohort-links"]["c2.arrays"] == "c4.arrays"
    back, errors = cohort.unpack(packed)
    assert list(back) == [4, 2] and errors == {}
    assert back[2]["arrays"] is back[4]["arrays"]
    assert back[2]["config"]["attack"] is True and "attack" not in back[4]["config"]


def test_a_failed_client_travels_as_its_reason_and_no_records():
    replies = {1: RecordDict({"metrics": MetricRecord({"partition-id": 1})})}
    packed = cohort.pack(replies, {3: "Traceback ...\nValueError: bad"})
    back, errors = cohort.unpack(packed)
    assert list(back) == [1] and errors == {3: "Traceback ...\nValueError: bad"}


def test_a_client_keeps_its_worker_across_rounds():
    assert cohort.assign([5, 0, 3, 4], 2) == [[0, 4], [3, 5]]
    assert cohort.assign([3, 1], 3) == [[3], [1], []]


def test_with_costs_a_round_is_balanced_longest_first():
    equal = dict.fromkeys(range(10), 4.0)
    assert cohort.assign(list(range(10)), 2, equal) == cohort.assign(list(range(10)), 2)
    assert cohort.assign([0, 2, 4, 6, 7], 2, equal) == [[0, 4, 7], [2, 6]]  # not 4 and 1
    costs = {0: 5.0, 1: 1.0, 2: 1.0, 3: 1.0, 4: 2.0}
    assert cohort.assign(list(costs), 2, costs) == [[0], [1, 2, 3, 4]]
    assert cohort.assign([3], 2, costs) == [[3], []]


def clients_per_message(grid: InProcessGrid) -> list[int]:
    """How many clients each cohort TRAIN message the grid got carried, in order."""
    return [len(cohort.unpack(m.content)[0]) for m in grid.sent if cohort.is_cohort(m.content)]


def test_clients_go_to_any_worker_only_when_every_worker_keeps_states_on_disk(tmp_path):
    """2 of 3 clients a round on 2 workers: one client each when the states are in partition
    folders (the per-client rows); without a folder a worker keeps its clients' states in its
    context.state, so client p stays on worker p mod 2 (both on worker 0 when 0 and 2 are
    sampled, as in rounds 2 and 3 of seed 1)."""
    kept = {"seed": 1, "client": {"keep_momentum": True}}
    raw = deep_merge(cohort_raw(tiny_raw("fedseal")), kept)
    per_client = rows_of(deep_merge(tiny_raw("fedseal"), kept), 3)
    on_disk = InProcessGrid(2, state_path=str(tmp_path / "client-state"))
    rows, _ = run_method(raw, on_disk)
    assert without_seconds(rows) == per_client
    assert clients_per_message(on_disk) == [1] * 2 * len(rows)
    in_memory = InProcessGrid(2)
    rows, _ = run_method(raw, in_memory)
    assert without_seconds(rows) == per_client
    assert clients_per_message(in_memory) == [1, 1, 2, 2, 1, 1]


def test_a_workers_state_keeps_each_client_under_its_own_prefix():
    worker = RecordDict()
    client_app.keep_client_state(worker, 3, RecordDict({"m": ConfigRecord({"a": 1})}))
    client_app.keep_client_state(worker, 13, RecordDict({"m": ConfigRecord({"a": 2})}))
    assert client_app.client_state(worker, 3)["m"]["a"] == 1
    assert client_app.client_state(worker, 13)["m"]["a"] == 2
    client_app.keep_client_state(worker, 3, RecordDict())
    assert list(worker) == ["c13.m"]


# ----- Partial sums (simulation.partial_sums) ---------------------------------------------
A = {"w": np.array([1.0, 2.0], dtype="float32"), "n": np.array(3, dtype="int64")}
B = {"w": np.array([3.0, 5.0], dtype="float32"), "n": np.array(7, dtype="int64")}
ZERO = {"w": np.zeros(2, dtype="float32"), "n": np.array(0, dtype="int64")}


def test_the_workers_partial_sums_give_fedavgs_mean_and_eq8():
    """(1*1 + 3*3)/4 = 2.5 and (1*2 + 3*5)/4 = 4.25; the counter takes the max. Eq. 8 from
    zero starts: (1 + 4 + 9 + 25) / (4^2 + 7^2) = 39/65 = 0.6."""
    one = partial_sum([0], [A], [1.0], [ZERO], ["w"])
    other = partial_sum([1], [B], [3.0], [ZERO], ["w"])
    assert one.sums["w"].dtype == np.float64 and other.weight == 3.0
    mean = mean_of_partial_sums([one, other], {k: v.dtype for k, v in A.items()})
    assert mean["w"].dtype == np.float32 and mean["w"].tolist() == [2.5, 4.25]
    assert int(mean["n"]) == 7
    for key in A:
        assert np.array_equal(mean[key], weighted_average([A, B], [1.0, 3.0])[key])
    assert diversity_of_partial_sums([one, other]) == pytest.approx(0.6)
    assert diversity_of_partial_sums([one, other]) == pytest.approx(
        weight_diversity([A["w"], B["w"]])
    )
    both = partial_sum([0, 1], [A, B], [1.0, 3.0])
    assert both.sums["w"].tolist() == [10.0, 17.0] and both.update_sum is None


def reply_of(pid: int, arrays: dict, n: int = 5) -> RecordDict:
    return RecordDict(
        {
            "arrays": to_record(arrays),
            "metrics": MetricRecord({"partition-id": pid, "num-examples": n}),
        }
    )


def test_a_worker_sums_only_the_models_that_pass_the_servers_check():
    start = to_record(ZERO)
    messages = {p: RecordDict({"arrays": start}) for p in (0, 1, 2)}
    bad = {**B, "w": np.array([np.nan, 1.0], dtype="float32")}
    replies = {0: reply_of(0, A, n=2), 1: reply_of(1, bad), 2: reply_of(2, B, n=6)}
    returned = client_app.summed(cohort.SumRequest("examples"), messages, replies)
    assert returned is not None and returned.part.pids == [0, 2]
    assert returned.part.weight == 8.0 and returned.part.sums["w"].tolist() == [20.0, 34.0]
    assert "arrays" not in replies[0] and "arrays" in replies[1]  # the server judges client 1
    assert returned.sizes[0] == cohort.array_sizes(reply_of(0, A)["arrays"])
    packed = cohort.pack(replies)
    cohort.attach_sum(packed, returned)
    back = cohort.returned_sum(packed)
    assert back is not None and back.part.pids == [0, 2] and back.sizes == returned.sizes
    assert back.part.sums["w"].tolist() == [20.0, 34.0] and back.part.weight == 8.0
    alone = {0: reply_of(0, A), 1: reply_of(1, bad)}
    assert client_app.summed(cohort.SumRequest("examples"), messages, alone) is None
    assert "arrays" in alone[0]  # a lone model travels as it is (float32, not a float64 sum)


def test_a_rejected_client_takes_its_workers_sum_with_it():
    stats = RoundStats()
    loop = RoundLoop.__new__(RoundLoop)
    loop.sums = [
        cohort.ReturnedSum(partial_sum([0, 2], [A, B], [1.0, 1.0]), {}),
        cohort.ReturnedSum(partial_sum([1], [B], [1.0]), {}),
    ]
    updates = [Update(pid, 5, reply_of(pid, A)) for pid in (0, 1)]  # client 2 was rejected
    kept = loop.drop_spoilt_sums(updates, stats)
    assert [u.pid for u in kept] == [1] and [r.part.pids for r in loop.sums] == [[1]]
    assert stats.rejections == [(0, "summed in its worker with client 2's reply")]


SUMS = {"simulation": {"partial_sums": True}}


@pytest.mark.parametrize(
    "method, extra, sums",
    [
        ("fedavg_fixmatch", SUMS, True),
        ("fedavg_with_server", SUMS, True),
        ("fedavg_fixmatch", {}, False),
        ("fedavg_fixmatch", deep_merge(SUMS, {"aggregate": {"rule": "median"}}), False),
        ("fedrgd", SUMS, False),
    ],
)
def test_cohorts_return_sums_where_the_mean_allows_and_the_rows_stay(
    monkeypatch, method, extra, sums
):
    """Rows of a cohort run with partial sums (off by default) equal the per-client run's,
    bytes and eq. 8's diversity included, to float rounding (1e-9) in these four tiny rounds;
    a worker with one client sends its model."""
    attached: list[int] = []
    real = cohort.attach_sum
    monkeypatch.setattr(
        cohort, "attach_sum", lambda c, r: attached.append(len(r.part.pids)) or real(c, r)
    )
    every_client = {"federation": {"clients_per_round": 0}}  # worker 0 trains clients 0, 2
    raw = deep_merge(deep_merge(tiny_raw(method), every_client), extra)
    rows = rows_of(cohort_raw(raw), 2)
    assert bool(attached) == sums
    expected = rows_of(raw, 3)
    assert [sorted(r) for r in rows] == [sorted(r) for r in expected]
    for row, want in zip(rows, expected):
        for key, value in want.items():
            if isinstance(value, float):
                assert row[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
            else:
                assert row[key] == value, key


# ----- Settings and the simulation's nodes -----------------------------------------------
def test_workers_default_to_one_per_cpu_share_and_never_exceed_the_clients():
    raw = {"method": "fedavg_fixmatch", "simulation": {"execution": "cohort"}}
    settings = settings_of(resolve_config(raw))
    assert cohort_workers(settings, gpus=0, cpus=2) == 2
    assert cohort_workers(settings, gpus=0, cpus=64) == settings.split.num_clients
    assert cohort_workers(settings, gpus=1, cpus=16) == 2  # two per GPU
    cpu = settings_of(resolve_config({**raw, "device": "cpu"}))
    assert cohort_workers(cpu, gpus=1, cpus=16) == 10  # device cpu: the CPUs count
    assert "num-supernodes=2 " in federation_config(
        settings_of(resolve_config({**raw, "simulation": {"execution": "cohort", "workers": 2}})),
        0.0,
    )


def test_a_bad_execution_is_one_line():
    with pytest.raises(ConfigError, match=r"simulation\.execution"):
        resolve_config({"simulation": {"execution": "batched"}})


# ----- Cohort runs equal per-client runs ------------------------------------------------
@pytest.mark.parametrize("method", everyday_first(sorted(METHODS), keep=2))
def test_a_cohort_run_gives_every_methods_per_client_rows(method):
    """Four rounds, 2 of 3 clients a round, each method's cross-round state (kept momentum,
    FedSEAL's self-ensemble, FedMatch's helpers, FedoSSL's FedRep heads): every row equal,
    bytes included (they count each client's records, not the cohort's message)."""
    raw = tiny_raw(method)
    assert rows_of(cohort_raw(raw), 2) == rows_of(raw, 3)


def test_attackers_and_a_streaming_split_keep_their_rows_in_a_cohort():
    raw = deep_merge(
        tiny_raw("fedseal"),
        {
            "federation": {"attack": {"kind": "sign_flip", "partitions": [1]}},
            "split": {"stream_steps": 2},
        },
    )
    per_client = rows_of(raw, 3)
    assert any(row.get("attackers") == [1] for row in per_client)
    assert rows_of(cohort_raw(raw), 2) == per_client


def test_a_failing_client_fails_alone_and_its_cohort_goes_on(monkeypatch):
    raw = cohort_raw(tiny_raw("fedavg_fixmatch"))
    real = client_app.train_client

    def flaky(content, context, state, pid, data_path="", background=False):
        if pid == 2:
            raise RuntimeError("injected failure of client 2")
        return real(content, context, state, pid, data_path, background)

    monkeypatch.setattr(client_app, "train_client", flaky)
    rows, _ = run_method(raw, InProcessGrid(2))
    sampled_two = [r for r in rows if 2 in r.get("failed_partitions", [])]
    assert sampled_two, "client 2 was never sampled"
    for row in sampled_two:
        assert row["failures"] == 1 and row["clients"] == 1  # worker 0's other client kept


def test_a_failed_worker_fails_each_of_its_clients():
    raw = cohort_raw(tiny_raw("fedavg_fixmatch"))
    rows, _ = run_method(raw, InProcessGrid(2, fail_partitions=[0]))  # worker 0: clients 0, 2
    for row in rows:
        assert set(row.get("failed_partitions", [])) <= {0, 2}
        assert row["clients"] + row["failures"] == 2


def test_a_resumed_cohort_run_keeps_its_clients_state(tmp_path):
    """FedSEAL with kept momentum: each client's self-ensemble and momentum come back from
    its own partition folder after a kill, though a worker holds several clients."""
    raw = cohort_raw(tiny_raw("fedseal"))
    straight = run_rounds(raw, tmp_path / "straight", snapshot=tmp_path / "killed", nodes=2)
    resumed = run_rounds(raw, tmp_path / "killed", resume=True, nodes=2)
    assert without_seconds(resumed) == without_seconds(straight)
    assert without_seconds(straight) == rows_of(tiny_raw("fedseal"), 3)


def test_with_a_state_folder_a_workers_context_carries_no_clients_state(tmp_path):
    """The worker's context.state travels with each of its messages: its clients' states
    (FedSEAL's self-ensemble and kept momentum) come from their partition files instead,
    with the rows of a per-client run."""
    raw = deep_merge(cohort_raw(tiny_raw("fedseal")), {"client": {"keep_momentum": True}})
    grid = InProcessGrid(2, state_path=str(tmp_path / "client-state"))
    rows, _ = run_method(raw, grid)
    per_client = deep_merge(tiny_raw("fedseal"), {"client": {"keep_momentum": True}})
    assert without_seconds(rows) == rows_of(per_client, 3)
    assert [len(c.state) for c in grid.contexts.values()] == [0, 0]
    kept = sorted(p.parent.name for p in (tmp_path / "client-state").glob("partition-*/round-*"))
    assert set(kept) == {"partition-0", "partition-1", "partition-2"}


def test_kept_states_come_from_memory_and_a_client_whose_state_file_fails_fails_alone(
    tmp_path, monkeypatch
):
    """A worker restores its clients' states from memory (no file decoded after round 1 of
    each client, the per-client run's rows), and a client whose state file cannot be written
    fails alone: its reply would claim a state that is not on disk."""
    raw = deep_merge(cohort_raw(tiny_raw("fedseal")), {"client": {"keep_momentum": True}})
    per_client = deep_merge(tiny_raw("fedseal"), {"client": {"keep_momentum": True}})
    decoded = []
    real_read = state_module.read_state
    monkeypatch.setattr(state_module, "read_state", lambda p: decoded.append(p) or real_read(p))
    grid = InProcessGrid(2, state_path=str(tmp_path / "kept"))
    rows, _ = run_method(raw, grid)
    assert without_seconds(rows) == rows_of(per_client, 3)
    assert decoded == []

    real_write = state_module.write_state_file

    def disk_full(chunks, folder, server_round):
        if folder.name == "partition-2":
            raise OSError(28, "No space left on device")
        real_write(chunks, folder, server_round)

    monkeypatch.setattr(state_module, "write_state_file", disk_full)
    rows, _ = run_method(raw, InProcessGrid(2, state_path=str(tmp_path / "full")))
    sampled_two = [r for r in rows if 2 in r.get("failed_partitions", [])]
    assert sampled_two, "client 2 was never sampled"
    for row in sampled_two:
        assert row["failures"] == 1 and row["clients"] == 1
    assert not list((tmp_path / "full" / "partition-2").glob("round-*"))


def test_a_local_deployment_refuses_cohort_execution_in_one_line(tmp_path):
    from ssfl.deploy import run_deployment

    settings = settings_of(resolve_config(cohort_raw({"method": "fedavg_fixmatch"})))
    with pytest.raises(ConfigError, match=r"simulation\.execution': cohort is for simulation"):
        run_deployment(settings, tmp_path / "out")
    assert not (tmp_path / "out").exists()

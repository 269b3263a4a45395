"""The reliability issue's rules 2 (update validation) and 3 (runs that cannot progress stop)."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping

import numpy as np
import pytest
import torch
import yaml
from flwr.app import Array, ArrayRecord, Error, Message, MessageType, MetricRecord, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode

import ssfl.runner
from ssfl.cli import main
from ssfl.experiment import resolve_config, reusable
from ssfl.records import record_arrays
from ssfl.registry import settings_of
from ssfl.runner import RunFailed, submit_run
from strategies.loop import RunStalled
from strategies.messaging import failure_cause
from tasks.config import ConfigError
from tasks.results import Recorder, markdown_table
from tests.harness import InProcessGrid, build_strategy, run_method, tiny_raw

Tamper = Callable[[dict[str, np.ndarray], dict], None]


class TamperGrid(InProcessGrid):
    """Chosen partitions train honestly, then their reply is altered before it is sent."""

    def __init__(self, num_nodes: int, tamper: Mapping[int, Tamper], **kwargs):
        super().__init__(num_nodes, **kwargs)
        self.tamper = dict(tamper)

    def handle(self, msg: Message) -> Message:
        reply = super().handle(msg)
        pid = self.partition[msg.metadata.dst_node_id]
        if msg.metadata.message_type != MessageType.TRAIN or pid not in self.tamper:
            return reply
        arrays = {k: v.copy() for k, v in record_arrays(reply.content["arrays"]).items()}
        metrics = dict(reply.content["metrics"].items())
        self.tamper[pid](arrays, metrics)
        record = ArrayRecord(array_dict={k: Array(v) for k, v in arrays.items()})  # 0-d kept
        content = RecordDict({"arrays": record, "metrics": MetricRecord(metrics)})
        return Message(content=content, reply_to=msg)


class FlakyGrid(InProcessGrid):
    """Every partition fails in the chosen training rounds (1, 2, ...), none in the others."""

    def __init__(self, num_nodes: int, failing_rounds: Iterable[int]):
        super().__init__(num_nodes)
        self.failing_rounds, self.round = set(failing_rounds), 0

    def send_and_receive(self, messages, timeout=None):
        messages = list(messages)
        if messages and messages[0].metadata.message_type == MessageType.TRAIN:
            self.round += 1
            self.fail = set(self.partition.values()) if self.round in self.failing_rounds else set()
        return super().send_and_receive(messages, timeout)


class DeadNodeGrid(InProcessGrid):
    """Messages get ids as Flower's grids give them; a dead partition's reply is the error
    the SuperLink makes in its place (from the SuperLink's node id, NODE_UNAVAILABLE)."""

    def __init__(self, num_nodes: int, dead: int):
        super().__init__(num_nodes)
        self.dead, self.count = dead, 0

    def send_and_receive(self, messages, timeout=None):
        messages = list(messages)
        for msg in messages:
            self.count += 1
            msg.metadata.__dict__["_message_id"] = f"message-{self.count}"
        return super().send_and_receive(messages, timeout)

    def handle(self, msg: Message) -> Message:
        if (
            msg.metadata.message_type != MessageType.TRAIN
            or self.partition[msg.metadata.dst_node_id] != self.dead
        ):
            return super().handle(msg)
        reply = Message(Error(code=ErrorCode.NODE_UNAVAILABLE, reason="node offline"), reply_to=msg)
        reply.metadata.__dict__["_src_node_id"] = SUPERLINK_NODE_ID
        return reply


def first_float(arrays: dict[str, np.ndarray]) -> str:
    return next(k for k, v in arrays.items() if v.dtype == np.float32 and v.size)


def set_first(value: float, key: Callable[[dict], str] = first_float) -> Tamper:
    def tamper(arrays: dict, metrics: dict) -> None:
        arrays[key(arrays)].flat[0] = value

    return tamper


def drop_last_key(arrays: dict, metrics: dict) -> None:
    del arrays[list(arrays)[-1]]


def flatten_first(arrays: dict, metrics: dict) -> None:
    key = first_float(arrays)
    arrays[key] = arrays[key].reshape(-1)


def as_float64(arrays: dict, metrics: dict) -> None:
    key = first_float(arrays)
    arrays[key] = arrays[key].astype(np.float64)


def set_metric(name: str, value: int) -> Tamper:
    def tamper(arrays: dict, metrics: dict) -> None:
        metrics[name] = value

    return tamper


# partition -> (tamper, what its reason names); partitions 0 and 8 stay honest.
DENSE_TAMPERS: dict[int, tuple[Tamper, str]] = {
    1: (set_first(np.nan), "non-finite"),
    2: (set_first(np.inf), "non-finite"),
    3: (drop_last_key, "missing"),
    4: (flatten_first, "shape"),
    5: (as_float64, "dtype float64"),
    6: (set_metric("num-examples", 10**9), "num-examples 1000000000 outside [1, 100]"),
    7: (set_metric("partition-id", 0), "partition-id 0, but its node holds partition 7"),
}


def payload_key(arrays: dict) -> str:
    """The values of the uploaded psi payload (sparse or dense)."""
    return next(k for k in ("psi.val", "psi.dense") if k in arrays)


def index_out_of_range(arrays: dict, metrics: dict) -> None:
    for key in [k for k in arrays if k.startswith("psi.")]:
        del arrays[key]
    arrays["psi.idx"] = np.array([10**9 - 1], dtype=np.uint32)
    arrays["psi.val"] = np.zeros(1, dtype=np.float32)


def drop_payload(arrays: dict, metrics: dict) -> None:
    del arrays[payload_key(arrays)]


def first_buffer(arrays: dict) -> str:
    return next(k for k, v in arrays.items() if k.startswith("buffer.") and v.dtype == np.float32)


FEDMATCH_TAMPERS: dict[int, tuple[Tamper, str]] = {
    1: (index_out_of_range, "does not decode"),
    2: (set_first(np.nan, payload_key), "decodes to non-finite values"),
    3: (drop_payload, "does not decode"),
    4: (set_first(np.inf, first_buffer), "holds non-finite values"),
}


def global_state(strategy) -> dict[str, torch.Tensor]:
    return strategy.server.model.state_dict()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("method", "tampers", "split"),
    [
        ("fedavg_fixmatch", DENSE_TAMPERS, {"num_clients": 9, "client_size": 100}),
        ("fedmatch", FEDMATCH_TAMPERS, {"num_clients": 5, "client_size": 100}),
    ],
)
def test_tampered_replies_are_rejected_and_the_model_is_the_honest_replies(
    synthetic_raw, method, tampers, split
):
    raw = {**synthetic_raw, "method": method, "split": {**synthetic_raw["split"], **split}}
    n = split["num_clients"]
    grid = TamperGrid(n, {pid: tamper for pid, (tamper, _) in tampers.items()})
    rows, tampered = run_method(raw, grid)
    honest_rows, honest = run_method(raw, InProcessGrid(n, fail_partitions=list(tampers)))
    for row in rows:
        assert row["rejected"] == len(tampers) and row["rejected_partitions"] == sorted(tampers)
        assert row["clients"] == n - len(tampers) and row["failures"] == 0
        for pid, reason in zip(row["rejected_partitions"], row["rejected_reasons"]):
            assert tampers[pid][1] in reason, (pid, reason)
    assert all(r["rejected"] == 0 and "rejected_reasons" not in r for r in honest_rows)
    assert [r["test_accuracy"] for r in rows] == [r["test_accuracy"] for r in honest_rows]
    expected = global_state(honest)
    assert all(torch.equal(v, expected[k]) for k, v in global_state(tampered).items())


def test_a_node_with_its_own_folder_is_bounded_by_the_documented_constant(synthetic_raw):
    from strategies.loop import OWN_DATA_MAX_EXAMPLES

    strategy = build_strategy(synthetic_raw)
    strategy.own_data = {1}
    assert strategy.max_examples(0) == 200 and strategy.max_examples(1) == OWN_DATA_MAX_EXAMPLES
    assert strategy.max_examples(3) == 0  # not a partition of the split


@pytest.mark.parametrize(
    ("grid", "needle"),
    [
        (InProcessGrid(3, fail_partitions=[0, 1, 2]), "injected failure of partition 2"),
        (
            TamperGrid(3, {p: set_metric("num-examples", 0) for p in range(3)}),
            "partition 2: rejected, num-examples 0 outside [1, 200]",
        ),
    ],
)
def test_a_run_without_accepted_updates_stops_after_max_failed_rounds(synthetic_raw, grid, needle):
    raw = {**synthetic_raw, "rounds": 5, "federation": {"max_failed_rounds": 2}}
    rows: list[dict] = []
    strategy = build_strategy(raw, rows.append)
    with pytest.raises(RunStalled) as err:
        strategy.start(grid, num_rounds=5)
    assert [r["round"] for r in rows] == [1, 2] and all(r["clients"] == 0 for r in rows)
    message = str(err.value)
    assert "\n" not in message and needle in message
    assert message.startswith("no client update accepted in 2 rounds in a row (rounds 1-2")


def test_the_default_is_three_rounds(synthetic_raw):
    rows: list[dict] = []
    strategy = build_strategy({**synthetic_raw, "rounds": 4}, rows.append)
    with pytest.raises(RunStalled, match="3 rounds in a row"):
        strategy.start(InProcessGrid(3, fail_partitions=[0, 1, 2]), num_rounds=4)
    assert len(rows) == 3 and all(r["failed_partitions"] == [0, 1, 2] for r in rows)


@pytest.mark.parametrize(("failing", "stalls"), [({1, 3}, False), ({2, 3}, True)])
def test_only_failures_in_a_row_stop_the_run(synthetic_raw, failing, stalls):
    raw = {**synthetic_raw, "rounds": 4, "federation": {"max_failed_rounds": 2}}
    rows: list[dict] = []
    strategy = build_strategy(raw, rows.append)
    grid = FlakyGrid(3, failing)
    if stalls:
        with pytest.raises(RunStalled, match=r"rounds 2-3"):
            strategy.start(grid, num_rounds=4)
    else:
        strategy.start(grid, num_rounds=4)
    expected = [0 if r in failing else 3 for r in range(1, 4 if stalls else 5)]
    assert [r["clients"] for r in rows] == expected


def test_max_failed_rounds_is_an_integer_of_at_least_one():
    assert resolve_config({})["federation"]["max_failed_rounds"] == 3
    for bad in (0, 1.5):
        with pytest.raises(ConfigError) as err:
            resolve_config({"federation": {"max_failed_rounds": bad}})
        assert "\n" not in str(err.value) and "federation.max_failed_rounds" in str(err.value)


def test_results_record_the_status(tmp_path):
    cfg = resolve_config({})
    row = {"round": 1, "test_accuracy": 0.5, "test_loss": 1.0, "seconds": 0.1}
    done = Recorder(tmp_path / "done", settings_of(cfg), {})
    done.add_round(row)
    assert done.finish()["status"] == "completed" and "failure" not in done.results()
    failed = Recorder(tmp_path / "failed", settings_of(cfg), {})
    failed.add_round(row)
    failed.finish(failure="no client update accepted")
    written = json.loads((tmp_path / "failed" / "results.json").read_text())
    assert written["status"] == "failed" and written["failure"] == "no client update accepted"
    assert len(written["rounds"]) == 1
    assert not reusable(written, settings_of(cfg)) and reusable(done.results(), settings_of(cfg))


def test_results_record_what_the_cpu_numbers_depend_on(tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        done = Recorder(tmp_path, settings_of(resolve_config({})), {})
        done.add_round({"round": 1, "test_accuracy": 0.5, "test_loss": 1.0, "seconds": 0.1})
        written = json.loads(json.dumps(done.finish()["host"]))
    finally:
        torch.set_num_threads(threads)
    assert written["threads"] == 1 and written["torch"] == torch.__version__
    assert written["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert isinstance(written["cpu"], str) and written["cpu"]
    assert written["numpy"] == np.__version__ and {"kornia", "flwr"} <= written.keys()


def test_results_record_the_code_version_the_run_was_launched_from(tmp_path):
    known = Recorder(tmp_path / "known", settings_of(resolve_config({})), {})
    known.code_version = "0123456789ab+dirty"  # the ServerApp's, from run-config code-version
    known.add_round({"round": 1, "test_accuracy": 0.5, "test_loss": 1.0, "seconds": 0.1})
    known.finish()
    written = json.loads((tmp_path / "known" / "results.json").read_text())
    assert written["code_version"] == "0123456789ab+dirty"
    unknown = Recorder(tmp_path / "unknown", settings_of(resolve_config({})), {})
    unknown.add_round({"round": 1, "test_accuracy": 0.5, "test_loss": 1.0, "seconds": 0.1})
    assert unknown.finish()["code_version"] is None  # a deployed app launched without git


def test_same_seed_same_threads_same_weights():
    from benchmarks.float_order import trained_weights

    first, again = trained_weights(3), trained_weights(3)
    assert first.shape == again.shape and first.ndim == 1 and torch.equal(first, again)
    assert not torch.equal(first, trained_weights(2))


FAILURE = "no client update accepted in 3 rounds in a row (rounds 1-3); round 3: partition 0: x"


def fake_flower(monkeypatch, write: dict | None, status: str) -> None:
    """flwr run writes ``write`` as results.json (None: nothing) and ends as ``status``."""

    def run_logged(cmd, env, log_path, echo, watch=None, done=None):
        out = log_path.parent
        if write is not None:
            (out / "results.json").write_text(json.dumps(write))
        return "Successfully started run 7\n"

    monkeypatch.setattr(ssfl.runner, "_run_logged", run_logged)
    monkeypatch.setattr(ssfl.runner, "run_status", lambda env, link, run_id: status)


def test_runner_raises_the_recorded_failure(tmp_path, monkeypatch):
    fake_flower(monkeypatch, {"status": "failed", "failure": FAILURE}, "finished:failed")
    with pytest.raises(RunFailed) as err:
        submit_run("local", {}, tmp_path / "exp.yaml", tmp_path)
    assert str(err.value) == FAILURE


def test_runner_ignores_a_previous_runs_results(tmp_path, monkeypatch):
    (tmp_path / "results.json").write_text(json.dumps({"status": "completed"}))
    fake_flower(monkeypatch, None, "finished:failed")
    with pytest.raises(RunFailed, match="ended as finished:failed"):
        submit_run("local", {}, tmp_path / "exp.yaml", tmp_path)


def test_cli_run_that_stalls_exits_1_with_one_line(tmp_path, monkeypatch, capsys, synthetic_raw):
    experiment = tmp_path / "exp.yaml"
    experiment.write_text(yaml.safe_dump(synthetic_raw))
    monkeypatch.setattr(ssfl.runner.LocalSuperLink, "launch", lambda self: None)
    monkeypatch.setattr(ssfl.runner.LocalSuperLink, "wait_ready", lambda self: None)
    fake_flower(monkeypatch, {"status": "failed", "failure": FAILURE}, "finished:failed")
    code = main(["run", str(experiment), "--out", str(tmp_path / "out"), "--quiet"])
    assert code == 1
    assert capsys.readouterr().err.splitlines()[-1] == f"ssfl: run failed: {FAILURE}"


def test_a_dead_nodes_failure_counts_for_its_partition():
    raw = {**tiny_raw("fedavg_fixmatch"), "rounds": 1, "federation": {"clients_per_round": 0}}
    rows, _ = run_method(raw, DeadNodeGrid(3, dead=2))
    assert [(r["failures"], r["failed_partitions"], r["clients"]) for r in rows] == [(1, [2], 2)]


def test_a_failed_clients_reason_is_cut_to_its_cause():
    relayed = (
        "<class 'ray.exceptions.RayTaskError(ClientAppException)'>:<'ray::ClientAppActor.run()\n"
        '  File "client_app/base.py", line 216, in optimizer\n'
        '    raise ValueError(f"Invalid learning rate: {lr}")\n'
        "ValueError: Invalid learning rate: -1.0\n\n"
        "The above exception was the direct cause of the following exception:\n\n"
        "flwr.clientapp.client_app.ClientAppException: \n"
        "Exception ClientAppException occurred. Message: Invalid learning rate: -1.0'>"
    )
    assert failure_cause(relayed) == "ValueError: Invalid learning rate: -1.0"
    assert failure_cause("RuntimeError: injected") == "RuntimeError: injected"
    deployed = "<class 'tasks.config.ConfigError'>:<'data-path '/n0': cannot read x.png (bad)'>"
    assert failure_cause(deployed) == "ConfigError: data-path '/n0': cannot read x.png (bad)"
    assert failure_cause("the node went away\nfor good") == "the node went away for good"


def test_a_refused_config_starts_no_superlink(tmp_path, monkeypatch, capsys):
    links = []
    booting = ssfl.runner.LocalSuperLink.booting.__func__

    def kept(cls):
        links.append(booting(cls))
        return links[-1]

    monkeypatch.setattr(ssfl.runner.LocalSuperLink, "booting", classmethod(kept))
    experiment = tmp_path / "exp.yaml"
    experiment.write_text(yaml.safe_dump({"method": "server_sl", "client": {"lr": -1}}))
    assert main(["run", str(experiment), "--out", str(tmp_path / "out")]) == 2
    assert "client.lr" in capsys.readouterr().err
    assert links == []  # refused before any process starts


def test_ssfl_run_stops_its_superlink_whatever_the_runner_does(
    tmp_path, monkeypatch, synthetic_raw
):
    links = []
    booting = ssfl.runner.LocalSuperLink.booting.__func__

    def kept(cls):
        links.append(booting(cls))
        return links[-1]

    def runner_that_fails_before_using_the_link(*args, **kwargs):
        raise RunFailed("flwr run could not start")

    monkeypatch.setattr(ssfl.runner.LocalSuperLink, "booting", classmethod(kept))
    monkeypatch.setattr(ssfl.runner, "run_simulation", runner_that_fails_before_using_the_link)
    experiment = tmp_path / "exp.yaml"
    experiment.write_text(yaml.safe_dump(synthetic_raw))
    assert main(["run", str(experiment), "--out", str(tmp_path / "out"), "--quiet"]) == 1
    (link,) = links
    assert link.process.poll() is not None and not link.home.exists()
    assert link.ray.process.poll() is not None  # the run's Ray cluster stopped too


def test_the_runner_names_the_checkpoint_files_as_the_checkpoint_module():
    from tasks import checkpoint

    assert ssfl.runner.CHECKPOINT_FILE == checkpoint.CHECKPOINT_FILE
    assert ssfl.runner.CLIENT_STATE_DIR == checkpoint.CLIENT_STATE_DIR


def test_the_stream_is_left_once_the_results_are_written(tmp_path):
    """flwr run --stream only streams the teardown after results.json: not waited for."""
    written = tmp_path / "results.json"
    child = f"import time; open({str(written)!r}, 'w'); print('streaming', flush=True); "
    cmd = [sys.executable, "-c", child + "time.sleep(60)"]
    started = time.monotonic()
    output = ssfl.runner._run_logged(
        cmd, dict(os.environ), tmp_path / "flower.log", echo=False, done=written.is_file
    )
    assert time.monotonic() - started < 30
    assert output == "streaming\n"


def test_results_and_the_compare_table_give_both_evaluation_points(tmp_path):
    recorder = Recorder(tmp_path, settings_of(resolve_config({})), {})
    row = {"round": 1, "test_accuracy": 0.8, "test_loss": 0.5, "seconds": 1.0}
    recorder.add_round({**row, "aggregate_accuracy": 0.7})
    stepped = recorder.results()
    assert stepped["final_aggregate_accuracy"] == 0.7 and stepped["final_test_accuracy"] == 0.8
    plain = {k: v for k, v in stepped.items() if k != "final_aggregate_accuracy"}
    table = markdown_table([stepped, plain]).splitlines()
    assert "| final acc | before server step | best acc |" in table[0]
    assert "| 0.8000 | 0.7000 | 0.8000 |" in table[2] and "| 0.8000 | - | 0.8000 |" in table[3]

"""benchmarks/round_profile.py: every second of a round attributed once, every pass replayed."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from ssfl.experiment import resolve_config
from ssfl.registry import settings_of
from tests.conftest import ROOT
from tests.harness import tiny_raw


@pytest.fixture(scope="module")
def profile():
    spec = importlib.util.spec_from_file_location(
        "round_profile", ROOT / "benchmarks/round_profile.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["round_profile"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_a_profiled_round_attributes_its_wall_time_once_and_records_each_clients_passes(
    profile, synthetic_raw
):
    split = {**synthetic_raw["split"], "client_size": 100}
    cfg = resolve_config({**synthetic_raw, "rounds": 1, "split": split})
    traces, models = profile.profiled_rounds(settings_of(cfg))
    assert len(traces) == 1
    for trace in traces:
        attributed = sum(trace.seconds.values())
        assert attributed == pytest.approx(trace.wall, rel=0.02, abs=0.01)
        assert sorted(trace.client_passes) == [0, 1, 2]
        for passes in trace.client_passes.values():
            kinds = [kind for kind, _ in passes]
            assert kinds.count("step") >= 1 and kinds.count("bwd") == kinds.count("step")
            assert kinds[0] == "fwd"
        server_forwards = [arg for kind, arg in trace.server_passes if kind == "fwd"]
        assert any(not grad for _, _, grad in server_forwards)  # evaluation
        assert trace.seconds[("clients", "forward")] > 0
        assert trace.seconds[("clients", "augmentation")] > 0
        assert trace.seconds[("evaluation", "forward")] > 0
    table = profile.phase_table(traces)
    assert set(table) <= set(profile.PHASES) and "clients" in table
    assert profile.replay(traces[-1].client_passes[0], models) > 0


def test_the_replay_survives_a_block_that_changes_its_input_in_place(profile):
    from torch import nn

    block = nn.Sequential(nn.ReLU(inplace=True), nn.Conv2d(4, 4, 3, padding=1))
    models = {"Sequential:148": block}
    fwd = ("fwd", ("Sequential:148", (2, 4, 8, 8), True))
    # the SSL halves run the encoder block by block: two blocks of one shape, one backward
    assert profile.replay([fwd, fwd, ("bwd", None), ("step", 0.1)], models) > 0


def test_the_steady_round_is_the_median_after_round_one(profile):
    assert profile.steady([9.0, 2.0, 4.0, 3.0]) == 3.0
    assert profile.steady([5.0]) == 5.0


def test_start_up_stages_add_up_and_leave_the_bootstrap_out(profile):
    marks = {
        "cli_ready": 102.0,
        "run_submitted": 105.0,
        "server_main": 109.0,
        "server_built": 110.5,
        "nodes_found": 114.0,
        "first_round": 120.0,
        "finished": 150.0,
    }
    stages = profile.startup_stages(100.0, marks, 151.0)
    assert stages == {
        "cli_s": 2.0,
        "superlink_and_submit_s": 3.0,
        "serverapp_launch_s": 4.0,
        "server_setup_s": 1.5,
        "node_discovery_s": 3.5,
        "bootstrap_s": 6.0,
        "to_first_round_s": 14.0,
        "shutdown_s": 1.0,
    }
    unseen = profile.startup_stages(
        100.0, {k: v for k, v in marks.items() if k != "cli_ready"}, 151.0
    )
    assert unseen["cli_s"] == 0.0 and unseen["superlink_and_submit_s"] == 5.0


def test_the_bare_loop_replays_the_median_steady_round(profile):
    traces = [profile.RoundTrace(wall=w) for w in (9.0, 1.0, 5.0, 1.2, 1.1)]
    assert profile.median_trace(traces).wall == 1.1
    assert profile.median_trace(traces[:1]).wall == 9.0


def test_the_clients_replay_counts_the_slowest_lane_and_reports_a_failed_one(profile):
    from torch import nn

    models = {"Linear:12": nn.Linear(3, 3)}
    fwd = ("fwd", ("Linear:12", (4, 3), True))
    trace = profile.RoundTrace()
    trace.client_passes[0] = [fwd, ("bwd", None), ("step", 0.1)]
    trace.client_passes[1] = [fwd, ("bwd", None), ("step", 0.1)] * 50
    trace.server_passes = [("fwd", ("Linear:12", (4, 3), False))]
    bare = profile.bare_round(trace, models, workers=2, server_threads=1)
    assert 0 < bare["clients"] < 1.0 and bare["total"] == bare["clients"] + bare["server"]
    trace.client_passes[1] = [("fwd", ("Missing:0", (4, 3), True))]
    with pytest.raises(RuntimeError, match="a replay lane failed"):
        profile.bare_round(trace, models, workers=2, server_threads=1)


def test_an_earlier_ssfl_run_part_is_reused_only_for_the_same_run(profile, tmp_path):
    path = tmp_path / "earlier.json"
    report = {"experiment": "e.yaml", "rounds": 3, "sets": ["a=1"], "flower": {"wall_s": 5.0}}
    path.write_text(json.dumps(report))
    assert profile.earlier_flower(path, "e.yaml", 3, ["a=1"]) == {"wall_s": 5.0}
    with pytest.raises(SystemExit, match="profiled"):
        profile.earlier_flower(path, "e.yaml", 4, ["a=1"])


def test_startup_only_runs_the_ssfl_run_part_alone_and_writes_its_stages(
    profile, tmp_path, monkeypatch, capsys
):
    stages = {"cli_s": 1.5, "node_discovery_s": 5.25, "to_first_round_s": 9.0}
    calls = []

    def fake_flower_run(experiment, rounds, sets):
        calls.append((experiment, rounds, sets))
        return {"startup": stages, "wall_s": 20.0}

    monkeypatch.setattr(profile, "flower_run", fake_flower_run)
    out = tmp_path / "startup.json"
    profile.startup_report("e.yaml", 1, ["eval.every=100"], out)
    assert calls == [("e.yaml", 1, ["eval.every=100"])]
    assert capsys.readouterr().out == (
        "start-up: cli 1.5 s, node_discovery 5.2 s, to_first_round 9.0 s\n"
    )
    report = json.loads(out.read_text())
    assert report["flower"]["startup"] == stages and report["sets"] == ["eval.every=100"]


def test_start_up_cpu_sums_each_process_at_its_last_sample_before_the_mark(profile):
    sampler = profile.CpuSampler(root=1)
    sampler.samples = [
        (10.0, {1: ("ssfl CLI", 0.5), 2: ("SuperLink", 0.25)}),
        (11.0, {1: ("ssfl CLI", 1.5), 3: ("client actors", 1.0)}),  # 2 has exited
        (12.0, {1: ("ssfl CLI", 9.0), 3: ("client actors", 9.0), 4: ("client actors", 9.0)}),
    ]
    cpu = sampler.cpu_until(11.5, since=9.5)
    assert cpu["by_kind"] == {"ssfl CLI": 1.5, "client actors": 1.0, "SuperLink": 0.25}
    assert cpu["cpu_s"] == 2.75 and cpu["cores_busy"] == pytest.approx(2.75 / 2.0)


def test_steady_cpu_counts_only_what_each_process_used_inside_the_steady_rounds(profile):
    sampler = profile.CpuSampler(root=1)
    sampler.samples = [
        (10.0, {1: ("SuperLink", 2.0), 2: ("client actors", 5.0)}),
        (12.0, {1: ("SuperLink", 2.5), 2: ("client actors", 6.0)}),
        (14.0, {1: ("SuperLink", 2.75), 2: ("client actors", 8.0), 3: ("client actors", 0.5)}),
        (16.0, {1: ("SuperLink", 9.0)}),  # after the last round: not counted
    ]
    marks = {"first_round_ended": 11.0, "rounds_ended": 15.0}
    cpu = profile.steady_cpu(sampler, marks, rounds=3)
    # From the samples at 10.0 to those at 14.0; process 3 started in between.
    assert cpu["by_kind"] == {"client actors": 3.5, "SuperLink": 0.75}
    assert cpu["cpu_s"] == 4.25 and cpu["cores_busy"] == pytest.approx(4.25 / 4.0)
    assert cpu["per_round_by_kind"] == {"client actors": 1.75, "SuperLink": 0.375}
    assert profile.steady_cpu(sampler, marks, rounds=1) is None
    assert profile.steady_cpu(sampler, {"rounds_ended": 15.0}, rounds=3) is None


def test_the_run_processes_are_told_apart_by_their_command_lines(profile):
    assert profile.process_kind("python -m ssfl.cli run e.yaml") == "ssfl CLI"
    assert profile.process_kind("/x/ray/_private/log_monitor.py --s") == "Ray log monitor"
    assert profile.process_kind("/x/ray/autoscaler/_private/monitor.py") == (
        "Ray autoscaler monitor"
    )
    assert profile.process_kind("ray::ClientAppActor.run") == "client actors"
    assert profile.process_kind("bash") == "other"


def test_a_sampled_process_gives_its_kind_and_cpu_while_alive(profile):
    child = subprocess.Popen([sys.executable, "-c", "sum(range(10**7))"])
    child.wait()
    kind, cpu = profile.process_cpu(os.getpid())
    assert kind == "other" and cpu > 0  # this test session has used CPU
    assert profile.process_cpu(child.pid) is None  # gone: nothing to sample


def test_the_start_up_line_names_the_cpu_it_used_when_sampled(profile):
    flower = {
        "startup": {"cli_s": 1.5},
        "startup_cpu": {"cpu_s": 3.0, "cores_busy": 1.5, "by_kind": {"SuperLink": 3.0}},
    }
    second = profile.startup_line(flower).splitlines()[1]
    assert second.startswith("start-up CPU: 3.0 s (1.50 cores busy on average of ")
    assert second.endswith("): SuperLink 3.0")


def test_both_engines_augmenters_count_as_augmentation(profile):
    from tasks import augment, augment_batched

    for cls in (
        augment.StrongAugment,
        augment.OfficialRandAugment,
        augment_batched.BatchedStrongAugment,
        augment_batched.BatchedOfficialRandAugment,
        augment_batched.BatchedWeakAugment,
    ):
        assert cls in profile.AUGMENTERS, cls


def test_a_method_whose_server_does_not_train_is_profiled(profile):
    """FedoSSL's server has no training step to time (it refines centroids when it
    aggregates): its rounds are profiled all the same."""
    cfg = resolve_config({**tiny_raw("fedossl"), "rounds": 1})
    traces, _ = profile.profiled_rounds(settings_of(cfg))
    assert len(traces) == 1 and traces[0].client_passes
    assert ("server training", "forward") not in traces[0].seconds

"""What ``ssfl run`` hands Flower's simulation and keeps of its output."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from ssfl import ray_head
from ssfl.experiment import resolve_config
from ssfl.progress import strip_ansi
from ssfl.registry import settings_of
from ssfl.runner import (
    SIZE_WARNING,
    LocalSuperLink,
    RayHead,
    RunFailed,
    _copy_lines,
    code_version,
    descendants,
    federation_config,
    flwr_env,
    free_port,
    run_config_arg,
    wait_until,
)
from tests.conftest import ROOT
from tests.harness import alive


def test_federation_config_runs_one_supernode_per_client():
    cfg = resolve_config(
        {"split": {"num_clients": 3}, "simulation": {"num_cpus": 2, "num_gpus": 0.5}}
    )
    pairs = dict(item.split("=") for item in federation_config(settings_of(cfg)).split())
    assert pairs == {
        "num-supernodes": "3",
        "client-resources-num-cpus": "2",
        "client-resources-num-gpus": "0.5",
    }


def test_flowers_federation_size_warning_is_neither_logged_nor_echoed(capsys):
    output = (
        "Successfully started run 7\n"
        "\x1b[93mWARNING \x1b[0m:   Since flwr 1.32, default simulated SuperNodes changed "
        "from 10 to 2.\n"
        "\x1b[92mINFO \x1b[0m:      Federation `@none/default` (3 simulated SuperNodes)\n"
        "\x1b[92mINFO \x1b[0m:      round 1/1  test_accuracy 0.1000\n"
    )
    lines: list[str] = []
    log = io.StringIO()
    _copy_lines(SimpleNamespace(stdout=io.StringIO(output)), lines, log, echo=True)
    echoed = capsys.readouterr().err
    kept = [strip_ansi(line) for line in output.splitlines(keepends=True)]
    del kept[1]
    assert lines == kept and log.getvalue() == "".join(kept)
    assert "\x1b" not in log.getvalue() and "\x1b" not in echoed  # captured: not a terminal
    assert SIZE_WARNING not in echoed and "started run 7" in echoed
    assert "round 1/1" not in echoed  # the progress line (ssfl.progress) shows the round


RAY_WORKERS = """
import os, sys
import ray
ray.init(runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(sys.path)}},
         include_dashboard=False, num_cpus=2, logging_level="ERROR")
actor = ray.remote(num_cpus=1)(type("Actor", (), {"pid": lambda self: os.getpid()})).remote()
ray.get(actor.pid.remote())
logs = ray._private.worker._global_node.get_logs_dir_path()
print(sum(name.startswith("python-core-worker") for name in os.listdir(logs)))
ray.shutdown()
"""


@pytest.mark.e2e
def test_ray_under_flowers_environment_starts_only_the_workers_the_actors_use(
    tmp_path, monkeypatch
):
    # Flower's RayBackend gives its actors a runtime_env; Ray's default would also start two
    # idle workers (one per CPU) for the driver. Under flwr_env: the actor's worker only.
    monkeypatch.delenv("RAY_prestart_worker_first_driver", raising=False)
    run = subprocess.run(
        [sys.executable, "-c", RAY_WORKERS],
        env=flwr_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split()[-1] == "1"


@pytest.mark.parametrize(
    ("user", "seconds"), [({}, "300"), ({"RAY_gcs_rpc_server_reconnect_timeout_s": "20"}, "20")]
)
def test_ray_waits_minutes_for_its_gcs_unless_the_user_says(user, seconds, tmp_path, monkeypatch):
    # Ray's default (60 s) ran out once when two runs started on 2 busy cores.
    monkeypatch.delenv("RAY_gcs_rpc_server_reconnect_timeout_s", raising=False)
    for key, value in user.items():
        monkeypatch.setenv(key, value)
    assert flwr_env(tmp_path)["RAY_gcs_rpc_server_reconnect_timeout_s"] == seconds


def test_the_superexec_polls_at_flowers_default_unless_the_user_says(tmp_path, monkeypatch):
    # At 0.1 s its polls cost 0.085 of a core for the whole run (docs/benchmarks.md).
    monkeypatch.delenv("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", raising=False)
    assert "FLWR_SUPEREXEC_TASK_POLL_INTERVAL" not in flwr_env(tmp_path)
    monkeypatch.setenv("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "0.1")
    assert flwr_env(tmp_path)["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] == "0.1"


@pytest.mark.parametrize(
    ("user", "prestarted"),
    [({}, True), ({"SSFL_RAY_PRESTART": "0"}, False), ({"RAY_ADDRESS": "10.0.0.5:6379"}, False)],
)
def test_a_run_joins_a_ray_cluster_of_its_own_unless_told_otherwise(user, prestarted, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("SSFL_RAY_PRESTART", raising=False)
    for key, value in user.items():
        monkeypatch.setenv(key, value)
    link = LocalSuperLink.create()
    try:
        assert (link.ray is not None) == prestarted
        if prestarted:
            assert link.env["RAY_ADDRESS"] == f"127.0.0.1:{link.ray.port}"
        else:  # the user's cluster, else one the simulation starts (never a found one)
            assert link.env["RAY_ADDRESS"] == user.get("RAY_ADDRESS", "local")
    finally:
        link.close()


def test_the_ray_head_starts_a_cluster_rather_than_joining_the_address_it_serves(
    tmp_path, monkeypatch
):
    started = {}

    def fake_start(cmd, env, log_file=None, stdin=None):
        started.update(cmd=cmd, env=env, stdin=stdin)
        return subprocess.Popen([sys.executable, "-c", "pass"])

    monkeypatch.setattr("ssfl.runner.start_process", fake_start)
    head = RayHead(45678, tmp_path / "ray-head.log")
    head.launch({"RAY_ADDRESS": head.address, "PATH": "/bin"})
    head.process.wait()
    assert started["cmd"][1:] == ["-m", "ssfl.ray_head"]
    assert started["env"] == {"PATH": "/bin", "RAY_GCS_SERVER_PORT": "45678"}
    assert started["stdin"] == subprocess.PIPE


def test_the_ray_head_starts_a_new_cluster_even_where_ray_would_join_one(monkeypatch):
    """ray.init with no address joins the cluster /tmp/ray/ray_current_cluster names (a
    `ray start` or ray.cluster_utils one, e.g. another test's): the head asks for a local one."""
    calls = []
    fake = SimpleNamespace(init=lambda **kw: calls.append(kw), shutdown=lambda: None)
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # stdin closed: the head returns
    monkeypatch.setattr(signal, "signal", lambda *args: None)
    ray_head.hold()
    assert [kw["address"] for kw in calls] == ["local"]


def fake_ray(monkeypatch, errors, joins=()):
    """A ``ray`` whose init raises ``errors`` one by one, then succeeds, and a head whose joins
    of a timed-out start give ``joins`` one by one (None: joined); the calls made."""
    calls, raising, joining = [], iter(errors), iter(joins)

    def init(**kw):
        calls.append(kw["address"])
        error = next(raising, None)
        if error is not None:
            raise error

    monkeypatch.setitem(sys.modules, "ray", SimpleNamespace(init=init, shutdown=lambda: None))
    monkeypatch.setattr(ray_head, "join_started", lambda: calls.append("join") or next(joining))
    monkeypatch.setattr(ray_head, "kill_descendants", lambda: calls.append("kill"))
    return calls


TIMEOUT = Exception(
    "The current node timed out during startup. This could happen because some of the "
    "raylet failed to startup or the GCS has become overloaded."
)


def test_a_timed_out_ray_start_is_joined_where_its_raylet_comes_up_late(monkeypatch, capsys):
    calls = fake_ray(monkeypatch, [TIMEOUT], joins=[None])
    assert ray_head.start_cluster() is False  # joined: the head stops the processes itself
    assert calls == ["local", "join"]
    assert capsys.readouterr().err == (
        "ssfl.ray_head: Ray's start timed out (try 1 of 3); joining the cluster it started\n"
    )


def test_a_timed_out_ray_start_that_cannot_be_joined_is_killed_and_started_again(
    monkeypatch, capsys
):
    calls = fake_ray(monkeypatch, [TIMEOUT, TIMEOUT], joins=["no raylet", "no raylet"])
    assert ray_head.start_cluster() is True
    assert calls == ["local", "join", "kill"] * 2 + ["local"]
    assert capsys.readouterr().err.splitlines()[:2] == [
        "ssfl.ray_head: Ray's start timed out (try 1 of 3); joining the cluster it started",
        "ssfl.ray_head: could not join it (no raylet); stopping what it started",
    ]


def test_the_ray_head_gives_up_after_its_tries_and_at_once_on_any_other_error(monkeypatch):
    calls = fake_ray(monkeypatch, [TIMEOUT] * 3, joins=["no raylet"] * 3)
    with pytest.raises(RuntimeError, match=r"^Ray did not start in 3 tries: The current node"):
        ray_head.start_cluster()
    assert calls == ["local", "join", "kill"] * 3
    calls = fake_ray(monkeypatch, [RuntimeError("port 6379 taken")])
    with pytest.raises(RuntimeError, match="port 6379 taken"):
        ray_head.start_cluster()
    assert calls == ["local"]


# The head with Ray's wait for its raylet made to run out on the first start (the clock jumps
# 31 s at each look-up of the node while "fail" holds), the GCS and raylet really started.
# argv[1]: "join" (the raylet is up: the head joins its start) or "restart" (the join is
# refused: the start's processes are killed and Ray starts again). Prints what it killed
# (processes before, left after), then whether the head owns the cluster, then serves it
# as `python -m ssfl.ray_head` does.
TIMED_OUT_HEAD = """
import os, sys
import ray._private.node as node
import ray._private.services as services
from ssfl import ray_head
from ssfl.runner import descendants

real_get_node, real_time, state = services.get_node, node.time, {"fail": True, "offset": 0.0}

def get_node(*args, **kwargs):
    if state["fail"]:
        state["offset"] += 31.0
        raise RuntimeError("not registered yet")
    return real_get_node(*args, **kwargs)

class Clock:
    def __getattr__(self, name):
        return getattr(real_time, name)
    def monotonic(self):
        return real_time.monotonic() + state["offset"]

def join(join_started=ray_head.join_started):
    state["fail"] = False
    return "refused by the test" if sys.argv[1] == "restart" else join_started()

def kill(kill_descendants=ray_head.kill_descendants):
    started = descendants(os.getpid())
    kill_descendants()
    print("killed", len(started), len(set(started) & set(descendants(os.getpid()))), flush=True)

services.get_node, node.time = get_node, Clock()
ray_head.join_started, ray_head.kill_descendants = join, kill
start_cluster = ray_head.start_cluster
ray_head.start_cluster = lambda: print("owned", start_cluster(), flush=True) or False
ray_head.hold()
"""


@pytest.mark.process
@pytest.mark.parametrize("mode", ["join", "restart"])
def test_a_timed_out_ray_start_serves_a_driver_and_leaves_nothing_behind(mode, tmp_path):
    port = str(free_port())
    env = {**os.environ, "RAY_GCS_SERVER_PORT": port, "RAY_ADDRESS": ""}
    out = tmp_path / "head.out"
    with out.open("w") as sink:
        head = subprocess.Popen(
            [sys.executable, "-c", TIMED_OUT_HEAD, mode],
            env=env,
            stdin=subprocess.PIPE,
            stdout=sink,
            stderr=subprocess.STDOUT,
            text=True,
        )
    try:
        wait_until(lambda: "owned" in out.read_text(), head, "the head", out, timeout=120)
        lines = [line for line in out.read_text().splitlines() if line.startswith(("owned", "k"))]
        if mode == "join":
            assert lines == ["owned False"]
        else:
            killed, left = (int(n) for n in lines[0].split()[1:])
            assert killed >= 2 and left == 0  # at least the GCS and the raylet, all gone
            assert lines[1:] == ["owned True"]
        started = descendants(head.pid)
        joined = subprocess.run(
            [sys.executable, "-c", RAY_JOIN],
            env={**env, "RAY_ADDRESS": f"127.0.0.1:{port}"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert joined.returncode == 0, joined.stderr[-2000:]
        assert joined.stdout.split()[-1] == port
        head.stdin.close()
        assert head.wait(timeout=60) == 0, out.read_text()[-2000:]
    finally:
        head.kill()
    time.sleep(0.5)
    assert [pid for pid in started if alive(pid)] == []


def test_a_dead_ray_head_fails_the_run_with_its_last_line(tmp_path):
    log = tmp_path / "ray-head.log"
    head = RayHead(45678, log)
    with log.open("w") as out:
        head.process = subprocess.Popen(
            [sys.executable, "-c", "print('port taken'); raise SystemExit(3)"], stdout=out
        )
    head.process.wait()
    with pytest.raises(RunFailed, match=r"^the run's Ray cluster exited with code 3: port taken$"):
        head.check()
    head.stop()


@pytest.mark.e2e
def test_the_ray_head_serves_a_flower_style_driver_and_stops_with_all_it_started(tmp_path):
    link = LocalSuperLink.create()
    try:
        link.ray.launch(link.env)
        joined = subprocess.run(
            [sys.executable, "-c", RAY_JOIN],
            env=link.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert joined.returncode == 0, joined.stderr[-2000:]
        assert joined.stdout.split()[-1] == f"{link.ray.port}"
        started = descendants(link.ray.process.pid)
        assert started
    finally:
        link.close()
    time.sleep(0.5)
    assert [pid for pid in [link.ray.process.pid, *started] if alive(pid)] == []


# Flower's RayBackend's call (flwr/server/superlink/fleet/vce/backend/raybackend.py), RAY_ADDRESS
# from the environment; prints the GCS port of the cluster it joined.
RAY_JOIN = """
import os, sys
import ray
ray.init(runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(sys.path)}},
         include_dashboard=False, logging_level="ERROR", log_to_driver=False)
actor = ray.remote(num_cpus=1)(type("Actor", (), {"pid": lambda self: os.getpid()})).remote()
ray.get(actor.pid.remote())
print(ray.get_runtime_context().gcs_address.rsplit(":", 1)[1])
ray.shutdown()
"""


def git(repo, *args: str) -> str:
    """git in ``repo`` with a throwaway identity; its output."""
    ident = ["-c", "user.email=t@example.com", "-c", "user.name=t"]
    proc = subprocess.run(["git", *ident, "-C", str(repo), *args], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_code_version_is_the_commit_marked_dirty_by_tracked_changes_only(tmp_path):
    repo = tmp_path / "app"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "a.py").write_text("x = 1\n")
    git(repo, "add", "a.py")
    git(repo, "commit", "-q", "-m", "one")
    head = git(repo, "rev-parse", "--short=12", "HEAD")
    assert len(head) == 12 and code_version(repo) == head
    (repo / "scratch.txt").write_text("untracked\n")
    assert code_version(repo) == head  # an untracked file (a run folder) changes no code
    (repo / "a.py").write_text("x = 2\n")
    assert code_version(repo) == head + "+dirty"
    sub = repo / "pkg"
    sub.mkdir()
    assert code_version(sub) == ""  # not the checkout's top: an installed copy inside one
    assert code_version(tmp_path) == ""  # no checkout at all


def test_the_code_version_travels_in_a_run_config_key_the_app_declares(tmp_path):
    tomllib = pytest.importorskip("tomllib")
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    arg = run_config_arg(tmp_path / "e.yaml", tmp_path, True, "state", "0123456789ab+dirty")
    keys = [item.split("=", 1)[0] for item in arg.split(" ")]
    assert keys == ["experiment", "out-dir", "resume", "client-state-dir", "code-version"]
    assert set(keys) <= set(declared["config"])  # Flower refuses an undeclared key
    assert "code-version='0123456789ab+dirty'" in arg
    assert "code-version" not in run_config_arg(tmp_path / "e.yaml", tmp_path)


def test_waiting_for_a_process_ends_at_once_when_it_exits_and_at_its_time_when_it_hangs(
    tmp_path,
):
    """The SuperLink's generous readiness time (SUPERLINK_READY_S) costs nothing when it dies."""
    log = tmp_path / "superlink.log"
    with subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"]) as dead:
        started = time.monotonic()
        with pytest.raises(RunFailed, match=r"^flower-superlink exited with 3; see "):
            wait_until(lambda: False, dead, "flower-superlink", log, timeout=300)
        assert time.monotonic() - started < 10
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) as hung:
        try:
            wait_until(lambda: True, hung, "flower-superlink", log, timeout=1)  # ready: returns
            with pytest.raises(RunFailed, match=r"^flower-superlink was not ready within 1s"):
                wait_until(lambda: False, hung, "flower-superlink", log, timeout=1)
        finally:
            hung.kill()

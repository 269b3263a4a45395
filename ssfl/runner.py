"""Run an experiment in Flower's simulation engine and check that it really finished.

What it takes care of (see the project's Flower notes): a scratch FLWR_HOME, no
runtime dependency install, a SuperLink of its own on free loopback ports (the
only one it stops), client resources, the run's real status (``flwr run
--stream`` exits 0 even when the ServerApp crashed) and the results file.
The process, environment and submission helpers here are shared with
:mod:`ssfl.deploy` (the same app as real SuperLink/SuperNode processes).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import yaml

from ssfl import lifecycle
from ssfl.lifecycle import (
    kill_server_apps,
    owned_temp,
    owned_temp_dir,
    record_interruption,
    run_tag,
    stop_grace,
)
from ssfl.run_lock import holding_out
from tasks.settings import Settings, mapping

# Names only; tasks.checkpoint would import torch, which the CLI imports after it has
# started the SuperLink booting (a test keeps the two equal).
CHECKPOINT_FILE = "checkpoint.pt"
CLIENT_STATE_DIR = "client-state"

APP_DIR = Path(__file__).resolve().parents[1]
BIN_DIR = Path(sys.executable).parent
# The app's packages: pyproject.toml's wheel packages (a test keeps the two equal).
APP_PACKAGES = ("server_app", "client_app", "strategies", "tasks", "ssfl")
# How long a SuperLink may take to answer its health check (one that exits fails at once).
# Beside CPU-bound work on 2 cores a simulation's SuperLink has taken over 60 s.
SUPERLINK_READY_S = 300.0


class RunFailed(RuntimeError):
    """The Flower run did not complete, or wrote no results, or its results.json records
    ``"status": "failed"``."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def flwr_bin(name: str) -> str:
    """A Flower executable from this interpreter's environment (else from PATH)."""
    local = BIN_DIR / name
    found = str(local) if local.exists() else shutil.which(name)
    if not found:
        raise RunFailed(f"'{name}' not found: install the project (pip install -e .)")
    return found


def flwr_env(home: Path, **extra: str) -> dict[str, str]:
    """The environment of every Flower process and CLI call: a scratch FLWR_HOME,
    no runtime dependency installation, no update check, no Ray
    workers started before they are asked for, the tag that lets the CLI's watchdog end
    them when the CLI ends (:mod:`ssfl.lifecycle`), plus ``extra``."""
    return {
        # Ray starts one idle worker per CPU for the first driver; Flower's actors carry a
        # runtime_env (PYTHONPATH), so they never use those and get workers of their own: on
        # a 2-core machine two extra Python processes start beside the actors (a user's
        # own setting wins).
        "RAY_prestart_worker_first_driver": "0",
        # Ray's processes give up on reaching the GCS after 60 s by default; a busy machine
        # (two runs starting on 2 cores beside a container build) has needed longer (a user's
        # own setting wins).
        "RAY_gcs_rpc_server_reconnect_timeout_s": "300",
        **os.environ,
        # Flower starts flower-superexec and flwr-serverapp by name: find ours first,
        # also when this environment is not activated.
        "PATH": os.pathsep.join([str(BIN_DIR), os.environ.get("PATH", "")]),
        "FLWR_HOME": str(home),
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        **run_tag(),
        **extra,
    }


def start_process(
    cmd: list[str],
    env: Mapping[str, str],
    log_file: Path | None = None,
    stdin: int | None = None,
) -> subprocess.Popen:
    """Start ``cmd`` in a process group of its own (``stop_process`` ends that group only),
    its output going to ``log_file`` (discarded when None)."""
    out = log_file.open("w") if log_file is not None else subprocess.DEVNULL
    try:
        return subprocess.Popen(
            cmd,
            env=dict(env),
            stdin=stdin,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    finally:
        if log_file is not None:
            out.close()


def stop_process(process: subprocess.Popen | None, grace: float | None = None) -> None:
    """Stop a process started by ``start_process`` and everything it started: SIGTERM, then
    SIGKILL (see :func:`stop_processes`)."""
    stop_processes([process], grace)


def stop_processes(
    processes: Sequence[subprocess.Popen | None], grace: float | None = None
) -> None:
    """Stop processes started by ``start_process`` and everything they started, all at
    once: SIGTERM, then SIGKILL to those left after ``grace`` seconds (default:
    :func:`ssfl.lifecycle.stop_grace`).

    Flower's SuperLink starts flower-superexec in a session of its own, which starts the
    simulation (and Ray); those only watch their parent and can outlive it while busy, so
    the process groups of all descendants are stopped too, not only the SuperLink's.
    After Ctrl-C or SIGTERM the ServerApp's processes get SIGKILL first, so that the round
    in flight is not recorded with its clients failed (see ``end_processes``).
    """
    running = [p for p in processes if p is not None and p.poll() is None]
    groups = [g for p in running for g in (p.pid, *descendant_groups(p.pid))]
    if lifecycle.interrupted:
        kill_server_apps([pid for p in running for pid in (p.pid, *descendants(p.pid))])
    grace = stop_grace() if grace is None else grace
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        for group in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, sig)
        if wait_gone(running, groups, wait):
            return


def wait_gone(processes: list[subprocess.Popen], groups: list[int], timeout: float) -> bool:
    """Whether ``processes`` exited and ``groups`` emptied within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        exited = all(p.poll() is not None for p in processes)
        if exited and not any(group_alive(g) for g in groups):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


def process_tree() -> dict[int, list[int]]:
    """Children of every process, from ``ps`` (Linux and macOS)."""
    out = subprocess.run(
        ["ps", "-A", "-o", "pid=,ppid="], capture_output=True, text=True, check=False
    ).stdout
    children: dict[int, list[int]] = {}
    for line in out.splitlines():
        pid, ppid = (int(v) for v in line.split())
        children.setdefault(ppid, []).append(pid)
    return children


def descendants(pid: int) -> list[int]:
    """The pids of ``pid``'s descendants."""
    children, todo, found = process_tree(), [pid], []
    while todo:
        for child in children.get(todo.pop(), []):
            todo.append(child)
            found.append(child)
    return found


def descendant_groups(pid: int) -> list[int]:
    """The process groups of ``pid``'s descendants other than ``pid``'s own group."""
    groups: list[int] = []
    for child in descendants(pid):
        with contextlib.suppress(ProcessLookupError):
            group = os.getpgid(child)
            if group not in (pid, *groups):
                groups.append(group)
    return groups


def group_alive(group: int) -> bool:
    """Whether a process of ``group`` still runs: zombies (exited, not yet reaped by a
    parent that may never do it) do not count."""
    try:
        os.killpg(group, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return sys.platform != "linux" or group in running_groups()


def running_groups() -> set[int]:
    """The process groups that have a member other than a zombie (Linux's /proc)."""
    groups = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if fields[0] != "Z":
                groups.add(int(fields[2]))
    return groups


def wait_until(
    ready: Callable[[], bool], process: subprocess.Popen, what: str, log: Path, timeout: float
) -> None:
    """Poll ``ready`` until it holds; RunFailed when ``process`` exits or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RunFailed(f"{what} exited with {process.returncode}; see {log}")
        if ready():
            return
        time.sleep(0.2)
    raise RunFailed(f"{what} was not ready within {timeout:.0f}s; see {log}")


def http_ok(url: str, ca_file: Path | None = None) -> bool:
    """Whether ``url`` answers 2xx (``ca_file``: the CA that signed a TLS server's certificate)."""
    import httpx

    verify = ssl.create_default_context(cafile=str(ca_file)) if ca_file else True
    try:
        return httpx.get(url, timeout=1.0, verify=verify).is_success
    except httpx.HTTPError:
        return False


def ray_prestart_wanted(env: Mapping[str, str]) -> bool:
    """Whether a run starts its own Ray cluster beforehand: not when the user names a
    cluster (``RAY_ADDRESS``) or turns it off (``SSFL_RAY_PRESTART=0``)."""
    return not env.get("RAY_ADDRESS") and env.get("SSFL_RAY_PRESTART", "1") != "0"


@dataclass
class RayHead:
    """The run's local Ray cluster (``python -m ssfl.ray_head``) on a free GCS port, started
    before the simulation asks for Ray, which joins it through ``RAY_ADDRESS``."""

    port: int
    log_file: Path
    process: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def launch(self, env: Mapping[str, str]) -> None:
        """Start the cluster without waiting for it (once); it lives while its stdin is open."""
        if self.process is None:
            cmd = [sys.executable, "-m", "ssfl.ray_head"]
            env = {k: v for k, v in env.items() if k != "RAY_ADDRESS"}  # start, not join
            env["RAY_GCS_SERVER_PORT"] = str(self.port)
            self.process = start_process(cmd, env, self.log_file, stdin=subprocess.PIPE)

    def check(self) -> None:
        """Raise RunFailed when the cluster's process has exited (the run cannot reach Ray)."""
        code = None if self.process is None else self.process.poll()
        if code is not None:
            lines = (
                self.log_file.read_text().strip().splitlines() if self.log_file.is_file() else []
            )
            last = lines[-1] if lines else "no output"
            raise RunFailed(f"the run's Ray cluster exited with code {code}: {last}")

    def release(self) -> None:
        """Close the cluster's stdin: it begins to shut down."""
        if self.process is not None and self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()

    def stop(self) -> None:
        """Stop the cluster: Ray's head processes and the workers it started."""
        self.release()
        stop_process(self.process)


@dataclass
class LocalSuperLink:
    """A simulation SuperLink on free loopback ports, with the Ray cluster its simulation
    joins (unless :func:`ray_prestart_wanted` says no), owned and stopped by this process."""

    home: Path
    env: dict[str, str]
    process: subprocess.Popen | None = None
    ray: RayHead | None = None

    @classmethod
    def create(cls) -> LocalSuperLink:
        """A SuperLink (not started) with a new scratch FLWR_HOME."""
        home = owned_temp_dir("flwr-home-")
        env = flwr_env(
            home,
            FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(free_port()),
            FLWR_LOCAL_CONTROL_API_PORT=str(free_port()),
        )
        ray = RayHead(free_port(), home / "ray-head.log") if ray_prestart_wanted(env) else None
        if ray is not None:
            env["RAY_ADDRESS"] = ray.address
        elif not env.get("RAY_ADDRESS"):
            # The simulation starts a cluster of its own, not the one another run or `ray
            # start` left in /tmp/ray/ray_current_cluster (ssfl.ray_head says why).
            env["RAY_ADDRESS"] = "local"
        return cls(home=home, env=env, ray=ray)

    @classmethod
    def booting(cls) -> LocalSuperLink:
        """A SuperLink in a scratch home, launched: it boots while the caller goes on."""
        link = cls.create()
        link.launch()
        return link

    @property
    def http_port(self) -> str:
        return self.env["FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"]

    def launch(self) -> None:
        """Start the Ray cluster and the SuperLink process without waiting for them (once)."""
        if self.process is not None:
            return
        if self.ray is not None:
            self.ray.launch(self.env)
        cmd = [
            flwr_bin("flower-superlink"),
            "--insecure",
            "--simulation",
            "--isolation",
            "subprocess",
            "--control-api-address",
            f"127.0.0.1:{self.env['FLWR_LOCAL_CONTROL_API_PORT']}",
            "--host",
            "127.0.0.1",
            "--port",
            self.http_port,
            "--database",
            str(self.home / "state.db"),
            "--disable-runtime-dependency-installation",
            "--log-file",
            str(self.log_file),
        ]
        self.process = start_process(cmd, self.env)

    def wait_ready(self, timeout: float = SUPERLINK_READY_S) -> None:
        """Block until the launched SuperLink answers its health check."""
        assert self.process is not None, "launch() first"
        health = f"http://127.0.0.1:{self.http_port}/health"
        wait_until(
            lambda: http_ok(health), self.process, "flower-superlink", self.log_file, timeout
        )

    @property
    def log_file(self) -> Path:
        return self.home / "superlink.log"

    def check(self) -> None:
        """Raise RunFailed when the run's Ray cluster has died."""
        if self.ray is not None:
            self.ray.check()

    def stop(self) -> None:
        """Stop the SuperLink and everything it started, and the Ray cluster, together."""
        if self.ray is None:
            stop_process(self.process)
            return
        self.ray.release()
        stop_processes([self.process, self.ray.process])

    def close(self, out: Path | None = None) -> None:
        """Stop it, keep its log in ``out`` (when given) and remove its scratch home."""
        self.stop()
        if out is not None:
            keep_log(self.log_file, out)
        shutil.rmtree(self.home, ignore_errors=True)


def write_resolved(settings: Settings, out: Path) -> Path:
    """The resolved experiment, saved beside the results; the run reads this file."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "config.yaml"
    path.write_text(yaml.safe_dump(mapping(settings), sort_keys=False))
    return path


def toml_str(value: str) -> str:
    """A TOML literal string for --run-config (paths with a single quote cannot be one)."""
    if "'" in value:
        from tasks.config import ConfigError

        raise ConfigError(
            f"path {value!r} contains a single quote, which Flower's run-config "
            "cannot carry; choose another folder"
        )
    return f"'{value}'"


def run_status(env: Mapping[str, str], superlink: str, run_id: str) -> str:
    """The run's status as the SuperLink records it (e.g. finished:completed)."""
    proc = subprocess.run(
        [flwr_bin("flwr"), "ls", superlink, "--run-id", run_id, "--format", "json"],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    match = re.search(r'"status":\s*"([^"]+)"', proc.stdout)
    return match.group(1) if match else f"unknown ({proc.stdout.strip()[-200:]})"


def git_out(app_dir: Path, *args: str) -> str | None:
    """``git -C app_dir ARGS``'s output, None when git is absent or fails."""
    git = shutil.which("git")
    if git is None:
        return None
    try:
        proc = subprocess.run(
            [git, "-C", str(app_dir), *args], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def code_version(app_dir: Path = APP_DIR) -> str:
    """The commit the app is launched from, with "+dirty" when a tracked file differs from
    it; "" when ``app_dir`` is not the top of a git checkout (an installed copy, a
    container). Each results.json records it as ``code_version``."""
    top = git_out(app_dir, "rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != Path(app_dir).resolve():
        return ""
    head = git_out(app_dir, "rev-parse", "--short=12", "HEAD")
    changed = git_out(app_dir, "status", "--porcelain", "--untracked-files=no")
    if not head:
        return ""
    return head + ("" if changed == "" else "+dirty")


def run_config_arg(
    exp: Path, out: Path, resume: bool = False, client_state: str = "", code: str = ""
) -> str:
    """The app's --run-config: the resolved experiment file, the results folder, whether to
    resume from its checkpoint, where simulated clients persist their state, and the code
    version the run is launched from (``code_version``)."""
    arg = f"experiment={toml_str(str(exp))} out-dir={toml_str(str(out))}"
    if resume:
        arg += " resume=true"
    if client_state:
        arg += f" client-state-dir={toml_str(client_state)}"
    if code:
        arg += f" code-version={toml_str(code)}"
    return arg


def prepare_out(out: Path, resume: bool) -> None:
    """A fresh run starts from nothing: a previous run's checkpoints (kept ones too) and
    client state in ``out`` are removed (a resumed run keeps them)."""
    if resume:
        return
    for checkpoint in out.glob("checkpoint*.pt"):
        checkpoint.unlink()
    shutil.rmtree(out / CLIENT_STATE_DIR, ignore_errors=True)


def stage_app(app_dir: Path, dest: Path) -> Path:
    """Copy what the FAB holds (pyproject.toml, the packages, experiments/) into ``dest``.

    ``flwr run`` walks every file under the folder it is given, a .venv and run folders
    included, before it filters them (5 s a run here); the staged copy holds only the app.
    """
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy2(app_dir / "pyproject.toml", dest / "pyproject.toml")
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in [*APP_PACKAGES, "experiments"]:
        shutil.copytree(app_dir / name, dest / name, ignore=skip)
    return dest


def submit_run(
    superlink: str,
    env: Mapping[str, str],
    exp: Path,
    out: Path,
    *,
    extra: Sequence[str] = (),
    stream: bool = True,
    app_dir: Path = APP_DIR,
    watch: Callable[[], None] | None = None,
    resume: bool = False,
    client_state: str = "",
    loggers: Sequence[str] = (),
) -> dict[str, Any]:
    """``flwr run --stream`` of the app on a SuperLink connection; check the run's real
    status and return its results.json, or raise RunFailed (also when ``watch`` does; with
    the results' one-line ``failure`` when the run recorded it). While it runs, each new
    round of OUT/metrics.jsonl goes to the progress line (``stream``) and the ``loggers``."""
    from ssfl.progress import follow_run

    results = out / "results.json"
    results.unlink(missing_ok=True)  # a previous run's file must not pass for this one's
    follower = follow_run(exp, out, stream, loggers)

    def watch_and_follow() -> None:
        follower.poll()
        if watch is not None:
            watch()

    with owned_temp("app-") as stage, contextlib.closing(follower):
        cmd = [
            flwr_bin("flwr"),
            "run",
            str(stage_app(app_dir, stage / "app")),
            superlink,
            "--run-config",
            run_config_arg(exp, out, resume, client_state, code_version(app_dir)),
            *extra,
            "--stream",
        ]
        output = _run_logged(
            cmd, env, out / "flower.log", echo=stream, watch=watch_and_follow, done=results.is_file
        )
    match = re.search(r"Successfully started run (\d+)", output)
    if not match:
        last = output.strip().splitlines()[-1] if output.strip() else "no output"
        raise RunFailed(f"flwr run did not start the run: {last}")
    recorded = json.loads(results.read_text()) if results.is_file() else None
    if recorded is not None and recorded.get("status") == "failed":
        raise RunFailed(recorded.get("failure") or f"the run failed; see {results}")
    if recorded is not None and recorded.get("status") == "completed":
        return recorded  # written, atomically, as the ServerApp's last act
    status = run_status(env, superlink, match.group(1))
    if status != "finished:completed":
        raise RunFailed(f"run {match.group(1)} ended as {status}; see {out / 'flower.log'}")
    if recorded is None:
        raise RunFailed(f"the run completed but wrote no {results}")
    return recorded


def run_simulation(
    settings: Settings,
    out: Path,
    *,
    stream: bool = True,
    app_dir: Path = APP_DIR,
    resume: bool = False,
    link: LocalSuperLink | None = None,
    loggers: Sequence[str] = (),
) -> dict[str, Any]:
    """Run a resolved experiment under ``flwr run``; return its results or raise RunFailed.

    ``resume``: go on from the checkpoint in ``out`` (the clients' state in
    ``out/client-state``); otherwise both are removed first. ``link``: a SuperLink
    already booting (:meth:`LocalSuperLink.booting`); this call closes it (its caller
    does when the device check refuses the experiment). Ctrl-C or SIGTERM: everything is
    stopped, results.json records the interrupted run."""
    from ssfl.gpu import check_run_device, gpu_count

    share = check_run_device(settings, gpu_count())  # a refused device starts nothing
    link = LocalSuperLink.booting() if link is None else link
    out = Path(out).resolve()
    with record_interruption(out):
        try:
            with holding_out(out):  # refused: the link booted for this run still closes
                exp = write_resolved(settings, out)
                prepare_out(out, resume)
                link.wait_ready()
                return submit_run(
                    "local",
                    link.env,
                    exp,
                    out,
                    extra=["--federation-config", federation_config(settings, share)],
                    stream=stream,
                    app_dir=app_dir,
                    watch=link.check,
                    resume=resume,
                    client_state=str(out / CLIENT_STATE_DIR),
                    loggers=loggers,
                )
        finally:
            link.close(out)


def federation_config(settings: Settings, gpu_share: float | None = None) -> str:
    """The simulation's --federation-config: one SuperNode per client (cohort: per worker)
    and its resources (``gpu_share``: each actor's GPU share, default simulation.num_gpus's
    share on this machine, see :mod:`ssfl.gpu`)."""
    from ssfl.gpu import client_gpu_share, gpu_count, simulated_nodes

    gpus = gpu_count()
    if gpu_share is None:
        gpu_share = client_gpu_share(settings, gpus)
    return (
        f"num-supernodes={simulated_nodes(settings, gpus)} "
        f"client-resources-num-cpus={settings.simulation.num_cpus} "
        f"client-resources-num-gpus={float(gpu_share)}"
    )


def keep_log(log_file: Path, out: Path) -> None:
    """Keep the SuperLink's log beside the results (its scratch home is removed)."""
    if log_file.is_file():
        shutil.copyfile(log_file, out / "superlink.log")


def _run_logged(
    cmd: list[str],
    env: Mapping[str, str],
    log_path: Path,
    echo: bool,
    watch: Callable[[], None] | None = None,
    done: Callable[[], bool] | None = None,
) -> str:
    """Run ``flwr run --stream`` into a log file, echoing progress lines when asked.

    ``watch`` is called about once a second while it runs; when it raises, the command is
    stopped and the error goes on (a deployment's process died: fail now, not at timeout).
    ``done``: once it holds, the command gets ``DONE_GRACE_S`` more to exit by itself (it
    is only streaming the run's teardown then) before it is stopped.
    """
    lines: list[str] = []
    with log_path.open("w") as log_fh:
        proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        )
        reader = threading.Thread(target=_copy_lines, args=(proc, lines, log_fh, echo))
        reader.start()
        try:
            while proc.poll() is None:
                if watch is not None:
                    watch()
                if done is not None and done():
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=DONE_GRACE_S)
                    break
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=1.0)
        finally:
            if proc.poll() is None:
                proc.terminate()
            proc.wait()
            reader.join()
    return "".join(lines)


# Seconds ``flwr run --stream`` may take to exit once the run's results are written.
DONE_GRACE_S = 0.5


def _copy_lines(proc: subprocess.Popen, lines: list[str], log_fh: TextIO, echo: bool) -> None:
    """Keep every output line (but Flower's SIZE_WARNING) in ``lines`` and the log file,
    without terminal codes; echoed with them only to a terminal."""
    from ssfl.progress import strip_ansi

    assert proc.stdout is not None
    terminal = sys.stderr.isatty()
    for line in proc.stdout:
        plain = strip_ansi(line)
        if SIZE_WARNING in plain:
            continue
        lines.append(plain)
        log_fh.write(plain)
        if echo and _worth_echoing(plain):
            sys.stderr.write(line if terminal else plain)
            sys.stderr.flush()


# Flower 1.41's flwr-simulation logs this warning on every run, whatever the federation's
# size (flwr/simulation/app.py: unconditional, no setting turns it off); ssfl always sets
# num-supernodes to split.num_clients (federation_config), so for an ssfl run it is a
# false alarm: it is neither echoed nor kept in OUT/flower.log.
SIZE_WARNING = "default simulated SuperNodes changed from 10 to 2"


# Flower's Ray backend logs this warning for each actor it ends (flwr/simulation/
# ray_transport/ray_actor.py, terminate), which every normal shut-down does: kept in
# OUT/flower.log, not echoed.
ACTOR_END_WARNING = "Manually terminating ClientAppActor"


def _worth_echoing(line: str) -> bool:
    """Progress lines, warnings and errors; not Flower's per-message chatter, nor the
    warnings of a normal shut-down."""
    keys = ("round ", "WARNING", "ERROR", "Traceback", "Error", "Successfully started run")
    noise = ("configure_", SIZE_WARNING, ACTOR_END_WARNING, "checkpoint written")
    return (
        any(k in line for k in keys)
        and not any(n in line for n in noise)
        and not RECORDED_ROUND.search(line)  # the progress line (ssfl.progress) shows it
    )


# The ServerApp's own line per round (tasks.results.Recorder.add_round).
RECORDED_ROUND = re.compile(r"\bround \d+/\d+")

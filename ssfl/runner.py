"""Run an experiment in Flower's simulation engine and check that it really finished.

What it takes care of (see the project's Flower notes): a scratch FLWR_HOME, no
runtime dependency install, a SuperLink of its own on free loopback ports (the
only one it stops), client resources, the run's real status (``flwr run
--stream`` exits 0 even when the ServerApp crashed) and the results file.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

APP_DIR = Path(__file__).resolve().parents[1]
BIN_DIR = Path(sys.executable).parent


class RunFailed(RuntimeError):
    """The Flower run did not complete, or wrote no results."""


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


@dataclass
class LocalSuperLink:
    """A simulation SuperLink on free loopback ports, owned (and stopped) by this process."""

    home: Path
    env: dict[str, str]
    process: subprocess.Popen | None = None

    @classmethod
    def create(cls, home: Path) -> LocalSuperLink:
        http_port, control_port = free_port(), free_port()
        env = {
            **os.environ,
            # Flower starts flower-superexec and flwr-serverapp by name: find ours first,
            # also when this environment is not activated.
            "PATH": os.pathsep.join([str(BIN_DIR), os.environ.get("PATH", "")]),
            "FLWR_HOME": str(home),
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            "FLWR_DISABLE_UPDATE_CHECK": "1",
            "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(http_port),
            "FLWR_LOCAL_CONTROL_API_PORT": str(control_port),
        }
        return cls(home=home, env=env)

    @property
    def http_port(self) -> str:
        return self.env["FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"]

    def start(self, timeout: float = 60.0) -> None:
        log_file = self.home / "superlink.log"
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
            str(log_file),
        ]
        self.process = subprocess.Popen(
            cmd,
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RunFailed(
                    f"flower-superlink exited with {self.process.returncode}; "
                    f"see superlink.log in the output folder"
                )
            if self._healthy():
                return
            time.sleep(0.2)
        raise RunFailed(
            f"flower-superlink did not start within {timeout:.0f}s; "
            "see superlink.log in the output folder"
        )

    def _healthy(self) -> bool:
        import httpx

        try:
            return httpx.get(f"http://127.0.0.1:{self.http_port}/health", timeout=1.0).is_success
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        """Stop the SuperLink and everything it started (its own process group only)."""
        if self.process is None or self.process.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.process.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue


def write_resolved(cfg: Mapping[str, Any], out: Path) -> Path:
    """The resolved experiment, saved beside the results; the run reads this file."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "config.yaml"
    path.write_text(yaml.safe_dump(dict(cfg), sort_keys=False))
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


def run_status(link: LocalSuperLink, run_id: str) -> str:
    """The run's status as the SuperLink records it (e.g. finished:completed)."""
    proc = subprocess.run(
        [flwr_bin("flwr"), "ls", "local", "--run-id", run_id, "--format", "json"],
        env=link.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    match = re.search(r'"status":\s*"([^"]+)"', proc.stdout)
    return match.group(1) if match else f"unknown ({proc.stdout.strip()[-200:]})"


def run_simulation(
    cfg: Mapping[str, Any], out: Path, *, stream: bool = True, app_dir: Path = APP_DIR
) -> dict[str, Any]:
    """Run a resolved experiment under ``flwr run``; return its results or raise RunFailed."""
    out = Path(out).resolve()
    exp = write_resolved(cfg, out)
    home = Path(tempfile.mkdtemp(prefix="ssfl-flwr-home-"))
    sim = cfg["simulation"]
    link = LocalSuperLink.create(home)
    try:
        link.start()
        cmd = [
            flwr_bin("flwr"),
            "run",
            str(app_dir),
            "local",
            "--run-config",
            f"experiment={toml_str(str(exp))} out-dir={toml_str(str(out))}",
            "--federation-config",
            f"num-supernodes={cfg['split']['num_clients']} "
            f"client-resources-num-cpus={sim['num_cpus']} "
            f"client-resources-num-gpus={float(sim['num_gpus'])}",
            "--stream",
        ]
        output = _run_logged(cmd, link.env, out / "flower.log", echo=stream)
        match = re.search(r"Successfully started run (\d+)", output)
        if not match:
            last = output.strip().splitlines()[-1] if output.strip() else "no output"
            raise RunFailed(f"flwr run did not start the run: {last}")
        status = run_status(link, match.group(1))
        if status != "finished:completed":
            raise RunFailed(f"run {match.group(1)} ended as {status}; see {out / 'flower.log'}")
        results = out / "results.json"
        if not results.is_file():
            raise RunFailed(f"the run completed but wrote no {results}")
        return json.loads(results.read_text())
    finally:
        link.stop()
        keep_log(home / "superlink.log", out)
        shutil.rmtree(home, ignore_errors=True)


def keep_log(log_file: Path, out: Path) -> None:
    """Keep the SuperLink's log beside the results (its scratch home is removed)."""
    if log_file.is_file():
        shutil.copyfile(log_file, out / "superlink.log")


def _run_logged(cmd: list[str], env: Mapping[str, str], log_path: Path, echo: bool) -> str:
    """Run ``flwr run --stream`` into a log file, echoing progress lines when asked."""
    lines = []
    with log_path.open("w") as log_fh:
        proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            log_fh.write(line)
            if echo and _worth_echoing(line):
                sys.stderr.write(line)
                sys.stderr.flush()
        proc.wait()
    return "".join(lines)


def _worth_echoing(line: str) -> bool:
    """Progress lines, warnings and errors; not Flower's per-message chatter."""
    keys = ("round ", "WARNING", "ERROR", "Traceback", "Error", "Successfully started run")
    return any(k in line for k in keys) and "configure_" not in line

"""Run an experiment as a real deployment on loopback: SuperLink and SuperNodes as processes.

The topology is the container one (docker-compose.yml), as local processes: a
SuperLink with TLS, SuperNode authentication and process isolation; a SuperExec
that runs the ServerApp; per node a SuperNode with its own key and node-config and a
SuperExec that runs its ClientApps. Certificates, keys, the SuperLink's database and
the Flower CLI configuration live in a scratch FLWR_HOME; each process logs to
``OUT/logs/<name>.log``. Only the processes started here are stopped, by process group.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ssfl.certs import make_certificates, make_node_key
from ssfl.lifecycle import owned_temp_dir, record_interruption
from ssfl.run_lock import holding_out
from ssfl.runner import (
    APP_DIR,
    SUPERLINK_READY_S,
    RunFailed,
    flwr_bin,
    flwr_env,
    free_port,
    http_ok,
    prepare_out,
    start_process,
    stop_processes,
    submit_run,
    toml_str,
    wait_until,
    write_resolved,
)
from tasks.checkpoint import CLIENT_STATE_DIR
from tasks.config import ConfigError
from tasks.settings import Settings

SUPERLINK = "deploy-local"  # the Flower CLI's name for the SuperLink connection


def node_config(
    partition_id: int, num_partitions: int, data_path: str = "", state_path: str = ""
) -> str:
    """A SuperNode's --node-config: its partition, or its own folder of images too, and the
    folder where it persists its context.state (client_app/state.py)."""
    config = f"partition-id={partition_id} num-partitions={num_partitions}"
    if data_path:
        config += f" data-path={toml_str(data_path)}"
    if state_path:
        config += f" state-path={toml_str(state_path)}"
    return config


@dataclass
class LocalDeployment:
    """A SuperLink, its ServerApp SuperExec and SuperNodes on loopback, owned by this process."""

    home: Path
    logs: Path
    env: dict[str, str]
    port: int
    certs: dict[str, Path]
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)

    @classmethod
    def create(cls, home: Path, logs: Path) -> LocalDeployment:
        """Certificates for 127.0.0.1 and the CLI's connection to a SuperLink on a free port."""
        logs.mkdir(parents=True, exist_ok=True)
        port = free_port()
        certs = make_certificates(home / "certs")
        (home / "config.toml").write_text(
            f'[superlink]\ndefault = "{SUPERLINK}"\n\n[superlink.{SUPERLINK}]\n'
            f'address = "127.0.0.1:{port}"\nroot-certificates = "{certs["ca"]}"\n'
        )
        return cls(home=home, logs=logs, env=flwr_env(home), port=port, certs=certs)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(
        self, name: str, cmd: list[str], env: Mapping[str, str] | None = None
    ) -> subprocess.Popen:
        process = start_process(cmd, env or self.env, self.logs / f"{name}.log")
        self.processes[name] = process
        return process

    def start_superlink(self, timeout: float = SUPERLINK_READY_S) -> None:
        """The SuperLink (TLS, node authentication, process isolation) and the ServerApp's
        SuperExec; returns once the SuperLink answers over TLS."""
        c = self.certs
        process = self.start(
            "superlink",
            [
                flwr_bin("flower-superlink"),
                *("--ssl-ca-certfile", str(c["ca"])),
                *("--ssl-certfile", str(c["cert"])),
                *("--ssl-keyfile", str(c["key"])),
                "--enable-supernode-auth",
                *("--isolation", "process"),
                "--disable-runtime-dependency-installation",
                *("--database", str(self.home / "state.db")),
                *("--host", "127.0.0.1", "--port", str(self.port)),
            ],
        )
        health = f"https://{self.address}/health"
        wait_until(
            lambda: http_ok(health, c["ca"]),
            process,
            "flower-superlink",
            self.logs / "superlink.log",
            timeout,
        )
        self.start(
            "superexec-serverapp",
            [
                flwr_bin("flower-superexec"),
                *("--runtime-api-address", self.address),
                *("--root-certificates", str(c["ca"])),
            ],
        )

    def register(self, public_keys: list[Path]) -> None:
        """Register SuperNode public keys with the SuperLink (``flwr supernode register``)."""
        for key in public_keys:
            proc = subprocess.run(
                [flwr_bin("flwr"), "supernode", "register", str(key), SUPERLINK],
                env=self.env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            if proc.returncode != 0 or "registered successfully" not in proc.stdout:
                detail = " ".join((proc.stdout + proc.stderr).split())[-300:]
                raise RunFailed(f"could not register {key.name}: {detail}")

    def start_node(
        self, name: str, private_key: Path, config: str, threads: int, ca: Path | None = None
    ) -> None:
        """A SuperNode (TLS, its own key, process isolation) and its ClientApp SuperExec.

        Its ClientApps get ``threads`` CPU threads (OMP_NUM_THREADS), as Ray gives a
        simulated client with ``client-resources-num-cpus``: the same float arithmetic,
        so the same numbers as ``ssfl run``. ``ca``: the CA the node trusts (default:
        the one that signed the SuperLink's certificate).
        """
        runtime_port = str(free_port())
        env = {**self.env, "OMP_NUM_THREADS": str(threads)}
        self.start(
            name,
            [
                flwr_bin("flower-supernode"),
                *("--superlink", self.address),
                *("--root-certificates", str(ca or self.certs["ca"])),
                *("--auth-supernode-private-key", str(private_key)),
                *("--isolation", "process"),
                *("--host", "127.0.0.1", "--port", runtime_port),
                *("--node-config", config),
            ],
            env,
        )
        # The SuperNode's Runtime API listens on loopback only; the SuperExec beside it
        # needs no TLS (a node on another host keeps its SuperExec in the same place).
        self.start(
            f"superexec-{name}",
            [
                flwr_bin("flower-superexec"),
                *("--runtime-api-address", f"127.0.0.1:{runtime_port}"),
                "--insecure",
            ],
            env,
        )

    def check_alive(self) -> None:
        """RunFailed naming every started process that has exited, with its log's last error."""
        dead = [(n, p.returncode) for n, p in self.processes.items() if p.poll() is not None]
        if dead:
            raise RunFailed(
                "; ".join(
                    f"{n} exited with {code}{last_error(self.logs / f'{n}.log')}"
                    for n, code in dead
                )
            )

    def stop(self) -> None:
        """Stop every process started here, together, each by its own process group."""
        stop_processes(list(self.processes.values()))


def last_error(log: Path) -> str:
    """': <why>' from a Flower log: the message of its last exit code (Flower prints it
    below 'Exit Code: N'), else its last ERROR line, else a pointer to the log."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", log.read_text(errors="replace")) if log.is_file() else ""
    lines = [line.strip() for line in text.splitlines()]
    exits = [i for i, line in enumerate(lines) if "Exit Code:" in line]
    if exits:
        message = []
        for line in lines[exits[-1] + 1 :]:
            if not line:
                break
            message.append(line)
        return f": {' '.join(message)} ({log})"
    errors = [line for line in lines if line.startswith("ERROR")]
    return f": {errors[-1].split(':', 1)[-1].strip()} ({log})" if errors else f" (see {log})"


def run_deployment(
    settings: Settings,
    out: Path,
    *,
    node_data: Mapping[int, str] | None = None,
    stream: bool = True,
    app_dir: Path = APP_DIR,
    resume: bool = False,
) -> dict[str, Any]:
    """Run a resolved experiment on a local deployment of ``split.num_clients`` SuperNodes.

    Node k holds partition k of ``split.num_clients``, or, when ``node_data`` maps k to a
    folder, that folder's unlabeled images; its state-path is ``out/client-state``.
    ``resume``: go on from the checkpoint in ``out``. Returns the results, or raises
    RunFailed when the run fails or a process dies. Ctrl-C or SIGTERM: every process is
    stopped, results.json records the interrupted run.
    """
    if settings.simulation.execution == "cohort":
        raise ConfigError(
            "config key 'simulation.execution': cohort is for simulation; a deployed "
            "SuperNode trains one client (set per_client)"
        )
    out = Path(out).resolve()
    with holding_out(out), record_interruption(out):
        return deploy(settings, out, node_data, stream, app_dir, resume)


def deploy(
    settings: Settings,
    out: Path,
    node_data: Mapping[int, str] | None,
    stream: bool,
    app_dir: Path,
    resume: bool,
) -> dict[str, Any]:
    """The body of :func:`run_deployment`: start the processes, submit, stop them all."""
    exp = write_resolved(settings, out)
    prepare_out(out, resume)
    num_nodes = settings.split.num_clients
    home = owned_temp_dir("deploy-")
    deployment = LocalDeployment.create(home, out / "logs")
    try:
        deployment.start_superlink()
        keys = [make_node_key(home / "keys", f"node{k}") for k in range(num_nodes)]
        deployment.register([public for _, public in keys])
        for k, (private, _) in enumerate(keys):
            data_path = (node_data or {}).get(k, "")
            config = node_config(k, num_nodes, data_path, str(out / CLIENT_STATE_DIR))
            threads = settings.simulation.num_cpus
            deployment.start_node(f"supernode-{k}", private, config, threads)
        # The ServerApp waits until all nodes are connected; a process that dies meanwhile
        # (a refused node, a crash) stops everything at once.
        results = submit_run(
            SUPERLINK,
            deployment.env,
            exp,
            out,
            stream=stream,
            app_dir=app_dir,
            watch=deployment.check_alive,
            resume=resume,
        )
        deployment.check_alive()
        return results
    finally:
        deployment.stop()
        shutil.rmtree(home, ignore_errors=True)

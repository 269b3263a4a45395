"""The compose files and the Dockerfile: valid for ``docker compose config``, the pinned
Flower version, TLS and node authentication on every link to the SuperLink, a GPU per client.

No Docker engine is needed; CI installs the compose client (.ci/run) and fails without it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from importlib.metadata import version

import pytest
import yaml

from tests.conftest import ROOT

FLWR_VERSION = version("flwr")
EDGE_ENV = {"SUPERLINK_ADDRESS": "server.example.org:8000", "NODE_ID": "7", "NODE_DATA_DIR": "/srv"}


def compose_command() -> list[str]:
    if (
        shutil.which("docker")
        and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0
    ):
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if os.environ.get("CI"):
        pytest.fail("no docker compose client: .ci/run installs Debian's docker-compose")
    pytest.skip("no docker compose client here")


def compose_config(path: str, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess:
    cmd = [*compose_command(), "-f", path, *extra, "config"]
    full_env = {k: v for k, v in os.environ.items() if k not in EDGE_ENV} | env
    return subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=120)


def services(path: str, env: dict[str, str], *extra: str) -> dict:
    proc = compose_config(path, env, *extra)
    assert proc.returncode == 0, proc.stderr
    return yaml.safe_load(proc.stdout)["services"]


def flags(service: dict) -> dict[str, str]:
    """--key=value items of a service's command."""
    return dict(item.partition("=")[::2] for item in service["command"] if item.startswith("--"))


def mounts(service: dict) -> dict[str, str]:
    """target -> source of a service's volumes (short syntax of compose v1, long of v2)."""
    out = {}
    for volume in service["volumes"]:
        if isinstance(volume, dict):
            out[volume["target"]] = str(volume["source"])
        else:
            source, target = volume.split(":")[:2]
            out[target] = source
    return out


def check_supernode(node: dict, superlink: str) -> None:
    f = flags(node)
    assert node["image"] == f"flwr/supernode:{FLWR_VERSION}"
    assert f["--superlink"] == superlink and f["--isolation"] == "process"
    assert f["--root-certificates"] == "certs/ca.crt" and "--insecure" not in f
    assert f["--auth-supernode-private-key"] == "keys/node"
    assert {"/app/certs/ca.crt", "/app/keys/node"} <= set(mounts(node))


def check_clientapp(exec_: dict, supernode: str, data_mount: str) -> None:
    assert flags(exec_)["--runtime-api-address"] == f"{supernode}:9094"
    assert exec_["build"]["dockerfile"] == "docker/superexec.Dockerfile"
    assert exec_["build"]["args"]["FLWR_VERSION"] == FLWR_VERSION
    devices = exec_["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    assert data_mount in mounts(exec_)


def test_server_and_local_nodes_compose():
    svc = services("docker-compose.yml", {}, "--profile", "local-nodes")
    link = flags(svc["superlink"])
    assert svc["superlink"]["image"] == f"flwr/superlink:{FLWR_VERSION}"
    assert {"--enable-supernode-auth", "--disable-runtime-dependency-installation"} <= set(link)
    assert link["--ssl-certfile"] == "certs/server.pem" and link["--isolation"] == "process"
    assert "--insecure" not in link
    server = flags(svc["superexec-serverapp"])
    assert server["--runtime-api-address"] == "superlink:8000"
    assert server["--root-certificates"] == "certs/ca.crt"
    for k in (0, 1):
        node = svc[f"supernode-{k}"]
        check_supernode(node, "superlink:8000")
        assert flags(node)["--node-config"] == f"partition-id={k} num-partitions=2"
        assert mounts(node)["/app/keys/node"] == f"{ROOT}/certs/node{k}"
        check_clientapp(svc[f"superexec-clientapp-{k}"], f"supernode-{k}", "/app/data")


def test_edge_compose_joins_a_remote_superlink_with_own_images():
    svc = services("docker-compose.edge.yml", EDGE_ENV)
    check_supernode(svc["supernode"], "server.example.org:8000")
    node_config = flags(svc["supernode"])["--node-config"]
    assert node_config == "partition-id=7 data-path='/app/node-data'"
    check_clientapp(svc["superexec-clientapp"], "supernode", "/app/node-data")
    assert mounts(svc["superexec-clientapp"])["/app/node-data"] == "/srv"


def test_edge_compose_needs_the_superlink_address():
    proc = compose_config(
        "docker-compose.edge.yml", {k: v for k, v in EDGE_ENV.items() if k != "SUPERLINK_ADDRESS"}
    )
    assert proc.returncode != 0 and "set SUPERLINK_ADDRESS" in proc.stderr


def test_dockerfile_builds_on_the_pinned_superexec_image():
    text = (ROOT / "docker" / "superexec.Dockerfile").read_text()
    assert re.search(r"^ARG FLWR_VERSION=(\S+)$", text, re.M).group(1) == FLWR_VERSION
    assert re.search(r"^FROM flwr/superexec:\$\{FLWR_VERSION\}$", text, re.M)
    for folder in ("server_app", "client_app", "strategies", "tasks", "ssfl"):
        assert f"!{folder}" in (ROOT / ".dockerignore").read_text()

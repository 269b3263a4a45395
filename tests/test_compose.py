"""The compose files and the Dockerfile: valid for ``docker compose config``, one image at the
pinned Flower version for every service, TLS and node authentication on every link to the
SuperLink, CPU by default and a GPU per client only with the GPU override files.

No Docker engine is needed; CI installs the compose client (.ci/run) and fails without it.
tests/test_compose_e2e.py runs the containers for real.
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
IMAGE = f"ssfl:{FLWR_VERSION}"
USER_ENV = {"SSFL_UID": "1000", "SSFL_GID": "1001"}
EDGE_ENV = {
    **USER_ENV,
    "SUPERLINK_ADDRESS": "server.example.org:8000",
    "NODE_ID": "7",
    "NODE_DATA_DIR": "/srv",
}
GPU = [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]


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


def compose_config(
    files: list[str], env: dict[str, str], *extra: str
) -> subprocess.CompletedProcess:
    cmd = [*compose_command(), *(arg for f in files for arg in ("-f", f)), *extra, "config"]
    full_env = {k: v for k, v in os.environ.items() if k not in EDGE_ENV} | env
    return subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=120)


def services(files: list[str], env: dict[str, str], *extra: str) -> dict:
    proc = compose_config(files, env, *extra)
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


def check_common(service: dict, entrypoint: str) -> None:
    """The one image, run as the host user, with the Flower command of its role."""
    assert service["image"] == IMAGE and service["user"] == "1000:1001"
    assert service["entrypoint"] in ([entrypoint], entrypoint)


def check_supernode(node: dict, superlink: str) -> None:
    check_common(node, "flower-supernode")
    f = flags(node)
    assert f["--superlink"] == superlink and f["--isolation"] == "process"
    assert f["--root-certificates"] == "certs/ca.crt" and "--insecure" not in f
    assert f["--auth-supernode-private-key"] == "keys/node"
    assert {"/app/certs/ca.crt", "/app/keys/node"} <= set(mounts(node))


def check_clientapp(exec_: dict, supernode: str, data_mount: str) -> None:
    check_common(exec_, "flower-superexec")
    assert flags(exec_)["--runtime-api-address"] == f"{supernode}:9094"
    assert exec_["environment"]["OMP_NUM_THREADS"] == "1"
    assert "deploy" not in exec_  # CPU unless a GPU override file is added
    assert data_mount in mounts(exec_)


def test_server_and_local_nodes_compose_runs_on_cpu():
    svc = services(["docker-compose.yml"], USER_ENV, "--profile", "local-nodes")
    check_common(svc["superlink"], "flower-superlink")
    assert svc["superlink"]["build"]["dockerfile"] == "docker/Dockerfile"
    link = flags(svc["superlink"])
    assert {"--enable-supernode-auth", "--disable-runtime-dependency-installation"} <= set(link)
    assert link["--ssl-certfile"] == "certs/server.pem" and link["--isolation"] == "process"
    assert "--insecure" not in link
    check_common(svc["superexec-serverapp"], "flower-superexec")
    server = flags(svc["superexec-serverapp"])
    assert server["--runtime-api-address"] == "superlink:8000"
    assert server["--root-certificates"] == "certs/ca.crt"
    assert "/app/runs" in mounts(svc["superexec-serverapp"])
    for k in (0, 1):
        node = svc[f"supernode-{k}"]
        check_supernode(node, "superlink:8000")
        assert flags(node)["--node-config"] == (
            f"partition-id={k} num-partitions=2 state-path='/app/node-state'"
        )
        assert mounts(node)["/app/keys/node"] == f"{ROOT}/certs/node{k}"
        check_clientapp(svc[f"superexec-clientapp-{k}"], f"supernode-{k}", "/app/data")
        # Its client state on a volume of its own: a resumed run or a re-created container
        # goes on from it (FedSEAL's self-ensemble, kept momentum).
        assert mounts(svc[f"superexec-clientapp-{k}"])["/app/node-state"] == f"node-state-{k}"


def test_gpu_override_gives_each_client_a_gpu():
    files = ["docker-compose.yml", "docker-compose.gpu.yml"]
    svc = services(files, USER_ENV, "--profile", "local-nodes")
    for k in (0, 1):
        assert (
            svc[f"superexec-clientapp-{k}"]["deploy"]["resources"]["reservations"]["devices"] == GPU
        )
    assert "deploy" not in svc["superlink"] and "deploy" not in svc["supernode-0"]
    edge = services(["docker-compose.edge.yml", "docker-compose.edge-gpu.yml"], EDGE_ENV)
    assert edge["superexec-clientapp"]["deploy"]["resources"]["reservations"]["devices"] == GPU


def test_edge_compose_joins_a_remote_superlink_with_own_images():
    svc = services(["docker-compose.edge.yml"], EDGE_ENV)
    assert set(svc) == {"supernode", "superexec-clientapp"}
    check_supernode(svc["supernode"], "server.example.org:8000")
    node_config = flags(svc["supernode"])["--node-config"]
    assert node_config == "partition-id=7 data-path='/app/node-data' state-path='/app/node-state'"
    check_clientapp(svc["superexec-clientapp"], "supernode", "/app/node-data")
    assert mounts(svc["superexec-clientapp"])["/app/node-data"] == "/srv"
    # The client state outlives the container: a named volume, writable by any uid.
    assert mounts(svc["superexec-clientapp"])["/app/node-state"] == "node-state"
    assert "RUN mkdir -m 1777 /app/node-state" in (ROOT / "docker" / "Dockerfile").read_text()
    assert all("build" not in s for s in svc.values())  # the image only, loaded from an archive


@pytest.mark.parametrize(
    ("files", "missing", "message"),
    [
        (["docker-compose.edge.yml"], "SUPERLINK_ADDRESS", "set SUPERLINK_ADDRESS"),
        (["docker-compose.edge.yml"], "SSFL_UID", "export SSFL_UID and SSFL_GID"),
        (["docker-compose.yml"], "SSFL_UID", "export SSFL_UID and SSFL_GID"),
    ],
)
def test_compose_names_what_is_missing(files, missing, message):
    proc = compose_config(files, {k: v for k, v in EDGE_ENV.items() if k != missing})
    assert proc.returncode != 0 and message in proc.stderr


def test_dockerfile_installs_only_from_the_wheelhouse():
    text = (ROOT / "docker" / "Dockerfile").read_text()
    assert re.search(r"^ARG BASE=python:3\.11-slim-bookworm$", text, re.M)
    assert re.search(r"^FROM \$\{BASE\} AS deps$", text, re.M)
    installs = re.findall(r"pip install[^\n]*", text)
    assert installs and all("--no-index" in line for line in installs)
    ignore = (ROOT / ".dockerignore").read_text()
    for folder in ("server_app", "client_app", "strategies", "tasks", "ssfl", "docker/wheels"):
        assert f"!{folder}\n" in ignore


def test_docs_hold_the_edge_steps_the_e2e_script_runs():
    docs = (ROOT / "docs" / "deployment.md").read_text()
    script = (ROOT / "scripts" / "compose-e2e.sh").read_text()
    for marker in ("edge-prepare", "edge-start"):
        block = re.search(rf"<!-- {marker} -->\n```bash\n(.*?)```", docs, re.S)
        assert block, marker
        assert f"doc_block {marker}" in script
    assert "docker compose -f docker-compose.edge.yml up -d" in docs

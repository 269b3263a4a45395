"""``ssfl run --ray-address``: the simulation on an existing Ray cluster of two nodes.

The cluster is Ray's own multi-node-on-one-host support (``ray.cluster_utils.Cluster``), one
CPU a node, so the run's two client actors must land on different nodes; an actor is a
child process of its node's raylet, which tells the nodes apart on one host.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import yaml
from ray.cluster_utils import Cluster

from ssfl.cli import main
from tests.conftest import ROOT
from tests.harness import processes, ssfl_run

pytestmark = [pytest.mark.e2e, pytest.mark.process]


def actor_parents(proc: subprocess.Popen, timeout: float = 600) -> set[int]:
    """The parent pids of every client actor on the machine seen while ``proc`` runs
    (polled; other runs' actors have other parents)."""
    parents, deadline = set(), time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        parents |= {ppid for _, ppid, cmd in processes() if cmd.startswith("ray::ClientAppActor")}
        time.sleep(0.2)
    return parents


def raylets(cluster: Cluster) -> set[int]:
    """The pids of the cluster's raylets, one per node."""
    nodes = [cluster.head_node, *cluster.worker_nodes]
    return {info.process.pid for node in nodes for info in node.all_processes["raylet"]}


def test_two_ray_nodes_run_the_clients_with_the_results_of_one(tmp_path, synthetic_raw):
    exp = tmp_path / "exp.yaml"
    raw = {**synthetic_raw, "split": {**synthetic_raw["split"], "num_clients": 2}}
    exp.write_text(yaml.safe_dump(raw))
    single = ssfl_run(exp, tmp_path / "single", "--quiet")
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False}
    )
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        nodes = raylets(cluster)
        out = tmp_path / "two-nodes"
        cmd = [sys.executable, "-m", "ssfl.cli", "run", str(exp), "--out", str(out), "--quiet"]
        with open(tmp_path / "stderr.log", "w") as err:
            proc = subprocess.Popen([*cmd, "--ray-address", cluster.address], cwd=ROOT, stderr=err)
            parents = actor_parents(proc)
        assert proc.wait(timeout=60) == 0, (tmp_path / "stderr.log").read_text()[-3000:]
    finally:
        cluster.shutdown()
    assert len(nodes) == 2 and parents & nodes == nodes  # actors under both nodes' raylets
    two = json.loads((out / "results.json").read_text())
    assert [r["test_accuracy"] for r in two["rounds"]] == [
        r["test_accuracy"] for r in single["rounds"]
    ]
    assert two["final_test_accuracy"] == single["final_test_accuracy"]


@pytest.mark.parametrize(
    "address, message",
    [("localhost", "expected HOST:PORT"), ("127.0.0.1:1", "no Ray head answers there")],
)
def test_a_bad_ray_address_exits_2_with_one_line(tmp_path, synthetic_raw, capsys, address, message):
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump(synthetic_raw))
    argv = ["run", str(exp), "--out", str(tmp_path / "out"), "--ray-address", address]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ssfl: error: --ray-address {address}") and message in err
    assert err.count("\n") == 1

"""Real deployment on loopback (``ssfl deploy-local``): certificates, node keys, refusals,
the same numbers as ``ssfl run``, a node that fails on its own, and a SuperNode killed and
restarted mid-run."""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_ssh_private_key
from flwr.cli.supernode.register import try_load_public_key
from flwr.common.config import parse_config_args

from ssfl.certs import main as certs_main
from ssfl.certs import make_certificates, make_node_key
from ssfl.cli import parse_node_data
from ssfl.deploy import SUPERLINK, LocalDeployment, last_error, node_config
from ssfl.experiment import resolve_config
from ssfl.registry import settings_of
from ssfl.runner import RunFailed, submit_run, write_resolved
from tasks.config import ConfigError
from tests.conftest import ROOT


def test_server_certificate_is_signed_by_the_ca_for_the_given_hosts(tmp_path):
    paths = make_certificates(tmp_path, ["superlink", "10.0.0.5"])
    ca = x509.load_pem_x509_certificate(paths["ca"].read_bytes())
    cert = x509.load_pem_x509_certificate(paths["cert"].read_bytes())
    ca.public_key().verify(
        cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(cert.signature_hash_algorithm)
    )
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["superlink", "localhost"]
    assert san.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("10.0.0.5"),
        ipaddress.ip_address("127.0.0.1"),
    ]
    assert paths["key"].stat().st_mode & 0o077 == 0 and paths["ca_key"].stat().st_mode & 0o077 == 0


def test_node_key_pair_is_what_flower_loads(tmp_path):
    private, public = make_node_key(tmp_path, "node3")
    key = load_ssh_private_key(private.read_bytes(), None)  # as flower-supernode loads it
    assert isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp384r1"
    assert public.read_text().startswith("ecdsa-sha2-nistp384 ")
    assert len(try_load_public_key(public)) > 0  # as `flwr supernode register` loads it
    assert private.stat().st_mode & 0o077 == 0


def test_certs_command_makes_only_an_edge_nodes_key_pair(tmp_path, capsys):
    assert certs_main([str(tmp_path), "--node-key", "node"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["node", "node.pub"]
    assert load_ssh_private_key((tmp_path / "node").read_bytes(), None).curve.name == "secp384r1"
    with pytest.raises(SystemExit) as exit_info:
        certs_main([str(tmp_path), "--node-key", "node", "--nodes", "2"])
    assert exit_info.value.code == 2
    assert "--node-key makes one key pair only" in capsys.readouterr().err


def test_node_config_round_trips_through_flowers_parser():
    assert parse_config_args([node_config(1, 2)]) == {"partition-id": 1, "num-partitions": 2}
    parsed = parse_config_args([node_config(0, 2, "/data/my images")])
    assert parsed == {"partition-id": 0, "num-partitions": 2, "data-path": "/data/my images"}
    parsed = parse_config_args([node_config(1, 2, state_path="/srv/state")])
    assert parsed == {"partition-id": 1, "num-partitions": 2, "state-path": "/srv/state"}


def test_node_data_option(tmp_path):
    assert parse_node_data([f"1={tmp_path}"], 2) == {1: str(tmp_path)}
    for bad in ("1", f"x={tmp_path}", "0="):
        with pytest.raises(ConfigError, match="NODE=FOLDER"):
            parse_node_data([bad], 2)
    with pytest.raises(ConfigError, match=r"node 2 not in 0\.\.1"):
        parse_node_data([f"2={tmp_path}"], 2)


def test_last_error_is_flowers_exit_message(tmp_path):
    log = tmp_path / "n.log"
    log.write_text(
        "INFO : start\n\x1b[91mERROR \x1b[0m: Exit Code: 305\nFailed to connect.\n"
        "[code: 2004] Failed to activate SuperNode.\n\nFor more information, visit: x\n"
    )
    assert (
        last_error(log)
        == f": Failed to connect. [code: 2004] Failed to activate SuperNode. ({log})"
    )
    log.write_text("INFO : start\nERROR : bad thing\n")
    assert last_error(log) == f": bad thing ({log})"


# ----- End-to-end: real SuperLink, SuperNodes and SuperExecs ---------------------------


@pytest.fixture
def two_node_experiment(tmp_path, synthetic_raw) -> Path:
    """2 nodes, 2 rounds, clients that really train (threshold low enough to keep labels)."""
    raw = {
        **synthetic_raw,
        "dataset": {
            **synthetic_raw["dataset"],
            "synthetic_train_size": 600,
            "synthetic_test_size": 200,
        },
        "split": {**synthetic_raw["split"], "num_clients": 2, "test_size": 200},
        "server": {"bootstrap_epochs": 3, "epochs": 1},
        "algo": {"threshold": 0.3},
    }
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def ssfl(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "ssfl.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=900)


@pytest.mark.e2e
def test_deploy_local_gives_the_numbers_of_ssfl_run(two_node_experiment, tmp_path):
    common = (str(two_node_experiment), "--nodes", "2", "--rounds", "2", "--quiet")
    started = time.monotonic()
    deployed = ssfl("deploy-local", *common, "--out", str(tmp_path / "deploy"))
    seconds = time.monotonic() - started
    assert deployed.returncode == 0, deployed.stderr[-3000:]
    assert seconds < 180, f"deploy-local took {seconds:.0f}s"
    logs = tmp_path / "deploy" / "logs"
    assert "Uvicorn running on https://127.0.0.1" in (logs / "superlink.log").read_text()
    assert (logs / "superlink.log").read_text().count("[Fleet.ActivateNode] Activated") == 2
    for k in (0, 1):  # each node's ClientApps ran in its own SuperExec
        assert (
            "Start `flwr-clientapp` process" in (logs / f"superexec-supernode-{k}.log").read_text()
        )
    simulated = ssfl("run", *common, "--out", str(tmp_path / "sim"))
    assert simulated.returncode == 0, simulated.stderr[-3000:]
    dep, sim = (json.loads((tmp_path / d / "results.json").read_text()) for d in ("deploy", "sim"))
    assert [r["clients"] for r in dep["rounds"]] == [2, 2] and dep["rounds"][0]["mask_rate"] > 0
    for key in ("test_accuracy", "test_loss", "train_loss", "mask_rate", "bytes_c2s"):
        assert [r[key] for r in dep["rounds"]] == [r[key] for r in sim["rounds"]], key
    assert f"{dep['final_test_accuracy']:.4f}" == f"{sim['final_test_accuracy']:.4f}"


@pytest.mark.e2e
def test_node_with_missing_data_folder_fails_alone(two_node_experiment, tmp_path):
    missing = tmp_path / "no-such-folder"
    out = tmp_path / "deploy"
    proc = ssfl(
        "deploy-local",
        str(two_node_experiment),
        *("--nodes", "2", "--rounds", "1", "--quiet"),
        *("--node-data", f"1={missing}", "--out", str(out)),
    )
    assert proc.returncode == 1 and "nodes [1] failed their work" in proc.stderr
    row = json.loads((out / "results.json").read_text())["rounds"][0]
    assert row["clients"] == 1 and row["failures"] == 1 and row["failed_partitions"] == [1]
    assert f"data-path '{missing}': no such folder" in (out / "flower.log").read_text()
    node_log = (out / "logs" / "superexec-supernode-1.log").read_text()
    assert f"ConfigError: data-path '{missing}': no such folder" in node_log


@pytest.mark.e2e
def test_a_run_whose_clients_all_fail_stops_with_exit_1_and_one_line(two_node_experiment, tmp_path):
    """Every node's own folder holds a file that is no image: no config check can know it,
    every client fails every round, and federation.max_failed_rounds (3) stops the run."""
    node_data = []
    for k in (0, 1):
        folder = tmp_path / f"node{k}"
        folder.mkdir()
        (folder / "broken.png").write_bytes(b"not a PNG")
        node_data += ["--node-data", f"{k}={folder}"]
    out = tmp_path / "deploy"
    proc = ssfl(
        "deploy-local",
        str(two_node_experiment),
        *("--nodes", "2", "--rounds", "6", "--quiet", *node_data, "--out", str(out)),
    )
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    prefix = "ssfl: deployment failed: "
    assert last.startswith(f"{prefix}no client update accepted in 3 rounds in a row")
    assert last.count("ConfigError: data-path") == 2  # each client's cause
    res = json.loads((out / "results.json").read_text())
    assert res["status"] == "failed" and [r["round"] for r in res["rounds"]] == [1, 2, 3]
    assert [r["failures"] for r in res["rounds"]] == [2, 2, 2]
    assert res["failure"] == last.removeprefix(prefix)


@pytest.mark.e2e
def test_unregistered_or_untrusting_node_is_refused(tmp_path):
    home = Path(tempfile.mkdtemp(prefix="ssfl-test-deploy-"))
    deployment = LocalDeployment.create(home, tmp_path / "logs")
    try:
        deployment.start_superlink()
        (registered, public), (unregistered, _) = (
            make_node_key(home / "keys", name) for name in ("node0", "node1")
        )
        deployment.register([public])
        deployment.start_node("good", registered, node_config(0, 1), threads=1)
        link_log = tmp_path / "logs" / "superlink.log"
        deadline = time.monotonic() + 180
        while "[Fleet.ActivateNode] Activated" not in link_log.read_text():
            assert time.monotonic() < deadline, "the registered node never came online"
            time.sleep(1)
        deployment.start_node("unregistered", unregistered, node_config(1, 3), threads=1)
        other_ca = make_certificates(home / "other")["ca"]
        deployment.start_node("untrusting", registered, node_config(2, 3), 1, ca=other_ca)
        assert deployment.processes["unregistered"].wait(timeout=180) != 0
        assert deployment.processes["untrusting"].wait(timeout=180) != 0
        assert deployment.processes["good"].poll() is None
        with pytest.raises(RunFailed) as err:
            deployment.check_alive()
        msg = str(err.value)
        assert "unregistered exited" in msg and "Failed to activate SuperNode" in msg
        assert "untrusting exited" in msg and "CERTIFICATE_VERIFY_FAILED" in msg
        text = link_log.read_text()
        assert "No SuperNode found with the given public key" in text
        assert text.count("[Fleet.ActivateNode] Activated") == 1
    finally:
        deployment.stop()
        shutil.rmtree(home, ignore_errors=True)
    assert all(p.poll() is not None for p in deployment.processes.values())


def rows_so_far(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    text = path.read_text() if path.is_file() else ""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def wait_for_round(out: Path, rnd: int, runner: threading.Thread, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while len(rows_so_far(out)) < rnd:
        assert runner.is_alive() and time.monotonic() < deadline, f"round {rnd} never came"
        time.sleep(0.5)


@pytest.mark.e2e
def test_a_killed_supernode_fails_its_rounds_and_is_used_again_once_restarted(
    tmp_path, synthetic_raw
):
    """3 nodes, FedSEAL; node 2 SIGKILLed after round 1: its rounds fail (once the SuperLink
    finds it offline, 2 missed heartbeats of 30 s, not timeout_s) and the run goes on; once
    round 2 is recorded it is restarted with the same key and node-config, takes its
    self-ensemble back from its state-path and trains again."""
    raw = {**synthetic_raw, "method": "fedseal", "rounds": 4, "client": {"batch_size": 64}}
    cfg = resolve_config({**raw, "federation": {"timeout_s": 600}})
    out = tmp_path / "out"
    exp = write_resolved(settings_of(cfg), out)
    home = Path(tempfile.mkdtemp(prefix="ssfl-test-fault-"))
    deployment = LocalDeployment.create(home, out / "logs")
    try:
        deployment.start_superlink()
        keys = [make_node_key(home / "keys", f"node{k}") for k in range(3)]
        deployment.register([public for _, public in keys])
        configs = [node_config(k, 3, state_path=str(out / "client-state")) for k in range(3)]
        for k, (private, _) in enumerate(keys):
            deployment.start_node(f"supernode-{k}", private, configs[k], threads=1)
        results: dict = {}
        runner = threading.Thread(
            target=lambda: results.update(submit_run(SUPERLINK, deployment.env, exp, out))
        )
        runner.start()
        wait_for_round(out, 1, runner)
        for name in ("supernode-2", "superexec-supernode-2"):
            os.killpg(deployment.processes[name].pid, signal.SIGKILL)
        wait_for_round(out, 2, runner)
        deployment.start_node("supernode-2", keys[2][0], configs[2], threads=1)
        runner.join(timeout=900)
    finally:
        deployment.stop()
        shutil.rmtree(home, ignore_errors=True)
    rows = results["rounds"]
    assert [r["round"] for r in rows] == [1, 2, 3, 4] and results["status"] == "completed"
    assert rows[1]["failed_partitions"] == [2] and rows[1]["clients"] == 2
    assert rows[1]["seconds"] < 300  # found offline, not waited for until timeout_s (600 s)
    assert rows[-1]["clients"] == 3 and rows[-1]["failures"] == 0
    # Node 2's ensemble counts its round 1 (restored from its state-path) and its rounds
    # after the restart; the others count every round.
    trained_again = sum(r["failures"] == 0 for r in rows[2:])
    assert 3 * rows[-1]["ensemble_size"] == pytest.approx(2 * 4 + 1 + trained_again)

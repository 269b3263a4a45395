"""An in-process Grid for tests: the real ClientApp handlers, no Ray, no SuperLink.

Replies come back in a shuffled order (seeded per grid; the strategy must sort them),
and chosen partitions fail the way a crashing ClientApp does in Flower: an error reply.
``node_data`` gives chosen nodes a ``data-path`` (their own image folder) in node-config;
``state_path`` gives every node a ``state-path`` (its persisted context.state).
"""

from __future__ import annotations

import contextlib
import io
import json
import random
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from flwr.app import Context, Error, Message, MessageType, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from client_app import app as client_app
from ssfl.cli import main
from ssfl.experiment import resolve_config
from ssfl.registry import method, settings_of
from strategies.loop import RoundLoop
from strategies.parts import ServerSide
from tasks.partition import get_split
from tasks.settings import Settings
from tests.conftest import ROOT


class InProcessGrid:
    def __init__(
        self,
        num_nodes: int,
        fail_partitions: Iterable[int] = (),
        node_data: Mapping[int, str] | None = None,
        order_seed: int = 0,
        state_path: str = "",
    ):
        TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
        self.partition = {7000 + 13 * i: i for i in range(num_nodes)}
        self.fail = set(fail_partitions)
        self.order = random.Random(order_seed)
        self.contexts = {
            nid: Context(
                run_id=1,
                node_id=nid,
                state=RecordDict(),
                run_config={},
                node_config={
                    "partition-id": pid,
                    "num-partitions": num_nodes,
                    **({"data-path": node_data[pid]} if pid in (node_data or {}) else {}),
                    **({"state-path": state_path} if state_path else {}),
                },
            )
            for nid, pid in self.partition.items()
        }
        self.sent: list[Message] = []
        self.replies: list[Message] = []  # every reply, in the order the handlers ran

    def get_node_ids(self) -> list[int]:
        return list(self.partition)

    def handle(self, msg: Message) -> Message:
        nid = msg.metadata.dst_node_id
        handler = (
            client_app.query if msg.metadata.message_type == MessageType.QUERY else client_app.train
        )
        try:
            if self.partition[nid] in self.fail and msg.metadata.message_type == MessageType.TRAIN:
                raise RuntimeError(f"injected failure of partition {self.partition[nid]}")
            return handler(msg, self.contexts[nid])
        except Exception as err:  # what Flower does with a ClientApp exception
            return Message(Error(code=1, reason=f"{type(err).__name__}: {err}"), reply_to=msg)

    def send_and_receive(self, messages: Iterable[Message], timeout: float | None = None):
        messages = list(messages)
        self.sent.extend(messages)
        replies = [self.handle(m) for m in messages]
        self.order.shuffle(replies)
        self.replies.extend(replies)
        return replies


def build_strategy(raw: Mapping[str, Any], on_round=None) -> RoundLoop:
    """A method's server half on CPU for a raw experiment mapping (resolved here)."""
    return strategy_of(settings_of(resolve_config(raw)), on_round)


def strategy_of(settings: Settings, on_round=None) -> RoundLoop:
    """A method's server half on CPU for checked settings."""
    ds, split = get_split(settings)
    server = ServerSide.build(settings, ds, split, torch.device("cpu"))
    return method(settings.method).server_half().strategy(server, on_round or (lambda row: None))


def run_method(raw: Mapping[str, Any], grid: InProcessGrid) -> tuple[list[dict], RoundLoop]:
    """Run an experiment through ``grid``: (its rows, its strategy)."""
    rows: list[dict] = []
    strategy = build_strategy(raw, rows.append)
    strategy.start(grid, num_rounds=strategy.settings.rounds)
    return rows, strategy


# Tiny experiments shared by the run tests: four rounds of one batch on synthetic data.
# Per method, what makes its cross-round state matter within 4 rounds.
METHOD_SETTINGS: dict[str, dict] = {
    "fedmatch": {"algo": {"helper_interval": 3, "num_helpers": 1}},
    "fedrgd": {"server": {"bootstrap_epochs": 0, "epochs": 0, "local_steps": 1}},
    "fedavg_with_server": {"server": {"bootstrap_epochs": 0, "epochs": 0, "local_steps": 1}},
    "fedsup": {"eval": {"protocol_every": 3, "finetune_epochs": 1, "linear_epochs": 1}},
    "fedseal": {"client": {"keep_momentum": True}, "server": {"keep_momentum": True}},
    # Open world: labels at the clients, global centroids and L_ce from round 1, FedRep heads.
    "fedossl": {
        "split": {"labeled_per_class": 0, "val_size": 0, "samples_per_class": 8},
        "server": {"bootstrap_epochs": 0, "epochs": 0, "batch_size": 32},
        "algo": {
            "cluster_from_round": 1,
            "ce_from_round": 1,
            "calibration_threshold": 0.3,
            "local_centroids": 4,
            "centroid_samples": 8,
            "server_cluster_steps": 5,
            "personal": "head",
        },
    },
}
STEP_METHODS = ("fedrgd", "fedavg_with_server")  # rounds of T steps (SSFL benchmark eq. 2)


def tiny_raw(method: str) -> dict:
    """Four rounds of one batch on synthetic data, 2 of 3 clients sampled a round."""
    raw = {
        "method": method,
        "rounds": 4,
        "dataset": {"name": "synthetic28", "synthetic_train_size": 300, "synthetic_test_size": 40},
        "split": {
            "labeled_per_class": 2,
            "val_size": 20,
            "test_size": 40,
            "num_clients": 3,
            "client_size": 16,
        },
        "server": {"bootstrap_epochs": 1, "epochs": 1, "batch_size": 20},
        "client": {"batch_size": 16, **({"local_steps": 1} if method in STEP_METHODS else {})},
        "federation": {"clients_per_round": 2},
    }
    for key, values in METHOD_SETTINGS.get(method, {}).items():
        raw[key] = {**raw.get(key, {}), **values}
    return raw


def without_seconds(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "seconds"} for row in rows]


# The ssfl command as a user runs it, and the processes it leaves (read from /proc).
def cli(*args: str) -> tuple[int, list[str]]:
    """``ssfl`` in this process: exit code and stderr lines."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, err.getvalue().strip().splitlines()


def ssfl_run(experiment, out, *args):
    cmd = [sys.executable, "-m", "ssfl.cli", "run", str(experiment), "--out", str(out), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "results.json").read_text())


def processes() -> list[tuple[int, int, str]]:
    """(pid, parent pid, command line) of every process, from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_text()
        except (OSError, ValueError, IndexError):
            continue
        found.append((int(entry.name), ppid, cmdline))
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ssfl.cli", "run", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


def everyday_sample(cases: list[tuple], per_method: int = 1) -> list:
    """An option walk's cases: the first ``per_method`` of each method (cases start with the
    method's name) stay in the everyday tier, the others are marked slow (run by --all)."""
    seen: dict[str, int] = {}
    out = []
    for case in cases:
        seen[case[0]] = seen.get(case[0], 0) + 1
        marks = () if seen[case[0]] <= per_method else (pytest.mark.slow,)
        out.append(pytest.param(*case, marks=marks))
    return out


def everyday_first(cases: list, keep: int = 1) -> list:
    """The first ``keep`` of a parametrized test's cases stay in the everyday tier, the
    others are marked slow (run by --all)."""
    return [
        pytest.param(
            *(c if isinstance(c, tuple) else (c,)), marks=() if i < keep else pytest.mark.slow
        )
        for i, c in enumerate(cases)
    ]

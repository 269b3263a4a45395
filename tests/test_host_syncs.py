"""tasks/syncs.py's counter on hand-made tensor code, and benchmarks/host_syncs.py on two
methods (its JSON and table, its one-line refusals)."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from benchmarks.host_syncs import main
from tasks.syncs import SyncCounter

pytestmark = pytest.mark.usefixtures("one_thread")


def counted(code: Callable[[torch.Tensor], Any]) -> SyncCounter:
    """The counter after ``code`` ran on a small tensor with positive and negative values."""
    x = torch.tensor([1.0, -2.0, 3.0, -4.0, 5.0], requires_grad=True)
    with SyncCounter() as counter:
        code(x)
    return counter


def branch(x: torch.Tensor) -> int:
    if x.sum() > 0:  # a Python if on a tensor
        return 1
    return 0


def masked_write(x: torch.Tensor) -> None:
    y = x.detach().clone()
    y[y > 0] = 0.0


def repeated(x: torch.Tensor) -> torch.Tensor:
    return torch.repeat_interleave(x, torch.ones(len(x), dtype=torch.long))


SYNCS = [
    pytest.param(lambda x: x[x > 0], "aten.index", id="bool-index"),
    pytest.param(masked_write, "aten.index_put_", id="bool-index-write"),
    pytest.param(lambda x: x.sum().item(), "aten._local_scalar_dense", id="item"),
    pytest.param(lambda x: float(x.detach().sum()), "aten._local_scalar_dense", id="float"),
    pytest.param(lambda x: bool((x > 0).any()), "aten._local_scalar_dense", id="bool"),
    pytest.param(branch, "aten._local_scalar_dense", id="python-if"),
    pytest.param(lambda x: torch.nonzero(x), "aten.nonzero", id="nonzero"),
    pytest.param(lambda x: torch.where(x > 0), "aten.nonzero", id="where-one-argument"),
    pytest.param(lambda x: torch.masked_select(x, x > 0), "aten.masked_select", id="select"),
    pytest.param(lambda x: torch.unique(x), "aten._unique2", id="unique"),
    pytest.param(repeated, "aten.repeat_interleave", id="repeat-interleave"),
    pytest.param(lambda x: F.one_hot(x.long().abs()), "aten._local_scalar_dense", id="one-hot"),
]


@pytest.mark.parametrize("code, op", SYNCS)
def test_each_sync_counts_once_under_its_op(code, op):
    counter = counted(code)
    assert counter.counts == {op: 1} and counter.total == 1


def test_arithmetic_where_integer_indexing_and_their_backward_count_nothing():
    def code(x: torch.Tensor) -> None:
        y = torch.where(x > 0, x, 0.0) * 2 + x.exp()
        y = y[torch.tensor([0, 2])] + x.clamp(min=0).sum()
        z = torch.repeat_interleave(x, torch.ones(5, dtype=torch.long), output_size=5)
        (y.sum() + z.sum() + F.one_hot(torch.tensor([0, 2]), 3).sum()).backward()

    assert counted(code).total == 0  # one_hot's range check is the CPU kernel's alone


def test_a_masks_backward_syncs_too_and_host_copies_are_counted_apart():
    def code(x: torch.Tensor) -> None:
        x[x > 0].sum().backward()  # the mask again in index_put of the backward
        x.detach().tolist()
        x.detach().cpu()

    counter = counted(code)
    assert counter.counts == {"aten.index": 1, "aten.index_put": 1}
    assert counter.host_copies == {"Tensor.tolist": 1, "Tensor.cpu": 1}


def test_sites_name_the_line_each_sync_comes_from():
    x = torch.arange(4.0)
    with SyncCounter(sites=True) as counter:
        torch.nonzero(x)
    line = test_sites_name_the_line_each_sync_comes_from.__code__.co_firstlineno + 3
    assert counter.sites == {("aten.nonzero", f"tests/test_host_syncs.py:{line}"): 1}


def run(*args: str) -> tuple[int, str, list[str]]:
    """``host_syncs`` in this process: exit code, stdout and stderr lines."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue().strip().splitlines()


METHODS = ("fedavg_fixmatch", "server_sl")


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> tuple[int, str, dict[str, Any]]:
    path = Path(tmp_path_factory.mktemp("host-syncs")) / "syncs.json"
    code, out, _ = run("--methods", ",".join(METHODS), "--json", str(path))
    return code, out, json.loads(path.read_text())


def test_the_script_writes_syncs_per_step_ops_and_the_host_and_a_line_per_method(report):
    code, out, data = report
    assert code == 0
    assert set(data["methods"]) == set(METHODS) and data["host"]["torch"] == torch.__version__
    for name, entry in data["methods"].items():
        assert isinstance(entry["syncs_per_step"], (int, float)) and entry["syncs_per_step"] >= 0
        assert entry["steps"] > 0 and entry["syncs_per_step"] == pytest.approx(
            entry["syncs"] / entry["steps"], abs=1e-3
        )
        assert sum(entry["ops"].values()) == entry["syncs"]
        assert sum(1 for line in out.splitlines() if line.startswith(f"{name} ")) == 1
    fixmatch = data["methods"]["fedavg_fixmatch"]
    assert fixmatch["part"] == "client" and fixmatch["steps_from"] == "local_steps"
    # By default the engine a GPU's `auto` runs: no sync inside the steps, the loss read once.
    assert data["engine"] == "batched" and fixmatch["syncs_per_step"] <= 0.5
    assert data["methods"]["server_sl"]["part"] == "server"


def test_the_confidence_selecting_clients_sync_at_most_once_a_step(tmp_path):
    """The GPU-speed target with the batched engine: FedSEAL's D+/D- sizes are read once an
    epoch and its metrics once a round (host copies, counted apart); FedMatch's one sync a
    step is its confident samples' nonzero (by design: the forward on them alone sets
    BatchNorm's statistics); its payloads' indices are found on the host copies. FedoSSL's
    L_ce is a masked mean and its round-start statistics (n^c, the margin, the agreement
    table) stay on the device until the round's one metrics copy."""
    path = tmp_path / "syncs.json"
    methods_arg = "fedseal,fedmatch,fedossl"
    code, _, _ = run("--methods", methods_arg, "--engine", "batched", "--json", str(path))
    methods = json.loads(path.read_text())["methods"]
    assert code == 0
    assert methods["fedseal"]["syncs_per_step"] == 0
    assert methods["fedossl"]["syncs_per_step"] == 0, methods["fedossl"]["sites"]
    assert methods["fedmatch"]["syncs_per_step"] <= 1
    assert methods["fedmatch"]["ops"] == {"aten.nonzero": methods["fedmatch"]["steps"]}


@pytest.mark.parametrize(
    "args",
    [("--methods", "fedavg_fixmatch,nope"), ("--methods", ","), ("--bogus",), ("--engine", "x")],
)
def test_a_bad_argument_or_method_is_one_line_and_exit_2(args):
    code, out, err = run(*args)
    assert code == 2 and out == "" and len(err) == 1 and err[0].startswith("host_syncs: error:")

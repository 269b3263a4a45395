"""What ``ssfl run`` hands Flower's simulation and keeps of its output."""

from __future__ import annotations

import io
from types import SimpleNamespace

from ssfl.experiment import resolve_config
from ssfl.runner import SIZE_WARNING, _copy_lines, federation_config


def test_federation_config_runs_one_supernode_per_client():
    cfg = resolve_config(
        {"split": {"num_clients": 3}, "simulation": {"num_cpus": 2, "num_gpus": 0.5}}
    )
    pairs = dict(item.split("=") for item in federation_config(cfg).split())
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
    kept = output.splitlines(keepends=True)
    del kept[1]
    assert lines == kept and log.getvalue() == "".join(kept)
    assert SIZE_WARNING not in echoed and "round 1/1" in echoed and "started run 7" in echoed

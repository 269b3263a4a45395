from __future__ import annotations

import pytest

from ssfl.experiment import resolve_config, resolve_experiment
from tasks.config import ConfigError, flatten, parse_overrides
from tests.conftest import ROOT
from tests.harness import run_cli


def test_defaults_fill_every_key_and_method_defaults_apply():
    cfg = resolve_config({"method": "fedavg_fixmatch"})
    assert cfg["algo"]["threshold"] == 0.9
    assert cfg["server"]["bootstrap_epochs"] == 20
    assert cfg["split"]["labeled_per_class"] == 50
    assert resolve_config({"method": "fedprox_sl"})["client"]["proximal_mu"] == 0.01


def test_unknown_key_names_key_and_allowed():
    with pytest.raises(ConfigError, match=r"unknown config key 'client.lrr'.*\blr\b"):
        resolve_config({"method": "server_sl", "client": {"lrr": 0.1}})


def test_algo_keys_are_per_method():
    with pytest.raises(ConfigError, match=r"unknown config key 'algo\.threshold'"):
        resolve_config({"method": "fedavg_sl", "algo": {"threshold": 0.5}})


@pytest.mark.parametrize(
    "raw, pattern",
    [
        ({"rounds": "ten"}, r"'rounds': expected int"),
        ({"client": {"lr": "fast"}}, r"'client.lr': expected float"),
        ({"dataset": {"download": 1}}, r"'dataset.download': expected bool"),
        ({"method": "fedavgg"}, r"unknown method 'fedavgg' \(allowed: .*server_sl"),
        ({"model": {"name": "vgg"}}, r"'model.name': 'vgg' is not one of .*small_cnn"),
        ({"split": {"partitioner": "zipf"}}, r"'split.partitioner'.*iid"),
        ({"dataset": {"name": "imagenet"}}, r"'dataset.name'.*fashion_mnist"),
        ({"rounds": 0}, r"'rounds': must be in \[1, 100000\], got 0$"),
        ({"split": {"target_r": 1.5}}, r"target_r"),
        ({"model": {"head_size": 5}}, r"'model.head_size': 5 outputs cannot hold the 10"),
        ({"method": "fedseal", "algo": {"theta": 1.5}}, r"'algo.theta': must be in \[0, 1\]"),
        ({"method": "fedseal", "algo": {"tau_max": -0.1}}, r"'algo.tau_max'"),
        ({"method": "fedseal", "algo": {"lambda_ramp_rounds": -1}}, r"lambda_ramp_rounds"),
        ({"method": "fedmatch", "server": {"local_steps": 4}}, r"'server.local_steps'"),
        ({"server": {"optimizer": "adam"}}, r"'server.optimizer': the server trains with sgd"),
        ({"method": "fedmatch", "client": {"optimizer": "adam"}}, r"'client.optimizer'.*fedmatch"),
        (
            {"method": "fedsup", "client": {"optimizer": "adam", "keep_momentum": True}},
            r"'client.optimizer': keep_momentum and nesterov belong to sgd",
        ),
        (
            {"method": "fedossl", "lr_schedule": {"name": "stepwise"}},
            r"'lr_schedule.name'.*multistep",
        ),
    ],
)
def test_bad_values_are_one_line_errors(raw, pattern):
    with pytest.raises(ConfigError, match=pattern) as err:
        resolve_config({"method": "server_sl", **raw})
    assert "\n" not in str(err.value)


def test_int_is_accepted_for_float_and_coerced():
    assert resolve_config({"client": {"lr": 1}})["client"]["lr"] == 1.0


def test_overrides_parse_like_yaml():
    assert parse_overrides(["client.lr=0.5", "name=x", "dataset.download=false"]) == {
        "client": {"lr": 0.5},
        "name": "x",
        "dataset": {"download": False},
    }
    assert parse_overrides("rounds=3;seed=2") == {"rounds": 3, "seed": 2}
    with pytest.raises(ConfigError, match="key=value"):
        parse_overrides(["rounds"])


def test_exponents_without_a_dot_are_floats_in_files_and_overrides(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("method: fedmatch\nalgo: {l1_threshold: 4e-5, delta: 1.0e-5}\n")
    cfg = resolve_experiment(path, sets=["client.lr=2E-3", "name=1e3x"])
    assert cfg["algo"]["l1_threshold"] == 4e-5 and cfg["algo"]["delta"] == 1e-5
    assert cfg["client"]["lr"] == 2e-3 and cfg["name"] == "1e3x"


def test_every_shipped_experiment_resolves():
    files = sorted((ROOT / "experiments").rglob("*.yaml"))
    assert len(files) >= 5
    names = [resolve_experiment(path)["name"] for path in files]
    # Each names itself (the default output folder runs/<name>-<time>), and no two alike.
    assert all(names) and len(set(names)) == len(names)


def test_flatten():
    assert flatten({"a": {"b": 1, "c": {"d": 2}}, "e": 3}) == {"a.b": 1, "a.c.d": 2, "e": 3}


SERVER_SL = str(ROOT / "experiments/fmnist-las/server_sl.yaml")


@pytest.mark.process
def test_cli_misspelled_key_exits_2_with_one_line():
    proc = run_cli(SERVER_SL, "--set", "clinet.lr=0.1")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown config key 'clinet'" in lines[0]


def test_cli_missing_experiment_exits_2():
    proc = run_cli("nope.yaml")
    assert proc.returncode == 2 and "experiment file not found" in proc.stderr


@pytest.mark.process
def test_cli_missing_data_exits_2_naming_the_folder(tmp_path):
    proc = run_cli(
        SERVER_SL, "--set", f"dataset.root={tmp_path}", "--set", "dataset.download=false"
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(tmp_path) in lines[0] and "fashion_mnist not found" in lines[0]


@pytest.mark.process
def test_cli_out_path_with_a_quote_is_refused(tmp_path):
    proc = run_cli(SERVER_SL, "--out", str(tmp_path / "it's"))
    assert proc.returncode == 2 and "single quote" in proc.stderr

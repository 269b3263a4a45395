"""Config values are checked by meaning (issue 17, item 4).

Every numeric key of every registered method's resolved config is set to -1, 0, 10^12
(as an int and as a float), NaN and a string. Each value is either refused by the config
with one line (``ConfigError``: ``ssfl run`` exits 2), or a run on tiny synthetic data
completes its round: never another exception, never a hang.
"""

from __future__ import annotations

import contextlib
import json
import math
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from ssfl.experiment import resolve_config
from ssfl.registry import METHODS, settings_of
from tasks.config import RULES, ConfigError, deep_merge, flatten
from tasks.partition import get_split
from tasks.settings import Range, keys_of, rules_of
from tests.conftest import ROOT
from tests.harness import InProcessGrid, everyday_sample, run_cli, run_method

pytestmark = pytest.mark.usefixtures("one_thread")

PROBES: tuple[Any, ...] = (-1, 0, 10**12, 1e12, math.nan, "x")

# One round on the smallest split every method accepts: no bootstrap, one server epoch,
# two clients of 16 images.
TINY: dict[str, Any] = {
    "rounds": 1,
    "dataset": {"name": "synthetic28", "synthetic_train_size": 200, "synthetic_test_size": 40},
    "split": {
        "labeled_per_class": 2,
        "val_size": 20,
        "test_size": 20,
        "num_clients": 2,
        "client_size": 16,
    },
    "model": {"norm": "none"},
    "server": {"bootstrap_epochs": 0, "epochs": 1, "batch_size": 8},
    "client": {"batch_size": 8},
    "eval": {"finetune_epochs": 1, "linear_epochs": 1},
}

# What each method needs on TINY (SGD steps instead of epochs, heads of the right width).
SETTING: dict[str, dict[str, Any]] = {
    "fedavg_with_server": {"server": {"epochs": 0, "local_steps": 1}, "client": {"local_steps": 1}},
    "fedrgd": {"server": {"epochs": 0, "local_steps": 1}, "client": {"local_steps": 1}},
    "fedavg_simclr": {"model": {"projector_dim": 8}},
    "fedavg_simsiam": {"model": {"projector_dim": 8, "predictor_dim": 8}},
    "fedavg_byol": {"model": {"projector_dim": 8, "predictor_dim": 8}},
    "fedsup": {"model": {"projector_dim": 128, "predictor_dim": 8}},
    # Open world: labels at the clients, no server training; 8 images a class.
    "fedossl": {
        "split": {"labeled_per_class": 0, "val_size": 0, "samples_per_class": 8},
        "server": {"epochs": 0, "batch_size": 32},
        "algo": {"local_centroids": 4, "centroid_samples": 8, "server_cluster_steps": 5},
    },
}

# Keys of DEFAULTS that no method overrides are read by the shared code (the split, the
# model, the server's SGD, the client's SGD in client_app/base.py, the round loop and the
# evaluation), the same for every method: their accepted values run under one method with
# clients, a server and the evaluation protocols. Every key a method declares in its own
# defaults or rules runs under that method, and so does every shared key its own code
# reads (READS: each client half counts its round and batches; FedSEAL's thresholds come
# from the validation set).
REFERENCE = "fedavg_fixmatch"
CLIENT_ROUND = {"client.epochs", "client.local_steps", "client.batch_size", "client.proximal_mu"}
READS: dict[str, set[str]] = {
    "fedseal": {"split.val_size", "eval.batch_size"},
    "fedsup": {"eval.batch_size"},
}

# A key that acts only together with another value is probed with that value set.
PROTOCOLS = {"eval": {"protocol_every": 1}}
COSINE = {"lr_schedule": {"name": "cosine"}}
TOGETHER: dict[str, dict[str, Any]] = {
    "eval.finetune_epochs": PROTOCOLS,
    "eval.finetune_lr": PROTOCOLS,
    "eval.linear_epochs": PROTOCOLS,
    "eval.linear_lr": PROTOCOLS,
    "lr_schedule.epochs": COSINE,
    "lr_schedule.warmup_epochs": COSINE,
    "lr_schedule.epoch_samples": COSINE,
    "split.dirichlet_alpha": {"split": {"partitioner": "dirichlet"}},
    "split.target_r": {"split": {"partitioner": "noniid_r"}},
    "split.stream_rounds_per_step": {"split": {"stream_steps": 2}},
    "algo.fixed_threshold": {"algo": {"classwise_threshold": False}},
}


def raw_for(name: str) -> dict[str, Any]:
    return deep_merge({**TINY, "method": name}, SETTING.get(name, {}))


def numeric_keys(name: str) -> list[str]:
    flat = flatten(resolve_config(raw_for(name)))
    return sorted(
        k for k, v in flat.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
    )


def own_keys(name: str) -> set[str]:
    """Numeric keys the method sets itself: its defaults and its rules."""
    spec = METHODS[name]
    algo = spec.settings_class()
    return set(flatten(spec.server_half().defaults())) | set(keys_of(algo, "algo."))


def read_keys(name: str) -> set[str]:
    """Shared keys the method's own code reads (see REFERENCE)."""
    return READS.get(name, set()) | (CLIENT_ROUND if METHODS[name].client else set())


def runs_under(name: str, key: str) -> bool:
    """Whether an accepted value of ``key`` is run under method ``name`` (see REFERENCE)."""
    declared_anywhere = any(key in own_keys(m) for m in METHODS)
    mine = key in own_keys(name) or key in read_keys(name)
    return mine or (name == REFERENCE and not declared_anywhere)


def with_value(raw: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    *path, leaf = key.split(".")
    update: dict[str, Any] = {leaf: value}
    for part in reversed(path):
        update = {part: update}
    return deep_merge(raw, update)


def probed(name: str, key: str, probe: Any) -> dict[str, Any]:
    """The method's tiny experiment with ``key`` set to ``probe`` (and its TOGETHER)."""
    return with_value(deep_merge(raw_for(name), TOGETHER.get(key, {})), key, probe)


def refusal(raw: dict[str, Any]) -> str | None:
    """The config's refusal of ``raw``, or None when it is accepted."""
    try:
        resolve_config(raw)
    except ConfigError as err:
        return str(err)
    return None


def rule_of(name: str, key: str) -> Range | None:
    return RULES.get(key) or rules_of(METHODS[name].settings_class(), "algo.").get(key)


def must_refuse(name: str, key: str, probe: Any) -> bool:
    """NaN and strings are no key's number, nor is -1 unless the key's range declares it (as
    simulation.num_gpus's auto); 10^12 fits no bounded key; every count is an int, so the
    float 1e12 fits only a float key without an upper bound."""
    if isinstance(probe, str) or probe != probe:
        return True
    if probe == -1:
        return not rule_of(name, key).holds(-1)
    if probe != 1e12:
        return False
    default = flatten(resolve_config(raw_for(name)))[key]
    unbounded = rule_of(name, key).high is None
    return not unbounded or (isinstance(probe, float) and isinstance(default, int))


CASES = [(name, key) for name in sorted(METHODS) for key in numeric_keys(name)]


def test_every_numeric_key_has_a_rule():
    assert [(name, key) for name, key in CASES if rule_of(name, key) is None] == []


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_numeric_key_refuses_bad_values_in_one_line(name):
    for key in numeric_keys(name):
        for probe in PROBES:
            why = refusal(probed(name, key, probe))
            if why is not None:
                assert "\n" not in why and why.startswith("config key"), why
            assert why is not None or not must_refuse(name, key, probe), (key, probe)


def accepted_cases() -> list[tuple[str, str, Any]]:
    """(method, key, probe) that the config accepts and that run under that method, each
    resolved config once (a probe equal to the default, 10^12 and 1e12 of a float key)."""
    cases: dict[str, tuple[str, str, Any]] = {}
    for name, key in CASES:
        if not runs_under(name, key):
            continue
        for probe in PROBES:
            raw = probed(name, key, probe)
            if refusal(raw) is None:
                resolved = json.dumps(resolve_config(raw), sort_keys=True)
                cases.setdefault(resolved, (name, key, probe))
    return list(cases.values())


@contextlib.contextmanager
def deadline(seconds: int) -> Iterator[None]:
    """A hang becomes a TimeoutError after ``seconds``."""

    def expire(signum, frame):
        raise TimeoutError(f"no round completed in {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("name, key, probe", everyday_sample(accepted_cases()))
def test_an_accepted_value_completes_a_round_or_its_data_refuses_it(name, key, probe):
    raw = probed(name, key, probe)
    try:
        get_split(settings_of(resolve_config(raw)))
    except ConfigError as err:  # ssfl run's data check: exit 2 with this line
        assert "\n" not in str(err)
        return
    with deadline(60):
        rows, _ = run_method(raw, InProcessGrid(raw["split"]["num_clients"]))
    assert [row["round"] for row in rows] == [1]


@pytest.mark.process
def test_cli_refuses_a_negative_learning_rate_with_exit_2_and_one_line():
    proc = run_cli(str(ROOT / "experiments/fmnist-las/fedseal.yaml"), "--set", "client.lr=-1")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "ssfl: error: config key 'client.lr': must be > 0, got -1"
    ]


@pytest.mark.parametrize(
    "split, pattern",
    [
        ({"num_clients": 200, "client_size": 0}, r"'split.num_clients': 200 clients leave client"),
        ({"stream_steps": 17}, r"'split.stream_steps': must be <= the smallest client's 16"),
    ],
)
def test_a_split_the_data_cannot_hold_is_one_line(split, pattern):
    cfg = resolve_config(deep_merge(raw_for(REFERENCE), {"split": split}))
    with pytest.raises(ConfigError, match=pattern) as err:
        get_split(settings_of(cfg))
    assert "\n" not in str(err.value)

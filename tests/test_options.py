"""Every option a method has is honoured or refused: never silently ignored.

For every method, each key under client (when the method has clients), server and algo
is set to another value on a tiny synthetic run: either the config refuses it with a
ConfigError, or the run's numbers change.
"""

from __future__ import annotations

import copy
import functools
import json
from typing import Any

import pytest

from ssfl.experiment import resolve_config
from ssfl.registry import METHODS, method
from tasks.config import CHOICES, ConfigError, deep_merge, flatten
from tasks.settings import choices_of
from tests.harness import InProcessGrid, everyday_sample, run_method

pytestmark = pytest.mark.usefixtures("one_thread")

# A bootstrapped model confident enough for pseudo-labels, thresholds and complementary
# labels to be non-empty; three clients so that groups and helpers can vary.
TINY: dict[str, Any] = {
    "rounds": 2,
    "dataset": {"name": "synthetic28", "synthetic_train_size": 600, "synthetic_test_size": 60},
    "split": {
        "labeled_per_class": 3,
        "val_size": 30,
        "test_size": 60,
        "num_clients": 3,
        "client_size": 32,
    },
    "model": {"norm": "none"},
    "server": {"bootstrap_epochs": 20, "epochs": 1, "batch_size": 16, "lr": 0.1},
    "client": {"batch_size": 16, "lr": 0.05},
}

# Per method, what makes its keys observable on TINY (e.g. T counted in steps).
SETTING: dict[str, dict[str, Any]] = {
    "fedavg_with_server": {
        "server": {"epochs": 0, "local_steps": 2},
        "client": {"local_steps": 2},
        "algo": {"threshold": 0.3},
    },
    "fedrgd": {
        "server": {"epochs": 0, "local_steps": 2},
        "client": {"local_steps": 2},
        "algo": {"threshold": 0.3},
    },
    "fedmatch": {"server": {"lr": 0.01}, "algo": {"helper_interval": 2, "confidence": 0.3}},
    "fedavg_fixmatch": {"algo": {"threshold": 0.3}},
    "fedavg_simclr": {"model": {"projector_dim": 16}},
    "fedavg_simsiam": {"model": {"projector_dim": 16, "predictor_dim": 8}},
    "fedavg_byol": {"model": {"projector_dim": 16, "predictor_dim": 8}},
    # f_Server's step after round r acts on the online network in round r + 1.
    "fedsup": {"rounds": 3, "model": {"projector_dim": 128, "predictor_dim": 8}},
    "fedavg_uda": {"algo": {"threshold": 0.3}},
    # Open world (labels at the clients, no server training), calibration from round 1;
    # two globally unseen classes over three clients, so that client sizes differ.
    "fedossl": {
        "split": {
            "labeled_per_class": 0,
            "val_size": 0,
            "samples_per_class": 30,
            "class_roles": "SSSSSSLLGG",
        },
        "server": {"bootstrap_epochs": 0, "epochs": 0, "batch_size": 32, "lr": 0.01},
        "algo": {
            "cluster_from_round": 1,
            "ce_from_round": 1,
            "calibration_threshold": 0.3,
            "local_centroids": 4,
            "centroid_samples": 16,
            "server_cluster_steps": 20,
        },
    },
}

# A key that only acts together with another value: that value is set with it (a
# (method, key) entry: for that method only).
_NACH = {"algo": {"objective": "nach"}}
# TINY's round-2 model puts every sample's best seen class between 0.5 and 0.9: with an OOD
# threshold of 0.9 all of them are pseudo-labeled (none with 0.45, or from round 3).
_SEMIFL = {"algo": {"objective": "semifl", "beta": 0.0, "gamma": 0.0, "ood_threshold": 0.9}}
# The SimCLR stage's settings act only when it runs (on TINY's pool, in several batches).
_PRETRAIN = {"algo": {"pretrain_epochs": 1, "pretrain_batch_size": 64}}
# R_i's keys act only when R_i is on (FedoSSL's default, as the official code, leaves it off).
_R_ON = {"algo": {"beta": 1.0}}
# TINY's 16 features fall into 4 hard clusters within a few k-means iterations, after which
# more iterations change no bit (5 against 10 changed nothing on an AVX2 CPU): 0 iterations
# (the random start rows) against 2 always moves the centroids.
_KMEANS_FROM_START = {"algo": {"kmeans_iters": 0}}
TOGETHER: dict[str | tuple[str, str], dict[str, Any]] = {
    ("fedossl", "algo.flip_suppressed"): _R_ON,
    ("fedossl", "algo.tau"): _R_ON,
    ("fedossl", "algo.kmeans_iters"): _KMEANS_FROM_START,
    # One Sinkhorn round against two at a low lambda, where the balancing moves members
    # (ten against twenty rounds at lambda 25 leave TINY's hard clusters as they are).
    ("fedossl", "algo.local_sinkhorn_iters"): {
        "algo": {"local_sinkhorn_iters": 1, "kmeans_iters": 1, "sinkhorn_sharpness": 0.5}
    },
    ("fedossl", "algo.pretrain_batch_size"): _PRETRAIN,
    ("fedossl", "algo.pretrain_lr"): _PRETRAIN,
    ("fedossl", "algo.pretrain_temperature"): _PRETRAIN,
    ("fedossl", "algo.pretrain_projector_dim"): _PRETRAIN,
    ("fedossl", "algo.pseudo_threshold"): _NACH,
    ("fedossl", "algo.self_training_weight"): _NACH,
    ("fedossl", "algo.randaugment_n"): _NACH,
    ("fedossl", "algo.randaugment_m"): _NACH,
    ("fedossl", "algo.ood_threshold"): _SEMIFL,
    ("fedossl", "algo.pseudo_from_round"): _SEMIFL,
    ("fedossl", "algo.mix_weight"): _SEMIFL,
    ("fedossl", "algo.mixup_alpha"): {"algo": {**_SEMIFL["algo"], "mix_weight": 1.0}},
    "algo.fixed_threshold": {"algo": {"classwise_threshold": False}},
    "algo.labeled_batch_size": {
        "split": {"scenario": "labels_at_client", "client_labeled_per_class": 2},
    },
    "algo.tau_max": {"algo": {"theta": 0.5}},
    # Eval and train mode differ only with BatchNorm; the key is self-training's.
    "algo.selftrain_labels": {"algo": {"loss": "selftrain"}, "model": {"norm": "bn"}},
    "client.keep_momentum": {"client": {"momentum": 0.9}},
    "server.keep_momentum": {"server": {"momentum": 0.9}},
    "client.nesterov": {"client": {"momentum": 0.9}},
    "server.nesterov": {"server": {"momentum": 0.9}},
}

# The strings each method's algo keys allow, from their declarations.
STRINGS = {
    key: allowed
    for spec in METHODS.values()
    for key, allowed in choices_of(spec.settings_class(), "algo.").items()
}


def other_value(key: str, value: Any) -> Any:
    """A different valid-looking value of the same type."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        if key.endswith("helpers"):
            return value - 1
        return (
            value + 1 if key.endswith(("epochs", "steps", "groups", "interval")) else value * 2 or 2
        )
    if isinstance(value, float):
        return value * 0.5 if value else 0.1
    choices = CHOICES.get(key) or STRINGS.get(key) or (value,)
    return next((c for c in choices if c != value), value)


def raw_for(name: str) -> dict[str, Any]:

    return deep_merge({**TINY, "method": name}, SETTING.get(name, {}))


def declared_keys(name: str) -> list[str]:
    cfg = resolve_config(raw_for(name))
    halves = ["server", "algo"] + (["client"] if method(name).client else [])
    flat = flatten(cfg)
    return sorted(k for k in flat if k.split(".")[0] in halves and flat[k] != {})


@functools.lru_cache(maxsize=64)
def numbers_of(raw_json: str) -> tuple[float, ...]:
    raw = json.loads(raw_json)
    rows, _ = run_method(raw, InProcessGrid(raw["split"]["num_clients"]))
    return tuple(r["test_loss"] for r in rows)


def numbers(raw: dict[str, Any]) -> tuple[float, ...]:
    return numbers_of(json.dumps(raw, sort_keys=True))


CASES = [(name, key) for name in sorted(METHODS) for key in declared_keys(name)]


@pytest.mark.parametrize("name, key", everyday_sample(CASES))
def test_every_declared_key_changes_something_or_is_refused(name, key):

    raw = deep_merge(raw_for(name), TOGETHER.get((name, key), TOGETHER.get(key, {})))
    section, leaf = key.split(".", 1)
    value = flatten(resolve_config(raw))[key]
    changed = copy.deepcopy(raw)
    changed.setdefault(section, {})[leaf] = other_value(key, value)
    try:
        resolve_config(changed)
    except ConfigError:
        return  # refused with one line
    assert numbers(changed) != numbers(raw), f"{name}: {key} {value!r} -> changed nothing"

"""Experiment configuration: defaults, YAML loading, overrides and validation.

An experiment is a nested mapping. Every key has a default below (or in the
method's own ``algo`` defaults); the type of the default is the type a value
must have, and every numeric key has a range its meaning allows (:data:`RULES`, and
each method's ``rules`` beside its defaults). Unknown keys, values of the wrong type,
NaN and infinities, and values outside their range raise :class:`ConfigError` with one
line naming the key and what is allowed, before any training starts.
"""

from __future__ import annotations

import copy
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A bad experiment: unknown key, wrong type or a value outside the allowed set."""


DEFAULTS: dict[str, Any] = {
    "method": "server_sl",
    "name": "",
    "seed": 0,
    "rounds": 50,
    "device": "auto",
    "dataset": {
        "name": "fashion_mnist",
        # Folder holding the dataset files; "" = $SSFL_DATA_DIR, else ./data.
        "root": "",
        "download": True,
        # Size of each generated split of the synthetic dataset.
        "synthetic_train_size": 4000,
        "synthetic_test_size": 1000,
    },
    "split": {
        "scenario": "labels_at_server",
        "labeled_per_class": 50,
        "val_size": 200,
        "test_size": 3000,
        "num_clients": 10,
        # 0 = all training images left after the server's and validation sets, split
        # among the clients (SSFL benchmark App. A.2 for the iid and noniid_r partitioners).
        "client_size": 1200,
        "partitioner": "iid",
        "dirichlet_alpha": 0.5,
        "target_r": 0.4,
        "client_labeled_per_class": 0,
        # Streaming (FedMatch 6.1): 0 = off; else each client's unlabeled data is cut into
        # stream_steps chunks and round r trains on chunk (r - 1) // stream_rounds_per_step.
        "stream_steps": 0,
        "stream_rounds_per_step": 10,
    },
    # dropout: Dropout2d after small_cnn's conv blocks (the SSFL benchmark's EMNIST CNN: 0.25).
    "model": {
        "name": "small_cnn",
        "norm": "bn",
        "dropout": 0.0,
        "head_size": 0,
        # SSL heads on the embedding (SimCLR, SimSiam, BYOL, FedSup); 0 = none.
        "projector_dim": 0,
        "predictor_dim": 0,
        # Weights (and so the conv inputs) in channels-last memory layout (ours; a GPU speed
        # option, off by default).
        "channels_last": False,
    },
    # amp "bf16": client training, server training and evaluation under bf16 autocast
    # (ours; a GPU speed option, off by default, "off" = float32 throughout).
    "train": {"amp": "off"},
    "server": {
        "bootstrap_epochs": 0,
        "epochs": 0,
        "lr": 0.01,
        "lr_decay": 1.0,
        "momentum": 0.9,
        "weight_decay": 0.0,
        "batch_size": 32,
        "nesterov": False,
        # T of the SSFL benchmark: SGD steps per round; 0 = count in epochs instead.
        "local_steps": 0,
        # Keep the SGD momentum buffers from round to round (the SSFL benchmark's code).
        "keep_momentum": False,
    },
    "client": {
        "epochs": 1,
        "lr": 0.01,
        "lr_decay": 1.0,
        "momentum": 0.9,
        "weight_decay": 0.0,
        "batch_size": 32,
        "proximal_mu": 0.0,
        "nesterov": False,
        "local_steps": 0,
        "keep_momentum": False,
    },
    # Learning rate of both halves: "exponential" = lr * lr_decay^(round - 1); "cosine" =
    # SSFL benchmark eq. 9 per SGD step, one epoch = epoch_samples / batch_size steps,
    # epochs 0 = the whole run (rounds x steps per round).
    "lr_schedule": {
        "name": "exponential",
        "epochs": 0.0,
        "warmup_epochs": 0.0,
        "epoch_samples": 65536,
        "cycles": 0.4375,
        "floor": 0.0001,
    },
    # clients_per_round 0 = all; min_clients 0 = wait for all split.num_clients nodes;
    # max_failed_rounds rounds in a row without an accepted client update stop the run;
    # checkpoint_every N > 0 also keeps every Nth round's checkpoint (checkpoint-rNNN.pt).
    "federation": {
        "clients_per_round": 0,
        "min_clients": 0,
        "timeout_s": 3600.0,
        "max_failed_rounds": 3,
        "checkpoint_every": 0,
    },
    # num_gpus: each client actor's share of a GPU; -1 = auto (ssfl.gpu: 0 on device cpu or
    # without a GPU, else the GPUs divided among a round's clients, at most 1 each).
    "simulation": {"num_cpus": 1, "num_gpus": -1.0},
    # local_models: also record local_accuracy, the clients' trained models' mean test
    # accuracy each round (FedMatch Table 2's metric).
    "eval": {
        # Test-set evaluation every this-th round and at the last (the aggregate's too).
        "every": 1,
        "batch_size": 500,
        "local_models": False,
        # FedSup 5.1.2's protocols on the global model: a fresh linear head finetuned end
        # to end, and a linear probe on the frozen encoder, both on the server's labels;
        # every protocol_every rounds and at the last round (0 = off). Epochs and rates: ours.
        "protocol_every": 0,
        "finetune_epochs": 5,
        "finetune_lr": 0.01,
        "linear_epochs": 50,
        "linear_lr": 0.1,
        # cosine: both protocols anneal their rate to 0 (ours: the model they end on is
        # settled, not one step of a noisy constant-rate walk); constant.
        "protocol_schedule": "cosine",
    },
    # Weak view: flip + shift by up to this fraction of the side (FixMatch: 0.125).
    "augment": {"weak_shift": 0.125},
    "algo": {},
}

CHOICES: dict[str, tuple[str, ...]] = {
    "device": ("auto", "cpu", "cuda"),
    "split.scenario": ("labels_at_server", "labels_at_client", "open_world"),
    "split.partitioner": ("iid", "dirichlet", "random_classes", "fedmatch_imbalanced", "noniid_r"),
    "model.norm": ("none", "bn", "gn"),
    "lr_schedule.name": ("exponential", "cosine"),
    "eval.protocol_schedule": ("cosine", "constant"),
    "train.amp": ("off", "bf16"),
}


@dataclass(frozen=True)
class Range:
    """The interval a numeric key's value must lie in; None = unbounded on that side."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def holds(self, value: float) -> bool:
        """Whether ``value`` lies in the interval (NaN never does)."""
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        below = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return above and below and not math.isnan(value)

    def __str__(self) -> str:
        """'> 0', '>= 1', 'in [0, 1)', 'in [1, 100000]'."""
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {show(self.low)}"
        left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
        return f"in {left}{show(self.low)}, {show(self.high)}{right}"


def show(value: Any) -> str:
    """A number as a user types it: 1 not 1.0, 1e+12 not 1000000000000.0."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def between(low: float, high: float, high_open: bool = False) -> Range:
    """[low, high] (or [low, high))."""
    return Range(low, high, high_open=high_open)


POSITIVE = Range(0, low_open=True)  # rates, temperatures, timeouts
NON_NEGATIVE = Range(0)  # loss weights, decays, thresholds on magnitudes
UNIT = between(0, 1)  # probabilities, thresholds, fractions
MOMENTUM = between(0, 1, high_open=True)

# Upper bounds on counts, far above any real run, so that a typo (an extra digit or
# three) is refused at once instead of hanging a run or exhausting memory.
MAX_ROUNDS = 100_000
MAX_EPOCHS = 10_000  # per round, the bootstrap, the evaluation protocols
MAX_STEPS = 1_000_000  # SGD steps per round
MAX_BATCH = 1_000_000
MAX_CLIENTS = 100_000
MAX_IMAGES = 1_000_000  # a generated split; real splits are bounded by the dataset
MAX_WIDTH = 16_384  # a head's or an SSL projector's width (BYOL: 4096)
MAX_CPUS = 1_024
MAX_SEED = 2**32 - 1  # numpy's seed range

# Every numeric key of DEFAULTS and the range its meaning allows (a method's own keys:
# ServerHalf.rules beside its defaults). Every float must also be finite.
RULES: dict[str, Range] = {
    "seed": between(0, MAX_SEED),
    "rounds": between(1, MAX_ROUNDS),
    "dataset.synthetic_train_size": between(1, MAX_IMAGES),
    "dataset.synthetic_test_size": between(1, MAX_IMAGES),
    "split.labeled_per_class": between(0, MAX_IMAGES),
    "split.val_size": between(0, MAX_IMAGES),
    "split.test_size": between(0, MAX_IMAGES),
    "split.num_clients": between(1, MAX_CLIENTS),
    "split.client_size": between(0, MAX_IMAGES),
    "split.dirichlet_alpha": POSITIVE,
    "split.target_r": UNIT,
    "split.client_labeled_per_class": between(0, MAX_IMAGES),
    "split.stream_steps": between(0, MAX_IMAGES),
    "split.stream_rounds_per_step": between(1, MAX_ROUNDS),
    "model.dropout": between(0, 1, high_open=True),
    "model.head_size": between(0, MAX_WIDTH),
    "model.projector_dim": between(0, MAX_WIDTH),
    "model.predictor_dim": between(0, MAX_WIDTH),
    **{
        f"{half}.{key}": rule
        for half in ("server", "client")
        for key, rule in {
            "epochs": between(0, MAX_EPOCHS),
            "lr": POSITIVE,
            "lr_decay": Range(0, 1, low_open=True),
            "momentum": MOMENTUM,
            "weight_decay": NON_NEGATIVE,
            "batch_size": between(1, MAX_BATCH),
            "local_steps": between(0, MAX_STEPS),
        }.items()
    },
    "server.bootstrap_epochs": between(0, MAX_EPOCHS),
    "client.proximal_mu": NON_NEGATIVE,
    "lr_schedule.epochs": between(0, MAX_EPOCHS * MAX_ROUNDS),
    "lr_schedule.warmup_epochs": between(0, MAX_EPOCHS * MAX_ROUNDS),
    "lr_schedule.epoch_samples": between(1, MAX_IMAGES * MAX_EPOCHS),
    "lr_schedule.cycles": NON_NEGATIVE,
    "lr_schedule.floor": UNIT,
    "federation.clients_per_round": between(0, MAX_CLIENTS),
    "federation.min_clients": between(0, MAX_CLIENTS),
    "federation.timeout_s": POSITIVE,
    "federation.max_failed_rounds": between(1, MAX_ROUNDS),
    "federation.checkpoint_every": between(0, MAX_ROUNDS),
    "simulation.num_cpus": between(1, MAX_CPUS),
    "simulation.num_gpus": between(-1, 1),
    "eval.batch_size": between(1, MAX_BATCH),
    "eval.every": between(1, MAX_ROUNDS),
    "eval.protocol_every": between(0, MAX_ROUNDS),
    "eval.finetune_epochs": between(1, MAX_EPOCHS),
    "eval.finetune_lr": POSITIVE,
    "eval.linear_epochs": between(1, MAX_EPOCHS),
    "eval.linear_lr": POSITIVE,
    "augment.weak_shift": between(0, 0.5),
}


def deep_merge(base: dict[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """Return a copy of ``base`` with ``update`` merged in recursively."""
    out = copy.deepcopy(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


class ConfigLoader(yaml.SafeLoader):
    """YAML's safe loader, also reading '4e-5' as a float (YAML 1.1 needs a dot: '4.0e-5')."""


ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+$"),
    list("-+0123456789."),
)


def load_yaml(text: str) -> Any:
    """Experiment files and --set values, read the same way."""
    return yaml.load(text, Loader=ConfigLoader)


def parse_scalar(text: str) -> Any:
    """Parse an override value the way YAML reads a scalar ('0.1' -> 0.1, 'true' -> True)."""
    try:
        return load_yaml(text) if text.strip() else ""
    except yaml.YAMLError:
        return text


def parse_overrides(items: list[str] | str) -> dict[str, Any]:
    """Turn ["a.b=1", ...] or "a.b=1;c=x" into a nested mapping."""
    if isinstance(items, str):
        items = [part for part in items.split(";") if part.strip()]
    nested: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"override '{item}' is not of the form key=value")
        key, value = item.split("=", 1)
        node = nested
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override '{item}' conflicts with another override")
        node[parts[-1]] = parse_scalar(value)
    return nested


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read an experiment file; a missing or malformed file is a ConfigError."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"experiment file not found: {path}")
    try:
        data = load_yaml(path.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"{path}: not UTF-8 text (byte {err.object[err.start]:#04x} at offset {err.start}); "
            "save it as UTF-8"
        ) from err
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from err
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: an experiment must be a mapping of keys to values")
    return data


def _check_type(key: str, value: Any, default: Any) -> Any:
    """Return ``value`` coerced to the type of ``default`` or raise ConfigError."""
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int):
        ok = is_number and isinstance(value, int)
    elif isinstance(default, float):
        ok, value = is_number, float(value) if is_number else value
        if ok and not math.isfinite(value):
            raise ConfigError(f"config key '{key}': must be a finite number, got {show(value)}")
    else:
        ok = isinstance(value, str)
    if not ok:
        kind = type(default).__name__
        raise ConfigError(f"config key '{key}': expected {kind}, got {value!r}")
    return value


def _validate(node: Mapping[str, Any], schema: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """Check every key of ``node`` against ``schema`` (defaults) and fill the rest."""
    out: dict[str, Any] = {}
    for key, value in node.items():
        full = f"{prefix}{key}"
        if key not in schema:
            allowed = ", ".join(sorted(schema)) or "(none)"
            raise ConfigError(
                f"unknown config key '{full}' (allowed under '{prefix or '.'}': {allowed})"
            )
        default = schema[key]
        if isinstance(default, dict):
            if not isinstance(value, Mapping):
                raise ConfigError(f"config key '{full}': expected a mapping, got {value!r}")
            out[key] = _validate(value, default, f"{full}.")
        else:
            out[key] = _check_type(full, value, default)
    for key, default in schema.items():
        if key not in out:
            out[key] = copy.deepcopy(default)
    return out


def _get(cfg: Mapping[str, Any], dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        node = node[part]
    return node


def resolve(
    raw: Mapping[str, Any],
    method_defaults: Mapping[str, Any],
    choices: Mapping[str, tuple[str, ...]],
    method_rules: Mapping[str, Range] | None = None,
) -> dict[str, Any]:
    """Validate a raw experiment mapping against DEFAULTS with the method's own defaults
    merged in; return the full config. ``choices``: allowed values of more keys (the
    registered datasets and models); ``method_rules``: the ranges of the method's own
    numeric keys (beside RULES)."""
    schema = deep_merge(DEFAULTS, method_defaults)
    cfg = _validate(raw, schema, "")
    for key, allowed in {**CHOICES, **choices}.items():
        value = _get(cfg, key)
        if value not in allowed:
            raise ConfigError(f"config key '{key}': {value!r} is not one of {', '.join(allowed)}")
    _check_rules(cfg, {**RULES, **(method_rules or {})})
    _check_ranges(cfg)
    return cfg


def _check_rules(cfg: Mapping[str, Any], rules: Mapping[str, Range]) -> None:
    """Each numeric key inside the range its rule allows."""
    for key, rule in rules.items():
        value = _get(cfg, key)
        if not rule.holds(value):
            raise ConfigError(f"config key '{key}': must be {rule}, got {show(value)}")


def _check_ranges(cfg: Mapping[str, Any]) -> None:
    """Values inside their ranges that still make no sense together."""
    for key in ("federation.clients_per_round", "federation.min_clients"):
        if _get(cfg, key) > cfg["split"]["num_clients"]:
            raise ConfigError(
                f"config key '{key}': must be <= split.num_clients "
                f"({cfg['split']['num_clients']}), got {_get(cfg, key)}"
            )
    share = cfg["simulation"]["num_gpus"]
    if -1 < share < 0:
        raise ConfigError(
            f"config key 'simulation.num_gpus': must be -1 (auto) or in [0, 1], got {show(share)}"
        )
    dropout = cfg["model"]["dropout"]
    if dropout and cfg["model"]["name"] != "small_cnn":
        raise ConfigError(
            f"config key 'model.dropout': only small_cnn has a dropout layer, "
            f"not {cfg['model']['name']}"
        )
    if cfg["model"]["predictor_dim"] and not cfg["model"]["projector_dim"]:
        raise ConfigError(
            "config key 'model.predictor_dim': a predictor sits on the projector: "
            "set model.projector_dim > 0"
        )
    _check_scenario(cfg["split"])
    for half in ("server", "client"):
        _check_round_length(half, cfg[half], cfg["lr_schedule"]["name"])
    for half in ("server", "client"):
        if cfg[half]["nesterov"] and cfg[half]["momentum"] <= 0:
            raise ConfigError(
                f"config key '{half}.nesterov': Nesterov momentum needs {half}.momentum > 0"
            )
    sched = cfg["lr_schedule"]
    if sched["epochs"] and sched["warmup_epochs"] >= sched["epochs"]:
        raise ConfigError(
            f"config key 'lr_schedule.warmup_epochs': must be < lr_schedule.epochs "
            f"({sched['epochs']}), got {sched['warmup_epochs']}"
        )


def _check_round_length(half: str, hcfg: Mapping[str, Any], schedule: str) -> None:
    """One key counts a round (epochs or T steps) and one sets its rate's decay."""
    if hcfg["epochs"] > 0 and hcfg["local_steps"] > 0:
        raise ConfigError(
            f"config keys '{half}.epochs' and '{half}.local_steps': a round is counted in "
            f"one of them; set {half}.epochs to 0 when {half}.local_steps > 0"
        )
    if schedule != "exponential" and hcfg["lr_decay"] != 1.0:
        raise ConfigError(
            f"config key '{half}.lr_decay': the {schedule} lr_schedule sets the rate; "
            "lr_decay applies to the exponential schedule only (set it to 1.0)"
        )


def _check_scenario(split: Mapping[str, Any]) -> None:
    """split.scenario and split.client_labeled_per_class state one fact: they must agree."""
    at_client = split["scenario"] == "labels_at_client"
    if at_client != (split["client_labeled_per_class"] > 0):
        raise ConfigError(
            f"config keys 'split.scenario' ({split['scenario']}) and "
            f"'split.client_labeled_per_class' ({split['client_labeled_per_class']}) disagree: "
            "labels_at_client needs client labels (> 0), labels_at_server none (0)"
        )


def data_root(cfg: Mapping[str, Any]) -> Path:
    """The dataset folder: dataset.root, else $SSFL_DATA_DIR, else ./data (absolute)."""
    root = cfg["dataset"]["root"] or os.environ.get("SSFL_DATA_DIR", "") or "data"
    return Path(root).expanduser().resolve()


def flatten(cfg: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested config -> {"a.b": value} (used for tables and overrides)."""
    flat: dict[str, Any] = {}
    for key, value in cfg.items():
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat

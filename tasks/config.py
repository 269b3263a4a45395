"""Experiment configuration: YAML loading, overrides and validation.

An experiment is a nested mapping. Every key is declared once in tasks.settings (a
method's ``algo`` keys in its own settings class): the type of its default is the type a
value must have, and every numeric key has a range its meaning allows. Unknown keys,
values of the wrong type, NaN and infinities, and values outside their range raise
:class:`ConfigError` with one line naming the key and what is allowed, before any
training starts.
"""

from __future__ import annotations

import copy
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from tasks.settings import (
    Range,
    Settings,
    choices_of,
    defaults_of,
    rules_of,
    scenario_keys,
    show,
)

# The characters that break a line (str.splitlines), each shown as its escape instead.
LINE_BREAKS = {ord(c): repr(c)[1:-1] for c in "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"}


class ConfigError(ValueError):
    """A bad experiment: unknown key, wrong type or a value outside the allowed set. Its
    message is one line: a line break that a key or value brings is shown escaped (\\n)."""

    def __init__(self, message: str) -> None:
        super().__init__(message.translate(LINE_BREAKS))


DEFAULTS: dict[str, Any] = defaults_of(Settings)
CHOICES: dict[str, tuple[str, ...]] = choices_of(Settings)
# Every numeric key of DEFAULTS and the range its meaning allows (a method's own keys:
# its algo class's declarations). Every float must also be finite.
RULES: dict[str, Range] = rules_of(Settings)
# Keys that are gone, with what replaced them: a config that still sets one is told so.
RETIRED: dict[str, str] = {
    "algo.cluster_from_epoch": "use algo.cluster_from_round (FedoSSL's gates count rounds, "
    "as the official code: 6 = its 6th round)",
    "algo.ce_from_epoch": "use algo.ce_from_round (the official code's 8th round: 8)",
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


class DuplicateKeyError(yaml.YAMLError):
    """A mapping gives one key twice (YAML loaders silently keep the last value)."""


class ConfigLoader(yaml.SafeLoader):
    """YAML's safe loader, also reading '4e-5' as a float (YAML 1.1 needs a dot: '4.0e-5'),
    refusing a key given twice in one mapping."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key, line = key_node.value, key_node.start_mark.line + 1
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            if key in seen:
                raise DuplicateKeyError(
                    f"key '{key}' is given twice (lines {seen[key]} and {line})"
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


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
    except DuplicateKeyError as err:
        raise ConfigError(f"{path}: {err}; keep one") from err
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from err
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: an experiment must be a mapping of keys to values")
    return data


def _check_type(key: str, value: Any, default: Any) -> Any:
    """Return ``value`` coerced to the type of ``default`` or raise ConfigError."""
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(default, tuple):
        return _check_int_list(key, value)
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


def _check_int_list(key: str, value: Any) -> tuple[int, ...]:
    """A list of integers (YAML ``[0, 1]``) as a tuple, or a one-line ConfigError."""
    items = value if isinstance(value, (list, tuple)) else None
    if items is None or any(isinstance(v, bool) or not isinstance(v, int) for v in items):
        raise ConfigError(f"config key '{key}': expected a list of integers, got {value!r}")
    return tuple(items)


def _validate(node: Mapping[str, Any], schema: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """Check every key of ``node`` against ``schema`` (defaults) and fill the rest."""
    out: dict[str, Any] = {}
    for key, value in node.items():
        full = f"{prefix}{key}"
        if key not in schema and full in RETIRED:
            raise ConfigError(f"config key '{full}' was removed: {RETIRED[full]}")
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
    _check_attack(cfg["federation"]["attack"], cfg["split"]["num_clients"])
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
    if cfg["server"]["optimizer"] != "sgd":
        raise ConfigError("config key 'server.optimizer': the server trains with sgd only")
    if cfg["client"]["optimizer"] != "sgd" and (
        cfg["client"]["keep_momentum"] or cfg["client"]["nesterov"]
    ):
        raise ConfigError(
            "config key 'client.optimizer': keep_momentum and nesterov belong to sgd; "
            "set them to false with adam"
        )
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


def _check_attack(attack: Mapping[str, Any], num_clients: int) -> None:
    """Attacking partitions exist in the split and are named once; an attack has attackers."""
    partitions = attack["partitions"]
    wrong = [pid for pid in partitions if not 0 <= pid < num_clients]
    if wrong or len(set(partitions)) != len(partitions):
        raise ConfigError(
            f"config key 'federation.attack.partitions': partition ids in [0, {num_clients}) "
            f"(split.num_clients), each once; got {list(partitions)}"
        )
    if attack["kind"] != "none" and not partitions and attack["fraction"] == 0:
        raise ConfigError(
            f"config key 'federation.attack.kind': {attack['kind']!r} needs attackers: set "
            "federation.attack.partitions or federation.attack.fraction"
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


OPEN_WORLD_KEYS = scenario_keys("open_world")


def _check_scenario(split: Mapping[str, Any]) -> None:
    """split.scenario and split.client_labeled_per_class state one fact: they must agree;
    the open-world keys mean something only in the open_world scenario."""
    if split["scenario"] != "open_world":
        for key in OPEN_WORLD_KEYS:
            if split[key] != DEFAULTS["split"][key]:
                raise ConfigError(
                    f"config key 'split.{key}': an open_world key; split.scenario is "
                    f"{split['scenario']} (leave it at {DEFAULTS['split'][key]!r})"
                )
    at_client = split["scenario"] == "labels_at_client"
    if at_client != (split["client_labeled_per_class"] > 0):
        raise ConfigError(
            f"config keys 'split.scenario' ({split['scenario']}) and "
            f"'split.client_labeled_per_class' ({split['client_labeled_per_class']}) disagree: "
            "labels_at_client needs client labels (> 0), labels_at_server none (0)"
        )


def data_root(root: str) -> Path:
    """The dataset folder: dataset.root (``root``), else $SSFL_DATA_DIR, else ./data
    (absolute)."""
    return Path(root or os.environ.get("SSFL_DATA_DIR", "") or "data").expanduser().resolve()


def flatten(cfg: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested config -> {"a.b": value} (used for tables and overrides)."""
    flat: dict[str, Any] = {}
    for key, value in cfg.items():
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat

"""Settings declared once: the declarations give the defaults, ranges and choices the YAML
reader checks, and a checked config becomes frozen typed objects."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pytest

from ssfl.experiment import resolve_config
from ssfl.registry import METHODS, settings_of
from tasks.config import CHOICES, DEFAULTS, RULES, ConfigError
from tasks.settings import (
    UNIT,
    AlgoSettings,
    ConsistencySettings,
    OptimizerSettings,
    ServerSettings,
    Settings,
    again,
    between,
    choices_of,
    defaults_of,
    keys_of,
    rules_of,
    scenario_keys,
    setting,
    typed,
)
from tests.harness import tiny_raw


@dataclass(frozen=True)
class Inner:
    rate: float = setting(0.5, "a rate", rule=UNIT, ref="Paper eq. 1")
    mode: str = setting("a", "a mode", choices=("a", "b"))
    on: bool = setting(True, "a switch")


@dataclass(frozen=True)
class Outer:
    count: int = setting(3, "a count", rule=between(1, 9))
    inner: Inner = field(default_factory=Inner)
    algo: AlgoSettings = field(default_factory=AlgoSettings)


@dataclass(frozen=True)
class Mine(AlgoSettings):
    weight: float = setting(2.0, "a weight", rule=between(0, 5))


def test_the_declarations_give_defaults_rules_and_choices():
    assert defaults_of(Outer) == {
        "count": 3,
        "inner": {"rate": 0.5, "mode": "a", "on": True},
        "algo": {},
    }
    assert rules_of(Outer) == {"count": between(1, 9), "inner.rate": UNIT}
    assert choices_of(Outer) == {"inner.mode": ("a", "b")}
    assert list(keys_of(Outer)) == ["count", "inner.rate", "inner.mode", "inner.on"]
    assert keys_of(Inner)["rate"].metadata["ref"] == "Paper eq. 1"


def test_typed_builds_frozen_objects_with_the_methods_algo_class():
    values = {
        "count": 4,
        "inner": {"rate": 0.25, "mode": "b", "on": False},
        "algo": {"weight": 1.5},
    }
    built = typed(Outer, values, Mine)
    assert built == Outer(4, Inner(0.25, "b", False), Mine(1.5))
    assert isinstance(built.algo, Mine) and built.algo.weight == 1.5
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.count = 5  # type: ignore[misc]


def test_again_changes_the_default_and_keeps_the_one_declaration():
    threshold = {f.name: f for f in dataclasses.fields(ConsistencySettings)}["threshold"]
    moved = again(ConsistencySettings, "threshold", 0.95)
    assert moved.default == 0.95 and moved.metadata == threshold.metadata
    server = {f.name: f for f in dataclasses.fields(ServerSettings)}
    lr = {f.name: f for f in dataclasses.fields(OptimizerSettings)}["lr"]
    assert server["lr"].metadata == lr.metadata and server["lr"].default == 0.01


def test_the_readers_tables_come_from_the_declarations():
    assert defaults_of(Settings) == DEFAULTS
    assert RULES["server.lr"] == RULES["client.lr"] and str(RULES["server.momentum"]) == "in [0, 1)"
    assert CHOICES["split.partitioner"][0] == "iid" and DEFAULTS["algo"] == {}
    assert DEFAULTS["server"]["epochs"] == 0 and DEFAULTS["client"]["epochs"] == 1


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_key_has_help_and_every_number_a_range(name):
    cls = METHODS[name].settings_class()
    for key, f in {**keys_of(Settings), **keys_of(cls, "algo.")}.items():
        assert f.metadata["help"], key
        if f.type in ("int", "float"):
            assert f.metadata["rule"] is not None, key


@pytest.mark.parametrize("name", sorted(METHODS))
def test_a_checked_config_reads_as_typed_settings_equal_to_the_dict(name):
    cfg = resolve_config(tiny_raw(name))
    settings = settings_of(cfg)
    assert isinstance(settings.algo, METHODS[name].settings_class())
    assert dataclasses.asdict(settings) == cfg
    assert settings.split.num_clients == cfg["split"]["num_clients"]


def test_a_choice_declared_on_a_method_key_is_checked_with_one_line():
    raw = tiny_raw("fedossl")
    raw.setdefault("algo", {})["objective"] = "other"
    with pytest.raises(ConfigError) as caught:
        resolve_config(raw)
    assert str(caught.value) == (
        "config key 'algo.objective': 'other' is not one of orca, nach, semifl"
    )


def test_an_open_world_key_outside_the_open_world_is_refused():
    raw = tiny_raw("fedseal")
    raw["split"]["class_roles"] = "SSSSSSLGGG"
    with pytest.raises(ConfigError) as caught:
        resolve_config(raw)
    assert str(caught.value) == (
        "config key 'split.class_roles': an open_world key; split.scenario is "
        "labels_at_server (leave it at '')"
    )


@pytest.mark.parametrize(
    "key, value", [("labeled_fraction", 0.25), ("role_clients", 2), ("samples_per_class", 8)]
)
def test_every_key_declared_for_the_open_world_is_refused_outside_it(key, value):
    assert scenario_keys("open_world") == (
        "class_roles",
        "labeled_fraction",
        "role_clients",
        "samples_per_class",
    )
    raw = tiny_raw("fedseal")
    raw["split"][key] = value
    with pytest.raises(ConfigError, match=f"'split.{key}': an open_world key"):
        resolve_config(raw)


def test_only_a_method_that_trains_on_the_open_world_split_accepts_it():
    raw = tiny_raw("fedseal")
    raw["split"] = {**raw["split"], "scenario": "open_world", "labeled_per_class": 0}
    with pytest.raises(ConfigError) as caught:
        resolve_config(raw)
    assert str(caught.value) == (
        "config key 'split.scenario': method 'fedseal' does not train on the open_world split "
        "(fedossl does)"
    )

"""Property-based: generated YAML documents and --set values thrown at the config reader
(ssfl.experiment.resolve_experiment) and at `ssfl validate` never make a traceback: the
reader returns a config or raises a one-line ConfigError; `ssfl validate` exits 0 or 2 with
one `ok`/`FAIL` line and nothing on stderr."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ssfl.cli import main
from ssfl.experiment import resolve_experiment
from ssfl.registry import METHODS
from tasks.config import DEFAULTS, ConfigError, flatten
from tests.conftest import ROOT

BASE = yaml.safe_load((ROOT / "experiments" / "quickstart.yaml").read_text())
KNOWN_KEYS = sorted(flatten(DEFAULTS))
# Few examples and no deadline: the everyday tier's budget, on a shared 2-core machine. The
# same examples every run (derandomize): CI is deterministic; derandomize=False explores
# further.
BOUNDED = settings(
    max_examples=50,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 40),
    st.integers(),
    st.floats(),
    st.text(max_size=8),
    st.sampled_from(sorted(METHODS)),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)
KEYS = st.one_of(
    st.sampled_from(KNOWN_KEYS),
    st.sampled_from(["method", "name"]),
    st.text(min_size=1, max_size=12),
)


def with_value(doc: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    """``doc`` with the dotted key set to ``value`` (a non-mapping on the way is replaced)."""
    out = copy.deepcopy(doc)
    node = out
    *parents, last = dotted.split(".")
    for part in parents:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[last] = value
    return out


@st.composite
def documents(draw: st.DrawFn) -> str:
    """An experiment file's text: the quickstart with keys set to generated values, the same
    with a key given twice, or any text at all."""
    doc = BASE
    for key, value in draw(st.lists(st.tuples(KEYS, VALUES), max_size=4)):
        doc = with_value(doc, key, value)
    text = yaml.safe_dump(doc, allow_unicode=True)
    kind = draw(st.sampled_from(["mapping", "duplicate", "text"]))
    if kind == "duplicate":
        line = draw(st.sampled_from([t for t in text.splitlines() if t and t[0] != " "]))
        return f"{text}{line}\n"
    return draw(st.text(max_size=80)) if kind == "text" else text


SETS = st.lists(
    st.tuples(KEYS, st.one_of(st.text(max_size=12), VALUES.map(yaml.safe_dump))).map(
        lambda kv: f"{kv[0]}={kv[1].strip()}"
    ),
    max_size=3,
)


def assert_one_line_refusal_or_config(path: Path, sets: list[str]) -> None:
    try:
        cfg = resolve_experiment(path, sets=sets)
    except ConfigError as err:
        message = str(err)
        assert message and "\n" not in message, repr(message)
        return
    assert isinstance(cfg, dict) and cfg["method"] in METHODS


@BOUNDED
@given(text=documents())
def test_any_document_is_read_or_refused_in_one_line(text, tmp_path):
    path = tmp_path / "generated.yaml"
    path.write_text(text, encoding="utf-8")
    assert_one_line_refusal_or_config(path, [])


@BOUNDED
@given(sets=SETS)
def test_any_set_value_is_read_or_refused_in_one_line(sets):
    assert_one_line_refusal_or_config(ROOT / "experiments" / "quickstart.yaml", sets)


@pytest.mark.filterwarnings("ignore")
@settings(BOUNDED, max_examples=20)
@given(text=documents())
def test_ssfl_validate_exits_0_or_2_with_one_line(text, tmp_path, capsys):
    path = tmp_path / "generated.yaml"
    path.write_text(text, encoding="utf-8")
    code = main(["validate", str(path)])
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert (code, err) in ((0, ""), (2, "")), (code, err)
    assert len(lines) == 1 and lines[0].startswith("ok " if code == 0 else "FAIL "), lines


def test_a_method_that_is_not_a_name_is_refused_in_one_line(tmp_path):
    path = tmp_path / "listed.yaml"
    path.write_text("method: []\nrounds: 1\n")
    with pytest.raises(ConfigError, match=r"^config key 'method': unknown method \[\] \(allowed"):
        resolve_experiment(path)
    with pytest.raises(ConfigError, match=r"unknown method \{'a': 1\}"):
        resolve_experiment(ROOT / "experiments" / "quickstart.yaml", sets=["method={a: 1}"])


def test_a_key_with_a_line_break_is_named_escaped_on_one_line(tmp_path):
    path = tmp_path / "broken-key.yaml"
    path.write_text('method: fedseal\n"a\\fb\\nc": 1\n')
    with pytest.raises(ConfigError) as refused:
        resolve_experiment(path)
    assert str(refused.value).startswith("unknown config key 'a\\x0cb\\nc' (allowed under")
    assert len(str(refused.value).splitlines()) == 1

"""The method registry: lazy, one line per method, renamed names refused with one line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ssfl.experiment import resolve_config
from ssfl.registry import METHODS, method
from strategies.loop import ServerHalf
from tasks.config import ConfigError
from tests.conftest import ROOT


def test_every_method_resolves_to_its_two_halves():
    from client_app.base import ClientHalf

    for name, spec in METHODS.items():
        assert issubclass(spec.server_half(), ServerHalf), name
        client = spec.client_half()
        assert client is None or issubclass(client, ClientHalf), name
    assert METHODS["server_sl"].client_half() is None


def test_the_old_name_of_a_renamed_method_is_a_one_line_error():
    with pytest.raises(ConfigError, match="'ssfl_fedavg' was renamed to 'fedavg_with_server'"):
        resolve_config({"method": "ssfl_fedavg"})
    with pytest.raises(ConfigError, match="unknown method 'nope'"):
        method("nope")


def test_importing_the_registry_imports_no_method_module():
    code = (
        "import sys, ssfl.registry, client_app.app; "
        "print(sorted(m for m in sys.modules if m.startswith(('strategies', 'server_app'))))"
    )
    assert fresh_interpreter(code) == "[]"


def test_resolving_every_method_and_starting_a_client_load_no_server_only_module():
    """What the CLI imports before the SuperLink boots, and each client actor at its start:
    neither needs Flower's in-memory grid (its LinkState, SQLAlchemy: ~0.85 s) nor SciPy
    (~0.3-1.8 s); both are imported where they are used (docs/benchmarks.md, start-up)."""
    code = (
        "import sys, client_app.app\n"
        "from ssfl.registry import METHODS, settings_of\n"
        "from ssfl.experiment import resolve_config\n"
        "for name in METHODS:\n"
        "    settings_of(resolve_config({'method': name}))\n"
        "    METHODS[name].client_half()\n"
        "heavy = ('flwr.superlink.grid.inmemory_grid', 'sqlalchemy', 'scipy', 'dp_accounting')\n"
        "print(sorted(m for m in heavy if m in sys.modules))"
    )
    assert fresh_interpreter(code) == "[]"


def fresh_interpreter(code: str) -> str:
    """What ``code`` prints in a new interpreter at the repository root (it must not fail)."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()

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
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"

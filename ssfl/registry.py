"""The method registry: one line per method, name -> server half and client half.

Both halves are import strings, resolved on first use, so that a client process
imports only client-side code and nothing here imports a method module.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from tasks.config import ConfigError


@dataclass(frozen=True)
class Method:
    """A method's two halves as ``module:Class`` strings (client None: server only)."""

    server: str
    client: str | None

    def server_half(self) -> Any:
        """The server half (a ``strategies.loop.ServerHalf`` subclass)."""
        return load(self.server)

    def client_half(self) -> Any:
        """The client half (a ``client_app.base.ClientHalf`` subclass), or None."""
        return None if self.client is None else load(self.client)


METHODS: dict[str, Method] = {
    "server_sl": Method("strategies.server_sl:ServerSL", None),
    "fedavg_sl": Method("strategies.fedavg_sl:FedAvgSL", "client_app.supervised:SupervisedClient"),
    "fedprox_sl": Method("strategies.fedavg_sl:FedProxSL", "client_app.supervised:SupervisedClient"),
    "fedavg_fixmatch": Method("strategies.fixmatch:FedAvgFixMatch", "client_app.fixmatch:FixMatchClient"),
    "fedavg_uda": Method("strategies.uda:FedAvgUDA", "client_app.uda:UDAClient"),
    "fedseal": Method("strategies.fedseal:FedSEAL", "client_app.fedseal:FedSEALClient"),
    "fedavg_with_server": Method("strategies.fedavg_with_server:FedAvgWithServer", "client_app.pseudo_label:PseudoLabelClient"),
    "fedrgd": Method("strategies.fedrgd:FedRGD", "client_app.pseudo_label:PseudoLabelClient"),
    "fedmatch": Method("strategies.fedmatch:FedMatch", "client_app.fedmatch:FedMatchClient"),
    "fedavg_simclr": Method("strategies.fedavg_ssl:FedAvgSimCLR", "client_app.ssl:SimCLRClient"),
    "fedavg_simsiam": Method("strategies.fedavg_ssl:FedAvgSimSiam", "client_app.ssl:SimSiamClient"),
    "fedavg_byol": Method("strategies.fedavg_ssl:FedAvgBYOL", "client_app.ssl:BYOLClient"),
    "fedsup": Method("strategies.fedsup:FedSup", "client_app.fedsup:FedSupClient"),
    "fedossl": Method("strategies.fedossl:FedoSSL", "client_app.fedossl:FedoSSLClient"),
}  # fmt: skip

# Old method names: a one-line error names the new one.
RENAMED = {"ssfl_fedavg": "fedavg_with_server"}


def load(target: str) -> Any:
    """Import ``module:attribute``."""
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


def method(name: str) -> Method:
    """The registered method ``name``; an unknown or renamed one is a ConfigError."""
    if name in RENAMED:
        raise ConfigError(
            f"config key 'method': {name!r} was renamed to {RENAMED[name]!r}; use the new name"
        )
    if name not in METHODS:
        allowed = ", ".join(sorted(METHODS))
        raise ConfigError(f"config key 'method': unknown method {name!r} (allowed: {allowed})")
    return METHODS[name]

"""The method registry: one line per method, name -> server half, client half and the
class declaring its ``algo`` settings.

All three are import strings, resolved on first use, so that a client process imports
only client-side code and nothing here imports a method module. A method's settings
class lives in its client half's module (both processes import it) or in tasks.settings.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tasks.config import ConfigError
from tasks.settings import AlgoSettings, Settings, typed


@dataclass(frozen=True)
class Method:
    """A method's two halves and its ``algo`` settings class as ``module:Class`` strings
    (client None: server only; settings None: no keys of its own)."""

    server: str
    client: str | None
    settings: str | None = None

    def server_half(self) -> Any:
        """The server half (a ``strategies.loop.ServerHalf`` subclass)."""
        return load(self.server)

    def client_half(self) -> Any:
        """The client half (a ``client_app.base.ClientHalf`` subclass), or None."""
        return None if self.client is None else load(self.client)

    def settings_class(self) -> type[AlgoSettings]:
        """The dataclass declaring the method's ``algo`` keys."""
        return AlgoSettings if self.settings is None else load(self.settings)


METHODS: dict[str, Method] = {
    "server_sl": Method("strategies.server_sl:ServerSL", None),
    "fedavg_sl": Method("strategies.fedavg_sl:FedAvgSL", "client_app.supervised:SupervisedClient"),
    "fedprox_sl": Method("strategies.fedavg_sl:FedProxSL", "client_app.supervised:SupervisedClient"),
    "fedavg_fixmatch": Method("strategies.fixmatch:FedAvgFixMatch", "client_app.fixmatch:FixMatchClient", "tasks.settings:ConsistencySettings"),
    "fedavg_uda": Method("strategies.uda:FedAvgUDA", "client_app.uda:UDAClient", "client_app.uda:UDASettings"),
    "fedseal": Method("strategies.fedseal:FedSEAL", "client_app.fedseal:FedSEALClient", "client_app.fedseal:FedSEALSettings"),
    "fedavg_with_server": Method("strategies.fedavg_with_server:FedAvgWithServer", "client_app.pseudo_label:PseudoLabelClient", "client_app.pseudo_label:PseudoLabelSettings"),
    "fedrgd": Method("strategies.fedrgd:FedRGD", "client_app.pseudo_label:PseudoLabelClient", "client_app.pseudo_label:FedRGDSettings"),
    "fedmatch": Method("strategies.fedmatch:FedMatch", "client_app.fedmatch:FedMatchClient", "client_app.fedmatch:FedMatchSettings"),
    "fedavg_simclr": Method("strategies.fedavg_ssl:FedAvgSimCLR", "client_app.ssl:SimCLRClient", "client_app.ssl:SimCLRSettings"),
    "fedavg_simsiam": Method("strategies.fedavg_ssl:FedAvgSimSiam", "client_app.ssl:SimSiamClient", "tasks.settings:RandAugmentSettings"),
    "fedavg_byol": Method("strategies.fedavg_ssl:FedAvgBYOL", "client_app.ssl:BYOLClient", "client_app.ssl:BYOLSettings"),
    "fedsup": Method("strategies.fedsup:FedSup", "client_app.fedsup:FedSupClient", "client_app.fedsup:FedSupSettings"),
    "fedossl": Method("strategies.fedossl:FedoSSL", "client_app.fedossl:FedoSSLClient", "client_app.fedossl:FedoSSLSettings"),
}  # fmt: skip

# Old method names: a one-line error names the new one.
RENAMED = {"ssfl_fedavg": "fedavg_with_server"}


def load(target: str) -> Any:
    """Import ``module:attribute``."""
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


def method(name: str) -> Method:
    """The registered method ``name``; an unknown or renamed one (or not a name: a list, a
    mapping) is a ConfigError."""
    if isinstance(name, str) and name in RENAMED:
        raise ConfigError(
            f"config key 'method': {name!r} was renamed to {RENAMED[name]!r}; use the new name"
        )
    if not isinstance(name, str) or name not in METHODS:
        allowed = ", ".join(sorted(METHODS))
        raise ConfigError(f"config key 'method': unknown method {name!r} (allowed: {allowed})")
    return METHODS[name]


def settings_of(cfg: Mapping[str, Any]) -> Settings:
    """The typed settings of a checked config (its method's ``algo`` class)."""
    return typed(Settings, cfg, lambda name: method(name).settings_class())

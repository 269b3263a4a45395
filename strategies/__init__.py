"""The method registry: name -> (server half, client half). One line per method."""

from __future__ import annotations

from typing import NamedTuple

from client_app.base import ClientHalf
from client_app.fedmatch import FedMatchClient
from client_app.fedseal import FedSEALClient
from client_app.fixmatch import FixMatchClient
from client_app.ssfl_fedavg import SSFLClient
from client_app.supervised import SupervisedClient
from client_app.uda import UDAClient
from strategies.base import SSFLStrategy
from strategies.fedavg_sl import FedAvgSL, FedProxSL
from strategies.fedmatch import FedMatch
from strategies.fedrgd import FedRGD
from strategies.fedseal import FedSEAL
from strategies.fixmatch import FedAvgFixMatch
from strategies.server_sl import ServerSL
from strategies.ssfl_fedavg import SSFLFedAvg
from strategies.uda import FedAvgUDA


class Method(NamedTuple):
    strategy: type[SSFLStrategy]
    client: type[ClientHalf] | None

    def defaults(self):
        return self.strategy.defaults()


METHODS: dict[str, Method] = {
    "server_sl": Method(ServerSL, None),
    "fedavg_sl": Method(FedAvgSL, SupervisedClient),
    "fedprox_sl": Method(FedProxSL, SupervisedClient),
    "fedavg_fixmatch": Method(FedAvgFixMatch, FixMatchClient),
    "fedavg_uda": Method(FedAvgUDA, UDAClient),
    "fedseal": Method(FedSEAL, FedSEALClient),
    "ssfl_fedavg": Method(SSFLFedAvg, SSFLClient),
    "fedrgd": Method(FedRGD, SSFLClient),
    "fedmatch": Method(FedMatch, FedMatchClient),
}

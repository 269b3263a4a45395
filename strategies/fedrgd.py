"""FedRGD: grouping-based model averaging of the SSFL benchmark (Zhang, Yao et al., eq. 7).

FedAvg with the server's model joining (eq. 4-5) with eq. 7 in its place: the users
that replied are shuffled into S = algo.groups groups, the server's model joins every
group, and the users of a group start the next round from their group's average
(strategies.parts.GroupedAverage). With fewer users than S, there are as many groups
as users.
"""

from __future__ import annotations

from strategies.fedavg_with_server import FedAvgWithServer
from strategies.parts import GroupedAverage, ServerSide


class FedRGD(FedAvgWithServer):
    """FedAvg with the server's model joining, grouped (eq. 7 in place of eq. 4); keys:
    client_app.pseudo_label.FedRGDSettings."""

    privacy_refusal = (
        "averages in groups (one model a group, each of fewer clients), which the one noised "
        "mean of DP-FedAvg does not calibrate"
    )

    @classmethod
    def aggregator(cls, server: ServerSide) -> GroupedAverage:
        algo = server.settings.algo
        return GroupedAverage(server, algo.groups, algo.server_weight)

"""FedAvg-SL and FedProx-SL: upper bounds where clients are given their true labels."""

from __future__ import annotations

from typing import Any

from strategies.loop import ServerHalf


class FedAvgSL(ServerHalf):
    """Plain FedAvg over supervised client training (McMahan et al. 2017)."""


class FedProxSL(FedAvgSL):
    """FedAvg-SL with the FedProx proximal term (Li et al. 2020, eq. 2), mu = 0.01."""

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        return {"client": {"proximal_mu": 0.01}}

"""Client-level differential privacy around a model-averaging aggregator (DP-FedAvg,
McMahan et al. 2018; adaptive clipping, Andrew et al. 2021), with Flower's own clipping
and noise-calibration functions (``flwr.supercore.differential_privacy``).

Flower's DP strategy wrappers cannot wrap :class:`strategies.loop.RoundLoop` (its
``start`` drives its own rounds; a wrapper's ``start`` would run Flower's loop without
the server's step, evaluation and checkpoints), so this aggregator does their work inside
the loop (docs/privacy.md): each accepted update (client model minus the round's start
model, floating arrays) is clipped to the clipping norm (``server_*``; ``client_*``: the
clients clipped it, client_app/base.py), the clipped models are averaged with equal
weights, and Gaussian noise of std z * C / n (n averaged clients) is added to the
average's floating arrays. Integer buffers (BatchNorm's batch counter) keep the start
model's values, so nothing of a client passes through them un-noised.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, RecordDict
from flwr.supercore.differential_privacy import (
    KEY_CLIPPING_NORM,
    KEY_NORM_BIT,
    compute_adaptive_noise_params,
    compute_stdv,
)

from ssfl.records import record_arrays, to_record
from strategies.parts import Aggregator, Metrics, ServerSide, Update
from tasks.privacy import State, clipped_model, epsilon, floating_keys, scaled_update
from tasks.settings import PrivacySettings, Settings
from tasks.train import derive_seed


def noised(state: State, std: float, rng: np.random.Generator) -> State:
    """``state`` with N(0, std^2) added to every floating value (drawn in float64)."""
    out = dict(state)
    for key in floating_keys(state):
        value = np.asarray(state[key], np.float64)
        out[key] = (value + rng.normal(0.0, std, value.shape)).astype(state[key].dtype)
    return out


def sampled_clients(settings: Settings) -> int:
    """Clients a round samples (federation.clients_per_round; 0 = all)."""
    return settings.federation.clients_per_round or settings.split.num_clients


def noise_params(settings: Settings) -> tuple[float, float]:
    """(sigma_b, z_delta): the unclipped count's noise std and the update's noise multiplier
    (Flower's compute_adaptive_noise_params for ``*_adaptive``, which splits z between the
    two releases; the fixed modes: 0 and z). Raises ValueError when sigma_b is too small."""
    p = settings.privacy
    if not p.mode.endswith("adaptive"):
        return 0.0, p.noise_multiplier
    given = None if p.clipped_count_stddev < 0 else p.clipped_count_stddev
    return compute_adaptive_noise_params(p.noise_multiplier, sampled_clients(settings), given)


class PrivateAggregator:
    """``inner`` (a model average) on clipped updates with equal weights, plus noise; the
    clipping norm (adapted each round in ``*_adaptive``) and the epsilon spent so far."""

    def __init__(self, server: ServerSide, inner: Aggregator):
        self.inner = inner
        self.settings = server.settings
        self.options: PrivacySettings = server.settings.privacy
        self.clipping_norm = self.options.clipping_norm
        self.count_std, self.update_z = noise_params(server.settings)
        self.releases = 0  # noised aggregates released so far
        self.started_from: dict[int, ArrayRecord] = {}

    @property
    def on_clients(self) -> bool:
        return self.options.mode.startswith("client")

    @property
    def adaptive(self) -> bool:
        return self.options.mode.endswith("adaptive")

    def client_config(self) -> dict[str, Any]:
        """What a client's round config carries: the clipping norm in ``client_*``."""
        return {KEY_CLIPPING_NORM: self.clipping_norm} if self.on_clients else {}

    def start_model(self, server_round: int, pid: int, arrays: ArrayRecord) -> ArrayRecord:
        sent = self.inner.start_model(server_round, pid, arrays)
        self.started_from[pid] = sent
        return sent

    def clip(self, updates: list[Update]) -> tuple[list[Update], int, list[float]]:
        """Each update clipped (``server_*``; ``client_*``: taken as sent, integer arrays the
        start's) as an equal-weight update; how many were longer than the norm (``client_*``:
        as the clients' norm bits say) and each update's norm as it arrived."""
        out, clipped, norms = [], 0, []
        bound = math.inf if self.on_clients else self.clipping_norm
        for u in updates:
            model, norm = clipped_model(u.arrays, record_arrays(self.started_from[u.pid]), bound)
            if self.on_clients:
                clipped += int(bool(u.content["metrics"].get(KEY_NORM_BIT, False)))
            else:
                clipped += int(norm > bound)
            norms.append(norm)
            content = RecordDict({"arrays": to_record(model), "metrics": u.content["metrics"]})
            out.append(Update(u.pid, 1, content))
        return out, clipped, norms

    @property
    def poisson(self) -> bool:
        return self.options.sampling == "poisson"

    def denominator(self, averaged: int) -> int:
        """The n of the noise's std z C / n and of the adaptive count: the clients averaged,
        or with Poisson sampling the expected count qN (clients_per_round)."""
        return sampled_clients(self.settings) if self.poisson else averaged

    def aggregate(self, server_round: int, updates: list[Update]) -> tuple[ArrayRecord, Metrics]:
        """The noised average of the clipped updates and the round's privacy metrics (with
        Poisson sampling each clipped update scaled by n / qN first: the sum over qN)."""
        private, clipped, norms = self.clip(updates)
        n = self.denominator(len(private))
        if n != len(private):
            private = [self.scaled(u, len(private) / n) for u in private]
        record, metrics = self.inner.aggregate(server_round, private)
        std, rng = self.noise(server_round, n)
        average = noised(record_arrays(record), std, rng)
        self.releases += 1
        metrics.update(
            {
                "clipping_norm": self.clipping_norm,
                "clipped_fraction": clipped / len(private),
                "update_norm_median": float(np.median(norms)),
                "noise_std": std,
                **self.spent(),
            }
        )
        if self.adaptive:
            self.adapt(len(private) - clipped, n, rng)
        return to_record(average), metrics

    def aggregate_none(self, server_round: int, arrays: ArrayRecord) -> tuple[ArrayRecord, Metrics]:
        """A Poisson round that sampled no client: the global model plus the noise (an
        unchanged model would tell that the sample was empty), counted as a release."""
        n = self.denominator(0)
        std, rng = self.noise(server_round, n)
        self.releases += 1
        metrics: Metrics = {"clipping_norm": self.clipping_norm, "noise_std": std, **self.spent()}
        if self.adaptive:
            self.adapt(0, n, rng)
        return to_record(noised(record_arrays(arrays), std, rng)), metrics

    def noise(self, server_round: int, n: int) -> tuple[float, np.random.Generator]:
        """The noise's std z C / n and the round's generator (seeded by the run and round)."""
        std = compute_stdv(self.update_z, self.clipping_norm, n)
        return std, np.random.default_rng(derive_seed(self.settings.seed, "privacy", server_round))

    def scaled(self, update: Update, factor: float) -> Update:
        """``update`` (a clipped model) with its change from its start model times
        ``factor``, floating arrays only."""
        start = record_arrays(self.started_from[update.pid])
        model = scaled_update(update.arrays, start, factor)
        content = RecordDict({"arrays": to_record(model), "metrics": update.content["metrics"]})
        return Update(update.pid, update.num_examples, content)

    def adapt(self, unclipped: int, total: int, rng: np.random.Generator) -> None:
        """Andrew et al. 2021, Algorithm 1: C <- C exp(-eta_C (b - gamma)), b the noised
        fraction of updates at most C long (Flower 1.41's wrappers use the clipped fraction
        with this sign, which shrinks C when most updates are clipped: docs/privacy.md)."""
        b = (unclipped + rng.normal(0.0, self.count_std)) / total
        o = self.options
        self.clipping_norm *= math.exp(-o.clip_norm_lr * (b - o.target_clipped_quantile))

    def spent(self) -> Metrics:
        """``epsilon`` at ``delta`` (privacy.target_delta) after the releases so far (by
        privacy.accountant; None without noise: no guarantee)."""
        rate = sampled_clients(self.settings) / self.settings.split.num_clients
        z, delta = self.options.noise_multiplier, self.options.target_delta
        spent = epsilon(z, rate, self.releases, delta, self.options.accountant)
        return {"epsilon": spent if math.isfinite(spent) else None, "delta": delta}

    def state(self) -> dict[str, Any]:
        """The inner aggregator's state, the clipping norm and the releases so far."""
        return {
            "inner": self.inner.state(),
            "clipping_norm": self.clipping_norm,
            "releases": self.releases,
        }

    def restore(self, state: dict[str, Any]) -> None:
        self.inner.restore(state["inner"])
        self.clipping_norm = float(state["clipping_norm"])
        self.releases = int(state["releases"])

"""Client-level differential privacy's pieces: a client's update clipped (Flower's clipping
function) and the privacy a run has spent, epsilon at a delta for the subsampled Gaussian
mechanism of DP-FedAvg (McMahan et al. 2018), from Google's ``dp-accounting``.

Each round releases one noised aggregate of clipped client updates: a Gaussian mechanism
of noise multiplier z on a sample of the clients, which the accountant treats as Poisson
sampling at rate q = clients per round / clients (docs/privacy.md: what this assumes).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
from flwr.supercore.differential_privacy import compute_clip_model_update, get_norm

if TYPE_CHECKING:
    from dp_accounting import dp_event

State = dict[str, np.ndarray]

# The RDP orders epsilon is minimised over: integers, whose terms dp-accounting computes in
# closed form (fractional orders below 2 need a series that may not converge and are left
# out with a warning at sampling rates above ~0.1).
RDP_ORDERS = [*range(2, 65), 80, 96, 128, 192, 256, 512, 1024]


def floating_keys(state: State) -> list[str]:
    """The keys of the floating arrays (parameters and BatchNorm's running statistics)."""
    return [key for key, value in state.items() if np.issubdtype(value.dtype, np.floating)]


def clipped_model(model: State, start: State, bound: float) -> tuple[State, float]:
    """``start`` plus the update ``model - start`` of the floating arrays scaled to L2 norm
    at most ``bound`` (Flower's compute_clip_model_update, in float64), integer arrays the
    start's; and the update's norm before clipping."""
    keys = floating_keys(start)
    params = [np.asarray(model[k], np.float64) for k in keys]
    starts = [np.asarray(start[k], np.float64) for k in keys]
    norm = get_norm([p - s for p, s in zip(params, starts)])
    if norm > 0:
        compute_clip_model_update(params, starts, bound)
    out = dict(start)
    out.update({k: p.astype(start[k].dtype) for k, p in zip(keys, params)})
    return out, norm


def scaled_update(model: State, start: State, factor: float) -> State:
    """``start`` plus ``factor`` times the update ``model - start`` of the floating arrays
    (in float64), integer arrays the start's."""
    out = dict(start)
    for key in floating_keys(start):
        change = np.asarray(model[key], np.float64) - np.asarray(start[key], np.float64)
        out[key] = (np.asarray(start[key], np.float64) + factor * change).astype(start[key].dtype)
    return out


def round_event(noise_multiplier: float, rate: float, rounds: int) -> dp_event.DpEvent:
    """``rounds`` releases of the Gaussian mechanism with ``noise_multiplier`` on a Poisson
    sample of the clients at ``rate``. dp-accounting is imported here, not with the module:
    it brings SciPy, about a second of every client process's start otherwise."""
    from dp_accounting import dp_event

    gaussian = dp_event.GaussianDpEvent(noise_multiplier)
    sampled = gaussian if rate >= 1 else dp_event.PoissonSampledDpEvent(rate, gaussian)
    return dp_event.SelfComposedDpEvent(sampled, rounds)


def epsilon(
    noise_multiplier: float, rate: float, rounds: int, delta: float, accountant: str = "rdp"
) -> float:
    """Epsilon at ``delta`` after ``rounds`` releases (0 before the first; inf without
    noise), by the RDP accountant (Mironov 2017; the default) or the privacy-loss
    distribution one (``pld``: tighter, about 0.5 s a call)."""
    if rounds == 0:
        return 0.0
    if noise_multiplier == 0:
        return math.inf
    from dp_accounting.pld import pld_privacy_accountant
    from dp_accounting.rdp import rdp_privacy_accountant

    if accountant == "rdp":
        spent = rdp_privacy_accountant.RdpAccountant(RDP_ORDERS)
    else:
        spent = pld_privacy_accountant.PLDAccountant()
    spent.compose(round_event(noise_multiplier, rate, rounds))
    return float(spent.get_epsilon(delta))


Z_STEP = 1e-4  # the solved noise multiplier's resolution


def noise_for_epsilon(
    target: float,
    rate: float,
    rounds: int,
    delta: float,
    accountant: str = "rdp",
    guess: float | None = None,
) -> float:
    """The smallest noise multiplier z, to 4 decimals, whose epsilon at ``delta`` after
    ``rounds`` releases is at most ``target`` (bisection, since epsilon falls as z grows),
    as Opacus' ``make_private_with_epsilon`` solves for its sigma. A ``guess`` that is
    already that z is checked in two accountings and returned."""
    if target <= 0:
        raise ValueError(f"target epsilon {target}: must be above 0")

    def reaches(z: float) -> bool:
        return z > 0 and epsilon(z, rate, rounds, delta, accountant) <= target

    if guess is not None and reaches(guess) and not reaches(round(guess - Z_STEP, 4)):
        return guess
    high = 1.0
    while not reaches(high):
        high *= 2
        if high > 1e4:
            raise ValueError(f"no noise multiplier up to 1e4 reaches epsilon {target}")
    low = 0.0
    while high - low > Z_STEP:
        middle = (low + high) / 2
        low, high = (low, middle) if reaches(middle) else (middle, high)
    z = math.ceil(high / Z_STEP) * Z_STEP
    return round(z - Z_STEP, 4) if reaches(round(z - Z_STEP, 4)) else round(z, 4)

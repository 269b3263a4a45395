"""GPU shares of simulated clients, and the device checks a run makes before it starts.

Ray hides the GPU from an actor that asks for no GPU (``CUDA_VISIBLE_DEVICES=''``), so a
client trains on the GPU only when its actor holds a share of one. ``simulation.num_gpus``
is that share; its default, :data:`AUTO_SHARE`, picks one: nothing when the experiment's
device is ``cpu`` or the machine has no GPU, else the machine's GPUs divided among the
clients of a round (at most one GPU each), so that a whole round trains at once.
"""

from __future__ import annotations

import math
import os

from tasks.config import ConfigError
from tasks.settings import Settings

# simulation.num_gpus's default: the share is picked by :func:`client_gpu_share`.
AUTO_SHARE = -1.0
# Ray counts fractional resources in steps of 1e-4; a share is rounded down to one.
SHARE_STEP = 1e-4


def gpu_count() -> int:
    """CUDA GPUs torch sees in this process (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def clients_a_round(settings: Settings) -> int:
    """Clients sampled each round: federation.clients_per_round, 0 meaning all."""
    return settings.federation.clients_per_round or settings.split.num_clients


def cohort_workers(settings: Settings, gpus: int, cpus: int | None = None) -> int:
    """Worker SuperNodes of a cohort simulation: simulation.workers, else two per GPU the
    clients train on, else one per simulation.num_cpus CPUs; at most the clients."""
    sim = settings.simulation
    if sim.workers:
        return min(sim.workers, settings.split.num_clients)
    if settings.device != "cpu" and gpus and sim.num_gpus != 0:
        auto = 2 * gpus
    else:
        auto = max(1, (cpus or os.cpu_count() or 1) // sim.num_cpus)
    return max(1, min(auto, settings.split.num_clients))


def simulated_nodes(settings: Settings, gpus: int) -> int:
    """The simulation's SuperNodes: one a client, or the cohort workers."""
    if settings.simulation.execution == "cohort":
        return cohort_workers(settings, gpus)
    return settings.split.num_clients


def auto_share(gpus: int, clients: int) -> float:
    """``gpus`` GPUs divided among ``clients`` actors, at most 1 each, rounded down to
    Ray's resource step (never below one step)."""
    share = min(1.0, gpus / max(clients, 1))
    return max(SHARE_STEP, math.floor(share / SHARE_STEP) * SHARE_STEP)


def client_gpu_share(settings: Settings, gpus: int) -> float:
    """The GPU share of every client actor: simulation.num_gpus when set (>= 0), else
    (auto) 0 on ``device: cpu`` or without a GPU, and :func:`auto_share` otherwise."""
    share = float(settings.simulation.num_gpus)
    if share != AUTO_SHARE:
        return share
    if settings.device == "cpu" or gpus == 0:
        return 0.0
    if settings.simulation.execution == "cohort":
        return auto_share(gpus, cohort_workers(settings, gpus))
    return auto_share(gpus, clients_a_round(settings))


def check_cuda(device: str, num_gpus: float, gpus: int) -> None:
    """ConfigError (one line) when ``device: cuda`` cannot reach a GPU: the machine has
    none, or the clients' share (simulation.num_gpus) is 0, which hides it from them."""
    if device != "cuda":
        return
    if gpus == 0:
        raise ConfigError(
            "config key 'device': 'cuda', but torch sees no CUDA GPU on this machine "
            "(use device: auto or cpu)"
        )
    if num_gpus == 0:
        raise ConfigError(
            "config keys 'device' and 'simulation.num_gpus': device 'cuda' with a zero GPU "
            "share hides the GPU from every client (set simulation.num_gpus > 0, or -1 = auto)"
        )


def check_run_device(settings: Settings, gpus: int) -> float:
    """The clients' GPU share of a resolved experiment, after :func:`check_cuda`."""
    share = client_gpu_share(settings, gpus)
    check_cuda(settings.device, share, gpus)
    return share

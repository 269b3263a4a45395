"""Training and evaluation loops shared by the server and client halves (no Flower inside)."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import math
import sys
from collections.abc import Callable, Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from tasks.losses import proximal_term
from tasks.settings import LrScheduleSettings, OptimizerSettings

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

# glibc mallopt parameters, and the values keep_freed_memory sets.
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
TRIM_THRESHOLD_BYTES = 1 << 30  # freed heap kept for reuse, up to this much


@functools.cache
def keep_freed_memory() -> bool:
    """Let glibc's malloc keep freed tensor buffers for reuse (once per process).

    With its defaults, the megabyte buffers of a training or evaluation step (the
    activations of a batch) are mapped and unmapped, or trimmed from the heap, as they
    are freed, and every new one is faulted in and zeroed page by page by the kernel:
    on the SSFL benchmark's client round ~250,000 page faults and 0.5 s of system time
    in a 1.2 s round, a third of a 10,000-image test evaluation (docs/benchmarks.md).
    Here every buffer comes from the heap (no mmap) and up to TRIM_THRESHOLD_BYTES of
    freed heap is kept. Numbers are unchanged. False where the C library is not glibc
    (it is then left as it is).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run the block with ``threads`` torch intra-op threads (None: as they are), then
    restore the count."""
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def resolve_device(name: str) -> torch.device:
    """'auto' picks CUDA when there is one; 'cuda' without one is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' requested but torch sees no CUDA device")
    return torch.device(name)


# The reply record in which a client names the device it trained on.
DEVICE_RECORD = "device"


def device_name(device: torch.device) -> str:
    """'cpu', or 'cuda:N' with N the index torch uses in this process (an actor that holds
    a GPU share sees its GPU as cuda:0)."""
    if device.type == "cuda":
        index = torch.cuda.current_device() if device.index is None else device.index
        return f"cuda:{index}"
    return str(device)


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from any parts (seed, round, partition, ...), stable across processes."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") & ((1 << 63) - 1)


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[torch.Generator]:
    """A seeded stretch of work: torch's global RNG (weight init, augmentation) is seeded
    with ``seed`` inside and restored to the caller's state on exit; yields a CPU
    generator with the same seed for batch order."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        yield torch.Generator().manual_seed(seed)


def autocast(amp: str, device: torch.device) -> contextlib.AbstractContextManager:
    """bf16 autocast on ``device`` when ``amp`` (``train.amp``) is "bf16", else nothing."""
    if amp == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def running_sum(device: torch.device) -> torch.Tensor:
    """A float64 zero on ``device`` to add each step's loss to: the loop never waits for
    the device, and the sum is the one a Python float sum of the same losses gives."""
    return torch.zeros((), dtype=torch.float64, device=device)


def to_float(images: torch.Tensor, device: torch.device) -> torch.Tensor:
    """uint8 (N, C, H, W) -> float32 in [0, 1] on ``device``."""
    return images.to(device=device, dtype=torch.float32).div_(255.0)


def make_sgd(
    params: Iterable[nn.Parameter],
    lr: float,
    momentum: float,
    weight_decay: float,
    nesterov: bool = False,
) -> torch.optim.SGD:
    """SGD; Nesterov needs momentum > 0 (the config refuses the pair before any run)."""
    if nesterov and momentum <= 0:
        raise ValueError("Nesterov momentum needs momentum > 0")
    return torch.optim.SGD(
        params, lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov
    )


def cosine_warmup_lr(
    step: int, base_lr: float, total_steps: float, warmup_steps: float, cycles: float, floor: float
) -> float:
    """SSFL benchmark App. A.3, eq. 9, with t = ``step`` (0-based SGD iteration):

    gamma_t = gamma * max(cos(pi * c * (t - eM/B) / (EM/B - eM/B)), eps)

    where EM/B = ``total_steps``, eM/B = ``warmup_steps``, c = ``cycles``, eps = ``floor``.
    During the warm-up (t < eM/B) the rate rises linearly, gamma * (t + 1) / (eM/B)
    (gradual warm-up of Goyal et al. 2017, which eq. 9 cites).
    """
    if warmup_steps > 0 and step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(total_steps - warmup_steps, 1.0)
    return base_lr * max(math.cos(math.pi * cycles * progress), floor)


def steps_per_round(n: int, batch_size: int, epochs: int, local_steps: int) -> int:
    """SGD steps of one round: T = ``local_steps`` when > 0, else ``epochs`` passes over n."""
    if local_steps > 0:
        return local_steps
    return epochs * math.ceil(n / batch_size) if n else 0


def scheduled_lr(
    half: OptimizerSettings,
    schedule: LrScheduleSettings,
    rounds: int,
    rnd: int,
    step: int,
    round_steps: int,
) -> float:
    """Learning rate of step ``step`` of round ``rnd`` for one half (``server`` or ``client``).

    ``exponential``: lr * lr_decay^(rnd - 1), constant within a round. ``multistep``: see
    :func:`multistep_lr`. ``cosine``: eq. 9
    over the global step t = (rnd - 1) * round_steps + step, one epoch being
    ``epoch_samples`` / batch_size steps (M / B); ``epochs`` 0 = the whole run.
    Round 0 (the server's bootstrap) runs at the base rate.
    """
    if schedule.name == "exponential" or rnd < 1:
        return half.lr * half.lr_decay ** max(rnd - 1, 0)
    if schedule.name == "multistep":
        milestones = (schedule.first_milestone, schedule.second_milestone)
        return multistep_lr(half.lr, rnd, rounds, milestones, schedule.gamma)
    epoch_steps = schedule.epoch_samples / half.batch_size
    total = schedule.epochs * epoch_steps or rounds * round_steps
    return cosine_warmup_lr(
        (rnd - 1) * round_steps + step,
        half.lr,
        total,
        schedule.warmup_epochs * epoch_steps,
        schedule.cycles,
        schedule.floor,
    )


def multistep_lr(
    lr: float, rnd: int, rounds: int, milestones: tuple[float, ...], gamma: float
) -> float:
    """lr x gamma^k for round ``rnd``, k the milestones m with rnd - 1 >= m x rounds: the
    FedoSSL official code's MultiStepLR (milestones 140 and 180 of 5 x 40 local epochs,
    gamma 0.1), with the round as the unit."""
    passed = sum(rnd - 1 >= m * rounds for m in milestones)
    return lr * gamma**passed


def minibatches(
    n: int,
    batch_size: int,
    generator: torch.Generator,
    drop_last: bool = False,
    device: torch.device | str = "cpu",
) -> Iterator[torch.Tensor]:
    """Random index batches covering 0..n-1 once, on ``device`` (the permutation is drawn
    from ``generator`` and copied there once per pass, not once per batch)."""
    order = torch.randperm(n, generator=generator).to(device)
    stop = n - n % batch_size if drop_last and n >= batch_size else n
    for start in range(0, stop, batch_size):
        yield order[start : start + batch_size]


def cycled_batch(step: int, batch_size: int, n: int, device: torch.device) -> torch.Tensor:
    """Indices of labeled batch ``step`` of min(batch_size, n) samples, cycling through 0..n-1
    in order (the labeled set is small next to the unlabeled one)."""
    bs = min(batch_size, n)
    return torch.arange(step * bs, step * bs + bs, device=device) % n


def step_batches(
    n: int,
    batch_size: int,
    generator: torch.Generator,
    epochs: int,
    local_steps: int = 0,
    device: torch.device | str = "cpu",
) -> Iterator[torch.Tensor]:
    """The index batches of one round.

    ``local_steps`` > 0: exactly that many batches of min(batch_size, n) samples, drawn
    from reshuffled passes over the data (T counted in SGD steps, SSFL benchmark 3.2).
    Otherwise ``epochs`` passes of :func:`minibatches`.
    """
    if local_steps <= 0:
        for _ in range(epochs):
            yield from minibatches(n, batch_size, generator, device=device)
        return
    if n == 0:
        return
    size, done = min(batch_size, n), 0
    while done < local_steps:
        for idx in minibatches(n, size, generator, drop_last=True, device=device):
            yield idx
            done += 1
            if done == local_steps:
                return


def supervised_epochs(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int,
    optimizer: torch.optim.Optimizer,
    batch_size: int,
    generator: torch.Generator,
    augment: nn.Module | None = None,
    loss_fn: LossFn = F.cross_entropy,
    proximal_mu: float = 0.0,
    local_steps: int = 0,
    lr_at: Callable[[int], float] | None = None,
) -> dict[str, float]:
    """Mini-batch SGD on (x, y) for ``epochs`` epochs (FedSEAL eq. 3-4 on the server).

    With ``local_steps`` > 0 it is that many steps instead (SSFL benchmark eq. 2, T steps).
    ``lr_at(step)`` sets the learning rate of every step (eq. 9); without it the
    optimizer's rate is kept. With ``proximal_mu`` > 0 the FedProx term anchors the
    weights to their starting values.
    """
    model.train()
    anchor = [p.detach().clone() for p in model.parameters()] if proximal_mu > 0 else []
    total, steps = running_sum(x.device), 0
    for idx in step_batches(len(x), batch_size, generator, epochs, local_steps):
        idx = idx.to(x.device)
        xb = x[idx]
        if augment is not None:
            xb = augment(xb)
        loss = loss_fn(model(xb), y[idx])
        if proximal_mu > 0:
            loss = loss + proximal_term(model, anchor, proximal_mu)
        if lr_at is not None:
            set_lr(optimizer, lr_at(steps))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        total += loss.detach().double()
        steps += 1
    return {"loss": float(total) / max(steps, 1), "steps": float(steps)}


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


@torch.no_grad()
def predict_logits(model: nn.Module, x: torch.Tensor, batch_size: int) -> torch.Tensor:
    """Logits of the model in eval mode, batch by batch."""
    model.eval()
    return torch.cat([model(x[i : i + batch_size]).float() for i in range(0, len(x), batch_size)])


@torch.no_grad()
def eval_mode_logits(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Logits of ``x`` in eval mode (BatchNorm's running statistics, no gradient, no
    statistics update), the model back in train mode after: the SSFL benchmark's official
    ``--ue_loss SF`` label pass."""
    model.eval()
    try:
        return model(x)
    finally:
        model.train()


def evaluate(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int
) -> tuple[float, float]:
    """Accuracy (fraction) and mean cross-entropy."""
    logits = predict_logits(model, x, batch_size)
    loss = float(F.cross_entropy(logits, y))
    acc = float((logits.argmax(dim=1) == y).float().mean())
    return acc, loss

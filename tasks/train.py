"""Training and evaluation loops shared by the server and client halves (no Flower inside)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from tasks.losses import proximal_term

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def resolve_device(name: str) -> torch.device:
    """'auto' picks CUDA when there is one; 'cuda' without one is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' requested but torch sees no CUDA device")
    return torch.device(name)


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from any parts (seed, round, partition, ...), stable across processes."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") & ((1 << 63) - 1)


def seed_torch(seed: int) -> torch.Generator:
    """Seed torch's global RNG (augmentation) and return a CPU generator for batch order."""
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def to_float(images: torch.Tensor, device: torch.device) -> torch.Tensor:
    """uint8 (N, C, H, W) -> float32 in [0, 1] on ``device``."""
    return images.to(device=device, dtype=torch.float32).div_(255.0)


def make_sgd(model: nn.Module, lr: float, momentum: float, weight_decay: float) -> torch.optim.SGD:
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)


def minibatches(
    n: int, batch_size: int, generator: torch.Generator, drop_last: bool = False
) -> Iterator[torch.Tensor]:
    """Random index batches covering 0..n-1 once."""
    order = torch.randperm(n, generator=generator)
    stop = n - n % batch_size if drop_last and n >= batch_size else n
    for start in range(0, stop, batch_size):
        yield order[start : start + batch_size]


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
) -> dict[str, float]:
    """Mini-batch SGD on (x, y) for ``epochs`` epochs (FedSEAL eq. 3-4 on the server).

    With ``proximal_mu`` > 0 the FedProx term anchors the weights to their starting values.
    """
    model.train()
    anchor = [p.detach().clone() for p in model.parameters()] if proximal_mu > 0 else []
    total, steps = 0.0, 0
    for _ in range(epochs):
        for idx in minibatches(len(x), batch_size, generator):
            idx = idx.to(x.device)
            xb = x[idx]
            if augment is not None:
                xb = augment(xb)
            loss = loss_fn(model(xb), y[idx])
            if proximal_mu > 0:
                loss = loss + proximal_term(model, anchor, proximal_mu)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += float(loss.detach())
            steps += 1
    return {"loss": total / max(steps, 1), "steps": float(steps)}


@torch.no_grad()
def predict_logits(model: nn.Module, x: torch.Tensor, batch_size: int) -> torch.Tensor:
    """Logits of the model in eval mode, batch by batch."""
    model.eval()
    return torch.cat([model(x[i : i + batch_size]) for i in range(0, len(x), batch_size)])


def evaluate(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int
) -> tuple[float, float]:
    """Accuracy (fraction) and mean cross-entropy."""
    logits = predict_logits(model, x, batch_size)
    loss = float(F.cross_entropy(logits, y))
    acc = float((logits.argmax(dim=1) == y).float().mean())
    return acc, loss

"""Self-supervised losses of FedSup (Gill 2023, SNU master's thesis), on embeddings and maps.

References, by section and equation of the FedSup text: SimCLR's NT-Xent (section 3.2.2,
eq. 3.3), SimSiam's negative cosine D and its stop-gradient form (section 3.2.3, eqs.
3.4-3.6), BYOL's EMA target network (section 3.2.4), and FedSup's consistency loss L_Con,
layer-wise feature-map loss L_MSE and its weight lambda_s^(t/T) (section 4.1.1). Every loss
returns a scalar tensor.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def negative_cosine(p: Tensor, z: Tensor) -> Tensor:
    """SimSiam's D(p, z) = -(p . z) / (|p|_2 |z|_2) per row, averaged over the batch.

    FedSup eq. 3.4 (D) and eq. 3.5 (the batch mean); gradients reach both p and z.
    """
    return -F.cosine_similarity(p, z, dim=1).mean()


def symmetric_negative_cosine(p1: Tensor, p2: Tensor, z1: Tensor, z2: Tensor) -> Tensor:
    """FedSup eq. 3.6: 1/(2B) sum_b D(p_b1, sg(z_b2)) + D(p_b2, sg(z_b1)).

    Stop-gradient on z1 and z2. SimSiam (z from the same network), BYOL (z from the EMA target,
    section 3.2.4) and FedSup's consistency loss L_Con (z from the server's supervised network,
    section 4.1.1) all use this loss.
    """
    return 0.5 * negative_cosine(p1, z2.detach()) + 0.5 * negative_cosine(p2, z1.detach())


def nt_xent(z1: Tensor, z2: Tensor, temperature: float = 0.5, decoupled: bool = False) -> Tensor:
    """SimCLR's NT-Xent, symmetrised: L = 1/(2B) sum_b l_b(1,2) + l_b(2,1) (FedSup eq. 3.3).

    sim is cosine similarity and row b of z1 and z2 is a positive pair. By default (Chen et
    al. 2020) the denominator of l_b(1,2) runs over the 2B - 1 vectors other than z_b1, the
    positive z_b2 included. ``decoupled=True`` follows eq. 3.3 as FedSup writes it: the
    indicator 1(b' != b) also drops the positive, leaving the 2B - 2 negatives.
    """
    if z1.shape != z2.shape or z1.dim() != 2:
        raise ValueError(f"z1 and z2 must be (B, d) of one shape, got {z1.shape} and {z2.shape}")
    batch = z1.shape[0]
    if batch < 2:
        raise ValueError(f"NT-Xent needs a batch of at least 2, got {batch}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    z = F.normalize(torch.cat([z1, z2]), dim=1)
    logits = z @ z.T / temperature
    rows = torch.arange(2 * batch, device=z.device)
    positives = (rows + batch) % (2 * batch)
    excluded = rows[:, None] == rows[None, :]
    if decoupled:
        excluded = excluded | (positives[:, None] == rows[None, :])
    denominator = torch.logsumexp(logits.masked_fill(excluded, float("-inf")), dim=1)
    return (denominator - logits[rows, positives]).mean()


def layerwise_mse(online_maps: Sequence[Tensor], target_maps: Sequence[Tensor], n: int) -> Tensor:
    """FedSup's L_MSE (section 4.1.1): sum over the first n blocks of MSE(online, sg(target)).

    Each block's MSE is the mean over all its elements; the target (the server's supervised
    network) gets no gradient. n = 0 gives a zero tensor.
    """
    if len(online_maps) != len(target_maps):
        raise ValueError(
            f"{len(online_maps)} online feature maps but {len(target_maps)} target feature maps"
        )
    if not 0 <= n <= len(online_maps):
        raise ValueError(f"n must be in [0, {len(online_maps)}], got {n}")
    for block, (online, target) in enumerate(zip(online_maps, target_maps)):
        if online.shape != target.shape:
            raise ValueError(f"block {block}: online {online.shape} != target {target.shape}")
    total = online_maps[0].new_zeros(()) if online_maps else torch.zeros(())
    for online, target in zip(online_maps[:n], target_maps[:n]):
        total = total + F.mse_loss(online, target.detach())
    return total


def mse_weight(lambda_s: float, server_round: int, rounds: int) -> float:
    """FedSup's weight lambda_s^(t/T) of L_MSE at round t of T (section 4.1.1)."""
    if lambda_s <= 0:
        raise ValueError(f"lambda_s must be > 0, got {lambda_s}")
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    return lambda_s ** (server_round / rounds)


def ema_update(target: nn.Module, online: nn.Module, mu: float) -> None:
    """BYOL's target update xi <- mu xi + (1 - mu) theta (FedSup section 3.2.4), in place.

    Parameters are averaged; buffers (e.g. BatchNorm running statistics and counters) are
    copied from the online network.
    """
    if not 0 <= mu <= 1:
        raise ValueError(f"mu must be in [0, 1], got {mu}")
    online_params = dict(online.named_parameters())
    online_buffers = dict(online.named_buffers())
    target_params = dict(target.named_parameters())
    target_buffers = dict(target.named_buffers())
    if target_params.keys() != online_params.keys() or (
        target_buffers.keys() != online_buffers.keys()
    ):
        raise ValueError("target and online networks differ in their parameters or buffers")
    with torch.no_grad():
        for name, param in target_params.items():
            param.mul_(mu).add_(online_params[name], alpha=1 - mu)
        for name, buffer in target_buffers.items():
            buffer.copy_(online_buffers[name])

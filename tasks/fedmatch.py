"""FedMatch's inter-client consistency (Jeong et al. 2021, section 3.1, eq. 1-3).

Agreement-based pseudo-labels, the inter-client KL term, and the server's helper
selection: every client model is embedded by its output on one fixed noise image and
the H nearest other models in a KD-tree (scipy) become the client's helpers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F


def agreement_labels(
    local_probs: torch.Tensor, helper_probs: Sequence[torch.Tensor]
) -> torch.Tensor:
    """Eq. 3: the class most models vote for (one vote each: local argmax, helpers' argmax).

    Ties go to the local model's class (ours; the official code takes the lowest class index).
    """
    k = local_probs.shape[1]
    local = F.one_hot(local_probs.argmax(dim=1), k).float()
    votes = local.clone()
    for probs in helper_probs:
        votes += F.one_hot(probs.argmax(dim=1), k).float()
    return (votes + 0.5 * local).argmax(dim=1)


def inter_client_kl(
    helper_probs: Sequence[torch.Tensor], local_logits: torch.Tensor
) -> torch.Tensor:
    """Eq. 1: (1/H) sum_j KL(p_hj || p_local), averaged over the samples (helpers frozen)."""
    if not helper_probs:
        return local_logits.new_zeros(())
    log_local = F.log_softmax(local_logits, dim=1)
    total = local_logits.new_zeros(())
    for probs in helper_probs:
        p = probs.detach()
        total = total + (p * (torch.log(p.clamp_min(1e-12)) - log_local)).sum(dim=1).mean()
    return total / len(helper_probs)


def noise_input(channels: int, size: int, seed: int) -> torch.Tensor:
    """The fixed input a of section 3.1: truncated normal pixels (mean 125, std 125, in
    [0, 255], official code) scaled to [0, 1], shape (1, C, H, W)."""
    from scipy.stats import truncnorm  # slow to import: only where it is used

    mu, std = 125.0, 125.0
    dist = truncnorm((0.0 - mu) / std, (255.0 - mu) / std, loc=mu, scale=std)
    pixels = dist.rvs(size=(1, channels, size, size), random_state=np.random.default_rng(seed))
    return torch.from_numpy(pixels / 255.0).float()


def is_helper_round(server_round: int, interval: int) -> bool:
    """Helpers travel every ``interval``-th round (official: (round + 1) % 10 == 0, 0-based)."""
    return interval > 0 and server_round % interval == 0


class HelperIndex:
    """A KD-tree over the model embeddings m^k; the H nearest other clients are helpers."""

    def __init__(self, embeddings: Mapping[int, np.ndarray]):
        from scipy.spatial import KDTree  # here: clients and the CLI start without SciPy

        self.ids = sorted(embeddings)
        self.vectors = np.stack([np.asarray(embeddings[i], dtype=np.float64) for i in self.ids])
        self.tree = KDTree(self.vectors)

    def helpers(self, pid: int, num_helpers: int) -> list[int]:
        """The ``num_helpers`` clients nearest to ``pid``'s embedding, never ``pid`` itself.

        A client without an embedding (never uploaded) gets no helpers (section 3.1).
        """
        if pid not in self.ids or num_helpers <= 0:
            return []
        k = min(num_helpers + 1, len(self.ids))
        _, found = self.tree.query(self.vectors[self.ids.index(pid)], k=k)
        neighbours = [self.ids[int(i)] for i in np.atleast_1d(found)]
        return [n for n in neighbours if n != pid][:num_helpers]

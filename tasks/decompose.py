"""FedMatch's parameter decomposition theta = sigma + psi (Jeong et al. 2021, section 3.2).

:class:`Decomposed` wraps any registered model: every parameter of the model becomes two,
sigma (learned on labeled data, eq. 4) and psi (learned on unlabeled data, eq. 5), and
the model runs with theta = sigma + psi through ``torch.func.functional_call``. The
wrapped model keeps its buffers (BatchNorm statistics); its own parameters are removed.
Without decomposition (the ablation) psi is empty and theta = sigma.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

PARTS = ("sigma", "psi")
BUFFER = "buffer."  # key prefix of the buffers in a message


def _key(name: str) -> str:
    """A parameter name as a ParameterDict key (no dots allowed there)."""
    return name.replace(".", "-")


class Decomposed(nn.Module):
    """A model whose parameters are theta = sigma + psi (or sigma alone when not decomposed)."""

    def __init__(self, net: nn.Module, psi_factor: float = 0.2, decomposed: bool = True):
        super().__init__()
        named = list(net.named_parameters())
        self.names = tuple(name for name, _ in named)
        self.shapes = tuple(tuple(p.shape) for _, p in named)
        self.decomposed = decomposed
        self.sigma = nn.ParameterDict({_key(n): nn.Parameter(p.detach().clone()) for n, p in named})
        # Official code: psi starts as psi_factor * sigma (0.2), so theta starts at 1.2 sigma.
        self.psi = nn.ParameterDict(
            {_key(n): nn.Parameter(psi_factor * p.detach().clone()) for n, p in named}
            if decomposed
            else {}
        )
        for name in self.names:
            owner, _, attr = name.rpartition(".")
            module = net.get_submodule(owner)
            del module._parameters[attr]
            module.register_buffer(attr, None, persistent=False)
        self.net = net

    @property
    def unlabeled_part(self) -> str:
        """The part trained on unlabeled data: psi, or sigma itself without decomposition."""
        return "psi" if self.decomposed else "sigma"

    def parts(self) -> tuple[str, ...]:
        return PARTS if self.decomposed else ("sigma",)

    def params(self, part: str) -> list[nn.Parameter]:
        """The parameters of one part, in the wrapped model's parameter order."""
        store = self.sigma if part == "sigma" else self.psi
        return [store[_key(n)] for n in self.names]

    def numel(self) -> int:
        """Number of elements of theta (one dense copy of the model's parameters)."""
        return sum(p.numel() for p in self.params("sigma"))

    def theta(
        self, unlabeled: list[torch.Tensor] | None = None, sigma: list[torch.Tensor] | None = None
    ) -> dict[str, torch.Tensor]:
        """theta per parameter name; ``unlabeled``/``sigma`` replace this model's parts."""
        sigma = sigma if sigma is not None else self.params("sigma")
        if not self.decomposed:
            return dict(zip(self.names, unlabeled if unlabeled is not None else sigma))
        psi = unlabeled if unlabeled is not None else self.params("psi")
        return {n: s + p for n, s, p in zip(self.names, sigma, psi)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return functional_call(self.net, self.theta(), (x,))

    @torch.no_grad()
    def forward_with(
        self, unlabeled: torch.Tensor, x: torch.Tensor, sigma: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Logits of another model in eval mode: sigma + psi_h for a flat psi_h (a helper).

        ``sigma`` (flat) replaces this model's sigma; without decomposition the flat
        ``unlabeled`` vector is the other model's whole theta.
        """
        own_sigma = self.unflatten(sigma) if sigma is not None else None
        theta = self.theta(self.unflatten(unlabeled), own_sigma)
        with eval_mode(self):
            return functional_call(self.net, theta, (x,))

    def train_only(self, part: str) -> None:
        """Freeze every part but ``part`` (eq. 4: psi frozen; eq. 5: sigma frozen)."""
        for name in self.parts():
            for p in self.params(name):
                p.requires_grad_(name == part)

    def flat(self, part: str) -> torch.Tensor:
        """One part as a flat float32 vector (a copy)."""
        return torch.cat([p.detach().reshape(-1) for p in self.params(part)]).float().clone()

    def unflatten(self, vector: torch.Tensor) -> list[torch.Tensor]:
        """A flat vector cut into tensors of the parameters' shapes, on the model's device."""
        device = self.params("sigma")[0].device
        sizes = [int(torch.Size(s).numel()) for s in self.shapes]
        pieces = vector.to(device).split(sizes)
        return [piece.reshape(shape) for piece, shape in zip(pieces, self.shapes)]

    @torch.no_grad()
    def load_flat(self, part: str, vector: torch.Tensor) -> None:
        """Overwrite one part with a flat vector."""
        if vector.numel() != self.numel():
            raise ValueError(f"{part}: {vector.numel()} values for {self.numel()} parameters")
        for p, value in zip(self.params(part), self.unflatten(vector)):
            p.copy_(value)

    def buffer_state(self) -> dict[str, torch.Tensor]:
        """The wrapped model's persistent buffers (BatchNorm statistics), by name."""
        return {k: v.detach() for k, v in self.net.state_dict().items()}

    @torch.no_grad()
    def prune_psi(self, threshold: float) -> None:
        """Zero every psi element with |psi| <= threshold (official code's l1 threshold)."""
        for p in self.params("psi"):
            p.masked_fill_(p.abs() <= threshold, 0.0)


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """Run a block in eval mode and restore the previous mode."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def decomposition_penalty(
    sigma: list[torch.Tensor], psi: list[torch.Tensor], lambda_l1: float, lambda_l2: float
) -> torch.Tensor:
    """lambda_L1 ||psi||_1 + lambda_L2 ||sigma* - psi||_2^2 of eq. 5 (sigma frozen: detached)."""
    l1 = sum(p.abs().sum() for p in psi)
    l2 = sum(((s.detach() - p) ** 2).sum() for s, p in zip(sigma, psi))
    return lambda_l1 * l1 + lambda_l2 * l2


def uploaded_parts(model: Decomposed, labels_at_client: bool) -> tuple[str, ...]:
    """What a client uploads: both parts with labels at the client (Algorithm 1), only the
    unlabeled part with labels at the server (Algorithm 2)."""
    return model.parts() if labels_at_client else (model.unlabeled_part,)


def buffer_arrays(model: Decomposed) -> dict[str, np.ndarray]:
    """The model's buffers (BatchNorm statistics) as message arrays, dense: they are tiny."""
    return {f"{BUFFER}{k}": v.cpu().numpy() for k, v in model.buffer_state().items()}


def dense_model_bytes(model: Decomposed) -> int:
    """What one dense float32 copy of the model costs (what FedAvg sends per message)."""
    buffers = sum(v.numel() for v in model.buffer_state().values())
    return 4 * (model.numel() + buffers)

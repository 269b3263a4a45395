"""The resident client runtime: a process keeps its built models and reuses them, clean."""

from __future__ import annotations

import torch
from torch import nn

from client_app import base


def test_a_resident_model_is_built_once_and_comes_back_without_gradients_in_train_mode():
    builds = []

    def build() -> nn.Module:
        builds.append(1)
        return nn.Linear(3, 2)

    first = base.resident_model(("test", 1), build)
    first(torch.ones(1, 3)).sum().backward()
    first.eval()
    again = base.resident_model(("test", 1), build)
    assert again is first and len(builds) == 1
    assert again.training and all(p.grad is None for p in again.parameters())


def test_at_most_models_kept_are_resident_the_oldest_goes_first():
    keys = [("kept", i) for i in range(base.MODELS_KEPT + 1)]
    models = [base.resident_model(k, lambda: nn.Linear(1, 1)) for k in keys]
    assert keys[0] not in base._resident and all(k in base._resident for k in keys[1:])
    assert base.resident_model(keys[-1], lambda: nn.Linear(1, 1)) is models[-1]

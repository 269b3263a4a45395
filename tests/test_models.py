from __future__ import annotations

import pytest
import torch
from torch import nn

from tasks.models import MODELS, build_model


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("channels, size", [(1, 28), (3, 32)])
@pytest.mark.parametrize("norm", ["none", "bn", "gn"])
def test_output_shapes(name, channels, size, norm):
    model = build_model(name, channels, 10, size, norm, (0.5,) * channels, (0.25,) * channels)
    model.eval()
    assert model(torch.rand(2, channels, size, size)).shape == (2, 10)
    kinds = {type(m) for m in model.modules()}
    assert (nn.BatchNorm2d in kinds) == (norm == "bn")
    assert (nn.GroupNorm in kinds) == (norm == "gn")


def test_classes_follow_dataset_and_resnet18_gn_uses_32_groups():
    model = build_model("resnet18", 3, 100, 32, "gn", (0.5,) * 3, (0.25,) * 3)
    assert model(torch.rand(1, 3, 32, 32)).shape == (1, 100)
    groups = {m.num_groups for m in model.modules() if isinstance(m, nn.GroupNorm)}
    assert groups == {32}


def test_resnet9_matches_fedmatch_definition():
    model = build_model("resnet9", 3, 10, 32, "none", (0.5,) * 3, (0.25,) * 3)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert len(convs) == 8 and all(c.bias is None for c in convs)
    assert model[1].classifier.bias is None

"""Model registry: constructors by name, configured by arguments.

Every model takes images in [0, 1] of shape (N, C, H, W); the first layer
normalises them with the dataset's mean and std, so callers never do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn


class Normalize(nn.Module):
    """(x - mean) / std per channel, stored as buffers so it travels with the model."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]):
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std).view(1, -1, 1, 1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


def norm_layer(kind: str, channels: int) -> nn.Module:
    """BatchNorm, GroupNorm(min(32, C) groups, as in the SSFL benchmark) or nothing."""
    if kind == "bn":
        return nn.BatchNorm2d(channels)
    if kind == "gn":
        return nn.GroupNorm(min(32, channels), channels)
    return nn.Identity()


class SmallCNN(nn.Module):
    """Two 3x3 conv blocks and two dense layers; fast on a CPU for 28x28 and 32x32 inputs.

    ``dropout`` > 0 adds Dropout2d after the conv blocks, as the SSFL benchmark's EMNIST
    CNN (p = 0.25); at 0 there is no dropout layer at all.
    """

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        image_size: int,
        norm: str = "bn",
        dropout: float = 0.0,
    ):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, 3, padding=1, bias=norm == "none"),
            norm_layer(norm, 32),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1, bias=norm == "none"),
            norm_layer(norm, 64),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            *([nn.Dropout2d(dropout)] if dropout > 0 else []),
        )
        side = image_size // 4
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(64 * side * side, 128),
            nn.ReLU(inplace=True),
            nn.Linear(128, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def _conv_block(cin: int, cout: int, norm: str, pool: int = 1) -> nn.Sequential:
    layers: list[nn.Module] = [
        nn.Conv2d(cin, cout, 3, padding=1, bias=False),
        norm_layer(norm, cout),
        nn.ReLU(inplace=True),
    ]
    if pool > 1:
        layers.append(nn.MaxPool2d(pool))
    return nn.Sequential(*layers)


class Residual(nn.Module):
    """x + f(x)."""

    def __init__(self, body: nn.Module):
        super().__init__()
        self.body = body

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


class ResNet9(nn.Module):
    """ResNet-9 as FedMatch's code defines it (no normalisation by default, no bias).

    conv64 -> conv128+pool -> res[128,128] -> conv256+pool -> conv512+pool ->
    res[512,512] -> global max pool -> dense (no bias).
    """

    def __init__(self, in_channels: int, num_classes: int, image_size: int, norm: str = "none"):
        super().__init__()
        self.features = nn.Sequential(
            _conv_block(in_channels, 64, norm),
            _conv_block(64, 128, norm, pool=2),
            Residual(nn.Sequential(_conv_block(128, 128, norm), _conv_block(128, 128, norm))),
            _conv_block(128, 256, norm, pool=2),
            _conv_block(256, 512, norm, pool=2),
            Residual(nn.Sequential(_conv_block(512, 512, norm), _conv_block(512, 512, norm))),
            nn.AdaptiveMaxPool2d(1),
            nn.Flatten(),
        )
        self.classifier = nn.Linear(512, num_classes, bias=False)
        for module in self.modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(module.weight, nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class BasicBlock(nn.Module):
    """The CIFAR ResNet basic block with a projection shortcut when the shape changes."""

    def __init__(self, cin: int, cout: int, stride: int, norm: str):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False),
            norm_layer(norm, cout),
            nn.ReLU(inplace=True),
            nn.Conv2d(cout, cout, 3, padding=1, bias=False),
            norm_layer(norm, cout),
        )
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride=stride, bias=False), norm_layer(norm, cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


class ResNet18(nn.Module):
    """CIFAR ResNet-18 ([2, 2, 2, 2] basic blocks, 3x3 stride-1 stem), BN or GroupNorm(32)."""

    def __init__(self, in_channels: int, num_classes: int, image_size: int, norm: str = "bn"):
        super().__init__()
        layers: list[nn.Module] = [
            nn.Conv2d(in_channels, 64, 3, padding=1, bias=False),
            norm_layer(norm, 64),
            nn.ReLU(inplace=True),
        ]
        cin = 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [BasicBlock(cin, cout, stride, norm), BasicBlock(cout, cout, 1, norm)]
            cin = cout
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


MODELS: dict[str, Callable[..., nn.Module]] = {
    "small_cnn": SmallCNN,
    "resnet9": ResNet9,
    "resnet18": ResNet18,
}


def build_model(
    name: str,
    in_channels: int,
    num_classes: int,
    image_size: int,
    norm: str,
    mean: Sequence[float],
    std: Sequence[float],
    dropout: float = 0.0,
) -> nn.Sequential:
    """A registered model behind a Normalize layer: model[0] normalises, model[1] is the net."""
    options = {"dropout": dropout} if dropout else {}
    net = MODELS[name](in_channels, num_classes, image_size, norm=norm, **options)
    return nn.Sequential(Normalize(mean, std), net)


def classifier_keys(model: nn.Module) -> list[str]:
    """State-dict keys of the model's last linear layer (the classifier of SSFL eq. 8)."""
    name = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)][-1]
    return [f"{name}.{p}" for p, _ in model.get_submodule(name).named_parameters()]


def model_for(mcfg: Mapping[str, Any], data) -> nn.Sequential:
    """The experiment's model (``model`` config section) for a dataset-like object.

    ``data`` needs channels, num_classes, image_size, mean and std (a Dataset or ClientData).
    """
    return build_model(
        mcfg["name"],
        data.channels,
        data.num_classes,
        data.image_size,
        mcfg["norm"],
        data.mean,
        data.std,
        float(mcfg["dropout"]),
    )

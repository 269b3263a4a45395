"""Model registry: constructors by name, configured by arguments.

Every model takes images in [0, 1] of shape (N, C, H, W); the first layer
normalises them with the dataset's mean and std, so callers never do.

Every registered model is a :class:`Net`: conv blocks (``feature_maps``), a pooled and
flattened representation (``embed``) and a ``head`` on it, with forward = head(embed(x)).
The functions :func:`feature_maps`, :func:`embedding`, :func:`head_of` and :func:`num_blocks`
reach these through the Normalize wrapper that :func:`build_model` adds.
"""

from __future__ import annotations

import dataclasses
import itertools
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torch import nn

from tasks.config import ConfigError
from tasks.settings import ModelSettings


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


class Net(nn.Module, ABC):
    """Base of the registered models.

    ``features`` is an nn.Sequential whose leading layers are the conv blocks: block i ends
    before layer ``block_ends[i]``; the layers after the last block (pooling, flattening)
    and ``embed_tail`` (the head's input layers) give the embedding. With
    :func:`add_ssl_heads`, a ``projector`` and a ``predictor`` MLP sit on the embedding
    (SimCLR, SimSiam, BYOL, FedSup); the forward pass never uses them.
    """

    features: nn.Sequential
    block_ends: tuple[int, ...]

    @property
    def num_blocks(self) -> int:
        """Number of conv blocks, the maps ``feature_maps`` returns."""
        return len(self.block_ends)

    @property
    @abstractmethod
    def head(self) -> nn.Module:
        """The classifier applied to ``embed``'s output."""

    def embed_tail(self, h: torch.Tensor) -> torch.Tensor:
        """The embedding from the output of ``features`` (the identity by default)."""
        return h

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """The (N, D) representation the head takes."""
        return self.embed_tail(self.features(x))

    def maps_and_embedding(self, x: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """The output of each conv block and the embedding, in one pass."""
        maps = []
        for i, layer in enumerate(self.features, 1):
            x = layer(x)
            if i in self.block_ends:
                maps.append(x)
        return maps, self.embed_tail(x)

    def feature_maps(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The output of each conv block in order: ``num_blocks`` (N, C, H, W) tensors."""
        maps = []
        for i, layer in enumerate(self.features[: self.block_ends[-1]], 1):
            x = layer(x)
            if i in self.block_ends:
                maps.append(x)
        return maps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(x))


class SmallCNN(Net):
    """Two 3x3 conv blocks and two dense layers; fast on a CPU for 28x28 and 32x32 inputs.

    ``dropout`` > 0 adds Dropout2d after the conv blocks, as the SSFL benchmark's EMNIST
    CNN (p = 0.25); at 0 there is no dropout layer at all. Blocks: conv32+pool and
    conv64+pool (with the dropout); the embedding is the 128-unit hidden layer, the head
    the last dense layer (``num_classes`` outputs).
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
        self.block_ends = (4, len(self.features))
        side = image_size // 4
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(64 * side * side, 128),
            nn.ReLU(inplace=True),
            nn.Linear(128, num_classes),
        )

    @property
    def head(self) -> nn.Module:
        return self.classifier[-1]

    def embed_tail(self, h: torch.Tensor) -> torch.Tensor:
        return self.classifier[:-1](h)


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


class ResNet9(Net):
    """ResNet-9 as FedMatch's code defines it (no normalisation by default, no bias).

    conv64 -> conv128+pool -> res[128,128] -> conv256+pool -> conv512+pool ->
    res[512,512] -> global max pool -> dense (no bias). Blocks, the four stages of
    ResNet-9: conv64 | conv128+pool, res128 | conv256+pool | conv512+pool, res512.
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
        self.block_ends = (1, 3, 4, 6)
        self.classifier = nn.Linear(512, num_classes, bias=False)
        for module in self.modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(module.weight, nonlinearity="relu")

    @property
    def head(self) -> nn.Module:
        return self.classifier


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


class ResNet18(Net):
    """CIFAR ResNet-18 ([2, 2, 2, 2] basic blocks, 3x3 stride-1 stem), BN or GroupNorm(32).

    Blocks: the stem and the four stages of two basic blocks each.
    """

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
        self.block_ends = (3, 5, 7, 9, 11)
        self.classifier = nn.Linear(512, num_classes)

    @property
    def head(self) -> nn.Module:
        return self.classifier


MODELS: dict[str, Callable[..., Net]] = {
    "small_cnn": SmallCNN,
    "resnet9": ResNet9,
    "resnet18": ResNet18,
}


def mlp(dims: Sequence[int]) -> nn.Sequential:
    """Linear -> BatchNorm1d -> ReLU between consecutive widths, a plain Linear last
    (the projector and predictor of SimSiam and BYOL)."""
    layers: list[nn.Module] = []
    for i, (cin, cout) in enumerate(itertools.pairwise(dims)):
        layers.append(nn.Linear(cin, cout))
        if i < len(dims) - 2:
            layers += [nn.BatchNorm1d(cout), nn.ReLU(inplace=True)]
    return nn.Sequential(*layers)


def add_ssl_heads(net: Net, projector_dim: int, predictor_dim: int = 0) -> None:
    """A projector D -> P -> P on the embedding, and a predictor P -> H -> P when
    ``predictor_dim`` H > 0 (FedSup section 5.1.1: P = H = 512 with ResNet-18)."""
    if projector_dim < 1:
        raise ValueError(f"projector_dim must be positive, got {projector_dim}")
    width = net.head.in_features
    net.projector = mlp((width, projector_dim, projector_dim))
    if predictor_dim:
        net.predictor = mlp((projector_dim, predictor_dim, projector_dim))


def build_model(
    name: str,
    in_channels: int,
    num_classes: int,
    image_size: int,
    norm: str,
    mean: Sequence[float],
    std: Sequence[float],
    dropout: float = 0.0,
    head_size: int | None = None,
    projector_dim: int = 0,
    predictor_dim: int = 0,
) -> nn.Sequential:
    """A registered model behind a Normalize layer: model[0] normalises, model[1] is the net.

    ``head_size`` is the number of head outputs (None: ``num_classes``);
    ``projector_dim`` > 0 adds the SSL projector (and ``predictor_dim`` > 0 the predictor).
    """
    if head_size is not None and head_size < 1:
        raise ValueError(f"head_size must be positive, got {head_size}")
    if predictor_dim and not projector_dim:
        raise ValueError("a predictor needs a projector (projector_dim > 0)")
    options = {"dropout": dropout} if dropout else {}
    outputs = num_classes if head_size is None else head_size
    net = MODELS[name](in_channels, outputs, image_size, norm=norm, **options)
    if projector_dim:
        add_ssl_heads(net, projector_dim, predictor_dim)
    return nn.Sequential(Normalize(mean, std), net)


def _parts(model: nn.Module) -> tuple[nn.Module, Net]:
    """The Normalize layer and the net of a model from :func:`build_model`."""
    if not (
        isinstance(model, nn.Sequential)
        and len(model) == 2
        and isinstance(model[0], Normalize)
        and isinstance(model[1], Net)
    ):
        raise TypeError(f"not a model from build_model: {type(model).__name__}")
    return model[0], model[1]


def feature_maps(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """The output of each conv block of a built model for images ``x`` in [0, 1]."""
    normalize, net = _parts(model)
    return net.feature_maps(normalize(x))


def embedding(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The (N, D) representation a built model's head takes, for images ``x`` in [0, 1]."""
    normalize, net = _parts(model)
    return net.embed(normalize(x))


class SSLOutputs(NamedTuple):
    """One pass of a built model with SSL heads (``prediction`` None without a predictor)."""

    maps: list[torch.Tensor]
    embedding: torch.Tensor
    projection: torch.Tensor | None
    prediction: torch.Tensor | None


def ssl_outputs(model: nn.Module, x: torch.Tensor) -> SSLOutputs:
    """Block feature maps, embedding, projection and prediction of images ``x`` in [0, 1]
    (the projection None without a projector)."""
    normalize, net = _parts(model)
    maps, emb = net.maps_and_embedding(normalize(x))
    projector = getattr(net, "projector", None)
    predictor = getattr(net, "predictor", None)
    z = projector(emb) if projector is not None else None
    p = predictor(z) if predictor is not None and z is not None else None
    return SSLOutputs(maps, emb, z, p)


def has_ssl_heads(model: nn.Module, predictor: bool = False) -> bool:
    """Whether a built model has a projector (and, asked for, a predictor)."""
    net = _parts(model)[1]
    return hasattr(net, "projector") and (not predictor or hasattr(net, "predictor"))


def head_of(model: nn.Module) -> nn.Module:
    """The head (classifier) of a built model: model(x) == head_of(model)(embedding(model, x))."""
    return _parts(model)[1].head


def num_blocks(model: nn.Module) -> int:
    """Number of conv blocks of a built model (the length of ``feature_maps``)."""
    return _parts(model)[1].num_blocks


def classifier_keys(model: nn.Module) -> list[str]:
    """State-dict keys of a built model's head (the classifier of SSFL eq. 8)."""
    head = head_of(model)
    name = next(n for n, m in model.named_modules() if m is head)
    return [f"{name}.{p}" for p, _ in head.named_parameters()]


def without_ssl_heads(model: ModelSettings) -> ModelSettings:
    """A ``model`` section without the projector and predictor (FedSup's f_Server)."""
    return dataclasses.replace(model, projector_dim=0, predictor_dim=0)


def check_head_size(head_size: int, num_classes: int) -> None:
    """A head of ``head_size`` outputs (0: one per class) must hold every class."""
    if 0 < head_size < num_classes:
        raise ConfigError(
            f"config key 'model.head_size': {head_size} outputs cannot hold the "
            f"{num_classes} classes (0 means one output per class)"
        )


def model_for(settings: ModelSettings, data) -> nn.Sequential:
    """The experiment's model (its ``model`` section) for a dataset-like object.

    ``data`` needs channels, num_classes, image_size, mean and std (a Dataset or ClientData);
    ``head_size`` (0: the class count) sets the head's width; ``projector_dim`` and
    ``predictor_dim`` (0: none) add the SSL heads; ``channels_last`` lays the weights out
    channels-last.
    """
    check_head_size(settings.head_size, data.num_classes)
    model = build_model(
        settings.name,
        data.channels,
        data.num_classes,
        data.image_size,
        settings.norm,
        data.mean,
        data.std,
        settings.dropout,
        settings.head_size or None,
        settings.projector_dim,
        settings.predictor_dim,
    )
    if settings.channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model


TRAINABLE = ("all", "last_block")


def freeze_before_last_block(model: nn.Module) -> list[str]:
    """FedoSSL section 5's second stage (as ORCA): every parameter before the last conv
    block stops taking gradients (ResNet-18: all but layer4 and the head; the small CNN:
    its first block). Returns the frozen parameters' names; BatchNorm statistics still
    update in train mode."""
    _, net = _parts(model)
    if net.num_blocks < 2:
        raise ValueError(
            f"trainable last_block needs a model of 2+ conv blocks, not {net.num_blocks}"
        )
    start = net.block_ends[-2]
    frozen = {id(p) for p in net.features[:start].parameters()}
    names = []
    for name, param in model.named_parameters():
        if id(param) in frozen:
            param.requires_grad_(False)
            names.append(name)
    return names

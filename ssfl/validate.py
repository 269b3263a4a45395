"""``ssfl validate``: build each experiment's split, model and optimizers at its dataset's
real sizes, without training, so a config that cannot run fails in seconds, not hours.

Where a dataset's files are absent (e.g. CIFAR-10 on a machine without it), the split is
built over labels with the dataset's real per-class counts and images of its real shape
that share one zero buffer: a split needs only labels, so nothing of real size is drawn.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ssfl.experiment import resolve_experiment
from ssfl.registry import method, settings_of
from tasks.config import ConfigError
from tasks.data import Dataset, dataset_info, dataset_request, load_dataset
from tasks.partition import Split, make_split
from tasks.settings import Settings

# Images per class of the train and test sets as published (CIFAR-10/100, Fashion-MNIST,
# EMNIST balanced and STL-10 are balanced; MNIST and SVHN are not). Fashion-MNIST's and
# MNIST's counts are those of the official IDX files.
REAL_CLASS_COUNTS: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "cifar10": ((5000,) * 10, (1000,) * 10),
    "cifar100": ((500,) * 100, (100,) * 100),
    "fashion_mnist": ((6000,) * 10, (1000,) * 10),
    "mnist": (
        (5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949),
        (980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009),
    ),
    "svhn": (
        (4948, 13861, 10585, 8497, 7458, 6882, 5727, 5595, 5045, 4659),
        (1744, 5099, 4149, 2882, 2523, 2384, 1977, 2019, 1660, 1595),
    ),
    "emnist_balanced": ((2400,) * 47, (400,) * 47),
    "stl10": ((500,) * 10, (800,) * 10),
}


@dataclass(frozen=True)
class Checked:
    """The outcome of validating one experiment file: ``error`` empty when it passed."""

    path: str
    summary: str = ""
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error

    def line(self) -> str:
        return (
            f"ok    {self.path}: {self.summary}" if self.ok else f"FAIL  {self.path}: {self.error}"
        )


def stand_in_dataset(name: str) -> Dataset:
    """Labels with the real per-class counts of ``name`` (a fixed shuffle) and images of its
    real shape, all views of one zero image."""
    if name not in REAL_CLASS_COUNTS:
        raise ConfigError(f"validate: no real sizes known for dataset {name!r}")
    info = dataset_info(name)
    train_counts, test_counts = REAL_CLASS_COUNTS[name]
    rng = np.random.default_rng(0)

    def labels(counts: tuple[int, ...]) -> torch.Tensor:
        return torch.from_numpy(rng.permutation(np.repeat(np.arange(len(counts)), counts)))

    def images(n: int) -> torch.Tensor:
        shape = (info.channels, info.image_size, info.image_size)
        return torch.zeros((1, *shape), dtype=torch.uint8).expand(n, *shape)

    return Dataset(
        name=name,
        train_x=images(sum(train_counts)),
        train_y=labels(train_counts),
        test_x=images(sum(test_counts)),
        test_y=labels(test_counts),
        num_classes=info.num_classes,
        mean=info.mean,
        std=info.std,
        flip=info.flip,
    )


def real_sized_dataset(settings: Settings) -> tuple[Dataset, bool]:
    """The experiment's dataset from its files (never downloaded), else its stand-in; and
    whether it is the stand-in. Synthetic datasets are built at the config's sizes."""
    request = dataclasses.replace(dataset_request(settings.dataset), download=False)
    try:
        return load_dataset(request), False
    except ConfigError:
        if request.name not in REAL_CLASS_COUNTS:
            raise
        return stand_in_dataset(request.name), True


def build_client_half(settings: Settings, dataset: Dataset) -> None:
    """Build the model and SGD a client of the method builds in its first round (nothing for
    a method without clients), through the client half's own ``build_model`` and
    ``optimizer``, without a Flower message or a partition."""
    cls = method(settings.method).client_half()
    if cls is None:
        return
    client = cls.__new__(cls)
    client.settings, client.algo, client.data = settings, settings.algo, dataset
    client.device, client.state, client.lr = torch.device("cpu"), {}, settings.client.lr
    client.model = client.build_model()
    client.optimizer()


def server_model_and_optimizer(
    settings: Settings, dataset: Dataset, split: Split
) -> torch.nn.Module:
    """The server's model, its parts and (when it trains) its first round's SGD."""
    from strategies.parts import ServerSide

    server = ServerSide.build(settings, dataset, split, torch.device("cpu"))
    parts = method(settings.method).server_half().parts(server)
    if parts.trainer.trains():
        parts.trainer.optimizer(1)
    return server.model


def parameter_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def describe(settings: Settings, split: Split, params: int, stand_in: bool) -> str:
    """One line: method, dataset (and whether its images are stand-ins), clients, labels,
    parameters."""
    s = split.summary
    labeled = s["server_labeled"] + sum(s["client_labeled_sizes"])
    source = ", real counts, no images" if stand_in else ""
    clients = len(split.clients)
    return (
        f"{settings.method} on {settings.dataset.name} ({clients} client{'s' * (clients != 1)}, "
        f"{sum(s['client_sizes'])} client images{source}), {labeled} labeled, "
        f"{params / 1e6:.2f}M parameters"
    )


def check_experiment(path: str | Path) -> Checked:
    """Resolve ``path`` as ``ssfl run`` does and build its split, models and optimizers."""
    try:
        settings = settings_of(resolve_experiment(path))
        dataset, stand_in = real_sized_dataset(settings)
        split = make_split(dataset, settings.split, settings.seed)
        model = server_model_and_optimizer(settings, dataset, split)
        build_client_half(settings, dataset)
    except ConfigError as err:
        return Checked(str(path), error=str(err))
    except (OSError, ValueError, RuntimeError, TypeError, KeyError) as err:
        return Checked(str(path), error=f"{type(err).__name__}: {err}")
    return Checked(str(path), summary=describe(settings, split, parameter_count(model), stand_in))

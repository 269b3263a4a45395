"""Datasets as uint8 tensors: IDX files, torchvision datasets, and a synthetic set.

Every loader returns a :class:`Dataset` with images of shape (N, C, H, W) in
uint8 and int64 labels. Loads are cached per process (``load_dataset``).
"""

from __future__ import annotations

import functools
import gzip
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tasks.config import ConfigError, data_root


@dataclass(frozen=True)
class DatasetRequest:
    """What to load: a registered name, where its files are, and synthetic sizes."""

    name: str
    root: str
    download: bool = False
    synthetic_train: int = 4000
    synthetic_test: int = 1000


@dataclass(frozen=True)
class Dataset:
    """A labeled image dataset with a fixed train/test split."""

    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    flip: bool

    @property
    def channels(self) -> int:
        return int(self.train_x.shape[1])

    @property
    def image_size(self) -> int:
        return int(self.train_x.shape[-1])


def import_torchvision():
    """Import torchvision, defining its two C++ op schemas when a CPU torch lacks them.

    The PyPI torchvision wheel is a CUDA build; with a CPU-only torch its import fails
    on ``torchvision::nms``. Its datasets and transforms are pure Python and work once
    the schemas exist (see the project's notes on Flower 1.41 here).
    """
    if not hasattr(torch.ops.torchvision, "nms"):
        try:
            import torchvision
        except RuntimeError:
            lib = torch.library.Library("torchvision", "DEF")
            lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
            lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
            import_torchvision.lib = lib  # keep the library object alive
    import torchvision

    return torchvision


IDX_FILES = {
    "train_x": "train-images-idx3-ubyte.gz",
    "train_y": "train-labels-idx1-ubyte.gz",
    "test_x": "t10k-images-idx3-ubyte.gz",
    "test_y": "t10k-labels-idx1-ubyte.gz",
}


def read_idx(path: Path) -> np.ndarray:
    """Read one (optionally gzipped) IDX file into a numpy array."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        raw = fh.read()
    if raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise ConfigError(f"{path}: not an IDX file of unsigned bytes")
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise ConfigError(f"{path}: truncated IDX file")
    return data.reshape(dims)


def _find_idx_dir(root: Path, folders: tuple[str, ...]) -> Path | None:
    for folder in folders:
        candidate = root / folder
        if all((candidate / f).is_file() for f in IDX_FILES.values()):
            return candidate
    return None


def _idx_loader(
    name: str, folders: tuple[str, ...], tv_class: str, mean: float, std: float, flip: bool
) -> Callable[[DatasetRequest], Dataset]:
    """A loader for an MNIST-format dataset kept as the four official .gz files."""

    def load(request: DatasetRequest) -> Dataset:
        root, download = Path(request.root), request.download
        found = _find_idx_dir(root, folders)
        if found is None and download:
            _download_torchvision(tv_class, root)
            found = _find_idx_dir(root, folders)
        if found is None:
            files = ", ".join(IDX_FILES.values())
            raise ConfigError(
                f"{name} not found: put {files} in {root / folders[0]} "
                "(or set dataset.root / SSFL_DATA_DIR to the folder that holds it)"
            )
        arrays = {key: read_idx(found / fname) for key, fname in IDX_FILES.items()}
        return Dataset(
            name=name,
            train_x=torch.from_numpy(arrays["train_x"].copy()).unsqueeze(1),
            train_y=torch.from_numpy(arrays["train_y"].astype(np.int64)),
            test_x=torch.from_numpy(arrays["test_x"].copy()).unsqueeze(1),
            test_y=torch.from_numpy(arrays["test_y"].astype(np.int64)),
            num_classes=10,
            mean=(mean,),
            std=(std,),
            flip=flip,
        )

    return load


def _download_torchvision(tv_class: str, root: Path, **kwargs) -> object:
    """Fetch a dataset with torchvision's own downloader; one clear line when offline."""
    tv = import_torchvision()
    try:
        return getattr(tv.datasets, tv_class)(str(root), download=True, **kwargs)
    except Exception as err:  # network errors come in many types
        raise ConfigError(
            f"could not download {tv_class} into {root} ({type(err).__name__}); "
            "put the files there by hand or set dataset.root / SSFL_DATA_DIR"
        ) from err


def _images_to_nchw(data: np.ndarray | torch.Tensor) -> torch.Tensor:
    array = np.asarray(data)
    if array.ndim == 3:
        array = array[:, None]
    elif array.shape[-1] in (1, 3):
        array = array.transpose(0, 3, 1, 2)
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.uint8))


def _torchvision_loader(
    name: str,
    tv_class: str,
    mean: tuple[float, ...],
    std: tuple[float, ...],
    flip: bool,
    train_kwargs: dict,
    test_kwargs: dict,
    num_classes: int,
) -> Callable[[DatasetRequest], Dataset]:
    """A loader for a dataset handled by a torchvision dataset class."""

    def fetch(root: Path, download: bool, kwargs: dict):
        tv = import_torchvision()
        try:
            return getattr(tv.datasets, tv_class)(str(root), download=False, **kwargs)
        except (RuntimeError, FileNotFoundError) as err:
            if not download:
                raise ConfigError(
                    f"{name} not found in {root}: put torchvision's {tv_class} files there "
                    "or set dataset.download: true"
                ) from err
        return _download_torchvision(tv_class, root, **kwargs)

    def load(request: DatasetRequest) -> Dataset:
        root, download = Path(request.root), request.download
        train, test = fetch(root, download, train_kwargs), fetch(root, download, test_kwargs)
        labels = "labels" if hasattr(train, "labels") else "targets"
        return Dataset(
            name=name,
            train_x=_images_to_nchw(train.data),
            train_y=torch.as_tensor(np.asarray(getattr(train, labels)), dtype=torch.int64),
            test_x=_images_to_nchw(test.data),
            test_y=torch.as_tensor(np.asarray(getattr(test, labels)), dtype=torch.int64),
            num_classes=num_classes,
            mean=mean,
            std=std,
            flip=flip,
        )

    return load


def make_synthetic(
    size: int, train_size: int, test_size: int, channels: int = 1, num_classes: int = 10
) -> Dataset:
    """A learnable synthetic dataset: per-class smooth templates, shifted and noised.

    Fixed generator seed, so every process builds the same images.
    """
    gen = torch.Generator().manual_seed(20261122)
    coarse = torch.rand(num_classes, channels, 7, 7, generator=gen)
    templates = torch.nn.functional.interpolate(coarse, size=(size, size), mode="bilinear")

    def draw(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        labels = torch.arange(n) % num_classes
        labels = labels[torch.randperm(n, generator=gen)]
        images = templates[labels]
        shifts = torch.randint(-2, 3, (n, 2), generator=gen)
        images = torch.stack(
            [torch.roll(img, (int(s[0]), int(s[1])), dims=(1, 2)) for img, s in zip(images, shifts)]
        )
        images = images * (0.6 + 0.4 * torch.rand(n, 1, 1, 1, generator=gen))
        images = images + 0.25 * torch.randn(images.shape, generator=gen)
        return (images.clamp(0, 1) * 255).to(torch.uint8), labels

    train_x, train_y = draw(train_size)
    test_x, test_y = draw(test_size)
    return Dataset(
        name=f"synthetic{size}",
        train_x=train_x,
        train_y=train_y,
        test_x=test_x,
        test_y=test_y,
        num_classes=num_classes,
        mean=(0.5,) * channels,
        std=(0.25,) * channels,
        flip=False,
    )


CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)

# name: (torchvision class, mean, std, flip, train kwargs, test kwargs, classes)
TORCHVISION_SPECS: dict[str, tuple] = {
    "cifar10": ("CIFAR10", CIFAR_MEAN, CIFAR_STD, True, {"train": True}, {"train": False}, 10),
    "cifar100": (
        "CIFAR100",
        (0.5071, 0.4865, 0.4409),
        (0.2673, 0.2564, 0.2762),
        True,
        {"train": True},
        {"train": False},
        100,
    ),
    "svhn": (
        "SVHN",
        (0.4377, 0.4438, 0.4728),
        (0.1980, 0.2010, 0.1970),
        False,
        {"split": "train"},
        {"split": "test"},
        10,
    ),
    "emnist_balanced": (
        "EMNIST",
        (0.1751,),
        (0.3332,),
        False,
        {"split": "balanced", "train": True},
        {"split": "balanced", "train": False},
        47,
    ),
    "stl10": (
        "STL10",
        (0.4467, 0.4398, 0.4066),
        (0.2603, 0.2566, 0.2713),
        True,
        {"split": "train"},
        {"split": "test"},
        10,
    ),
}

DATASETS: dict[str, Callable[[DatasetRequest], Dataset]] = {
    "fashion_mnist": _idx_loader(
        "fashion_mnist",
        ("fashion-mnist", "FashionMNIST/raw", "."),
        "FashionMNIST",
        0.2860,
        0.3530,
        flip=True,
    ),
    "mnist": _idx_loader("mnist", ("mnist", "MNIST/raw", "."), "MNIST", 0.1307, 0.3081, flip=False),
    **{name: _torchvision_loader(name, *spec) for name, spec in TORCHVISION_SPECS.items()},
    "synthetic28": lambda req: make_synthetic(28, req.synthetic_train, req.synthetic_test, 1),
    "synthetic32": lambda req: make_synthetic(32, req.synthetic_train, req.synthetic_test, 3),
}


@functools.lru_cache(maxsize=4)
def load_dataset(request: DatasetRequest) -> Dataset:
    """Load a registered dataset once per process."""
    if request.name not in DATASETS:
        raise ConfigError(
            f"config key 'dataset.name': unknown dataset {request.name!r} "
            f"(allowed: {', '.join(sorted(DATASETS))})"
        )
    return DATASETS[request.name](request)


def dataset_request(cfg: Mapping[str, Any]) -> DatasetRequest:
    """The dataset an experiment asks for."""
    ds = cfg["dataset"]
    return DatasetRequest(
        name=ds["name"],
        root=str(data_root(cfg)),
        download=ds["download"],
        synthetic_train=ds["synthetic_train_size"],
        synthetic_test=ds["synthetic_test_size"],
    )

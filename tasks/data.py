"""Datasets as uint8 tensors: IDX files, torchvision datasets, a synthetic set, a node's folder.

Every loader returns a :class:`Dataset` with images of shape (N, C, H, W) in
uint8 and int64 labels. Loads are cached per process (``load_dataset``);
the official IDX files are checked against their SHA-256 (:data:`IDX_RELEASES`) first.
:data:`DATASET_INFO` holds what a model needs to know about each dataset's images
without loading them; :func:`load_image_folder` reads a node's own unlabeled
images (PNG/JPEG files or .npy arrays) in a dataset's format.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import math
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tasks.config import ConfigError, data_root
from tasks.settings import DatasetSettings


@dataclass(frozen=True)
class DatasetRequest:
    """What to load: a registered name, where its files are, and synthetic sizes."""

    name: str
    root: str
    download: bool = False
    synthetic_train: int = 4000
    synthetic_test: int = 1000


@dataclass(frozen=True)
class DatasetInfo:
    """What models and augmentation need to know about a dataset's images (no data)."""

    num_classes: int
    channels: int
    image_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    flip: bool


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


@dataclass(frozen=True)
class IdxRelease:
    """An official release of the four IDX files: its title and each file's SHA-256."""

    title: str
    sha256: Mapping[str, str]


# SHA-256 of the official .gz files, checked before they are parsed. Fashion-MNIST: the
# release of zalandoresearch/fashion-mnist (data/fashion/, MD5s as in its README). MNIST:
# LeCun, Cortes and Burges' release (MD5s as torchvision's MNIST checks).
IDX_RELEASES: dict[str, IdxRelease] = {
    "fashion_mnist": IdxRelease(
        "Fashion-MNIST",
        {
            "train-images-idx3-ubyte.gz": (
                "3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84"
            ),
            "train-labels-idx1-ubyte.gz": (
                "a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845"
            ),
            "t10k-images-idx3-ubyte.gz": (
                "346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073"
            ),
            "t10k-labels-idx1-ubyte.gz": (
                "67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5"
            ),
        },
    ),
    "mnist": IdxRelease(
        "MNIST",
        {
            "train-images-idx3-ubyte.gz": (
                "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609"
            ),
            "train-labels-idx1-ubyte.gz": (
                "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c"
            ),
            "t10k-images-idx3-ubyte.gz": (
                "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6"
            ),
            "t10k-labels-idx1-ubyte.gz": (
                "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6"
            ),
        },
    ),
}


def file_sha256(path: Path) -> str:
    """A file's SHA-256 in hex, computed once per process while its size and mtime stay."""
    stat = path.stat()
    return _sha256(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    """The SHA-256 of the file at ``path``; size and mtime only key the cache."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verify_release(folder: Path, release: IdxRelease) -> None:
    """Refuse, in one line naming the file, a file of ``folder`` that is not the official one."""
    for fname, expected in release.sha256.items():
        path = folder / fname
        if file_sha256(path) != expected:
            raise ConfigError(
                f"{path}: SHA-256 differs from the official {release.title} release "
                "(truncated or altered?); replace it with the official file"
            )


def _read_bytes(path: Path) -> bytes:
    """A file's bytes, gunzipped when it ends in .gz; a damaged file is one ConfigError line."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as fh:
            return fh.read()
    except (EOFError, OSError, zlib.error) as err:  # gzip.BadGzipFile is an OSError
        reason = getattr(err, "strerror", None) or str(err) or type(err).__name__
        raise ConfigError(
            f"{path}: cannot read it ({reason}); replace it with a good copy"
        ) from err


def read_idx(path: Path) -> np.ndarray:
    """Read one (optionally gzipped) IDX file of unsigned bytes into a numpy array."""
    raw = _read_bytes(path)
    if len(raw) < 4 or raw[:3] != b"\x00\x00\x08":
        raise ConfigError(f"{path}: not an IDX file of unsigned bytes")
    ndim = raw[3]
    offset = 4 + 4 * ndim
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    if len(raw) < offset or len(raw) - offset != math.prod(dims):
        raise ConfigError(f"{path}: truncated IDX file")
    return np.frombuffer(raw, dtype=np.uint8, offset=offset).reshape(dims)


def _find_idx_dir(root: Path, folders: tuple[str, ...]) -> Path | None:
    """The first of ``folders`` under ``root`` that holds all four IDX files."""
    for folder in folders:
        candidate = root / folder
        if all((candidate / f).is_file() for f in IDX_FILES.values()):
            return candidate
    return None


def _missing_idx_files(name: str, root: Path, folders: tuple[str, ...]) -> ConfigError:
    """One line for IDX files not found: the ones a folder holding some of them lacks, else all."""
    for folder in folders:
        candidate = root / folder
        missing = [candidate / f for f in IDX_FILES.values() if not (candidate / f).is_file()]
        if len(missing) < len(IDX_FILES):
            paths = ", ".join(str(path) for path in missing)
            return ConfigError(
                f"{paths}: missing beside the other {name} files in {candidate}; "
                "put the official file there"
            )
    files = ", ".join(IDX_FILES.values())
    return ConfigError(
        f"{name} not found: put {files} in {root / folders[0]} "
        "(or set dataset.root / SSFL_DATA_DIR to the folder that holds it)"
    )


def _labeled(name: str, train_x, train_y, test_x, test_y) -> Dataset:
    """A Dataset of registered ``name``, its class count and statistics from DATASET_INFO."""
    info = DATASET_INFO[name]
    return Dataset(
        name=name,
        train_x=train_x,
        train_y=train_y,
        test_x=test_x,
        test_y=test_y,
        num_classes=info.num_classes,
        mean=info.mean,
        std=info.std,
        flip=info.flip,
    )


def _idx_loader(
    name: str, folders: tuple[str, ...], tv_class: str
) -> Callable[[DatasetRequest], Dataset]:
    """A loader for an MNIST-format dataset kept as the four official .gz files."""

    def load(request: DatasetRequest) -> Dataset:
        root, download = Path(request.root), request.download
        found = _find_idx_dir(root, folders)
        if found is None and download:
            _download_torchvision(tv_class, root)
            found = _find_idx_dir(root, folders)
        if found is None:
            raise _missing_idx_files(name, root, folders)
        if name in IDX_RELEASES:
            verify_release(found, IDX_RELEASES[name])
        arrays = {key: read_idx(found / fname) for key, fname in IDX_FILES.items()}
        return _labeled(
            name,
            torch.from_numpy(arrays["train_x"].copy()).unsqueeze(1),
            torch.from_numpy(arrays["train_y"].astype(np.int64)),
            torch.from_numpy(arrays["test_x"].copy()).unsqueeze(1),
            torch.from_numpy(arrays["test_y"].astype(np.int64)),
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
    name: str, tv_class: str, train_kwargs: dict, test_kwargs: dict
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
        return _labeled(
            name,
            _images_to_nchw(train.data),
            torch.as_tensor(np.asarray(getattr(train, labels)), dtype=torch.int64),
            _images_to_nchw(test.data),
            torch.as_tensor(np.asarray(getattr(test, labels)), dtype=torch.int64),
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

# name: classes, channels, side, per-channel mean and std of the train images, horizontal flip
DATASET_INFO: dict[str, DatasetInfo] = {
    "fashion_mnist": DatasetInfo(10, 1, 28, (0.2860,), (0.3530,), flip=True),
    "mnist": DatasetInfo(10, 1, 28, (0.1307,), (0.3081,), flip=False),
    "cifar10": DatasetInfo(10, 3, 32, CIFAR_MEAN, CIFAR_STD, flip=True),
    "cifar100": DatasetInfo(
        100, 3, 32, (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762), flip=True
    ),
    "svhn": DatasetInfo(10, 3, 32, (0.4377, 0.4438, 0.4728), (0.1980, 0.2010, 0.1970), flip=False),
    "emnist_balanced": DatasetInfo(47, 1, 28, (0.1751,), (0.3332,), flip=False),
    "stl10": DatasetInfo(10, 3, 96, (0.4467, 0.4398, 0.4066), (0.2603, 0.2566, 0.2713), flip=True),
    "synthetic28": DatasetInfo(10, 1, 28, (0.5,), (0.25,), flip=False),
    "synthetic32": DatasetInfo(10, 3, 32, (0.5,) * 3, (0.25,) * 3, flip=False),
}

# name: (torchvision class, train kwargs, test kwargs)
TORCHVISION_SPECS: dict[str, tuple] = {
    "cifar10": ("CIFAR10", {"train": True}, {"train": False}),
    "cifar100": ("CIFAR100", {"train": True}, {"train": False}),
    "svhn": ("SVHN", {"split": "train"}, {"split": "test"}),
    "emnist_balanced": (
        "EMNIST",
        {"split": "balanced", "train": True},
        {"split": "balanced", "train": False},
    ),
    "stl10": ("STL10", {"split": "train"}, {"split": "test"}),
}

DATASETS: dict[str, Callable[[DatasetRequest], Dataset]] = {
    "fashion_mnist": _idx_loader(
        "fashion_mnist", ("fashion-mnist", "FashionMNIST/raw", "."), "FashionMNIST"
    ),
    "mnist": _idx_loader("mnist", ("mnist", "MNIST/raw", "."), "MNIST"),
    **{name: _torchvision_loader(name, *spec) for name, spec in TORCHVISION_SPECS.items()},
    "synthetic28": lambda req: make_synthetic(28, req.synthetic_train, req.synthetic_test, 1),
    "synthetic32": lambda req: make_synthetic(32, req.synthetic_train, req.synthetic_test, 3),
}


def _unknown_dataset(name: str) -> ConfigError:
    return ConfigError(
        f"config key 'dataset.name': unknown dataset {name!r} "
        f"(allowed: {', '.join(sorted(DATASETS))})"
    )


def dataset_info(name: str) -> DatasetInfo:
    """Classes, image format and statistics of a registered dataset, without loading it."""
    if name not in DATASET_INFO:
        raise _unknown_dataset(name)
    return DATASET_INFO[name]


@functools.lru_cache(maxsize=4)
def load_dataset(request: DatasetRequest) -> Dataset:
    """Load a registered dataset once per process."""
    if request.name not in DATASETS:
        raise _unknown_dataset(request.name)
    return DATASETS[request.name](request)


def dataset_request(ds: DatasetSettings) -> DatasetRequest:
    """The dataset an experiment asks for."""
    return DatasetRequest(
        name=ds.name,
        root=str(data_root(ds.root)),
        download=ds.download,
        synthetic_train=ds.synthetic_train_size,
        synthetic_test=ds.synthetic_test_size,
    )


# A node's own unlabeled images (deployment: node-config ``data-path``).
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")


def load_image_folder(path: str | Path, info: DatasetInfo) -> torch.Tensor:
    """A node's unlabeled images as uint8 (N, C, H, W) in the dataset's channels and size.

    Reads every PNG/JPEG file and .npy array directly inside ``path``, in name order.
    Images are converted to gray or RGB as ``info`` says and resized (bilinear) to
    ``info.image_size`` squared. A .npy array holds uint8 values, or floats in [0, 1]:
    2-D is one gray image; 3-D is one H x W x C image when the last axis has 3 or 4
    entries, else a stack of gray images; 4-D is N x H x W x C or N x C x H x W.
    A missing folder, an unreadable file or an empty folder is a one-line ConfigError.
    """
    folder = Path(path)
    if not folder.is_dir():
        raise ConfigError(f"data-path '{folder}': no such folder")
    try:
        files = sorted(p for p in folder.iterdir() if p.suffix.lower() in (*IMAGE_SUFFIXES, ".npy"))
    except OSError as err:
        raise ConfigError(f"data-path '{folder}': cannot list it ({err.strerror})") from err
    if not files:
        raise ConfigError(f"data-path '{folder}': no PNG, JPEG or .npy files in it")
    images: list[np.ndarray] = []
    for file in files:
        try:
            raw = _npy_images(file) if file.suffix.lower() == ".npy" else [_read_image(file)]
            images.extend(_fit_image(image, info) for image in raw)
        except (OSError, ValueError) as err:  # PIL's UnidentifiedImageError is an OSError
            reason = " ".join(str(err).split()) or type(err).__name__
            raise ConfigError(f"data-path '{folder}': cannot read {file.name} ({reason})") from err
    return torch.from_numpy(np.stack(images))


def _read_image(path: Path):
    from PIL import Image

    with Image.open(path) as image:
        image.load()
        return image.copy()


def _npy_images(path: Path) -> list[np.ndarray]:
    """The images of one .npy file, each H x W or H x W x 3/4 uint8 (see load_image_folder)."""
    array = np.load(path, allow_pickle=False)
    if np.issubdtype(array.dtype, np.floating):
        if array.size and not 0.0 <= array.min() <= array.max() <= 1.0:
            raise ValueError(f"float values must lie in [0, 1], found {array.min()}..{array.max()}")
        array = np.round(array * 255.0).astype(np.uint8)
    elif array.dtype != np.uint8:
        raise ValueError(f"expected uint8 or float values, got {array.dtype}")
    if array.ndim == 2:
        return [array]
    if array.ndim == 3:
        return [array] if array.shape[-1] in (3, 4) else list(array)
    if array.ndim == 4:
        if array.shape[-1] not in (1, 3, 4):
            if array.shape[1] not in (1, 3, 4):
                raise ValueError(f"no channel axis of size 1, 3 or 4 in shape {array.shape}")
            array = array.transpose(0, 2, 3, 1)
        return list(array[..., 0] if array.shape[-1] == 1 else array)
    raise ValueError(f"expected an array of 2 to 4 dimensions, got shape {array.shape}")


def _fit_image(image, info: DatasetInfo) -> np.ndarray:
    """A PIL image or an H x W (x 3/4) uint8 array -> C x H x W uint8 in the dataset's format."""
    from PIL import Image

    if isinstance(image, np.ndarray):
        image = Image.fromarray(image)
    image = image.convert("L" if info.channels == 1 else "RGB")
    side = info.image_size
    if image.size != (side, side):
        image = image.resize((side, side), Image.Resampling.BILINEAR)
    array = np.asarray(image, dtype=np.uint8)
    return array[None] if array.ndim == 2 else array.transpose(2, 0, 1)

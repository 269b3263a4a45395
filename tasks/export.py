"""A run's final global model as a file to keep: ``OUT/model.pt``.

The file is a dict read by ``torch.load(path, weights_only=True)``:

- ``state_dict``: the network's weights under plain names (``features.0.weight``,
  ``head.weight``, ...); FedMatch's decomposed parameters are stored as theta = sigma + psi;
- ``model``: the run's ``model`` config section; ``dataset``, ``num_classes``, ``channels``,
  ``image_size``, ``mean``, ``std``: the input the network expects (images in [0, 1],
  normalised inside the rebuilt model);
- ``method``, ``round``, ``test_accuracy``, ``ssfl_version``, ``format``.

:func:`load_model` rebuilds the network from these and loads the weights.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tasks.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from tasks.data import DatasetInfo
from tasks.models import model_for
from tasks.settings import ModelSettings, Settings, mapping

MODEL_FILE = "model.pt"
FORMAT = 1
# The network's key prefix inside a built model (model[0] normalises, model[1] is the net).
NET_PREFIX = "1."


def ssfl_version() -> str:
    """The installed ssfl's version ("unknown" when it runs from an uninstalled tree)."""
    try:
        return version("ssfl")
    except PackageNotFoundError:
        return "unknown"


def plain_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The weights of a built model (or of FedMatch's ``Decomposed`` wrapper, as
    theta = sigma + psi) under the network's own names, on the CPU."""
    if hasattr(model, "theta") and hasattr(model, "net"):
        state = {**model.net.state_dict(), **model.theta()}
    else:
        state = model.state_dict()
    return {
        key.removeprefix(NET_PREFIX): value.detach().cpu().clone() for key, value in state.items()
    }


def model_record(
    model: nn.Module, settings: Settings, data: Any, rows: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """The contents of model.pt for ``model`` after the rounds ``rows`` of run ``settings``;
    ``data``: the run's Dataset (classes, image format, normalisation)."""
    tested = [r["test_accuracy"] for r in rows if "test_accuracy" in r]
    return {
        "format": FORMAT,
        "state_dict": plain_state(model),
        "model": mapping(settings.model),
        "dataset": settings.dataset.name,
        "num_classes": int(data.num_classes),
        "channels": int(data.channels),
        "image_size": int(data.image_size),
        "mean": [float(v) for v in data.mean],
        "std": [float(v) for v in data.std],
        "method": settings.method,
        "round": int(rows[-1]["round"]) if rows else 0,
        "test_accuracy": float(tested[-1]) if tested else None,
        "ssfl_version": ssfl_version(),
    }


def save_model(
    model: nn.Module,
    settings: Settings,
    data: Any,
    rows: Sequence[Mapping[str, Any]],
    path: Path,
) -> None:
    """Write model.pt (atomically) for ``model`` after the rounds ``rows``."""
    save_checkpoint(model_record(model, settings, data, rows), path)


def read_model_file(path: str | Path) -> dict[str, Any]:
    """A model.pt's contents; CheckpointError (one line) when missing, unreadable or not one."""
    record = load_checkpoint(Path(path))
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not an ssfl model file (format {FORMAT})")
    return record


def rebuild(record: Mapping[str, Any]) -> nn.Module:
    """The network a model.pt describes, with its weights, in eval mode (on the CPU)."""
    image = DatasetInfo(
        record["num_classes"],
        record["channels"],
        record["image_size"],
        tuple(record["mean"]),
        tuple(record["std"]),
        flip=False,
    )
    model = model_for(ModelSettings(**record["model"]), image)
    model[1].load_state_dict(record["state_dict"])
    return model.eval()


def load_model(path: str | Path) -> nn.Module:
    """The model in ``path`` (a run's model.pt, or its run folder), ready for inference:
    ``model(images)`` takes N x C x H x W floats in [0, 1] and returns class scores."""
    path = Path(path)
    return rebuild(read_model_file(path / MODEL_FILE if path.is_dir() else path))

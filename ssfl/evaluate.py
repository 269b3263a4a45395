"""``ssfl evaluate RUN_DIR``: a run's kept model (OUT/model.pt) on the run's own split, or on
the same split of another dataset, with the metrics of the run's method (accuracy; for
FedoSSL runs also the open-world accuracies).

The model is evaluated by the method's own evaluator on the images the run tested on, so
``test_accuracy`` equals the run's final test accuracy (same device kind, same numbers).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ssfl.experiment import resolve_config
from ssfl.registry import settings_of
from tasks.config import ConfigError, deep_merge, read_yaml
from tasks.settings import Settings

# --split: which of the server's image sets the model is evaluated on.
SPLITS = ("test", "val", "labeled")
RUN_CONFIG = "config.yaml"


def run_config(run_dir: Path, dataset: str | None) -> Settings:
    """The resolved experiment of a run folder (its config.yaml), on ``dataset`` if given."""
    path = run_dir / RUN_CONFIG
    if not path.is_file():
        raise ConfigError(f"{run_dir} is not a run folder (no {RUN_CONFIG}); give a run's --out")
    raw = read_yaml(path)
    if dataset:
        raw = deep_merge(raw, {"dataset": {"name": dataset}})
    return settings_of(resolve_config(raw))


def kept_model(run_dir: Path) -> dict[str, Any]:
    """The run's model.pt contents; a one-line ConfigError when it has none."""
    from tasks.checkpoint import CheckpointError
    from tasks.export import MODEL_FILE, read_model_file

    try:
        return read_model_file(run_dir / MODEL_FILE)
    except CheckpointError as err:
        raise ConfigError(f"{err}; only runs that finished keep their model") from err


def check_image_format(record: dict[str, Any], data: Any) -> None:
    """Refuse a dataset whose images or classes the kept model cannot take."""
    wanted = (record["channels"], record["image_size"], record["num_classes"])
    given = (data.channels, data.image_size, data.num_classes)
    if wanted != given:
        raise ConfigError(
            f"--dataset {data.name}: {given[0]}x{given[1]}x{given[1]} images of {given[2]} "
            f"classes; the model takes {wanted[0]}x{wanted[1]}x{wanted[1]} images of "
            f"{wanted[2]} classes"
        )


def evaluate_run(run_dir: Path, dataset: str | None = None, split: str = "test") -> dict[str, Any]:
    """The metrics of a run's kept model on ``split`` (see :data:`SPLITS`); also ``images``
    (how many were evaluated), ``round`` and ``recorded`` (the run's final test accuracy)."""
    from ssfl.registry import method
    from strategies.parts import ServerSide
    from tasks.export import rebuild
    from tasks.partition import get_split
    from tasks.train import resolve_device

    if split not in SPLITS:
        raise ConfigError(f"--split {split!r}: choose one of {', '.join(SPLITS)}")
    settings = run_config(run_dir, dataset)
    record = kept_model(run_dir)
    data, indices = get_split(settings)
    check_image_format(record, data)
    device = resolve_device(settings.device)
    server = ServerSide.build(settings, data, indices, device)
    x, y = getattr(server, f"{split}_x"), getattr(server, f"{split}_y")
    if len(y) == 0:
        raise ConfigError(f"--split {split}: this run's server holds no {split} images")
    server = dataclasses.replace(server, test_x=x, test_y=y)
    evaluator = method(settings.method).server_half().parts(server).evaluator
    metrics = evaluator.evaluate(rebuild(record).to(device))
    shown = {k: v for k, v in metrics.items() if not k.startswith("best_")}
    return {
        **shown,
        "images": len(y),
        "round": record["round"],
        "recorded": record["test_accuracy"],
    }


def report_lines(metrics: dict[str, Any], split: str) -> list[str]:
    """``name=value`` lines, the split's accuracy last (``test_accuracy=0.xxxx``)."""
    accuracy = metrics["test_accuracy"]
    skip = {"test_accuracy", "images", "round", "recorded"}
    lines = [
        f"{k.replace('test_', f'{split}_', 1)}={v:.4f}"
        for k, v in sorted(metrics.items())
        if k not in skip
    ]
    return [*lines, f"{split}_accuracy={accuracy:.4f}"]

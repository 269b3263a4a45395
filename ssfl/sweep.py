"""``ssfl sweep``: run one experiment over a grid of config values; a table and a plot.

Each cell is the experiment with one combination of the grid's values, applied after
the ``--set`` overrides. ``a.b+c.d=v1,v2`` ties keys: both take each value together
(the SSFL benchmark's T is ``client.local_steps`` and ``server.local_steps`` at once).
Every cell is resolved and its split built before any training, so a bad value fails
first. A cell whose folder holds a completed run's results.json made with the same
resolved config is reused; any other cell is (re)run. Writes ``DIR/table.md`` (one row
per cell), ``DIR/sweep.png`` (final accuracy against the first grid key, one line per
combination of the other keys) and ``DIR/accuracy.png`` (every cell's curve).
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path
from typing import Any

from ssfl.cells import Cell as CellRun
from ssfl.cells import run_cells
from ssfl.experiment import REFUSE, CellFolders, check_data, resolve_experiment, reusable_run
from ssfl.registry import settings_of
from tasks.config import ConfigError, parse_scalar
from tasks.results import markdown_table, plot_curves, plot_sweep
from tasks.settings import Settings

Cell = tuple[tuple[str, Any], ...]


def parse_grid(items: list[str]) -> list[tuple[str, list[Any]]]:
    """["key=v1,v2", ...] -> [(key, [v1, v2]), ...], values parsed like YAML scalars."""
    grid = []
    for item in items:
        key, sep, values = item.partition("=")
        parts = [v.strip() for v in values.split(",")]
        if not sep or not all(k.strip() for k in key.split("+")) or not all(parts):
            raise ConfigError(f"--set-grid '{item}' is not of the form key=v1,v2,...")
        if any(key.strip() == k for k, _ in grid):
            raise ConfigError(f"--set-grid: key '{key.strip()}' given twice")
        grid.append((key.strip(), [parse_scalar(v) for v in parts]))
    return grid


def grid_cells(grid: list[tuple[str, list[Any]]]) -> list[Cell]:
    """Every combination of the grid's values, in the order given."""
    keys = [k for k, _ in grid]
    return [tuple(zip(keys, combo)) for combo in itertools.product(*(v for _, v in grid))]


def cell_overrides(cell: Cell) -> list[str]:
    """The cell's values as --set overrides, one per key of a tied a+b key."""
    return [f"{k.strip()}={v}" for key, v in cell for k in key.split("+")]


def cell_label(cell: Cell) -> str:
    return ",".join(f"{k}={v}" for k, v in cell)


def cell_dir(out: Path, cell: Cell) -> Path:
    return out / cell_label(cell).replace("/", "_").replace(" ", "_")


def plan_cell(settings: Settings, out: Path, label: str, folders: CellFolders) -> dict | CellRun:
    """A completed run of ``settings`` in ``out`` (reused), else the run to make (a
    one-line ConfigError now when ``out`` holds another run and ``folders`` says neither
    to resume nor to replace it)."""
    previous = reusable_run(out, settings)
    if previous is not None:
        print(f"ssfl sweep: {label}: reusing {out}", file=sys.stderr)
        return previous
    folders.action(out, settings)
    return CellRun("sweep", label, settings, out, folders)


def sweep_table(experiment: str, grid: list[tuple[str, list[Any]]], runs: list[dict]) -> str:
    """The runs' table (tasks.results.markdown_table) under a title naming the grid."""
    keys = ", ".join(k for k, _ in grid)
    return f"### Sweep of {keys} ({experiment})\n\n{markdown_table(runs)}"


def sweep(
    experiment: str,
    grid_items: list[str],
    sets: list[str],
    rounds: int | None,
    out: Path,
    folders: CellFolders = REFUSE,
    jobs: int = 1,
) -> str:
    """Run (or reuse) every cell of the grid; write table.md, sweep.png and accuracy.png.
    A cell folder holding another run is refused before anything runs, unless ``folders``
    says to resume or replace it; ``jobs``: cells run at once, each in a process of its
    own (:mod:`ssfl.cells`)."""

    grid = parse_grid(grid_items)
    cells = grid_cells(grid)
    configs = []
    for cell in cells:
        overrides = [*sets, *cell_overrides(cell)]
        settings = settings_of(resolve_experiment(experiment, rounds, None, overrides))
        check_data(settings)
        configs.append(settings)
    plans = [
        plan_cell(settings, cell_dir(out, cell), cell_label(cell), folders)
        for cell, settings in zip(cells, configs)
    ]
    out.mkdir(parents=True, exist_ok=True)
    ran = iter(run_cells([plan for plan in plans if isinstance(plan, CellRun)], jobs))
    runs = []
    for cell, plan in zip(cells, plans):
        res = next(ran) if isinstance(plan, CellRun) else plan
        res["name"] = cell_label(cell)
        runs.append(res)
    text = sweep_table(experiment, grid, runs)
    (out / "table.md").write_text(text + "\n")
    series: dict[str, list[tuple[Any, float]]] = {}
    for cell, res in zip(cells, runs):
        series.setdefault(cell_label(cell[1:]), []).append((cell[0][1], res["final_test_accuracy"]))
    plot_sweep(series, grid[0][0], out / "sweep.png")
    plot_curves(runs, out / "accuracy.png", title=f"sweep of {grid[0][0]}")
    return text

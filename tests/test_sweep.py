"""``ssfl sweep``: grid parsing, cells reused only when their config matches, table and plot."""

from __future__ import annotations

import json

import pytest
import yaml

import ssfl.cells
from ssfl.cli import main
from ssfl.experiment import CellFolders, resolve_experiment
from ssfl.sweep import cell_dir, cell_overrides, grid_cells, parse_grid, sweep
from tasks.config import ConfigError
from tasks.results import plot_curves, plot_sweep
from tasks.settings import mapping


def test_parse_grid_and_cells():
    grid = parse_grid(["split.target_r=0,0.2,1.0", "method=fedavg_with_server,fedrgd"])
    assert grid == [("split.target_r", [0, 0.2, 1.0]), ("method", ["fedavg_with_server", "fedrgd"])]
    cells = grid_cells(grid)
    assert len(cells) == 6 and cells[1] == (("split.target_r", 0), ("method", "fedrgd"))


def test_tied_keys_take_each_value_together():
    grid = parse_grid(["client.local_steps+server.local_steps=2,8", "seed=0,1"])
    cells = grid_cells(grid)
    assert len(cells) == 4
    assert cell_overrides(cells[2]) == ["client.local_steps=8", "server.local_steps=8", "seed=0"]


@pytest.mark.parametrize("item", ["rounds", "=1,2", "rounds=1,,2", "rounds=", "a+=1,2"])
def test_bad_grid_is_a_config_error(item):
    with pytest.raises(ConfigError, match="--set-grid"):
        parse_grid([item])
    with pytest.raises(ConfigError, match="given twice"):
        parse_grid(["seed=1,2", "seed=3"])


def fake_results(cfg: dict, acc: float) -> dict:
    rows = [{"round": 1, "test_accuracy": acc, "bytes_c2s": 0}]
    return {
        "method": cfg["method"],
        "name": cfg["name"],
        "dataset": cfg["dataset"]["name"],
        "config": cfg,
        "split": {"partitioner": "noniid_r", "noniid_r": cfg["split"]["target_r"]},
        "rounds": rows,
        "final_test_accuracy": acc,
        "best_test_accuracy": acc,
        "wall_seconds": 1.0,
    }


def test_sweep_reuses_matching_cells_and_reruns_stale_ones(tmp_path, synthetic_raw, monkeypatch):
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump({**synthetic_raw, "method": "server_sl", "rounds": 1}))
    out = tmp_path / "sweep"
    grid = ["split.target_r=0.0,0.4"]
    cells = grid_cells(parse_grid(grid))
    cfgs = [resolve_experiment(str(exp), None, None, [f"{k}={v}" for k, v in c]) for c in cells]
    for cell, cfg, acc in zip(cells, cfgs, (0.9, 0.1)):
        cell_dir(out, cell).mkdir(parents=True)
        stored = cfg if acc == 0.9 else {**cfg, "seed": 7}  # the second cell is stale
        (cell_dir(out, cell) / "results.json").write_text(json.dumps(fake_results(stored, acc)))
    ran = []

    def fake_run(settings, path, stream=True, resume=False):
        cfg = mapping(settings)
        ran.append(path)
        return fake_results(cfg, 0.7)

    monkeypatch.setattr(ssfl.cells, "run_simulation", fake_run)
    text = sweep(str(exp), grid, [], None, out, CellFolders(overwrite=True))  # stale: rerun
    assert ran == [cell_dir(out, cells[1])]
    assert "| split.target_r=0.0 | server_sl |" in text and "| 0.9000 |" in text
    assert "| split.target_r=0.4 |" in text and "| 0.7000 |" in text
    assert (out / "table.md").read_text().strip() == text.strip()
    assert (out / "sweep.png").stat().st_size > 0 and (out / "accuracy.png").stat().st_size > 0


def test_cli_sweep_rejects_a_bad_value_before_running(tmp_path, synthetic_raw, capsys):
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump({**synthetic_raw, "method": "server_sl"}))
    code = main(["sweep", str(exp), "--set-grid", "split.target_r=0.2,1.5", "--out", str(tmp_path)])
    assert code == 2 and "target_r" in capsys.readouterr().err
    assert not (tmp_path / "split.target_r=0.2").exists()


def test_sweep_plot_takes_names_and_curves_take_any_metric(tmp_path):
    plot_sweep({"": [("fedavg_with_server", 0.8), ("fedrgd", 0.82)]}, "method", tmp_path / "s.png")
    assert (tmp_path / "s.png").stat().st_size > 0
    rows = [{"round": 1, "test_accuracy": 0.5}, {"round": 2, "weight_diversity": 0.3}]
    plot_curves([{"name": "a", "rounds": rows}], tmp_path / "d.png", metric="weight_diversity")
    assert (tmp_path / "d.png").stat().st_size > 0

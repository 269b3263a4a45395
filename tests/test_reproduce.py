"""``ssfl reproduce``: finished cells are reused; the table puts ours beside the paper's."""

from __future__ import annotations

import json

import pytest

import ssfl.reproduce
from ssfl.experiment import resolve_experiment
from ssfl.reproduce import TABLES, cell_dir, reproduce
from tasks.config import ConfigError
from tests.conftest import ROOT


def fake_results(acc: float, rounds: int = 3, config: dict | None = None) -> dict:
    rows = [{"round": r, "test_accuracy": acc - 0.01 * (rounds - r)} for r in range(1, rounds + 1)]
    return {
        "method": "m",
        "name": "",
        "rounds": rows,
        "final_test_accuracy": acc,
        "best_test_accuracy": acc,
        "config": config or {},
    }


def write_table_cells(out, accs: dict[str, float]) -> None:
    """A results.json in every cell of fedseal-table1, made with the cell's own config."""
    table = TABLES["fedseal-table1"]
    for column, overrides in table.columns.items():
        for row in table.rows:
            folder = cell_dir(out, row, column)
            folder.mkdir(parents=True)
            cfg = resolve_experiment(row.experiment, None, None, overrides)
            (folder / "results.json").write_text(json.dumps(fake_results(accs[row.label], 3, cfg)))


ACCS = {
    "Server-SL": 0.80,
    "FedAvg-SL": 0.86,
    "FedAvg-FixMatch": 0.79,
    "FedAvg-UDA": 0.78,
    "FedSEAL": 0.84,
    "FedMatch": 0.81,
}


def test_table_from_finished_cells(tmp_path):
    write_table_cells(tmp_path, ACCS)
    text = reproduce("fedseal-table1", tmp_path, None, [])
    assert "| FedSEAL | 0.8400 | 0.8418 | 0.8400 | 0.8428 |" in text
    assert "| FedSEAL - Server-SL | +0.0400 | +0.0447 | +0.0400 | +0.0403 |" in text
    assert "| FedMatch | 0.8100 | - | 0.8100 | - |" in text  # not in the paper's table
    assert "| FedMatch - Server-SL | +0.0100 | - | +0.0100 | - |" in text
    assert "after 3 rounds" in text
    assert (tmp_path / "table.md").read_text().strip() == text.strip()
    assert (tmp_path / "accuracy.png").stat().st_size > 0


def test_a_cell_made_with_another_config_runs_again(tmp_path, monkeypatch):
    write_table_cells(tmp_path, ACCS)
    ran = []

    def fake_run(cfg, out, stream):
        ran.append((cfg["method"], cfg["client"]["lr"], out.name))
        return fake_results(0.5, 3, cfg)

    monkeypatch.setattr(ssfl.reproduce, "run_simulation", fake_run)
    monkeypatch.setattr(ssfl.reproduce, "check_data", lambda cfg: cfg)
    text = reproduce("fedseal-table1", tmp_path, None, ["client.lr=0.123"])
    assert len(ran) == 12  # client.lr is in every cell's config, Server-SL's too
    assert all(lr == pytest.approx(0.123) for _, lr, _ in ran)
    assert "0.5000" in text


def test_same_config_ignores_where_a_run_executes_not_what_it_computes():
    from ssfl.reproduce import same_config

    cfg = resolve_experiment("experiments/fmnist-las/fedseal.yaml", None, None, [])
    moved = json.loads(json.dumps(cfg))
    moved["dataset"]["root"] = "/elsewhere"
    moved["federation"]["min_clients"] = 1
    moved["simulation"]["num_gpus"] = 0.5
    assert same_config(moved, cfg)
    moved["algo"]["tau_max"] = 1.0
    assert not same_config(moved, cfg)


def test_no_run_tables_the_finished_cells_only(tmp_path, monkeypatch):
    write_table_cells(tmp_path, ACCS)
    fedseal = next(r for r in TABLES["fedseal-table1"].rows if r.label == "FedSEAL")
    (cell_dir(tmp_path, fedseal, "IID") / "results.json").unlink()
    monkeypatch.setattr(ssfl.reproduce, "run_simulation", pytest.fail)
    text = reproduce("fedseal-table1", tmp_path, None, [], run=False)
    assert "| FedSEAL | 0.8400 | 0.8418 | not run | 0.8428 |" in text
    assert "| FedSEAL - Server-SL | +0.0400 | +0.0447 | not run | +0.0403 |" in text


def test_fedmatch_table2_has_one_experiment_per_scenario_and_costs(tmp_path):
    table = TABLES["fedmatch-table2"]
    for row in table.rows:
        for column in table.columns:
            path = row.experiment_for(column)
            assert (ROOT / path).is_file(), path
            folder = cell_dir(tmp_path, row, column)
            folder.mkdir(parents=True)
            overrides = table.columns[column]
            cfg = resolve_experiment(path, None, None, overrides)
            assert cfg["eval"]["local_models"], path  # the paper's metric is recorded
            res = {**fake_results(0.80, 3, cfg), "final_local_accuracy": 0.7}
            for r in res["rounds"]:  # a quarter of the dense bytes each way
                r.update(bytes_s2c=25, bytes_s2c_dense=100, bytes_c2s=50, bytes_c2s_dense=200)
            (folder / "results.json").write_text(json.dumps(res))
    text = reproduce("fedmatch-table2", tmp_path, None, [])
    assert "| method | Labels-at-Client ours | Labels-at-Client ours, local |" in text
    assert "| FedMatch | 0.8000 | 0.7000 | 0.7795 | 0.8000 | 0.7000 | 0.8415 |" in text
    assert "| FedProx-FixMatch | 0.8000 | 0.7000 | 0.6240 | 0.8000 | 0.7000 | 0.7371 |" in text
    assert "| FedMatch | 25% / 25% | 37% / 48% | 25% / 25% | 14% / 63% |" in text


def test_fedsup_tables_share_cells_and_show_the_gap_each_row_closes(tmp_path, monkeypatch):
    from ssfl.reproduce import FEDSUP_ROWS

    table = TABLES["fedsup-table6"]
    accs = dict(zip(FEDSUP_ROWS, (0.70, 0.90, 0.72, 0.73, 0.74, 0.75, 0.76, 0.80)))
    ran = []

    labels = {cell_dir(tmp_path, r, c): r.label for r in table.rows for c in table.columns}

    def fake_run(cfg, out, stream):
        ran.append(out.name)
        acc = accs[labels[out]]
        return {
            **fake_results(acc, 2, cfg),
            "final_finetune_accuracy": acc,
            "final_linear_accuracy": acc - 0.1,
        }

    monkeypatch.setattr(ssfl.reproduce, "run_simulation", fake_run)
    monkeypatch.setattr(ssfl.reproduce, "check_data", lambda cfg: cfg)
    text = reproduce("fedsup-table6", tmp_path, 2, [], dataset="fmnist")
    assert len(ran) == len(FEDSUP_ROWS) * len(table.columns)
    assert "Table 6.1" in text and "Table 6.2" in text
    assert "| FedSup | 0.8000 | 0.6954 | 0.8000 | 0.6884 |" in text  # finetuning
    assert "| FedSup | 0.7000 | 0.6626 | 0.7000 | 0.6610 |" in text  # linear evaluation
    assert "| FedSup | 50% | 56% | 50% | 58% |" in text  # (0.80 - 0.70) / (0.90 - 0.70)
    with pytest.raises(ConfigError, match="--dataset"):
        reproduce("fedsup-table6", tmp_path, 2, [], dataset="mnist")

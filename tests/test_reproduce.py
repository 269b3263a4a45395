"""``ssfl reproduce``: finished cells are reused; the table puts ours beside the paper's."""

from __future__ import annotations

import json

from ssfl.reproduce import TABLES, cell_dir, reproduce
from tests.conftest import ROOT


def fake_results(acc: float, rounds: int = 3) -> dict:
    rows = [{"round": r, "test_accuracy": acc - 0.01 * (rounds - r)} for r in range(1, rounds + 1)]
    return {
        "method": "m",
        "name": "",
        "rounds": rows,
        "final_test_accuracy": acc,
        "best_test_accuracy": acc,
    }


def test_table_from_finished_cells(tmp_path):
    table = TABLES["fedseal-table1"]
    accs = {
        "Server-SL": 0.80,
        "FedAvg-SL": 0.86,
        "FedAvg-FixMatch": 0.79,
        "FedAvg-UDA": 0.78,
        "FedSEAL": 0.84,
    }
    for column in table.columns:
        for row in table.rows:
            folder = cell_dir(tmp_path, row, column)
            folder.mkdir(parents=True)
            (folder / "results.json").write_text(json.dumps(fake_results(accs[row.label])))
    text = reproduce("fedseal-table1", tmp_path, None, [])
    assert "| FedSEAL | 0.8400 | 0.8418 | 0.8400 | 0.8428 |" in text
    assert "| FedSEAL - Server-SL | +0.0400 | +0.0447 | +0.0400 | +0.0403 |" in text
    assert "after 3 rounds" in text
    assert (tmp_path / "table.md").read_text().strip() == text.strip()
    assert (tmp_path / "accuracy.png").stat().st_size > 0


def test_fedmatch_table2_has_one_experiment_per_scenario_and_costs(tmp_path):
    table = TABLES["fedmatch-table2"]
    for row in table.rows:
        for column in table.columns:
            path = row.experiment_for(column)
            assert (ROOT / path).is_file(), path
            folder = cell_dir(tmp_path, row, column)
            folder.mkdir(parents=True)
            res = fake_results(0.80)
            for r in res["rounds"]:  # a quarter of the dense bytes each way
                r.update(bytes_s2c=25, bytes_s2c_dense=100, bytes_c2s=50, bytes_c2s_dense=200)
            (folder / "results.json").write_text(json.dumps(res))
    text = reproduce("fedmatch-table2", tmp_path, None, [])
    assert "| FedMatch | 0.8000 | 0.7795 | 0.8000 | 0.8415 |" in text
    assert "| FedProx-FixMatch | 0.8000 | 0.6240 | 0.8000 | 0.7371 |" in text
    assert "| FedMatch | 25% / 25% | 37% / 48% | 25% / 25% | 14% / 63% |" in text

"""``ssfl reproduce``: finished cells are reused; the table puts ours beside the paper's."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

import ssfl.cells
import ssfl.reproduce
from ssfl.experiment import CellFolders, resolve_experiment
from ssfl.registry import settings_of
from ssfl.reproduce import TABLES, Pick, cell_dir, reproduce
from tasks.config import ConfigError
from tasks.settings import mapping
from tests.conftest import ROOT


def fake_results(acc: float, rounds: int = 3, config: dict | None = None) -> dict:
    rows = [{"round": r, "test_accuracy": acc - 0.01 * (rounds - r)} for r in range(1, rounds + 1)]
    return {
        "method": "m",
        "name": "",
        "rounds": rows,
        "final_test_accuracy": acc,
        "best_test_accuracy": acc,
        "wall_seconds": 12.5,
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
    assert "after 3 rounds, of the global model after the server's step" in text
    assert (tmp_path / "table.md").read_text().strip() == text.strip()
    assert (tmp_path / "accuracy.png").stat().st_size > 0


def test_a_cell_made_with_another_config_runs_again(tmp_path, monkeypatch):
    write_table_cells(tmp_path, ACCS)
    ran = []

    def fake_run(settings, out, stream, resume=False):
        cfg = mapping(settings)
        ran.append((cfg["method"], cfg["client"]["lr"], out.name))
        return fake_results(0.5, 3, cfg)

    monkeypatch.setattr(ssfl.cells, "run_simulation", fake_run)
    monkeypatch.setattr(ssfl.reproduce, "check_data", lambda cfg: cfg)
    rerun = CellFolders(overwrite=True)
    text = reproduce("fedseal-table1", tmp_path, None, ["client.lr=0.123"], folders=rerun)
    assert len(ran) == 12  # client.lr is in every cell's config, Server-SL's too
    assert all(lr == pytest.approx(0.123) for _, lr, _ in ran)
    assert "0.5000" in text


def test_same_config_ignores_where_a_run_executes_not_what_it_computes():
    from ssfl.experiment import same_config

    cfg = resolve_experiment("experiments/fmnist-las/fedseal.yaml", None, None, [])
    moved = json.loads(json.dumps(cfg))
    moved["dataset"]["root"] = "/elsewhere"
    moved["federation"]["min_clients"] = 1
    moved["simulation"]["num_gpus"] = 0.5
    assert same_config(moved, settings_of(cfg))
    moved["algo"]["tau_max"] = 1.0
    assert not same_config(moved, settings_of(cfg))


@pytest.mark.parametrize("gpus, same", [(0, True), (1, False)])
def test_a_run_recorded_with_kornia_is_the_auto_config_where_auto_runs_kornia(
    monkeypatch, gpus, same
):
    """Runs made when kornia was the default are reused and resumed by today's `auto` config
    on a machine without a GPU (where auto runs kornia), not where auto runs batched."""
    from ssfl.experiment import same_config

    monkeypatch.setattr("ssfl.gpu.gpu_count", lambda: gpus)
    cfg = resolve_experiment("experiments/fmnist-las/fedseal.yaml", None, None, [])
    assert cfg["augment"]["engine"] == "auto" and cfg["device"] == "auto"
    older = json.loads(json.dumps(cfg))
    older["augment"]["engine"] = "kornia"
    assert same_config(older, settings_of(cfg)) is same
    older["augment"]["engine"] = "batched"
    assert same_config(older, settings_of(cfg)) is not same
    on_cpu = resolve_experiment("experiments/fmnist-las/fedseal.yaml", None, None, ["device=cpu"])
    older["device"] = "cpu"
    older["augment"]["engine"] = "kornia"
    assert same_config(older, settings_of(on_cpu))


def test_cohort_only_keys_compare_only_in_cohort_runs():
    """A per-client run made when partial sums were on by default is the same config; a
    cohort run with them on is not (its sums round otherwise)."""
    from ssfl.experiment import same_config

    cfg = resolve_experiment("experiments/fmnist-las/fedseal.yaml", None, None, [])
    older = json.loads(json.dumps(cfg))
    older["simulation"].update(partial_sums=True, workers=3)
    assert same_config(older, settings_of(cfg))
    sets = ["simulation.execution=cohort"]
    cohort = resolve_experiment("experiments/fmnist-las/fedseal.yaml", None, None, sets)
    summed = json.loads(json.dumps(cohort))
    summed["simulation"]["partial_sums"] = True
    assert not same_config(summed, settings_of(cohort))


def test_no_run_tables_the_finished_cells_only(tmp_path, monkeypatch):
    write_table_cells(tmp_path, ACCS)
    fedseal = next(r for r in TABLES["fedseal-table1"].rows if r.label == "FedSEAL")
    (cell_dir(tmp_path, fedseal, "IID") / "results.json").unlink()
    monkeypatch.setattr(ssfl.cells, "run_simulation", pytest.fail)
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
    accs = dict(zip(FEDSUP_ROWS, (0.70, 0.90, 0.72, 0.73, 0.74, 0.75, 0.76, 0.80, 0.71)))
    ran = []

    labels = {cell_dir(tmp_path, r, c): r.label for r in table.rows for c in table.columns}

    def fake_run(settings, out, stream, resume=False):
        cfg = mapping(settings)
        ran.append(out.name)
        acc = accs[labels[out]]
        return {
            **fake_results(acc, 2, cfg),
            "final_finetune_accuracy": acc,
            "final_linear_accuracy": acc - 0.1,
        }

    monkeypatch.setattr(ssfl.cells, "run_simulation", fake_run)
    monkeypatch.setattr(ssfl.reproduce, "check_data", lambda cfg: cfg)
    text = reproduce("fedsup-table6", tmp_path, 2, [], dataset="fmnist")
    assert len(ran) == len(FEDSUP_ROWS) * len(table.columns)
    assert "Table 6.1" in text and "Table 6.2" in text
    assert "| FedSup | 0.8000 | 0.6954 | 0.8000 | 0.6884 |" in text  # finetuning
    assert "| FedSup | 0.7000 | 0.6626 | 0.7000 | 0.6610 |" in text  # linear evaluation
    assert "| FedSup | 50% | 56% | 50% | 58% |" in text  # (0.80 - 0.70) / (0.90 - 0.70)
    # The paper's view: bounds at their plain test accuracy (fake_results: acc as well), the
    # rows under linear evaluation (acc - 0.1): (0.70 - 0.70) / 0.20 for FedSup.
    assert "| gap closed, bounds without the protocol |" in text
    assert "| FedSup | 0% | 41% | 0% | 45% |" in text  # Table 6.2: (0.6626 - 0.5692) / 0.2258
    assert "| FedSup N = 0 | 0.7100 | 0.5720 | 0.7100 | 0.5680 |" in text  # Table 6.3
    with pytest.raises(ConfigError, match="--dataset"):
        reproduce("fedsup-table6", tmp_path, 2, [], dataset="mnist")


def test_the_fedsup_room_table_runs_the_rows_it_names(tmp_path, monkeypatch):
    ran = []

    def fake_run(settings, out, stream, resume=False):
        cfg = mapping(settings)
        ran.append((out.name, cfg["split"]["labeled_per_class"]))
        res = fake_results(0.7, 2, cfg)
        return {**res, "final_finetune_accuracy": 0.7, "final_linear_accuracy": 0.6}

    monkeypatch.setattr(ssfl.cells, "run_simulation", fake_run)
    monkeypatch.setattr(ssfl.reproduce, "check_data", lambda cfg: cfg)
    text = reproduce(
        "fedsup-table6", tmp_path, 2, [], dataset="fmnist-room", pick=Pick(columns=("IID",))
    )
    rows = ["Centralized", "Fully Supervised", "SimCLR", "BYOL", "FedSup", "FedSup N = 0"]
    assert len(ran) == len(rows) and {labels for _, labels in ran} == {50}
    assert all(f"| {row} | 0.7000 |" in text for row in rows)
    assert "FixMatch" not in text and "FedRGD" not in text
    assert "fedsup_n0-iid" in {folder for folder, _ in ran}
    with pytest.raises(ConfigError, match="--rows"):
        reproduce("fedsup-table6", tmp_path, 2, [], dataset="fmnist-room", pick=Pick(("FedRGD",)))


def test_a_missing_row_file_is_refused_by_name(tmp_path, monkeypatch):
    """A lost experiment file stops the table with its path instead of shrinking it."""
    app = tmp_path / "app"
    room = app / "experiments/fmnist-fedsup-room"
    room.mkdir(parents=True)
    for name in ("centralized", "fully_supervised", "simclr", "byol", "fedsup"):
        (room / f"{name}.yaml").write_text("method: fedsup\n")
    monkeypatch.setattr(ssfl.reproduce, "APP_DIR", app)
    with pytest.raises(
        ConfigError, match=r"row 'FedSup N = 0' needs experiments/fmnist-fedsup-room/fedsup_n0"
    ):
        reproduce("fedsup-table6", tmp_path / "out", 2, [], dataset="fmnist-room", run=False)
    assert not (tmp_path / "out").exists()


def test_every_subset_names_rows_and_a_dataset_of_its_table():
    for name, table in TABLES.items():
        labels = {row.label for row in table.rows}
        for dataset, subset in table.subsets.items():
            assert dataset in table.datasets, (name, dataset)
            assert set(subset) <= labels, (name, set(subset) - labels)


def test_a_subset_label_that_names_no_row_is_refused(tmp_path, monkeypatch):
    """A misspelt subset label stops the table instead of dropping the row it meant."""
    table = TABLES["fedsup-table6"]
    subsets = {"fmnist-room": ("Centralized", "FedSup N=0")}
    monkeypatch.setitem(TABLES, "fedsup-table6", replace(table, subsets=subsets))
    with pytest.raises(
        ConfigError, match=r"--dataset fmnist-room: the table has no row 'FedSup N=0'"
    ):
        reproduce("fedsup-table6", tmp_path / "out", 2, [], dataset="fmnist-room", run=False)
    assert not (tmp_path / "out").exists()


SEEDS = [0, 1, 2]
# Per seed 0, 1, 2: FedSEAL's mean 0.85, sample std 0.01; FedMatch's gain over Server-SL
# (+0.01) is within twice the larger std (0.02), FedSEAL's (+0.05) is not.
SEED_ACCS = {
    "Server-SL": [0.80, 0.80, 0.80],
    "FedAvg-SL": [0.86, 0.87, 0.88],
    "FedAvg-FixMatch": [0.79, 0.79, 0.79],
    "FedAvg-UDA": [0.78, 0.78, 0.78],
    "FedSEAL": [0.84, 0.85, 0.86],
    "FedMatch": [0.80, 0.81, 0.82],
}


def write_seed_cells(out, accs: dict[str, list[float]], seeds: list[int], rounds: int = 12):
    """A results.json per seed of every fedseal-table1 cell, made with that seed's config."""
    table = TABLES["fedseal-table1"]
    for column, overrides in table.columns.items():
        for row in table.rows:
            for seed in seeds:
                folder = cell_dir(out, row, column) / f"seed{seed}"
                folder.mkdir(parents=True)
                cfg = resolve_experiment(row.experiment, None, None, [*overrides, f"seed={seed}"])
                res = fake_results(accs[row.label][seed], rounds, cfg)
                (folder / "results.json").write_text(json.dumps(res))


def test_seeds_table_shows_mean_std_last10_and_ties(tmp_path, monkeypatch):
    write_seed_cells(tmp_path, SEED_ACCS, SEEDS)
    monkeypatch.setattr(ssfl.cells, "run_simulation", pytest.fail)
    plotted = []
    monkeypatch.setattr(ssfl.reproduce, "plot_curves", lambda runs, *a, **k: plotted.extend(runs))
    text = reproduce("fedseal-table1", tmp_path, None, [], seeds=SEEDS)
    assert len(plotted) == 36 and "FedSEAL (IID) seed 1" in {r["name"] for r in plotted}
    assert "| FedSEAL | 0.8500 ± 0.0100 | 0.8418 | 0.8500 ± 0.0100 | 0.8428 |" in text
    assert "| Server-SL | 0.8000 ± 0.0000 | 0.7971 | 0.8000 ± 0.0000 | 0.8025 |" in text
    assert "| FedSEAL - Server-SL | +0.0500 | +0.0447 | +0.0500 | +0.0403 |" in text
    assert "| FedMatch - Server-SL | +0.0100 (tie) | - | +0.0100 (tie) | - |" in text
    # fake_results: round r has acc - 0.01 * (12 - r); rounds 3..12 average acc - 0.045.
    assert "| test accuracy, mean of the last 10 rounds | Non-IID ours | IID ours |" in text
    assert "| FedSEAL | 0.8050 ± 0.0100 | 0.8050 ± 0.0100 |" in text
    assert "Seeds 0, 1, 2 (n = 3); ± is the sample std over seeds;" in text
    summary = json.loads((tmp_path / "seeds.json").read_text())
    assert summary["seeds"] == SEEDS and summary["metric"] == "final_test_accuracy"
    assert len(summary["cells"]) == 12
    cell = next(c for c in summary["cells"] if (c["row"], c["column"]) == ("FedSEAL", "IID"))
    assert cell["values"] == [0.84, 0.85, 0.86] and cell["n"] == 3
    assert cell["mean"] == pytest.approx(0.85) and cell["std"] == pytest.approx(0.01)
    assert cell["last10_mean"] == pytest.approx(0.805)
    assert cell["last10_std"] == pytest.approx(0.01)


def test_last10_skips_rounds_without_the_key():
    from ssfl.reproduce import last10

    rows = [{"round": r, "test_accuracy": 0.0} for r in range(1, 21)]
    for r in (12, 16, 20):  # every 4th round records the protocol accuracy
        rows[r - 1]["finetune_accuracy"] = r / 100
    assert last10("final_finetune_accuracy")({"rounds": rows}) == pytest.approx(0.16)
    assert last10("final_linear_accuracy")({"rounds": rows}) is None


def test_missing_seeds_run_with_the_seed_in_their_config(tmp_path, monkeypatch):
    write_seed_cells(tmp_path, SEED_ACCS, [0, 1])
    monkeypatch.setattr(ssfl.cells, "run_simulation", pytest.fail)
    text = reproduce("fedseal-table1", tmp_path, None, [], run=False, seeds=SEEDS)
    assert "| FedSEAL | 0.8450 ± 0.0071 (n = 2) | 0.8418 |" in text
    ran = []

    def fake_run(settings, out, stream, resume=False):
        cfg = mapping(settings)
        ran.append((cfg["seed"], out.parent.name, out.name))
        return fake_results(0.9, 12, cfg)

    monkeypatch.setattr(ssfl.cells, "run_simulation", fake_run)
    monkeypatch.setattr(ssfl.reproduce, "check_data", lambda cfg: cfg)
    text = reproduce("fedseal-table1", tmp_path, None, [], seeds=SEEDS)
    assert len(ran) == 12  # seed 2 of every cell; seeds 0 and 1 are reused
    assert {(seed, name) for seed, _, name in ran} == {(2, "seed2")}
    table = TABLES["fedseal-table1"]
    cells = {cell_dir(tmp_path, r, c).name for r in table.rows for c in table.columns}
    assert {parent for _, parent, _ in ran} == cells
    # FedSEAL IID: 0.84, 0.85, 0.90 -> mean 0.8633, sample std 0.0321.
    assert "| FedSEAL | 0.8633 ± 0.0321 | 0.8418 | 0.8633 ± 0.0321 | 0.8428 |" in text


def test_seeds_gap_closed_uses_means_and_marks_ties():
    from ssfl.reproduce import markdown

    accs = {"Centralized": 0.70, "Fully Supervised": 0.90, "FixMatch": 0.72, "FedSup": 0.80}
    spread = {"FixMatch": [-0.02, 0.0, 0.02]}  # std 0.02: its +0.02 over Centralized ties
    results = {}
    for label, acc in accs.items():
        for column in TABLES["fedsup-table6"].columns:
            runs = {}
            for seed, delta in zip(SEEDS, spread.get(label, [0.0] * 3)):
                runs[seed] = {**fake_results(acc + delta), "final_finetune_accuracy": acc + delta}
            results[(label, column)] = runs
    text = markdown(TABLES["fedsup-table6"], results, SEEDS)
    assert "| FixMatch | 10% (tie) | 13% | 10% (tie) | 13% |" in text
    assert "| FedSup | 50% | 56% | 50% | 58% |" in text
    assert "| SimCLR | not run | 20% | not run | 22% |" in text


def test_rows_and_columns_run_the_picked_cells_and_table_the_finished_others(tmp_path, monkeypatch):
    write_seed_cells(tmp_path, SEED_ACCS, [0])
    ran = []

    def fake_run(settings, out, stream, resume=False):
        cfg = mapping(settings)
        ran.append((out.parent.name, cfg["seed"]))
        return fake_results(0.9, 12, cfg)

    monkeypatch.setattr(ssfl.cells, "run_simulation", fake_run)
    monkeypatch.setattr(ssfl.reproduce, "check_data", lambda cfg: cfg)
    pick = Pick(rows=("Server-SL", "FedSEAL"), columns=("IID",))
    text = reproduce("fedseal-table1", tmp_path, None, [], seeds=SEEDS, pick=pick)
    assert sorted(ran) == [
        (folder, seed) for folder in ("fedseal-iid", "server_sl-iid") for seed in (1, 2)
    ]
    # Picked: three seeds; the others keep their one finished seed.
    assert "| FedSEAL | 0.8400 ± 0.0000 (n = 1) | 0.8418 | 0.8800 ± 0.0346 | 0.8428 |" in text


def test_jobs_hand_every_cell_to_run_to_the_runner_at_once_and_table_them_in_order(
    tmp_path, monkeypatch
):
    """--jobs: every folder and data is checked, then the cells to run go to run_cells in
    one list (which runs N at once); each result lands in its own cell and seed."""
    write_seed_cells(tmp_path, SEED_ACCS, [0])
    handed = []

    def fake_cells(cells, jobs):
        handed.append(([(c.out.parent.name, c.settings.seed, c.label) for c in cells], jobs))
        return [fake_results(0.5 + c.settings.seed / 10, 12, mapping(c.settings)) for c in cells]

    monkeypatch.setattr(ssfl.reproduce, "run_cells", fake_cells)
    monkeypatch.setattr(ssfl.reproduce, "check_data", lambda cfg: cfg)
    pick = Pick(rows=("FedSEAL",), columns=("IID",))
    text = reproduce("fedseal-table1", tmp_path, None, [], seeds=SEEDS, pick=pick, jobs=3)
    assert handed == [([("fedseal-iid", 1, "FedSEAL"), ("fedseal-iid", 2, "FedSEAL")], 3)]
    # FedSEAL IID: 0.84 (finished), 0.6, 0.7 -> mean 0.7133, sample std 0.1206.
    assert "| FedSEAL | 0.8400 ± 0.0000 (n = 1) | 0.8418 | 0.7133 ± 0.1206 | 0.8428 |" in text


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--rows", "FedSEAL,Nope"], "--rows: 'Nope' is not one of the table's (Server-SL, "),
        (["--columns", "iid"], "--columns: 'iid' is not one of the table's (Non-IID, IID)"),
    ],
)
def test_unknown_rows_or_columns_exit_2_with_one_line(tmp_path, monkeypatch, capsys, argv, message):
    from ssfl.cli import main

    monkeypatch.setattr(ssfl.cells, "run_simulation", pytest.fail)
    assert main(["reproduce", "fedseal-table1", "--out", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ssfl: error: {message}") and err.count("\n") == 1


@pytest.mark.parametrize("seeds", ["0,x", "", "1,1"])
def test_bad_seeds_exit_2_with_one_line(tmp_path, monkeypatch, capsys, seeds):
    from ssfl.cli import main

    monkeypatch.setattr(ssfl.cells, "run_simulation", pytest.fail)
    argv = ["reproduce", "fedseal-table1", "--out", str(tmp_path), "--seeds", seeds]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("ssfl: error: --seeds") and err.count("\n") == 1


def test_ssfl_fig2_runs_every_variant_per_seed_and_judges_gains_over_self_training(
    tmp_path, monkeypatch
):
    # Per seed 0, 1, 2: the FedAvg solution's gain over self-training (+0.10) is outside
    # twice the larger std (0.02); grouping's (+0.01) is within it.
    accs = {
        "ssfl_fmnist_server_sl": [0.80, 0.80, 0.80],
        "selftrain_bn": [0.60, 0.60, 0.60],
        "crl_bn": [0.65, 0.65, 0.65],
        "crl_gn": [0.69, 0.70, 0.71],
        "grouping_gn": [0.59, 0.61, 0.63],
    }
    ran = []

    def fake_run(settings, out, stream, resume=False):
        cfg = mapping(settings)
        ran.append((cfg["name"], cfg["seed"], out.parent.name))
        return fake_results(accs[cfg["name"]][cfg["seed"]], 12, cfg)

    monkeypatch.setattr(ssfl.cells, "run_simulation", fake_run)
    monkeypatch.setattr(ssfl.reproduce, "check_data", lambda cfg: cfg)
    text = reproduce("ssfl-fig2", tmp_path, None, [], dataset="fmnist", seeds=SEEDS)
    assert len(ran) == 15 and {seed for _, seed, _ in ran} == set(SEEDS)
    assert {folder for _, _, folder in ran} == {
        "server_sl-noniid",
        "traditional_self_training-noniid",
        "fedavg_solution_bn-noniid",
        "fedavg_solution-noniid",
        "grouping_based_solution-noniid",
    }
    assert "| FedAvg solution | 0.7000 ± 0.0100 | 0.9283 |" in text
    assert "| Server-SL | 0.8000 ± 0.0000 | - |" in text
    assert "| FedAvg solution - Traditional self-training | +0.1000 | +0.4073 |" in text
    grouping = "| Grouping-based solution - Traditional self-training | +0.0100 (tie) | +0.4128 |"
    assert grouping in text
    assert "| Server-SL - Traditional self-training | +0.2000 | - |" in text


def test_ssfl_table2_compares_one_and_three_groups_that_differ_in_s_only(tmp_path, monkeypatch):
    # Per seed 0, 1, 2: S = 3 gains +0.05 over S = 1, outside twice the larger std (0.01).
    accs = {"grouping_s1_k30": [0.70, 0.70, 0.70], "grouping_s3_k30": [0.74, 0.75, 0.76]}
    ran = {}

    def fake_run(settings, out, stream, resume=False):
        cfg = mapping(settings)
        ran[(cfg["name"], cfg["seed"])] = cfg
        return fake_results(accs[cfg["name"]][cfg["seed"]], 40, cfg)

    monkeypatch.setattr(ssfl.cells, "run_simulation", fake_run)
    monkeypatch.setattr(ssfl.reproduce, "check_data", lambda cfg: cfg)
    text = reproduce("ssfl-table2", tmp_path, None, [], seeds=SEEDS)
    assert len(ran) == 6
    one, three = ran[("grouping_s1_k30", 0)], ran[("grouping_s3_k30", 0)]
    assert (one["algo"]["groups"], three["algo"]["groups"]) == (1, 3)
    for cfg in (one, three):
        assert cfg["method"] == "fedrgd" and cfg["split"]["num_clients"] == 30
        assert cfg["federation"]["clients_per_round"] == 0  # C_k = K
        assert cfg["client"]["lr"] == 0.003 and cfg["server"]["lr"] == 0.03
    same = {k: v for k, v in one.items() if k not in ("name", "algo")}
    assert same == {k: v for k, v in three.items() if k not in ("name", "algo")}
    assert {**one["algo"], "groups": 3} == three["algo"]
    assert "| Grouping-based (S = 3) - FedAvg (S = 1) | +0.0500 | +0.1079 |" in text


def test_ssfl_fig2_long_runs_the_long_files_with_the_papers_participation(tmp_path, monkeypatch):
    ran = {}

    def fake_run(settings, out, stream, resume=False):
        cfg = mapping(settings)
        ran[cfg["name"]] = cfg
        return fake_results(0.5, 3, cfg)

    monkeypatch.setattr(ssfl.cells, "run_simulation", fake_run)
    monkeypatch.setattr(ssfl.reproduce, "check_data", lambda cfg: cfg)
    reproduce("ssfl-fig2", tmp_path, None, [], dataset="fmnist-long")
    assert sorted(ran) == [
        "crl_bn_long",
        "crl_gn_long",
        "grouping_gn_long",
        "selftrain_bn_long",
        "ssfl_fmnist_server_sl_long",
    ]
    for name, cfg in ran.items():
        assert cfg["rounds"] == 160
        assert (cfg["split"]["num_clients"], cfg["federation"]["clients_per_round"]) == (50, 10)
        if name != "ssfl_fmnist_server_sl_long":  # no users' models to average
            assert cfg["federation"]["average"] == "parameters"


def test_the_table_says_which_commits_days_and_machines_made_its_cells():
    from ssfl.reproduce import markdown

    xeon = {"cpu": "Intel Xeon", "cpu_capability": "AVX512", "threads": 2}
    made = {
        "FedSEAL": ("0123456789ab", 1795824000.0, xeon),  # 2026-11-28 00:00 UTC
        "Server-SL": ("0123456789ab", 1795824000.0 - 3600, xeon),  # 2026-11-27 23:00 UTC
        "FedMatch": ("0123456789ab+dirty", 1795824000.0 + 7200, {**xeon, "cpu": "AMD EPYC"}),
    }
    results = {
        (label, "IID"): {
            None: {
                **fake_results(0.8),
                "code_version": commit,
                "timeline": {"finished": finished},
                "host": host,
            }
        }
        for label, (commit, finished, host) in made.items()
    }
    results[("FedAvg-SL", "IID")] = {None: fake_results(0.9)}  # a cell from before the record
    text = markdown(TABLES["fedseal-table1"], results)
    assert text.splitlines()[-1] == (
        "Cells: commit 0123456789ab (2 cells), 0123456789ab+dirty (1 cell), not recorded "
        "(1 cell); finished 2026-11-27 to 2026-11-28; Intel Xeon (AVX512, 2 threads) (2 cells), "
        "AMD EPYC (AVX512, 2 threads) (1 cell), not recorded (1 cell)."
    )
    assert markdown(TABLES["fedseal-table1"], {}).splitlines()[-1].startswith("FedMatch is not")


def test_the_dp_table_runs_each_rows_own_privacy_setting(tmp_path, monkeypatch):
    """Rows of one experiment file differ by their own overrides (the noise multiplier per
    epsilon, no DP); Server-SL's row has none; --set still comes last."""
    ran = {}

    def fake_run(settings, out, stream, resume=False):
        cfg = mapping(settings)
        ran[out.parent.name] = cfg
        return fake_results(0.5, 3, cfg)

    monkeypatch.setattr(ssfl.cells, "run_simulation", fake_run)
    monkeypatch.setattr(ssfl.reproduce, "check_data", lambda cfg: cfg)
    pick = Pick(rows=("Server-SL", "FedSEAL without DP", "FedSEAL at epsilon 4"))
    text = reproduce("dp-fmnist", tmp_path, 2, ["privacy.clipping_norm=2.0"], seeds=[0], pick=pick)
    privacy = {name: cfg["privacy"] for name, cfg in ran.items()}
    assert privacy["fedseal_without_dp-fashionmnist"]["mode"] == "none"
    at4 = privacy["fedseal_at_epsilon_4-fashionmnist"]
    assert (at4["mode"], at4["noise_multiplier"], at4["clipping_norm"]) == (
        "server_fixed",
        1.5,
        2.0,
    )
    assert privacy["server_sl-fashionmnist"]["mode"] == "none"
    assert len(ran) == 3 and "| FedSEAL at epsilon 8 | not run | - |" in text


def test_the_dp_tables_clipping_rows_separate_the_clipping_from_the_noise(
    tmp_path, monkeypatch, capsys
):
    """Clipping only: C = 1.0 and no noise; epsilon 8 (z = 1.0) at C = 0.1 and 0.01."""
    ran = {}

    def fake_run(settings, out, stream, resume=False):
        ran[out.parent.name] = mapping(settings)["privacy"]
        return fake_results(0.5, 3, mapping(settings))

    monkeypatch.setattr(ssfl.cells, "run_simulation", fake_run)
    monkeypatch.setattr(ssfl.reproduce, "check_data", lambda cfg: cfg)
    rows = [r.label for r in TABLES["dp-fmnist"].rows if r.label.startswith("FedSEAL")]
    assert rows == [
        "FedSEAL without DP",
        "FedSEAL at epsilon 8",
        "FedSEAL at epsilon 4",
        "FedSEAL at epsilon 1",
        "FedSEAL clipping only",
        "FedSEAL at epsilon 8 with C = 0.1",
        "FedSEAL at epsilon 8 with C = 0.01",
    ]
    pick = Pick(rows=tuple(rows[4:]))
    reproduce("dp-fmnist", tmp_path, 2, [], seeds=[0], pick=pick)
    got = {name: (p["mode"], p["noise_multiplier"], p["clipping_norm"]) for name, p in ran.items()}
    assert got == {
        "fedseal_clipping_only-fashionmnist": ("server_fixed", 0.0, 1.0),
        "fedseal_at_epsilon_8_with_c0.1-fashionmnist": ("server_fixed", 1.0, 0.1),
        "fedseal_at_epsilon_8_with_c0.01-fashionmnist": ("server_fixed", 1.0, 0.01),
    }
    where = tmp_path / "fedseal_clipping_only-fashionmnist" / "seed0"
    assert capsys.readouterr().err.splitlines()[:2] == [  # each cell: its start and its end
        f"ssfl reproduce: FedSEAL clipping only -> {where}",
        "ssfl reproduce: FedSEAL clipping only: final_test_accuracy 0.5000  "
        f"best_test_accuracy 0.5000  wall_seconds 12.5  -> {where / 'results.json'}",
    ]

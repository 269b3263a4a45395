"""Bad inputs a newcomer tries: each ends in exit 2 and one line saying what to do, before
any process starts; shipped experiments are found from any folder; ``ssfl --version``."""

from __future__ import annotations

import json
from importlib.metadata import version

import pytest

import ssfl.runner
from ssfl.cli import main
from ssfl.experiment import APP_DIR, find_experiment
from tests.conftest import ROOT


@pytest.fixture(autouse=True)
def no_processes(monkeypatch):
    """Any attempt to start the SuperLink fails the test: errors come first."""

    def refuse(self):
        raise AssertionError("a process was started")

    monkeypatch.setattr(ssfl.runner.LocalSuperLink, "launch", refuse)


def one_line_error(capsys, argv: list[str]) -> str:
    """Run the CLI; assert exit 2 and a single stderr line; return that line."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ssfl: error: "), err
    assert "Traceback" not in err
    return err


def test_a_non_utf8_yaml_is_one_line(tmp_path, capsys):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("method: fedseal\nname: caf\xe9\n".encode("latin-1"))
    err = one_line_error(capsys, ["run", str(path)])
    assert "not UTF-8" in err and "0xe9" in err and "save it as UTF-8" in err


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (
            "method: fedseal\nrounds: 1\nseed: 3\nrounds: 2\n",
            "key 'rounds' is given twice (lines 2 and 4)",
        ),
        (
            "method: fedseal\nclient:\n  lr: 0.1\n  lr: 0.2\n",
            "key 'lr' is given twice (lines 3 and 4)",
        ),
    ],
)
def test_a_key_given_twice_is_refused_naming_it_and_both_lines(tmp_path, capsys, text, said):
    """YAML loaders keep the last value silently; the user meant one of them."""
    path = tmp_path / "twice.yaml"
    path.write_text(text)
    assert said in one_line_error(capsys, ["run", str(path)])


def test_an_empty_yaml_must_name_its_method(tmp_path, capsys):
    path = tmp_path / "empty.yaml"
    path.write_text("# nothing yet\n")
    err = one_line_error(capsys, ["run", str(path)])
    assert "must name its method" in err and "fedseal" in err


def test_a_directory_as_the_experiment_lists_its_yamls(capsys):
    err = one_line_error(capsys, ["run", str(ROOT / "experiments" / "fmnist-las")])
    assert "is a folder" in err and "fedseal.yaml" in err and "server_sl.yaml" in err


def test_another_method_names_its_experiment_files(capsys):
    err = one_line_error(
        capsys,
        ["run", "experiments/fmnist-las/fedseal.yaml", "--set", "method=fedavg_fixmatch"],
    )
    assert "algo.theta" in err  # the resolver's own reason stays
    assert "another method means another experiment file" in err
    assert "experiments/fmnist-las/fedavg_fixmatch.yaml" in err
    assert "experiments/fmnist-fedsup/fixmatch.yaml" in err


def write_json(path, text: str):
    path.mkdir()
    (path / "results.json").write_text(text)
    return str(path)


def test_compare_on_corrupt_json_is_one_line(tmp_path, capsys):
    run = write_json(tmp_path / "run", '{"method": "fedseal", "rounds": [')
    err = one_line_error(capsys, ["compare", run, "--plot", str(tmp_path / "c.png")])
    assert "not a readable results.json" in err
    assert not (tmp_path / "c.png").exists()


def test_compare_on_results_without_rounds_is_one_line(tmp_path, capsys):
    run = write_json(tmp_path / "run", json.dumps({"method": "fedseal"}))
    err = one_line_error(capsys, ["compare", run, "--plot", str(tmp_path / "c.png")])
    assert "not an ssfl run's results.json" in err and "rounds" in err


def results(acc: float) -> dict:
    rows = [{"round": 1, "test_accuracy": acc, "test_loss": 0.5, "bytes_c2s": 100}]
    return {
        "method": "fedseal",
        "name": "a",
        "dataset": "synthetic28",
        "split": {},
        "rounds": rows,
        "final_test_accuracy": acc,
        "best_test_accuracy": acc,
        "wall_seconds": 3.0,
    }


def test_compare_with_an_unknown_metric_names_the_known_ones(tmp_path, capsys):
    run = write_json(tmp_path / "run", json.dumps(results(0.5)))
    err = one_line_error(
        capsys, ["compare", run, "--metric", "nosuch", "--plot", str(tmp_path / "c.png")]
    )
    assert "--metric nosuch" in err and "test_accuracy" in err and "test_loss" in err
    assert not (tmp_path / "c.png").exists()


def test_compare_of_a_failed_run_shows_dashes(tmp_path, capsys):
    failed = {**results(0.5), "final_test_accuracy": None, "best_test_accuracy": None}
    run = write_json(tmp_path / "run", json.dumps(failed))
    assert main(["compare", run, "--plot", str(tmp_path / "c.png")]) == 0
    row = capsys.readouterr().out.splitlines()[2]
    assert row.split("|")[7:9] == [" - ", " - "]


def test_evaluate_without_a_run_folder_is_one_line(tmp_path, capsys):
    err = one_line_error(capsys, ["evaluate", str(tmp_path)])
    assert "not a run folder" in err


def test_shipped_experiments_are_found_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    wanted = APP_DIR / "experiments" / "fmnist-las" / "fedseal.yaml"
    assert find_experiment("experiments/fmnist-las/fedseal.yaml") == wanted
    assert find_experiment("fmnist-las/fedseal.yaml") == wanted
    assert find_experiment("fmnist-las/fedseal") == wanted
    assert find_experiment("quickstart") == APP_DIR / "experiments" / "quickstart.yaml"
    own = tmp_path / "experiments" / "fmnist-las" / "fedseal.yaml"
    own.parent.mkdir(parents=True)
    own.write_text("method: fedseal\n")
    assert find_experiment("experiments/fmnist-las/fedseal.yaml").resolve() == own


def test_a_missing_experiment_says_where_it_looked(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    err = one_line_error(capsys, ["run", "nosuch.yaml"])
    assert "not found: nosuch.yaml" in err and str(APP_DIR / "experiments") in err


def test_version_names_ssfl_flower_and_torch(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    out = capsys.readouterr().out.strip()
    assert out == f"ssfl {version('ssfl')}, flwr {version('flwr')}, torch {version('torch')}"


def test_reproduce_finds_its_cells_from_any_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["reproduce", "fedseal-table1", "--out", "table", "--no-run"]) == 0
    assert "| FedSEAL |" in capsys.readouterr().out
    assert (tmp_path / "table" / "table.md").is_file()

"""tasks/metrics.py on hand-made predictions, and benchmarks/calibration.py on a kept checkpoint."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
import torch

from ssfl.experiment import resolve_config
from ssfl.registry import settings_of
from tasks.checkpoint import save_checkpoint
from tasks.metrics import calibration, confident_share, expected_calibration_error, reliability_bins
from tests.conftest import ROOT

# Four predictions over 3 classes: confidences 0.95, 0.6, 0.55, 1.0; labels make the first,
# second and fourth right.
PROBS = torch.tensor([[0.95, 0.03, 0.02], [0.2, 0.6, 0.2], [0.3, 0.15, 0.55], [0.0, 0.0, 1.0]])
LABELS = torch.tensor([0, 1, 0, 2])


def test_reliability_bins_count_confidence_and_accuracy_per_bin():
    rows = reliability_bins(PROBS, LABELS, bins=2)
    assert [r["count"] for r in rows] == [0, 4]  # 0.55 lies in [0.5, 1]
    assert rows[0]["confidence"] == 0.0 and rows[0]["accuracy"] == 0.0
    assert rows[1]["confidence"] == pytest.approx((0.95 + 0.6 + 0.55 + 1.0) / 4)
    assert rows[1]["accuracy"] == pytest.approx(0.75)
    ten = reliability_bins(PROBS, LABELS, bins=10)
    assert [r["count"] for r in ten] == [0, 0, 0, 0, 0, 1, 1, 0, 0, 2]  # 1.0 in the last bin
    assert ten[9]["accuracy"] == 1.0 and ten[5]["accuracy"] == 0.0
    assert sum(r["count"] for r in ten) == len(LABELS)


def test_ece_weights_each_bins_gap_by_its_share():
    ten = reliability_bins(PROBS, LABELS, bins=10)
    # bins: [0.55] wrong, [0.6] right, [0.95, 1.0] right
    expected = (abs(0 - 0.55) + abs(1 - 0.6) + 2 * abs(1 - 0.975)) / 4
    assert expected_calibration_error(ten) == pytest.approx(expected)
    assert expected_calibration_error(reliability_bins(PROBS[:0], LABELS[:0], 10)) == 0.0
    perfect = torch.eye(3)
    assert expected_calibration_error(reliability_bins(perfect, torch.arange(3), 10)) == 0.0


def test_the_confident_share_is_what_a_mask_at_tau_keeps():
    share = confident_share(PROBS, LABELS, threshold=0.95)
    assert share["count"] == 2 and share["rate"] == 0.5 and share["accuracy"] == 1.0
    assert share["kept_per_class"] == [1, 0, 1] and share["right_per_class"] == [1, 0, 1]
    wrong = confident_share(PROBS, torch.tensor([1, 1, 0, 0]), threshold=0.5)
    assert wrong["count"] == 4 and wrong["accuracy"] == pytest.approx(0.25)
    assert wrong["kept_per_class"] == [1, 1, 2] and wrong["right_per_class"] == [0, 1, 0]
    assert confident_share(PROBS, LABELS, threshold=1.01)["accuracy"] == 0.0


def test_calibration_summarises_one_set():
    report = calibration(PROBS, LABELS, threshold=0.9, bins=10)
    assert report["images"] == 4 and report["accuracy"] == 0.75
    assert report["predicted_per_class"] == [1, 1, 2]
    assert report["mean_confidence"] == pytest.approx(0.775)
    assert report["confident"]["count"] == 2 and len(report["bins"]) == 10


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("calibration", ROOT / "benchmarks/calibration.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["calibration"] = module
    spec.loader.exec_module(module)
    return module


def run_script(script, monkeypatch, *args: str) -> None:
    monkeypatch.setattr(sys, "argv", ["calibration.py", *args])
    script.main()


def test_the_script_measures_a_kept_checkpoints_model_and_refuses_another_runs(
    script, synthetic_raw, tmp_path, monkeypatch, capsys
):
    exp = tmp_path / "exp.yaml"
    exp.write_text(json.dumps(synthetic_raw))
    cfg = resolve_config(synthetic_raw)
    dataset_model = script.server_model(settings_of(cfg), None)[0].model
    state = {"round": 3, "config": json.dumps(cfg), "model": dataset_model.state_dict()}
    save_checkpoint(state, tmp_path / "checkpoint-r003.pt")
    out = tmp_path / "out"
    run_script(
        script,
        monkeypatch,
        str(exp),
        "--checkpoint",
        str(tmp_path / "checkpoint-r003.pt"),
        "--out",
        str(out),
    )
    report = json.loads((out / "calibration.json").read_text())
    assert report["model"] == "the global model after round 3"
    assert set(report["sets"]) == set(script.SETS) and (out / "reliability.png").stat().st_size
    users = sum(len(c) for c in script.get_split(settings_of(cfg))[1].clients)
    assert report["sets"]["weak views"]["images"] == users == 3 * 200
    assert report["sets"]["test set"]["images"] == 400
    for name in script.SETS:
        assert (
            sum(r["count"] for r in report["sets"][name]["bins"]) == report["sets"][name]["images"]
        )
    weak, clean = report["sets"]["weak views"], report["sets"]["clean images"]
    assert weak["bins"] != clean["bins"]  # the weak views are augmented
    assert "| test set (400) |" in capsys.readouterr().out
    with pytest.raises(
        SystemExit, match=r"^calibration: --checkpoint: the config differs .* in seed;"
    ):
        run_script(
            script,
            monkeypatch,
            str(exp),
            "--set",
            "seed=5",
            "--checkpoint",
            str(tmp_path / "checkpoint-r003.pt"),
            "--out",
            str(out),
        )
    with pytest.raises(SystemExit, match=r"^calibration: --checkpoint: no checkpoint at"):
        run_script(
            script,
            monkeypatch,
            str(exp),
            "--checkpoint",
            str(tmp_path / "none.pt"),
            "--out",
            str(out),
        )

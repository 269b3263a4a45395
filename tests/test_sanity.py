"""``ssfl sanity``: a method's parts trained centrally, on synthetic 28x28 data."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

import ssfl.sanity
from ssfl.cli import main
from ssfl.sanity import SANITY_METHODS, SanityOptions, labeled_indices, run_sanity

SYNTHETIC = ["dataset.synthetic_train_size=800", "dataset.synthetic_test_size=200", "device=cpu"]
SHORT = SanityOptions(
    steps=40, mu=2, batch_size=16, labels_per_class=10, log_every=20, eval_every=20
)


def test_labeled_indices_take_n_of_every_class_reproducibly():
    labels = torch.arange(200) % 10
    idx = labeled_indices(labels, 5, seed=3)
    assert np.bincount(labels.numpy()[idx], minlength=10).tolist() == [5] * 10
    assert len(set(idx.tolist())) == 50
    assert np.array_equal(idx, labeled_indices(labels, 5, seed=3))


@pytest.mark.slow
def test_fixmatch_parts_learn_and_log_gradient_norms(tmp_path):
    results = run_sanity("fixmatch", "synthetic28", tmp_path, SHORT, SYNTHETIC)
    written = json.loads((tmp_path / "results.json").read_text())
    assert written["final_test_accuracy"] == results["final_test_accuracy"]
    assert [e["step"] for e in written["evals"]] == [20, 40]
    assert [b["step"] for b in written["blocks"]] == [20, 40]
    for block in written["blocks"]:
        assert math.isfinite(block["grad_norm_mean"]) and block["grad_norm_mean"] > 0
        assert block["grad_norm_max"] >= block["grad_norm_mean"]
    assert written["labeled"] == 100 and written["unlabeled"] == 700
    assert results["final_test_accuracy"] > 0.5  # chance is 0.1


def test_a_sanity_run_is_deterministic(tmp_path):
    opts = SanityOptions(steps=6, mu=2, batch_size=8, labels_per_class=5, log_every=3)
    a = run_sanity("fixmatch", "synthetic28", tmp_path / "a", opts, SYNTHETIC)
    b = run_sanity("fixmatch", "synthetic28", tmp_path / "b", opts, SYNTHETIC)
    assert a["blocks"] == b["blocks"] and a["evals"] == b["evals"]


@pytest.mark.parametrize("method", sorted(set(SANITY_METHODS) - {"fixmatch"}))
def test_every_method_runs_its_own_loss(tmp_path, method):
    opts = SanityOptions(steps=4, mu=1, batch_size=8, labels_per_class=5, log_every=2)
    results = run_sanity(method, "synthetic28", tmp_path, opts, SYNTHETIC)
    assert results["method"] == method and len(results["blocks"]) == 2
    assert 0.0 <= results["final_test_accuracy"] <= 1.0


def test_the_cli_writes_results(tmp_path, capsys):
    args = ["sanity", "crl", "--dataset", "synthetic28", "--out", str(tmp_path), "--steps", "2"]
    args += ["--mu", "1", "--batch-size", "8", "--labels-per-class", "5", "--log-every", "1"]
    assert main(args + [a for s in SYNTHETIC for a in ("--set", s)]) == 0
    assert "final_test_accuracy" in capsys.readouterr().out
    assert (tmp_path / "results.json").exists()
    bad = ["sanity", "crl", "--dataset", "synthetic28", "--out", str(tmp_path), "--steps", "0"]
    assert main(bad) == 2


def forward_log(monkeypatch) -> list[tuple[bool, bool, int]]:
    """(train mode, gradient on, batch size) of every forward of the sanity's model."""
    calls: list[tuple[bool, bool, int]] = []
    build = ssfl.sanity.model_for

    def logged(*args, **kwargs):
        model = build(*args, **kwargs)
        model.register_forward_hook(
            lambda m, x, y: calls.append((m.training, torch.is_grad_enabled(), len(x[0])))
        )
        return model

    monkeypatch.setattr(ssfl.sanity, "model_for", logged)
    return calls


@pytest.mark.parametrize("labels", ["eval", "train"])
def test_selftrain_reads_its_labels_off_the_pass_its_users_do(tmp_path, monkeypatch, labels):
    calls = forward_log(monkeypatch)
    opts = SanityOptions(steps=3, mu=2, batch_size=8, labels_per_class=5, log_every=3)
    sets = [*SYNTHETIC, f"algo.selftrain_labels={labels}"]
    run_sanity("selftrain", "synthetic28", tmp_path, opts, sets)
    step = [(True, True, 8 + 2 * 16)]  # labeled B + weak and strong views of mu * B
    label_pass = [(False, False, 16)] if labels == "eval" else []
    assert calls == (label_pass + step) * 3 + [(False, False, 200)]  # the test set last

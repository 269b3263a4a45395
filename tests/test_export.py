"""OUT/model.pt: plain names, the config to rebuild it, the README's loading lines, and
``ssfl evaluate`` giving back the accuracy the run recorded."""

from __future__ import annotations

import re

import pytest
import torch
import yaml

from ssfl.cli import main
from ssfl.experiment import resolve_config
from ssfl.registry import settings_of
from strategies.parts import ServerSide
from strategies.parts import TestAccuracy as Accuracy
from tasks.decompose import Decomposed
from tasks.export import MODEL_FILE, load_model, plain_state, read_model_file, save_model
from tasks.models import model_for
from tasks.partition import get_split
from tasks.settings import ModelSettings
from tests.conftest import ROOT


@pytest.fixture
def tiny_run(tmp_path, synthetic_raw):
    """A run folder as a run leaves it: config.yaml and model.pt of a model whose recorded
    test accuracy is its accuracy on the run's test split."""
    cfg = resolve_config({**synthetic_raw, "method": "fedseal"})
    data, split = get_split(settings_of(cfg))
    server = ServerSide.build(settings_of(cfg), data, split, torch.device("cpu"))
    with torch.no_grad():
        for p in server.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    acc = Accuracy(server).evaluate(server.model)["test_accuracy"]
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    save_model(
        server.model, settings_of(cfg), data, [{"round": 2, "test_accuracy": acc}], out / MODEL_FILE
    )
    return out, server, acc


def test_model_file_has_plain_names_and_what_rebuilds_it(tiny_run):
    out, server, acc = tiny_run
    record = read_model_file(out / MODEL_FILE)
    assert set(record["state_dict"]) == set(server.model[1].state_dict())
    assert not any(k.startswith(("0.", "1.")) for k in record["state_dict"])
    assert record["model"]["name"] == "small_cnn" and record["dataset"] == "synthetic28"
    assert (record["num_classes"], record["channels"], record["image_size"]) == (10, 1, 28)
    assert record["round"] == 2 and record["test_accuracy"] == acc
    loaded = load_model(out)
    for key, value in server.model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value)
    assert not loaded.training


def test_fedmatch_decomposed_model_is_kept_as_theta(tmp_path, synthetic_raw):
    cfg = resolve_config({**synthetic_raw, "method": "fedmatch"})
    data, _ = get_split(settings_of(cfg))
    net = model_for(ModelSettings(**cfg["model"]), data)
    wrapped = Decomposed(net, psi_factor=0.2)
    state = plain_state(wrapped)
    theta = wrapped.theta()
    assert torch.equal(state["features.0.weight"], theta["1.features.0.weight"])
    save_model(wrapped, settings_of(cfg), data, [], tmp_path / MODEL_FILE)
    x = torch.rand(4, 1, 28, 28)
    wrapped.eval()
    assert torch.allclose(load_model(tmp_path / MODEL_FILE)(x), wrapped(x))


def readme_snippet() -> str:
    """The Python block after the README's 'Load the model' marker."""
    text = (ROOT / "README.md").read_text()
    match = re.search(r"<!-- load-model -->\s*```python\n(.*?)```", text, re.S)
    assert match, "README.md has no load-model snippet"
    return match.group(1)


def test_the_readmes_loading_lines_work(tiny_run, monkeypatch):
    out, server, _ = tiny_run
    snippet = readme_snippet()
    assert len(snippet.strip().splitlines()) == 3
    folder = out.parent / "runs" / "quickstart"
    folder.mkdir(parents=True)
    (folder / MODEL_FILE).write_bytes((out / MODEL_FILE).read_bytes())
    monkeypatch.chdir(out.parent)
    images = server.test_x[:8].cpu()
    scope = {"images": images}
    exec(snippet, scope)
    server.model.eval()
    assert torch.equal(scope["predicted"], server.model(images).argmax(1))


def test_evaluate_gives_back_the_recorded_accuracy(tiny_run, capsys):
    out, _, acc = tiny_run
    assert main(["evaluate", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == f"test_accuracy={acc:.4f}"
    assert any(line.startswith("test_loss=") for line in lines)


def test_evaluate_on_the_validation_images(tiny_run, capsys):
    out, _, _ = tiny_run
    assert main(["evaluate", str(out), "--split", "val"]) == 0
    captured = capsys.readouterr()
    assert re.fullmatch(r"val_accuracy=0\.\d{4}", captured.out.splitlines()[-1])
    assert "on 50 val images" in captured.err


def test_evaluate_refuses_a_dataset_of_another_image_format(tiny_run, capsys):
    out, _, _ = tiny_run
    assert main(["evaluate", str(out), "--dataset", "synthetic32"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "3x32x32 images" in err and "1x28x28" in err


def test_evaluate_refuses_an_unknown_split(tiny_run, capsys):
    out, _, _ = tiny_run
    assert main(["evaluate", str(out), "--split", "train"]) == 2
    assert "test, val, labeled" in capsys.readouterr().err

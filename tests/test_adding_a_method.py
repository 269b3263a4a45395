"""docs/adding-a-method.md kept true: a method written here, in one module, is added with
one registry line and nothing else: its keys are checked from its one declaration, it runs
a round, and the generated reference lists it.

The module holds what the page says a method's own files hold: a settings class and a
client half (client_app/<method>.py), a server half (strategies/<method>.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from client_app.base import ClientHalf
from ssfl import reference
from ssfl.experiment import resolve_config
from ssfl.registry import METHODS, Method, settings_of
from strategies.loop import ServerHalf
from tasks.augment import grouped_views
from tasks.config import ConfigError
from tasks.settings import UNIT, RandAugmentSettings, Settings, setting
from tasks.train import running_sum, set_lr
from tests.harness import InProcessGrid, run_method, tiny_raw

HERE = "tests.test_adding_a_method"


# ----- client_app/toy.py ---------------------------------------------------------------
@dataclass(frozen=True)
class ToySettings(RandAugmentSettings):
    threshold: float = setting(0.8, "confidence a pseudo-label needs", rule=UNIT, ref="toy eq. 1")


class ToyClient(ClientHalf):
    """Cross-entropy of the strong view on the weak view's confident labels."""

    def train(self) -> dict[str, float]:
        weak, strong = self.augmenters()
        opt, total, steps, kept = self.optimizer(), running_sum(self.device), 0, 0.0
        self.model.train()
        for _, (w, s) in grouped_views(self.data.x, self.round_batches(), (weak, strong)):
            logits_w, logits_s = self.model(torch.cat([w, s])).chunk(2)
            conf, labels = logits_w.detach().softmax(1).max(1)
            mask = (conf >= self.algo.threshold).float()
            loss = (F.cross_entropy(logits_s, labels, reduction="none") * mask).mean()
            set_lr(opt, self.lr_at(steps, self.round_steps()))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total, steps, kept = (
                total + loss.detach().double(),
                steps + 1,
                kept + float(mask.mean()),
            )
        return {"train_loss": float(total) / max(steps, 1), "mask_rate": kept / max(steps, 1)}


# ----- strategies/toy.py ---------------------------------------------------------------
class Toy(ServerHalf):
    @classmethod
    def defaults(cls) -> dict[str, Any]:
        return {"server": {"bootstrap_epochs": 1, "epochs": 1}}

    @classmethod
    def check_config(cls, settings: Settings) -> None:
        if settings.split.val_size == 0:
            raise ConfigError("config key 'split.val_size': toy needs a validation set")


# ----- ssfl/registry.py: the one line ------------------------------------------------
LINE = Method(f"{HERE}:Toy", f"{HERE}:ToyClient", f"{HERE}:ToySettings")


@pytest.fixture(autouse=True)
def registered(monkeypatch) -> None:
    monkeypatch.setitem(METHODS, "toy", LINE)


def toy_raw(**algo: Any) -> dict:
    raw = tiny_raw("toy")
    raw["rounds"] = 1
    raw["algo"] = algo
    return raw


def test_its_keys_are_typed_defaulted_and_checked_from_the_one_declaration():
    cfg = resolve_config(toy_raw())
    assert cfg["algo"] == {"randaugment_n": 2, "randaugment_m": 10.0, "threshold": 0.8}
    assert cfg["server"]["bootstrap_epochs"] == 1
    assert settings_of(cfg).algo == ToySettings(threshold=0.8)
    refusals = {
        "config key 'algo.threshold': must be in [0, 1], got 2": toy_raw(threshold=2),
        "config key 'algo.threshold': expected float, got 'high'": toy_raw(threshold="high"),
        "unknown config key 'algo.other' (allowed under 'algo.': randaugment_m, randaugment_n, "
        "threshold)": toy_raw(other=1),
        "config key 'split.val_size': toy needs a validation set": {
            **toy_raw(),
            "split": {**toy_raw()["split"], "val_size": 0},
        },
    }
    for message, raw in refusals.items():
        with pytest.raises(ConfigError) as caught:
            resolve_config(raw)
        assert str(caught.value) == message


def test_it_runs_a_round_and_its_metrics_reach_the_row():
    rows, strategy = run_method(toy_raw(threshold=0.0), InProcessGrid(3))
    assert len(rows) == 1 and rows[0]["clients"] == 2 and rows[0]["failures"] == 0
    assert rows[0]["mask_rate"] == pytest.approx(1.0)  # threshold 0 keeps every sample
    assert 0.0 <= rows[0]["test_accuracy"] <= 1.0 and rows[0]["server_steps"] > 0
    assert isinstance(strategy.server.settings.algo, ToySettings)


def test_the_generated_reference_lists_it_with_its_keys():
    block = reference.block()
    assert f"#### `toy` (`{HERE}:ToySettings`)" in block
    assert (
        "| `algo.threshold` | `0.8` | in [0, 1] | confidence a pseudo-label needs [toy eq. 1] |"
        in block
    )
    assert "| `toy` | `tests.test_adding_a_method:Toy` | `server.bootstrap_epochs` `1`" in block

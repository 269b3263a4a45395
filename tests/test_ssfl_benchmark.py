"""The SSFL benchmark / FedRGD (Zhang, Yao et al. 2020): equations on hand-made tensors,
T counted in steps, the grouping, the R partitioner on the real Fashion-MNIST split."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import types

import numpy as np
import pytest
import torch

from client_app.base import MOMENTUM_KEY
from client_app.pseudo_label import PseudoLabelClient
from ssfl.experiment import resolve_config, resolve_experiment
from ssfl.registry import settings_of
from tasks import aggregate
from tasks.aggregate import assign_groups, average_with_server, group_average, weight_diversity
from tasks.checkpoint import save_checkpoint
from tasks.config import ConfigError
from tasks.losses import DistributionAligner, crl_loss, selftrain_loss
from tasks.models import build_model, classifier_keys
from tasks.partition import get_split, remaining_class_counts
from tasks.settings import ClientSettings, LrScheduleSettings
from tasks.train import cosine_warmup_lr, multistep_lr, scheduled_lr, step_batches
from tests.conftest import ROOT
from tests.harness import InProcessGrid, build_strategy, run_method

# Sample 0 is confident (p = e^3 / (e^3 + 2) = 0.909 >= 0.9), sample 1 is not.
WEAK = torch.tensor([[3.0, 0.0, 0.0], [1.0, 0.5, 0.0]])
STRONG = torch.tensor([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0]])


def test_selftrain_loss_eq3_on_the_same_view():
    loss, mask = selftrain_loss(WEAK, threshold=0.9)
    assert mask.tolist() == [1.0, 0.0]
    ce = -math.log(math.exp(3) / (math.exp(3) + 2))  # CE of sample 0 against its own argmax
    assert float(loss) == pytest.approx(ce / 2, rel=1e-6)  # 1/N_k over the whole batch


def test_crl_loss_eq6_pseudo_label_weak_prediction_strong():
    loss, mask = crl_loss(WEAK, STRONG, threshold=0.9)
    assert mask.tolist() == [1.0, 0.0]
    ce = -math.log(math.e / (math.e + 2))  # strong view of sample 0 against label 0
    assert float(loss) == pytest.approx(ce / 2, rel=1e-6)
    assert float(crl_loss(WEAK, STRONG, threshold=0.95)[0]) == 0.0  # tau = 0.95 keeps nothing


def test_average_with_server_eq4():
    server = {"w": np.array([1.0, 1.0], dtype=np.float32)}
    users = [{"w": np.array([3.0, 3.0], dtype=np.float32)}, {"w": np.array([5.0, 8.0])}]
    assert average_with_server(server, users)["w"].tolist() == [3.0, 4.0]  # (1+3+5)/3, (1+3+8)/3


def test_server_weight_scales_the_servers_share():
    server = {"w": np.array([0.0, 10.0])}
    users = [{"w": np.array([10.0, 0.0])}, {"w": np.array([4.0, 0.0])}]
    # a = 2: (2 w_s + w_1 + w_2) / 4; a = 1 is eq. 4's (w_s + w_1 + w_2) / 3
    assert average_with_server(server, users, 2.0)["w"].tolist() == [3.5, 5.0]
    assert (
        average_with_server(server, users, 1.0)["w"].tolist()
        == average_with_server(server, users)["w"].tolist()
    )
    per_group, _ = group_average(server, {0: users[0], 1: users[1]}, [[0], [1]], 3.0)
    assert [g["w"].tolist() for g in per_group] == [[2.5, 7.5], [1.0, 7.5]]  # (3 w_s + w_k) / 4


def test_group_average_eq7_hand_made():
    server = {"w": np.array([0.0, 6.0])}
    users = {k: {"w": np.array(w)} for k, w in enumerate([[6.0, 0.0], [3.0, 3.0], [9.0, 0.0]])}
    per_group, overall = group_average(server, users, [[0], [1, 2]])
    assert per_group[0]["w"].tolist() == [3.0, 3.0]  # (w_s + w_0) / 2
    assert per_group[1]["w"].tolist() == [4.0, 3.0]  # (w_s + w_1 + w_2) / 3
    assert overall["w"].tolist() == [3.5, 3.0]  # mean of the group averages


def test_the_server_joins_every_group():
    server = {"w": np.ones(3)}
    users = {k: {"w": np.zeros(3)} for k in range(5)}
    per_group, _ = group_average(server, users, [[0, 1], [2, 3, 4]])
    assert [float(g["w"][0]) for g in per_group] == [pytest.approx(1 / 3), pytest.approx(1 / 4)]


@pytest.mark.parametrize("ids, s, sizes", [(range(10), 2, [5, 5]), (range(10), 3, [4, 3, 3])])
def test_every_user_in_exactly_one_group(ids, s, sizes):
    groups = assign_groups(list(ids), s, np.random.default_rng(0))
    assert [len(g) for g in groups] == sizes
    flat = [k for g in groups for k in g]
    assert sorted(flat) == list(ids)  # each user once
    assert groups == assign_groups(list(ids), s, np.random.default_rng(0))
    assert len(assign_groups([4, 7], 5, np.random.default_rng(0))) == 2  # no empty group


def test_weight_diversity_eq8_hand_made():
    assert weight_diversity([np.array([1.0, 0.0]), np.array([0.0, 1.0])]) == pytest.approx(1.0)
    same = np.array([1.0, 2.0])
    assert weight_diversity([same, same]) == pytest.approx(0.5)  # 1/n for equal updates
    # ||u1||^2 + ||u2||^2 = 25 + 1; ||u1 + u2||^2 = ||(3, 5)||^2 = 34
    assert weight_diversity([np.array([3.0, 4.0]), np.array([0.0, 1.0])]) == pytest.approx(26 / 34)
    assert weight_diversity([same, -same]) == math.inf


def test_classifier_keys_name_the_last_linear_layer():
    small = build_model("small_cnn", 1, 10, 28, "gn", (0.5,), (0.25,))
    assert classifier_keys(small) == ["1.classifier.3.weight", "1.classifier.3.bias"]
    resnet9 = build_model("resnet9", 3, 10, 32, "none", (0.5,) * 3, (0.25,) * 3)
    assert classifier_keys(resnet9) == ["1.classifier.weight"]


def test_cosine_warmup_lr_eq9():
    kw = {"base_lr": 0.1, "total_steps": 100, "warmup_steps": 10, "cycles": 0.5, "floor": 0.01}
    assert cosine_warmup_lr(0, **kw) == pytest.approx(0.01)  # linear warm-up, (t + 1) / eM/B
    assert cosine_warmup_lr(9, **kw) == pytest.approx(0.1)
    assert cosine_warmup_lr(10, **kw) == pytest.approx(0.1)
    assert cosine_warmup_lr(55, **kw) == pytest.approx(0.1 * math.cos(math.pi / 4))  # half way
    assert cosine_warmup_lr(100, **{**kw, "cycles": 1.0}) == pytest.approx(0.001)  # eps floor
    assert cosine_warmup_lr(0, **{**kw, "warmup_steps": 0}) == pytest.approx(0.1)  # e = 0


def test_scheduled_lr_counts_global_steps():
    half = ClientSettings(lr=0.1, lr_decay=0.5, batch_size=64)
    sched = LrScheduleSettings(name="exponential")
    assert scheduled_lr(half, sched, 10, 3, 5, 16) == pytest.approx(0.025)
    sched = LrScheduleSettings("cosine", 0.0, 0.0, 65536, cycles=1.0, floor=0.0)
    # 10 rounds of 16 steps: round 6, step 0 is t = 80 of 160 -> cos(pi / 2) = 0
    assert scheduled_lr(half, sched, 10, 6, 0, 16) == pytest.approx(0.0, abs=1e-12)
    assert scheduled_lr(half, sched, 10, 3, 8, 16) == pytest.approx(0.1 * math.cos(math.pi * 0.25))
    # E = 2 epochs of M / B = 65536 / 64 = 1024 steps: t = 1024 is half way
    sched = dataclasses.replace(sched, epochs=2.0)
    assert scheduled_lr(half, sched, 1000, 65, 0, 16) == pytest.approx(0.0, abs=1e-12)
    assert scheduled_lr(half, sched, 1000, 0, 3, 16) == 0.1  # round 0: the bootstrap


def test_multistep_lr_drops_tenfold_at_70_and_90_percent_of_the_rounds():
    # 40 rounds as the FedoSSL code (200 epochs, milestones 140 and 180 at E = 5): rounds
    # 1-28 at lr, 29-36 at lr / 10, 37-40 at lr / 100.
    half = ClientSettings(lr=0.1, batch_size=64)
    sched = LrScheduleSettings(name="multistep")
    rates = [scheduled_lr(half, sched, 40, r, 0, 16) for r in range(1, 41)]
    assert rates[:28] == [0.1] * 28
    assert rates[28:36] == pytest.approx([0.01] * 8)
    assert rates[36:] == pytest.approx([0.001] * 4)
    assert scheduled_lr(half, sched, 40, 29, 15, 16) == pytest.approx(0.01)  # per round
    # Milestones 2 and 4 of 10 rounds: the drop comes once that many rounds are done.
    assert multistep_lr(1.0, 2, 10, (0.2, 0.4), 0.5) == 1.0
    assert multistep_lr(1.0, 3, 10, (0.2, 0.4), 0.5) == 0.5
    assert multistep_lr(1.0, 4, 10, (0.2, 0.4), 0.5) == 0.5
    assert multistep_lr(1.0, 5, 10, (0.2, 0.4), 0.5) == 0.25


def test_step_batches_count_steps_not_epochs():
    gen = torch.Generator().manual_seed(0)
    batches = list(step_batches(10, 4, gen, epochs=5, local_steps=7))
    assert len(batches) == 7 and all(len(b) == 4 for b in batches)  # full batches, reshuffled
    assert all(0 <= int(i) < 10 for b in batches for i in b)
    assert [len(b) for b in step_batches(3, 4, gen, epochs=1, local_steps=5)] == [3] * 5
    assert [len(b) for b in step_batches(10, 4, gen, epochs=2)] == [4, 4, 2, 4, 4, 2]


def ssfl_raw(method: str, **algo) -> dict:
    return {
        "method": method,
        "rounds": 2,
        "dataset": {
            "name": "synthetic28",
            "synthetic_train_size": 1200,
            "synthetic_test_size": 200,
        },
        "split": {
            "labeled_per_class": 5,
            "val_size": 0,
            "test_size": 200,
            "num_clients": 4,
            "client_size": 0,
            "partitioner": "noniid_r",
        },
        "model": {"norm": "gn"},
        "server": {"local_steps": 5, "batch_size": 8},
        "client": {"local_steps": 3, "batch_size": 8},
        "algo": algo,
    }


def run_harness(raw: dict, grid: InProcessGrid):
    rows, strategy = run_method(raw, grid)
    return rows, strategy, strategy.server.split


def test_t_is_counted_in_sgd_steps_for_server_and_users():
    grid = InProcessGrid(4)
    rows, strategy, split = run_harness(ssfl_raw("fedavg_with_server", loss="selftrain"), grid)
    assert min(split.summary["client_sizes"]) > 100  # one epoch would be 13+ batches of 8
    for row in rows:
        assert row["local_steps"] == 3.0 and row["server_steps"] == 5.0
        assert row["clients"] == 4 and 0.0 < row["weight_diversity"] < math.inf
    # keep_momentum (official code): the SGD state outlives the round on both sides.
    params = list(strategy.server.model.parameters())
    kept = strategy.parts.trainer.kept_optimizer
    assert kept is not None and len(kept.state) == len(params)
    for ctx in grid.contexts.values():
        assert len(ctx.state[MOMENTUM_KEY]) == len(params)


def test_bootstrap_counts_epochs_while_rounds_count_t_steps():
    raw = ssfl_raw("fedavg_with_server")
    raw["server"].update(bootstrap_epochs=2, keep_momentum=False)
    trainer = build_strategy(raw).parts.trainer
    server = trainer.server
    steps: list[int] = []
    make_optimizer = trainer.optimizer

    def counted(server_round: int) -> torch.optim.Optimizer:
        opt = make_optimizer(server_round)
        opt.register_step_post_hook(lambda *_: steps.append(server_round))
        return opt

    trainer.optimizer = counted
    trainer.bootstrap()
    assert len(server.labeled_x) == 50  # 2 epochs of ceil(50 / 8) = 7 batches, not T = 5
    assert steps == [0] * 14
    trainer.fit(1, 0)
    assert steps[14:] == [1] * 5  # a round: T = server.local_steps


def test_fedrgd_sends_each_group_its_average_and_the_server_the_mean():
    grid = InProcessGrid(4)
    rows, strategy, _ = run_harness(ssfl_raw("fedrgd", groups=2, threshold=0.0), grid)
    pid = {nid: p for p, nid in strategy.nodes.items()}
    key = "1.classifier.3.bias"
    train = [m for m in grid.sent if m.metadata.message_type == "train"]
    sent = [
        {pid[m.metadata.dst_node_id]: m.content["arrays"][key].numpy() for m in msgs}
        for msgs in (train[:4], train[4:])
    ]
    assert all(np.array_equal(sent[0][0], v) for v in sent[0].values())  # round 1: all w_avg
    groups = rows[0]["groups"]
    assert len(groups) == 2 and sorted(k for g in groups for k in g) == [0, 1, 2, 3]
    for group in groups:  # round 2: each user starts from its group's average
        assert all(np.array_equal(sent[1][group[0]], sent[1][k]) for k in group)
    assert not np.array_equal(sent[1][groups[0][0]], sent[1][groups[1][0]])
    # After the last round the server holds w_avg = the mean of the group averages (eq. 7).
    last = rows[-1]["groups"]
    group_bias = [strategy.parts.aggregator.group_models[g[0]][key].numpy() for g in last]
    server_bias = strategy.server.model.state_dict()[key].numpy()
    assert np.allclose(np.mean(group_bias, axis=0), server_bias, atol=1e-6)


@pytest.mark.parametrize(
    "method, overrides, pattern",
    [
        ("fedavg_with_server", {"client": {"local_steps": 0}}, r"local_steps.*>= 1"),
        ("fedavg_with_server", {"algo": {"loss": "mse"}}, r"'algo.loss'"),
        ("fedrgd", {"algo": {"groups": 0}}, r"'algo.groups'"),
        ("fedseal", {"client": {"local_steps": 4, "epochs": 0}}, r"'client.local_steps'.*honour"),
        ("fedseal", {"client": {"epochs": 1, "local_steps": 4}}, r"counted in one of them"),
        ("fedseal", {"lr_schedule": {"name": "cosine"}}, r"'server.lr_decay'.*cosine"),
        (
            "fedseal",
            {
                "lr_schedule": {"name": "cosine"},
                "server": {"lr_decay": 1.0},
                "client": {"lr_decay": 1.0},
            },
            r"'lr_schedule.name'.*does not honour",
        ),
        ("server_sl", {"lr_schedule": {"epochs": 2.0, "warmup_epochs": 2.0}}, r"warmup_epochs"),
        ("fedmatch", {"client": {"keep_momentum": True}}, r"'client.keep_momentum'"),
        ("fedmatch", {"client": {"proximal_mu": 0.01}}, r"'client.proximal_mu'"),
        ("fedmatch", {"client": {"nesterov": True}}, r"'client.nesterov'.*momentum > 0"),
    ],
)
def test_bad_ssfl_values_are_config_errors(method, overrides, pattern):
    with pytest.raises(ConfigError, match=pattern):
        resolve_config({"method": method, **overrides})


@pytest.mark.parametrize("target", [0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
def test_r_partitioner_on_the_ssfl_fmnist_split(data_dir, target):
    cfg = resolve_experiment(
        ROOT / "experiments/ssfl-fmnist/crl_gn.yaml",
        sets=[f"dataset.root={data_dir}", f"split.target_r={target}"],
    )
    _, split = get_split(settings_of(cfg))
    assert abs(split.summary["noniid_r"] - target) <= 0.02
    assert split.summary["client_sizes"] == [5900] * 10 and split.summary["server_labeled"] == 1000


def test_remaining_counts_follow_app_a2_on_unbalanced_classes():
    # n = (40, 20), Q = (2/3, 1/3), R = 0.5, one user per main class:
    # user 0: 0.5 * 40 + 0.5 * 2/3 * 40 = 33.3 of class 0, 0.5 * 2/3 * 20 = 6.7 of class 1
    counts = remaining_class_counts("noniid_r", 2, np.array([40, 20]), 0.5)
    assert counts.tolist() == [[33, 7], [7, 13]]
    assert remaining_class_counts("iid", 2, np.array([40, 20]), 0.5).tolist() == [[20, 10]] * 2


def test_selftrain_loss_reads_pseudo_labels_from_label_logits():
    logits = WEAK.clone().requires_grad_()
    label_logits = torch.tensor([[0.0, 3.0, 0.0], [0.0, 0.0, 0.0]])  # sample 0 -> class 1
    loss, mask = selftrain_loss(logits, threshold=0.9, label_logits=label_logits)
    assert mask.tolist() == [1.0, 0.0]
    ce = -math.log(1.0 / (math.exp(3) + 2))  # logits of sample 0 against label 1
    assert float(loss) == pytest.approx(ce / 2, rel=1e-6)
    loss.backward()
    assert logits.grad[1].abs().sum() == 0  # the masked sample gets no gradient


def batchnorm_user(selftrain_labels: str) -> types.SimpleNamespace:
    """A stand-in self-training user whose model is one BatchNorm layer with running
    statistics mean (1, -1), variance (4, 1), so that eval and train mode differ."""
    norm = torch.nn.BatchNorm1d(2)
    norm.running_mean.copy_(torch.tensor([1.0, -1.0]))
    norm.running_var.copy_(torch.tensor([4.0, 1.0]))
    algo = types.SimpleNamespace(loss="selftrain", selftrain_labels=selftrain_labels)
    user = types.SimpleNamespace(model=norm.train(), algo=algo, aligner=None)
    user.trains_strong_view = PseudoLabelClient.trains_strong_view
    user.labels_in_eval_mode = PseudoLabelClient.labels_in_eval_mode
    return user


# Batch mean (1, 1), biased variance (1, 1): train mode gives (x - 1) / 1.
BATCH = torch.tensor([[0.0, 0.0], [2.0, 2.0]])
TRAIN_MODE = [-1.0, -1.0, 1.0, 1.0]


def test_selftrain_labels_eval_come_from_running_statistics_without_a_gradient():
    user = batchnorm_user("eval")
    labels, trained = PseudoLabelClient.logits(user, (BATCH,))
    # eval mode, the official --ue_loss SF pass: (x - (1, -1)) / (2, 1)
    assert labels.flatten().tolist() == pytest.approx([-0.5, 1.0, 0.5, 3.0], abs=1e-4)
    assert trained.flatten().tolist() == pytest.approx(TRAIN_MODE, abs=1e-4)
    assert trained.requires_grad and not labels.requires_grad
    assert user.model.training  # back in train mode for the step
    # the statistics moved once (momentum 0.1, unbiased variance 2), by the training pass
    assert user.model.running_mean.tolist() == pytest.approx([1.0, -0.8])
    assert user.model.running_var.tolist() == pytest.approx([3.8, 1.1])
    loss, mask = selftrain_loss(trained, 0.5, labels)
    assert mask.tolist() == [1.0, 1.0]  # softmax of (-0.5, 1) and (0.5, 3): both >= 0.5
    ce = -torch.log_softmax(trained.detach(), 1)[:, 1].mean()  # both labelled 1
    assert float(loss.detach()) == pytest.approx(float(ce))
    assert float(ce) == pytest.approx(math.log(2.0), abs=1e-4)  # the logits tie


def test_selftrain_labels_train_are_the_training_pass_logits():
    user = batchnorm_user("train")
    labels, trained = PseudoLabelClient.logits(user, (BATCH,))
    assert labels is trained
    assert trained.flatten().tolist() == pytest.approx(TRAIN_MODE, abs=1e-4)


def test_selftrain_labels_is_refused_for_crl():
    with pytest.raises(ConfigError, match=r"'algo\.selftrain_labels': applies to algo\.loss"):
        resolve_config(ssfl_raw("fedavg_with_server", loss="crl", selftrain_labels="train"))
    assert resolve_config(ssfl_raw("fedrgd", loss="selftrain", selftrain_labels="train"))


def test_distribution_alignment_on_hand_made_probabilities():
    aligner = DistributionAligner(2)
    probs = torch.tensor([[0.9, 0.1], [0.6, 0.4]])
    aligned = torch.softmax(aligner(torch.log(probs)), dim=1)
    # mean p = (0.75, 0.25); p * (1/2) / mean, renormalised
    assert aligned[0].tolist() == pytest.approx([0.75, 0.25], rel=1e-5)
    assert aligned[1].tolist() == pytest.approx([1 / 3, 2 / 3], rel=1e-5)
    # the running mean covers every batch so far: (0.9 + 0.6 + 0.5) / 3 for class 0
    aligner(torch.zeros(1, 2))
    assert aligner.mean().tolist() == pytest.approx([2.0 / 3, 1.0 / 3], rel=1e-5)


@pytest.mark.parametrize("loss", ["crl", "selftrain"])
def test_distribution_alignment_feeds_every_users_step(monkeypatch, loss):
    calls: list[int] = []
    align = DistributionAligner.__call__

    def counted(self, logits):
        calls.append(len(logits))
        return align(self, logits)

    monkeypatch.setattr(DistributionAligner, "__call__", counted)
    raw = ssfl_raw("fedavg_with_server", loss=loss, distribution_alignment=True)
    rows, _, _ = run_harness({**raw, "rounds": 1}, InProcessGrid(4))
    assert calls == [8] * (4 * 3)  # every user, each of its T = 3 steps, a batch of 8
    assert rows[0]["local_steps"] == 3.0
    calls.clear()
    run_harness({**ssfl_raw("fedavg_with_server", loss=loss), "rounds": 1}, InProcessGrid(4))
    assert calls == []  # off by default (the paper has no alignment)


@pytest.mark.parametrize("method, sizes", [("fedavg_with_server", [4]), ("fedrgd", [2, 2])])
def test_server_weight_reaches_eq4_and_eq7(monkeypatch, method, sizes):
    seen: list[list[float]] = []
    average = aggregate.weighted_average

    def recorded(updates, weights, device="cpu"):
        seen.append(list(weights))
        return average(updates, weights, device)

    monkeypatch.setattr(aggregate, "weighted_average", recorded)
    run_harness({**ssfl_raw(method, server_weight=3.0), "rounds": 1}, InProcessGrid(4))
    assert [w for w in seen if w[0] == 3.0] == [[3.0] + [1.0] * n for n in sizes]
    with pytest.raises(ConfigError, match=r"'algo\.server_weight': must be > 0"):
        resolve_config({"method": method, "algo": {"server_weight": 0}})


def test_small_cnn_dropout_is_a_model_option():
    plain = build_model("small_cnn", 1, 10, 28, "gn", (0.5,), (0.25,))
    dropped = build_model("small_cnn", 1, 10, 28, "gn", (0.5,), (0.25,), dropout=0.25)
    assert not any(isinstance(m, torch.nn.Dropout2d) for m in plain.modules())
    assert [m.p for m in dropped.modules() if isinstance(m, torch.nn.Dropout2d)] == [0.25]
    assert plain.state_dict().keys() == dropped.state_dict().keys()
    with pytest.raises(ConfigError, match="only small_cnn"):
        resolve_config({"model": {"name": "resnet18", "dropout": 0.25}})
    with pytest.raises(ConfigError, match=r"must be in \[0, 1\)"):
        resolve_config({"model": {"dropout": 1.0}})


def test_local_drift_benchmark_runs_every_user_for_t_steps(tmp_path):
    spec = importlib.util.spec_from_file_location("local_drift", ROOT / "benchmarks/local_drift.py")
    drift_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(drift_module)
    raw = ssfl_raw("fedavg_with_server")
    raw["server"]["bootstrap_epochs"] = 1
    cfg = resolve_config(raw)
    start, accuracy = drift_module.bootstrapped(settings_of(cfg))
    row = drift_module.drift(settings_of(cfg), start, 2)
    assert row["steps"] == 2 and len(row["user_accuracy"]) == 4
    assert all(m["local_steps"] == 2 for m in row["user_metrics"])
    assert 0.0 <= row["average_accuracy"] <= 1.0 and 0.0 <= accuracy <= 1.0
    save_checkpoint({"round": 4, "config": json.dumps(cfg), "model": start}, tmp_path / "c.pt")
    kept, kept_accuracy = drift_module.checkpointed(settings_of(cfg), tmp_path / "c.pt")
    assert kept_accuracy == accuracy
    assert all(torch.equal(kept[k], start[k]) for k in start)
    other = resolve_config({**raw, "seed": 3})
    with pytest.raises(SystemExit, match=r"^local_drift: --checkpoint: the config differs"):
        drift_module.checkpointed(settings_of(other), tmp_path / "c.pt")

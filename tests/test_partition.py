from __future__ import annotations

import numpy as np
import pytest

from ssfl.experiment import resolve_config, resolve_experiment
from ssfl.registry import settings_of
from tasks import partition
from tasks.config import ConfigError
from tasks.data import make_synthetic
from tasks.partition import get_split, make_split, noniid_r, round_counts
from tasks.settings import SplitSettings
from tests.conftest import ROOT

# Fashion-MNIST's shape and class balance at half its size: no data files needed.
SYNTHETIC = {"name": "synthetic28", "synthetic_train_size": 30000, "synthetic_test_size": 3000}


def split_cfg(**split):
    return resolve_config({"dataset": SYNTHETIC, "split": split})


def test_fmnist_las_sizes_and_disjointness():
    ds, split = get_split(settings_of(split_cfg()))
    labels = ds.train_y.numpy()
    assert len(split.server_labeled) == 500 and len(split.val) == 200 and len(split.test) == 3000
    assert np.bincount(labels[split.server_labeled]).tolist() == [50] * 10
    assert [len(c) for c in split.clients] == [1200] * 10
    for c in split.clients:  # IID: 120 per class (FedSEAL 5.1)
        assert np.bincount(labels[c], minlength=10).tolist() == [120] * 10
    everything = np.concatenate([split.server_labeled, split.val, *split.clients])
    assert len(np.unique(everything)) == len(everything)
    assert split.summary["noniid_r"] == 0.0


def test_split_is_deterministic_in_the_seed():
    ds, a = get_split(settings_of(split_cfg()))
    b = make_split(ds, SplitSettings(**split_cfg()["split"]), 0)
    c = make_split(ds, SplitSettings(**split_cfg()["split"]), 1)
    assert all(np.array_equal(x, y) for x, y in zip(a.clients, b.clients))
    assert np.array_equal(a.server_labeled, b.server_labeled)
    assert not np.array_equal(a.server_labeled, c.server_labeled)


def test_noniid_r_metric_on_hand_made_histograms():
    # SSFL eq. 1: mean over pairs of ||P_k - P_m||_1 / 2
    assert noniid_r(np.array([[5, 5], [5, 5]])) == 0.0
    assert noniid_r(np.array([[10, 0], [0, 10]])) == 1.0
    # pairs: (a,b)=0.5, (a,c)=1.0, (b,c)=0.5 -> mean 2/3
    assert noniid_r(np.array([[4, 0], [2, 2], [0, 4]])) == pytest.approx(2 / 3)


def test_noniid_r_equals_every_pair_summed_and_scales_to_many_clients():
    # The sorted-column sum against the plain mean over all K (K - 1) / 2 pairs.
    hist = np.random.default_rng(3).integers(0, 20, size=(37, 6))
    probs = hist / np.maximum(hist.sum(axis=1, keepdims=True), 1)
    pairs = [np.abs(probs[a] - probs[b]).sum() / 2 for a in range(37) for b in range(a + 1, 37)]
    assert noniid_r(hist) == pytest.approx(np.mean(pairs), rel=1e-12)
    # 20,000 clients: the K x K x C difference array would need 32 GB; this is O(K).
    one_class_each = np.eye(10, dtype=np.int64)[np.arange(20_000) % 10] * 5
    assert noniid_r(one_class_each) == pytest.approx(1 - 1999 / 19999, rel=1e-12)


@pytest.mark.parametrize("target", [0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
def test_ssfl_partitioner_hits_target_r(target):
    cfg = split_cfg(partitioner="noniid_r", target_r=target, labeled_per_class=100)
    _, split = get_split(settings_of(cfg))
    assert abs(split.summary["noniid_r"] - target) <= 0.02


def test_random_classes_and_fedmatch_imbalanced():
    ds, split = get_split(settings_of(split_cfg(partitioner="random_classes")))
    labels = ds.train_y.numpy()
    hists = np.array([np.bincount(labels[c], minlength=10) for c in split.clients])
    assert (hists.sum(axis=1) == 1200).all() and split.summary["noniid_r"] > 0.2
    _, fm = get_split(settings_of(split_cfg(partitioner="fedmatch_imbalanced", num_clients=12)))
    h = np.array(fm.summary["client_histograms"])
    assert h[3].argmax() == 3 and h[3, 3] == 600 and h[3, 4] == 180 and h[3, 2] == 180
    assert np.array_equal(h[0], h[10])  # client k takes type k mod 10


def test_dirichlet_uses_every_pool_sample_once():
    _, split = get_split(settings_of(split_cfg(partitioner="dirichlet", dirichlet_alpha=0.3)))
    sizes = [len(c) for c in split.clients]
    assert sum(sizes) == 12000 and len(set(sizes)) > 1
    assert len(np.unique(np.concatenate(split.clients))) == 12000


def test_a_dirichlet_partition_is_drawn_once_and_read_back(tmp_path, monkeypatch):
    monkeypatch.setenv("SSFL_CACHE_DIR", str(tmp_path))
    cfg = split_cfg(partitioner="dirichlet", dirichlet_alpha=0.5, num_clients=7)
    ds = make_synthetic(28, 20000, 3000)
    drawn = make_split(ds, SplitSettings(**cfg["split"]), 0)
    (saved,) = tmp_path.glob("dirichlet-*.npz")

    def no_second_draw(*args):
        raise AssertionError("drawn again")

    monkeypatch.setattr(partition, "_flwr_dirichlet", no_second_draw)
    read = make_split(ds, SplitSettings(**cfg["split"]), 0)
    assert [c.tolist() for c in read.clients] == [c.tolist() for c in drawn.clients]
    assert read.summary == drawn.summary
    with pytest.raises(AssertionError, match="drawn again"):  # another alpha: another key
        make_split(ds, SplitSettings(**{**cfg["split"], "dirichlet_alpha": 0.6}), 0)
    with pytest.raises(AssertionError, match="drawn again"):  # another seed: another key
        make_split(ds, SplitSettings(**cfg["split"]), 1)
    saved.write_bytes(b"not an npz")  # a damaged file is drawn again, not trusted
    with pytest.raises(AssertionError, match="drawn again"):
        make_split(ds, SplitSettings(**cfg["split"]), 0)


def test_an_unwritable_cache_warns_and_the_split_still_comes(tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("SSFL_CACHE_DIR", str(blocker / "cache"))
    cfg = split_cfg(partitioner="dirichlet", dirichlet_alpha=0.5, num_clients=7)
    split = make_split(make_synthetic(28, 20000, 3000), SplitSettings(**cfg["split"]), 0)
    assert sum(len(c) for c in split.clients) == cfg["split"]["client_size"] * 7
    assert "split cache not written" in caplog.text


def small_split(num_clients: int, client_size: int) -> dict:
    """A fedmatch_imbalanced split config with 5 server labels a class, no val/test subset."""
    return split_cfg(
        partitioner="fedmatch_imbalanced",
        num_clients=num_clients,
        client_size=client_size,
        labeled_per_class=5,
        val_size=0,
        test_size=0,
    )["split"]


@pytest.mark.parametrize("num_classes", [5, 12])
def test_fedmatch_imbalanced_split_of_another_class_count(num_classes):
    """Client k: 50% of class k mod C, 15% of each neighbour, the other 20% spread evenly."""
    ds = make_synthetic(28, 400 * num_classes, 10 * num_classes, num_classes=num_classes)
    scfg = small_split(num_classes + 1, 200)
    hists = np.array(make_split(ds, SplitSettings(**scfg), 0).summary["client_histograms"])
    assert hists.shape == (num_classes + 1, num_classes)
    for k, hist in enumerate(hists):
        main, after, before = k % num_classes, (k + 1) % num_classes, (k - 1) % num_classes
        assert hist.sum() == 200 and hist[main] == 100 and hist[after] == hist[before] == 30
        rest = np.delete(hist, [main, after, before])
        assert rest.sum() == 40 and rest.max() - rest.min() <= 1


def test_fedmatch_imbalanced_needs_four_classes():
    ds = make_synthetic(28, 900, 30, num_classes=3)
    with pytest.raises(ConfigError, match="needs at least 4 classes, the dataset has 3"):
        make_split(ds, SplitSettings(**small_split(3, 100)), 0)


@pytest.mark.parametrize("target", [0.0, 0.4, 1.0])
def test_ssfl_fmnist_split_shares_out_the_rest_at_target_r(target):
    """The shipped SSFL Fashion-MNIST split (client_size 0: every image left, App. A.2)."""
    sets = [f"dataset.{k}={v}" for k, v in SYNTHETIC.items()] + [f"split.target_r={target}"]
    cfg = resolve_experiment(ROOT / "experiments/ssfl-fmnist/crl_gn.yaml", sets=sets)
    ds, split = get_split(settings_of(cfg))
    scfg, k = cfg["split"], cfg["split"]["num_clients"]
    left = len(ds.train_y) - ds.num_classes * scfg["labeled_per_class"] - scfg["val_size"]
    assert split.summary["client_sizes"] == [left // k] * k
    assert split.summary["server_labeled"] == ds.num_classes * scfg["labeled_per_class"]
    assert abs(split.summary["noniid_r"] - target) <= 0.02


def test_labels_at_client_part_is_a_subset_with_per_class_counts():
    ds = make_synthetic(28, 3000, 200)
    scfg = resolve_config(
        {
            "split": {
                "scenario": "labels_at_client",
                "client_labeled_per_class": 3,
                "num_clients": 4,
                "client_size": 300,
                "labeled_per_class": 0,
                "test_size": 200,
            }
        }
    )["split"]
    split = make_split(ds, SplitSettings(**scfg), 0)
    labels = ds.train_y.numpy()
    for c, lab in zip(split.clients, split.client_labeled):
        assert np.isin(lab, c).all()
        assert np.bincount(labels[lab], minlength=10).tolist() == [3] * 10


def test_too_large_split_is_a_config_error():
    ds = make_synthetic(28, 500, 100)
    scfg = resolve_config({"split": {"client_size": 1000, "test_size": 100}})["split"]
    with pytest.raises(ConfigError, match=r"only \d+ left"):
        make_split(ds, SplitSettings(**scfg), 0)


def test_round_counts_sum_exactly():
    counts = round_counts(np.array([0.5, 0.15, 0.35]), 7)
    assert counts.sum() == 7 and counts.tolist() == [4, 1, 2]

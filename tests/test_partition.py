from __future__ import annotations

import numpy as np
import pytest

from tasks.config import ConfigError, resolve
from tasks.data import make_synthetic
from tasks.partition import get_split, make_split, noniid_r, round_counts


def fmnist_cfg(data_dir, **split):
    return resolve({"dataset": {"name": "fashion_mnist", "root": str(data_dir)}, "split": split})


def test_fmnist_las_sizes_and_disjointness(data_dir):
    ds, split = get_split(fmnist_cfg(data_dir))
    labels = ds.train_y.numpy()
    assert len(split.server_labeled) == 500 and len(split.val) == 200 and len(split.test) == 3000
    assert np.bincount(labels[split.server_labeled]).tolist() == [50] * 10
    assert [len(c) for c in split.clients] == [1200] * 10
    for c in split.clients:  # IID: 120 per class (FedSEAL 5.1)
        assert np.bincount(labels[c], minlength=10).tolist() == [120] * 10
    everything = np.concatenate([split.server_labeled, split.val, *split.clients])
    assert len(np.unique(everything)) == len(everything)
    assert split.summary["noniid_r"] == 0.0


def test_split_is_deterministic_in_the_seed(data_dir):
    ds, a = get_split(fmnist_cfg(data_dir))
    b = make_split(ds, fmnist_cfg(data_dir)["split"], 0)
    c = make_split(ds, fmnist_cfg(data_dir)["split"], 1)
    assert all(np.array_equal(x, y) for x, y in zip(a.clients, b.clients))
    assert np.array_equal(a.server_labeled, b.server_labeled)
    assert not np.array_equal(a.server_labeled, c.server_labeled)


def test_noniid_r_metric_on_hand_made_histograms():
    # SSFL eq. 1: mean over pairs of ||P_k - P_m||_1 / 2
    assert noniid_r(np.array([[5, 5], [5, 5]])) == 0.0
    assert noniid_r(np.array([[10, 0], [0, 10]])) == 1.0
    # pairs: (a,b)=0.5, (a,c)=1.0, (b,c)=0.5 -> mean 2/3
    assert noniid_r(np.array([[4, 0], [2, 2], [0, 4]])) == pytest.approx(2 / 3)


@pytest.mark.parametrize("target", [0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
def test_ssfl_partitioner_hits_target_r(data_dir, target):
    cfg = fmnist_cfg(data_dir, partitioner="noniid_r", target_r=target, labeled_per_class=100)
    _, split = get_split(cfg)
    assert abs(split.summary["noniid_r"] - target) <= 0.02


def test_random_classes_and_fedmatch_imbalanced(data_dir):
    ds, split = get_split(fmnist_cfg(data_dir, partitioner="random_classes"))
    labels = ds.train_y.numpy()
    hists = np.array([np.bincount(labels[c], minlength=10) for c in split.clients])
    assert (hists.sum(axis=1) == 1200).all() and split.summary["noniid_r"] > 0.2
    _, fm = get_split(fmnist_cfg(data_dir, partitioner="fedmatch_imbalanced", num_clients=12))
    h = np.array(fm.summary["client_histograms"])
    assert h[3].argmax() == 3 and h[3, 3] == 600 and h[3, 4] == 180 and h[3, 2] == 180
    assert np.array_equal(h[0], h[10])  # client k takes type k mod 10


def test_dirichlet_uses_every_pool_sample_once(data_dir):
    _, split = get_split(fmnist_cfg(data_dir, partitioner="dirichlet", dirichlet_alpha=0.3))
    sizes = [len(c) for c in split.clients]
    assert sum(sizes) == 12000 and len(set(sizes)) > 1
    assert len(np.unique(np.concatenate(split.clients))) == 12000


def test_labels_at_client_part_is_a_subset_with_per_class_counts():
    ds = make_synthetic(28, 3000, 200)
    scfg = resolve(
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
    split = make_split(ds, scfg, 0)
    labels = ds.train_y.numpy()
    for c, lab in zip(split.clients, split.client_labeled):
        assert np.isin(lab, c).all()
        assert np.bincount(labels[lab], minlength=10).tolist() == [3] * 10


def test_too_large_split_is_a_config_error():
    ds = make_synthetic(28, 500, 100)
    scfg = resolve({"split": {"client_size": 1000, "test_size": 100}})["split"]
    with pytest.raises(ConfigError, match=r"only \d+ left"):
        make_split(ds, scfg, 0)


def test_round_counts_sum_exactly():
    counts = round_counts(np.array([0.5, 0.15, 0.35]), 7)
    assert counts.sum() == 7 and counts.tolist() == [4, 1, 2]

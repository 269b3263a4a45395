"""A node's own unlabeled images (node-config ``data-path``): the loader and the ClientApp."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from client_app.base import Node, node_from_config
from tasks.config import ConfigError
from tasks.data import DatasetInfo, dataset_info, load_image_folder
from tests.harness import InProcessGrid, run_method

GRAY28 = dataset_info("fashion_mnist")  # 1 channel, 28 x 28
RGB32 = dataset_info("synthetic32")  # 3 channels, 32 x 32


def save_png(path, array: np.ndarray) -> None:
    Image.fromarray(array).save(path)


def test_png_files_keep_their_pixels_in_name_order(tmp_path):
    a = np.arange(28 * 28, dtype=np.uint8).reshape(28, 28)
    save_png(tmp_path / "b.png", np.full((28, 28), 7, np.uint8))
    save_png(tmp_path / "a.png", a)
    (tmp_path / "notes.txt").write_text("ignored")
    x = load_image_folder(tmp_path, GRAY28)
    assert x.shape == (2, 1, 28, 28) and x.dtype == torch.uint8
    assert torch.equal(x[0, 0], torch.from_numpy(a)) and int(x[1].min()) == int(x[1].max()) == 7


def test_colour_is_converted_and_size_fitted(tmp_path):
    # ITU-R 601 luma as PIL computes it: (100*19595 + 200*38470 + 50*7471 + 2**15) >> 16 = 153
    save_png(tmp_path / "rgb.png", np.tile(np.array([100, 200, 50], np.uint8), (28, 28, 1)))
    save_png(tmp_path / "big.png", np.full((56, 40), 77, np.uint8))  # resized to 28 x 28
    x = load_image_folder(tmp_path, GRAY28)
    assert x.shape == (2, 1, 28, 28)
    assert set(x[0].unique().tolist()) == {77} and set(x[1].unique().tolist()) == {153}
    rgb = load_image_folder(tmp_path, RGB32)  # gray -> 3 equal channels, 32 x 32
    assert rgb.shape == (2, 3, 32, 32) and set(rgb[0].unique().tolist()) == {77}


def test_jpeg_is_read(tmp_path):
    Image.fromarray(np.full((28, 28), 128, np.uint8)).save(tmp_path / "x.jpg", quality=95)
    x = load_image_folder(tmp_path, GRAY28)
    assert x.shape == (1, 1, 28, 28) and (x.int() - 128).abs().max() <= 1


@pytest.mark.parametrize(
    ("shape", "count"),
    [((28, 28), 1), ((5, 28, 28), 5), ((2, 28, 28, 1), 2), ((2, 1, 28, 28), 2), ((28, 28, 3), 1)],
)
def test_npy_layouts(tmp_path, shape, count):
    np.save(tmp_path / "x.npy", np.full(shape, 9, np.uint8))
    x = load_image_folder(tmp_path, GRAY28)
    assert x.shape == (count, 1, 28, 28) and set(x.unique().tolist()) == {9}


def test_npy_floats_in_unit_range_are_scaled(tmp_path):
    np.save(tmp_path / "x.npy", np.array([[0.0, 0.5], [1.0, 0.25]], np.float32))
    x = load_image_folder(tmp_path, DatasetInfo(10, 1, 2, (0.5,), (0.25,), flip=False))
    assert x[0, 0].tolist() == [[0, 128], [255, 64]]  # round(x * 255), half to even


@pytest.mark.parametrize(
    ("setup", "needle"),
    [
        (lambda d: None, "no such folder"),
        (lambda d: d.mkdir(), "no PNG, JPEG or .npy files"),
        (lambda d: (d.mkdir(), (d / "x.png").write_bytes(b"not an image")), "cannot read x.png"),
        (lambda d: (d.mkdir(), np.save(d / "x.npy", np.full((4, 4), 2.0))), "cannot read x.npy"),
        (lambda d: (d.mkdir(), np.save(d / "x.npy", np.zeros((4, 4), np.int32))), "int32"),
    ],
)
def test_bad_folders_are_one_clear_line(tmp_path, setup, needle):
    folder = tmp_path / "node"
    setup(folder)
    with pytest.raises(ConfigError) as err:
        load_image_folder(folder, GRAY28)
    msg = str(err.value)
    assert "\n" not in msg and str(folder) in msg and needle in msg


def test_node_config_names_the_data_source():
    assert node_from_config({"partition-id": 2, "num-partitions": 4}) == Node(2, "")
    assert node_from_config({"partition-id": 0, "data-path": "/d"}) == Node(0, "/d")
    with pytest.raises(ValueError, match="data-path"):
        node_from_config({"data-path": "/d"})


def image_folder(path, n: int):
    path.mkdir()
    rng = np.random.default_rng(0)
    for i in range(n):
        save_png(path / f"{i:03d}.png", rng.integers(0, 256, (28, 28), dtype=np.uint8))
    return str(path)


def node_metrics(grid: InProcessGrid, pid: int) -> dict:
    """The metrics of the partition's last reply."""
    reply = next(r for r in reversed(grid.replies) if grid.partition[r.metadata.src_node_id] == pid)
    assert not reply.has_error(), reply.error.reason
    return dict(reply.content["metrics"].items())


@pytest.mark.parametrize("method", ["fedavg_fixmatch", "fedseal"])
def test_node_with_own_images_trains_without_label_diagnostics(method, tmp_path, synthetic_raw):
    grid = InProcessGrid(3, node_data={1: image_folder(tmp_path / "node1", 40)})
    rows = run_method({**synthetic_raw, "method": method, "rounds": 1}, grid)[0]
    assert rows[0]["clients"] == 3 and rows[0]["failures"] == 0
    own, partition = node_metrics(grid, 1), node_metrics(grid, 0)
    assert own["num-examples"] == 40 and partition["num-examples"] == 200
    assert "pseudo_label_accuracy" in partition and "pseudo_label_accuracy" not in own
    if method == "fedseal":
        assert "complementary_label_accuracy" not in own
        assert 0.0 <= own["positive_fraction"] <= 1.0
    else:
        assert 0.0 <= own["mask_rate"] <= 1.0


def test_missing_folder_fails_that_node_only(tmp_path, synthetic_raw):
    grid = InProcessGrid(3, node_data={2: str(tmp_path / "missing")})
    rows = run_method({**synthetic_raw, "rounds": 1}, grid)[0]
    assert rows[0]["clients"] == 2 and rows[0]["failed_partitions"] == [2]
    reason = next(r for r in grid.replies if r.has_error()).error.reason
    assert "no such folder" in reason and str(tmp_path / "missing") in reason


def test_supervised_method_refuses_unlabeled_node(tmp_path, synthetic_raw):
    grid = InProcessGrid(3, node_data={0: image_folder(tmp_path / "node0", 10)})
    rows = run_method({**synthetic_raw, "method": "fedavg_sl", "rounds": 1}, grid)[0]
    assert rows[0]["failed_partitions"] == [0]
    assert "only unlabeled images" in next(r for r in grid.replies if r.has_error()).error.reason


def test_fedseal_oracle_labels_refuse_unlabeled_node(tmp_path, synthetic_raw):
    grid = InProcessGrid(3, node_data={1: image_folder(tmp_path / "node1", 10)})
    raw = {**synthetic_raw, "method": "fedseal", "rounds": 1, "algo": {"oracle_labels": True}}
    rows = run_method(raw, grid)[0]
    assert rows[0]["failed_partitions"] == [1]
    assert (
        "oracle_labels needs known labels"
        in next(r for r in grid.replies if r.has_error()).error.reason
    )

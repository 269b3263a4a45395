"""tasks/state_io.py: a model's state to and from the host in one copy per dtype gives what
state_dict() and load_state_dict() give, with fewer host copies."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from tasks.state_io import device_tensors, host_arrays, load_host_arrays
from tasks.syncs import SyncCounter


def small_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4, 3))


def test_host_arrays_equal_the_state_dict_in_one_copy_per_dtype():
    model = small_model(0)
    model[1].num_batches_tracked += 7  # the int64 buffer: a second dtype
    state = model.state_dict()
    with SyncCounter() as counter:
        arrays = host_arrays(state)
    assert list(arrays) == list(state)
    for key, tensor in state.items():
        assert arrays[key].flags["C_CONTIGUOUS"] and arrays[key].dtype == tensor.numpy().dtype
        assert np.array_equal(arrays[key], tensor.numpy()) and arrays[key].shape == tensor.shape
    assert counter.host_copies["Tensor.cpu"] == 2  # float32 and int64, not one a tensor
    assert int(arrays["1.num_batches_tracked"]) == 7


def test_load_host_arrays_is_load_state_dict():
    source, target, reference = small_model(1), small_model(2), small_model(3)
    source.to(memory_format=torch.channels_last)
    arrays = {k: v.numpy().copy() for k, v in source.state_dict().items()}
    load_host_arrays(target, arrays)
    reference.load_state_dict(source.state_dict())
    for (key, got), want in zip(target.state_dict().items(), reference.state_dict().values()):
        assert torch.equal(got, want), key
    arrays["1.num_batches_tracked"] = np.array([5])  # a one-element counter, as torch takes it
    load_host_arrays(target, arrays)
    assert int(target[1].num_batches_tracked) == 5


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda a: a.pop("3.bias"), r"missing \['3.bias'\]"),
        (lambda a: a.update(extra=np.zeros(1)), r"unexpected \['extra'\]"),
        (lambda a: a.update({"3.bias": np.zeros(4, "float32")}), r"size mismatch for 3.bias"),
    ],
)
def test_load_host_arrays_refuses_other_keys_or_shapes(change, message):
    model = small_model(0)
    arrays = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    change(arrays)
    with pytest.raises(RuntimeError, match=message):
        load_host_arrays(model, arrays)


def test_device_tensors_are_independent_views_with_the_arrays_values():
    arrays = {
        "a": np.arange(6, dtype="float32").reshape(2, 3),
        "b": np.array([1, 2]),
        "c": np.ones(2, "float32"),
    }
    out = device_tensors(arrays, torch.device("cpu"))
    assert list(out) == ["a", "b", "c"]
    for key, array in arrays.items():
        assert (
            np.array_equal(out[key].numpy(), array)
            and out[key].dtype == torch.from_numpy(array).dtype
        )
    out["a"].add_(1)
    assert out["c"].tolist() == [1.0, 1.0]  # the slices do not overlap

"""Client state files (client_app/state.py): the layout's round trip, earlier versions'
protobuf files, and a damaged file's one-line error."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from flwr.common.serde import recorddict_to_proto

from client_app.state import (
    MAGIC,
    StateFileError,
    decode_state,
    encode_state,
    read_state,
    restore_state,
    save_state,
)


def sample_state() -> RecordDict:
    return RecordDict(
        {
            "momentum": ArrayRecord(
                {"0": torch.arange(6, dtype=torch.float32).reshape(2, 3), "1": torch.tensor(7)}
            ),
            "ensemble": ArrayRecord({"p": Array(np.array([[0.25, 0.75]], dtype=np.float64))}),
            "empty": ArrayRecord(),
            "seen": MetricRecord({"rounds": 3, "loss": 0.5}),
            "cfg": ConfigRecord({"name": "x", "flags": [1, 2]}),
        }
    )


def assert_same(a: RecordDict, b: RecordDict) -> None:
    assert list(a) == list(b)
    for key in a:
        if isinstance(a[key], ArrayRecord):
            assert list(a[key]) == list(b[key])
            for name in a[key]:
                x, y = a[key][name], b[key][name]
                assert (x.dtype, tuple(x.shape), x.stype, x.data) == (
                    y.dtype,
                    tuple(y.shape),
                    y.stype,
                    y.data,
                )
        else:
            assert dict(a[key]) == dict(b[key])


def test_a_state_file_gives_back_every_record_and_array_byte_for_byte():
    state = sample_state()
    chunks = encode_state(state)
    assert chunks[0] == MAGIC
    back = decode_state(b"".join(chunks))
    # the other records come last, after the array records: their order is kept per kind
    assert list(back) == ["momentum", "ensemble", "empty", "seen", "cfg"]
    assert_same(state, back)
    assert back["momentum"]["0"].numpy().tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert back["ensemble"]["p"].numpy().dtype == np.float64


def test_an_array_only_state_has_no_protobuf_part_and_the_arrays_bytes_as_they_are():
    state = RecordDict({"m": ArrayRecord({"w": Array(np.ones(1000, dtype=np.float32))})})
    chunks = encode_state(state)
    assert chunks[-1] == b""
    assert state["m"]["w"].data in chunks
    assert_same(state, decode_state(b"".join(chunks)))


def test_a_protobuf_state_file_of_earlier_versions_is_still_read(tmp_path):
    state = sample_state()
    folder = tmp_path / "partition-0"
    folder.mkdir()
    (folder / "round-2.bin").write_bytes(recorddict_to_proto(state).SerializeToString())
    restored = RecordDict()
    assert restore_state(restored, folder, 3) == 2
    assert_same(state, restored)


@pytest.mark.parametrize("cut", [5, 30, -3])
def test_a_damaged_state_file_is_one_line_naming_it(cut, tmp_path):
    folder = tmp_path / "partition-1"
    save_state(sample_state(), folder, 4)
    path = folder / "round-4.bin"
    path.write_bytes(path.read_bytes()[:cut])
    with pytest.raises(StateFileError) as err:
        read_state(path)
    assert str(err.value).startswith(f"client state file {path} is damaged: ")
    assert "\n" not in str(err.value)

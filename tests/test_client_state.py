"""Client state files (client_app/state.py): the layout's round trip, earlier versions'
protobuf files, a damaged file's one-line error, and the states a process keeps in memory
and writes in the background."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from flwr.common.serde import recorddict_to_proto

import client_app.state as state_module
from client_app.state import (
    MAGIC,
    STORE,
    StateFileError,
    StateStore,
    Written,
    decode_state,
    encode_state,
    read_state,
    read_token,
    restore_state,
    save_state,
)
from tasks.checkpoint import write_atomic


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


def test_a_state_this_process_wrote_comes_back_from_memory_as_a_copy(tmp_path, monkeypatch):
    folder = tmp_path / "partition-0"
    save_state(sample_state(), folder, 2)
    assert read_token(folder / "round-2.bin") == STORE.kept[folder].token

    def no_file(path):
        raise AssertionError(f"{path} read although this process wrote it")

    monkeypatch.setattr(state_module, "read_state", no_file)
    restored = RecordDict()
    assert restore_state(restored, folder, 3) == 2
    assert_same(sample_state(), restored)
    restored["momentum"]["0"] = Array(np.zeros(1, dtype=np.float32))  # a client's change
    again = RecordDict()
    restore_state(again, folder, 3)
    assert_same(sample_state(), again)


def test_a_file_another_process_wrote_is_read_from_disk(tmp_path):
    """The newest file's token is not the one this process wrote (another worker wrote that
    round, or the same round again): the file wins."""
    folder = tmp_path / "partition-0"
    save_state(sample_state(), folder, 2)
    other = RecordDict({"momentum": ArrayRecord({"0": torch.ones(2)})})
    write_atomic(folder / "round-2.bin", encode_state(other, "another process"))
    restored = RecordDict()
    assert restore_state(restored, folder, 3) == 2
    assert_same(other, restored)
    save_state(sample_state(), folder, 3)
    write_atomic(folder / "round-4.bin", encode_state(other, "a newer round"))
    newest = RecordDict()
    assert restore_state(newest, folder, 5) == 4
    assert_same(other, newest)


def test_a_background_write_is_on_disk_after_flush_and_a_failed_one_is_reported(tmp_path):
    folder = tmp_path / "partition-0"
    save_state(sample_state(), folder, 1, background=True)
    assert STORE.flush() == {}
    assert_same(sample_state(), read_state(folder / "round-1.bin"))
    blocked = tmp_path / "partition-1"
    blocked.write_text("a file where the folder should be")
    save_state(sample_state(), blocked, 1, background=True)
    failed = STORE.flush()
    assert list(failed) == [blocked] and isinstance(failed[blocked], OSError)
    assert blocked not in STORE.kept  # never restored from memory: it is not on disk


def test_kept_states_stay_within_the_budget_least_recently_used_first(tmp_path):
    store = StateStore(budget=250)
    for i in range(3):
        store.keep(tmp_path / str(i), Written(1, f"t{i}", RecordDict(), 100))
    assert list(store.kept) == [tmp_path / "1", tmp_path / "2"]
    assert store.lookup(tmp_path / "1", 1, "t1") is not None  # now the most recent
    store.keep(tmp_path / "3", Written(1, "t3", RecordDict(), 100))
    assert list(store.kept) == [tmp_path / "1", tmp_path / "3"]
    store.keep(tmp_path / "4", Written(1, "t4", RecordDict(), 300))  # over the budget alone
    assert tmp_path / "4" not in store.kept
    assert store.lookup(tmp_path / "1", 2, "t1") is None  # another round
    assert store.lookup(tmp_path / "1", 1, None) is None  # a file without a token

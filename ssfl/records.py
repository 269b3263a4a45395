"""Flower ArrayRecords to and from numpy arrays by key, for the client and server halves
alike (what travels keeps its dtypes: sparse payloads keep their index dtype)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from flwr.app import Array, ArrayRecord


def record_arrays(record: ArrayRecord) -> dict[str, np.ndarray]:
    """An ArrayRecord's arrays by key."""
    return dict(zip(record.keys(), record.to_numpy_ndarrays(), strict=True))


def to_record(arrays: Mapping[str, np.ndarray]) -> ArrayRecord:
    """An ArrayRecord of numpy arrays, dtypes kept."""
    return ArrayRecord(
        array_dict={key: Array(np.ascontiguousarray(v)) for key, v in arrays.items()}
    )


def record_dtypes(record: ArrayRecord) -> dict[str, np.dtype]:
    """An ArrayRecord's dtypes by key, read without decoding its arrays."""
    return {key: np.dtype(array.dtype) for key, array in record.items()}

"""Counting the device-to-host syncs of tensor code (benchmarks/host_syncs.py).

A sync is an op whose result the host must read from the device before it can go on:
the stream drains, and the GPU idles while Python catches up. :class:`SyncCounter` sees
every ATen op below autograd (a ``TorchDispatchMode``), so the backward pass and the
optimizer's ops count too. It counts apart the tensor methods that copy to the host
(``.cpu()``, ``.tolist()``), which on a CPU run reach no ATen op: a ``TorchFunctionMode``
it enters with itself sees them.

On a CPU run every tensor is on the host, so the counts are of what *would* wait for an
accelerator if the tensors were on one: an op on a tensor that stays on the host there
(a draw from a CPU generator, a Python scalar wrapped in a tensor) counts as well.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]
TORCH_DIR = str(Path(torch.__file__).parent)
HERE = str(Path(__file__).resolve())

# Ops that always read the device: a Python scalar or bool out of a tensor, or an output
# whose size depends on the data (the host must know it to allocate the result).
ALWAYS = frozenset(
    {
        "aten._local_scalar_dense",  # .item(), float(t), int(t), bool(t), `if t:`
        "aten.nonzero",  # torch.nonzero, torch.where(cond), argwhere
        "aten.masked_select",
        "aten._unique",
        "aten._unique2",
        "aten.unique_dim",
        "aten.unique_consecutive",
        "aten.unique_dim_consecutive",
        "aten.equal",  # a Python bool
        "aten.allclose",  # a Python bool
        "aten._linalg_check_errors",  # reads LAPACK's info (linalg.solve, inv, cholesky)
        "aten.bincount",  # CUDA reads the input's min and max to size the bins
    }
)
# Indexing ops that sync only with a boolean (or uint8) mask among their indices: the mask
# becomes indices by nonzero first. Integer indices are checked on the device.
MASK_INDEXED = frozenset(
    {"aten.index", "aten.index_put_", "aten.index_put", "aten._index_put_impl_"}
)


def mask_indexed(args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
    indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
    return any(
        isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices
    )


def unsized_repeat(args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
    """repeat_interleave with tensor repeats and no output_size sums the repeats on the host."""
    repeats = args[1] if len(args) > 1 else kwargs.get("repeats", args[0] if args else None)
    return isinstance(repeats, torch.Tensor) and kwargs.get("output_size") is None


def tensor_fill(args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
    """masked_fill with a 0-dim tensor value reads that value (CUDA: ``value.item()``)."""
    value = args[2] if len(args) > 2 else kwargs.get("value")
    return isinstance(value, torch.Tensor)


def auto_range(args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
    """histc with min == max (its default) reads the input's min and max."""
    low = args[2] if len(args) > 2 else kwargs.get("min", 0)
    high = args[3] if len(args) > 3 else kwargs.get("max", 0)
    return low == high


CONDITIONAL: dict[str, Callable[[Sequence[Any], Mapping[str, Any]], bool]] = {
    **dict.fromkeys(MASK_INDEXED, mask_indexed),
    "aten.repeat_interleave": unsized_repeat,
    "aten.masked_fill": tensor_fill,
    "aten.masked_fill_": tensor_fill,
    "aten.histc": auto_range,
}


def is_sync(name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
    """Whether the ATen op ``name`` (its overload packet, e.g. ``aten.nonzero``) with these
    arguments makes the host wait for the device."""
    if name in ALWAYS:
        return True
    check = CONDITIONAL.get(name)
    return check is not None and check(args, kwargs)


def site(frame: FrameType | None) -> str:
    """Where a sync comes from: the innermost caller outside torch, as a path relative to
    the project or to site-packages, followed by the innermost project frame when that
    caller is a library (``kornia/....py:12 < tasks/augment.py:89``)."""
    outside: str | None = None
    while frame is not None:
        path = frame.f_code.co_filename
        if not path.startswith(TORCH_DIR) and path != HERE:
            where = f"{short_path(path)}:{frame.f_lineno}"
            if path.startswith(str(ROOT)) and "site-packages" not in path:
                return where if outside is None else f"{outside} < {where}"
            outside = outside or where
        frame = frame.f_back
    return outside or "?"


def short_path(path: str) -> str:
    """``path`` relative to site-packages (a library) or to the project."""
    if "site-packages/" in path:
        return path.rsplit("site-packages/", 1)[1]
    try:
        return str(Path(path).relative_to(ROOT))
    except ValueError:
        return path


# Tensor methods that copy to the host: a blocking read of a device tensor.
COPIES = {torch.Tensor.cpu: "Tensor.cpu", torch.Tensor.tolist: "Tensor.tolist"}
# Functions whose CPU kernel reads its input's range with .item() to check it, where an
# accelerator's checks it on the device (F.one_hot: CUDA, MPS, XLA read only the max, and
# only to size the output when num_classes is -1).
DEVICE_CHECKED = frozenset({torch.nn.functional.one_hot})


# How many SyncCounters are counting now (see :func:`counting`).
ACTIVE = 0


def counting() -> bool:
    """Whether a :class:`SyncCounter` is counting: code with a CPU-only shortcut that
    reads tensors back (free on the host) takes its accelerator path instead, so that
    what is counted is what an accelerator would run."""
    return ACTIVE > 0


class SyncCounter(TorchDispatchMode):
    """Counts, by op, the ATen ops that force a device-to-host read on an accelerator.

    Always: ``aten._local_scalar_dense`` (``.item()``, ``float(t)``, ``int(t)``,
    ``bool(t)``, a Python ``if`` on a tensor), ``aten.nonzero`` and ``aten.masked_select``
    and the ``aten.unique*`` ops (their output size depends on the data), ``aten.equal``
    and ``aten.allclose`` (a Python bool), ``aten._linalg_check_errors`` (reads LAPACK's
    error codes), ``aten.bincount`` (CUDA reads the input's min and max to size its
    output). With some arguments only: ``aten.index`` / ``aten.index_put_`` with a
    boolean mask (the mask goes through nonzero), ``aten.repeat_interleave`` with tensor
    repeats and no ``output_size``, ``aten.masked_fill`` with a tensor value (CUDA:
    ``value.item()``), ``aten.histc`` with min == max (reads the input's range), and
    ``F.one_hot`` with num_classes -1 (reads the max; counted as ``aten._local_scalar_dense``).

    Not syncs: ``aten.nonzero_static`` (fixed size), ``aten.masked_scatter_`` (CUDA checks
    its size with a device assert), ``torch.where(c, a, b)``, integer indexing (bounds
    checked on the device), sorting and top-k, and the range checks of
    :data:`DEVICE_CHECKED` functions, which only their CPU kernels make.

    The tensor methods that copy to the host (``.cpu()``, ``.tolist()``) reach no ATen op
    on a CPU tensor; they are counted apart, in ``host_copies`` (a ``TorchFunctionMode``
    entered with this one), and left out of ``total``.

    ``counts``: syncs by op (overload packet, e.g. ``aten.nonzero``); with ``sites``,
    ``sites`` and ``host_copy_sites`` count them by (op, where from: see :func:`site`).
    """

    def __init__(self, sites: bool = False) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()
        self.sites: Counter[tuple[str, str]] = Counter()
        self.host_copies: Counter[str] = Counter()
        self.host_copy_sites: Counter[tuple[str, str]] = Counter()
        self.record_sites = sites
        self.calls = TensorCalls(self)
        self.device_checked = 0  # depth inside DEVICE_CHECKED functions

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def add(self, name: str, frame: FrameType | None, copy: bool = False) -> None:
        """Count one sync (or, with ``copy``, one host copy) of ``name`` called from ``frame``."""
        counts, sites = (
            (self.host_copies, self.host_copy_sites) if copy else (self.counts, self.sites)
        )
        counts[name] += 1
        if self.record_sites:
            sites[(name, site(frame))] += 1

    def __enter__(self) -> SyncCounter:
        global ACTIVE
        self.calls.__enter__()
        ACTIVE += 1
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        global ACTIVE
        super().__exit__(*exc)
        ACTIVE -= 1
        self.calls.__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func.overloadpacket)
        if not self.device_checked and is_sync(name, args, kwargs):
            self.add(name, sys._getframe(1))
        return func(*args, **kwargs)


class TensorCalls(TorchFunctionMode):
    """What a :class:`SyncCounter` needs to see above the dispatcher: host copies, and the
    :data:`DEVICE_CHECKED` functions (their CPU-only range reads are not counted)."""

    def __init__(self, counter: SyncCounter) -> None:
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        counter = self.counter
        if func in COPIES:
            counter.add(COPIES[func], sys._getframe(1), copy=True)
        if func not in DEVICE_CHECKED:
            return func(*args, **kwargs)
        if (args[1] if len(args) > 1 else kwargs.get("num_classes", -1)) == -1:
            counter.add("aten._local_scalar_dense", sys._getframe(1))
        counter.device_checked += 1
        try:
            return func(*args, **kwargs)
        finally:
            counter.device_checked -= 1

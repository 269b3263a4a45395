"""Cohort execution's wire format (simulation.execution: cohort), shared by both apps.

In cohort mode a simulated SuperNode is a worker: one TRAIN message carries several
clients' messages, and one reply carries their replies. Each client's records travel
under ``c<partition>.<name>`` (``c3.arrays``, ``c3.config``); the ``cohort`` ConfigRecord
lists the partitions in order. A record object that several clients share (the round's
start model, a payload) travels once: the other clients' keys point to it in the
``cohort-links`` ConfigRecord. A client that raised inside the worker has its traceback
under its partition in the reply's ``cohort-errors`` ConfigRecord, and no records.

Partial sums (simulation.partial_sums): where the server's rule is a plain mean, its
message asks for them (``sum``: the weights, ``examples`` or ``equal``; ``sum-keys``: the
classifier's keys when eq. 8's diversity is wanted). The worker then replies, for the
clients whose models pass the server's check, their records without ``arrays`` and one
float64 sum under ``cohort-sum`` (and eq. 8's terms under ``cohort-eq8``), listed in the
``cohort`` record (``summed``, their weights' ``sum-weight``, ``spread``, and each one's
``arrays-bytes`` and ``dense-bytes``: what its model would have cost, for the byte counts).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from tasks.aggregate import PartialSum

COHORT = "cohort"
LINKS = "cohort-links"
ERRORS = "cohort-errors"
SUM = "cohort-sum"
EQ8 = "cohort-eq8"


@dataclass(frozen=True)
class SumRequest:
    """What the server asks a worker to sum: the weights (``examples``: each client's
    num-examples, FedAvg; ``equal``: 1 each, SSFL eq. 4-5) and eq. 8's classifier keys."""

    weights: str
    diversity_keys: tuple[str, ...] = ()


@dataclass
class ReturnedSum:
    """A worker's partial sum as the server reads it, with what each summed client's model
    would have cost on the wire (serialised, dense float32 bytes)."""

    part: PartialSum
    sizes: dict[int, tuple[int, int]]


def client_key(pid: int, name: str) -> str:
    """Where client ``pid``'s record ``name`` travels."""
    return f"c{pid}.{name}"


def is_cohort(content: RecordDict) -> bool:
    """Whether a message is a cohort (several clients), not one client's."""
    return COHORT in content.config_records


def pack(contents: Mapping[int, RecordDict], errors: Mapping[int, str] | None = None) -> RecordDict:
    """One RecordDict of the clients' ``contents`` (partition -> records), in their order;
    a record object met before travels as a link to its first key."""
    out = RecordDict({COHORT: ConfigRecord({"partitions": [int(p) for p in contents]})})
    first: dict[int, str] = {}
    links: dict[str, str] = {}
    for pid, content in contents.items():
        for name, record in content.items():
            key = client_key(pid, name)
            if id(record) in first:
                links[key] = first[id(record)]
                continue
            first[id(record)] = key
            out[key] = record
    if links:
        out[LINKS] = ConfigRecord(links)
    if errors:
        out[ERRORS] = ConfigRecord({str(pid): reason for pid, reason in errors.items()})
    return out


def unpack(content: RecordDict) -> tuple[dict[int, RecordDict], dict[int, str]]:
    """The clients' RecordDicts by partition (in the cohort's order; links resolved to the
    same record object) and the errors of those that raised."""
    pids = [int(p) for p in content[COHORT]["partitions"]]
    links = content.config_records.get(LINKS, {})
    contents: dict[int, RecordDict] = {pid: RecordDict() for pid in pids}
    for key in [*(k for k in content if k.startswith("c") and "." in k), *links]:
        head, name = key.split(".", 1)
        if not head[1:].isdigit() or int(head[1:]) not in contents:
            continue
        contents[int(head[1:])][name] = content[str(links.get(key, key))]
    errors = {int(p): str(r) for p, r in content.config_records.get(ERRORS, {}).items()}
    for pid in errors:
        contents.pop(pid, None)
    return contents, errors


def assign(
    partitions: list[int], workers: int, costs: Mapping[int, float] | None = None
) -> list[list[int]]:
    """The round's partitions over ``workers``, sorted each.

    Without ``costs``: partition p to worker p mod workers, so a client's worker, and the
    worker's kept client state, never change. With each partition's expected cost: longest
    first, each to the worker with the least cost so far (the lowest index on ties), so a
    round of sampled clients does not wait on a worker given most of them (10 of 100 on two
    workers by p mod 2: 6.2 clients on the busier one on average, against 5). Equal costs
    and every client sampled give the p mod workers split."""
    out: list[list[int]] = [[] for _ in range(workers)]
    if costs is None:
        for pid in sorted(partitions):
            out[pid % workers].append(pid)
        return out
    loads = [0.0] * workers
    for pid in sorted(partitions, key=lambda p: (-costs[p], p)):
        worker = min(range(workers), key=lambda w: (loads[w], w))
        out[worker].append(pid)
        loads[worker] += costs[pid]
    return [sorted(pids) for pids in out]


def ask_for_sums(content: RecordDict, request: SumRequest) -> None:
    """Add ``request`` to a packed cohort message."""
    record = content[COHORT]
    record["sum"] = request.weights
    if request.diversity_keys:
        record["sum-keys"] = list(request.diversity_keys)


def sum_request(content: RecordDict) -> SumRequest | None:
    """The partial sum a cohort message asks for (None: every client's model)."""
    record = content[COHORT]
    if "sum" not in record:
        return None
    return SumRequest(str(record["sum"]), tuple(str(k) for k in record.get("sum-keys", [])))


def array_sizes(record: ArrayRecord) -> tuple[int, int]:
    """A record's arrays as serialised, and as dense float32 tensors (bytes)."""
    arrays = list(record.values())
    return sum(len(a.data) for a in arrays), sum(4 * int(np.prod(a.shape)) for a in arrays)


def attach_sum(content: RecordDict, returned: ReturnedSum) -> None:
    """Add a worker's partial sum to its packed reply."""
    part = returned.part
    record = content[COHORT]
    record["summed"] = [int(p) for p in part.pids]
    record["sum-weight"] = float(part.weight)
    record["arrays-bytes"] = [returned.sizes[p][0] for p in part.pids]
    record["dense-bytes"] = [returned.sizes[p][1] for p in part.pids]
    content[SUM] = ArrayRecord(array_dict={k: Array(v) for k, v in part.sums.items()})
    if part.update_sum is not None:
        record["spread"] = float(part.spread)
        content[EQ8] = ArrayRecord(array_dict={"u": Array(part.update_sum)})


def returned_sum(content: RecordDict) -> ReturnedSum | None:
    """The partial sum a cohort reply carries (None: none)."""
    record = content[COHORT]
    if "summed" not in record:
        return None
    pids = [int(p) for p in record["summed"]]
    sums = dict(zip(content[SUM].keys(), content[SUM].to_numpy_ndarrays()))
    part = PartialSum(pids, sums, float(record["sum-weight"]))
    if EQ8 in content.array_records:
        part.spread = float(record["spread"])
        part.update_sum = content[EQ8]["u"].numpy()
    sizes = zip(pids, record["arrays-bytes"], record["dense-bytes"])
    return ReturnedSum(part, {p: (int(a), int(d)) for p, a, d in sizes})

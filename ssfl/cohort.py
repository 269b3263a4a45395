"""Cohort execution's wire format (simulation.execution: cohort), shared by both apps.

In cohort mode a simulated SuperNode is a worker: one TRAIN message carries several
clients' messages, and one reply carries their replies. Each client's records travel
under ``c<partition>.<name>`` (``c3.arrays``, ``c3.config``); the ``cohort`` ConfigRecord
lists the partitions in order. A record object that several clients share (the round's
start model, a payload) travels once: the other clients' keys point to it in the
``cohort-links`` ConfigRecord. A client that raised inside the worker has its traceback
under its partition in the reply's ``cohort-errors`` ConfigRecord, and no records.
"""

from __future__ import annotations

from collections.abc import Mapping

from flwr.app import ConfigRecord, RecordDict

COHORT = "cohort"
LINKS = "cohort-links"
ERRORS = "cohort-errors"


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


def assign(partitions: list[int], workers: int) -> list[list[int]]:
    """The round's partitions over ``workers`` (partition p to worker p mod workers, so a
    client's worker, and the worker's kept client state, never change); sorted each."""
    out: list[list[int]] = [[] for _ in range(workers)]
    for pid in sorted(partitions):
        out[pid % workers].append(pid)
    return out

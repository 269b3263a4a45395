"""Deterministic splits: server labeled set, validation, test, and client partitions.

All index arrays point into the dataset's train arrays (test indices into the
test arrays). A split is a pure function of (dataset, split config, seed) and is
cached per process by :func:`get_split`; a Dirichlet partition (seconds for 100 clients
through flwr-datasets) is also kept on disk (:func:`split_cache_dir`) for every later
process: the ServerApp's, the client actors', the next run's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import os
import zipfile
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from tasks.config import ConfigError
from tasks.data import Dataset, dataset_request, load_dataset
from tasks.settings import DatasetSettings, Settings, SplitSettings, mapping, typed

log = logging.getLogger(__name__)

# FedMatch's class-imbalanced distribution (reference code): client type j puts
# 50% of its data on class j, 15% on each neighbour, and the rest spread thin.
FEDMATCH_BASE_RATIOS = (0.50, 0.15, 0.03, 0.03, 0.03, 0.02, 0.03, 0.03, 0.03, 0.15)


@dataclass
class Split:
    """Index sets of one experiment and a JSON-ready summary of them."""

    server_labeled: np.ndarray
    val: np.ndarray
    test: np.ndarray
    clients: list[np.ndarray]
    client_labeled: list[np.ndarray]
    summary: dict[str, Any] = field(default_factory=dict)


def noniid_r(histograms: np.ndarray) -> float:
    """Non-IID level R (SSFL benchmark, eq. 1): mean pairwise total-variation distance.

    Per class, the sum of |p_a - p_b| over all pairs a < b is that of the sorted column,
    sum_i p_(i) (2i - K + 1) (0-based i): O(K log K) time and O(K) memory, where the K x K
    difference array of K = 10,000 clients would take 8 GB."""
    hist = np.asarray(histograms, dtype=np.float64)
    k = hist.shape[0]
    if k < 2:
        return 0.0
    probs = np.sort(hist / np.maximum(hist.sum(axis=1, keepdims=True), 1.0), axis=0)
    rank_weights = 2.0 * np.arange(k) - (k - 1)
    pair_sums = rank_weights @ probs
    return float(pair_sums.sum() / 2.0 / (k * (k - 1) / 2))


def round_counts(weights: np.ndarray, total: int) -> np.ndarray:
    """Integer counts proportional to ``weights`` that sum to ``total`` (largest remainder)."""
    weights = np.asarray(weights, dtype=np.float64)
    exact = weights / weights.sum() * total
    counts = np.floor(exact).astype(np.int64)
    order = np.argsort(-(exact - counts), kind="stable")
    counts[order[: total - counts.sum()]] += 1
    return counts


class ClassPool:
    """Per-class shuffled index lists to draw from without replacement."""

    def __init__(self, indices: np.ndarray, labels: np.ndarray, num_classes: int, rng):
        self.by_class = [rng.permutation(indices[labels[indices] == c]) for c in range(num_classes)]
        self.used = [0] * num_classes

    def available(self) -> np.ndarray:
        return np.array([len(ix) - u for ix, u in zip(self.by_class, self.used)])

    def take(self, counts: np.ndarray, what: str) -> np.ndarray:
        """Draw ``counts[c]`` unused indices of every class c."""
        short = np.nonzero(np.asarray(counts) > self.available())[0]
        if short.size:
            c = int(short[0])
            raise ConfigError(
                f"split: {what} needs {int(counts[c])} samples of class {c}, "
                f"only {int(self.available()[c])} left; lower split sizes or change the split"
            )
        parts = []
        for c, n in enumerate(counts):
            parts.append(self.by_class[c][self.used[c] : self.used[c] + int(n)])
            self.used[c] += int(n)
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def remaining(self) -> np.ndarray:
        return np.concatenate([ix[u:] for ix, u in zip(self.by_class, self.used)])


def fedmatch_ratios(num_classes: int) -> np.ndarray:
    """FedMatch's class-imbalanced type 0: the reference table for 10 classes; for another
    count (ours) the same shape, 50% on the main class, 15% on each neighbour and the
    other 20% spread evenly over the remaining classes."""
    if num_classes == len(FEDMATCH_BASE_RATIOS):
        return np.asarray(FEDMATCH_BASE_RATIOS)
    if num_classes < 4:
        raise ConfigError(
            f"config key 'split.partitioner': fedmatch_imbalanced needs at least 4 classes, "
            f"the dataset has {num_classes}"
        )
    ratios = np.full(num_classes, 0.20 / (num_classes - 3))
    ratios[0], ratios[1], ratios[-1] = 0.50, 0.15, 0.15
    return ratios


def _balanced(total: int, num_classes: int) -> np.ndarray:
    return round_counts(np.ones(num_classes), total)


def partition_class_counts(
    partitioner: str,
    num_clients: int,
    client_size: int,
    num_classes: int,
    scfg: SplitSettings,
    rng: np.random.Generator,
) -> np.ndarray:
    """Per-client class counts (num_clients x num_classes) of the count-based partitioners."""
    rows = []
    for k in range(num_clients):
        if partitioner == "iid":
            weights = np.ones(num_classes)
        elif partitioner == "random_classes":
            # FedSEAL 5.1 non-IID: "the class distribution is randomly generated";
            # we draw it uniformly from the simplex, i.e. Dirichlet(1, ..., 1).
            weights = rng.dirichlet(np.ones(num_classes))
        elif partitioner == "fedmatch_imbalanced":
            weights = np.roll(fedmatch_ratios(num_classes), k % num_classes)
        elif partitioner == "noniid_r":
            # SSFL benchmark, App. A.2: R of the client from its main class, 1 - R spread by Q.
            target = scfg.target_r
            weights = (1.0 - target) * np.full(num_classes, 1.0 / num_classes)
            weights[k % num_classes] += target
        else:
            raise ConfigError(f"config key 'split.partitioner': unknown {partitioner!r}")
        # Rotate tie-breaks so the rounding remainder does not always hit the same classes.
        rows.append(np.roll(round_counts(np.roll(weights, -k), client_size), k))
    return np.stack(rows)


def remaining_class_counts(
    partitioner: str, num_clients: int, available: np.ndarray, target_r: float
) -> np.ndarray:
    """Per-client class counts that share out all ``available`` samples (client_size 0).

    SSFL benchmark App. A.2: with n_i samples of class i left, Q = n / sum(n) and m_j
    users whose main class is j (user k's main class is k mod d), a user of main class j
    gets R n_j / m_j of class j plus (1 - R) n_i q_j / m_j of every class i. ``iid``
    gives every user n_i / K of every class. Rounding is per class (largest remainder),
    so no class is over-drawn; client sizes follow the classes' sizes.
    """
    avail = np.asarray(available, dtype=np.float64)
    d = len(avail)
    if partitioner == "iid":
        frac = np.full((num_clients, d), 1.0 / num_clients)
    else:
        main = np.arange(num_clients) % d
        m = np.bincount(main, minlength=d)[main]
        q = avail / avail.sum()
        frac = np.repeat(((1.0 - target_r) * q[main] / m)[:, None], d, axis=1)
        frac[np.arange(num_clients), main] += target_r / m
    columns = [
        round_counts(frac[:, i], int(np.floor(avail[i] * frac[:, i].sum() + 1e-9)))
        for i in range(d)
    ]
    return np.stack(columns, axis=1)


def _dirichlet_partitions(
    pool: ClassPool, labels: np.ndarray, scfg: SplitSettings, num_classes: int, seed: int
) -> list[np.ndarray]:
    """Dirichlet(alpha) label skew (flwr-datasets) over num_clients * client_size samples,
    read from the on-disk cache when these exact inputs were partitioned before."""
    total = scfg.num_clients * scfg.client_size
    chosen = pool.take(_balanced(total, num_classes), "the dirichlet pool")
    path = split_cache_dir() / f"dirichlet-{_dirichlet_key(chosen, labels, scfg, seed)}.npz"
    cached = _read_partitions(path)
    if cached is not None:
        return cached
    parts = _flwr_dirichlet(chosen, labels, scfg, seed)
    _write_partitions(path, parts)
    return parts


def _flwr_dirichlet(
    chosen: np.ndarray, labels: np.ndarray, scfg: SplitSettings, seed: int
) -> list[np.ndarray]:
    import datasets as hf
    from flwr_datasets.partitioner import DirichletPartitioner

    table = hf.Dataset.from_dict({"idx": chosen.tolist(), "label": labels[chosen].tolist()})
    part = DirichletPartitioner(
        num_partitions=scfg.num_clients,
        partition_by="label",
        alpha=scfg.dirichlet_alpha,
        min_partition_size=1,
        self_balancing=False,
        shuffle=True,
        seed=seed,
    )
    part.dataset = table
    return [
        np.asarray(part.load_partition(k)["idx"], dtype=np.int64) for k in range(scfg.num_clients)
    ]


def split_cache_dir() -> Path:
    """Where partitions that take seconds to draw are kept: $SSFL_CACHE_DIR, else
    ~/.cache/ssfl (they are a pure function of their key, so any process may reuse them)."""
    return Path(os.environ.get("SSFL_CACHE_DIR") or Path.home() / ".cache" / "ssfl")


def _dirichlet_key(chosen: np.ndarray, labels: np.ndarray, scfg: SplitSettings, seed: int) -> str:
    """A hash of every input of :func:`_flwr_dirichlet`, and of the libraries that draw it."""
    digest = hashlib.sha256()
    for lib in ("flwr-datasets", "datasets", "numpy"):
        digest.update(f"{lib}=={metadata.version(lib)};".encode())
    digest.update(f"{scfg.num_clients};{scfg.dirichlet_alpha!r};{seed};".encode())
    digest.update(np.ascontiguousarray(chosen, dtype=np.int64).tobytes())
    digest.update(np.ascontiguousarray(labels[chosen], dtype=np.int64).tobytes())
    return digest.hexdigest()[:32]


def _read_partitions(path: Path) -> list[np.ndarray] | None:
    """The partitions saved at ``path``; None when absent or unreadable (drawn again)."""
    try:
        with np.load(path) as saved:
            return np.split(saved["indices"], saved["offsets"][1:-1])
    except (OSError, EOFError, KeyError, ValueError, zipfile.BadZipFile):
        return None


def _write_partitions(path: Path, parts: list[np.ndarray]) -> None:
    """Save atomically (a concurrent reader sees the whole file or none); a cache that
    cannot be written is skipped with a warning (every process then draws it again)."""
    offsets = np.cumsum([0, *(len(p) for p in parts)])
    tmp = path.with_name(f"{path.stem}.{os.getpid()}.partial.npz")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(tmp, indices=np.concatenate(parts), offsets=offsets)
        os.replace(tmp, path)
    except OSError as err:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        log.warning("split cache not written (%s): each process draws the partition again", err)


def _client_indices(
    pool: ClassPool, labels: np.ndarray, scfg: SplitSettings, k: int, seed: int, rng
) -> list[np.ndarray]:
    """Draw every client's samples from what the server and validation sets left."""
    num_clients = scfg.num_clients
    if scfg.client_size == 0 and scfg.partitioner in ("iid", "noniid_r"):
        counts = remaining_class_counts(
            scfg.partitioner, num_clients, pool.available(), scfg.target_r
        )
    else:
        if scfg.client_size == 0:
            scfg = dataclasses.replace(scfg, client_size=int(pool.available().sum()) // num_clients)
        if scfg.partitioner == "dirichlet":
            return _dirichlet_partitions(pool, labels, scfg, k, seed)
        counts = partition_class_counts(
            scfg.partitioner, num_clients, scfg.client_size, k, scfg, rng
        )
    return [pool.take(row, f"client {i}") for i, row in enumerate(counts)]


def histogram(labels: np.ndarray, idx: np.ndarray, num_classes: int) -> list[int]:
    return np.bincount(labels[idx], minlength=num_classes).astype(int).tolist()


def make_split(ds: Dataset, scfg: SplitSettings, seed: int) -> Split:
    """Build the split of FedSEAL 5.1 / FedMatch / SSFL App. A.2, deterministic from the seed
    (``split.scenario: open_world``: FedoSSL's, :func:`open_world_split`)."""
    if scfg.scenario == "open_world":
        return open_world_split(ds, scfg, seed)
    rng = np.random.default_rng(seed)
    labels = ds.train_y.numpy()
    k = ds.num_classes
    pool = ClassPool(np.arange(len(labels)), labels, k, rng)
    server = pool.take(np.full(k, scfg.labeled_per_class), "the server labeled set")
    val = pool.take(_balanced(scfg.val_size, k), "the validation set")
    clients = _client_indices(pool, labels, scfg, k, seed, rng)
    clients = [rng.permutation(c) for c in clients]
    client_labeled = [_client_labeled(c, labels, k, scfg.client_labeled_per_class) for c in clients]
    _check_clients(clients, client_labeled, scfg)
    test = _test_indices(ds, scfg.test_size, rng)
    hists = np.array([histogram(labels, c, k) for c in clients])
    summary = {
        "server_labeled": len(server),
        "val": len(val),
        "test": len(test),
        "num_clients": len(clients),
        "client_sizes": [len(c) for c in clients],
        "client_labeled_sizes": [len(c) for c in client_labeled],
        "server_histogram": histogram(labels, server, k),
        "client_histograms": hists.tolist(),
        "noniid_r": round(noniid_r(hists), 6),
        "partitioner": scfg.partitioner,
    }
    return Split(server, val, test, clients, client_labeled, summary)


def _check_clients(
    clients: list[np.ndarray], client_labeled: list[np.ndarray], scfg: SplitSettings
) -> None:
    """Every client holds images, and enough unlabeled ones for its streaming steps."""
    empty = [i for i, c in enumerate(clients) if len(c) == 0]
    if empty:
        raise ConfigError(
            f"config key 'split.num_clients': {len(clients)} clients leave client {empty[0]} "
            "without images; lower it or make the server's and validation sets smaller"
        )
    unlabeled = min(len(c) - len(lab) for c, lab in zip(clients, client_labeled))
    if scfg.stream_steps > unlabeled:
        raise ConfigError(
            f"config key 'split.stream_steps': must be <= the smallest client's {unlabeled} "
            f"unlabeled images, got {scfg.stream_steps}"
        )


def _client_labeled(client: np.ndarray, labels: np.ndarray, k: int, per_class: int) -> np.ndarray:
    """Labels-at-client: the first ``per_class`` samples of each class in the client's order."""
    if per_class == 0:
        return np.zeros(0, dtype=np.int64)
    picked = [client[labels[client] == c][:per_class] for c in range(k)]
    return np.concatenate(picked)


def _test_indices(ds: Dataset, size: int, rng) -> np.ndarray:
    """A class-balanced random subset of the test set (all of it when size is 0)."""
    n = len(ds.test_y)
    if size == 0 or size == n:
        return np.arange(n)
    if size > n:
        raise ConfigError(f"config key 'split.test_size': {size} > {n} test images")
    labels = ds.test_y.numpy()
    pool = ClassPool(np.arange(n), labels, ds.num_classes, rng)
    return np.sort(pool.take(_balanced(size, ds.num_classes), "the test set"))


# ----- FedoSSL's open world (Definition 1, section 5) -----------------------------------
SEEN, LOCALLY_UNSEEN, GLOBALLY_UNSEEN = "S", "L", "G"


def class_roles(spec: str, num_classes: int) -> str:
    """One role letter per class: S seen, L locally unseen (unlabeled at every client), G
    globally unseen (unlabeled at some clients). "" = FedoSSL section 5's default: the first
    60% of the classes seen, the next one locally unseen, the rest globally unseen."""
    if not spec:
        seen = round(0.6 * num_classes)
        lu = 1 if num_classes - seen > 1 else 0
        return SEEN * seen + LOCALLY_UNSEEN * lu + GLOBALLY_UNSEEN * (num_classes - seen - lu)
    if len(spec) != num_classes or set(spec) - {SEEN, LOCALLY_UNSEEN, GLOBALLY_UNSEEN}:
        raise ConfigError(
            f"config key 'split.class_roles': {spec!r} must give one of S, L, G to each of "
            f"the {num_classes} classes"
        )
    return spec


def globally_unseen_holders(num_gu: int, num_clients: int) -> list[list[int]]:
    """Clients holding each globally unseen class: contiguous groups of ceil(K / G) clients
    (official code, 5 clients: [0, 1], [2, 3], [4]; the note's Fashion-MNIST setting, 10
    clients: 0-3, 4-7, 8-9); when that leaves a class without clients (4 clients, 3 classes),
    near-equal contiguous groups (ours)."""
    width = -(-num_clients // max(num_gu, 1))
    if width * (num_gu - 1) >= num_clients:
        parts = np.array_split(np.arange(num_clients), num_gu)
        return [part.tolist() for part in parts]
    return [[k for k in range(num_clients) if k // width == g] for g in range(num_gu)]


def client_classes(roles: str, num_clients: int) -> list[list[int]]:
    """The classes each client holds: all seen and locally unseen ones plus its globally
    unseen ones; a ConfigError (one line) when a client would have no unseen class or a
    globally unseen class no client."""
    shared = [c for c, r in enumerate(roles) if r in (SEEN, LOCALLY_UNSEEN)]
    gu = [c for c, r in enumerate(roles) if r == GLOBALLY_UNSEEN]
    holders = globally_unseen_holders(len(gu), num_clients)
    if any(not h for h in holders):
        raise ConfigError(
            f"config key 'split.class_roles': {len(gu)} globally unseen classes need at least "
            f"{len(gu)} clients (split.role_clients / split.num_clients), got {num_clients}"
        )
    for c, h in zip(gu, holders):
        if num_clients > 1 and len(h) == num_clients:
            raise ConfigError(
                f"config key 'split.class_roles': globally unseen class {c} would be at every "
                "client, which Definition 1 calls locally unseen; mark it L"
            )
    out = [sorted(shared + [c for c, h in zip(gu, holders) if k in h]) for k in range(num_clients)]
    for k, classes in enumerate(out):
        if all(roles[c] == SEEN for c in classes):
            raise ConfigError(
                f"config key 'split.class_roles': client {k} would hold no unseen class "
                f"(roles {roles!r}); give it a locally or globally unseen class"
            )
    return out


def open_world_split(ds: Dataset, scfg: SplitSettings, seed: int) -> Split:
    """FedoSSL's open-world split (Definition 1 and the official code's class sets).

    Classes take the roles of ``split.class_roles``; every client holds every seen class, a
    ``split.labeled_fraction`` of each labeled, the rest unlabeled, every locally unseen
    class (unlabeled) and its globally unseen classes (unlabeled). Each class's samples
    (after the validation set; at most ``split.samples_per_class``, 0 = all) are shared
    evenly and disjointly among the clients holding it. Roles are computed over
    ``split.role_clients`` clients (0 = num_clients), merged into num_clients in order (one
    client: the centralized baseline on the same data). No server labels."""
    rng = np.random.default_rng(seed)
    labels = ds.train_y.numpy()
    k, num_clients = ds.num_classes, scfg.num_clients
    role_clients = scfg.role_clients or num_clients
    if role_clients < num_clients:
        raise ConfigError(
            f"config key 'split.role_clients': {role_clients} < split.num_clients ({num_clients})"
        )
    roles = class_roles(scfg.class_roles, k)
    holders_of = client_classes(roles, role_clients)
    pool = ClassPool(np.arange(len(labels)), labels, k, rng)
    val = pool.take(_balanced(scfg.val_size, k), "the validation set")
    labeled: list[list[np.ndarray]] = [[] for _ in range(role_clients)]
    unlabeled: list[list[np.ndarray]] = [[] for _ in range(role_clients)]
    for c in range(k):
        holders = [v for v in range(role_clients) if c in holders_of[v]]
        rest = pool.by_class[c][pool.used[c] :]
        if scfg.samples_per_class:
            rest = rest[: scfg.samples_per_class]
        n_lab = round(scfg.labeled_fraction * len(rest)) if roles[c] == SEEN else 0
        for target, part in ((labeled, rest[:n_lab]), (unlabeled, rest[n_lab:])):
            bounds = np.concatenate([[0], np.cumsum(_balanced(len(part), len(holders)))])
            for v, lo, hi in zip(holders, bounds[:-1], bounds[1:]):
                target[v].append(part[lo:hi])
    merged = [v * num_clients // role_clients for v in range(role_clients)]

    def gather(parts: list[list[np.ndarray]], client: int) -> np.ndarray:
        chunks = [a for v in range(role_clients) if merged[v] == client for a in parts[v]]
        return np.concatenate(chunks).astype(np.int64) if chunks else np.zeros(0, np.int64)

    client_labeled = [gather(labeled, i) for i in range(num_clients)]
    clients = [
        rng.permutation(np.concatenate([client_labeled[i], gather(unlabeled, i)]))
        for i in range(num_clients)
    ]
    test = _test_indices(ds, scfg.test_size, rng)
    hists = np.array([histogram(labels, c, k) for c in clients])
    summary = {
        "server_labeled": 0,
        "val": len(val),
        "test": len(test),
        "num_clients": num_clients,
        "client_sizes": [len(c) for c in clients],
        "client_labeled_sizes": [len(c) for c in client_labeled],
        "client_histograms": hists.tolist(),
        "client_labeled_histograms": [histogram(labels, c, k) for c in client_labeled],
        "noniid_r": round(noniid_r(hists), 6),
        "partitioner": "open_world",
        "class_roles": {
            "roles": roles,
            "seen": [c for c, r in enumerate(roles) if r == SEEN],
            "locally_unseen": [c for c, r in enumerate(roles) if r == LOCALLY_UNSEEN],
            "globally_unseen": [c for c, r in enumerate(roles) if r == GLOBALLY_UNSEEN],
            "client_classes": [
                sorted({c for v in range(role_clients) if merged[v] == i for c in holders_of[v]})
                for i in range(num_clients)
            ],
        },
    }
    return Split(np.zeros(0, np.int64), val, test, clients, client_labeled, summary)


def split_key(settings: Settings) -> str:
    """What an experiment's split depends on (its dataset, split and seed sections) as
    JSON: the key of the per-process caches of splits and client partitions."""
    inputs = {
        "dataset": mapping(settings.dataset),
        "split": mapping(settings.split),
        "seed": settings.seed,
    }
    return json.dumps(inputs, sort_keys=True)


@functools.lru_cache(maxsize=4)
def split_of_key(key: str) -> tuple[Dataset, Split]:
    """Dataset and split of a :func:`split_key`, computed once per process."""
    inputs = json.loads(key)
    ds = load_dataset(dataset_request(typed(DatasetSettings, inputs["dataset"])))
    return ds, make_split(ds, typed(SplitSettings, inputs["split"]), inputs["seed"])


def get_split(settings: Settings) -> tuple[Dataset, Split]:
    """Dataset and split of an experiment, computed once per process."""
    return split_of_key(split_key(settings))


def stream_step(server_round: int, steps: int, rounds_per_step: int) -> int:
    """Streaming step t (0-based) of a round (FedMatch 6.1, Streaming-NonIID).

    Each step lasts ``rounds_per_step`` rounds; rounds past the last step stay on it.
    """
    return min(max(server_round - 1, 0) // rounds_per_step, steps - 1)


def stream_slice(n: int, step: int, steps: int) -> slice:
    """Step ``step`` of ``steps`` nearly equal consecutive chunks of a client's n samples."""
    if n < steps:
        raise ValueError(f"{n} unlabeled samples cannot be streamed in {steps} steps")
    return slice(step * n // steps, (step + 1) * n // steps)

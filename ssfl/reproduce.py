"""``ssfl reproduce TABLE``: run a paper table's cells and write our numbers beside the paper's.

Each cell is an experiment plus the column's overrides; a finished cell (a completed
run's results.json in its folder made with the same resolved config) is reused, so an
interrupted reproduction resumes where it stopped; a cell whose config changed or whose
run failed is run again. With
``--seeds`` each cell runs once per seed and the table gives mean ± std over the seeds.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ssfl.cells import Cell, run_cells
from ssfl.experiment import (
    APP_DIR,
    REFUSE,
    CellFolders,
    check_data,
    resolve_experiment,
    reusable_run,
)
from ssfl.registry import settings_of
from tasks.config import ConfigError
from tasks.results import plot_curves


@dataclass(frozen=True)
class Row:
    label: str
    experiment: str | dict[str, str]  # one experiment, or one per column
    paper: dict[str, float]
    # Paper's (S2C, C2S) cost per column as fractions of dense; printed beside ours.
    paper_costs: dict[str, tuple[float, float]] = field(default_factory=dict)
    # The row's own config overrides, before the column's and the command line's.
    sets: tuple[str, ...] = ()

    def experiment_for(self, column: str, folder: str = "") -> str:
        """The cell's experiment file (inside ``folder`` for a table with datasets)."""
        name = self.experiment[column] if isinstance(self.experiment, dict) else self.experiment
        return f"{folder}/{name}" if folder else name


@dataclass(frozen=True)
class Curve:
    """The table's rows drawn as lines (a second figure): the x axis' name and ticks, and per
    series the row label at each tick."""

    x_label: str
    ticks: tuple[str, ...]
    series: dict[str, tuple[str, ...]]


@dataclass(frozen=True)
class Table:
    title: str
    columns: dict[str, list[str]]
    rows: list[Row]
    baseline: str = ""
    notes: list[str] = field(default_factory=list)
    # Also show the clients' averaged local accuracy (the cells set eval.local_models).
    local: bool = False
    # The results.json field tabled (e.g. FedSup's protocol accuracies).
    metric: str = "final_test_accuracy"
    # Tables of the same cells with another metric, written after this one.
    linked: tuple[str, ...] = ()
    # --dataset name -> the experiments folder of the rows' files (first: the default).
    datasets: dict[str, str] = field(default_factory=dict)
    # --dataset name -> the row labels its folder ships, for a setting that runs some of
    # the table's rows only (a dataset not named here runs every row).
    subsets: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # (lower, upper) rows: each row's share of the gap between them, ours and the paper's.
    gap: tuple[str, str] | None = None
    # The rows as lines against a setting (docs' second figure; the baseline as a band).
    curve: Curve | None = None


FMNIST = "experiments/fmnist-las"
STREAM = "experiments/fmnist-streaming"
SCENARIOS = {"Labels-at-Client": "lac", "Labels-at-Server": "las"}


def streaming(name: str) -> dict[str, str]:
    """One Streaming-NonIID experiment per scenario column (FedMatch Table 2)."""
    return {column: f"{STREAM}/{name}_{tag}.yaml" for column, tag in SCENARIOS.items()}


TABLES: dict[str, Table] = {
    "fedseal-table1": Table(
        title="FedSEAL Table 1: test accuracy on Fashion-MNIST (labels-at-server)",
        columns={"Non-IID": ["split.partitioner=random_classes"], "IID": []},
        rows=[
            Row("Server-SL", f"{FMNIST}/server_sl.yaml", {"Non-IID": 0.7971, "IID": 0.8025}),
            Row("FedAvg-SL", f"{FMNIST}/fedavg_sl.yaml", {"Non-IID": 0.8932, "IID": 0.8997}),
            Row(
                "FedAvg-FixMatch",
                f"{FMNIST}/fedavg_fixmatch.yaml",
                {"Non-IID": 0.7873, "IID": 0.7735},
            ),
            Row("FedAvg-UDA", f"{FMNIST}/fedavg_uda.yaml", {"Non-IID": 0.7915, "IID": 0.7995}),
            Row("FedSEAL", f"{FMNIST}/fedseal.yaml", {"Non-IID": 0.8418, "IID": 0.8428}),
            Row("FedMatch", f"{FMNIST}/fedmatch.yaml", {}),
        ],
        baseline="Server-SL",
        notes=[
            "Paper: ResNet-18, rounds not stated. Ours: the experiments' model (small CNN "
            "unless overridden), the same split and seed for every cell.",
            "FedMatch is not in FedSEAL's Table 1 (its Table 2 has it on CIFAR-10): no paper "
            "number.",
        ],
    ),
    "fedmatch-table2": Table(
        title="FedMatch Table 2: Streaming-NonIID Fashion-MNIST, 10 clients, 100 rounds",
        columns={column: [] for column in SCENARIOS},
        rows=[
            Row(
                "FedProx-SL",
                streaming("fedprox_sl"),
                {"Labels-at-Client": 0.8206, "Labels-at-Server": 0.7743},
            ),
            Row(
                "FedProx-UDA",
                streaming("fedprox_uda"),
                {"Labels-at-Client": 0.7371, "Labels-at-Server": 0.8334},
            ),
            Row(
                "FedProx-FixMatch",
                streaming("fedprox_fixmatch"),
                {"Labels-at-Client": 0.6240, "Labels-at-Server": 0.7371},
            ),
            Row(
                "FedMatch",
                streaming("fedmatch"),
                {"Labels-at-Client": 0.7795, "Labels-at-Server": 0.8415},
                paper_costs={"Labels-at-Client": (0.37, 0.48), "Labels-at-Server": (0.14, 0.63)},
            ),
        ],
        notes=[
            "Paper: ResNet-9, averaged local accuracy of the clients, 62,000 unlabeled images. "
            "Ours: small CNN, 10 x 5,000 images (T = 10 steps of 10 rounds), same seed for "
            "every cell; 'ours' is the global model's test accuracy, 'ours, local' the "
            "paper's metric: the mean test accuracy of the clients' models right after "
            "their local training in the last round.",
        ],
        local=True,
    ),
}


# Client-level DP (ours, no paper table): FedSEAL and FedAvg-FixMatch on experiments/fmnist-dp/
# (100 clients, 10 a round, DP-FedAvg's clipping and Gaussian noise on the server) at noise
# multipliers z giving epsilon about 1, 4 and 8 after 100 rounds at delta 1e-5 (docs/privacy.md),
# and without DP; Server-SL spends no client privacy.
DP = "experiments/fmnist-dp"
DP_COLUMN = "Fashion-MNIST"
DP_LEVELS = {"8": "1.0", "4": "1.5", "1": "4.3"}  # epsilon -> z


def private_rows(label: str, file: str) -> list[Row]:
    """A method without DP, then at each epsilon (its z as an override)."""
    rows = [Row(f"{label} without DP", f"{DP}/{file}", {}, sets=("privacy.mode=none",))]
    for eps, z in DP_LEVELS.items():
        sets = (f"privacy.noise_multiplier={z}",)
        rows.append(Row(f"{label} at epsilon {eps}", f"{DP}/{file}", {}, sets=sets))
    return rows


DP_CLIPPING_NORMS = ("0.1", "0.01")  # below the experiments' C = 1.0


def clipping_rows(label: str, file: str) -> list[Row]:
    """Where the accuracy goes (clipping bias against noise): the clipping alone (no noise,
    so no guarantee), and epsilon 8 at smaller clipping norms C (the noise's std z C / n
    falls with C, and so does every clipped update)."""
    rows = [Row(f"{label} clipping only", f"{DP}/{file}", {}, sets=("privacy.noise_multiplier=0",))]
    for norm in DP_CLIPPING_NORMS:
        sets = (f"privacy.noise_multiplier={DP_LEVELS['8']}", f"privacy.clipping_norm={norm}")
        rows.append(Row(f"{label} at epsilon 8 with C = {norm}", f"{DP}/{file}", {}, sets=sets))
    return rows


DP_METHODS = ("FedSEAL", "FedAvg-FixMatch")


def dp_curve() -> Curve:
    """Each DP method's final accuracy at epsilon 1, 4, 8 and without DP (the figure of the
    table asked for: accuracy against epsilon)."""
    levels = sorted(DP_LEVELS, key=float)
    return Curve(
        x_label="epsilon at delta 1e-5 after 100 rounds",
        ticks=(*levels, "no DP"),
        series={
            m: (*(f"{m} at epsilon {eps}" for eps in levels), f"{m} without DP") for m in DP_METHODS
        },
    )


TABLES["dp-fmnist"] = Table(
    title="Client-level DP: test accuracy against epsilon (Fashion-MNIST, 100 clients)",
    columns={DP_COLUMN: []},
    rows=[
        Row("Server-SL", f"{DP}/server_sl.yaml", {}),
        *private_rows("FedSEAL", "fedseal.yaml"),
        *clipping_rows("FedSEAL", "fedseal.yaml"),
        *private_rows("FedAvg-FixMatch", "fedavg_fixmatch.yaml"),
    ],
    baseline="Server-SL",
    curve=dp_curve(),
    notes=[
        "No paper has this table (ours). experiments/fmnist-dp/: 100 clients of 500 images, 10 "
        "a round, 50 labels a class at the server, 100 rounds; DP-FedAvg on the server "
        "(clipping norm 1.0, noise z x 1.0 / 10 on the mean); epsilon at delta 1e-5 from the "
        "RDP accountant (z 1.0, 1.5, 4.3: 7.97, 3.95, 0.99), each cell's epsilon in its "
        "results.json. Server-SL spends no client privacy. 'Clipping only': C = 1.0, no "
        "noise (no guarantee); 'with C = ...': epsilon 8 at that clipping norm. "
        "docs/privacy.md.",
    ],
)


# SSFL benchmark Fig. 2 (left): CIFAR-10, ResNet-18, K = C_k = 10, R = 0.4, N_s = 1000, T = 16
# (section 4, "Experimental comparison"); Server-SL is ours (the server's labels only).
SSFL_COLUMN = "Non-IID"  # R = 0.4 (App. A.2)
SSFL_TABLE = Table(
    title="SSFL benchmark Fig. 2: test accuracy of the four variants (Fashion-MNIST)",
    columns={SSFL_COLUMN: []},
    rows=[
        Row("Server-SL", "server_sl.yaml", {}),
        Row("Traditional self-training", "selftrain_bn.yaml", {SSFL_COLUMN: 0.5210}),
        Row("FedAvg solution (BN)", "crl_bn.yaml", {SSFL_COLUMN: 0.8511}),
        Row("FedAvg solution", "crl_gn.yaml", {SSFL_COLUMN: 0.9283}),
        Row("Grouping-based solution", "grouping_gn.yaml", {SSFL_COLUMN: 0.9338}),
    ],
    baseline="Traditional self-training",
    notes=[
        "Paper: CIFAR-10, ResNet-18 GN (BN for self-training and the FedAvg solution (BN)), "
        "Fig. 2 and the text "
        "beside it (grouping: 0.9283 + 0.0055). Ours (fmnist): Fashion-MNIST, small CNN, the "
        "paper's K, C_k, R, N_s, T, tau and S, 40 rounds; (fmnist-long) 160 rounds, K = 50 "
        "users with C_k = 10 a round, 20 warm-up rounds, parameters-only averaging; "
        "(fmnist-steady) the 40-round files with the server's model weighing 10 in eq. 4 / "
        "eq. 7 and a 10x smaller user lr (ours: every cell steady). Server-SL "
        "(ours) trains the server's 1,000 labeled images in the same rhythm. "
        "docs/ssfl-benchmark.md.",
    ],
    datasets={
        "fmnist": "experiments/ssfl-fmnist",
        "fmnist-long": "experiments/ssfl-fmnist-long",
        "fmnist-steady": "experiments/ssfl-fmnist-steady",
    },
)
TABLES["ssfl-fig2"] = SSFL_TABLE

# SSFL benchmark Table 2 (4.3): FedAvg against grouping-based averaging where C_k = K is
# large. Ours (fmnist): FedRGD with S = 1 (eq. 4's average) and S = 3, K = C_k = 30.
TABLES["ssfl-table2"] = Table(
    title="SSFL benchmark Table 2: FedAvg against grouping-based averaging, C_k = K",
    columns={SSFL_COLUMN: []},
    rows=[
        Row("FedAvg (S = 1)", "grouping_s1.yaml", {SSFL_COLUMN: 0.7084}),
        Row("Grouping-based (S = 3)", "grouping_s3.yaml", {SSFL_COLUMN: 0.8163}),
    ],
    baseline="FedAvg (S = 1)",
    notes=[
        "Paper: EMNIST, K = C_k = 47, S = 5 (the row of Table 2 where grouping matters: "
        "+10.79 points; Cifar-10 0.9283 / 0.9338 and SVHN 0.9483 / 0.9499 with K = C_k = "
        "10 / 20, S = 2). Ours (fmnist): Fashion-MNIST, small CNN with GroupNorm, CRL, "
        "K = C_k = 30, R = 0.4, user lr 0.003, 40 rounds; the two files differ in S only. "
        "docs/ssfl-benchmark.md.",
    ],
    datasets={"fmnist": "experiments/ssfl-fmnist-groups"},
)


FEDSUP_ROWS = {
    "Centralized": "centralized.yaml",
    "Fully Supervised": "fully_supervised.yaml",
    "FixMatch": "fixmatch.yaml",
    "SimCLR": "simclr.yaml",
    "SimSiam": "simsiam.yaml",
    "BYOL": "byol.yaml",
    "FedRGD": "fedrgd.yaml",
    "FedSup": "fedsup.yaml",
    "FedSup N = 0": "fedsup_n0.yaml",
}
# FedSup Tables 6.1 (finetuning) and 6.2 (linear evaluation), CIFAR-10 (IID, Non-IID); the
# paper's Centralized and Fully Supervised rows are their plain test accuracies in both.
FEDSUP_PAPER = {
    "final_finetune_accuracy": {
        "Centralized": (0.5692, 0.5692),
        "Fully Supervised": (0.7950, 0.7730),
        "FixMatch": (0.5976, 0.5962),
        "SimCLR": (0.6150, 0.6138),
        "SimSiam": (0.6108, 0.5856),
        "BYOL": (0.6410, 0.6266),
        "FedRGD": (0.6332, 0.6324),
        "FedSup": (0.6954, 0.6884),
        "FedSup N = 0": (0.5720, 0.5680),  # Table 6.3 (its N = 4 is Table 6.1's FedSup)
    },
    "final_linear_accuracy": {
        "Centralized": (0.5692, 0.5692),
        "Fully Supervised": (0.7950, 0.7730),
        "FixMatch": (0.5952, 0.5940),
        "SimCLR": (0.6070, 0.6034),
        "SimSiam": (0.5944, 0.5720),
        "BYOL": (0.6296, 0.6168),
        "FedSup": (0.6626, 0.6610),
    },
}
FEDSUP_COLUMNS = {"IID": [], "Non-IID": ["split.dirichlet_alpha=0.1"]}
FEDSUP_DATASETS = {
    "fmnist": "experiments/fmnist-fedsup",
    "cifar10": "experiments/cifar10-fedsup",
    "fmnist-room": "experiments/fmnist-fedsup-room",
}
# The 500-label setting runs the two bounds and the rows whose share of the gap it measures.
FEDSUP_SUBSETS = {
    "fmnist-room": (
        "Centralized",
        "Fully Supervised",
        "SimCLR",
        "BYOL",
        "FedSup",
        "FedSup N = 0",
    ),
}
FEDSUP_NOTES = [
    "Paper: CIFAR-10, ResNet-18, 100 rounds, Dirichlet alpha 1e5 / 0.1. Ours (fmnist): "
    "Fashion-MNIST, small CNN, 20 rounds, the same split rules and alphas, the configs' seed "
    "0 unless a Seeds line says otherwise; every row is the protocol on its final global "
    "model (the paper's Centralized and Fully Supervised rows are plain test accuracies); "
    "(fmnist-room) the same with 500 labels at the server. FedSup N = 0: without L_MSE "
    "(Table 6.3's first row).",
    "Gap closed: (row - Centralized) / (Fully Supervised - Centralized) per column, every "
    "row under the table's protocol (ours); 'bounds without the protocol' reads the two bounds "
    "as plain test accuracies, as the paper's tables do.",
]


def fedsup_table(title: str, metric: str, linked: tuple[str, ...] = ()) -> Table:
    """One of FedSup's Tables 6.1/6.2: the same cells, one protocol's accuracy."""
    paper = FEDSUP_PAPER[metric]
    return Table(
        title=title,
        columns=FEDSUP_COLUMNS,
        rows=[
            Row(label, name, dict(zip(FEDSUP_COLUMNS, paper[label])) if label in paper else {})
            for label, name in FEDSUP_ROWS.items()
        ],
        notes=FEDSUP_NOTES,
        metric=metric,
        linked=linked,
        datasets=FEDSUP_DATASETS,
        subsets=FEDSUP_SUBSETS,
        gap=("Centralized", "Fully Supervised"),
    )


TABLES["fedsup-table6"] = fedsup_table(
    "FedSup Table 6.1: test accuracy under finetuning",
    "final_finetune_accuracy",
    linked=("fedsup-table6.2",),
)
TABLES["fedsup-table6.2"] = fedsup_table(
    "FedSup Table 6.2: test accuracy under linear evaluation", "final_linear_accuracy"
)


# FedoSSL Table 2 (CIFAR-10, 10 clients at 50%), All / Seen / LU / GU / AU accuracy, and the
# Fashion-MNIST cells of experiments/fmnist-open/ (ablations: Tables 3-4, not in Table 2).
# Local-N and Cen-N have configs (local_n.yaml, cen_n.yaml) outside the table: the issue's
# CPU table is the rows below, within its 2.5-hour budget.
FEDOSSL_ROWS = {
    "Local-O": "local_o.yaml",
    "Cen-O": "cen_o.yaml",
    "Fed-AO": "fed_ao.yaml",
    "Fed-RO": "fed_ro.yaml",
    "Fed-AN": "fed_an.yaml",
    "Fed-RN": "fed_rn.yaml",
    "SemiFL*": "semifl.yaml",
    "FedoSSL with R_i": "fedossl_with_r.yaml",
    "FedoSSL w/o L_ce": "fedossl_no_ce.yaml",
    "FedoSSL w/o L_cluster": "fedossl_no_cluster.yaml",
    "FedoSSL": "fedossl.yaml",
}
FEDOSSL_PAPER = {  # All, Seen, LU, GU, AU (Table 2; Cen-O and Local-O report no LU / GU)
    "Local-O": (0.6598, 0.7957, None, None, 0.4560),
    "Cen-O": (0.7826, 0.8663, None, None, 0.7195),
    "Fed-AO": (0.6946, 0.8101, 0.8938, 0.4203, 0.5215),
    "Fed-RO": (0.7172, 0.8222, 0.8984, 0.5343, 0.5596),
    "Fed-AN": (0.6658, 0.8418, 0.7876, 0.3758, 0.4015),
    "Fed-RN": (0.6883, 0.8552, 0.7984, 0.4179, 0.4381),
    "SemiFL*": (0.6491, 0.8157, 0.8633, 0.3116, 0.3992),
    "FedoSSL": (0.7626, 0.8429, 0.9068, 0.5969, 0.6422),
}
FEDOSSL_METRICS = {"all": "All", "seen": "Seen", "lu": "LU", "gu": "GU", "unseen": "AU"}
FEDOSSL_PARTS = list(FEDOSSL_METRICS)
FEDOSSL_NOTES = [
    "Paper: CIFAR-10, SimCLR-pretrained ResNet-18, 50 rounds, E = 5, best round. Ours "
    "(fmnist): Fashion-MNIST, small CNN from scratch, 30 rounds, E = 1, the configs' seed 0 "
    "unless a Seeds line says otherwise; 'best' is the best round (the paper's), 'final' the "
    "last round's. Seen: plain accuracy; All, AU, LU, GU: Hungarian-matched (docs/fedossl.md).",
]


def fedossl_table(part: str, best: bool, linked: tuple[str, ...] = ()) -> Table:
    """One accuracy of FedoSSL's Table 2 over its rows, best round or final round."""
    index = FEDOSSL_PARTS.index(part)
    column, which = "Table 2", "best round" if best else "final round"
    paper = {
        label: {column: values[index]}
        for label, values in FEDOSSL_PAPER.items()
        if best and values[index] is not None
    }
    return Table(
        title=f"FedoSSL Table 2: {FEDOSSL_METRICS[part]} accuracy ({which})",
        columns={column: []},
        rows=[Row(label, name, paper.get(label, {})) for label, name in FEDOSSL_ROWS.items()],
        notes=FEDOSSL_NOTES if part == "all" and best else [],
        metric=f"final_{'best_' if best else ''}acc_{part}",
        linked=linked,
        datasets={"fmnist": "experiments/fmnist-open"},
    )


FEDOSSL_LINKED = tuple(
    f"fedossl-table2.{part}{'' if best else '.final'}"
    for best in (True, False)
    for part in FEDOSSL_PARTS
    if (part, best) != ("all", True)
)
TABLES["fedossl-table2"] = fedossl_table("all", True, linked=FEDOSSL_LINKED)
for _name in FEDOSSL_LINKED:
    _part = _name.split(".")[1]
    TABLES[_name] = fedossl_table(_part, not _name.endswith(".final"))


def cell_dir(out: Path, row: Row, column: str) -> Path:
    slug = row.label.lower().replace(" = ", "").replace(" ", "_").replace("-", "_")
    slug = slug.replace("*", "").replace("/", "").replace("(", "").replace(")", "")
    return out / f"{slug}-{column.lower().replace('-', '')}"


def plan_cell(
    experiment: str,
    label: str,
    overrides: list[str],
    rounds: int | None,
    out: Path,
    folders: CellFolders = REFUSE,
) -> dict[str, Any] | Cell:
    """The cell's results when ``out`` holds a completed run of its config, else the run
    to make (a one-line ConfigError now when ``out`` holds another run and ``folders``
    says neither to resume nor to replace it)."""
    settings = settings_of(resolve_experiment(experiment, rounds, None, overrides))
    previous = reusable_run(out, settings)
    if previous is not None:
        return previous
    folders.action(out, settings)
    return Cell("reproduce", label, settings, out, folders)


Results = dict[tuple[str, str], dict[int | None, dict[str, Any]]]
"""Each finished cell's results by (row label, column), then by seed (None: no --seeds)."""
Measure = Callable[[dict[str, Any]], float | None]


@dataclass(frozen=True)
class Spread:
    """A cell's value over its seeds: mean, sample std (0 with one seed), how many seeds."""

    mean: float
    std: float
    n: int


def recorded(name: str) -> Measure:
    """A results.json field, e.g. final_test_accuracy (None: not recorded)."""
    return lambda res: res.get(name)


def last10(metric: str) -> Measure:
    """The mean of ``metric``'s per-round key (``final_`` dropped) over the last 10 rounds.

    Rounds that do not record the key are skipped (None: none of the last 10 does).
    """
    key = metric.removeprefix("final_")

    def average(res: dict[str, Any]) -> float | None:
        found = [r[key] for r in res["rounds"][-10:] if r.get(key) is not None]
        return statistics.fmean(found) if found else None

    return average


def stat(results: Results, label: str, column: str, measure: Measure) -> Spread | None:
    """``measure`` of a cell over its finished seeds (None: not run or not recorded)."""
    found = (measure(res) for res in results.get((label, column), {}).values())
    values = [v for v in found if v is not None]
    if not values:
        return None
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return Spread(statistics.fmean(values), std, len(values))


def mean(value: Spread | None) -> float | None:
    """The spread's mean (None: no value)."""
    return None if value is None else value.mean


def fmt(value: float | None, spec: str, missing: str = "not run") -> str:
    """A number for the table, or ``missing`` ("-" for a number the paper does not have)."""
    return missing if value is None else format(value, spec)


def show(value: Spread | None, seeds: list[int] | None) -> str:
    """Our number: the mean, with seeds ``mean ± std`` (and n when some seeds are missing)."""
    if value is None or not seeds:
        return fmt(mean(value), ".4f")
    text = f"{value.mean:.4f} ± {value.std:.4f}"
    return text if value.n == len(seeds) else f"{text} (n = {value.n})"


def tie(ours: Spread | None, ref: Spread | None, seeds: list[int] | None) -> str:
    """The mark " (tie)" when, with seeds, the means differ by at most twice the larger std."""
    if not seeds or ours is None or ref is None:
        return ""
    return " (tie)" if abs(ours.mean - ref.mean) <= 2 * max(ours.std, ref.std) else ""


def markdown(table: Table, results: Results, seeds: list[int] | None = None) -> str:
    """Our final accuracy beside the paper's, per column; a gain line against the baseline.

    With ``seeds``, ours is the mean ± std over the seeds and a table of the last-10-round
    means follows.
    """
    cols = list(table.columns)
    names = ["ours", "ours, local", "paper"] if table.local else ["ours", "paper"]
    measures = [recorded(table.metric)]
    if table.local:
        measures.append(recorded("final_local_accuracy"))
    head = "| method | " + " | ".join(f"{c} {n}" for c in cols for n in names) + " |"
    lines = [f"### {table.title}", "", head, "|---|" + "---|" * len(names) * len(cols)]
    for row in table.rows:
        cells = []
        for c in cols:
            cells += [show(stat(results, row.label, c, m), seeds) for m in measures]
            cells.append(fmt(row.paper.get(c), ".4f", "-"))
        lines.append(f"| {row.label} | " + " | ".join(cells) + " |")
    lines += gains(table, results, seeds)
    lines += gap_closed(table, results, seeds)
    if table.gap and table.metric != "final_test_accuracy":
        lines += gap_closed(table, results, seeds, raw_bounds=True)
    lines += last_rounds(table, results, seeds)
    lines += costs(table, results)
    rounds = sorted({len(r["rounds"]) for runs in results.values() for r in runs.values()})
    done = f"after {', '.join(map(str, rounds))} rounds" if rounds else "(no cell has finished)"
    what = table.metric.removeprefix("final_").replace("_", " ")
    lines += ["", f"Final {what} {done}{evaluation_point(table.metric)}."]
    lines += seeds_note(table, seeds)
    lines += [f"{note}" for note in table.notes]
    lines += provenance(results)
    return "\n".join(lines)


def evaluation_point(metric: str) -> str:
    """Which model a test-accuracy table shows: the global model after the server's step
    (the clients' average before it is each cell's final_aggregate_accuracy)."""
    if metric != "final_test_accuracy":
        return ""
    return (
        ", of the global model after the server's step where a method has one (the clients' "
        "average before it: final_aggregate_accuracy in each cell's results.json)"
    )


def gains(table: Table, results: Results, seeds: list[int] | None) -> list[str]:
    """Each row's gain over the baseline row, ours (mean; (tie) within the spread) | paper."""
    if not table.baseline:
        return []
    base = next(r for r in table.rows if r.label == table.baseline)
    final = recorded(table.metric)
    lines = []
    for row in table.rows:
        if row is base:
            continue
        cells = []
        for c in table.columns:
            ours, ref = (stat(results, r.label, c, final) for r in (row, base))
            gain = None if ours is None or ref is None else ours.mean - ref.mean
            paper = row.paper.get(c)
            base_paper = base.paper.get(c)
            paper_gain = None if paper is None or base_paper is None else paper - base_paper
            cells.append(
                f"{fmt(gain, '+.4f')}{tie(ours, ref, seeds)} | {fmt(paper_gain, '+.4f', '-')}"
            )
        lines.append(f"| {row.label} - {table.baseline} | " + " | ".join(cells) + " |")
    return lines


def share(value: float | None, lo: float | None, hi: float | None) -> float | None:
    """``value``'s share of the gap from ``lo`` to ``hi`` (None: a number is missing)."""
    if value is None or lo is None or hi is None or hi == lo:
        return None
    return (value - lo) / (hi - lo)


def gap_closed(
    table: Table, results: Results, seeds: list[int] | None = None, raw_bounds: bool = False
) -> list[str]:
    """Each row's share of the gap between the table's lower and upper rows, ours | paper.

    Ours uses the means; with seeds, (tie) marks a row within the spread of the lower row.
    With ``raw_bounds`` the two bound rows are read as plain test accuracies
    (final_test_accuracy, no protocol), the paper's view of FedSup's Tables 6.1-6.2.
    """
    if table.gap is None:
        return []
    low, high = (next(r for r in table.rows if r.label == name) for name in table.gap)
    cols = list(table.columns)
    final = recorded(table.metric)
    bound = recorded("final_test_accuracy") if raw_bounds else final
    name = "gap closed, bounds without the protocol" if raw_bounds else "gap closed"
    head = f"| {name} | " + " | ".join(f"{c} ours | {c} paper" for c in cols) + " |"
    lines = ["", head, "|---|" + "---|---|" * len(cols)]
    for row in table.rows:
        if row in (low, high):
            continue
        cells = []
        for c in cols:
            ours = stat(results, row.label, c, final)
            lo, hi = (stat(results, r.label, c, bound) for r in (low, high))
            part = share(mean(ours), mean(lo), mean(hi))
            mark = "" if part is None else tie(ours, lo, seeds)
            paper = share(row.paper.get(c), low.paper.get(c), high.paper.get(c))
            cells.append(f"{fmt(part, '.0%')}{mark} | {fmt(paper, '.0%', '-')}")
        lines.append(f"| {row.label} | " + " | ".join(cells) + " |")
    return lines


def last_rounds(table: Table, results: Results, seeds: list[int] | None) -> list[str]:
    """With seeds: each cell's mean of the metric over its last 10 rounds, mean ± std."""
    if not seeds:
        return []
    cols = list(table.columns)
    recent = last10(table.metric)
    what = table.metric.removeprefix("final_").replace("_", " ")
    head = f"| {what}, mean of the last 10 rounds | " + " | ".join(f"{c} ours" for c in cols)
    lines = ["", head + " |", "|---|" + "---|" * len(cols)]
    for row in table.rows:
        cells = [show(stat(results, row.label, c, recent), seeds) for c in cols]
        lines.append(f"| {row.label} | " + " | ".join(cells) + " |")
    return lines


def seeds_note(table: Table, seeds: list[int] | None) -> list[str]:
    """The line under a table with seeds: which seeds, what ± is, what (tie) means."""
    if not seeds:
        return []
    gap = f"; a gap closed is (tie) when the row's gain over {table.gap[0]} is" if table.gap else ""
    return [
        f"Seeds {', '.join(map(str, seeds))} (n = {len(seeds)}); ± is the sample std over "
        f"seeds; a gain within twice the larger std is marked (tie){gap}."
    ]


def counted(values: list[str]) -> str:
    """``a (2 cells), b (1 cell)``: each distinct value with how many cells show it."""
    tally = {value: values.count(value) for value in dict.fromkeys(values)}
    return ", ".join(f"{v} ({n} cell{'s' * (n != 1)})" for v, n in tally.items())


def finished_day(res: dict[str, Any]) -> str | None:
    """The UTC day a cell's run finished (its timeline's ``finished``), None if unrecorded."""
    finished = res.get("timeline", {}).get("finished")
    if not isinstance(finished, (int, float)):
        return None
    return datetime.fromtimestamp(finished, tz=timezone.utc).strftime("%Y-%m-%d")


def machine(res: dict[str, Any]) -> str:
    """The CPU a cell ran on, its kernels' instruction set and threads (numbers depend on
    them: docs/reference.md, "Determinism")."""
    host = res.get("host") or {}
    if not host.get("cpu"):
        return "not recorded"
    return f"{host['cpu']} ({host.get('cpu_capability', '?')}, {host.get('threads', '?')} threads)"


def provenance(results: Results) -> list[str]:
    """The line under a table saying what made its cells: commits (results.json's
    code_version), the days they finished, and the machines."""
    cells = [res for runs in results.values() for res in runs.values()]
    if not cells:
        return []
    commits = counted([res.get("code_version") or "not recorded" for res in cells])
    days = sorted(day for day in map(finished_day, cells) if day)
    when = f"finished {days[0]} to {days[-1]}" if days else "finish days not recorded"
    hosts = counted([machine(res) for res in cells])
    return [f"Cells: commit {commits}; {when}; {hosts}."]


def cost_ratio(results: dict[str, Any], sent: str, dense: str) -> float:
    """Bytes sent over all rounds as a fraction of the dense cost."""
    rows = results["rounds"]
    return sum(r[sent] for r in rows) / max(sum(r.get(dense, 0) for r in rows), 1)


def costs(table: Table, results: Results) -> list[str]:
    """Communication of the rows with paper costs: S2C and C2S as fractions of dense.

    With seeds, each fraction is the mean over the seeds.
    """
    rows = [row for row in table.rows if row.paper_costs]
    if not rows:
        return []
    cols = list(table.columns)
    head = "| cost (S2C / C2S) | " + " | ".join(f"{c} ours | {c} paper" for c in cols) + " |"
    lines = ["", head, "|---|" + "---|---|" * len(cols)]
    for row in rows:
        cells = []
        for c in cols:
            runs = list(results.get((row.label, c), {}).values())
            ours = "not run"
            if runs:
                s2c, c2s = (
                    statistics.fmean(
                        cost_ratio(res, f"bytes_{way}", f"bytes_{way}_dense") for res in runs
                    )
                    for way in ("s2c", "c2s")
                )
                ours = f"{s2c:.0%} / {c2s:.0%}"
            paper_s2c, paper_c2s = row.paper_costs[c]
            cells.append(f"{ours} | {paper_s2c:.0%} / {paper_c2s:.0%}")
        lines.append(f"| {row.label} | " + " | ".join(cells) + " |")
    return lines


def experiments_folder(table: Table, dataset: str | None) -> str:
    """The folder of the rows' experiments for ``dataset`` (None: the table's first)."""
    if not table.datasets:
        if dataset is not None:
            raise ConfigError(f"--dataset: {table.title} has one dataset only")
        return ""
    if dataset is None:
        return next(iter(table.datasets.values()))
    if dataset not in table.datasets:
        allowed = ", ".join(table.datasets)
        raise ConfigError(f"--dataset: {dataset!r} is not one of this table's ({allowed})")
    return table.datasets[dataset]


def rows_in(table: Table, dataset: str | None) -> Table:
    """``table`` with the rows ``dataset`` ships (``Table.subsets``; default: every row).

    A row whose experiment file is missing from the dataset's folder, or a subset label that
    names no row: ConfigError naming it, so that a table never shrinks without a word.
    """
    folder = experiments_folder(table, dataset)
    if not folder:
        return table
    name = dataset or next(iter(table.datasets))
    labels = table.subsets.get(name)
    unknown = sorted(set(labels or ()) - {row.label for row in table.rows})
    if unknown:
        raise ConfigError(f"--dataset {name}: the table has no row {', '.join(map(repr, unknown))}")
    kept = [row for row in table.rows if labels is None or row.label in labels]
    for row in kept:
        for column in table.columns:
            path = row.experiment_for(column, folder)
            if not (APP_DIR / path).is_file():
                raise ConfigError(f"--dataset {name}: row {row.label!r} needs {path}, missing")
    return replace(table, rows=kept)


@dataclass(frozen=True)
class Pick:
    """The cells a reproduction runs: rows and columns by name (empty: all of them).

    Cells outside the pick are not run; they are tabled when their finished run is there.
    """

    rows: tuple[str, ...] = ()
    columns: tuple[str, ...] = ()

    def check(self, table: Table) -> None:
        """A name that is not one of the table's rows or columns: ConfigError."""
        for flag, names, known in (
            ("--rows", self.rows, [row.label for row in table.rows]),
            ("--columns", self.columns, list(table.columns)),
        ):
            unknown = [name for name in names if name not in known]
            if unknown:
                raise ConfigError(
                    f"{flag}: {unknown[0]!r} is not one of the table's ({', '.join(known)})"
                )

    def runs(self, row: Row, column: str) -> bool:
        """Whether the pick runs this cell."""
        return (not self.rows or row.label in self.rows) and (
            not self.columns or column in self.columns
        )


ALL = Pick()


def parse_names(text: str | None) -> tuple[str, ...]:
    """``--rows Server-SL,FedSEAL`` -> ("Server-SL", "FedSEAL"); None: ()."""
    return () if text is None else tuple(name.strip() for name in text.split(",") if name.strip())


def parse_seeds(text: str) -> list[int]:
    """``--seeds 0,1,2`` -> [0, 1, 2]; empty, non-integer or repeated seeds: ConfigError."""
    try:
        seeds = [int(item) for item in text.split(",")]
    except ValueError:
        raise ConfigError(
            f"--seeds {text!r}: expected integers separated by commas, e.g. 0,1,2"
        ) from None
    if len(set(seeds)) < len(seeds):
        raise ConfigError(f"--seeds {text!r}: a seed is repeated")
    return seeds


def reproduce(
    name: str,
    out: Path,
    rounds: int | None,
    sets: list[str],
    run: bool = True,
    dataset: str | None = None,
    seeds: list[int] | None = None,
    folders: CellFolders = REFUSE,
    pick: Pick = ALL,
    jobs: int = 1,
) -> str:
    """Run (or reuse) every cell of a table; write table.md and accuracy.png into ``out``.

    With ``run=False`` nothing is run: the table shows the finished cells only; ``pick``
    runs some rows or columns only (the others are tabled when finished). Linked
    tables (the same cells, another metric) follow in table.md. With ``seeds`` every cell
    runs once per seed (in ``seed{S}`` folders), the table shows mean ± std over the seeds
    and ``seeds.json`` holds the numbers. A cell folder holding another run is refused
    before anything runs, unless ``folders`` says to resume or replace it; ``jobs``: cells
    run at once, each in a process of its own (:mod:`ssfl.cells`).
    """
    folder = experiments_folder(TABLES[name], dataset)
    table = rows_in(TABLES[name], dataset)
    pick.check(table)
    results = table_results(table, out, rounds, sets, run, folder, seeds, folders, pick, jobs)
    out.mkdir(parents=True, exist_ok=True)
    tables = (table, *(rows_in(TABLES[linked], dataset) for linked in table.linked))
    text = "\n\n".join(markdown(t, results, seeds) for t in tables)
    (out / "table.md").write_text(text + "\n")
    if seeds:
        summary = seeds_summary(table, results, seeds)
        (out / "seeds.json").write_text(json.dumps(summary, indent=2) + "\n")
    runs = [res for cell in results.values() for res in cell.values()]
    plot_curves(runs, out / "accuracy.png", title=table.title)
    return text


def seeds_summary(table: Table, results: Results, seeds: list[int]) -> dict[str, Any]:
    """seeds.json: per finished cell, each seed's final value and the spreads over seeds."""
    final, recent = recorded(table.metric), last10(table.metric)
    cells = []
    for (label, column), runs in results.items():
        ours, last = (stat(results, label, column, m) for m in (final, recent))
        cells.append(
            {
                "row": label,
                "column": column,
                "values": [final(runs[s]) if s in runs else None for s in seeds],
                "mean": mean(ours),
                "std": None if ours is None else ours.std,
                "last10_mean": mean(last),
                "last10_std": None if last is None else last.std,
                "n": 0 if ours is None else ours.n,
            }
        )
    return {"seeds": seeds, "metric": table.metric, "cells": cells}


def table_results(
    table: Table,
    out: Path,
    rounds: int | None,
    sets: list[str],
    run: bool,
    folder: str,
    seeds: list[int] | None = None,
    folders: CellFolders = REFUSE,
    pick: Pick = ALL,
    jobs: int = 1,
) -> Results:
    """Every finished cell's results by (row label, column) and seed: reused, or run (the
    picked cells, ``jobs`` at once) once every cell to run has been checked."""
    slots: list[tuple[tuple[str, str], int | None, dict[str, Any] | Cell]] = []
    for column, col_overrides in table.columns.items():
        for row in table.rows:
            experiment = row.experiment_for(column, folder)
            overrides = [*row.sets, *col_overrides, *sets]
            picked = run and pick.runs(row, column)
            for seed, where, extra in seed_folders(cell_dir(out, row, column), seeds):
                cell_sets = [*overrides, *extra]
                if picked:
                    plan = plan_cell(experiment, row.label, cell_sets, rounds, where, folders)
                else:
                    settings = settings_of(resolve_experiment(experiment, rounds, None, cell_sets))
                    plan = reusable_run(where, settings)
                if plan is not None:
                    slots.append(((row.label, column), seed, plan))
    to_run = [plan for *_, plan in slots if isinstance(plan, Cell)]
    for cell in to_run:  # every folder was checked first; now every cell's data
        check_data(cell.settings)
    ran = iter(run_cells(to_run, jobs))
    results: Results = {}
    for (label, column), seed, plan in slots:
        res = next(ran) if isinstance(plan, Cell) else plan
        res["name"] = f"{label} ({column})" + ("" if seed is None else f" seed {seed}")
        results.setdefault((label, column), {})[seed] = res
    return results


def seed_folders(out: Path, seeds: list[int] | None) -> list[tuple[int | None, Path, list[str]]]:
    """Each seed's folder and override: ``out/seed{S}`` with ``seed=S``; without seeds the
    one run in ``out`` itself (seed None, no override)."""
    if not seeds:
        return [(None, out, [])]
    return [(seed, out / f"seed{seed}", [f"seed={seed}"]) for seed in seeds]

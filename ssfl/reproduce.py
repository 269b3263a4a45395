"""``ssfl reproduce TABLE``: run a paper table's cells and write our numbers beside the paper's.

Each cell is an experiment plus the column's overrides; a finished cell (a results.json
in its folder made with the same resolved config) is reused, so an interrupted
reproduction resumes where it stopped; a cell whose config changed is run again.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ssfl.experiment import check_data, resolve_experiment, same_config
from ssfl.runner import run_simulation
from tasks.config import ConfigError
from tasks.results import load_results, plot_curves


@dataclass(frozen=True)
class Row:
    label: str
    experiment: str | dict[str, str]  # one experiment, or one per column
    paper: dict[str, float]
    # Paper's (S2C, C2S) cost per column as fractions of dense; printed beside ours.
    paper_costs: dict[str, tuple[float, float]] = field(default_factory=dict)

    def experiment_for(self, column: str, folder: str = "") -> str:
        """The cell's experiment file (inside ``folder`` for a table with datasets)."""
        name = self.experiment[column] if isinstance(self.experiment, dict) else self.experiment
        return f"{folder}/{name}" if folder else name


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
    # (lower, upper) rows: each row's share of the gap between them, ours and the paper's.
    gap: tuple[str, str] | None = None


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


FEDSUP_ROWS = {
    "Centralized": "centralized.yaml",
    "Fully Supervised": "fully_supervised.yaml",
    "FixMatch": "fixmatch.yaml",
    "SimCLR": "simclr.yaml",
    "SimSiam": "simsiam.yaml",
    "BYOL": "byol.yaml",
    "FedRGD": "fedrgd.yaml",
    "FedSup": "fedsup.yaml",
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
FEDSUP_DATASETS = {"fmnist": "experiments/fmnist-fedsup", "cifar10": "experiments/cifar10-fedsup"}
FEDSUP_NOTES = [
    "Paper: CIFAR-10, ResNet-18, 100 rounds, Dirichlet alpha 1e5 / 0.1. Ours (fmnist): "
    "Fashion-MNIST, small CNN, 20 rounds, the same split rules and alphas, seed 0; every row "
    "is the protocol on its final global model (the paper's Centralized and Fully Supervised "
    "rows are plain test accuracies).",
    "Gap closed: (row - Centralized) / (Fully Supervised - Centralized) per column.",
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


def cell_dir(out: Path, row: Row, column: str) -> Path:
    slug = row.label.lower().replace(" ", "_").replace("-", "_")
    return out / f"{slug}-{column.lower().replace('-', '')}"


def run_cell(
    experiment: str,
    label: str,
    overrides: list[str],
    rounds: int | None,
    out: Path,
    run: bool = True,
) -> dict[str, Any] | None:
    """The cell's results: reused when made with the same config, else run (None: not run)."""
    cfg = resolve_experiment(experiment, rounds, None, overrides)
    if (out / "results.json").is_file():
        previous = load_results(out)
        if same_config(previous.get("config", {}), cfg):
            return previous
        if run:
            print(f"ssfl reproduce: {out} has another config's results; rerun", file=sys.stderr)
    if not run:
        return None
    check_data(cfg)
    print(f"ssfl reproduce: {label} -> {out}", file=sys.stderr)
    return run_simulation(cfg, out, stream=False)


def final(
    results: dict[tuple[str, str], dict[str, Any]],
    label: str,
    column: str,
    metric: str = "final_test_accuracy",
) -> float | None:
    """A cell's value of ``metric`` (None: not run or not recorded)."""
    res = results.get((label, column))
    return None if res is None else res.get(metric)


def final_local(
    results: dict[tuple[str, str], dict[str, Any]], label: str, column: str
) -> float | None:
    """A cell's last-round local_accuracy (None: not run or not recorded)."""
    res = results.get((label, column))
    return None if res is None else res.get("final_local_accuracy")


def fmt(value: float | None, spec: str, missing: str = "not run") -> str:
    """A number for the table, or ``missing`` ("-" for a number the paper does not have)."""
    return missing if value is None else format(value, spec)


def markdown(table: Table, results: dict[tuple[str, str], dict[str, Any]]) -> str:
    """Our final accuracy beside the paper's, per column; a gain line against the baseline."""
    cols = list(table.columns)
    names = ["ours", "ours, local", "paper"] if table.local else ["ours", "paper"]
    head = "| method | " + " | ".join(f"{c} {n}" for c in cols for n in names) + " |"
    lines = [f"### {table.title}", "", head, "|---|" + "---|" * len(names) * len(cols)]
    for row in table.rows:
        cells = []
        for c in cols:
            values = [fmt(final(results, row.label, c, table.metric), ".4f")]
            if table.local:
                values.append(fmt(final_local(results, row.label, c), ".4f"))
            values.append(fmt(row.paper.get(c), ".4f", "-"))
            cells += values
        lines.append(f"| {row.label} | " + " | ".join(cells) + " |")
    if table.baseline:
        base = next(r for r in table.rows if r.label == table.baseline)
        for row in table.rows:
            if row is base:
                continue
            gains = []
            for c in cols:
                ours, ref = final(results, row.label, c), final(results, base.label, c)
                gain = None if ours is None or ref is None else ours - ref
                paper = row.paper.get(c)
                paper_gain = None if paper is None else paper - base.paper[c]
                gains.append(f"{fmt(gain, '+.4f')} | {fmt(paper_gain, '+.4f', '-')}")
            lines.append(f"| {row.label} - {table.baseline} | " + " | ".join(gains) + " |")
    lines += gap_closed(table, results)
    lines += costs(table, results)
    rounds = sorted({len(r["rounds"]) for r in results.values()})
    done = f"after {', '.join(map(str, rounds))} rounds" if rounds else "(no cell has finished)"
    what = table.metric.removeprefix("final_").replace("_", " ")
    lines += ["", f"Final {what} {done}."]
    lines += [f"{note}" for note in table.notes]
    return "\n".join(lines)


def gap_closed(table: Table, results: dict[tuple[str, str], dict[str, Any]]) -> list[str]:
    """Each row's share of the gap between the table's lower and upper rows, ours | paper."""
    if table.gap is None:
        return []
    low, high = (next(r for r in table.rows if r.label == name) for name in table.gap)
    cols = list(table.columns)

    def share(value, lo, hi) -> float | None:
        if value is None or lo is None or hi is None or hi == lo:
            return None
        return (value - lo) / (hi - lo)

    head = "| gap closed | " + " | ".join(f"{c} ours | {c} paper" for c in cols) + " |"
    lines = ["", head, "|---|" + "---|---|" * len(cols)]
    for row in table.rows:
        if row in (low, high):
            continue
        cells = []
        for c in cols:
            ours = share(*(final(results, r.label, c, table.metric) for r in (row, low, high)))
            paper = share(row.paper.get(c), low.paper.get(c), high.paper.get(c))
            cells.append(f"{fmt(ours, '.0%')} | {fmt(paper, '.0%', '-')}")
        lines.append(f"| {row.label} | " + " | ".join(cells) + " |")
    return lines


def cost_ratio(results: dict[str, Any], sent: str, dense: str) -> float:
    """Bytes sent over all rounds as a fraction of the dense cost."""
    rows = results["rounds"]
    return sum(r[sent] for r in rows) / max(sum(r.get(dense, 0) for r in rows), 1)


def costs(table: Table, results: dict[tuple[str, str], dict[str, Any]]) -> list[str]:
    """Communication of the rows with paper costs: S2C and C2S as fractions of dense."""
    rows = [row for row in table.rows if row.paper_costs]
    if not rows:
        return []
    cols = list(table.columns)
    head = "| cost (S2C / C2S) | " + " | ".join(f"{c} ours | {c} paper" for c in cols) + " |"
    lines = ["", head, "|---|" + "---|---|" * len(cols)]
    for row in rows:
        cells = []
        for c in cols:
            res = results.get((row.label, c))
            ours = "not run"
            if res is not None:
                s2c = cost_ratio(res, "bytes_s2c", "bytes_s2c_dense")
                ours = f"{s2c:.0%} / {cost_ratio(res, 'bytes_c2s', 'bytes_c2s_dense'):.0%}"
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


def reproduce(
    name: str,
    out: Path,
    rounds: int | None,
    sets: list[str],
    run: bool = True,
    dataset: str | None = None,
) -> str:
    """Run (or reuse) every cell of a table; write table.md and accuracy.png into ``out``.

    With ``run=False`` nothing is run: the table shows the finished cells only. Linked
    tables (the same cells, another metric) follow in table.md.
    """
    table = TABLES[name]
    folder = experiments_folder(table, dataset)
    out.mkdir(parents=True, exist_ok=True)
    results = table_results(table, out, rounds, sets, run, folder)
    text = "\n\n".join(markdown(t, results) for t in (table, *map(TABLES.get, table.linked)))
    (out / "table.md").write_text(text + "\n")
    plot_curves(list(results.values()), out / "accuracy.png", title=table.title)
    return text


def table_results(
    table: Table, out: Path, rounds: int | None, sets: list[str], run: bool, folder: str
) -> dict[tuple[str, str], dict[str, Any]]:
    """Every cell's results, run or reused, by (row label, column)."""
    results = {}
    for column, col_overrides in table.columns.items():
        for row in table.rows:
            res = run_cell(
                row.experiment_for(column, folder),
                row.label,
                [*col_overrides, *sets],
                rounds,
                cell_dir(out, row, column),
                run,
            )
            if res is None:
                continue
            res["name"] = f"{row.label} ({column})"
            results[(row.label, column)] = res
    return results

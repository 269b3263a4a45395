"""Results tables that cannot go stale: the method pages' and the README's tables, generated
from the committed result summaries under ``results/tables/`` (each the ``seeds.json`` that
``ssfl reproduce ... --seeds`` writes, plus the command that produced it):

    python -m ssfl.tables          # rewrite every block between its markers, and its figure
    python -m ssfl.tables --check  # exit 1 when a block or figure differs or a summary is
                                   # inconsistent

A block sits between ``<!-- BEGIN GENERATED: NAME -->`` and ``<!-- END GENERATED: NAME -->``;
its figure (ssfl/figures.py) is ``docs/img/NAME.svg`` (and ``NAME-curve.svg``, the rows as
lines, where its table has a curve). To add a result: add its summary folder
and list it in the block's ``summaries``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ssfl.figures import Line, curve_plot, dot_plot
from ssfl.reproduce import TABLES

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results" / "tables"
FIGURES = Path("docs") / "img"  # under ROOT
SHOWN = 1  # commands listed under a table per summary (the rest: in the summary)
TOLERANCE = 1.5e-4  # the per-seed values are rounded to 4 decimals before the mean and std


class SummaryError(ValueError):
    """A summary that is missing a field or whose mean or std disagrees with its values."""


@dataclass(frozen=True)
class Block:
    """One results table: the page it sits in and the summaries it reads, first one wins."""

    page: str
    table: str  # the ``ssfl reproduce`` table that holds the paper's numbers
    summaries: tuple[str, ...]
    columns: tuple[str, ...]
    metric: str = "final_test_accuracy"  # every summary of the block records this one
    baseline: str | None = None  # the row the lifts are over (None: the table's)
    label: str = ""  # how a README row names this block's setting when it shows it second


@dataclass(frozen=True)
class Status:
    """One README row: its methods, its page, our summarised cell (if any) and the verdict."""

    methods: str  # the row's first cell starts with these
    page: str  # the verdict links to the page's WHY section
    verdict: str  # reproduced / partly / not
    cell: tuple[str, str, str] | None = None  # (block, row, column)
    against: str | None = None  # a row of the same block and column shown beside ours
    also: tuple[str, ...] = ()  # other blocks (settings) whose same cells follow


BLOCKS: dict[str, Block] = {
    "fedseal-table1": Block(
        page="docs/fedseal.md",
        table="fedseal-table1",
        summaries=("fedseal-table1", "fedseal-table1-seed0", "fedseal-table1-sl"),
        columns=("IID", "Non-IID"),
    ),
    "fedmatch-table2": Block(
        page="docs/fedmatch.md",
        table="fedmatch-table2",
        summaries=("fedmatch-table2-las",),
        columns=("Labels-at-Server",),
        metric="final_local_accuracy",
        baseline="FedProx-FixMatch",
    ),
    "fedsup-table6": Block(
        page="docs/fedsup.md",
        table="fedsup-table6",
        summaries=("fedsup-room-crossed", "fedsup-room-n0", "fedsup-room-baselines"),
        columns=("IID",),
        metric="final_finetune_accuracy",
        baseline="Centralized",
    ),
    "fedossl-table2": Block(
        page="docs/fedossl.md",
        table="fedossl-table2",
        summaries=("fedossl-table2", "fedossl-table2-rows"),
        columns=("Table 2",),
        metric="final_best_acc_all",
        baseline="Fed-AO",
    ),
    "ssfl-fig2": Block(
        page="docs/ssfl-benchmark.md",
        table="ssfl-fig2",
        summaries=("ssfl-fig2-long", "ssfl-fig2-long-sl", "ssfl-fig2-long-s0"),
        columns=("Non-IID",),
    ),
    "ssfl-fig2-steady": Block(
        page="docs/ssfl-benchmark.md",
        table="ssfl-fig2",
        summaries=("ssfl-fig2-steady",),
        columns=("Non-IID",),
        label="steady setting",
    ),
    "dp-fmnist": Block(
        page="docs/privacy.md",
        table="dp-fmnist",
        summaries=("dp-fmnist",),
        columns=("Fashion-MNIST",),
    ),
}

WHY = "why-ours-differ"
FEDSEAL = "docs/fedseal.md"
STATUSES: tuple[Status, ...] = (
    Status("`fedseal`", FEDSEAL, "reproduced", ("fedseal-table1", "FedSEAL", "IID")),
    Status("`server_sl`", FEDSEAL, "reproduced", ("fedseal-table1", "Server-SL", "IID")),
    Status(
        "`fedavg_sl`, `fedprox_sl`", FEDSEAL, "reproduced", ("fedseal-table1", "FedAvg-SL", "IID")
    ),
    Status("`fedavg_fixmatch`", FEDSEAL, "partly", ("fedseal-table1", "FedAvg-FixMatch", "IID")),
    Status("`fedavg_uda`", FEDSEAL, "partly", ("fedseal-table1", "FedAvg-UDA", "IID")),
    Status(
        "`fedmatch`",
        "docs/fedmatch.md",
        "partly",
        ("fedmatch-table2", "FedMatch", "Labels-at-Server"),
    ),
    Status(
        "`fedavg_with_server`",
        "docs/ssfl-benchmark.md",
        "partly",
        ("ssfl-fig2", "FedAvg solution", "Non-IID"),
        "Server-SL",  # the paper's federated model ends above the server alone
        ("ssfl-fig2-steady",),  # and where it ends in the setting where no cell collapses
    ),
    Status(
        "`fedrgd`",
        "docs/ssfl-benchmark.md",
        "partly",
        ("ssfl-fig2", "Grouping-based solution", "Non-IID"),
        "Server-SL",
        ("ssfl-fig2-steady",),
    ),
    Status("`fedsup`", "docs/fedsup.md", "not", ("fedsup-table6", "FedSup", "IID")),
    Status("`fedavg_simclr`, `fedavg_simsiam`, `fedavg_byol`", "docs/fedsup.md", "not"),
    Status("`fedossl`", "docs/fedossl.md", "partly", ("fedossl-table2", "FedoSSL", "Table 2")),
)
README_BLOCK = "methods"


def load(name: str) -> dict[str, Any]:
    """A summary, checked: every cell's mean and std agree with its per-seed values."""
    path = RESULTS / name / "seeds.json"
    summary = json.loads(path.read_text())
    for key in ("table", "commands", "source", "seeds", "metric", "cells"):
        if key not in summary:
            raise SummaryError(f"{path}: no {key!r}")
    for cell in summary["cells"]:
        check_cell(path, cell)
    return summary


def check_cell(path: Path, cell: dict[str, Any]) -> None:
    """The cell's mean and std (statistics.stdev, as ``ssfl reproduce``) match its values."""
    values = [v for v in cell["values"] if v is not None]
    where = f"{path}: {cell['row']} ({cell['column']})"
    if len(values) != cell["n"]:
        raise SummaryError(f"{where}: n = {cell['n']} but {len(values)} values")
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    for label, ours, recorded in (
        ("mean", statistics.fmean(values), cell["mean"]),
        ("std", std, cell["std"]),
    ):
        if abs(ours - recorded) > TOLERANCE:
            raise SummaryError(f"{where}: {label} {recorded} but the values give {ours:.4f}")


def cells(block: Block) -> dict[tuple[str, str], dict[str, Any]]:
    """The block's cells by (row, column); a cell of an earlier summary wins."""
    found: dict[tuple[str, str], dict[str, Any]] = {}
    labels = {row.label for row in TABLES[block.table].rows}
    for name in block.summaries:
        summary = load(name)
        if (summary["table"], summary["metric"]) != (block.table, block.metric):
            raise SummaryError(
                f"{name}: {summary['table']} / {summary['metric']}, "
                f"the block's is {block.table} / {block.metric}"
            )
        for cell in summary["cells"]:
            if cell["row"] not in labels or cell["column"] not in block.columns:
                raise SummaryError(
                    f"{name}: {cell['row']!r} ({cell['column']}) is no cell of {block.table}"
                )
            found.setdefault((cell["row"], cell["column"]), cell)
    return found


def shown(cell: dict[str, Any] | None) -> str:
    """Our number: mean ± std over n seeds, or the one seed's value."""
    if cell is None:
        return "not run"
    if cell["n"] > 1:
        return f"{cell['mean']:.4f} ± {cell['std']:.4f} ({cell['n']} seeds)"
    return f"{cell['mean']:.4f} (1 seed)"


def lift(cell: dict[str, Any], base: dict[str, Any]) -> str:
    """The difference of two means (seeds on both sides), bold beyond twice the larger std,
    else a tie."""
    diff = cell["mean"] - base["mean"]
    line = 2 * max(cell["std"], base["std"])
    return (
        f"**{diff:+.4f}** (> {line:.4f})"
        if abs(diff) > line
        else f"{diff:+.4f} (tie, <= {line:.4f})"
    )


def has_paper(block: Block) -> bool:
    """Whether the paper has a number in any of the block's cells."""
    rows = TABLES[block.table].rows
    return any(row.paper.get(c) is not None for row in rows for c in block.columns)


def table_lines(block: Block) -> list[str]:
    """Ours beside the paper per column, then each three-seed row's lift over the baseline."""
    table, found = TABLES[block.table], cells(block)
    papers = has_paper(block)  # a table no paper has (ours only) has no paper columns
    head = " | ".join(f"{c} ours" + (f" | {c} paper" if papers else "") for c in block.columns)
    width = "---|---|" if papers else "---|"
    lines = [f"| {block.metric} | {head} |", "|---|" + width * len(block.columns)]
    for row in table.rows:
        if not any((row.label, c) in found for c in block.columns):
            continue
        parts = [
            shown(found.get((row.label, c))) + (f" | {paper(row.paper.get(c))}" if papers else "")
            for c in block.columns
        ]
        lines.append(f"| {row.label} | " + " | ".join(parts) + " |")
    base = {r.label: r for r in table.rows}.get(block.baseline or table.baseline)
    for row in table.rows:
        if base is None or row is base:
            continue
        pairs = [(found.get((row.label, c)), found.get((base.label, c))) for c in block.columns]
        if not all(a and b and a["n"] > 1 and b["n"] > 1 for a, b in pairs):
            continue
        parts = [
            lift(a, b) + (f" | {paper_lift(row.paper.get(c), base.paper.get(c))}" if papers else "")
            for (a, b), c in zip(pairs, block.columns, strict=True)
        ]
        lines.append(f"| {row.label} - {base.label} | " + " | ".join(parts) + " |")
    return lines


def paper(value: float | None) -> str:
    """The paper's number, or "-" where it has none."""
    return "-" if value is None else f"{value:.4f}"


def paper_lift(value: float | None, base: float | None) -> str:
    """The paper's difference, or "-"."""
    return "-" if value is None or base is None else f"{value - base:+.4f}"


def commands(block: Block) -> list[str]:
    """The commands of the block's summaries, as the note under the table: up to
    ``SHOWN`` of a summary's, the rest named by the summary's file."""
    lines = []
    for name in block.summaries:
        found = load(name)["commands"]
        lines += [f"- `{command}`" for command in found[:SHOWN]]
        if len(found) > SHOWN:
            rest = len(found) - SHOWN
            lines.append(f"- and {rest} more in `results/tables/{name}/seeds.json`")
    return lines


def block_text(name: str, old: str) -> str:
    """The generated text of one block (without its markers); ``old`` is its text today."""
    if name == README_BLOCK:
        return "\n".join(readme_lines(old.splitlines()))
    block = BLOCKS[name]
    note = (
        "Generated by `python -m ssfl.tables` from `results/tables/`; a "
        "difference is bold beyond twice the larger std, else a tie. Made by:"
    )
    image = os.path.relpath(figure_path(name), (ROOT / block.page).parent)
    beside = " beside the paper" if has_paper(block) else ""
    figures = [f"![Ours (each seed, mean and std){beside}]({image})"]
    curve = TABLES[block.table].curve
    if curve is not None:
        image = os.path.relpath(figure_path(name, CURVE), (ROOT / block.page).parent)
        figures.append(f"![Ours against {curve.x_label}]({image})")
    return "\n".join([*table_lines(block), "", *figures, "", note, "", *commands(block)])


CURVE = "-curve"  # the file name's tail of a block's curve figure


def figure_path(name: str, kind: str = "") -> Path:
    return ROOT / FIGURES / f"{name}{kind}.svg"


def figures_of(name: str) -> dict[Path, str]:
    """A block's figures by path: its dot plot, and its curve where its table has one."""
    out = {figure_path(name): figure_text(name)}
    if TABLES[BLOCKS[name].table].curve is not None:
        out[figure_path(name, CURVE)] = curve_text(name)
    return out


def curve_text(name: str) -> str:
    """The SVG of a block's curve (one column): each series' cells at the curve's ticks, the
    table's baseline row as a band."""
    block = BLOCKS[name]
    table, found = TABLES[block.table], cells(block)
    curve, column = table.curve, block.columns[0]
    assert curve is not None

    def line(label: str) -> Line | None:
        cell = found.get((label, column))
        if cell is None:
            return None
        values = tuple(v for v in cell["values"] if v is not None)
        return Line(label, values, cell["mean"], cell["std"], None)

    series = {m: [line(label) for label in labels] for m, labels in curve.series.items()}
    base = line(block.baseline or table.baseline)
    return curve_plot(table.title, block.metric, curve.x_label, curve.ticks, series, base)


def figure_text(name: str) -> str:
    """The SVG of a block: each cell of ours (seeds, mean, std) beside the paper's number."""
    block = BLOCKS[name]
    table, found = TABLES[block.table], cells(block)
    lines = []
    for row in table.rows:
        for column in block.columns:
            cell = found.get((row.label, column))
            if cell is None:
                continue
            label = row.label if len(block.columns) == 1 else f"{row.label} ({column})"
            values = tuple(v for v in cell["values"] if v is not None)
            lines.append(Line(label, values, cell["mean"], cell["std"], row.paper.get(column)))
    return dot_plot(table.title, block.metric, lines)


def readme_lines(old: list[str]) -> list[str]:
    """The README's methods table as written, its last column regenerated: the verdict
    (reproduced / partly / not) linked to its reason, then our number beside the paper's where
    a summary has it, else the column's hand-written text.
    """
    table = [line for line in old if line.startswith("|")]
    if len(table) < 2:
        raise SummaryError(f"README.md: the {README_BLOCK!r} block holds no table")
    lines = table[:2]
    for line in table[2:]:
        first, last = line.rstrip()[:-1].rsplit("|", 1)
        status = status_of(line)
        lines.append(f"{first}| {verdict(status)}: {ours(status, last.strip())} |")
    return lines


def status_of(line: str) -> Status:
    """The declared status of a README row, found by the methods in its first cell."""
    first = line.split("|")[1].strip()
    for status in STATUSES:
        if first.startswith(status.methods + " "):
            return status
    raise SummaryError(f"README.md: the row {first!r} has no status in ssfl/tables.py")


def verdict(status: Status) -> str:
    """The verdict linked to the page's reason."""
    return f"[{status.verdict}]({status.page}#{WHY})"


def ours(status: Status, written: str) -> str:
    """Our number and the paper's from the summary, else the hand-written text (its old
    verdict removed)."""
    if status.cell is None:
        return re.sub(r"^\[(reproduced|partly|not)\]\([^)]*\): ", "", written)
    block_name, row, column = status.cell
    block = BLOCKS[block_name]
    found = cells(block)
    rows = {r.label: r for r in TABLES[block.table].rows}
    text = f"{column} {shown(found.get((row, column)))}, paper {paper(rows[row].paper.get(column))}"
    if status.against is not None:
        text += f"; {status.against} {shown(found.get((status.against, column)))}"
    for other in status.also:
        found = cells(BLOCKS[other])
        text += f"; {BLOCKS[other].label}: {shown(found.get((row, column)))}"
        if status.against is not None:
            text += f", {status.against} {shown(found.get((status.against, column)))}"
    return text


def marker(kind: str, name: str) -> str:
    return f"<!-- {kind} GENERATED: {name} -->"


def pages() -> dict[Path, list[str]]:
    """Every page with generated blocks and the names of its blocks."""
    found: dict[Path, list[str]] = {ROOT / "README.md": [README_BLOCK]}
    for name, block in BLOCKS.items():
        found.setdefault(ROOT / block.page, []).append(name)
    return found


def rendered(text: str, names: list[str], where: Path) -> str:
    """``text`` with each named block between its markers regenerated."""
    for name in names:
        pattern = re.compile(
            re.escape(marker("BEGIN", name)) + r"\n.*?" + re.escape(marker("END", name)), re.S
        )
        found = pattern.search(text)
        if found is None:
            raise SummaryError(f"{where}: no markers for the block {name!r}")
        old = found.group(0).split("\n", 1)[1].rsplit("\n", 1)[0]
        new = f"{marker('BEGIN', name)}\n{block_text(name, old)}\n{marker('END', name)}"
        text = text[: found.start()] + new + text[found.end() :]
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a block is stale")
    args = parser.parse_args(argv)
    try:
        updates = {page: rendered(page.read_text(), names, page) for page, names in pages().items()}
        for name in BLOCKS:
            updates |= figures_of(name)
    except SummaryError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    stale = [p for p, text in updates.items() if not p.exists() or text != p.read_text()]
    if args.check:
        for path in stale:
            print(f"{path} is stale: run python -m ssfl.tables", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(updates[path])
    return 0


if __name__ == "__main__":
    sys.exit(main())

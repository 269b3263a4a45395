"""Tables that cannot go stale: the method pages' and the README's results tables are those the
committed summaries under results/tables/ generate, and the method pages stay short."""

from __future__ import annotations

import json
import os
import shutil
from xml.etree import ElementTree

import pytest

from ssfl import figures, tables
from tests.conftest import ROOT

METHOD_PAGES = ["fedseal", "fedmatch", "fedsup", "fedossl", "ssfl-benchmark"]


def test_the_generated_tables_are_those_the_summaries_give():
    assert tables.main(["--check"]) == 0


@pytest.mark.parametrize("name", METHOD_PAGES)
def test_each_method_page_is_at_most_12_kb_and_links_its_lab_notebook(name):
    page = ROOT / "docs" / f"{name}.md"
    assert len(page.read_bytes()) <= 12_000
    assert f"(log/{name}.md)" in page.read_text()
    assert (ROOT / "docs" / "log" / f"{name}.md").is_file()


@pytest.mark.parametrize("method", ["fedavg_with_server", "fedrgd"])
def test_the_ssfl_benchmarks_readme_rows_show_the_server_alone_beside_ours(method):
    """Where the paper's federated model ends above the server's own, the row says where
    ours ends against it."""
    (row,) = [
        line
        for line in (ROOT / "README.md").read_text().splitlines()
        if line.startswith(f"| `{method}`")
    ]
    row_label = {"fedavg_with_server": "FedAvg solution", "fedrgd": "Grouping-based solution"}
    long, steady = (tables.cells(tables.BLOCKS[b]) for b in ("ssfl-fig2", "ssfl-fig2-steady"))
    server, ours = steady[("Server-SL", "Non-IID")], steady[(row_label[method], "Non-IID")]
    assert f"; Server-SL {tables.shown(long[('Server-SL', 'Non-IID')])}; " in row
    assert row.endswith(
        f"; steady setting: {tables.shown(ours)}, Server-SL {tables.shown(server)} |"
    )


def copy(monkeypatch, tmp_path):
    """The summaries and the pages with blocks, copied into tmp_path and used from there."""
    shutil.copytree(tables.RESULTS, tmp_path / "results" / "tables")
    for page in tables.pages():
        target = tmp_path / page.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(page, target)
    shutil.copytree(ROOT / tables.FIGURES, tmp_path / tables.FIGURES)
    monkeypatch.setattr(tables, "ROOT", tmp_path)
    monkeypatch.setattr(tables, "RESULTS", tmp_path / "results" / "tables")
    return tmp_path / "results" / "tables" / "fedseal-table1" / "seeds.json"


def test_a_changed_summary_makes_the_pages_stale_until_regenerated(monkeypatch, tmp_path):
    path = copy(monkeypatch, tmp_path)
    summary = json.loads(path.read_text())
    cell = summary["cells"][1]  # FedSEAL, IID
    assert (cell["row"], cell["column"]) == ("FedSEAL", "IID")
    cell["values"], cell["mean"], cell["std"] = [0.8, 0.8, 0.8], 0.8, 0.0
    path.write_text(json.dumps(summary))
    assert tables.main(["--check"]) == 1
    assert tables.main([]) == 0 and tables.main(["--check"]) == 0
    page = (tmp_path / "docs" / "fedseal.md").read_text()
    readme = (tmp_path / "README.md").read_text()
    assert "| FedSEAL | 0.8000 ± 0.0000 (3 seeds) | 0.8428 |" in page
    assert "IID 0.8000 ± 0.0000 (3 seeds), paper 0.8428" in readme
    assert "+0.0010 (tie, <= 0.0294)" in page  # 0.8000 - 0.7990, inside twice Server-SL's std
    figure = (tmp_path / "docs" / "img" / "fedseal-table1.svg").read_text()
    assert figure != (ROOT / "docs" / "img" / "fedseal-table1.svg").read_text()


def test_a_missing_or_edited_figure_is_stale_until_regenerated(monkeypatch, tmp_path, capsys):
    copy(monkeypatch, tmp_path)
    figure = tmp_path / "docs" / "img" / "fedossl-table2.svg"
    figure.unlink()
    assert tables.main(["--check"]) == 1
    assert f"{figure} is stale" in capsys.readouterr().err
    assert tables.main([]) == 0 and tables.main(["--check"]) == 0
    figure.write_text(figure.read_text().replace("#1f5fa8", "#000000"))
    assert tables.main(["--check"]) == 1


@pytest.mark.parametrize("name", sorted(tables.BLOCKS))
def test_each_tables_figure_marks_every_seed_mean_and_paper_number_of_its_cells(name):
    """Per cell of ours: a hollow dot per seed, a filled dot (the mean) with its std bar;
    a diamond per cell whose paper number exists; every mark inside the plot's width; the
    page's block shows the figure."""
    block = tables.BLOCKS[name]
    svg = ElementTree.fromstring((ROOT / "docs" / "img" / f"{name}.svg").read_text())
    ns = "{http://www.w3.org/2000/svg}"
    found = tables.cells(block)
    rows = {r.label: r for r in tables.TABLES[block.table].rows}
    seeds = sum(len([v for v in c["values"] if v is not None]) for c in found.values())
    papers = sum(rows[r].paper.get(c) is not None for r, c in found)
    circles = svg.findall(f"{ns}circle")
    hollow = [c for c in circles if c.get("fill") == "none"]
    assert len(hollow) == seeds + 1  # and the legend's
    assert len(circles) - len(hollow) == len(found) + 1
    assert len(svg.findall(f"{ns}path")) == papers + tables.has_paper(block)  # and the key's
    for circle in circles[2:]:  # the legend's two first
        assert figures.LABEL_WIDTH <= float(circle.get("cx")) <= figures.WIDTH - figures.RIGHT
    image = os.path.relpath(ROOT / "docs" / "img" / f"{name}.svg", (ROOT / block.page).parent)
    assert f"]({image})" in (ROOT / block.page).read_text()


def test_the_axis_holds_every_value_bar_and_paper_number_at_round_ticks():
    lines = [
        figures.Line("a", (0.512, 0.6), 0.556, 0.06, 0.7626),
        figures.Line("b", (), 0.8, 0, None),
    ]
    low, high, step = figures.axis_range(lines)
    assert (low, high, step) == (pytest.approx(0.4), pytest.approx(0.8), 0.1)
    assert figures.axis_range([figures.Line("c", (0.81,), 0.81, 0.0, 0.84)])[2] == 0.05


def test_a_mean_that_disagrees_with_its_seeds_is_refused(monkeypatch, tmp_path, capsys):
    path = copy(monkeypatch, tmp_path)
    summary = json.loads(path.read_text())
    summary["cells"][0]["mean"] = 0.8100  # Server-SL IID: its seeds give 0.7990
    path.write_text(json.dumps(summary))
    assert tables.main(["--check"]) == 1
    assert "mean 0.81 but the values give 0.7990" in capsys.readouterr().err


def test_a_readme_row_without_a_verdict_is_refused(monkeypatch, tmp_path, capsys):
    copy(monkeypatch, tmp_path)
    readme = tmp_path / "README.md"
    text = readme.read_text().replace("| `fedrgd` (", "| `fedfoo` (")
    readme.write_text(text)
    assert tables.main([]) == 1
    assert "'`fedfoo` ([docs](docs/ssfl-benchmark.md))' has no status" in capsys.readouterr().err


def test_a_cell_the_table_does_not_have_is_refused(monkeypatch, tmp_path, capsys):
    path = copy(monkeypatch, tmp_path)
    summary = json.loads(path.read_text())
    summary["cells"][0]["row"] = "Server-SI"
    path.write_text(json.dumps(summary))
    assert tables.main(["--check"]) == 1
    assert "'Server-SI' (IID) is no cell of fedseal-table1" in capsys.readouterr().err


def test_the_key_names_the_paper_only_when_a_line_has_its_number():
    ours = figures.Line("ours only", (0.5, 0.6), 0.55, 0.07, None)
    assert "the paper" not in figures.dot_plot("t", "m", [ours])
    with_paper = figures.Line("beside the paper", (0.5,), 0.5, 0.0, 0.7)
    assert "the paper" in figures.dot_plot("t", "m", [ours, with_paper])


def test_a_table_of_our_own_has_no_paper_columns_and_its_figure_no_paper_key():
    block = tables.BLOCKS["dp-fmnist"]
    assert not tables.has_paper(block)
    lines = tables.table_lines(block)
    assert lines[0] == "| final_test_accuracy | Fashion-MNIST ours |"
    assert all(line.count("|") == 3 for line in lines)
    assert "the paper" not in tables.figure_path("dp-fmnist").read_text()


SVG = "{http://www.w3.org/2000/svg}"


def test_the_curve_joins_each_series_means_marks_its_seeds_and_bands_the_baseline():
    a = [
        figures.Line("a at 1", (0.2, 0.4), 0.3, 0.1414, None),
        None,
        figures.Line("a without", (0.8,), 0.8, 0.0, None),
    ]
    b = [None, figures.Line("b at 4", (0.5,), 0.5, 0.0, None), None]
    base = figures.Line("Server-SL", (0.7, 0.72), 0.71, 0.0141, None)
    text = figures.curve_plot("t", "acc", "epsilon", ("1", "4", "none"), {"A": a, "B": b}, base)
    svg = ElementTree.fromstring(text)
    (joined,) = svg.findall(f"{SVG}polyline")  # B has one point: nothing to join
    points = [tuple(map(float, p.split(","))) for p in joined.get("points").split()]
    assert points[0][0] < points[1][0] and points[0][1] > points[1][1]  # 0.3, then 0.8 above
    circles = svg.findall(f"{SVG}circle")
    assert sorted(c.get("fill") for c in circles if c.get("fill") != "none") == sorted(
        [figures.SERIES[0]] * 2 + [figures.SERIES[1]]
    )
    assert len([c for c in circles if c.get("fill") == "none"]) == 4  # the seeds
    ticks = {t.text: float(t.get("x")) for t in svg.findall(f"{SVG}text") if t.text in "14none"}
    b_mean = next(c for c in circles if c.get("fill") == figures.SERIES[1])
    assert float(b_mean.get("cx")) == ticks["4"] and points[1][0] == ticks["none"]
    rects = svg.findall(f"{SVG}rect")
    band = next(r for r in rects if r.get("fill-opacity") and r.get("x") == str(figures.PLOT_LEFT))
    dashed = next(ln for ln in svg.findall(f"{SVG}line") if ln.get("stroke-dasharray"))
    middle = float(band.get("y")) + float(band.get("height")) / 2
    assert middle == pytest.approx(float(dashed.get("y1")), abs=0.1)


def test_a_curve_of_more_series_than_colours_is_refused():
    line = figures.Line("x", (0.5,), 0.5, 0.0, None)
    series = {str(k): [line] for k in range(len(figures.SERIES) + 1)}
    with pytest.raises(ValueError, match="at most 4 series"):
        figures.curve_plot("t", "m", "x", ("1",), series)


def test_the_dp_tables_curve_shows_each_finished_cell_of_its_series():
    """The privacy page's accuracy-against-epsilon figure: a filled dot per finished cell of
    each method at each epsilon and without DP, Server-SL as the band."""
    block = tables.BLOCKS["dp-fmnist"]
    curve = tables.TABLES[block.table].curve
    assert curve.ticks == ("1", "4", "8", "no DP")
    assert curve.series["FedSEAL"][2] == "FedSEAL at epsilon 8"
    found = tables.cells(block)
    shown = [label for labels in curve.series.values() for label in labels]
    finished = sum((label, "Fashion-MNIST") in found for label in shown)
    svg = ElementTree.fromstring(tables.figure_path("dp-fmnist", tables.CURVE).read_text())
    filled = [c for c in svg.findall(f"{SVG}circle") if c.get("fill") != "none"]
    assert len(filled) == finished > 0
    assert "Server-SL" in [t.text for t in svg.findall(f"{SVG}text")]
    assert "](img/dp-fmnist-curve.svg)" in (ROOT / block.page).read_text()

"""The results tables' figures: one dot plot per generated table (``ssfl/tables.py``), written
as plain SVG text, so that the same summaries always give the same bytes (no plotting library,
no timestamps) and ``python -m ssfl.tables --check`` can tell a stale figure.

Per table cell with our numbers, one line: each seed's value (a hollow dot), the mean with a
bar of one std either side (a filled dot), and the paper's number (a diamond) where it has one.
A table with a curve (``ssfl.reproduce.Curve``) also gets a line plot: per series the means
joined across the x ticks, with their seeds and std bars, and the baseline as a band.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from html import escape

WIDTH = 720
LABEL_WIDTH = 250  # the row labels' column
RIGHT = 20
TOP = 54  # the title and the legend
ROW = 26
BOTTOM = 36  # the axis' tick labels and name
OURS = "#1f5fa8"
PAPER = "#d9730d"
GRID = "#d0d0d0"
FONT = 'font-family="sans-serif" font-size="12"'


@dataclass(frozen=True)
class Line:
    """One cell: its label, our per-seed values, mean and std, and the paper's number."""

    label: str
    values: tuple[float, ...]
    mean: float
    std: float
    paper: float | None


def axis_range(lines: list[Line]) -> tuple[float, float, float]:
    """(low, high, step): every value, bar and paper number inside, ticks at round steps."""
    points = [v for line in lines for v in line.values]
    points += [line.mean - line.std for line in lines] + [line.mean + line.std for line in lines]
    points += [line.paper for line in lines if line.paper is not None]
    span = max(points) - min(points)
    step = 0.05 if span <= 0.25 else 0.1
    low = math.floor(min(points) / step + 1e-9) * step  # 0.8 / 0.1 is 8.000000000000002
    high = math.ceil(max(points) / step - 1e-9) * step
    return low, max(high, low + step), step


def dot_plot(title: str, metric: str, lines: list[Line]) -> str:
    """The SVG text of ``lines`` under ``title``; the x axis is ``metric``."""
    low, high, step = axis_range(lines)
    height = TOP + ROW * len(lines) + BOTTOM

    def x(value: float) -> float:
        return LABEL_WIDTH + (value - low) / (high - low) * (WIDTH - LABEL_WIDTH - RIGHT)

    out = [*svg_head(title, height), *legend(any(line.paper is not None for line in lines))]
    bottom = TOP + ROW * len(lines)
    ticks = round((high - low) / step)
    for i in range(ticks + 1):
        value = low + i * step
        out.append(
            f'<line x1="{x(value):.1f}" y1="{TOP - 6}" x2="{x(value):.1f}" y2="{bottom}" '
            f'stroke="{GRID}"/>'
        )
        out.append(
            f'<text x="{x(value):.1f}" y="{bottom + 14}" {FONT} '
            f'text-anchor="middle">{value:.2f}</text>'
        )
    out.append(
        f'<text x="{x((low + high) / 2):.1f}" y="{bottom + 30}" {FONT} '
        f'text-anchor="middle">{escape(metric)}</text>'
    )
    for i, line in enumerate(lines):
        out += row_marks(line, TOP + ROW * i + ROW / 2, x)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def svg_head(title: str, height: int) -> list[str]:
    """A figure's opening: the SVG element ``WIDTH`` x ``height``, its title (also shown in
    bold at the top left) and a white background."""
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" role="img">',
        f"<title>{escape(title)}</title>",
        f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
        f'<text x="10" y="20" {FONT} font-weight="bold">{escape(title)}</text>',
    ]


def legend(with_paper: bool = True) -> list[str]:
    """The key: ours (mean and one std, each seed) and, where it has numbers, the paper."""
    y = 38
    ours = [
        f'<circle cx="16" cy="{y - 4}" r="4.5" fill="{OURS}"/>',
        f'<text x="26" y="{y}" {FONT}>ours: mean, bar = one std</text>',
        f'<circle cx="196" cy="{y - 4}" r="3.5" fill="none" stroke="{OURS}"/>',
        f'<text x="206" y="{y}" {FONT}>each seed</text>',
    ]
    paper = [
        f'<path d="{diamond(290, y - 4)}" fill="{PAPER}"/>',
        f'<text x="300" y="{y}" {FONT}>the paper</text>',
    ]
    return ours + paper if with_paper else ours


def row_marks(line: Line, y: float, x) -> list[str]:
    """One row's label, seeds, mean with its bar, and paper diamond."""
    marks = [
        f'<text x="{LABEL_WIDTH - 10}" y="{y + 4:.1f}" {FONT} '
        f'text-anchor="end">{escape(line.label)}</text>',
        f'<line x1="{x(line.mean - line.std):.1f}" y1="{y:.1f}" '
        f'x2="{x(line.mean + line.std):.1f}" y2="{y:.1f}" stroke="{OURS}" stroke-width="2"/>',
    ]
    marks += [
        f'<circle cx="{x(v):.1f}" cy="{y:.1f}" r="3.5" fill="none" stroke="{OURS}"/>'
        for v in line.values
    ]
    marks.append(f'<circle cx="{x(line.mean):.1f}" cy="{y:.1f}" r="4.5" fill="{OURS}"/>')
    if line.paper is not None:
        marks.append(f'<path d="{diamond(x(line.paper), y)}" fill="{PAPER}"/>')
    return marks


def diamond(cx: float, cy: float, r: float = 5.0) -> str:
    """The path of a diamond centred on (cx, cy)."""
    return (
        f"M{cx:.1f} {cy - r:.1f}L{cx + r:.1f} {cy:.1f}L{cx:.1f} {cy + r:.1f}L{cx - r:.1f} {cy:.1f}Z"
    )


Scale = Callable[[float], float]  # a value (or a tick's index) -> its SVG coordinate
SERIES = ("#1f5fa8", "#b8336a", "#2a9d4b", "#7a4fb3")  # a colour per series, in order
BASELINE = "#6b6b6b"
PLOT_LEFT = 60  # the y axis' tick labels
PLOT_RIGHT = 190  # the key, right of the plot
PLOT_HEIGHT = 240


def curve_plot(
    title: str,
    metric: str,
    x_label: str,
    ticks: tuple[str, ...],
    series: dict[str, list[Line | None]],
    baseline: Line | None = None,
) -> str:
    """The SVG text of ``series`` (per series a Line or None at each of ``ticks``) against
    the ticks, evenly spaced; ``baseline`` a band of one std about its mean, across."""
    if len(series) > len(SERIES):
        raise ValueError(f"a curve plot draws at most {len(SERIES)} series, not {len(series)}")
    present = [line for lines in series.values() for line in lines if line is not None]
    low, high, step = axis_range(present + ([baseline] if baseline else []))
    height = TOP + PLOT_HEIGHT + BOTTOM + 14
    right = WIDTH - PLOT_RIGHT
    gap = (right - PLOT_LEFT) / len(ticks)

    def x(i: int) -> float:
        return PLOT_LEFT + gap * (i + 0.5)

    def y(value: float) -> float:
        return TOP + (high - value) / (high - low) * PLOT_HEIGHT

    out = [*svg_head(title, height), *curve_axes(ticks, x_label, metric, (low, high, step), x, y)]
    if baseline is not None:
        out += band(baseline, y, PLOT_LEFT, right)
    for lines, colour in zip(series.values(), SERIES):
        out += series_marks(lines, colour, x, y)
    out += curve_key(list(series), baseline, right + 16)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def curve_axes(
    ticks: tuple[str, ...],
    x_label: str,
    metric: str,
    scale: tuple[float, float, float],
    x: Scale,
    y: Scale,
) -> list[str]:
    """Horizontal grid lines at the value ticks (labelled left) and the x ticks' names."""
    low, high, step = scale
    bottom = TOP + PLOT_HEIGHT
    out = []
    for i in range(round((high - low) / step) + 1):
        value = low + i * step
        out.append(
            f'<line x1="{PLOT_LEFT}" y1="{y(value):.1f}" x2="{WIDTH - PLOT_RIGHT}" '
            f'y2="{y(value):.1f}" stroke="{GRID}"/>'
        )
        out.append(
            f'<text x="{PLOT_LEFT - 6}" y="{y(value) + 4:.1f}" {FONT} '
            f'text-anchor="end">{value:.2f}</text>'
        )
    for i, tick in enumerate(ticks):
        out.append(
            f'<text x="{x(i):.1f}" y="{bottom + 16}" {FONT} '
            f'text-anchor="middle">{escape(tick)}</text>'
        )
    middle = (PLOT_LEFT + WIDTH - PLOT_RIGHT) / 2
    out.append(
        f'<text x="{middle:.1f}" y="{bottom + 34}" {FONT} '
        f'text-anchor="middle">{escape(x_label)}</text>'
    )
    out.append(
        f'<text x="14" y="{TOP + PLOT_HEIGHT / 2:.1f}" {FONT} text-anchor="middle" '
        f'transform="rotate(-90 14 {TOP + PLOT_HEIGHT / 2:.1f})">{escape(metric)}</text>'
    )
    return out


def band(line: Line, y: Scale, left: float, right: float) -> list[str]:
    """The baseline: its mean as a dashed line in a band of one std either side."""
    top, bottom = y(line.mean + line.std), y(line.mean - line.std)
    return [
        f'<rect x="{left}" y="{top:.1f}" width="{right - left}" height="{bottom - top:.1f}" '
        f'fill="{BASELINE}" fill-opacity="0.15"/>',
        f'<line x1="{left}" y1="{y(line.mean):.1f}" x2="{right}" y2="{y(line.mean):.1f}" '
        f'stroke="{BASELINE}" stroke-dasharray="5 3"/>',
    ]


def series_marks(lines: list[Line | None], colour: str, x: Scale, y: Scale) -> list[str]:
    """One series: its means joined in tick order, each with its std bar and seeds."""
    points = [(i, line) for i, line in enumerate(lines) if line is not None]
    out = []
    if len(points) > 1:
        path = " ".join(f"{x(i):.1f},{y(line.mean):.1f}" for i, line in points)
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="1.5"/>')
    for i, line in points:
        out.append(
            f'<line x1="{x(i):.1f}" y1="{y(line.mean + line.std):.1f}" x2="{x(i):.1f}" '
            f'y2="{y(line.mean - line.std):.1f}" stroke="{colour}" stroke-width="2"/>'
        )
        out += [
            f'<circle cx="{x(i):.1f}" cy="{y(v):.1f}" r="3.5" fill="none" stroke="{colour}"/>'
            for v in line.values
        ]
        out.append(f'<circle cx="{x(i):.1f}" cy="{y(line.mean):.1f}" r="4.5" fill="{colour}"/>')
    return out


def curve_key(names: list[str], baseline: Line | None, left: float) -> list[str]:
    """The key, right of the plot: a swatch per series, the baseline's band, the seeds."""
    out = []
    for k, (name, colour) in enumerate(zip(names, SERIES)):
        y = TOP + 10 + 20 * k
        out.append(f'<rect x="{left}" y="{y - 9}" width="14" height="4" fill="{colour}"/>')
        out.append(f'<text x="{left + 20}" y="{y - 3}" {FONT}>{escape(name)}</text>')
    y = TOP + 10 + 20 * len(names)
    if baseline is not None:
        out.append(
            f'<rect x="{left}" y="{y - 12}" width="14" height="10" fill="{BASELINE}" '
            f'fill-opacity="0.15"/>'
        )
        out.append(f'<text x="{left + 20}" y="{y - 3}" {FONT}>{escape(baseline.label)}</text>')
        y += 20
    out.append(f'<text x="{left}" y="{y - 3}" {FONT}>dots: mean, each seed;</text>')
    out.append(f'<text x="{left}" y="{y + 13}" {FONT}>bars and band: one std</text>')
    return out

"""The results tables' figures: one dot plot per generated table (``ssfl/tables.py``), written
as plain SVG text, so that the same summaries always give the same bytes (no plotting library,
no timestamps) and ``python -m ssfl.tables --check`` can tell a stale figure.

Per table cell with our numbers, one line: each seed's value (a hollow dot), the mean with a
bar of one std either side (a filled dot), and the paper's number (a diamond) where it has one.
"""

from __future__ import annotations

import math
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

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" role="img">',
        f"<title>{escape(title)}</title>",
        f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
        f'<text x="10" y="20" {FONT} font-weight="bold">{escape(title)}</text>',
        *legend(any(line.paper is not None for line in lines)),
    ]
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

"""Server-side charts for the console: plain inline SVG (no JavaScript, no CDN; works offline)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext as _

PALETTE = ["#417690", "#e0a030", "#70a050", "#c05050", "#8060b0", "#40a0a0", "#b07040", "#808080"]
WIDTH, HEIGHT = 640, 274
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 30, 56  # the title above the plot


@dataclass
class Series:
    name: str
    values: list[float]


def no_data() -> str:
    """What an empty chart says (outside the f-strings: xgettext does not read inside them)."""
    return _("no data yet")


def _nice_max(value: float) -> float:
    """A round upper bound for the y axis (1, 2, 2.5, 5 × 10^n)."""
    if value <= 0:
        return 1.0
    magnitude = 10 ** len(str(int(value))) / 10 if value >= 1 else 1.0
    while magnitude > value:
        magnitude /= 10
    for step in (1, 2, 2.5, 5, 10):
        if step * magnitude >= value:
            return step * magnitude
    return 10 * magnitude


def _whole_max(value: float) -> int:
    """A y axis top for counts: four equal steps of a whole number (1, 2, 5 × 10^n), so every label is an
    integer (a count of 1 gets 0-4, not 0, 0.25, ... 1)."""
    step = 1
    while 4 * step < value:
        step = step * 5 // 2 if str(step)[0] == "2" else step * 2  # 1, 2, 5, 10, 20, 50, ...
    return 4 * step


def _fmt(value: float) -> str:
    if value >= 1000:
        return f"{value:,.0f}"
    if value >= 10 or value == int(value):
        return f"{value:.0f}"
    return f"{value:.2g}" if value < 1 else f"{value:.1f}"


def _frame(title: str, top: float, unit: str) -> list[str]:
    """A chart's opening: the svg element, its title (for screen readers and shown above the plot), and
    the grid with its y labels from 0 to `top`."""
    plot_h = HEIGHT - TOP - BOTTOM
    parts = [
        f'<svg class="chart" role="img" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'width="{WIDTH}" height="{HEIGHT}" aria-label="{escape(title)}">',
        f"<title>{escape(title)}</title>",
        f'<text x="{LEFT}" y="14" font-size="12" font-weight="bold" fill="#333">{escape(title)}</text>',
    ]
    for i in range(5):  # grid and y labels
        y = TOP + plot_h - plot_h * i / 4
        parts.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" stroke="#ddd"/>')
        parts.append(
            f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11" fill="#666">'
            f"{escape(_fmt(top * i / 4))}{escape(unit)}</text>"
        )
    return parts


def bar_chart(
    *,
    title: str,
    categories: list[str],
    series: list[Series],
    unit: str = "",
    stacked: bool = False,
    counts: bool = False,
) -> SafeString:
    """Grouped (or stacked) bars, one group per category, one colour per series, with a legend. `counts`:
    the values are whole numbers, and so is every y label."""
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    n = max(len(categories), 1)
    if stacked:
        peak = max((sum(s.values[i] for s in series) for i in range(len(categories))), default=0)
    else:
        peak = max((v for s in series for v in s.values), default=0)
    top = _whole_max(peak) if counts else _nice_max(peak)
    parts = _frame(title, top, unit)
    group_w = plot_w / n
    bar_w = group_w * 0.7 / (1 if stacked else max(len(series), 1))
    # Every category labelled while labels have 40 px each, else every step-th one (the last one always).
    step = math.ceil(n * 40 / plot_w)
    for ci, category in enumerate(categories):
        x0 = LEFT + ci * group_w + group_w * 0.15
        base = 0.0
        for si, s in enumerate(series):
            value = s.values[ci]
            h = plot_h * value / top
            x = x0 if stacked else x0 + si * bar_w
            y = TOP + plot_h - h - (plot_h * base / top if stacked else 0)
            parts.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(bar_w - 1, 1):.1f}" height="{h:.1f}" '
                f'fill="{PALETTE[si % len(PALETTE)]}"><title>{escape(s.name)} · {escape(category)}: '
                f"{escape(_fmt(value))}{escape(unit)}</title></rect>"
            )
            if stacked:
                base += value
        if (n - 1 - ci) % step == 0:
            parts.append(
                f'<text x="{LEFT + ci * group_w + group_w / 2:.1f}" y="{TOP + plot_h + 16}" text-anchor="middle" '
                f'font-size="11" fill="#444">{escape(category)}</text>'
            )
    parts.append(f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{WIDTH - RIGHT}" y2="{TOP + plot_h}" stroke="#888"/>')
    x = LEFT
    for si, s in enumerate(series):  # legend
        parts.append(
            f'<rect x="{x}" y="{HEIGHT - 18}" width="10" height="10" fill="{PALETTE[si % len(PALETTE)]}"/>'
            f'<text x="{x + 14}" y="{HEIGHT - 9}" font-size="11" fill="#444">{escape(s.name)}</text>'
        )
        x += 24 + 7 * len(s.name)
    if not series or peak == 0:
        parts.append(
            f'<text x="{LEFT + plot_w / 2}" y="{TOP + plot_h / 2}" text-anchor="middle" font-size="13" '
            f'fill="#999">{escape(no_data())}</text>'
        )
    parts.append("</svg>")
    return mark_safe("".join(parts))  # every interpolated text is escaped above


def line_chart(*, title: str, labels: list[str], series: list[Series], unit: str = "") -> SafeString:
    """Lines over evenly spaced x labels (only every few labels printed); gaps (None) break the line."""
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    values = [v for s in series for v in s.values if v is not None]
    top = _nice_max(max(values, default=0))
    n = max(len(labels) - 1, 1)
    parts = _frame(title, top, unit)
    every = max(1, len(labels) // 8)
    for i, label in enumerate(labels):
        if i % every == 0:
            parts.append(
                f'<text x="{LEFT + plot_w * i / n:.1f}" y="{TOP + plot_h + 16}" text-anchor="middle" '
                f'font-size="11" fill="#444">{escape(label)}</text>'
            )
    for si, s in enumerate(series):
        colour = PALETTE[si % len(PALETTE)]
        d, pen_down = [], False
        for i, v in enumerate(s.values):
            if v is None:
                pen_down = False
                continue
            x, y = LEFT + plot_w * i / n, TOP + plot_h - plot_h * v / top
            d.append(f"{'L' if pen_down else 'M'}{x:.1f},{y:.1f}")
            parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{colour}"/>')
            pen_down = True
        if d:
            parts.append(f'<path d="{" ".join(d)}" fill="none" stroke="{colour}" stroke-width="2"/>')
    parts.append(f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{WIDTH - RIGHT}" y2="{TOP + plot_h}" stroke="#888"/>')
    x = LEFT
    for si, s in enumerate(series):
        parts.append(
            f'<rect x="{x}" y="{HEIGHT - 18}" width="10" height="10" fill="{PALETTE[si % len(PALETTE)]}"/>'
            f'<text x="{x + 14}" y="{HEIGHT - 9}" font-size="11" fill="#444">{escape(s.name)}</text>'
        )
        x += 24 + 7 * len(s.name)
    if not values:
        parts.append(
            f'<text x="{LEFT + plot_w / 2}" y="{TOP + plot_h / 2}" text-anchor="middle" font-size="13" '
            f'fill="#999">{escape(no_data())}</text>'
        )
    parts.append("</svg>")
    return mark_safe("".join(parts))  # every interpolated text is escaped above

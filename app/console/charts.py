"""Bar charts drawn on the server as SVG: no script, nothing for the content security policy
to allow, and each bar's figure in its own ``<title>`` (and the chart's in a table beside it)
for screen readers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

WIDTH = 720
HEIGHT = 160
GAP = 0.15
"""The share of each slot left empty between bars."""


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    label: str
    value: int


@dataclass(frozen=True)
class Chart:
    id: str
    title: str
    bars: list[Bar]
    peak: int
    first_label: str
    last_label: str
    width: int = WIDTH
    height: int = HEIGHT


def bar_chart(chart_id: str, title: str, points: Sequence[tuple[str, int]]) -> Chart:
    """One bar per ``(label, value)``, scaled to the largest value."""
    peak = max((value for _, value in points), default=0)
    slot = WIDTH / max(1, len(points))
    bars = []
    for i, (label, value) in enumerate(points):
        height = 0.0 if peak == 0 else (HEIGHT - 1) * value / peak
        bars.append(
            Bar(
                x=round(i * slot + slot * GAP / 2, 2),
                y=round(HEIGHT - height, 2),
                width=round(slot * (1 - GAP), 2),
                height=round(height, 2),
                label=label,
                value=value,
            )
        )
    first = points[0][0] if points else ""
    last = points[-1][0] if points else ""
    return Chart(chart_id, title, bars, peak, first, last)


def bucket_label(start: int, width: int) -> str:
    """A bucket's start as a chart labels it: the day for days, else the time (UTC)."""
    moment = datetime.fromtimestamp(start, tz=timezone.utc)
    return moment.strftime("%Y-%m-%d" if width >= 86400 else "%H:%M")


def series(totals: dict[int, int], *, start: int, width: int, count: int) -> list[tuple[str, int]]:
    """``count`` buckets from ``start``, each with its total (0 where it has none)."""
    return [
        (bucket_label(start + i * width, width), totals.get(start + i * width, 0))
        for i in range(count)
    ]

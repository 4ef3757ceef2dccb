"""Charts of the Sync view as geometry for an inline SVG (drawn by the ``chart`` macro of
``templates/macros.html``): no script, no library, no request of its own, coloured by the page's
CSS variables so they follow Airflow's light and dark modes.

A chart maps time to x and a value to y linearly inside its plot area: ``x = left + (t - start) /
(end - start) * plot_width``, ``y = top + plot_height * (1 - v / top_value)``, where the top value
is the series' greatest rounded up to 1, 2 or 5 times a power of ten. Each point is drawn as a
``circle`` carrying its time and value (``data-t``, ``data-v``; a tooltip), so a test finds it
where its value puts it.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field

from airflow_sync_provider.core.series import Point, rates


@dataclass(frozen=True)
class Dot:
    x: float
    y: float
    t: float
    v: float
    title: str


@dataclass
class Line:
    name: str  # its CSS class: lag, rate, errors …
    label: str
    dots: list[Dot]

    @property
    def path(self) -> str:
        return " ".join(f"{'M' if i == 0 else 'L'}{d.x:.1f},{d.y:.1f}" for i, d in enumerate(self.dots))


@dataclass
class Chart:
    width: int
    height: int
    left: int
    top: int
    plot_width: int
    plot_height: int
    start: float
    end: float
    top_value: float
    lines: list[Line] = field(default_factory=list)
    y_ticks: list[tuple[float, str]] = field(default_factory=list)  # (y, label)
    x_ticks: list[tuple[float, str]] = field(default_factory=list)  # (x, label)
    title: str = ""
    marks: list[Dot] = field(default_factory=list)  # events on the time axis (errors)

    def x(self, t: float) -> float:
        return self.left + (t - self.start) / (self.end - self.start) * self.plot_width

    def y(self, v: float) -> float:
        return self.top + self.plot_height * (1 - v / self.top_value)

    @property
    def empty(self) -> bool:
        return not any(line.dots for line in self.lines)


def nice_top(value: float) -> float:
    """The smallest of 1, 2, 5 × 10^k at or above ``value`` (1 for nothing)."""
    if value <= 0 or not math.isfinite(value):
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    return next(step * power for step in (1, 2, 5, 10) if step * power >= value * (1 - 1e-9))


def short_number(value: float) -> str:
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            return f"{value / size:.3g}{suffix}"
    return f"{value:.3g}"


def _clock(t: float, span: float) -> str:
    moment = dt.datetime.fromtimestamp(t, dt.timezone.utc)
    return moment.strftime("%H:%M" if span <= 86400 else "%a %d %H:%M")


def time_chart(lines: dict[str, tuple[str, list[tuple[float, float]]]], start: float, end: float, unit: str = "",
               size: tuple[int, int] = (560, 170), axes: bool = True) -> Chart:
    """Lines over ``[start, end]``: ``{css name: (label, [(t, v), ...])}``; ``size`` in px.
    Without ``axes`` (a sparkline) the plot fills the box."""
    width, height = size
    left, top, right, bottom = (48, 10, 12, 22) if axes else (1, 2, 1, 2)
    values = [v for _, points in lines.values() for _, v in points]
    chart = Chart(width, height, left, top, width - left - right, height - top - bottom, start, max(end, start + 1),
                  nice_top(max(values, default=0.0)))
    for name, (label, points) in lines.items():
        dots = [Dot(chart.x(t), chart.y(v), t, v, f"{_clock(t, 0)} UTC: {short_number(v)}{unit} {label}")
                for t, v in points if start <= t <= chart.end]
        chart.lines.append(Line(name, label, dots))
    if axes:
        chart.y_ticks = [(chart.y(v), short_number(v) + unit) for v in (0, chart.top_value / 2, chart.top_value)]
        span = chart.end - chart.start
        chart.x_ticks = [(chart.x(t), _clock(t, span)) for t in (start + span * i / 4 for i in range(5))]
    return chart


def pipeline_charts(points: list[Point], start: float, end: float) -> tuple[Chart, Chart]:
    """A pipeline's window: its lag (the worst of each point, the points with a failure marked) and the row changes
    it applied per second, with the shards its verification repaired per minute beside them."""
    lag = time_chart({"lag": ("s behind", [(p.at, p.lag) for p in points])}, start, end, " s")
    lag.title = "lag behind the source"
    lag.marks = [Dot(lag.x(p.at), lag.top + lag.plot_height, p.at, p.errors,
                     f"{_clock(p.at, 0)} UTC: {p.errors} failure(s) or stop(s)") for p in points if p.errors]
    repairs = [(t, v * 60) for t, v in rates(points, "repairs")]
    rate = time_chart({"rate": ("changes/s", rates(points, "changes")),
                       "repairs": ("shards repaired/min", [r for r in repairs if r[1] > 0])}, start, end)
    rate.title = "row changes applied per second"
    return lag, rate


def load_chart(points: list[Point], start: float, end: float) -> Chart:
    """A load's rows written per second over its series."""
    chart = time_chart({"rate": ("rows/s", rates(points, "rows"))}, start, end)
    chart.title = "rows written per second"
    return chart


def sparkline(points: list[Point], start: float, end: float) -> Chart:
    """A pipeline's lag as a small line for the first page's table."""
    return time_chart({"lag": ("s behind", [(p.at, p.lag) for p in points])}, start, end, " s", (112, 22), False)

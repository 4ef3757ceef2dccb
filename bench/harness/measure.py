"""Timing and statistics: wall clocks, load averages, rates, percentiles, rounds, and how the
result files write numbers ("—" where there is none)."""

from __future__ import annotations

import contextlib
import os
import statistics
import time


@contextlib.contextmanager
def timer():
    """``with timer() as t: …`` → ``t["seconds"]``, the wall time of the block."""
    box = {}
    start = time.perf_counter()
    yield box
    box["seconds"] = time.perf_counter() - start


class LoadAverage:
    """The 1-min load average before → after a block (the machine may be shared with other work)."""

    def __enter__(self):
        self.before = os.getloadavg()[0]
        return self

    def __exit__(self, *exc):
        self.after = os.getloadavg()[0]

    def __str__(self):
        return f"{self.before:.2f}→{self.after:.2f}"


def fmt_load(values) -> str:
    """A load average triple (os.getloadavg()) as 1-min/5-min/15-min."""
    return "/".join(f"{v:.2f}" for v in values)


# --- statistics ---------------------------------------------------------------------------------

def rate(n, seconds) -> float | None:
    """``n`` per second, None when either is missing or zero."""
    return n / seconds if n and seconds else None


def percentile(values, q: float, nearest: bool = False) -> float | None:
    """The ``q`` quantile (0…1) of ``values``: interpolated between the two nearest ranks, or with
    ``nearest`` the value at rank ⌊q·n⌋ itself; None for no values."""
    if not values:
        return None
    values = sorted(values)
    if nearest:
        return values[min(len(values) - 1, int(q * len(values)))]
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def median(values) -> float | None:
    """The median of the rounds that have a value (None for none)."""
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def interleaved(variants, rounds: int):
    """(round, variant) for ``rounds`` rounds of every variant, every other round in reverse
    order: no variant always runs first (the machine's load changes from minute to minute)."""
    for round_ in range(rounds):
        for variant in list(variants)[::1 if round_ % 2 == 0 else -1]:
            yield round_, variant


# --- numbers as the result files write them -----------------------------------------------------

def fmt_num(value, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def fmt_rate(value) -> str:
    return f"{value:,.0f}" if value else "—"


def fmt_ratio(a, b) -> str:
    return f"{a / b:.2f}×" if a is not None and b else "—"


def fmt_rounds(values, digits: int = 2, sep: str = ", ") -> str:
    """Every round's value, in the order given."""
    return sep.join(f"{v:.{digits}f}" for v in values)


def fmt_median(values, digits: int = 2) -> str:
    return fmt_num(median(values), digits)


def fmt_range(values, digits: int = 2) -> str:
    """min–max of the rounds that have a value."""
    values = sorted(v for v in values if v is not None)
    return f"{values[0]:.{digits}f}–{values[-1]:.{digits}f}" if values else "—"


def fmt_change(base_seconds: float, seconds: float) -> str:
    """The change in rows/s from ``base_seconds`` to ``seconds`` for the same work, as a percentage."""
    return f"{(base_seconds / seconds - 1) * 100:+.1f} %"

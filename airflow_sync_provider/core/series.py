"""Time series the Sync view draws: per CDC pipeline its lag, row changes applied (so changes/s),
verification repairs and failures (a count); per running load its rows written (so rows/s) and shards done.
Plain Python over the ledger (no Airflow, no pyspark, no HTML: plugins/charts.py draws them).

**Where the points come from.** No job makes a write of its own for them: a pipeline's point is
taken when its state is written (``Checkpoints.write``, i.e. at a checkpoint advance or a status
change), a load's by the driver's progress thread as it writes its heartbeat (spark/channels.py).
Both go through :class:`SeriesWriter`, which keeps at most one point per subject every
:data:`STEP_SECONDS` (the writes in between are skipped, a status change is always kept): at most
one small insert per checkpoint advance, in practice one every 10 s while a pipeline runs. A
point that cannot be written is logged and dropped: the series never fails a job.

**Bounded.** One ``series`` table in the ledger (MergeTree), kept by ClickHouse TTLs: points of
the last :data:`RAW_DAYS` day as written (at most one per 10 s: 8,640 a subject a day); older ones
merged into one point per :data:`COARSE_SECONDS` (5 min: 288 a day; the worst lag, the newest
counters of those 5 minutes); points older than :data:`KEPT_DAYS` days dropped. So a subject holds
at most ~10,700 rows (8,640 + 7 × 288), whatever its age. TTLs act on ClickHouse's merges;
whatever the merges have done, a read aggregates the window it asks for into at most
``buckets`` points, so a chart's cost does not grow with the table.

Counters are stored as running totals (a pipeline's ``events``, its shards repaired; a load's rows
written): a point lost or merged loses no change, and a rate is the difference of two points
over their distance in time (:func:`rates`; a total that went down — a load started afresh —
counts from zero).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, fields

from airflow_sync_provider.core.ledger import TIME_TYPE, LedgerTables, utc_datetime
from airflow_sync_provider.core.metrics import lag_seconds

log = logging.getLogger(__name__)

PIPELINE, LOAD = "pipeline", "load"
STEP_SECONDS = 10.0  # a subject's points are at least this far apart
RAW_DAYS = 1  # points younger than this are kept as written
COARSE_SECONDS = 300  # older ones: one point per 5 minutes
KEPT_DAYS = 8  # older ones are dropped
# the windows a page draws: name → seconds (each read as at most WINDOW_BUCKETS points)
WINDOWS = {"hour": 3600, "day": 86400, "week": 7 * 86400}
WINDOW_BUCKETS = 120

_SERIES = (
    ("kind", "LowCardinality(String)"), ("subject", "String"), ("at", TIME_TYPE),
    ("lag", "Float64"),  # a pipeline's lag behind its source, seconds (the worst of a merged point)
    ("changes", "UInt64"),  # a pipeline's row changes applied, in total
    ("repairs", "UInt64"),  # a pipeline's shards repaired by its verification, in total
    # failures recorded: 1 at the state a pipeline's failure or stop wrote (once per failure: its applier
    # writes that state once, as it ends), else 0; a merged or bucketed point: how many in it
    ("errors", "UInt64"),
    ("rows", "UInt64"),  # a load's rows written, in total
    ("shards_done", "UInt32"), ("shards", "UInt32"),  # a load's shards done, of planned
)
_VALUES = [n for n, _ in _SERIES[3:]]
_COARSE = f"toStartOfInterval(at, INTERVAL {COARSE_SECONDS} SECOND)"
_ENGINE = (f"MergeTree ORDER BY (kind, subject, {_COARSE}, at)"
           f" TTL toDateTime(at) + INTERVAL {RAW_DAYS} DAY GROUP BY kind, subject, {_COARSE}"
           f" SET at = max(at), lag = max(lag), changes = max(changes), repairs = max(repairs),"
           f" errors = sum(errors), rows = max(rows), shards_done = max(shards_done), shards = max(shards),"
           f" toDateTime(at) + INTERVAL {KEPT_DAYS} DAY DELETE")


@dataclass(frozen=True)
class Point:
    """One point of a subject's series (a merged or bucketed one: the worst lag, the newest totals,
    the failures in it)."""

    at: float
    lag: float = 0.0
    changes: int = 0
    repairs: int = 0
    errors: int = 0
    rows: int = 0
    shards_done: int = 0
    shards: int = 0

    def values(self) -> list:
        return [getattr(self, n) for n in _VALUES]

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def pipeline_point(state, now: float | None = None, failures: int = 0) -> Point | None:
    """A pipeline's point from its state (core/cdc/checkpoints.PipelineState) and the failures it
    records (see :meth:`SeriesWriter.pipeline`); None before it has a checkpoint (no lag to tell)
    unless it ended badly."""
    now = time.time() if now is None else now
    lag = lag_seconds(state, now)
    if lag is None and not state.ended_badly:
        return None
    return Point(now, round(lag or 0.0, 3), state.events, state.verification()["repaired_shards"], failures)


def load_point(state, shards: dict, now: float | None = None) -> Point:
    """A running load's point: rows written and shards done over its shards' newest attempts."""
    return Point(time.time() if now is None else now, rows=sum(s.records_written for s in shards.values()),
                 shards_done=sum(1 for s in shards.values() if s.status == "success"),
                 shards=len((state.plan or {}).get("shards", [])))


class Series(LedgerTables):
    """The ledger's ``series`` table: written through a :class:`SeriesWriter`, read by windows."""

    def ensure(self) -> None:
        self._ensure_tables([("series", _SERIES, _ENGINE)])

    def write(self, kind: str, points: dict[str, Point]) -> None:
        """Points as given, by subject (a test writes a series it then finds drawn)."""
        rows = [[kind, subject, utc_datetime(p.at), *p.values()] for subject, p in points.items()]
        if rows:
            self._insert("series", rows, _SERIES)

    def read(self, kind: str, subjects: list[str], since: float, until: float | None = None,
             buckets: int = WINDOW_BUCKETS) -> dict[str, list[Point]]:
        """Each subject's points in ``[since, until]``, at most ``buckets`` of them: a bucket is the
        window's equal part, its point at its newest point's time with the worst lag, the newest
        totals and the failures recorded in it. Subjects without points are left out."""
        if not subjects or not self.exists("series"):
            return {}
        until = time.time() if until is None else until
        width = max(1e-3, (until - since) / max(1, buckets))
        result = self.ch.query(
            f"SELECT subject, toFloat64(max(at)), max(lag), max(changes), max(repairs), sum(errors), max(rows),"
            f" max(shards_done), max(shards) FROM {self.table('series')}"
            " WHERE kind = {k:String} AND subject IN {s:Array(String)}"
            " AND at >= fromUnixTimestamp64Micro({a:Int64}) AND at <= fromUnixTimestamp64Micro({b:Int64})"
            " GROUP BY subject, intDiv(toUnixTimestamp64Micro(at) - {a:Int64}, {w:Int64}) ORDER BY subject, 2",
            parameters={"k": kind, "s": list(subjects), "a": int(since * 1e6), "b": int(until * 1e6),
                        "w": int(width * 1e6)})
        out: dict[str, list[Point]] = {}
        for subject, at, *values in result.result_rows:
            out.setdefault(subject, []).append(Point(at, *values))
        return out

    def window(self, kind: str, subjects: list[str], window: str, now: float | None = None,
               buckets: int = WINDOW_BUCKETS) -> dict[str, list[Point]]:
        """:meth:`read` over one of :data:`WINDOWS` ending now."""
        now = time.time() if now is None else now
        return self.read(kind, subjects, now - WINDOWS[window], now, buckets)


def worst_lag(series: list[list[Point]], width: float) -> list[Point]:
    """Several subjects' points (a source group's pipelines) as one line: the worst lag of each
    ``width`` seconds, at its newest point's time, with the failures recorded in it."""
    out: dict[int, Point] = {}
    for points in series:
        for p in points:
            had = out.get(int(p.at // width))
            out[int(p.at // width)] = p if had is None else Point(
                max(p.at, had.at), max(p.lag, had.lag), errors=p.errors + had.errors)
    return [Point(p.at, p.lag, errors=p.errors) for _, p in sorted(out.items())]


def rates(points: list[Point], total: str) -> list[tuple[float, float]]:
    """Per second between consecutive points of a running total (``changes``, ``rows``,
    ``shards_done``), at the later point's time; a total that went down counts from zero."""
    out = []
    for before, after in zip(points, points[1:]):
        span = after.at - before.at
        if span > 0:
            grown = getattr(after, total) - getattr(before, total)
            out.append((after.at, (grown if grown >= 0 else getattr(after, total)) / span))
    return out


def finish_estimate(points: list[Point], estimated_rows: int, planned: int, now: float | None = None,
                    recent: float = 900.0) -> float | None:
    """When a running load should finish, from its pace over the last ``recent`` seconds of its
    series: rows written towards the plan's estimate (shards done when there is no estimate or no
    row moved). None when it has not moved (or has no two points)."""
    now = time.time() if now is None else now
    latest = points[-1] if points else None
    if latest is None:
        return None
    earlier = next((p for p in points if p.at >= latest.at - recent and p.at < latest.at), None)
    if earlier is None:
        return None
    span = latest.at - earlier.at
    for done, goal in ((latest.rows - earlier.rows, estimated_rows - latest.rows),
                       (latest.shards_done - earlier.shards_done, planned - latest.shards_done)):
        if done > 0 and goal >= 0:
            return now + max(0.0, goal) * span / done
    return None


class SeriesWriter:
    """Keeps at most one point a subject every :data:`STEP_SECONDS` (a status change always
    kept), and never fails its caller: a point that cannot be written is logged and dropped."""

    def __init__(self, client, database: str, step: float = STEP_SECONDS):
        self.series = Series(client, database)
        self.step = step
        self._last: dict[tuple[str, str], tuple[float, object]] = {}
        self._ready = False

    def _due(self, kind: str, subject: str, at: float, mark) -> bool:
        last = self._last.get((kind, subject))
        return last is None or at - last[0] >= self.step or last[1] != mark

    def _write(self, kind: str, points: dict[str, Point], marks: dict) -> None:
        if not points:
            return
        try:
            if not self._ready:
                self.series.ensure()
                self._ready = True
            self.series.write(kind, points)
        except Exception as exc:  # the series is for people looking at pages: never fail the job for it
            log.info(f"series: {len(points)} point(s) of {kind} not written ({type(exc).__name__}: {exc})"[:500])
            return
        for subject, p in points.items():
            self._last[(kind, subject)] = (p.at, marks.get(subject))

    def pipeline(self, state, now: float | None = None) -> None:
        """Note a pipeline's state as it is written (``Checkpoints.write``). A failed or stopped
        state this writer has not just written (its applier writes it once, as it ends: a retry's
        applier writes ``running`` first) is a failure recorded: its point counts 1 in ``errors``."""
        now = time.time() if now is None else now
        if not self._due(PIPELINE, state.pipeline, now, state.status):
            return  # (checked first: this runs at every checkpoint, the point reads every table's state)
        try:
            last = self._last.get((PIPELINE, state.pipeline))
            failures = int(state.ended_badly and (last is None or last[1] != state.status))
            point = pipeline_point(state, now, failures)
        except Exception as exc:  # as _write: never fail the checkpoint's write for a chart's point
            log.info(f"series: pipeline {state.pipeline}'s point not taken ({type(exc).__name__}: {exc})"[:500])
            return
        if point is not None:
            self._write(PIPELINE, {state.pipeline: point}, {state.pipeline: state.status})

    def loads(self, found: list[tuple], now: float | None = None) -> None:
        """Note running loads' progress: ``(LoadState, {shard id: ShardState})`` each (the
        progress thread's own reading of their shards)."""
        points = {}
        for state, shards in found:
            point = load_point(state, shards, now)
            if self._due(LOAD, state.load_key, point.at, point.shards_done == point.shards):
                points[state.load_key] = point
        self._write(LOAD, points, {k: p.shards_done == p.shards for k, p in points.items()})

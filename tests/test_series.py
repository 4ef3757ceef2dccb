"""The Sync view's time series (core/series.py) over a real ledger, and its charts
(plugins/charts.py): bounded (points at most every 10 s, merged after a day, dropped after 8),
read back as at most the asked number of points, and drawn where their values put them."""

from __future__ import annotations

import dataclasses
import re
import time

import pytest

from airflow_sync_provider.core.cdc.checkpoints import Checkpoints, PipelineState
from airflow_sync_provider.core.loads import LoadState, ShardState
from airflow_sync_provider.core.overview import LoadRow
from airflow_sync_provider.core.positions import BinlogPosition
from airflow_sync_provider.core.series import (
    COARSE_SECONDS,
    KEPT_DAYS,
    PIPELINE,
    Point,
    Series,
    SeriesWriter,
    finish_estimate,
    rates,
)
from airflow_sync_provider.plugins import charts, pages
from tests.ledger_fill import fresh


@pytest.fixture
def series(ch):
    yield from fresh(ch, Series, "series")


def test_points_are_kept_every_10_s_at_most_merged_after_a_day_and_dropped_after_8(series, ch):
    now = time.time()
    writer = SeriesWriter(ch, series.database)
    state = PipelineState("p", "running", BinlogPosition("f.1", 4), source_position=BinlogPosition("f.1", 9),
                          source_time=now - 30, events=10)
    for i in range(30):  # a checkpoint a second for 30 s: three points
        state.events += 5
        writer.pipeline(state, now + i)
    state.status = "failed"  # a status change is kept whatever the step
    writer.pipeline(state, now + 30.5)
    kept = series.read(PIPELINE, ["p"], now - 1, now + 60, buckets=1000)["p"]
    assert [p.at - now for p in kept] == pytest.approx([0, 10, 20, 30.5], abs=1e-3)
    assert [p.changes for p in kept] == [15, 65, 115, 160] and [p.errors for p in kept] == [0, 0, 0, 1]
    assert kept[0].lag == pytest.approx(30, abs=0.01)
    # errors count failures: the failed state written again is none; a retry running then failing again is one
    writer.pipeline(state, now + 45)
    state.status = "running"
    writer.pipeline(state, now + 46)
    state.status = "stopped"
    writer.pipeline(state, now + 47)
    kept = series.read(PIPELINE, ["p"], now - 1, now + 60, buckets=1000)["p"]
    assert [(round(p.at - now, 1), p.errors) for p in kept[3:]] == [(30.5, 1), (45, 0), (46, 0), (47, 1)]
    assert series.read(PIPELINE, ["p"], now - 1, now + 60, buckets=1)["p"][0].errors == 2  # a bucket sums them

    # a week and a half of points every 10 s (as a busy pipeline writes them), then ClickHouse's merge
    span = int((KEPT_DAYS + 2) * 86400 / 10)
    ch.command(f"INSERT INTO {series.table('series')} (kind, subject, at, lag, changes)"
               f" SELECT 'pipeline', 'busy', now64(6) - toIntervalSecond(number * 10), number % 100, {span} - number"
               f" FROM numbers({span})")
    ch.command(f"INSERT INTO {series.table('series')} (kind, subject, at, errors) SELECT 'pipeline', 'flaky',"
               f" toStartOfInterval(now64(6) - INTERVAL 3 DAY, INTERVAL {COARSE_SECONDS} SECOND)"
               f" + toIntervalSecond(number * 10 + 5), number % 2 = 0 FROM numbers(3)")  # failures 1, 0, 1
    ch.command(f"OPTIMIZE TABLE {series.table('series')} FINAL")
    assert ch.query(f"SELECT count(), sum(errors) FROM {series.table('series')} WHERE subject = 'flaky'"
                    ).result_rows == [(1, 2)]  # merged into one point that keeps both failures
    rows, oldest = ch.query(f"SELECT count(), toFloat64(min(at)) FROM {series.table('series')}"
                            " WHERE subject = 'busy'").result_rows[0]
    bound = 86400 // 10 + (KEPT_DAYS - 1) * 86400 // COARSE_SECONDS + 2
    assert rows <= bound, (rows, bound)  # 8,640 raw + 7 × 288 merged
    assert time.time() - oldest <= KEPT_DAYS * 86400 + COARSE_SECONDS
    coarse = ch.query(f"SELECT max(lag), count() FROM {series.table('series')} WHERE subject = 'busy'"
                      " AND at < now() - INTERVAL 2 DAY").result_rows[0]
    assert coarse[0] == 99  # a merged point keeps the worst lag of its 5 minutes
    week = series.window(PIPELINE, ["busy"], "week")["busy"]
    assert 100 <= len(week) <= 121 and all(a.at < b.at for a, b in zip(week, week[1:]))


def test_a_state_written_makes_a_point_and_rates_and_finish_come_from_totals(series, ch):
    book = Checkpoints(ch, series.database)
    book.ensure()
    state = PipelineState("cdc", "running", BinlogPosition("f.1", 4), source_position=BinlogPosition("f.1", 4),
                          events=7)
    book.write(state)
    assert series.read(PIPELINE, ["cdc"], time.time() - 60)["cdc"][0].changes == 7

    points = [Point(100, changes=0), Point(110, changes=50), Point(130, changes=10)]  # a reset counts from zero
    assert rates(points, "changes") == [(110, 5.0), (130, 0.5)]
    load = [Point(1000, rows=0, shards_done=0, shards=10), Point(1600, rows=300, shards_done=3, shards=10)]
    assert finish_estimate(load, 1000, 10, now=1600) == pytest.approx(1600 + 700 * 2)  # 0.5 rows/s, 700 to go
    assert finish_estimate(load, 0, 10, now=1600) == pytest.approx(1600 + 7 * 200)  # no estimate: by shards
    assert finish_estimate(load[:1], 1000, 10) is None


def test_a_chart_puts_each_point_where_its_time_and_value_say():
    start = 1_000_000.0
    wrote = [(start + 600, 0.0), (start + 1200, 60.0), (start + 1800, 150.0), (start + 3000, 30.0)]
    points = [Point(t, lag=v) for t, v in wrote]
    lag, rate = charts.pipeline_charts(points, start, start + 3600)
    assert lag.top_value == 200  # 150 rounded up to 1, 2 or 5 × 10^k
    line = lag.lines[0]
    for dot, (t, v) in zip(line.dots, wrote, strict=True):
        assert dot.x == pytest.approx(lag.left + (t - start) / 3600 * lag.plot_width)
        assert dot.y == pytest.approx(lag.top + lag.plot_height * (1 - v / 200))
    assert line.dots[0].y == lag.top + lag.plot_height and line.path.startswith(f"M{line.dots[0].x:.1f},")
    assert [label for _, label in lag.y_ticks] == ["0 s", "100 s", "200 s"]
    svg = pages.ENV.from_string("{% import 'macros.html' as m %}{{ m.chart(c, 'lag') }}").render(c=lag)
    drawn = [(float(t), float(v), float(x), float(y)) for x, y, t, v in re.findall(
        r"<circle cx='([\d.]+)' cy='([\d.]+)' r='2' data-t='([\d.]+)' data-v='([\d.]+)'>", svg)]
    assert [(t, v) for t, v, _, _ in drawn] == wrote
    assert all(abs(x - d.x) < 0.06 and abs(y - d.y) < 0.06 for (_, _, x, y), d in zip(drawn, line.dots))
    assert "<rect" not in svg  # lines and dots only: themable, and the bar charts' counts stay theirs
    assert charts.nice_top(0) == 1 and charts.nice_top(101) == 200 and charts.nice_top(5) == 5


def test_a_running_loads_page_shows_the_estimated_finish_of_the_first_pages_running_table():
    now = time.time()
    shards = {i: ShardState(i, 1, "success" if i < 3 else "running", "", [], records_written=100) for i in range(5)}
    plan = {"shards": [{"id": i, "estimated_rows": 200} for i in range(5)]}
    state = LoadState("db.t<1>", 1, "running", "db.t", "db.t", plan, "", 0, {}, heartbeat=now, shards=shards)
    series = [Point(now - 600, rows=200, shards_done=1, shards=5), Point(now, rows=500, shards_done=3, shards=5)]
    finish = finish_estimate(series, 1000, 5, now)  # 300 rows in 600 s, 500 to go: 1,000 s
    assert finish == pytest.approx(now + 1000)
    row = LoadRow.of(state, "wait", series=series)
    assert (row.estimated_rows, row.planned, row.done) == (1000, 5, 3) and row.finish(now) == finish
    page = pages.load_html(state, ("wait", "shards running"), None, None, series, now)
    line = re.search(r"<p id='progress-line'>(.*?)</p>", page, re.S).group(1)
    assert f"data-finish='{finish:.0f}'" in line and "3/5 shards, 500 of ~1,000 rows (50%)" in line
    assert "progress-line" not in pages.load_html(dataclasses.replace(state, status="published"),
                                                  ("success", ""), None, None, series, now)

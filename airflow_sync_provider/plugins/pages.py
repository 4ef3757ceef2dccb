"""The Sync view's pages, and the reconciliation and snapshot-diff reports, as HTML: rendered from
the Jinja2 templates in ``plugins/templates/`` with autoescaping on (every value is escaped
unless a template marks it safe, and none does). What they show is gathered elsewhere, in plain
Python: the Sync view's data by core/overview.py, a reconciliation or a diff run by its job (or
read back from the ledger).

Imports jinja2, not Airflow: the operators and the command line write the report pages too
(plugins/reports.py), without the API server.

Server-rendered in Airflow's look (templates/theme.css; templates/mode.html, the one script, follows the UI's
colour mode), readable without script, every row linked to the Airflow task instance that produced it.
Links are relative to ``/sync/``: a task instance is ``../dags/<dag>/runs/<run>/tasks/<task>``
(``/mapped/<index>`` for a mapped one), the Airflow UI's own route, so they hold under any
``[api] base_url`` path.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import NamedTuple
from urllib.parse import quote, urlencode

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from airflow_sync_provider.core.cdc.servers import Server
from airflow_sync_provider.core.clickhouse.layout import Layout
from airflow_sync_provider.core.content.shaping import describe_content
from airflow_sync_provider.core.ledger import TaskRef
from airflow_sync_provider.core.loads import SHARD_SUCCESS, LoadState
from airflow_sync_provider.core.overview import (
    ATTENTION_ROWS,
    FAILED,
    LAG_WARNING_SECONDS,
    PAGE_ROWS,
    RECENT_DAYS,
    SPARK_BUCKETS,
    STATES,
    Filters,
    LoadRow,
    Overview,
    PipelineRow,
)
from airflow_sync_provider.core.selection import TableSet
from airflow_sync_provider.core.series import WINDOWS, Point, worst_lag
from airflow_sync_provider.plugins import charts

REFRESH_SECONDS = 15
TEMPLATES = Path(__file__).with_name("templates")


def ti_path(task: TaskRef) -> str:
    """The Airflow UI's page of a task instance, relative to ``/sync/``."""
    path = (f"../dags/{quote(task.dag_id, safe='')}/runs/{quote(task.run_id, safe='')}"
            f"/tasks/{quote(task.task_id, safe='')}")
    return path + (f"/mapped/{task.map_index}" if task.map_index >= 0 else "")


def ago(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60), ("s", 1)):
        if seconds >= size or unit == "s":
            return f"{seconds / size:.0f} {unit} ago"


def since(at: float | None, now: float) -> str:
    return ago(now - at) if at else "–"


def clock(at: float) -> str:
    """A moment as the charts' axes give it: ``HH:MM UTC``."""
    return time.strftime("%H:%M UTC", time.gmtime(at))


def duration(seconds: float) -> str:
    return ago(max(0.0, seconds)).removesuffix(" ago")


def spark(points: list[Point], now: float) -> charts.Chart:
    """A pipeline's lag over the hour before ``now`` as a sparkline."""
    return charts.sparkline(points, now - WINDOWS["hour"], now)


def query(filters: Filters, **change) -> str:
    """The first page's query string for ``filters`` with ``change`` applied (defaults left out)."""
    values = {"table": filters.table, "state": filters.state, "load": filters.load, "page": filters.page,
              "days": filters.days} | change
    defaults = {"page": 1, "days": RECENT_DAYS}
    return "?" + urlencode({k: v for k, v in values.items() if v and defaults.get(k) != v})


class SourceGroup(NamedTuple):
    """A row of the pipelines' table heading a source group's pipelines."""

    name: str
    parts: list[PipelineRow]
    kind: str  # its worst pipeline's: failed, behind, else idle
    worst: str  # its worst lag, as shown
    series: list[Point]  # its worst lag over the last hour (a line like a pipeline's)


def grouped(pipelines: list[PipelineRow]) -> list[tuple[SourceGroup | None, PipelineRow | None]]:
    """The pipelines' table in order, as ``(group, None)`` or ``(None, pipeline)``: a source
    group's pipelines together under a row of the group, at the place of its first one."""
    out, seen = [], set()
    for p in pipelines:
        if p.group and p.group not in seen:
            seen.add(p.group)
            parts = [q for q in pipelines if q.group == p.group]
            lags = [q.lag for q in parts]
            kind = FAILED if any(q.failing for q in parts) else "behind" if any(q.behind for q in parts) else "idle"
            line = worst_lag([q.series for q in parts], WINDOWS["hour"] / SPARK_BUCKETS)
            out.append((SourceGroup(p.group, parts, kind, "–" if None in lags else f"{max(lags):,.0f} s", line), None))
            out += [(None, q) for q in parts]
        elif not p.group:
            out.append((None, p))
    return out


class Bar(NamedTuple):
    x: int
    y: float
    width: int
    height: float
    colour: str
    title: str


def minute_chart(counters: list[dict]) -> dict | None:
    """Row changes applied per minute (all tables) as bars, or None when there were none."""
    minutes: dict[str, int] = {}
    for c in counters:
        minutes[c["minute"]] = minutes.get(c["minute"], 0) + c["events"]
    if not minutes:
        return None
    top, bar, height = max(minutes.values()) or 1, 24, 80
    bars = [Bar(i * (bar + 6), height - n / top * height, bar, n / top * height, "#4e79a7", f"{m}: {n:,} changes")
            for i, (m, n) in enumerate(sorted(minutes.items()))]
    return {"bars": bars, "width": len(minutes) * (bar + 6), "height": height, "first": min(minutes),
            "last": max(minutes), "peak": top}


def shard_chart(shards: list[dict]) -> dict:
    """A reconciliation's source and target rows per shard as pairs of bars (a mismatched shard's
    target in red), each pair labelled with its shard."""
    top = max([max(s["source_rows"], s["target_rows"]) for s in shards] + [1])
    bar_w, gap, height = 18, 14, 220
    pairs = []
    for i, s in enumerate(shards):
        x = 50 + i * (2 * bar_w + gap)
        bad = bool(s["problems"])
        bars = [Bar(x + j * bar_w, 20 + height - value / top * height, bar_w - 2, value / top * height, colour,
                    f"shard {s['shard_id']}: {'source' if j == 0 else 'target'} {value:,}")
                for j, (value, colour) in enumerate(((s["source_rows"], "#4e79a7"),
                                                     (s["target_rows"], "#e15759" if bad else "#59a14f")))]
        pairs.append({"bars": bars, "label_x": x + bar_w, "label": f"{s['shard_id']}{' ✗' if bad else ''}"})
    return {"pairs": pairs, "width": len(shards) * (2 * bar_w + gap) + 60, "height": height + 50,
            "label_y": height + 38}


def _server(server: dict) -> str:
    return str(Server.from_dict(server))


def _cell(value) -> str:
    return "NULL" if value is None else str(value)


def _number(value) -> str:
    return "–" if value is None else f"{value:,}"


def _layout(layout, key: list | None = None) -> str:
    """A copy's layout in a line (core/clickhouse/layout.py); ``key``: its source key, when known."""
    return Layout.of(layout).summary(key)


ENV = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=True, undefined=StrictUndefined,
                  trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
ENV.filters.update(urlquote=lambda value: quote(str(value), safe=""), fmt=format, ago=ago, since=since,
                   server=_server, json=json.dumps, cell=_cell, number=_number, content=describe_content,
                   layout=_layout, clock=clock, duration=duration)
ENV.globals.update(ti_path=ti_path, query=query, grouped=grouped, FAILED=FAILED, STATES=STATES,
                   RECENT_DAYS=RECENT_DAYS, PAGE_ROWS=PAGE_ROWS, ATTENTION_ROWS=ATTENTION_ROWS,
                   LAG_WARNING_SECONDS=LAG_WARNING_SECONDS, REFRESH_SECONDS=REFRESH_SECONDS, spark=spark,
                   WINDOWS=WINDOWS)


def render(template: str, **context) -> str:
    return ENV.get_template(template).render(**context)


def overview_html(view: Overview, now: float | None = None) -> str:
    """The first page: counts, what needs attention with its remedy, running loads, pipelines,
    then a page of table loads (collapsed: a load's shards are on its own page)."""
    return render("overview.html", view=view, now=time.time() if now is None else now,
                  flagged=[p for p in view.pipelines if p.failing or p.behind])


def group_html(name: str, parts: list[PipelineRow], now: float | None = None) -> str:
    """A source group's pipelines: one copy, a row per source."""
    return render("group.html", name=name, parts=parts, now=time.time() if now is None else now)


def pipeline_html(p: PipelineRow, now: float | None = None) -> str:
    """One pipeline: state, lag, checkpoint, its tables' verification, what its copies hold and how
    they are laid out, schema changes, a chart of the changes applied per minute."""
    info = p.state.to_dict()
    now = time.time() if now is None else now
    changes = [(c["table"], {k: v for k, v in c.items() if k != "table"}) for c in info["schema_changes"]]
    lag, rate = charts.pipeline_charts(p.series, now - WINDOWS[p.window], now)
    return render("pipeline.html", p=p, s=p.state, info=info, changes=changes, chart=minute_chart(p.counters),
                  lag=lag, rate=rate, now=now)


def load_html(state: LoadState, verdict: tuple[str, str], task: TaskRef | None, check: dict | None,
              series: list[Point] | None = None, now: float | None = None) -> str:
    """One load in full: verdict, the task instance behind it, what the copy holds and how it is
    laid out, its rows per second over time (``series``, core/series.py), every shard's newest attempt."""
    now = time.time() if now is None else now
    series = series or []
    chart = charts.load_chart(series, series[0].at, series[-1].at) if len(series) > 1 else None
    shards = [(s, s.status != SHARD_SUCCESS or s.counters_disagree())
              for s in sorted(state.shards.values(), key=lambda s: s.shard_id)]
    spec = state.spec or {}
    tables = TableSet.of(spec.get("tableset"))
    content = tables.content_of()  # what the copy holds (never the salt)
    layout = tables.layout_of()  # the layout it asked for, a period load's partitions with it
    if spec.get("partition_by") and not layout.partition_by:
        layout = dataclasses.replace(layout, partition_by=spec["partition_by"])
    # a running load's progress and estimated finish as the first page's Running table shows them (one macro)
    row = LoadRow.of(state, verdict[0], task, check, series)
    return render("load.html", state=state, verdict=verdict, task=task, check=check, shards=shards, content=content,
                  layout=layout, chart=chart, series=series, row=row,
                  done=sum(1 for s in state.shards.values() if s.status == SHARD_SUCCESS), now=now)


def table_html(shape, now: float | None = None) -> str:
    """A copy's shape in one place (core/shape.CopyShape): source, key, layout, content, kept
    deletes, its loads, the pipelines and foreign keys that follow it."""
    return render("table.html", shape=shape, now=time.time() if now is None else now)


def diffs_html(runs: list[dict], prefix: str) -> str:
    """Snapshot-diff runs of the keys starting with ``prefix``."""
    return render("diffs.html", runs=runs, prefix=prefix)


def no_ledger_html(conn_id: str, setting: str, cause: str) -> str:
    """The page shown when the ledger's ClickHouse connection is missing or cannot be used."""
    return render("no_ledger.html", conn_id=conn_id, setting=setting, cause=cause)


def reconcile_html(result: dict) -> str:
    """A reconciliation (as the job returns it, or ``Ledger.reconciliation``): source vs target
    bars per shard, mismatches in red, the shards' hook counters and verdicts."""
    return render("reconcile.html", result=result, shape=result.get("shape") or {},
                  chart=shard_chart(result["shards"]))


def diff_html(result: dict, shards: list[dict], samples: dict, note: str = "") -> str:
    """A snapshot-diff run: counts per flag, what pruning saved, and sample rows per flag with
    changed cells marked (``note``: why there are none, e.g. the change set could not be read)."""
    return render("diff.html", result=result, shards=shards, samples=samples, note=note)

"""The Sync view's first page from the ledger: the questions an operator brings, answered first —
what failed (and the exact remedy), what is behind, what runs and how far, is the copy right —
then one row per table load to filter and page through.

A few queries whatever the number of tables: the ledger's tables (one), the newest generation of
every load in scope with its heartbeats and its shards' newest attempts (three), reconciliations
and diff runs (a few), the task instances of the rows shown (one a kind), the pipelines (one
each). Loads are judged by the counters
sensor's own rules (:func:`core.loads.counters_verdict`), on light ``LoadState`` objects (no plan
text, no shard predicates). Plain Python over the ledger: no Airflow, no pyspark.
"""

from __future__ import annotations

import math
import re
import shlex
import time
from dataclasses import dataclass, field

from airflow_sync_provider.core.cdc.checkpoints import PIPELINE_FAILED, PIPELINE_STOPPED, Checkpoints, PipelineState
from airflow_sync_provider.core.ledger import TASK_DIFF, TASK_LOAD, TASK_PIPELINE, TASK_RECONCILIATION, Ledger, TaskRef
from airflow_sync_provider.core.loads import (
    LOAD_ABANDONED,
    LOAD_PUBLISHED,
    LoadState,
    ShardState,
    counters_verdict,
    failing_shards,
)
from airflow_sync_provider.core.metrics import checkpoint_age, lag_seconds, recopies_running
from airflow_sync_provider.core.series import LOAD, PIPELINE, WINDOWS, Point, Series, finish_estimate

PAGE_ROWS = 50  # table loads per page
ATTENTION_ROWS = 25  # failures listed on the first screen (the rest: filter state=failed)
RUNNING_ROWS = 20
RECENT_DAYS = 7  # published loads older than this leave the page (running and failed ones stay)
LAG_WARNING_SECONDS = 300.0  # a pipeline further behind is listed under "needs attention"
SPARK_BUCKETS = 40  # points of a pipeline's lag line on the first page (its last hour)

# what a row of the page is, from the counters verdict and the load's status
FAILED, RUNNING, PUBLISHED, ABANDONED = "failed", "running", "published", "abandoned"
STATES = (FAILED, RUNNING, PUBLISHED, ABANDONED)
_RANK = {FAILED: 0, RUNNING: 1}


def glob_regex(pattern: str) -> str:
    """A database/table pattern with shell wildcards (``shop.*``, ``*.orders_*``, ``orders``: a
    name without a dot is a table in any database) as a case-insensitive RE2 for ``match()``."""
    body = "".join(".*" if c == "*" else "." if c == "?" else re.sub(r"([\\.+()|\[\]{}^$])", r"\\\1", c)
                   for c in pattern.strip())
    return "(?i)^" + ("" if "." in pattern else r"[^.]*\.") + body + "$"


@dataclass
class Filters:
    table: str = ""  # glob over the source or target ``db.table`` (glob_regex)
    state: str = ""  # one of STATES, or everything
    load: str = ""  # load key prefix (a job of many tables: its key)
    page: int = 1
    days: int = RECENT_DAYS

    def __post_init__(self):
        if self.state and self.state not in STATES:
            raise ValueError(f"state must be one of {', '.join(STATES)}, not {self.state!r}")
        self.page = max(1, int(self.page))
        self.days = max(1, int(self.days))


@dataclass
class LoadRow:
    state: LoadState  # light: plan shards carry only their ids; shards no predicates
    verdict: str  # the counters sensor's: success | wait | failed
    estimated_rows: int
    updated: float
    task: TaskRef | None = None
    check: dict | None = None  # the load's newest reconciliation: verdict, mismatched, generation
    series: list[Point] = field(default_factory=list)  # a running load's progress (core/series.py)

    @classmethod
    def of(cls, state: LoadState, verdict: str, task: TaskRef | None = None, check: dict | None = None,
           series: list[Point] | None = None) -> LoadRow:
        """A load read in full (its page) as the first page's row of it: the plan's estimate summed."""
        estimated = sum(s.get("estimated_rows") or 0 for s in (state.plan or {}).get("shards", []))
        return cls(state, verdict, estimated, state.heartbeat, task, check, list(series or []))

    @property
    def kind(self) -> str:
        if self.verdict == "failed":
            return FAILED
        return self.state.status if self.state.status in STATES else RUNNING

    @property
    def planned(self) -> int:
        return len(self.state.plan["shards"])

    @property
    def done(self) -> int:
        return sum(1 for s in self.state.shards.values() if s.status == "success")

    @property
    def failed_shards(self) -> list[int]:
        return failing_shards(self.state)

    @property
    def rows_written(self) -> int:
        return sum(s.records_written for s in self.state.shards.values())

    @property
    def error(self) -> str:
        """The load's error, else the first failed shard's."""
        if self.state.error:
            return self.state.error
        return next((self.state.shards[i].error for i in self.failed_shards
                     if i in self.state.shards and self.state.shards[i].error), "")

    def finish(self, now: float | None = None) -> float | None:
        """When it should be done, at its pace of the last 15 minutes (None: no pace yet)."""
        return finish_estimate(self.series, self.estimated_rows, self.planned, now)

    def remedy(self) -> tuple[str, str]:
        """(what to do in Airflow, the command line that does the same) for a failed load."""
        shards = ", ".join(map(str, self.failed_shards)) or "none"
        command = f"airflow-sync reimport --load {shlex.quote(self.state.load_key)} --failed"
        if self.state.status == LOAD_PUBLISHED:
            return (f"re-import shards {shards} into the published table: a FullLoadOperator with "
                    "reimport='failed' on this load key, or a ReconcileOperator with on_mismatch='reimport'", command)
        if self.state.status == LOAD_ABANDONED:
            return ("clear the task: the load starts afresh (left unfinished so long that its working tables were "
                    "dropped)", command)
        return f"clear the task: its retry resumes the load and reads only shards {shards}", command


@dataclass
class PipelineRow:
    state: PipelineState
    lag: float | None
    age: float | None  # since its last report (checkpoint)
    task: TaskRef | None = None
    counters: list[dict] = field(default_factory=list)  # per table and minute, a pipeline's own page only
    # its copies by table name, a pipeline's own page only: their TableFacts (core/clickhouse/described.py),
    # each copy's layout and source key as its table comment records them (Checkpoints.copies)
    copies: dict = field(default_factory=dict)
    selection: dict | None = None  # the patterns it keeps (core/cdc/checkpoints.Checkpoints.selection)
    # a source group's pipeline of one source (spark/cdc_group.py): the group, its merged copy
    group: str = ""
    merge_into: str = ""
    # its lag and totals over time (core/series.py): the last hour on the first page, its page's window
    series: list[Point] = field(default_factory=list)
    window: str = "hour"

    @property
    def failing(self) -> bool:
        return self.state.ended_badly or self.state.stale

    @property
    def behind(self) -> bool:
        return not self.failing and (self.lag or 0) > LAG_WARNING_SECONDS

    @property
    def kind(self) -> str:
        return FAILED if self.failing else "behind" if self.behind else self.state.status

    @property
    def recopying(self) -> list[str]:
        return recopies_running(self.state)

    @property
    def last_verified(self) -> dict | None:
        """The newest verification of any of its tables: ``{table, at, mismatched, ...}``."""
        looks = [t["last"] | {"table": t["table"]} for t in self.state.verification()["tables"] if t["last"]]
        return max(looks, key=lambda look: look["at"], default=None)

    def remedy(self) -> tuple[str, str]:
        command = f"airflow-sync cdc apply --pipeline {shlex.quote(self.state.pipeline)}"
        if self.state.status == PIPELINE_STOPPED:
            return ("it stopped on something a rerun alone cannot fix (see the error): do what it says, then clear "
                    "the task", command)
        if self.state.status == PIPELINE_FAILED:
            return (f"fix the cause, then clear the task: the pipeline replays from its checkpoint "
                    f"{self.state.checkpoint}", command)
        if self.state.stale:
            return ("its applier stopped reporting: clear the task (a new applier takes the lease over) or look "
                    "at the CDC service", command)
        return "a CDC run catches it up: trigger the pipeline's DAG, or run", command


@dataclass
class Overview:
    filters: Filters
    counts: dict[str, dict[str, int]]
    failed: list[LoadRow]  # the failing loads (all of them; the page lists ATTENTION_ROWS)
    running: list[LoadRow]
    pipelines: list[PipelineRow]
    rows: list[LoadRow]  # this page's
    total: int  # rows matching the filters, over all pages
    set_errors: list[dict]  # tables of jobs of many tables that failed before their load was recorded
    reconciliations: list[dict]
    diffs: list[dict]
    shown_pipelines: bool = True

    @property
    def pages(self) -> int:
        return max(1, math.ceil(self.total / PAGE_ROWS))


def _latest_loads_sql(ledger: Ledger, filters: Filters, columns: str) -> str:
    """The newest generation of each load key in scope (recent, or not over)."""
    where = ["startsWith(load_key, {prefix:String})"]
    if filters.table:
        where.append("(match(source_table, {pattern:String}) OR match(target_table, {pattern:String}))")
    return (f"SELECT {columns} FROM (SELECT * FROM {ledger.table('loads')} FINAL WHERE {' AND '.join(where)}"
            " ORDER BY load_key, generation DESC LIMIT 1 BY load_key)"
            " WHERE updated_at >= now64(6) - toIntervalDay({days:UInt32}) OR status IN ('running', 'failed')")


def load_rows(ledger: Ledger, filters: Filters) -> list[LoadRow]:
    """Every load in scope, judged, worst and newest first."""
    if not ledger.exists("loads"):
        return []
    params = {"prefix": filters.load, "pattern": glob_regex(filters.table) if filters.table else "",
              "days": filters.days}
    latest = _latest_loads_sql(
        ledger, filters,
        "load_key, generation, status, source_table, target_table, error, toFloat64(updated_at), repair,"
        " arrayMap(x -> toUInt32(JSONExtractUInt(x, 'id')), JSONExtractArrayRaw(plan, 'shards')),"
        " arraySum(arrayMap(x -> JSONExtractUInt(x, 'estimated_rows'), JSONExtractArrayRaw(plan, 'shards')))")
    heartbeats = ledger.ch.query(
        f"SELECT load_key, generation, toFloat64(max(at)) FROM {ledger.table('heartbeats')}"
        f" WHERE (load_key, generation) IN ({_latest_loads_sql(ledger, filters, 'load_key, generation')})"
        " GROUP BY load_key, generation", parameters=params).result_rows
    beats = {(k, g): at for k, g, at in heartbeats}
    rows = {}
    for key, gen, status, source, target, error, updated, repair, ids, estimated in ledger.ch.query(
            latest, parameters=params).result_rows:
        state = LoadState(key, gen, status, source, target, {"shards": [{"id": i} for i in ids]}, "", 0, {}, error,
                          None, list(repair), max(updated, beats.get((key, gen), 0.0)))
        rows[(key, gen)] = LoadRow(state, "", estimated, state.heartbeat)
    for key, gen, shard_id, attempt, status, read, written, failed, started, finished, error in ledger.ch.query(
            f"SELECT load_key, generation, shard_id, attempt, status, records_read, records_written, records_failed,"
            f" toFloat64(started_at), toFloat64(finished_at), substring(error, 1, 500)"
            f" FROM {ledger.table('shards')} FINAL"
            f" WHERE (load_key, generation) IN ({_latest_loads_sql(ledger, filters, 'load_key, generation')})"
            " ORDER BY load_key, generation, shard_id, attempt DESC LIMIT 1 BY load_key, generation, shard_id",
            parameters=params).result_rows:
        row = rows.get((key, gen))
        if row is not None:
            row.state.shards[shard_id] = ShardState(shard_id, attempt, status, "", [], read, written, failed,
                                                    started_at=started, finished_at=finished, error=error)
    for row in rows.values():
        row.verdict = counters_verdict(row.state)[0]
    return sorted(rows.values(), key=lambda r: (_RANK.get(r.kind, 2), -r.updated, r.state.load_key))


def pipeline_rows(ledger: Ledger, filters: Filters, name: str = "", now: float | None = None) -> list[PipelineRow]:
    """The CDC pipelines (one of them: ``name``), failing and furthest behind first; with a table
    pattern, those with a matching table."""
    checkpoints = Checkpoints(ledger.ch, ledger.database)
    if not ledger.exists("cdc_state"):
        return []
    now = time.time() if now is None else now
    pattern = re.compile(glob_regex(filters.table)[4:], re.I) if filters.table else None
    out, groups = [], {}
    for pipeline in checkpoints.pipelines():
        group = pipeline.rpartition("@")[0]  # a source group's pipeline of one source: <group>@<source>
        if group and group not in groups:
            groups[group] = checkpoints.group(group)
        if name and name not in (pipeline, group if groups.get(group) else None):
            continue
        state = checkpoints.state(pipeline)
        if state is None or (pattern and not any(pattern.match(t) for t in state.to_dict()["tables"])):
            continue
        found = groups.get(group)
        out.append(PipelineRow(state, lag_seconds(state, now), checkpoint_age(state, now),
                               selection=checkpoints.selection(pipeline), group=group if found else "",
                               merge_into=found.merge_into if found else ""))
    return sorted(out, key=lambda p: (not p.failing, not p.behind, -(p.lag or 0), p.state.pipeline))


def _newest_checks(ledger: Ledger, keys: list[str]) -> dict[str, dict]:
    if not keys or not ledger.exists("reconciliations"):
        return {}
    rows = ledger.ch.query(
        f"SELECT load_key, argMax(generation, at), argMax(verdict, at), argMax(mismatched, at), toFloat64(max(at))"
        f" FROM {ledger.table('reconciliations')} WHERE load_key IN {{k:Array(String)}} GROUP BY load_key",
        parameters={"k": keys}).result_rows
    return {k: {"generation": g, "verdict": v, "mismatched": list(m), "at": at} for k, g, v, m, at in rows}


def _set_errors(ledger: Ledger, filters: Filters, recorded: set[str]) -> list[dict]:
    """Tables a job of many tables could not start a load for (``Ledger.write_load_set``)."""
    if not ledger.exists("load_sets"):
        return []
    rows = ledger.ch.query(
        f"SELECT load_key, errors, toFloat64(at) FROM {ledger.table('load_sets')} FINAL"
        " WHERE startsWith(load_key, {p:String}) AND length(mapKeys(errors)) > 0"
        " AND at >= now64(6) - toIntervalDay({days:UInt32})", parameters={"p": filters.load, "days": filters.days})
    pattern = re.compile(glob_regex(filters.table)[4:], re.I) if filters.table else None
    out = []
    for job, errors, at in rows.result_rows:
        for key, error in errors.items():
            table = key[len(job) + 1:] if key.startswith(job + ":") else key
            if key not in recorded and (pattern is None or pattern.match(table)):
                out.append({"job": job, "load_key": key, "table": table, "error": error, "at": at})
    return out


def overview(ledger: Ledger, filters: Filters, now: float | None = None) -> Overview:
    """The first page: counts, failures with remedies, running loads, pipelines, a page of rows
    (with a key prefix: that job's loads and checks alone)."""
    ledger.snapshot_tables()
    loads = load_rows(ledger, filters)
    counts = {"loads": {s: 0 for s in STATES}, "shards": {FAILED: 0}}
    for row in loads:
        counts["loads"][row.kind] += 1
        counts["shards"][FAILED] += len(row.failed_shards) if row.kind == FAILED else 0
    everything = not filters.load
    pipelines = pipeline_rows(ledger, filters, now=now) if everything else []
    counts["pipelines"] = {k: sum(1 for p in pipelines if p.kind == k) for k in (FAILED, "behind", "running", "idle")}
    failed = [r for r in loads if r.kind == FAILED]
    running = [r for r in loads if r.kind == RUNNING]
    matching = [r for r in loads if not filters.state or r.kind == filters.state]
    first = (filters.page - 1) * PAGE_ROWS
    page = matching[first:first + PAGE_ROWS]
    shown = list({id(r): r for r in [*page, *failed[:ATTENTION_ROWS], *running[:RUNNING_ROWS]]}.values())
    keys = [r.state.load_key for r in shown]
    tasks, checks = ledger.tasks(TASK_LOAD, keys), _newest_checks(ledger, keys)
    for row in shown:
        row.task, row.check = tasks.get(row.state.load_key), checks.get(row.state.load_key)
    _pipeline_tasks(ledger, pipelines)
    _series(ledger, pipelines, running[:RUNNING_ROWS], now)
    reconciliations = ledger.reconciliations(limit=10, prefix=filters.load)
    rtasks = ledger.tasks(TASK_RECONCILIATION, [r["load_key"] for r in reconciliations])
    for r in reconciliations:
        r["task"] = rtasks.get(r["load_key"])
    counts["reconciliations"] = _verdict_counts(ledger, "reconciliations", "load_key", filters)
    counts["diffs"] = _verdict_counts(ledger, "diffs", "diff_key", filters) if everything else {}
    return Overview(filters, counts, failed, running[:RUNNING_ROWS], pipelines, page, len(matching),
                    _set_errors(ledger, filters, {r.state.load_key for r in loads}), reconciliations,
                    diff_runs(ledger) if everything else [], everything)


def _pipeline_tasks(ledger: Ledger, pipelines: list[PipelineRow]) -> None:
    tasks = ledger.tasks(TASK_PIPELINE, [p.state.pipeline for p in pipelines])
    for p in pipelines:
        p.task = tasks.get(p.state.pipeline)


def _series(ledger: Ledger, pipelines: list[PipelineRow], running: list[LoadRow], now: float | None) -> None:
    """The first page's time: each pipeline's lag over the last hour, each running load's progress."""
    series = Series(ledger.ch, ledger.database)
    lags = series.window(PIPELINE, [p.state.pipeline for p in pipelines], "hour", now, buckets=SPARK_BUCKETS)
    for p in pipelines:
        p.series = lags.get(p.state.pipeline, [])
    progress = series.window(LOAD, [r.state.load_key for r in running], "hour", now)
    for r in running:
        r.series = progress.get(r.state.load_key, [])


def pipeline_page(ledger: Ledger, name: str, now: float | None = None,
                  window: str = "hour") -> PipelineRow | list[PipelineRow] | None:
    """One pipeline with its changes per minute, its copies' layouts and its series over
    ``window`` (hour, day, week; the page its CDC tasks link to), a source group's pipelines (one
    per source), or None."""
    if window not in WINDOWS:
        raise ValueError(f"window must be one of {', '.join(WINDOWS)}, not {window!r}")
    found = pipeline_rows(ledger, Filters(), name, now)
    if not found:
        return None
    _pipeline_tasks(ledger, found)
    if found[0].state.pipeline != name:  # a source group
        return found
    checkpoints = Checkpoints(ledger.ch, ledger.database)
    found[0].counters = checkpoints.counters(name)
    found[0].copies = checkpoints.copies(found[0].state)
    found[0].window = window
    found[0].series = Series(ledger.ch, ledger.database).window(PIPELINE, [name], window, now).get(name, [])
    return found[0]


def _verdict_counts(ledger: Ledger, table: str, key: str, filters: Filters) -> dict[str, int]:
    """The newest verdict of each key (recent ones), counted."""
    if not ledger.exists(table):
        return {}
    rows = ledger.ch.query(
        f"SELECT verdict, count() FROM (SELECT argMax(verdict, at) AS verdict FROM {ledger.table(table)}"
        f" WHERE startsWith({key}, {{p:String}}) AND at >= now64(6) - toIntervalDay({{days:UInt32}})"
        f" GROUP BY {key}) GROUP BY verdict ORDER BY verdict",
        parameters={"p": filters.load, "days": filters.days}).result_rows
    return dict(rows)


def diff_runs(ledger: Ledger, prefix: str = "", limit: int = 10) -> list[dict]:
    """Recent snapshot-diff runs with the task instance behind each."""
    runs = ledger.diffs(limit=limit, prefix=prefix)
    tasks = ledger.tasks(TASK_DIFF, [d["diff_key"] for d in runs])
    for d in runs:
        d["task"] = tasks.get(d["diff_key"])
    return runs


def load_page(ledger: Ledger, load_key: str
              ) -> tuple[LoadState, tuple[str, str], TaskRef | None, dict | None, list[Point]] | None:
    """One load in full (the page a row's "shards" link opens) with its progress series, or None."""
    state = ledger.state(load_key)
    if state is None:
        return None
    return (state, counters_verdict(state), ledger.tasks(TASK_LOAD, [load_key]).get(load_key),
            _newest_checks(ledger, [load_key]).get(load_key), _load_series(ledger, state))


def _load_series(ledger: Ledger, state: LoadState) -> list[Point]:
    """A load's progress from its first shard's start to its last report (or now, running)."""
    now = time.time()
    began = min((s.started_at for s in state.shards.values() if s.started_at), default=0.0) or now - 86400
    until = now if state.status == RUNNING else max(state.heartbeat, began) + 60
    return Series(ledger.ch, ledger.database).read(LOAD, [state.load_key], began - 60, until).get(state.load_key, [])

"""What the provider tells a metrics system: names and values, computed from the ledger and the
jobs' results. Plain Python (no Airflow, no pyspark): the Airflow layer sends them through
Airflow's own ``Stats`` (airflow_sync_provider/stats.py), so StatsD, DogStatsD and OpenTelemetry
all receive them under Airflow's ``[metrics]`` settings (prefix, allow/block lists).

Names follow Airflow's rules (``[A-Za-z0-9_.-]``, at most 250 characters, and short enough for
OpenTelemetry's 255 with the prefix) and Airflow's own habit for per-object metrics
(``dagrun.duration.success.<dag_id>``): the object is the last segment(s) of the name, so a
plain StatsD server, which drops tags, still tells pipelines and tables apart; the same object is
also given as tags for the backends that keep them. A table is two segments, ``<db>.<table>``;
a pipeline one. A dot inside a segment becomes ``__`` (as Airflow does for task ids in legacy
names) and any other character outside the allowed set ``_``.

Every metric, where it is emitted and why: docs/metrics.md.
"""

from __future__ import annotations

import datetime as dt
import re
import time
import zlib
from dataclasses import dataclass, field

PREFIX = "sync"
MAX_NAME = 200  # Airflow: 250 for the name; OpenTelemetry: 255 with the prefix ("airflow." + …)

INCR, GAUGE, TIMING = "incr", "gauge", "timing"


@dataclass(frozen=True)
class Metric:
    kind: str  # INCR (a counter: add value), GAUGE (set to value), TIMING (value in seconds)
    name: str  # the full stat name, e.g. ``sync.pipeline.lag_seconds.demo_cdc``
    value: float
    tags: dict = field(default_factory=dict, compare=False)

    @property
    def delta(self) -> dt.timedelta:
        """A timing's value as Airflow's ``Stats.timing`` takes it (StatsD sends milliseconds)."""
        return dt.timedelta(seconds=self.value)


def segment(text: str) -> str:
    """One segment of a stat name: dots become ``__``, other disallowed characters ``_``."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", str(text).replace(".", "__")) or "_"


def _name(group: str, metric: str, *obj: str) -> str:
    """``sync.<group>.<metric>.<object segments>``, shortened with a checksum when too long."""
    head = f"{PREFIX}.{group}.{metric}"
    tail = ".".join(segment(o) for o in obj)
    name = f"{head}.{tail}" if tail else head
    if len(name) <= MAX_NAME:
        return name
    digest = f"{zlib.crc32(tail.encode()):08x}"
    return f"{head}.{tail[:MAX_NAME - len(head) - len(digest) - 2]}_{digest}"


def table_object(qualified: str) -> tuple[str, ...]:
    """``db.table`` → the two name segments (a name without a database: one)."""
    database, dot, table = qualified.partition(".")
    return (database, table) if dot else (database,)


# -- CDC pipelines --------------------------------------------------------------------------------

def lag_seconds(state, now: float | None = None) -> float | None:
    """How far a pipeline's copy is behind, from its last report (``PipelineState``): the age of
    the last applied change's source time while its checkpoint is short of the source position
    it last saw, else 0 (caught up as of that report); None before anything was applied. A
    pipeline that stopped reporting keeps its last value: its checkpoint age grows instead."""
    if state.checkpoint is None:
        return None
    now = time.time() if now is None else now
    if state.source_position is not None and state.checkpoint.key() < state.source_position.key() and state.source_time:
        return max(0.0, now - state.source_time)
    return 0.0


def checkpoint_age(state, now: float | None = None) -> float | None:
    """Seconds since the pipeline last wrote its state (each checkpoint is such a write)."""
    if not state.heartbeat:
        return None
    return max(0.0, (time.time() if now is None else now) - state.heartbeat)


def recopies_running(state) -> list[str]:
    """The pipeline's tables being re-copied now (after a DDL or a failed verification)."""
    return [t.name for t in state.tables if t.recopying and t.streaming]


def pipeline_gauges(state, now: float | None = None, measured_lag: float | None = None) -> list[Metric]:
    """A pipeline's state as gauges: lag (``measured_lag`` when a sensor measured it against the
    source's position now), checkpoint age, re-copies under way, failed (1 or 0: failed or
    stopped, a stop that needs a remedy)."""
    tags = {"pipeline": state.pipeline}
    lag = measured_lag if measured_lag is not None else lag_seconds(state, now)
    age = checkpoint_age(state, now)
    out = ([Metric(GAUGE, _name("pipeline", "lag_seconds", state.pipeline), round(lag, 3), tags)] if lag is not None
           else [])
    if age is not None:
        out.append(Metric(GAUGE, _name("pipeline", "checkpoint_age_seconds", state.pipeline), round(age, 3), tags))
    out.append(Metric(GAUGE, _name("pipeline", "recopies_running", state.pipeline), len(recopies_running(state)), tags))
    out.append(Metric(GAUGE, _name("pipeline", "failed", state.pipeline), int(state.ended_badly), tags))
    return out


def pipeline_run_counters(result: dict) -> list[Metric]:
    """What one bounded CDC run did (``CdcApplyOperator``'s job result): changes applied, tables
    verified, mismatched shards found, shards repaired, tables re-copied."""
    pipeline = result["pipeline"]
    tags = {"pipeline": pipeline}
    verified = result.get("verified") or []
    values = {"changes_applied": result.get("events", 0), "verifications": len(verified),
              "verify_mismatches": sum(len(v.get("mismatched") or []) for v in verified),
              "repairs": result.get("repaired_shards", 0), "recopies": len(result.get("recopied") or [])}
    return [Metric(INCR, _name("pipeline", metric, pipeline), value, tags) for metric, value in values.items()]


# -- full loads ------------------------------------------------------------------------------------

def load_metrics(state, before: dict[int, int], seconds: float | None) -> list[Metric]:
    """One try of a load (``LoadState`` read after its job ended; ``before``: each shard's newest
    attempt before the job): rows read / written / failed and shards that did not succeed, over
    the shard attempts this try made (a resumed load does not count the earlier tries' shards
    twice), and the try's duration. Counters, named by the target table."""
    ran = [s for s in state.shards.values() if s.attempt > before.get(s.shard_id, 0)]
    tags = {"table": state.target_table, "source_table": state.source_table, "load_key": state.load_key}
    obj = table_object(state.target_table)
    values = {"rows_read": sum(s.records_read for s in ran), "rows_written": sum(s.records_written for s in ran),
              "rows_failed": sum(s.records_failed for s in ran),
              # the job is over: a shard of this try that did not succeed failed (died ones included)
              "shards_failed": sum(1 for s in ran if s.status != "success")}
    out = [Metric(INCR, _name("load", metric, *obj), value, tags) for metric, value in values.items()]
    if seconds is not None:
        out.append(Metric(TIMING, _name("load", "duration", *obj), round(seconds, 3), tags))
    return out


def attempts(state) -> dict[int, int]:
    """Each shard's newest attempt (the ``before`` of :func:`load_metrics`)."""
    return {} if state is None else {i: s.attempt for i, s in state.shards.items()}


# -- reconciliations and snapshot diffs ------------------------------------------------------------

def reconcile_metrics(result: dict) -> list[Metric]:
    """One table's reconciliation (the job's result): a counter per verdict (``ok`` /
    ``mismatch``), mismatched shards (gauge), rows counted on both sides."""
    obj = table_object(result["target"])
    tags = {"table": result["target"], "load_key": result["load_key"], "verdict": result["verdict"]}
    rows = sum((s.get("source_rows") or 0) + (s.get("target_rows") or 0) for s in result.get("shards", []))
    return [Metric(INCR, _name("reconcile", segment(result["verdict"]), *obj), 1, tags),
            Metric(GAUGE, _name("reconcile", "mismatched_shards", *obj), len(result.get("mismatched") or []), tags),
            Metric(INCR, _name("reconcile", "rows_read", *obj), rows, tags)]


def diff_metrics(result: dict) -> list[Metric]:
    """One table's snapshot diff (the job's result), named by the copy compared (``old``): a
    counter per verdict (``identical`` / ``changed`` / ``applied``), rows read row by row,
    and the differences found (changed + new + deleted, a gauge)."""
    obj = table_object(result["old"])
    tags = {"table": result["old"], "diff_key": result["diff_key"], "verdict": result["verdict"]}
    counts = result.get("counts") or {}
    return [Metric(INCR, _name("diff", segment(result["verdict"]), *obj), 1, tags),
            Metric(INCR, _name("diff", "rows_read", *obj), result["rows_read_old"] + result["rows_read_new"], tags),
            Metric(GAUGE, _name("diff", "differences", *obj),
                   sum(counts.get(flag, 0) for flag in ("changed", "new", "deleted")), tags)]

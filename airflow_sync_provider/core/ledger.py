"""The ledger: loads, shards and their hook counters (patent S51), reconciliations, diffs and the
tasks that ran them, kept in the ClickHouse target (what a load's state means: core/loads.py).

Why the target: every party of a load already reaches it — executors (they write the data
there), the Spark driver in any deploy mode, Airflow tasks, sensors and triggers — and it is
the one place a load's state must agree with (the rows themselves). The source is often a
read-only replica, so it cannot hold state.

Tables (database ``airflow_sync`` by default) are append-only ReplacingMergeTree logs: every
progress report inserts the row anew with a later ``updated_at`` and readers take the newest
row (``FINAL``). So counters are written while a shard runs, no UPDATE is ever needed, and a
crashed writer leaves its last report behind.

A load key names one logical load (default: DAG, task and run). Each run of an unfinished key
resumes it; a key that was published starts a new *generation* (a fresh copy).
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass

from airflow_sync_provider.core.loads import LOAD_PUBLISHED, LoadState, ShardState, counters_verdict, now, set_verdict
from airflow_sync_provider.core.sql import ch_ident, ch_table

DEFAULT_LEDGER_DATABASE = "airflow_sync"
def utc_datetime(seconds: float | None):
    """Epoch seconds → an aware datetime, as clickhouse-connect inserts DateTime64."""
    return None if seconds is None else dt.datetime.fromtimestamp(seconds, dt.timezone.utc)


TIME_TYPE = "DateTime64(6, 'UTC')"  # every ledger time column (utc_datetime() gives its values)
# The ledger's tables: (column, ClickHouse type), in the order the writers below give values.
_LOADS = (
    ("load_key", "String"), ("generation", "UInt32"), ("status", "LowCardinality(String)"), ("source_table", "String"),
    ("target_table", "String"), ("plan", "String"), ("parts_table", "String"), ("version", "UInt64"),
    ("spec", "String"), ("error", "String"), ("repair", "Array(UInt32)"), ("start_position", "String"),
    ("updated_at", TIME_TYPE),
)
_SHARDS = (
    ("load_key", "String"), ("generation", "UInt32"), ("shard_id", "UInt32"), ("attempt", "UInt32"),
    ("status", "LowCardinality(String)"), ("where_sql", "String"), ("params", "String"), ("records_read", "UInt64"),
    ("records_written", "UInt64"), ("records_failed", "UInt64"), ("bytes", "UInt64"), ("started_at", TIME_TYPE),
    ("finished_at", f"Nullable({TIME_TYPE})"), ("error", "String"), ("version", "UInt64"), ("chunks", "UInt32"),
    ("resume_key", "String"), ("executor", "String"), ("updated_at", TIME_TYPE),
)
# A running load's driver reports here every few seconds: a row of its own, since the load's row
# carries the plan (a piece per ~4 MiB of the table: megabytes for a billion rows).
_HEARTBEATS = (("load_key", "String"), ("generation", "UInt32"), ("at", TIME_TYPE))
_RECONCILIATIONS = (
    ("load_key", "String"), ("generation", "UInt32"), ("verdict", "LowCardinality(String)"),
    ("mismatched", "Array(UInt32)"), ("checksum", "Bool"), ("report", "String"), ("at", TIME_TYPE),
)
_DIFFS = (
    ("diff_key", "String"), ("run_id", "String"), ("verdict", "LowCardinality(String)"), ("old_table", "String"),
    ("new_table", "String"), ("counts", "Map(String, UInt64)"), ("rows_old", "UInt64"), ("rows_new", "UInt64"),
    ("rows_read_old", "UInt64"), ("rows_read_new", "UInt64"), ("shards", "UInt32"), ("shards_read", "UInt32"),
    ("version", "UInt64"), ("at", TIME_TYPE), ("changes_table", "String"), ("keys", "Array(String)"),
    ("compared", "Array(String)"), ("buckets_read", "UInt64"),
)
_DIFF_SHARDS = (  # after diff_key and run_id: a diff shard's fields by these names
    ("diff_key", "String"), ("run_id", "String"), ("shard_id", "UInt32"), ("old_rows", "UInt64"),
    ("new_rows", "UInt64"), ("buckets", "UInt32"), ("buckets_read", "UInt32"), ("rows_read_old", "UInt64"),
    ("rows_read_new", "UInt64"), ("identical", "UInt64"), ("changed", "UInt64"), ("new", "UInt64"),
    ("deleted", "UInt64"), ("seconds", "Float64"),
)
_JOB_RESULTS = (("result_key", "String"), ("result", "String"), ("at", TIME_TYPE))
# The Airflow task instance that last worked on a load, reconciliation, diff or pipeline (written by
# the operator as its job starts): the Sync view links each row to it. ``key`` is the operator's
# key; a job of many tables has one row for the prefix of all its table keys (``<key>:<db>.<t>``).
_TASKS = (
    ("kind", "LowCardinality(String)"), ("key", "String"), ("dag_id", "String"), ("task_id", "String"),
    ("run_id", "String"), ("map_index", "Int32"), ("try_number", "UInt32"), ("at", TIME_TYPE),
)
TASK_LOAD, TASK_RECONCILIATION, TASK_DIFF, TASK_PIPELINE = "load", "reconciliation", "diff", "pipeline"


@dataclass(frozen=True)
class TaskRef:
    """An Airflow task instance, as the ledger remembers it."""

    dag_id: str
    task_id: str
    run_id: str
    map_index: int = -1
    try_number: int = 1


def key_prefixes(key: str) -> list[str]:
    """``key`` and each prefix of it that ends before a ``:`` (a job of many tables names its
    tables' loads, checks and diffs ``<key>:<db>.<table>``; a bootstrap's ``cdc:<pipeline>:<db>.<t>``)."""
    return [key] + [key[:i] for i, c in enumerate(key) if c == ":" and i]


# A job of many tables: its tables' load keys, the errors of tables that failed before their load
# was recorded and, per table key, the newest generation when the run began (``baseline``): a
# table whose load is published in a later generation was copied by this run (Ledger.resume_point).
_LOAD_SETS = (("load_key", "String"), ("tables", "Array(String)"), ("errors", "Map(String, String)"),
              ("at", TIME_TYPE), ("baseline", "Map(String, UInt32)"))


class LedgerTables:
    """Append-only tables in the target's ledger database, through a clickhouse-connect client."""

    def __init__(self, client, database: str = DEFAULT_LEDGER_DATABASE):
        self.ch = client
        self.database = database
        self._last = 0.0
        self._snapshot: set[str] | None = None  # snapshot_tables()

    def table(self, name: str) -> str:
        return ch_table(self.database, name)

    def _stamp(self) -> float:
        """Strictly increasing report times from this writer (ReplacingMergeTree keeps the newest)."""
        self._last = max(now(), self._last + 1e-6)
        return self._last

    def snapshot_tables(self) -> None:
        """Answer :meth:`exists` from one look at the database from now on: for a reader making
        many queries in one short request (the Sync view's page); tables created later are missed."""
        self._snapshot = {n for (n,) in self.ch.query("SELECT name FROM system.tables WHERE database = {d:String}",
                                                      parameters={"d": self.database}).result_rows}

    def exists(self, name: str) -> bool:
        if self._snapshot is not None:
            return name in self._snapshot
        return bool(self.ch.command(f"EXISTS TABLE {self.table(name)}"))

    def _create(self, name: str, columns: tuple, engine: str) -> None:
        body = ", ".join(f"{ch_ident(n)} {t}" for n, t in columns)
        self.ch.command(f"CREATE TABLE IF NOT EXISTS {self.table(name)} ({body}) ENGINE = {engine}")

    def _ensure_tables(self, tables: list[tuple[str, tuple, str]]) -> list[str]:
        """Create the missing ones of ``(name, columns, engine)`` and add the columns a table made
        by an earlier release lacks: one round trip when everything is there (every job starts so).
        Returns the names of the tables it created (a caller may carry data over into them)."""
        present: dict[str, set[str]] = {}
        for table, column in self.ch.query("SELECT table, name FROM system.columns WHERE database = {d:String}",
                                           parameters={"d": self.database}).result_rows:
            present.setdefault(table, set()).add(column)
        if not present:
            self.ch.command(f"CREATE DATABASE IF NOT EXISTS {ch_ident(self.database)}")
        created = []
        for name, columns, engine in tables:
            if name not in present:
                self._create(name, columns, engine)
                created.append(name)
                continue
            missing = [f"ADD COLUMN IF NOT EXISTS {ch_ident(n)} {t}" for n, t in columns if n not in present[name]]
            if missing:
                self.ch.command(f"ALTER TABLE {self.table(name)} {', '.join(missing)}")
        return created

    def _insert(self, name: str, rows: list, columns: tuple) -> None:
        # with the column types given, clickhouse-connect skips its DESCRIBE TABLE round trip
        self.ch.insert(self.table(name), rows, column_names=[n for n, _ in columns],
                       column_type_names=[t for _, t in columns])


class Ledger(LedgerTables):
    """Loads and their shards (hook counters), reconciliations, diffs and cluster-mode results."""

    def ensure(self) -> None:
        # loads last: readers take its existence to mean the ledger's tables are all there
        # (Ledger.state joins heartbeats; a reader between two CREATEs once saw it missing)
        self._ensure_tables([
            ("heartbeats", _HEARTBEATS, "ReplacingMergeTree(at) ORDER BY (load_key, generation)"),
            ("shards", _SHARDS, "ReplacingMergeTree(updated_at) ORDER BY (load_key, generation, shard_id, attempt)"),
            ("loads", _LOADS, "ReplacingMergeTree(updated_at) ORDER BY (load_key, generation)"),
        ])

    def write_reconciliation(self, load_key: str, generation: int, verdict: str, mismatched: list[int],
                             checksum: bool, report: list[dict]) -> None:
        self._create("reconciliations", _RECONCILIATIONS, "MergeTree ORDER BY (load_key, generation, at)")
        self._insert("reconciliations", [[load_key, generation, verdict, mismatched, checksum, json.dumps(report),
                                           utc_datetime(self._stamp())]], _RECONCILIATIONS)

    def write_diff(self, result: dict, shards: list[dict]) -> None:
        """A snapshot diff's run: per-flag counts and what was read row by row, per shard too
        (a shard whose checksums agreed shows 0 rows read: pruned)."""
        self._ensure_tables([("diffs", _DIFFS, "MergeTree ORDER BY (diff_key, at)"),
                             ("diff_shards", _DIFF_SHARDS, "MergeTree ORDER BY (diff_key, run_id, shard_id)")])
        r = result
        self._insert("diffs", [[
            r["diff_key"], r["run_id"], r["verdict"], r["old"], r["new"], r["counts"], r["rows_old"], r["rows_new"],
            r["rows_read_old"], r["rows_read_new"], r["shards"], r["shards_read"], r["version"] or 0,
            utc_datetime(self._stamp()), r["changes_table"], r["keys"], r["compared"], r["buckets_read"]]], _DIFFS)
        self._insert("diff_shards", [[r["diff_key"], r["run_id"], *(s[n] for n, _ in _DIFF_SHARDS[2:])]
                                     for s in shards], _DIFF_SHARDS)

    def write_load_set(self, load_key: str, table_keys: list[str], errors: dict | None = None,
                       baseline: dict | None = None) -> None:
        """A job of many tables: the per-table load keys ``load_key`` stands for, written before
        any of them runs (so the counters sensor knows which loads to wait for), and again at
        its end with the errors of tables that failed before their load was recorded.
        ``baseline``: each key's newest generation when the run began (:meth:`resume_point`)."""
        self._ensure_tables([("load_sets", _LOAD_SETS, "ReplacingMergeTree(at) ORDER BY load_key")])
        self._insert("load_sets", [[load_key, table_keys, errors or {}, utc_datetime(self._stamp()), baseline or {}]],
                     _LOAD_SETS)

    def load_set(self, load_key: str) -> tuple[list[str], dict] | None:
        """``write_load_set``'s newest (table keys, errors), or None."""
        found = self._load_set(load_key)
        return (found[0], found[1]) if found else None

    def _load_set(self, load_key: str) -> tuple[list[str], dict, dict] | None:
        if not self.exists("load_sets"):
            return None
        present = {c for (c,) in self.ch.query("SELECT name FROM system.columns WHERE database = {d:String} AND "
                                               "table = 'load_sets'", parameters={"d": self.database}).result_rows}
        baseline = "baseline" if "baseline" in present else "map()"  # a ledger no job of this release wrote yet
        rows = self.ch.query(f"SELECT tables, errors, {baseline} FROM {self.table('load_sets')} FINAL "
                             "WHERE load_key = {k:String}", parameters={"k": load_key}).result_rows
        return (list(rows[0][0]), dict(rows[0][1]), dict(rows[0][2])) if rows else None

    def newest_loads(self, load_keys: list[str]) -> dict[str, tuple[int, str]]:
        """Each key's newest generation and its status, in one query (keys never loaded are absent)."""
        if not load_keys or not self.exists("loads"):
            return {}
        rows = self.ch.query(f"SELECT load_key, generation, status FROM {self.table('loads')} FINAL"
                             " WHERE load_key IN {k:Array(String)} ORDER BY load_key, generation DESC"
                             " LIMIT 1 BY load_key", parameters={"k": list(load_keys)}).result_rows
        return {key: (int(generation), status) for key, generation, status in rows}

    def resume_point(self, load_key: str, table_keys: list[str]) -> tuple[dict[str, int], set[str]]:
        """Where a job of many tables under ``load_key`` starts: (baseline, done).

        The run before it (its load set) finished when every one of its tables was published by
        it (a generation above the baseline it recorded). Then this run is a new one: it copies
        every table afresh, and its baseline is each table's newest generation now. Otherwise
        (a table failed, or the job died) this run goes on with that one: same baseline, and
        ``done`` holds the tables it already published — they are not copied again; an
        unfinished table resumes from its unfinished shards (its own load does that). A table
        the selection gained since gets its own baseline now. One rule for every caller: the
        operator's retries and a command line run again with the same key.
        """
        found = self._load_set(load_key)
        newest = self.newest_loads(sorted(set(table_keys) | set(found[0] if found else ())))

        def published_after(key: str, base: int) -> bool:
            generation, status = newest.get(key, (0, ""))
            return status == LOAD_PUBLISHED and generation > base

        now = {key: newest.get(key, (0, ""))[0] for key in table_keys}
        if found is None:
            return now, set()
        previous, _, baseline = found
        if all(published_after(key, baseline.get(key, 0)) for key in previous):
            return now, set()
        kept = {key: baseline.get(key, 0) if key in previous else now[key] for key in table_keys}
        return kept, {key for key in table_keys if published_after(key, kept[key])}

    def write_task(self, kind: str, key: str, task: TaskRef) -> None:
        """The task instance working on ``key`` now (``kind``: TASK_LOAD, … ); the newest one wins."""
        self.ch.command(f"CREATE DATABASE IF NOT EXISTS {ch_ident(self.database)}")  # before any job's tables
        self._create("tasks", _TASKS, "ReplacingMergeTree(at) ORDER BY (kind, key)")
        self._insert("tasks", [[kind, key, task.dag_id, task.task_id, task.run_id, task.map_index, task.try_number,
                                utc_datetime(self._stamp())]], _TASKS)

    def tasks(self, kind: str, keys: list[str]) -> dict[str, TaskRef]:
        """The task instance behind each of ``keys``: recorded for the key itself, else for its
        longest prefix that a job of many tables was keyed by (:func:`key_prefixes`)."""
        wanted = sorted({p for key in keys for p in key_prefixes(key)})
        if not wanted or not self.exists("tasks"):
            return {}
        rows = self.ch.query(
            f"SELECT key, argMax(dag_id, at), argMax(task_id, at), argMax(run_id, at), argMax(map_index, at),"
            f" argMax(try_number, at) FROM {self.table('tasks')} WHERE kind = {{kind:String}}"
            f" AND key IN {{keys:Array(String)}} GROUP BY key", parameters={"kind": kind, "keys": wanted}).result_rows
        found = {key: TaskRef(*rest) for key, *rest in rows}
        out = {}
        for key in keys:  # the longest recorded: the key itself, else the nearest job of many tables
            hit = max((p for p in key_prefixes(key) if p in found), key=len, default=None)
            if hit is not None:
                out[key] = found[hit]
        return out

    def write_job_result(self, key: str, result: dict) -> None:
        """A cluster-mode job's result (its driver cannot write a file the submitter reads)."""
        self._create("job_results", _JOB_RESULTS, "MergeTree ORDER BY result_key TTL toDateTime(at) + INTERVAL 30 DAY")
        self._insert("job_results", [[key, json.dumps(result, default=str), utc_datetime(self._stamp())]], _JOB_RESULTS)

    def job_result(self, key: str) -> dict:
        try:
            rows = self.ch.query(f"SELECT result FROM {self.table('job_results')} WHERE result_key = {{k:String}} "
                                 "ORDER BY at DESC LIMIT 1", parameters={"k": key}).result_rows
        except Exception:  # no table yet: the job never got as far as writing
            return {}
        return json.loads(rows[0][0]) if rows else {}

    def write_load(self, state: LoadState) -> None:
        self.write_loads([state])

    def write_loads(self, states: list[LoadState]) -> None:
        """Several loads' rows in one insert (a source group's members)."""
        self._insert("loads", [[
            state.load_key, state.generation, state.status, state.source_table, state.target_table,
            json.dumps(state.plan), state.parts_table, state.version, json.dumps(state.spec), state.error[:4000],
            state.repair, json.dumps(state.start_position) if state.start_position else "", utc_datetime(self._stamp()),
        ] for state in states], _LOADS)

    def write_heartbeat(self, *states: LoadState) -> None:
        """The running loads' driver is alive (:attr:`LoadState.stale` reads it); one insert."""
        stamp = self._stamp()
        for state in states:
            state.heartbeat = stamp
        self._insert("heartbeats", [[s.load_key, s.generation, utc_datetime(stamp)] for s in states], _HEARTBEATS)

    def write_shard(self, load_key: str, generation: int, shard: ShardState) -> None:
        self.write_shards(load_key, generation, [shard])

    def write_shards(self, load_key: str, generation: int, shards: list[ShardState]) -> None:
        self.write_shards_of([(load_key, generation, shard) for shard in shards])

    def write_shards_of(self, entries: list[tuple[str, int, ShardState]]) -> None:
        """Shard records of several loads (load key, generation, record) in one insert."""
        self._insert("shards", [[
            load_key, generation, shard.shard_id, shard.attempt, shard.status, shard.where,
            json.dumps(shard.params), shard.records_read, shard.records_written, shard.records_failed,
            shard.bytes, utc_datetime(shard.started_at), utc_datetime(shard.finished_at), shard.error[:4000],
            shard.version, shard.chunks, json.dumps(shard.resume_key) if shard.resume_key is not None else "",
            shard.executor, utc_datetime(self._stamp()),
        ] for load_key, generation, shard in entries], _SHARDS)

    def state(self, load_key: str) -> LoadState | None:
        """The newest generation of ``load_key`` with the newest attempt of each shard, or None."""
        return self.states([load_key])[load_key]

    def states(self, load_keys: list[str]) -> dict[str, LoadState | None]:
        """:meth:`state` of each key, in two queries (a source group's members: one each would
        queue on a busy server)."""
        keys = list(dict.fromkeys(load_keys))
        if not keys:
            return {}
        # its last report: the load's row or a heartbeat, whichever is newer (no heartbeat: 1970)
        rows = self.ch.query(
            f"SELECT l.load_key, l.generation, status, source_table, target_table, plan, parts_table, version, spec,"
            f" error, greatest(toFloat64(updated_at), toFloat64(h.at)), repair, start_position"
            f" FROM {self.table('loads')} AS l FINAL"
            f" LEFT JOIN (SELECT load_key, generation, max(at) AS at FROM {self.table('heartbeats')}"
            f" WHERE load_key IN {{k:Array(String)}} GROUP BY load_key, generation) AS h"
            f" ON h.load_key = l.load_key AND h.generation = l.generation"
            f" WHERE l.load_key IN {{k:Array(String)}} ORDER BY l.load_key, l.generation DESC LIMIT 1 BY l.load_key",
            parameters={"k": keys}).result_rows
        found = {}
        for key, gen, status, source, target, plan, parts, version, spec, error, heartbeat, repair, start in rows:
            found[key] = LoadState(key, gen, status, source, target, json.loads(plan), parts, version,
                                   json.loads(spec), error, json.loads(start) if start else None, list(repair),
                                   heartbeat)
        shards = self._shards([(s.load_key, s.generation) for s in found.values()])
        for state in found.values():
            state.shards = shards.get((state.load_key, state.generation), {})
        return {key: found.get(key) for key in keys}

    def table_states(self, load_key: str) -> dict[str, LoadState]:
        """The load ``load_key`` by its key, or each recorded table load of a job of many tables
        keyed so (:meth:`write_load_set`); empty before anything was recorded."""
        if not self.exists("loads"):
            return {}
        state = self.state(load_key)
        if state is not None:
            return {load_key: state}
        keys, _ = self.load_set(load_key) or ([], {})
        return {key: found for key in keys if (found := self.state(key)) is not None}

    def left_behind(self, older_than: float) -> list[dict]:
        """Working (parts) tables no job will use: of a published load (a crash between publishing
        and dropping it), of a generation a newer one replaced, or of an unpublished load whose
        last report is older than ``older_than`` seconds (a job that crashed or failed and was
        never run again). ``{load_key, generation, parts_table, target_table, abandon}``;
        ``abandon``: the key's newest load, unpublished (to be marked abandoned)."""
        names = [n for (n,) in self.ch.query(
            "SELECT name FROM system.tables WHERE database = {d:String} AND startsWith(name, 'parts_')",
            parameters={"d": self.database}).result_rows]
        if not names or not self.exists("loads"):
            return []
        rows = self.ch.query(
            f"SELECT load_key, generation, parts_table, target_table FROM {self.table('loads')} FINAL"
            f" WHERE parts_table IN {{n:Array(String)}}", parameters={"n": names}).result_rows
        out = []
        for key, generation, parts, target in rows:
            state = self.state(key)
            newest = state is not None and state.generation == generation
            unpublished = newest and state.status != LOAD_PUBLISHED
            if unpublished and now() - state.heartbeat < older_than:
                continue  # it may be resumed yet
            out.append({"load_key": key, "generation": generation, "parts_table": parts, "target_table": target,
                        "abandon": unpublished})
        return out

    def recent(self, limit: int = 50, prefix: str = "") -> list[LoadState]:
        """The most recently reported loads (each its newest generation), newest first; only
        keys starting with ``prefix`` if given (a job of many tables: ``<key>:<db>.<table>``)."""
        if not self.exists("loads"):
            return []
        keys = self.ch.query(f"SELECT load_key FROM {self.table('loads')} WHERE startsWith(load_key, {{p:String}})"
                             f" GROUP BY load_key ORDER BY max(updated_at) DESC LIMIT {int(limit)}",
                             parameters={"p": prefix}).result_rows
        return [state for (key,) in keys if (state := self.state(key)) is not None]

    def reconciliations(self, limit: int = 50, prefix: str = "") -> list[dict]:
        """The newest reconciliation of each recently checked load, newest first."""
        if not self.exists("reconciliations"):
            return []
        rows = self.ch.query(
            f"SELECT load_key, argMax(generation, at), argMax(verdict, at), argMax(mismatched, at),"
            f" argMax(checksum, at), toFloat64(max(at)) FROM {self.table('reconciliations')}"
            f" WHERE startsWith(load_key, {{p:String}}) GROUP BY load_key ORDER BY max(at) DESC LIMIT {int(limit)}",
            parameters={"p": prefix}).result_rows
        return [dict(zip(("load_key", "generation", "verdict", "mismatched", "checksum", "at"), r)) for r in rows]

    def reconciliation(self, load_key: str) -> dict | None:
        """The newest reconciliation of ``load_key``, as ``plugins.pages.reconcile_html`` takes it."""
        if not self.exists("reconciliations"):
            return None
        rows = self.ch.query(
            f"SELECT generation, verdict, mismatched, checksum, report FROM {self.table('reconciliations')}"
            f" WHERE load_key = {{k:String}} ORDER BY at DESC LIMIT 1", parameters={"k": load_key}).result_rows
        if not rows:
            return None
        generation, verdict, mismatched, checksum, report = rows[0]
        state = self.state(load_key)
        return {"load_key": load_key, "generation": generation, "verdict": verdict, "mismatched": list(mismatched),
                "checksum": bool(checksum), "shards": json.loads(report),
                "table": state.source_table if state else "", "target": state.target_table if state else ""}

    def diffs(self, limit: int = 50, prefix: str = "", diff_key: str = "", run_id: str = "") -> list[dict]:
        """Recent snapshot-diff runs, newest first: of keys starting with ``prefix``, or of one
        ``diff_key`` (and ``run_id``)."""
        if not self.exists("diffs"):
            return []
        names = [n for n, _ in _DIFFS if n != "at"]
        where = ("diff_key = {k:String}" + (" AND run_id = {r:String}" if run_id else "") if diff_key
                 else "startsWith(diff_key, {p:String})")
        rows = self.ch.query(f"SELECT {', '.join(ch_ident(n) for n in names)}, toFloat64(at) FROM {self.table('diffs')}"
                             f" WHERE {where} ORDER BY at DESC LIMIT {int(limit)}",
                             parameters={"p": prefix, "k": diff_key, "r": run_id}).result_rows
        return [dict(zip([*names, "at"], r)) | {"old": r[names.index("old_table")], "new": r[names.index("new_table")]}
                for r in rows]

    def diff(self, diff_key: str, run_id: str = "") -> tuple[dict, list[dict]] | None:
        """One diff run (the newest of ``diff_key`` unless ``run_id``) and its shards."""
        runs = self.diffs(limit=1, diff_key=diff_key, run_id=run_id)
        if not runs:
            return None
        run = runs[0]
        names = [n for n, _ in _DIFF_SHARDS]
        shards = self.ch.query(f"SELECT {', '.join(ch_ident(n) for n in names)} FROM {self.table('diff_shards')}"
                               f" WHERE diff_key = {{k:String}} AND run_id = {{r:String}} ORDER BY shard_id",
                               parameters={"k": diff_key, "r": run["run_id"]}).result_rows
        return run, [dict(zip(names, s)) for s in shards]

    def shards(self, load_key: str, generation: int) -> dict[int, ShardState]:
        """The newest attempt of each shard of one generation of ``load_key``."""
        return self._shards([(load_key, generation)]).get((load_key, generation), {})

    def _shards(self, loads: list[tuple[str, int]]) -> dict[tuple[str, int], dict[int, ShardState]]:
        """:meth:`shards` of each (load key, generation), in one query."""
        out: dict[tuple[str, int], dict[int, ShardState]] = {}
        if not loads:
            return out
        for row in self.ch.query(
                f"SELECT load_key, generation, shard_id, attempt, status, where_sql, params, records_read,"
                f" records_written, records_failed, bytes, toFloat64(started_at), toFloat64(finished_at), error,"
                f" version, chunks, resume_key, executor"
                f" FROM {self.table('shards')} FINAL WHERE load_key IN {{k:Array(String)}}"
                f" AND (load_key, generation) IN {{kg:Array(Tuple(String, UInt32))}}"
                f" ORDER BY load_key, generation, shard_id, attempt",
                parameters={"k": [k for k, _ in loads], "kg": [(k, g) for k, g in loads]}).result_rows:
            key, generation, row = row[0], row[1], row[2:]
            shard = ShardState(row[0], row[1], row[2], row[3], json.loads(row[4]), *row[5:-2],
                               json.loads(row[-2]) if row[-2] else None, row[-1])
            out.setdefault((key, generation), {})[shard.shard_id] = shard  # ordered by attempt: the newest wins
        return out


def check_counters(endpoint, load_key: str, database: str = DEFAULT_LEDGER_DATABASE) -> tuple[str, str, dict]:
    """Read ``load_key`` from the ledger and judge it: (verdict, message, summary for XCom)."""
    from airflow_sync_provider.core.clickhouse.client import client

    ch = client(endpoint)
    try:
        ledger = Ledger(ch, database)
        ledger.ensure()
        state = ledger.state(load_key)
        found = ledger.load_set(load_key) if state is None else None
        if found is not None:  # a job of many tables: every one of them
            keys, errors = found
            return set_verdict(load_key, {key: ledger.state(key) for key in keys}, errors)
    finally:
        ch.close()
    verdict, message = counters_verdict(state)
    summary = {"load_key": load_key, "verdict": verdict, "message": message}
    if state is not None:
        summary |= {"generation": state.generation, "load_status": state.status,
                    "shards": len(state.plan.get("shards", [])),
                    "rows_read": sum(s.records_read for s in state.shards.values()),
                    "rows_written": sum(s.records_written for s in state.shards.values()),
                    "failed_shards": state.failed()}
    return verdict, message, summary

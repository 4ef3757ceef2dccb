"""Full load: shards read by ``channels`` concurrent channels, written as Arrow batches.

Driver: find or start the load in the ledger, plan (or reuse the stored plan when resuming),
hand each channel its queue of unfinished shards, report progress, publish when every shard
has succeeded. Channels run as Spark tasks on a cluster's executors, or as threads of the
driver for a small table or on a local master (``driver_copy_rows``): one channel = one source
connection draining its queue; per shard, drop what earlier attempts wrote, stream the rows
into a few large INSERTs (core/clickhouse/inserts.py), report counters. The shard loop is the one
the CDC bootstrap runs too (spark/shard_copy.py); :class:`FullLoadCopy` is what a full load
does differently.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from airflow_sync_provider.core.cdc.followers import await_followers
from airflow_sync_provider.core.cdc.servers import source_epoch
from airflow_sync_provider.core.clickhouse import repairs
from airflow_sync_provider.core.clickhouse.client import shared_client
from airflow_sync_provider.core.clickhouse.columns import WEIGHT_SETTINGS, check_columns
from airflow_sync_provider.core.clickhouse.ddl import create_working, drop_shard, drop_working_tables, parts_table_name
from airflow_sync_provider.core.clickhouse.derived import derived_columns
from airflow_sync_provider.core.clickhouse.described import (
    check_content,
    check_layout,
    is_parts_layout,
    resolve_layout,
    swapped_in,
    table_exists,
    version_above,
)
from airflow_sync_provider.core.clickhouse.history import Stamp, history_name
from airflow_sync_provider.core.clickhouse.history_snapshots import Scope, history_of, write_published
from airflow_sync_provider.core.clickhouse.inserts import ArrowInserts, InsertLimits
from airflow_sync_provider.core.clickhouse.publishing import Loaded, publish_full, publish_partitions, publish_working
from airflow_sync_provider.core.clickhouse.shards import cut_points, shard_predicates, target_predicates, weight_width
from airflow_sync_provider.core.crash_points import crash_point, hold_point
from airflow_sync_provider.core.jobspec import FullLoadSpec, copied_schema
from airflow_sync_provider.core.ledger import Ledger
from airflow_sync_provider.core.loads import (
    LOAD_ABANDONED,
    LOAD_FAILED,
    LOAD_PUBLISHED,
    LOAD_RUNNING,
    SHARD_SUCCESS,
    LoadState,
    ShardState,
)
from airflow_sync_provider.core.positions import BinlogPosition, flavor, position_if_readable, snapshot_position
from airflow_sync_provider.core.source import reader as mysql_reader
from airflow_sync_provider.core.source.group import member_filter
from airflow_sync_provider.core.source.locks import LockHeld, NamedLock, load_lock, lock_holder, lock_name
from airflow_sync_provider.core.source.planning import Plan, Shard, Sharding, plan_table
from airflow_sync_provider.core.source.schema import table_rows
from airflow_sync_provider.core.source.weights import NotComparable, needs_weight, read_weights
from airflow_sync_provider.core.specfile import public_dict, spec_to_dict
from airflow_sync_provider.core.sql import ch_table
from airflow_sync_provider.core.verify import shape as copy_shape
from airflow_sync_provider.core.verify.reports import shard_table
from airflow_sync_provider.spark.channels import driver_copy_limit, running_record
from airflow_sync_provider.spark.session import lazy
from airflow_sync_provider.spark.shard_copy import Channel, Copy, LoadFailed, LockLost, RowVersion, ShardCopy

log = logging.getLogger(__name__)

__all__ = ["FullLoadCopy", "LoadFailed", "run_full_load"]


class FullLoadCopy(ShardCopy):
    """A full load's shards: each read whole (its pieces), in a snapshot of its own, into the
    load's working table; a shard read again first loses what its earlier attempt wrote. A
    channel's shards share its inserts (shard_copy.ChannelOutput)."""

    spark_start: float | None = None  # the wait for the SparkContext not hidden behind planning
    shares_inserts = True

    def before_channels(self, session, todo: list[int], in_driver: bool) -> None:
        if in_driver:  # every shard's running record in one ledger write (run_together; else one per shard)
            self.announced = {i: running_record(self.spec.source, self.shards[i],
                                                (self.state.shards[i].attempt if i in self.state.shards else 0) + 1)
                              for i in todo}
        else:
            waited = time.time()
            session.get()
            self.spark_start = time.time() - waited

    def job_error(self, exc: Exception) -> str:
        return f"Spark job failed: {type(exc).__name__}: {exc}"

    def shards_failed(self) -> Exception:
        return LoadFailed(f"table {self.state.source_table}: {self.state.error}. Nothing was published; re-import "
                          f"with reimport='failed' (airflow-sync reimport --load {self.spec.load_key!r} --failed)")

    def open_channel(self, in_driver: bool) -> Channel:
        """Spark re-runs a channel whose executor was lost (a worker died): shards it finished are
        then not read again, and the one it was reading is cleared first. A driver thread runs
        once, right after the driver read the ledger: nothing to look up."""
        channel = Channel(self.spec)
        channel.at_start = self.state if in_driver else self.outage.call(lambda: self._now(channel.ledger),
                                                                         "reading the load's records")
        return channel

    def _now(self, ledger: Ledger) -> LoadState:
        now = ledger.state(self.state.load_key)
        return now if now is not None and now.generation == self.state.generation else self.state

    def start_record(self, channel: Channel, shard: Shard) -> ShardState:
        previous, now = self.state.shards.get(shard.id), channel.at_start.shards.get(shard.id)
        if now is not None and now.status == SHARD_SUCCESS and now.attempt > (previous.attempt if previous else 0):
            return now
        attempt = max(now.attempt if now else 0, previous.attempt if previous else 0) + 1
        record = self.announced.get(shard.id) or running_record(self.spec.source, shard, attempt)
        record.started_at = time.time()
        return record

    def inserts(self, channel: Channel, record: ShardState) -> ArrowInserts:
        """The channel's stream into the working table (a source group's members share it)."""
        table = ch_table(self.spec.ledger_database, self.state.parts_table)
        settings = WEIGHT_SETTINGS if self.copy.direct and self.copy.weight else None
        return channel.output.stream((table, self.copy.direct, bool(settings)), lambda: ArrowInserts(
            channel.ch, table, settings=settings, compression=self.spec.target.insert_compression,
            on_written=_written, on_failed=_failed,
            # a parts table has a partition per shard: ClickHouse takes at most 100 in one insert
            limits=InsertLimits(self.spec.insert_rows, self.spec.insert_bytes,
                                owners=None if self.copy.direct else 50)))

    def read(self, channel: Channel, shard: Shard, record: ShardState, inserts: ArrowInserts) -> None:
        if self.plan.null_shard(shard) and self.copy.split is not None and not self.copy.split.nullable:
            record.version = self.state.version  # a NOT NULL key: its NULL shard has no rows to read
            return
        # an earlier attempt (attempt > 1: it is in the ledger) may have written rows
        if record.attempt > 1 or not self.copy.direct:
            self.clear(channel, shard)
        record.version = None
        if self.copy.native_sql is None:
            self.read_text(channel, shard, record, inserts)
            return
        try:
            self.read_native(channel, shard, record, inserts)
        except mysql_reader.NativeReadError as exc:
            log.info(f"shard {shard.id}: the native reader failed ({exc}); reading it again "
                  "with mysqlclient")
            inserts.finish()  # what was sent is acknowledged before it is cleared
            record.records_read = record.records_written = record.bytes = 0
            record.version = None
            self.clear(channel, shard)
            self.read_text(channel, shard, record, inserts)
        if record.version is None:  # no rows: a text read gives the empty snapshot its position
            self.read_text(channel, shard, record, inserts)

    def reading(self, channel: Channel, columns_sql: str) -> mysql_reader.ShardRead:
        """How this copy's shards are read, by the reader whose SELECT list is ``columns_sql``."""
        return mysql_reader.ShardRead(self.plan, self.copy.mappings, columns_sql,
                                      channel.throttle.chunk_rows(self.spec.batch_rows), self.copy.weight is not None)

    def read_text(self, channel: Channel, shard: Shard, record: ShardState, inserts: ArrowInserts) -> None:
        """mysqlclient, its snapshot's position read on the same connection."""
        conn = mysql_reader.stream_connect(self.spec.source, self.spec.salt)
        try:
            record.version = (snapshot_position(conn, epoch=self.epoch).snapshot_version(repair=bool(self.state.repair))
                              if self.state.start_position else self.state.version)
            batches = mysql_reader.read_shard(conn, self.reading(channel, self.copy.text_sql), shard)
            self.write(channel, inserts, shard, batches, RowVersion(record.version, {}), record)
        finally:
            conn.close()

    def read_native(self, channel: Channel, shard: Shard, record: ShardState, inserts: ArrowInserts) -> None:
        """connectorx: on MariaDB its snapshot's own position, on MySQL the position just before it."""
        repair, holder, version = bool(self.state.repair), {}, self.state.version
        if self.state.start_position and not self.copy.mariadb:
            with mysql_reader.connect(self.spec.source) as conn:
                version = snapshot_position(conn, epoch=self.epoch).snapshot_version(repair=repair)
        snapshot = bool(self.state.start_position) and self.copy.mariadb
        if not snapshot:
            record.version = version
        batches = mysql_reader.read_shard_native(self.spec.source, self.reading(channel, self.copy.native_sql), shard,
                                                 snapshot, holder)
        self.write(channel, inserts, shard, batches,
                   RowVersion(None if snapshot else version, holder, repair, self.epoch), record)

    @property
    def epoch(self) -> int:
        """The source server's epoch (core/cdc/servers.py) its reads' versions carry (:func:`_plan_copy`)."""
        return self.copy.epoch

    def clear(self, channel: Channel, shard: Shard) -> None:
        """Remove what earlier attempts of ``shard`` wrote to the working table."""
        database, working = self.spec.ledger_database, self.state.parts_table
        if not self.copy.direct:
            drop_shard(channel.ch, database, working, self.copy.shard_base + shard.id)
            return
        width = weight_width(channel.ch, database, working) if self.copy.weights is not None else 0
        index = [s.id for s in self.plan.shards].index(shard.id)
        where, params = target_predicates(self.plan, self.copy.split, self.copy.weights, None, width,
                                          self.copy.member)[index]
        channel.ch.command(f"DELETE FROM {ch_table(database, working)} WHERE {where}", parameters=params)


def _written(rows: int, record: ShardState) -> None:
    record.count_written(rows)


def _failed(rows: int, record: ShardState) -> None:
    record.count_failed(rows)


def binlog_start(spec: FullLoadSpec, ch) -> tuple[dict | None, int]:
    """The source's binlog position now (each shard's read then takes its own snapshot's), or,
    for a source without a binlog (or without the privilege to see it), one version above
    everything the target table holds: snapshot writers still outrank older copies, but the
    copy cannot be a starting point for CDC."""
    with mysql_reader.connect(spec.source) as conn:
        position = position_if_readable(conn, f"{spec.source_database}.{spec.source_table}",
                                        source_epoch(conn, ch, spec.ledger_database))
    if position is not None:
        return position.to_dict(), 0
    # above the history's versions too: a fresh copy's own may be lower than those it replaced
    return None, max(version_above(ch, spec.target_database, spec.target_table),
                     version_above(ch, spec.target_database, history_name(spec.target_table)))


def _check_repairable(spec: FullLoadSpec, ch, schema, state: LoadState) -> None:
    """A repair writes rows of the source's shape now into the published copy in place: refuse it,
    naming what differs and the remedy, when the copy's columns or key no longer match the
    source's (core/verify/shape.py) — it would fail on a missing column, or write values into the
    wrong type, or merge them by the wrong key."""
    copy = copy_shape.read_copy_shape(ch, spec.target_database, spec.target_table)
    if copy is None:
        return  # nothing to compare: publishing the repair names the missing table
    check = copy_shape.check_copy(ch, schema, copy, state.plan.get("split_column"))
    if not check.comparable:
        raise LoadFailed(f"load {spec.load_key!r}: cannot repair {copy.qualified} in place: its shape no longer "
                         f"matches {schema.qualified}'s ({'; '.join(check.problems)}); "
                         f"{copy_shape.reload_remedy(spec.load_key, schema.qualified, copy.qualified)}")


def _start_or_resume(spec: FullLoadSpec, ledger: Ledger, schema, working: str | None = None,
                     start: tuple[dict | None, int] | None = None, known: dict | None = None) -> tuple[LoadState, Plan]:
    """The load's ledger state and plan: resumed, a repair of a published load, or a new
    generation (its working table ``working``, a source group's shared one, or its own).
    ``start``: :func:`binlog_start` read already (a source group's, once per source); ``known``:
    ledger states read already, by load key (a source group's, in one query)."""
    state = known[spec.load_key] if known is not None and spec.load_key in known else ledger.state(spec.load_key)
    if spec.reimport == "failed":
        if state is None:
            raise LoadFailed(f"load {spec.load_key!r} is not in the ledger: nothing to re-import")
        if state.status == LOAD_ABANDONED:
            raise LoadFailed(f"load {spec.load_key!r} was abandoned ({state.error[:300]}): nothing is left to "
                             "re-import; run it without reimport for a fresh copy")
        if state.status == LOAD_PUBLISHED:  # shards a reconciliation marked: repair them in place
            if not state.failed():
                raise LoadFailed(f"load {spec.load_key!r} is published and no shard is marked failed or mismatched "
                                 "(a reconciliation marks mismatched shards); run it again for a fresh copy")
            check_layout(ledger.ch, spec.target_database, spec.target_table)
            _check_repairable(spec, ledger.ch, schema, state)
            state.status, state.error, state.repair = LOAD_RUNNING, "", state.failed()
            position, state.version = start or binlog_start(spec, ledger.ch)
            # the copy still began where its load began (a pipeline started from it replays from
            # there: the shards not repaired are as the load read them); the repair's own reads
            # rank by their snapshots' positions, of the server they read now (_plan_copy)
            state.start_position = (state.start_position or position) if position else None
            # a CDC bootstrap's copy was written in place and has no working table of its own
            state.parts_table = working or state.parts_table or parts_table_name(spec.load_key,
                                                                                       state.generation)
            return state, Plan.from_dict(state.plan)
    if state is not None and state.status not in (LOAD_PUBLISHED, LOAD_ABANDONED):
        state.status, state.error = LOAD_RUNNING, ""
        return state, Plan.from_dict(state.plan)  # resume: same shards, so earlier attempts line up
    with mysql_reader.connect(spec.source) as conn:
        plan = plan_table(conn, schema, Sharding(speed=spec.speed(), split_column=spec.split_column,
                          split_factor=spec.split_factor, strategy=spec.strategy, where=spec.filter()))
    generation = state.generation + 1 if state else 1
    position, version = start or binlog_start(spec, ledger.ch)
    state = LoadState(spec.load_key, generation, LOAD_RUNNING, schema.qualified,
                      f"{spec.target_database}.{spec.target_table}", plan.to_dict(),
                      working or parts_table_name(spec.load_key, generation), version,
                      public_dict(spec) | {"source_shape": schema.shape()}, start_position=position)
    return state, plan


def _plan_copy(spec: FullLoadSpec, ch, schema, plan: Plan, state: LoadState, direct: bool = True) -> tuple[Copy, str]:
    """The reader (and why) and the working table's layout for this load (``direct=False``: the
    parts layout, whatever the load could take: a source group's members share one)."""
    mappings = schema.mappings()
    split = schema.column(plan.split_column) if plan.split_column else None
    weight = split if needs_weight(split) else None  # collated key: rows carry their weight
    # a full reload writes straight into a table of the final layout, unless ClickHouse cannot
    # tell a shard's rows apart (then a re-read shard could not be cleared); a resumed load
    # keeps the layout it started with
    direct, weights = direct and not state.repair and not spec.partition_by, None
    if direct and table_exists(ch, spec.ledger_database, state.parts_table):
        direct = not is_parts_layout(ch, spec.ledger_database, state.parts_table)
    with mysql_reader.connect(spec.source) as conn:
        if direct:
            try:
                weights = read_weights(conn, split, cut_points(plan)) if weight is not None else None
                target_predicates(plan, split, weights)
            except NotComparable:
                direct, weights = False, None
        mariadb = flavor(conn).mariadb
        # the epoch its reads' versions carry: the load's start position's; a repair's, that of the
        # server it reads now (after a failover, above every version the old server's stream wrote)
        epoch = ((source_epoch(conn, ch, spec.ledger_database) if state.repair else
                  BinlogPosition.from_dict(state.start_position).epoch) if state.start_position else 0)
    native_sql, note = mysql_reader.native_reader(spec.reader, spec.source, plan, mappings, schema.primary_key, weight)
    layout = resolve_layout(ch, spec.target_database, spec.target_table, spec.layout, reshape=spec.reshape)
    # its derived columns, or refused naming the copy (not the working table a load creates)
    derived_columns(layout, mappings, f"{spec.target_database}.{spec.target_table}")
    check_content(ch, schema, spec.target_database, spec.target_table)  # what it holds, or refused
    return Copy(mappings, weight, mysql_reader.select_list(mappings, weight), native_sql, mariadb, direct,
                split, weights, member=member_filter(schema), layout=layout, epoch=epoch), note


def _publish(spec: FullLoadSpec, ch, schema, plan: Plan, state: LoadState, copy: Copy) -> int:
    """Make the loaded rows visible: swap in a full copy, replace a period's partitions, or
    repair the re-imported shards of a published table in place. Returns the rows published.
    A copy that keeps a history hears of it first (:func:`_history_first`)."""
    shards = repaired_shards(spec, ch, schema, plan, state) if state.repair else []
    _history_first(spec, ch, schema, state, copy, shards)
    if copy.direct:
        return publish_working(ch, spec.ledger_database, state.parts_table, spec.target_database,
                                      spec.target_table)
    loaded = Loaded(schema, spec.ledger_database, state.parts_table, spec.target_database, spec.target_table,
                           copy.weight is not None, copy.layout)
    if state.repair:
        return repairs.publish_repair(ch, loaded, shards)
    if spec.partition_by:
        return publish_partitions(ch, loaded, spec.partition_by, list(spec.replace_partitions))
    return publish_full(ch, loaded)


def _history_first(spec: FullLoadSpec, ch, schema, state: LoadState, copy: Copy, shards: list) -> None:
    """The load's rows into the copy's history before the copy changes (a load's: ``snapshot``
    events; a repair's: ``repair`` events; of rows the history's newest versions lack only, and the
    deletes of keys the rows replace but lack: core/clickhouse/history_snapshots.py). Stamped from
    the ledger's records (the shards' versions and their reads' start), so a publish retried after
    a crash writes the same rows again, which collapse, or finds them written."""
    history = history_of(schema, spec.target_database, spec.target_table, copy.layout, copy.weight is not None)
    if history is None or (copy.direct and swapped_in(ch, spec.ledger_database, state.parts_table,
                                                      spec.target_database, spec.target_table)):
        return  # swapped in already (a crash before the ledger heard): its history was written before
    # as the ledger keeps them (its times are µs: a float in memory may round otherwise on a retry)
    recorded = Ledger(ch, spec.ledger_database).state(state.load_key) or state
    published = [s for i, s in recorded.shards.items() if i in (state.repair or state.shards)]
    top = max(s.version for s in published)
    if state.repair:
        scopes = [Scope(where, params, version) for where, params, version in shards]
    elif spec.partition_by:
        scopes = [Scope("_partition_id IN {history_partitions:Array(String)}",
                        {"history_partitions": list(spec.replace_partitions)}, top)]
    else:
        scopes = [Scope("1", {}, top)]
    event, via = ("repair", "reconcile") if state.repair else ("snapshot", "load")
    stamp = Stamp(event, via, int(max(s.started_at for s in published) * 1_000_000))
    write_published(ch, history, (spec.ledger_database, state.parts_table), stamp, scopes)
    crash_point("load.history-written")  # tests: the history written, the copy not yet (a retry collapses)


def repaired_shards(spec: FullLoadSpec, ch, schema, plan: Plan, state: LoadState) -> list[tuple[str, dict, int]]:
    """The re-read shards of a repair: each one's target predicate and its read's version."""
    with mysql_reader.connect(spec.source) as conn:
        predicates = shard_predicates(conn, ch, plan, schema, (spec.target_database, spec.target_table), state.spec)
    return [(where, params, state.shards[shard.id].version)
            for shard, (where, params) in zip(plan.shards, predicates) if shard.id in state.repair]


def _published_summary(state: LoadState, started: float) -> dict:
    """What a run returns for a load it found published and left alone."""
    return {"load_key": state.load_key, "generation": state.generation, "table": state.source_table,
            "target": state.target_table, "rows": sum(s.records_written for s in state.shards.values()),
            "shards": len(state.plan["shards"]), "shards_read": 0, "repaired": [], "per_shard": [],
            "channels": state.plan.get("channels"), "split_column": state.plan.get("split_column"),
            "start_position": state.start_position, "strategy": state.plan.get("strategy"), "reader": "",
            "warnings": [], "phases": {}, "seconds": round(time.time() - started, 3), "skipped": True}


def run_full_load(spec: FullLoadSpec, spark) -> dict:
    """``spark``: a SparkSession or a :class:`LazySession` (spark_jobs/full_load.py), which is
    started while the driver plans, and not at all when the driver copies the table alone."""
    started = time.time()
    session = lazy(spark)
    ch = shared_client(spec.target)
    ledger = Ledger(ch, spec.ledger_database)
    ledger.ensure()
    if spec.skip_published and (done := ledger.state(spec.load_key)) is not None and done.status == LOAD_PUBLISHED:
        log.info(f"load {spec.load_key!r} is published (generation {done.generation}); skipped")
        return _published_summary(done, started)
    load = TableLoad(spec, session, ledger)
    load.lock()
    try:
        collect_left_behind(spec, ledger)
        load.prepare()
        load.begin()
        in_driver = load.copy_in_driver(load.estimate())
        per_shard = load.copier.run(session, in_driver) if load.todo else []
        load.settle(per_shard, in_driver)
        load.publish()
        return load.done(per_shard)
    finally:
        load.unlock()


def collect_left_behind(spec: FullLoadSpec, ledger: Ledger) -> None:
    """Drop the working tables no job will use (Ledger.left_behind): unpublished loads nobody
    resumed for ``abandon_after_seconds`` are marked abandoned, so running one again starts
    afresh. A load whose lock is held is running, however quiet, and is left alone."""
    found = [w for w in ledger.left_behind(spec.abandon_after_seconds) if w["load_key"] != spec.load_key]
    if not found:
        return
    with mysql_reader.connect(spec.source) as conn:
        running = {w["load_key"] for w in found
                   if lock_holder(conn, lock_name(spec.ledger_database, f"load:{w['load_key']}")) is not None}
    for w in found:
        if w["load_key"] in running:
            continue
        drop_working_tables(ledger.ch, spec.ledger_database, w["parts_table"], w["target_table"])
        if w["abandon"]:
            state = ledger.state(w["load_key"])
            state.status = LOAD_ABANDONED
            state.error = (f"abandoned: no report for over {spec.abandon_after_seconds:.0f} s, so its working tables "
                           f"were dropped; {state.error}")[:4000]
            ledger.write_load(state)
        log.info(f"dropped the working tables of load {w['load_key']!r} generation {w['generation']} "
              f"({'abandoned' if w['abandon'] else 'published or replaced'})")


class TableLoad:
    """One table's load, step by step: :func:`run_full_load` runs the steps in order; a source
    group's merged copy (spark/group_load.py) runs each for every member, with one working table,
    one set of channels and one publish. Holds the load's context: spec, session, ledger (and its
    client), the copied schema, ledger state, plan, copy decisions and phases."""

    def __init__(self, spec: FullLoadSpec, session, ledger: Ledger):
        self.spec, self.session, self.ledger, self.ch = spec, session, ledger, ledger.ch
        self.started = time.time()
        self._lock: NamedLock | None = None
        self.phases: dict[str, float] = {}  # where the job's time went (bench/, the task log)
        self.todo: list[int] = []
        self.notes: list[str] = []  # a repair's: the pipelines following its copy that have not caught up

    def lock(self) -> None:
        """One job per load key; a killed job's key is free at once (core/source/locks.py)."""
        try:
            self._lock = load_lock(self.spec.source, self.spec.ledger_database, self.spec.load_key,
                                   f"load {self.spec.load_key!r}")
        except LockHeld as held:
            raise LoadFailed(str(held)) from None

    def unlock(self) -> None:
        if self._lock is not None:
            self._lock.release()

    def lock_lost(self) -> str:
        """Why this job must stop writing: its lock on the source is gone ("" while it holds it)."""
        if self._lock is None or not self._lock.lost:
            return ""
        return (f"load {self.spec.load_key!r}: this job lost its lock on the source ({self._lock.lost}), so another "
                "run may own the load now; it writes nothing more. Run it again: it resumes from the finished shards")

    def read_schema(self):
        """The source table as this load copies it."""
        with mysql_reader.connect(self.spec.source) as conn:
            return copied_schema(conn, spec_to_dict(self.spec), self.spec.salt, writer="load")

    def estimate(self) -> int:
        """The rows the load has left to copy, by the plan's estimates."""
        return sum(s.estimated_rows or 0 for s in self.plan.shards if s.id in self.todo)

    def copy_in_driver(self, rows: int) -> bool:
        """Are ``rows`` (this load's, or a group's) copied by the driver's own channels?"""
        return rows <= driver_copy_limit(self.spec.driver_copy_rows, self.session) and not self.session.started

    def prepare(self, schema=None, working: str | None = None, start: tuple | None = None,
                known: dict | None = None) -> None:
        """The schema copied (``schema``: a merged copy's member view, else the source table's),
        the ledger state and plan (new or resumed), the copy's reader and layout (a source group
        passes its shared ``working`` table, its source's ``start`` and the states it read)."""
        spec = self.spec
        self.schema = schema or self.read_schema()
        if schema is None:
            with mysql_reader.connect(spec.source) as conn:
                if table_rows(conn, spec.source_database, spec.source_table) > driver_copy_limit(
                        spec.driver_copy_rows, self.session):
                    self.session.start()  # the SparkContext comes up while the driver plans
        check_columns(self.schema)
        self.state, self.plan = _start_or_resume(spec, self.ledger, self.schema, working, start, known)
        self.copy, self.reader_note = _plan_copy(spec, self.ch, self.schema, self.plan, self.state)
        # what a history cannot hold (a keyless table) refused before a row is read
        history_of(self.schema, spec.target_database, spec.target_table, self.copy.layout, False)
        self.todo = self.state.todo()

    def use_layout(self, direct: bool, shard_base: int = 0) -> None:
        """A source group's member: the group's one working-table layout, and where its shards'
        ids start in a shared parts table."""
        if self.copy.direct != direct:
            self.copy, self.reader_note = _plan_copy(self.spec, self.ch, self.schema, self.plan, self.state, direct)
        self.copy = dataclasses.replace(self.copy, shard_base=shard_base)

    def create_working(self) -> None:
        create_working(self.ch, self.schema, self.spec.ledger_database, self.state.parts_table,
                              self.copy.weight is not None, self.copy.direct, self.copy.layout)

    def begin(self, grouped: bool = False) -> None:
        """The working table made and the load recorded as running (a group's member: the group
        makes their shared table and records its members together)."""
        if not grouped:
            self.create_working()
            self.ledger.write_load(self.state)
        hold_point("full_load.started", self.spec.load_key)  # tests: loads held together (core/crash_points.py)
        state, plan, copy = self.state, self.plan, self.copy
        log.info(f"load {state.load_key!r} generation {state.generation}: {len(self.todo)} of "
                 f"{len(plan.shards)} shards to read{' (repair of the published table)' if state.repair else ''}, "
                 f"{plan.channels} channel(s), split on {plan.split_column!r}")
        log.info(f"reader: {self.reader_note}; working table: "
                 f"{'final layout, published by a swap' if copy.direct else 'one partition per shard'}")
        self.phases["prepare"] = time.time() - self.started
        self.copier = FullLoadCopy(self.spec, plan, copy, state, self.ledger)
        self.copier.stopping = self.lock_lost
        if self.todo:
            log.info(f"copying about {self.estimate():,} rows in {min(plan.channels, len(self.todo))} channel(s)")

    def settle(self, per_shard: list[dict], in_driver: bool) -> None:
        """The shards as the channels left them (a failed one fails the load, naming it)."""
        if self.copier.spark_start is not None:
            self.phases["spark_start"] = self.copier.spark_start  # the session's start-up not hidden behind planning
        self.phases["copy"] = time.time() - self.started - self.phases["prepare"] - self.phases.get("spark_start", 0)
        self.state = self.copier.settle(per_shard, in_driver and bool(self.todo))
        if self.lock_lost():  # another job may own the key now: it publishes
            raise LockLost(self.lock_lost())

    @property
    def written(self) -> int:
        """Rows written by the shards this load publishes (a repair: its re-read shards)."""
        published = self.state.repair or [s.id for s in self.plan.shards]
        return sum(s.records_written for s in self.state.shards.values() if s.shard_id in published)

    def publish(self, written: int | None = None) -> int:
        """Make the rows visible (:func:`_publish`; publishing again is safe, so a passing failure
        is retried within the job's bound); a failure is recorded. ``written``: the rows the
        working table holds (a source group's: every member's)."""
        written = self.written if written is None else written
        try:
            if self.state.repair:  # beside the pipelines following the copy (docs/design-reconciliation.md)
                self.notes = await_followers(self.ch, self.spec.ledger_database, self.state)
            landed = self.copier.outage.call(lambda: _publish(self.spec, self.ch, self.schema, self.plan, self.state,
                                                              self.copy), "publishing the copy")
        except Exception as exc:  # e.g. the target went away: recorded, and publishing again is safe
            self.failed(f"publishing failed: {type(exc).__name__}: {exc}")
            raise
        if landed != written:
            raise LoadFailed(f"{self.spec.target_database}.{self.spec.target_table}: {written} rows written but "
                             f"{landed} published")
        return landed

    def failed(self, error: str) -> None:
        self.state.status, self.state.error = LOAD_FAILED, error[:4000]
        self.copier.record(lambda: self.ledger.write_load(self.state), "recording the load's failure")

    def done(self, per_shard: list[dict], grouped: bool = False) -> dict:
        """The load published: recorded and its working table dropped (a group's member: the
        group records its members together and drops their shared table), its result."""
        state, plan = self.state, self.plan
        repaired, written = list(state.repair), self.written  # before the repair list is cleared
        state.status, state.repair = LOAD_PUBLISHED, []
        if not grouped:
            self.ledger.write_load(state)
            self.ch.command(f"DROP TABLE IF EXISTS {ch_table(self.spec.ledger_database, state.parts_table)}")
        log.info("%s", shard_table([vars(s) | {"seconds": s.seconds} for s in state.shards.values()]))
        self.phases["publish"] = time.time() - self.started - sum(self.phases.values())
        log.info("seconds: " + ", ".join(f"{k} {v:.2f}" for k, v in self.phases.items()))
        return {
            "load_key": state.load_key,
            "generation": state.generation,
            "table": state.source_table,
            "target": f"{self.spec.target_database}.{self.spec.target_table}",
            "rows": written,
            "shards": len(plan.shards),
            "shards_read": len(self.todo),
            "repaired": repaired,
            "per_shard": [{k: s[k] for k in ("shard_id", "status", "attempt", "records_read", "records_written",
                                             "records_failed", "bytes", "seconds")} for s in per_shard],
            "channels": plan.channels,
            "split_column": plan.split_column,
            "start_position": state.start_position,
            "strategy": plan.strategy,
            "reader": self.reader_note,
            "warnings": list(plan.warnings) + self.notes,
            "phases": {k: round(v, 3) for k, v in self.phases.items()},
            "seconds": round(time.time() - self.started, 3),
        }

"""Full load: shards read by ``channels`` concurrent channels, written as Arrow batches.

Driver: find or start the load in the ledger, plan (or reuse the stored plan when resuming),
hand each channel its queue of unfinished shards, report progress, publish when every shard
has succeeded. Channels run as Spark tasks on a cluster's executors, or as threads of the
driver for a small table or on a local master (``driver_copy_rows``): one channel = one source
connection draining its queue; per shard, drop what earlier attempts wrote, stream the rows
into a few large INSERTs (core/target/inserts.py), report counters.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pyarrow as pa

from airflow_sync_provider.core.cdc.positions import flavor, position_if_readable, snapshot_position
from airflow_sync_provider.core.flow_control import Throttle
from airflow_sync_provider.core.jobspec import FullLoadSpec, copied_schema, public_dict, spec_to_dict
from airflow_sync_provider.core.ledger import (
    LOAD_ABANDONED, LOAD_FAILED, LOAD_PUBLISHED, LOAD_RUNNING, SHARD_FAILED, SHARD_SUCCESS, Ledger, LoadState, ShardState,
)
from airflow_sync_provider.core.crash_points import hold_point
from airflow_sync_provider.core.source import reader as mysql_reader
from airflow_sync_provider.core.source.locks import LockHeld, NamedLock, load_lock, lock_holder, lock_name
from airflow_sync_provider.core.source.planning import Plan, plan_table
from airflow_sync_provider.core.source.schema import table_rows
from airflow_sync_provider.core.sql import ch_table
from airflow_sync_provider.core.target import clickhouse as target
from airflow_sync_provider.core.target.inserts import ArrowInserts
from airflow_sync_provider.core.target.shards import (
    SPLIT_WEIGHT_COLUMN, NotComparable, Weights, cut_points, needs_weight, read_weights, shard_predicates,
    target_predicates, weight_width,
)
from airflow_sync_provider.core.typemap import MySQLColumn
from airflow_sync_provider.core.verify.reports import shard_table
from airflow_sync_provider.spark.cdc_ddl import shape_of_load
from airflow_sync_provider.spark.channels import Progress, driver_copy_limit, retrying, run_channels, running_record
from airflow_sync_provider.spark.session import lazy

REPORT_EVERY_SECONDS = 1.0


class LoadFailed(RuntimeError):
    pass


@dataclass(frozen=True)
class _Copy:
    """How every channel copies its shards, decided once by the driver."""

    mappings: list
    weight: MySQLColumn | None  # a collated split column: rows carry its collation weight
    text_sql: str  # the mysqlclient reader's SELECT list
    native_sql: str | None  # the Arrow-native reader's, None when mysqlclient reads
    mariadb: bool  # the native read takes MariaDB's own snapshot position (else one read before)
    direct: bool  # the working table has the final layout (core/target/clickhouse.py)
    split: MySQLColumn | None = None
    weights: Weights | None = None  # the cuts' collation weights, for the direct layout's deletes

    def names(self) -> list[str]:
        return ([m.name for m in self.mappings] + ([SPLIT_WEIGHT_COLUMN] if self.weight else [])
                + [target.VERSION_COLUMN] + ([] if self.direct else [target.SHARD_COLUMN]))


def _clear_shard(copy: _Copy, plan: Plan, ch, database: str, working: str, shard) -> None:
    """Remove what earlier attempts of ``shard`` wrote to the working table."""
    if not copy.direct:
        target.drop_shard(ch, database, working, shard.id)
        return
    width = weight_width(ch, database, working) if copy.weights is not None else 0
    index = [s.id for s in plan.shards].index(shard.id)
    where, params = target_predicates(plan, copy.split, copy.weights, None, width)[index]
    ch.command(f"DELETE FROM {ch_table(database, working)} WHERE {where}", parameters=params)


def _load_shard(spec, plan, copy: _Copy, ch, ledger, state, shard, attempt, throttle, rewrite: bool,
                announced: ShardState | None = None):
    """Copy one shard; ``rewrite``: an earlier attempt of it may have written rows; ``announced``:
    its running record, already in the ledger."""
    names = copy.names()
    record = announced or running_record(spec.source, shard, attempt)
    record.started_at = time.time()
    repair = bool(state.repair)

    def written(rows):
        record.records_written += rows

    def failed(rows):
        record.records_failed += rows

    inserts = ArrowInserts(ch, ch_table(spec.ledger_database, state.parts_table),
                           settings=target.WEIGHT_SETTINGS if copy.direct and copy.weight else None,
                           max_rows=spec.insert_rows, max_bytes=spec.insert_bytes, on_written=written, on_failed=failed)

    def copy_rows(batches, version_of):
        reported = time.monotonic()
        for batch in batches:
            if record.version is None:
                record.version = version_of()  # the rows' version: the position their snapshot saw
            rows = batch.num_rows
            record.records_read += rows
            record.bytes += batch.nbytes
            tail = [pa.repeat(pa.scalar(record.version, pa.uint64()), rows)]
            if not copy.direct:
                tail.append(pa.repeat(pa.scalar(shard.id, pa.uint32()), rows))
            inserts.write(pa.RecordBatch.from_arrays([*batch.columns, *tail], names=names))
            throttle.account(rows, batch.nbytes)
            if time.monotonic() - reported >= REPORT_EVERY_SECONDS:  # live hook counters
                ledger.write_shard(state.load_key, state.generation, record)
                reported = time.monotonic()
        inserts.finish()

    def read_text():
        conn = mysql_reader.stream_connect(spec.source)
        try:
            record.version = (snapshot_position(conn).snapshot_version(repair=repair) if state.start_position
                              else state.version)
            copy_rows(mysql_reader.read_shard(conn, plan, copy.mappings, shard, throttle.chunk_rows(spec.batch_rows),
                                              copy.text_sql, copy.weight is not None), None)
        finally:
            conn.close()

    def read_native():
        holder, version = {}, state.version
        if state.start_position and not copy.mariadb:  # MySQL: the position just before the snapshot
            with mysql_reader.connect(spec.source) as conn:
                version = snapshot_position(conn).snapshot_version(repair=repair)
        snapshot = bool(state.start_position) and copy.mariadb
        if not snapshot:
            record.version = version
        copy_rows(mysql_reader.read_shard_native(spec.source, plan, copy.mappings, shard,
                                                 throttle.chunk_rows(spec.batch_rows), copy.native_sql,
                                                 copy.weight is not None, snapshot, holder),
                  lambda: holder["snapshot"] - (1 if repair else 2))

    try:
        if announced is None:  # recorded before any row is written: a re-read then clears the shard first
            ledger.write_shard(state.load_key, state.generation, record)
        if rewrite or not copy.direct:
            _clear_shard(copy, plan, ch, spec.ledger_database, state.parts_table, shard)
        record.version = None
        if copy.native_sql is None:
            read_text()
        else:
            try:
                read_native()
            except mysql_reader.NativeReadError as exc:
                print(f"[airflow-sync] shard {shard.id}: the native reader failed ({exc}); reading it again "
                      "with mysqlclient", flush=True)
                inserts.finish()  # what was sent is acknowledged before it is cleared
                record.records_read = record.records_written = record.bytes = 0
                record.version = None
                _clear_shard(copy, plan, ch, spec.ledger_database, state.parts_table, shard)
                read_text()
            if record.version is None:  # no rows: a text read gives the empty snapshot its position
                read_text()
        record.status = SHARD_SUCCESS
    except Exception as exc:
        inserts.settle()
        record.status, record.error = SHARD_FAILED, f"{type(exc).__name__}: {exc}"[:4000]
        record.version = record.version or 0
    finally:
        inserts.close()
    record.finished_at = time.time()
    retrying(lambda: ledger.write_shard(state.load_key, state.generation, record), spec.ledger_wait_seconds)
    return record


def _channel_start(ledger: Ledger, state: LoadState) -> LoadState:
    """The load as the ledger has it when a channel starts. Spark re-runs a channel whose
    executor was lost (a worker died): shards it finished are then not read again, and the one
    it was reading is cleared first."""
    now = ledger.state(state.load_key)
    return now if now is not None and now.generation == state.generation else state


def _load_channel(spec: FullLoadSpec, plan: Plan, copy: _Copy, state: LoadState, shard_ids: list[int],
                  in_driver: bool = False, announced: dict | None = None):
    """Runs on an executor (or a driver thread): one channel = one source connection at a time, one throttle.
    ``announced``: the shards' running records the driver wrote for its threads."""
    ch = target.shared_client(spec.target)
    ledger = Ledger(ch, spec.ledger_database)
    throttle = Throttle(spec.channel_record_speed, spec.channel_byte_speed)
    shards = {s.id: s for s in plan.shards}
    # a driver thread runs once, right after the driver read the ledger: nothing to look up
    at_start = state if in_driver else retrying(lambda: _channel_start(ledger, state), spec.ledger_wait_seconds)
    for shard_id in shard_ids:
        previous, now = state.shards.get(shard_id), at_start.shards.get(shard_id)
        if now is not None and now.status == SHARD_SUCCESS and now.attempt > (previous.attempt if previous else 0):
            yield vars(now) | {"seconds": now.seconds}
            continue
        attempt = max(now.attempt if now else 0, previous.attempt if previous else 0) + 1
        record = _load_shard(spec, plan, copy, ch, ledger, state, shards[shard_id], attempt, throttle,
                             now is not None, (announced or {}).get(shard_id))
        yield vars(record) | {"seconds": record.seconds}


def _binlog_start(spec: FullLoadSpec, ch) -> tuple[dict | None, int]:
    """The source's binlog position now (each shard's read then takes its own snapshot's), or,
    for a source without a binlog (or without the privilege to see it), one version above
    everything the target table holds: snapshot writers still outrank older copies, but the
    copy cannot be a starting point for CDC."""
    with mysql_reader.connect(spec.source) as conn:
        position = position_if_readable(conn, f"{spec.source_database}.{spec.source_table}")
    if position is not None:
        return position.to_dict(), 0
    top = 0
    if target.table_exists(ch, spec.target_database, spec.target_table):
        top = int(ch.command(f"SELECT max({target.VERSION_COLUMN}) FROM {ch_table(spec.target_database, spec.target_table)}")
                  or 0)
    return None, top + 1


def _start_or_resume(spec: FullLoadSpec, ledger: Ledger, schema) -> tuple[LoadState, Plan]:
    state = ledger.state(spec.load_key)
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
            target.check_layout(ledger.ch, spec.target_database, spec.target_table)
            state.status, state.error, state.repair = LOAD_RUNNING, "", state.failed()
            state.start_position, state.version = _binlog_start(spec, ledger.ch)
            return state, Plan.from_dict(state.plan)
    if state is not None and state.status not in (LOAD_PUBLISHED, LOAD_ABANDONED):
        state.status, state.error = LOAD_RUNNING, ""
        return state, Plan.from_dict(state.plan)  # resume: same shards, so earlier attempts line up
    with mysql_reader.connect(spec.source) as conn:
        plan = plan_table(conn, schema, speed=spec.speed(), split_column=spec.split_column,
                          split_factor=spec.split_factor, strategy=spec.strategy, where=spec.filter())
    generation = state.generation + 1 if state else 1
    start, version = _binlog_start(spec, ledger.ch)
    state = LoadState(spec.load_key, generation, LOAD_RUNNING, schema.qualified,
                      f"{spec.target_database}.{spec.target_table}", plan.to_dict(),
                      target.parts_table_name(spec.load_key, generation), version,
                      public_dict(spec) | {"source_shape": shape_of_load(schema)}, start_position=start)
    return state, plan


def _plan_copy(spec: FullLoadSpec, ch, schema, plan: Plan, state: LoadState) -> tuple[_Copy, str]:
    """The reader (and why) and the working table's layout for this load."""
    mappings = schema.mappings()
    split = schema.column(plan.split_column) if plan.split_column else None
    weight = split if needs_weight(split) else None  # collated key: rows carry their weight
    # a full reload writes straight into a table of the final layout, unless ClickHouse cannot
    # tell a shard's rows apart (then a re-read shard could not be cleared); a resumed load
    # keeps the layout it started with
    direct, weights = not state.repair and not spec.partition_by, None
    if direct and target.table_exists(ch, spec.ledger_database, state.parts_table):
        direct = not target.is_parts_layout(ch, spec.ledger_database, state.parts_table)
    with mysql_reader.connect(spec.source) as conn:
        if direct:
            try:
                weights = read_weights(conn, split, cut_points(plan)) if weight is not None else None
                target_predicates(plan, split, weights)
            except NotComparable:
                direct, weights = False, None
        mariadb = flavor(conn).mariadb
    native_sql, note = mysql_reader.native_reader(spec.reader, spec.source, plan, mappings, schema.primary_key, weight)
    return _Copy(mappings, weight, mysql_reader.select_list(mappings, weight), native_sql, mariadb, direct,
                 split, weights), note


def _publish(spec: FullLoadSpec, ch, schema, plan: Plan, state: LoadState, copy: _Copy) -> int:
    """Make the loaded rows visible: swap in a full copy, replace a period's partitions, or
    repair the re-imported shards of a published table in place. Returns the rows published."""
    if copy.direct:
        return target.publish_working(ch, spec.ledger_database, state.parts_table, spec.target_database,
                                      spec.target_table)
    weight = copy.weight is not None
    args = (ch, schema, state.parts_table, spec.ledger_database, spec.target_database, spec.target_table)
    if state.repair:
        with mysql_reader.connect(spec.source) as conn:
            predicates = shard_predicates(conn, ch, plan, schema, state.spec, spec.target_database, spec.target_table)
        chosen = [(where, params, state.shards[shard.id].version)
                  for shard, (where, params) in zip(plan.shards, predicates) if shard.id in state.repair]
        return target.publish_repair(*args, chosen, weight)
    if spec.partition_by:
        return target.publish_partitions(*args, spec.partition_by, list(spec.replace_partitions), weight)
    return target.publish_full(*args, weight)


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
    ch = target.shared_client(spec.target)
    ledger = Ledger(ch, spec.ledger_database)
    ledger.ensure()
    if spec.skip_published and (done := ledger.state(spec.load_key)) is not None and done.status == LOAD_PUBLISHED:
        print(f"[airflow-sync] load {spec.load_key!r} is published (generation {done.generation}); skipped", flush=True)
        return _published_summary(done, started)
    try:  # one job per load key; a killed job's key is free at once (core/source/locks.py)
        lock = load_lock(spec.source, spec.ledger_database, spec.load_key, f"load {spec.load_key!r}")
    except LockHeld as held:
        raise LoadFailed(str(held)) from None
    try:
        _collect_left_behind(spec, ledger)
        return _load(spec, session, ch, ledger, lock, started)
    finally:
        lock.release()


def _collect_left_behind(spec: FullLoadSpec, ledger: Ledger) -> None:
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
        target.drop_working_tables(ledger.ch, spec.ledger_database, w["parts_table"], w["target_table"])
        if w["abandon"]:
            state = ledger.state(w["load_key"])
            state.status = LOAD_ABANDONED
            state.error = (f"abandoned: no report for over {spec.abandon_after_seconds:.0f} s, so its working tables "
                           f"were dropped; {state.error}")[:4000]
            ledger.write_load(state)
        print(f"[airflow-sync] dropped the working tables of load {w['load_key']!r} generation {w['generation']} "
              f"({'abandoned' if w['abandon'] else 'published or replaced'})", flush=True)


def _load(spec: FullLoadSpec, session, ch, ledger: Ledger, lock: NamedLock, started: float) -> dict:
    driver_rows = driver_copy_limit(spec.driver_copy_rows, session)
    with mysql_reader.connect(spec.source) as conn:
        schema = copied_schema(conn, spec_to_dict(spec))
        if table_rows(conn, spec.source_database, spec.source_table) > driver_rows:
            session.start()  # the SparkContext comes up while the driver plans
    target.check_columns(schema)
    state, plan = _start_or_resume(spec, ledger, schema)
    copy, reader_note = _plan_copy(spec, ch, schema, plan, state)
    ch.command(target.create_working_sql(schema, spec.ledger_database, state.parts_table, copy.weight is not None,
                                         copy.direct))
    ledger.write_load(state)
    hold_point("full_load.started", spec.load_key)  # tests: loads held together (core/crash_points.py)
    todo = state.todo()
    print(f"[airflow-sync] load {state.load_key!r} generation {state.generation}: {len(todo)} of "
          f"{len(plan.shards)} shards to read{' (repair of the published table)' if state.repair else ''}, "
          f"{plan.channels} channel(s), split on {plan.split_column!r}", flush=True)
    print(f"[airflow-sync] reader: {reader_note}; working table: "
          f"{'final layout, published by a swap' if copy.direct else 'one partition per shard'}", flush=True)

    phases = {"prepare": time.time() - started}  # where the job's time went (bench/, the task log)
    per_shard, in_driver = [], False
    if todo:
        channels = min(plan.channels, len(todo))
        queues = [todo[i::channels] for i in range(channels)]  # round-robin, like DataX task groups
        estimate = sum(s.estimated_rows or 0 for s in plan.shards if s.id in todo)
        in_driver = estimate <= driver_rows and not session.started
        print(f"[airflow-sync] copying about {estimate:,} rows in {channels} channel(s) "
              + ("in the driver" if in_driver else "as Spark tasks"), flush=True)
        try:
            with Progress(spec, state, todo):
                announced = None
                if in_driver:  # one ledger write for every shard's running record (else one per shard)
                    by_id = {s.id: s for s in plan.shards}
                    announced = {i: running_record(spec.source, by_id[i], (state.shards[i].attempt if i in state.shards else 0) + 1)
                                 for i in todo}
                    ledger.write_shards(state.load_key, state.generation, list(announced.values()))
                else:
                    waited = time.time()
                    session.get()
                    phases["spark_start"] = time.time() - waited  # the session's start-up not hidden behind planning
                per_shard = run_channels(session, queues, lambda q, driver: _load_channel(
                    spec, plan, copy, state, q, driver, announced), in_driver)
        except Exception as exc:  # a channel's task failed outright: say so in the ledger
            state.status, state.error = LOAD_FAILED, f"Spark job failed: {type(exc).__name__}: {exc}"[:4000]
            retrying(lambda: ledger.write_load(state), spec.ledger_wait_seconds)
            raise

    phases["copy"] = time.time() - started - phases["prepare"] - phases.get("spark_start", 0.0)
    if in_driver:  # the channels' own records, as they wrote them to the ledger
        for record in per_shard:
            state.shards[record["shard_id"]] = ShardState(**{k: v for k, v in record.items() if k != "seconds"})
    else:  # what the executors reported, attempts of re-run tasks included
        state = retrying(lambda: ledger.state(spec.load_key), spec.ledger_wait_seconds)
    failed = [i for i in (s["id"] for s in state.plan["shards"]) if i not in state.shards
              or state.shards[i].status != SHARD_SUCCESS]
    if failed:
        errors = "; ".join(f"shard {i}: {state.shards[i].error}" for i in failed if i in state.shards)
        state.status, state.error = LOAD_FAILED, f"shards {failed} failed: {errors}"[:4000]
        retrying(lambda: ledger.write_load(state), spec.ledger_wait_seconds)
        print(shard_table([vars(s) | {"seconds": s.seconds} for s in state.shards.values()]), flush=True)
        raise LoadFailed(f"table {schema.qualified}: {state.error}. Nothing was published; re-import with "
                         f"reimport='failed' (airflow-sync reimport --load {spec.load_key!r} --failed)")

    repaired = list(state.repair)
    published = repaired or [s.id for s in plan.shards]
    written = sum(s.records_written for s in state.shards.values() if s.shard_id in published)
    if lock.lost:  # another job may own the key now: it publishes, not this one
        raise LoadFailed(f"load {spec.load_key!r}: this job lost its lock on the source ({lock.lost}) and publishes "
                         "nothing; run it again (it resumes from the finished shards)")
    try:
        landed = _publish(spec, ch, schema, plan, state, copy)
    except Exception as exc:  # e.g. the target went away: recorded, and publishing again is safe
        state.status, state.error = LOAD_FAILED, f"publishing failed: {type(exc).__name__}: {exc}"[:4000]
        retrying(lambda: ledger.write_load(state), spec.ledger_wait_seconds)
        raise
    if landed != written:
        raise LoadFailed(f"table {schema.qualified}: {written} rows written but {landed} published")
    state.status, state.repair = LOAD_PUBLISHED, []
    ledger.write_load(state)
    ch.command(f"DROP TABLE IF EXISTS {ch_table(spec.ledger_database, state.parts_table)}")
    shards = [vars(s) | {"seconds": s.seconds} for s in state.shards.values()]
    print(shard_table(shards), flush=True)
    phases["publish"] = time.time() - started - sum(phases.values())
    print("[airflow-sync] seconds: " + ", ".join(f"{k} {v:.2f}" for k, v in phases.items()), flush=True)
    return {
        "load_key": state.load_key,
        "generation": state.generation,
        "table": schema.qualified,
        "target": f"{spec.target_database}.{spec.target_table}",
        "rows": written,
        "shards": len(plan.shards),
        "shards_read": len(todo),
        "repaired": repaired,
        "per_shard": [{k: s[k] for k in ("shard_id", "status", "attempt", "records_read", "records_written", "records_failed",
                                         "bytes", "seconds")} for s in per_shard],
        "channels": plan.channels,
        "split_column": plan.split_column,
        "start_position": state.start_position,
        "strategy": plan.strategy,
        "reader": reader_note,
        "warnings": list(plan.warnings),
        "phases": {k: round(v, 3) for k, v in phases.items()},
        "seconds": round(time.time() - started, 3),
    }

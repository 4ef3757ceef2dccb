"""CDC bootstrap: a lock-free, parallel, resumable chunked snapshot under live writes.

Driver, per table: record the source's binlog position P0, plan shards on the primary key's
first column, create the target if it is missing and register the table with the pipeline
(it replays the table's changes from P0). Channels (Spark tasks, or threads of the driver as
for a full load: spark/channels.py): one channel reads its shards chunk by chunk
(core/cdc/chunks.py); each chunk is one consistent snapshot whose binlog position P
gives its rows the version of a snapshot at P, written straight into the live target: every
change after P outranks them, every change before P is in them. After the last chunk, rows
older than any bootstrap read (an earlier copy's keys the source no longer has) are deleted.
docs/cdc-bootstrap.md argues why every row ends with its latest value.
"""

from __future__ import annotations

import time

import pyarrow as pa

from airflow_sync_provider.core.cdc.checkpoints import Checkpoints
from airflow_sync_provider.core.cdc.tables import PipelineTable
from airflow_sync_provider.core.cdc.chunks import ChunkKey, chunk_rows, streaming_problem
from airflow_sync_provider.core.cdc.positions import (
    BinlogError, BinlogPosition, current_position, ensure_fence, flavor, snapshot_position,
)
from airflow_sync_provider.core.crash_points import crash_point
from airflow_sync_provider.core.flow_control import Throttle
from airflow_sync_provider.core.jobspec import (
    CdcBootstrapSpec, FullLoadSpec, bootstrap_load_key, copied_schema, public_dict, table_config,
)
from airflow_sync_provider.core.ledger import (
    LOAD_FAILED, LOAD_PUBLISHED, LOAD_RUNNING, SHARD_FAILED, SHARD_SUCCESS, Ledger, LoadState,
)
from airflow_sync_provider.core.source import reader as mysql_reader
from airflow_sync_provider.core.source.locks import LockHeld, load_lock
from airflow_sync_provider.core.source.planning import Plan, plan_table
from airflow_sync_provider.core.source.schema import average_row_bytes, table_rows
from airflow_sync_provider.core.source.selection import TableSelection
from airflow_sync_provider.core.sql import ch_ident, ch_table, mysql_table
from airflow_sync_provider.core.target import clickhouse as target
from airflow_sync_provider.core.target.inserts import ArrowInserts
from airflow_sync_provider.core.target.shards import SPLIT_WEIGHT_COLUMN, needs_weight
from airflow_sync_provider.core.verify.reports import shard_table
from airflow_sync_provider.spark.channels import Progress, driver_copy_limit, retrying, run_channels, running_record
from airflow_sync_provider.spark.full_load import LoadFailed
from airflow_sync_provider.spark.session import lazy


class BootstrapFailed(LoadFailed):
    pass


def _fence(spec: CdcBootstrapSpec) -> str | None:
    if not spec.watermark_table:
        return None
    database, _, table = spec.watermark_table.partition(".")
    return mysql_table(database, table)


def _bootstrap_shard(spec: CdcBootstrapSpec, load: FullLoadSpec, plan: Plan, key: ChunkKey, chunk: int, mappings,
                     weight: bool, columns_sql: str, native_sql: str | None, ch, ledger: Ledger, state: LoadState, shard,
                     conn, kind, throttle):
    """Read ``shard`` in chunks of ``chunk`` rows, resuming after its last finished chunk."""
    previous = state.shards.get(shard.id)
    record = running_record(spec.source, shard, (previous.attempt if previous else 0) + 1)
    if previous is not None:  # resume after the last finished chunk, its counters kept
        for name in ("records_read", "records_written", "bytes", "chunks", "resume_key", "version"):
            setattr(record, name, getattr(previous, name))
    names = [m.name for m in mappings] + ([SPLIT_WEIGHT_COLUMN] if weight else []) + [target.VERSION_COLUMN]

    def failed(rows):
        record.records_failed += rows

    inserts = ArrowInserts(ch, ch_table(load.target_database, load.target_table),
                           settings=target.WEIGHT_SETTINGS if weight else None, on_failed=failed)
    fence = _fence(spec)
    after = key.decode(record.resume_key)
    try:
        ledger.write_shard(state.load_key, state.generation, record)
        while True:
            holder, nbytes, written = {}, 0, 0
            # the chunk's snapshot and its version: MariaDB's own position of the snapshot (read
            # inside the native SELECT), else the position taken before it (core/cdc/positions.py)
            native = native_sql is not None
            version = (None if native and kind.mariadb
                       else snapshot_position(conn, kind, fence).snapshot_version())
            if native:
                batches = mysql_reader.read_chunk_native(
                    spec.source, plan, mappings, shard, key, after, chunk, min(spec.batch_rows, chunk), native_sql,
                    weight, version is None, holder)
            else:
                batches = mysql_reader.read_chunk(conn, plan, mappings, shard, key, after, chunk,
                                                  min(spec.batch_rows, chunk), columns_sql, weight, holder)
            try:
                # the chunk streams into one insert while it is read (memory: a few batches,
                # whatever chunk_rows is); it counts only once all of it is acknowledged (a crash
                # re-reads it whole)
                for batch in batches:
                    if version is None:
                        version = holder["snapshot"] - 2
                    rows = batch.num_rows
                    inserts.write(pa.RecordBatch.from_arrays(
                        [*batch.columns, pa.repeat(pa.scalar(version, pa.uint64()), rows)], names=names))
                    written += rows
                    nbytes += batch.nbytes
                    throttle.account(rows, batch.nbytes)
                inserts.finish()
            except mysql_reader.NativeReadError as exc:  # this chunk again (its rows rank the same), by mysqlclient
                print(f"[airflow-sync] shard {shard.id}: the native reader failed ({exc}); mysqlclient reads "
                      "the rest of the shard", flush=True)
                inserts.finish()
                native_sql = None
                continue
            cur = conn.cursor()
            cur.execute("COMMIT")  # the chunk's snapshot ends: no read view is held between chunks
            cur.close()
            rows = holder["rows"]
            # the chunk is durable: count it once and move the resume point past it
            record.records_read += rows
            record.records_written += written
            record.bytes += nbytes
            record.chunks += 1
            record.version = version if version is not None else record.version
            if rows:
                after = holder["last"]
                record.resume_key = key.encode(after)
            crash_point("bootstrap.chunk-written")
            ledger.write_shard(state.load_key, state.generation, record)
            if rows < chunk:
                break
        record.status = SHARD_SUCCESS
    except Exception as exc:
        inserts.settle()
        record.status, record.error = SHARD_FAILED, f"{type(exc).__name__}: {exc}"[:4000]
    finally:
        inserts.close()
    record.finished_at = time.time()
    retrying(lambda: ledger.write_shard(state.load_key, state.generation, record), spec.ledger_wait_seconds)
    return record


def _bootstrap_channel(spec, load, plan, key, chunk, mappings, weight, columns_sql, native_sql, state, shard_ids):
    """Runs on an executor or a driver thread: one source connection and one throttle for a
    queue of shards."""
    ch = target.shared_client(spec.target)
    ledger = Ledger(ch, spec.ledger_database)
    throttle = Throttle(spec.channel_record_speed, spec.channel_byte_speed)
    shards = {s.id: s for s in plan.shards}
    conn = mysql_reader.stream_connect(spec.source)
    kind = flavor(conn)
    try:
        for shard_id in shard_ids:
            record = _bootstrap_shard(spec, load, plan, key, chunk, mappings, weight, columns_sql, native_sql, ch,
                                      ledger, state, shards[shard_id], conn, kind, throttle)
            if record.status != SHARD_SUCCESS:  # the connection may be broken: a fresh one
                conn.close()
                conn = mysql_reader.stream_connect(spec.source)
            yield vars(record) | {"seconds": record.seconds}
    finally:
        conn.close()


def _start_or_resume(spec: CdcBootstrapSpec, table: dict, ledger: Ledger, checkpoints: Checkpoints, conn, schema,
                     key: ChunkKey) -> tuple[FullLoadSpec, LoadState, Plan]:
    load = spec.load_spec(table, key.names[0])
    state = ledger.state(load.load_key)
    if state is not None and state.status == LOAD_PUBLISHED and not spec.restart:
        if target.table_exists(checkpoints.ch, load.target_database, load.target_table):
            return load, state, Plan.from_dict(state.plan)  # bootstrapped already: the pipeline keeps it current
        print(f"[airflow-sync] {schema.qualified}: its copy {load.target_database}.{load.target_table} is gone; "
              "bootstrapping it again", flush=True)
    if state is not None and state.status != LOAD_PUBLISHED and not spec.restart:
        state.status, state.error = LOAD_RUNNING, ""
        return load, state, Plan.from_dict(state.plan)  # resume: same shards, chunks after their resume keys
    start = current_position(conn)
    if start is None:
        raise BinlogError(f"table {schema.qualified}: the source has no binlog (log_bin is OFF), so there are no "
                          "changes to catch up with after a bootstrap; copy it with FullLoadOperator instead")
    plan = plan_table(conn, schema, speed=load.speed(), split_column=key.names[0], split_factor=spec.split_factor,
                      strategy=spec.strategy)
    state = LoadState(load.load_key, (state.generation + 1) if state else 1, LOAD_RUNNING, schema.qualified,
                      f"{load.target_database}.{load.target_table}", plan.to_dict(), "", 0, public_dict(load),
                      start_position=start.to_dict())
    return load, state, plan


def _prepare_target(ch, schema, load: FullLoadSpec, weight: bool) -> None:
    database, table = load.target_database, load.target_table
    ch.command(f"CREATE DATABASE IF NOT EXISTS {ch_ident(database)}")
    if not target.table_exists(ch, database, table):
        ch.command(target.create_table_sql(schema, database, table, weight=weight))
        return
    target.check_layout(ch, database, table)
    missing = [m.name for m in schema.mappings() if m.name not in target.column_types(ch, database, table)]
    if missing:
        raise BootstrapFailed(f"table {schema.qualified}: its copy {database}.{table} lacks column(s) {missing}; "
                              "drop the copy (the bootstrap creates it) or copy those columns out (exclude_columns)")
    if weight:
        ch.command(f"ALTER TABLE {ch_table(database, table)} ADD COLUMN IF NOT EXISTS "
                   f"{ch_ident(SPLIT_WEIGHT_COLUMN)} String MATERIALIZED ''")


def _drop_older(ch, load: FullLoadSpec, start: BinlogPosition) -> int:
    """Delete the copy's rows older than every bootstrap read: keys an earlier copy had that the
    source no longer has (rows the chunks read, and changes after P0, all rank higher)."""
    final = ch_table(load.target_database, load.target_table)
    where = f"{ch_ident(target.VERSION_COLUMN)} < {{v:UInt64}}"
    params = {"v": start.snapshot_version()}
    stale = int(ch.command(f"SELECT count() FROM {final} WHERE {where}", parameters=params))
    if stale:
        ch.command(f"DELETE FROM {final} WHERE {where}", parameters=params)
    return stale


def bootstrap_table(spec: CdcBootstrapSpec, session, ch, ledger: Ledger, checkpoints: Checkpoints,
                     table: dict) -> dict:
    """One table's bootstrap, by one job at a time (its load key's lock: core/source/locks.py)."""
    name = f"{table['source_database']}.{table['source_table']}"
    try:
        lock = load_lock(spec.source, spec.ledger_database, bootstrap_load_key(spec.pipeline, table),
                         f"the bootstrap of {name} for pipeline {spec.pipeline!r}")
    except LockHeld as held:
        raise BootstrapFailed(str(held)) from None
    try:
        return _bootstrap_locked(spec, session, ch, ledger, checkpoints, table)
    finally:
        lock.release()


def _bootstrap_locked(spec: CdcBootstrapSpec, session, ch, ledger: Ledger, checkpoints: Checkpoints,
                      table: dict) -> dict:
    started = time.time()
    with mysql_reader.connect(spec.source) as conn:
        schema = copied_schema(conn, table)
        target.check_columns(schema)
        key = ChunkKey.of(schema)
        if spec.watermark_table and not flavor(conn).mariadb:
            ensure_fence(conn, _fence(spec))
        load, state, plan = _start_or_resume(spec, table, ledger, checkpoints, conn, schema, key)
        in_driver = (table_rows(conn, table["source_database"], table["source_table"])
                     <= driver_copy_limit(spec.driver_copy_rows, session))
        chunk = chunk_rows(spec.chunk_rows, average_row_bytes(conn, table["source_database"], table["source_table"]))
    if not in_driver and state.status != LOAD_PUBLISHED:
        session.start()  # the SparkContext comes up while the driver prepares
    if state.status == LOAD_PUBLISHED:
        print(f"[airflow-sync] {schema.qualified} was bootstrapped for pipeline {spec.pipeline!r} already "
              f"(generation {state.generation}); skipped (restart=True bootstraps it again)", flush=True)
        if not spec.recopy:
            entry = PipelineTable.of(table)
            entry.split_column = plan.split_column
            checkpoints.register(spec.pipeline, entry, BinlogPosition.from_dict(state.start_position))  # no-op once joined
        return _summary(state, load, schema, plan, {}, [], 0, started) | {"skipped": True}
    mappings = schema.mappings()
    split = schema.column(plan.split_column)
    weight = needs_weight(split)  # a collated key: rows carry their weight, as full loads write them
    columns_sql = mysql_reader.select_list(mappings, split if weight else None)
    native_sql, note = mysql_reader.native_reader("auto", spec.source, plan, mappings, schema.primary_key,
                                                  split if weight else None)
    print(f"[airflow-sync] {schema.qualified}: reader {note}", flush=True)
    _prepare_target(ch, schema, load, weight)
    start = BinlogPosition.from_dict(state.start_position)
    # the table joins the pipeline now: its changes from P0 on are applied while the chunks run,
    # decoded with the shape it had then
    entry = PipelineTable.of(table)
    entry.split_column = plan.split_column
    entry.remember_shape(schema)
    if not spec.recopy:
        checkpoints.register(spec.pipeline, entry, start, again=spec.restart)
    ledger.write_load(state)
    todo = state.todo()
    before = {i: (s.records_read, s.chunks) for i, s in state.shards.items()}  # finished chunks of earlier runs
    print(f"[airflow-sync] bootstrap {schema.qualified} (pipeline {spec.pipeline!r}, from {start}): {len(todo)} of "
          f"{len(plan.shards)} shards to read in chunks of {chunk:,} rows, {plan.channels} channel(s) "
          + ("in the driver" if in_driver else "as Spark tasks"), flush=True)
    per_shard = []
    if todo:
        channels = min(plan.channels, len(todo))
        queues = [todo[i::channels] for i in range(channels)]
        try:
            with Progress(load, state, todo):
                per_shard = run_channels(session, queues, lambda q, _: _bootstrap_channel(
                    spec, load, plan, key, chunk, mappings, weight, columns_sql, native_sql, state, q), in_driver)
        except Exception as exc:  # e.g. an executor died: record it, so a retry resumes at once
            state.status, state.error = LOAD_FAILED, f"{type(exc).__name__}: {exc}"[:4000]
            retrying(lambda: ledger.write_load(state), spec.ledger_wait_seconds)
            raise BootstrapFailed(f"table {schema.qualified}: the bootstrap job failed ({type(exc).__name__}: "
                                  f"{str(exc)[:500]}); run it again: it resumes after each shard's last finished "
                                  "chunk") from exc
    state = ledger.state(load.load_key)
    failed = [s["id"] for s in state.plan["shards"]
              if s["id"] not in state.shards or state.shards[s["id"]].status != SHARD_SUCCESS]
    if failed:
        errors = "; ".join(f"shard {i}: {state.shards[i].error}" for i in failed if i in state.shards)
        state.status, state.error = LOAD_FAILED, f"shards {failed} failed: {errors}"[:4000]
        retrying(lambda: ledger.write_load(state), spec.ledger_wait_seconds)
        raise BootstrapFailed(f"table {schema.qualified}: {state.error}. Run the bootstrap again: it resumes after "
                              "each shard's last finished chunk")
    dropped = _drop_older(ch, load, start)
    state.status = LOAD_PUBLISHED
    ledger.write_load(state)
    shards = [vars(s) | {"seconds": s.seconds} for s in state.shards.values()]
    print(shard_table(shards), flush=True)
    return _summary(state, load, schema, plan, before, per_shard, dropped, started) | {"shards_read": len(todo)}


def copied_rows(ledger: Ledger, pipeline: str, table: dict) -> dict:
    """A finished bootstrap (or re-copy) of ``table`` as the ledger has it: {"rows": …}."""
    state = ledger.state(bootstrap_load_key(pipeline, table))
    return {"rows": sum(s.records_written for s in state.shards.values()) if state else 0}


def _summary(state: LoadState, load: FullLoadSpec, schema, plan: Plan, before: dict, per_shard: list, dropped: int,
             started: float) -> dict:
    return {"table": schema.qualified, "target": f"{load.target_database}.{load.target_table}",
            "load_key": load.load_key, "generation": state.generation, "start_position": state.start_position,
            "rows": sum(s.records_written for s in state.shards.values()),
            "rows_read_now": sum(r["records_read"] - before.get(r["shard_id"], (0, 0))[0] for r in per_shard),
            "chunks": sum(s.chunks for s in state.shards.values()),
            "chunks_read_now": sum(r["chunks"] - before.get(r["shard_id"], (0, 0))[1] for r in per_shard),
            "shards": len(plan.shards), "shards_read": 0, "older_rows_dropped": dropped, "skipped": False,
            "split_column": plan.split_column, "seconds": round(time.time() - started, 3)}


def run_cdc_bootstrap(spec: CdcBootstrapSpec, spark) -> dict:
    """``spark``: a SparkSession or a :class:`LazySession`, started only for a table whose
    channels run as Spark tasks (spark/channels.py)."""
    started = time.time()
    session = lazy(spark)
    ch = target.shared_client(spec.target)
    ledger, checkpoints = Ledger(ch, spec.ledger_database), Checkpoints(ch, spec.ledger_database)
    ledger.ensure()
    checkpoints.ensure()
    if spec.select:  # the pipeline keeps its patterns: every later run applies them
        selection = checkpoints.selection_for(spec.pipeline, spec.select, spec.change_selection)
        if selection != checkpoints.selection(spec.pipeline):
            checkpoints.write_selection(spec.pipeline, selection)
    selected, unstreamable = _selected(spec)
    tables = [bootstrap_table(spec, session, ch, ledger, checkpoints, table) for table in [*spec.tables, *selected]]
    with mysql_reader.connect(spec.source) as conn:
        end = current_position(conn)
    start = min((BinlogPosition.from_dict(t["start_position"]) for t in tables), key=BinlogPosition.key,
                default=end)
    return {"pipeline": spec.pipeline, "tables": tables, "rows": sum(t["rows"] for t in tables),
            "unstreamable": unstreamable, "start_position": start.to_dict(), "end_position": end.to_dict(),
            "seconds": round(time.time() - started, 3)}


def _selected(spec: CdcBootstrapSpec) -> tuple[list[dict], dict[str, str]]:
    """The tables ``spec.select`` names now (besides ``spec.tables``), and those of them CDC cannot
    stream, with the reason (they are left out, not failed: the others go on)."""
    selection = TableSelection.of(spec.select)
    if selection is None:
        return [], {}
    named = {f"{t['source_database']}.{t['source_table']}" for t in spec.tables}
    selected, unstreamable = [], {}
    with mysql_reader.connect(spec.source) as conn:
        names = [n for n in selection.resolve(conn) if n not in named]
        for name in names:
            config = table_config(selection.config(name))
            problem = streaming_problem(copied_schema(conn, config))
            if problem:
                unstreamable[name] = problem
            else:
                selected.append(config)
    print(f"[airflow-sync] pipeline {spec.pipeline!r}: {selection.to_dict()} selects {len(names)} table(s): "
          f"{', '.join(names) or 'none'}" + ("; not streamable, left out: " + "; ".join(
              f"{n} ({why})" for n, why in unstreamable.items()) if unstreamable else ""), flush=True)
    return selected, unstreamable

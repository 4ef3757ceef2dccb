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

import dataclasses
import logging
import time
from dataclasses import dataclass

from airflow_sync_provider.core.cdc.alter import nullable_type
from airflow_sync_provider.core.cdc.checkpoints import Checkpoints
from airflow_sync_provider.core.cdc.chunks import ChunkKey, chunk_rows, streaming_problem
from airflow_sync_provider.core.cdc.servers import source_epoch
from airflow_sync_provider.core.cdc.tables import PipelineTable
from airflow_sync_provider.core.clickhouse import repairs
from airflow_sync_provider.core.clickhouse.client import shared_client
from airflow_sync_provider.core.clickhouse.columns import SIGN_COLUMN, VERSION_COLUMN, WEIGHT_SETTINGS, check_columns
from airflow_sync_provider.core.clickhouse.ddl import create_multiset_sql, create_table_sql
from airflow_sync_provider.core.clickhouse.described import (
    check_content,
    check_layout,
    column_types,
    resolve_layout,
    table_exists,
)
from airflow_sync_provider.core.clickhouse.inserts import ArrowInserts
from airflow_sync_provider.core.crash_points import crash_point
from airflow_sync_provider.core.jobspec import (
    CdcBootstrapSpec,
    FullLoadSpec,
    bootstrap_load_key,
    copied_schema,
)
from airflow_sync_provider.core.ledger import Ledger
from airflow_sync_provider.core.loads import LOAD_PUBLISHED, LOAD_RUNNING, SHARD_SUCCESS, LoadState, ShardState
from airflow_sync_provider.core.positions import (
    BinlogError,
    BinlogPosition,
    current_position,
    ensure_fence,
    flavor,
    snapshot_position,
)
from airflow_sync_provider.core.selection import TableSelection, table_config
from airflow_sync_provider.core.source import reader as mysql_reader
from airflow_sync_provider.core.source.group import member_filter
from airflow_sync_provider.core.source.locks import LockHeld, load_lock
from airflow_sync_provider.core.source.planning import Plan, Shard, Sharding, plan_table
from airflow_sync_provider.core.source.schema import average_row_bytes, table_rows
from airflow_sync_provider.core.source.weights import SPLIT_WEIGHT_COLUMN, needs_weight
from airflow_sync_provider.core.specfile import public_dict
from airflow_sync_provider.core.sql import ch_ident, ch_table, mysql_table
from airflow_sync_provider.core.verify.reports import shard_table
from airflow_sync_provider.spark.channels import driver_copy_limit, running_record
from airflow_sync_provider.spark.session import lazy
from airflow_sync_provider.spark.shard_copy import Channel, Copy, LoadFailed, RowVersion, ShardCopy

log = logging.getLogger(__name__)

__all__ = ["BootstrapCopy", "BootstrapFailed", "bootstrap_table", "run_cdc_bootstrap"]


class BootstrapFailed(LoadFailed):
    pass


def _fence(spec: CdcBootstrapSpec) -> str | None:
    if not spec.watermark_table:
        return None
    database, _, table = spec.watermark_table.partition(".")
    return mysql_table(database, table)


@dataclass(frozen=True)
class Chunking:
    """How a bootstrap's shards are read: ``rows`` at a time along ``key``, each chunk's snapshot
    fenced by MySQL's watermark table ``fence`` (quoted) if there is one."""

    key: ChunkKey
    rows: int
    fence: str | None = None


class BootstrapCopy(ShardCopy):
    """A bootstrap's shards: each read in key chunks on the channel's own source connection,
    every chunk a consistent snapshot of its own written straight into the live copy, counted
    (and its resume key moved) only once ClickHouse acknowledged it."""

    def __init__(self, load: FullLoadSpec, plan: Plan, copy: Copy, state: LoadState, ledger: Ledger,
                 chunking: Chunking):
        super().__init__(load, plan, copy, state, ledger)
        self.key, self.chunk, self.fence = chunking.key, chunking.rows, chunking.fence

    def job_failed(self, exc: Exception) -> Exception:
        return BootstrapFailed(f"table {self.state.source_table}: the bootstrap job failed ({type(exc).__name__}: "
                               f"{str(exc)[:500]}); run it again: it resumes after each shard's last finished chunk")

    def shards_failed(self) -> Exception:
        return BootstrapFailed(f"table {self.state.source_table}: {self.state.error}. Run the bootstrap again: it "
                               "resumes after each shard's last finished chunk")

    def open_channel(self, in_driver: bool) -> Channel:
        """One source connection a channel (opened by its first read): every chunk's snapshot is
        opened (and its position read) on it."""
        return Channel(self.spec)

    def after_shard(self, channel: Channel, record: ShardState) -> None:
        if record.status != SHARD_SUCCESS and channel.conn is not None:  # it may be broken: the next read opens one
            try:
                channel.conn.close()
            except Exception:  # noqa: BLE001 - a broken connection is closed anyway
                pass
            channel.conn = None

    def start_record(self, channel: Channel, shard: Shard) -> ShardState:
        previous = self.state.shards.get(shard.id)
        record = running_record(self.spec.source, shard, (previous.attempt if previous else 0) + 1)
        if previous is not None:  # resume after the last finished chunk, its counters kept
            for name in ("records_read", "records_written", "bytes", "chunks", "resume_key", "version"):
                setattr(record, name, getattr(previous, name))
        return record

    def inserts(self, channel: Channel, record: ShardState) -> ArrowInserts:
        def failed(rows, _record):
            record.count_failed(rows)

        return ArrowInserts(channel.ch, ch_table(self.spec.target_database, self.spec.target_table),
                            settings=WEIGHT_SETTINGS if self.copy.weight else None,
                            compression=self.spec.target.insert_compression, on_failed=failed)

    def read(self, channel: Channel, shard: Shard, record: ShardState, inserts: ArrowInserts) -> None:
        """The shard in chunks, resuming after its last finished chunk."""
        if channel.conn is None:
            channel.conn = mysql_reader.stream_connect(self.spec.source, self.spec.salt)
            channel.kind = flavor(channel.conn)
        if self.key.keyless:
            self._read_whole(channel, shard, record, inserts)
            return
        after, native_sql = self.key.decode(record.resume_key), self.copy.native_sql
        while True:
            holder = {}
            # the chunk's snapshot and its version: MariaDB's own position of the snapshot (read
            # inside the native SELECT), else the position taken before it (core/positions.py)
            native = native_sql is not None
            epoch = BinlogPosition.from_dict(self.state.start_position).epoch  # the server's (core/cdc/servers.py)
            version = RowVersion(None if native and channel.kind.mariadb
                                 else snapshot_position(channel.conn, channel.kind, self.fence,
                                                        epoch).snapshot_version(),
                                 holder, epoch=epoch)
            read = mysql_reader.ShardRead(self.plan, self.copy.mappings, native_sql or self.copy.text_sql,
                                          min(self.spec.batch_rows, self.chunk), self.copy.weight is not None)
            chunk = mysql_reader.Chunk(self.key, after, self.chunk)
            if native:
                batches = mysql_reader.read_chunk_native(self.spec.source, read, shard, chunk, version.value is None,
                                                         holder)
            else:
                batches = mysql_reader.read_chunk(channel.conn, read, shard, chunk, holder)
            try:
                # the chunk streams into one insert while it is read (memory: a few batches,
                # whatever chunk_rows is); it counts only once all of it is acknowledged (a crash
                # re-reads it whole)
                written, nbytes = self.write(channel, inserts, shard, batches, version)
            except mysql_reader.NativeReadError as exc:  # this chunk again (its rows rank the same), by mysqlclient
                log.info(f"shard {shard.id}: the native reader failed ({exc}); mysqlclient reads "
                      "the rest of the shard")
                inserts.finish()
                native_sql = None
                continue
            cur = channel.conn.cursor()
            cur.execute("COMMIT")  # the chunk's snapshot ends: no read view is held between chunks
            cur.close()
            rows = holder["rows"]
            # the chunk is durable: count it once and move the resume point past it
            record.count_chunk(rows, written, nbytes)
            record.version = version.value if version.value is not None else record.version
            if rows:
                after = holder["last"]
                record.resume_key = self.key.encode(after)
            crash_point("bootstrap.chunk-written")
            channel.ledger.write_shard(self.state.load_key, self.state.generation, record)
            if rows < self.chunk:
                break


    def _read_whole(self, channel: Channel, shard: Shard, record: ShardState, inserts: ArrowInserts) -> None:
        """A table without a key: the whole table in one snapshot (mysqlclient's streaming cursor:
        memory stays bounded), each row +1 at the snapshot's version; the snapshot's position is
        kept as the shard's resume point, where the table joins its pipeline (a multiset's rows
        add up: not one change before it may be applied again, docs/keyless-tables.md). A read cut
        short is read again whole; what it wrote ranks below the new read and is removed after it."""
        epoch = BinlogPosition.from_dict(self.state.start_position).epoch
        position = snapshot_position(channel.conn, channel.kind, self.fence, epoch)
        version = RowVersion(position.snapshot_version(), {}, epoch=epoch)
        holder: dict = {}
        read = mysql_reader.ShardRead(self.plan, self.copy.mappings, self.copy.text_sql, self.spec.batch_rows, False)
        batches = mysql_reader.read_chunk(channel.conn, read, shard, mysql_reader.Chunk(self.key, None, 0), holder)
        record.records_read = record.records_written = record.bytes = record.chunks = 0
        written, nbytes = self.write(channel, inserts, shard, batches, version)
        cur = channel.conn.cursor()
        cur.execute("COMMIT")
        cur.close()
        record.count_chunk(holder["rows"], written, nbytes)
        record.version, record.resume_key = version.value, position.to_dict()
        crash_point("bootstrap.chunk-written")
        channel.ledger.write_shard(self.state.load_key, self.state.generation, record)


def _start_or_resume(spec: CdcBootstrapSpec, table: dict, ledger: Ledger, checkpoints: Checkpoints, conn, schema,
                     key: ChunkKey) -> tuple[FullLoadSpec, LoadState, Plan]:
    load = spec.load_spec(table, key.names[0] if key.names else None)
    state = ledger.state(load.load_key)
    # bootstrapped already (a re-import of shards into its copy may be under way: spark/reconcile.py)
    done = state is not None and (state.status == LOAD_PUBLISHED or bool(state.repair))
    if done and not spec.restart:
        if table_exists(checkpoints.ch, load.target_database, load.target_table):
            if state.status != LOAD_PUBLISHED:
                log.warning(f"{schema.qualified}: a re-import of shards {state.repair} into its copy did not finish "
                            f"({state.status}); finish it: airflow-sync reconcile --load {load.load_key!r} "
                            "--checksum --reimport")
            return load, state, Plan.from_dict(state.plan)  # the pipeline keeps it current
        log.info(f"{schema.qualified}: its copy {load.target_database}.{load.target_table} is gone; "
              "bootstrapping it again")
    elif state is not None and state.status != LOAD_PUBLISHED and not spec.restart:
        state.status, state.error = LOAD_RUNNING, ""
        return load, state, Plan.from_dict(state.plan)  # resume: same shards, chunks after their resume keys
    start = current_position(conn, epoch=source_epoch(conn, checkpoints.ch, spec.ledger_database))
    if start is None:
        raise BinlogError(f"table {schema.qualified}: the source has no binlog (log_bin is OFF), so there are no "
                          "changes to catch up with after a bootstrap; copy it with FullLoadOperator instead")
    if key.keyless and not flavor(conn).mariadb:
        raise BootstrapFailed(f"table {schema.qualified} has no primary key: its copy is a multiset whose rows add "
                              "up, so its snapshot and the binlog position it joins at must be exactly one moment, "
                              "which MariaDB reports and MySQL does not; give it a primary key (or an invisible "
                              "one: sql_generate_invisible_primary_key) to follow it from MySQL")
    # a table without a key is one shard, one snapshot (its indexes would split it)
    plan = plan_table(conn, dataclasses.replace(schema, indexes=()) if key.keyless else schema,
                      Sharding(speed=load.speed(), split_column=key.names[0] if key.names else None,
                               split_factor=spec.split_factor, strategy=spec.strategy))
    state = LoadState(load.load_key, (state.generation + 1) if state else 1, LOAD_RUNNING, schema.qualified,
                      f"{load.target_database}.{load.target_table}", plan.to_dict(), "", 0, public_dict(load),
                      start_position=start.to_dict())
    return load, state, plan


def _check_settings(ch, schema, load: FullLoadSpec):
    """The layout the copy is written under: the one asked for, which an existing copy must have,
    or none asked for, the copy's own; and the content asked for, which it must hold (else refused,
    naming both: core/clickhouse/layout.check_same, core/content/shaping.check_same)."""
    layout = resolve_layout(ch, load.target_database, load.target_table, load.layout)
    check_content(ch, schema, load.target_database, load.target_table)
    return layout


def _prepare_target(ch, schema, load: FullLoadSpec, weight: bool) -> None:
    multiset = not schema.primary_key  # docs/keyless-tables.md
    if multiset and member_filter(schema)[0] != "1":
        raise BootstrapFailed(f"table {schema.qualified} has no primary key: merging it into a source group's copy "
                              "is not supported yet (its rows are a multiset per source); copy each source's table "
                              "into a copy of its own")
    if multiset and schema.content.keep_deletes:
        raise BootstrapFailed(f"table {schema.qualified} has no primary key: a deleted row of its multiset copy "
                              "leaves it (-1); keeping deletes (on_delete='keep') is for tables with a key")
    database, table = load.target_database, load.target_table
    ch.command(f"CREATE DATABASE IF NOT EXISTS {ch_ident(database)}")
    layout = _check_settings(ch, schema, load)  # an existing copy's, or refused
    if not table_exists(ch, database, table):
        ch.command(create_multiset_sql(schema, database, table, layout) if multiset else
                   create_table_sql(schema, database, table, layout, weight=weight))
        return
    check_layout(ch, database, table)
    present = column_types(ch, database, table)
    if multiset and SIGN_COLUMN not in present:
        raise BootstrapFailed(f"table {schema.qualified} has no primary key, and its copy {database}.{table} is a "
                              "plain MergeTree (a full load's): a followed copy of it must be a multiset of signed "
                              "rows; drop the copy (the bootstrap makes it) or bootstrap into another target table")
    missing = [m for m in schema.mappings() if m.name not in present]
    if missing and member_filter(schema)[0] != "1":  # a merged copy: a member's new columns join it, Nullable
        for mapping in missing:
            ch.command(f"ALTER TABLE {ch_table(database, table)} ADD COLUMN IF NOT EXISTS {ch_ident(mapping.name)} "
                       f"{nullable_type(mapping.ch_type)}")
    elif missing:
        raise BootstrapFailed(f"table {schema.qualified}: its copy {database}.{table} lacks column(s) "
                              f"{[m.name for m in missing]}; drop the copy (the bootstrap creates it) or copy those "
                              "columns out (exclude_columns)")
    if weight:
        ch.command(f"ALTER TABLE {ch_table(database, table)} ADD COLUMN IF NOT EXISTS "
                   f"{ch_ident(SPLIT_WEIGHT_COLUMN)} String MATERIALIZED ''")


def _drop_older(ch, load: FullLoadSpec, start: BinlogPosition, schema) -> int:
    """Delete the copy's rows older than every bootstrap read: keys an earlier copy had that the
    source no longer has (rows the chunks read, and changes after P0, all rank higher). In a
    merged copy only the member's rows (its versions are its own server's)."""
    final = ch_table(load.target_database, load.target_table)
    mine, params = member_filter(schema)
    where = f"{ch_ident(VERSION_COLUMN)} < {{v:UInt64}} AND {mine}"
    params = {**params, "v": start.snapshot_version()}
    stale = int(ch.command(f"SELECT count() FROM {final} WHERE {where}", parameters=params))
    if stale and schema.content.keep_deletes:  # a copy that keeps deletes marks them (core/content/)
        repairs.tombstone_older(ch, load.target_database, load.target_table, start.snapshot_version(), mine,
                               params)
    elif stale:
        ch.command(f"DELETE FROM {final} WHERE {where}", parameters=params)
    return stale


def bootstrap_table(spec: CdcBootstrapSpec, session, ch, ledger: Ledger, checkpoints: Checkpoints,
                    table: dict) -> dict:
    """One table's bootstrap, by one job at a time (its load key's lock: core/source/locks.py);
    a pipeline's re-copy of a table (spark/cdc_ddl.py) runs it too."""
    name = f"{table['source_database']}.{table['source_table']}"
    # what its copy holds (core/content/): its entry's settings over the job's, kept with its pipeline entry
    table = {**table, "content": spec.tableset.content_of(table).to_dict() or None}
    try:
        lock = load_lock(spec.source, spec.ledger_database, bootstrap_load_key(spec.pipeline, table),
                         f"the bootstrap of {name} for pipeline {spec.pipeline!r}")
    except LockHeld as held:
        raise BootstrapFailed(str(held)) from None
    try:
        return _bootstrap_locked(spec, session, ch, ledger, checkpoints, table, lock)
    finally:
        lock.release()


def _bootstrap_locked(spec: CdcBootstrapSpec, session, ch, ledger: Ledger, checkpoints: Checkpoints,
                      table: dict, lock) -> dict:
    started = time.time()
    with mysql_reader.connect(spec.source) as conn:
        schema = copied_schema(conn, table, spec.salt)
        check_columns(schema)
        key = ChunkKey.of(schema)
        mariadb = flavor(conn).mariadb
        fence = ensure_fence(conn, _fence(spec)) if spec.watermark_table and not mariadb else None
        load, state, plan = _start_or_resume(spec, table, ledger, checkpoints, conn, schema, key)
        in_driver = (table_rows(conn, table["source_database"], table["source_table"])
                     <= driver_copy_limit(spec.driver_copy_rows, session))
        chunk = chunk_rows(spec.chunk_rows, average_row_bytes(conn, table["source_database"], table["source_table"]))
    if not in_driver and state.status != LOAD_PUBLISHED and not state.repair:
        session.start()  # the SparkContext comes up while the driver prepares
    if state.status == LOAD_PUBLISHED or state.repair:
        if not spec.recopy:  # asked for another layout or content than the copy's: refused, as a full load is
            _check_settings(ch, schema, load)
        log.info(f"{schema.qualified} was bootstrapped for pipeline {spec.pipeline!r} already "
              f"(generation {state.generation}); skipped (restart=True bootstraps it again)")
        if not spec.recopy:
            entry = PipelineTable.of(table)
            entry.split_column = plan.split_column
            # no-op once joined
            checkpoints.register(spec.pipeline, entry, _snapshot_of(state) if key.keyless
                                 else BinlogPosition.from_dict(state.start_position))
        return _summary(state, load, plan, started) | {"skipped": True}
    mappings = schema.mappings()
    split = schema.column(plan.split_column) if plan.split_column else None
    weight = split if split is not None and needs_weight(split) else None  # a collated key's rows carry their weight
    if key.keyless:  # one snapshot streamed by mysqlclient (connectorx may buffer a whole query)
        native_sql, note = None, "mysqlclient (a table without a key: one snapshot, streamed)"
    else:
        native_sql, note = mysql_reader.native_reader("auto", spec.source, plan, mappings, schema.primary_key,
                                                      weight)
    log.info(f"{schema.qualified}: reader {note}")
    _prepare_target(ch, schema, load, weight is not None)
    start = BinlogPosition.from_dict(state.start_position)
    # the table joins the pipeline now: its changes from P0 on are applied while the chunks run,
    # decoded with the shape it had then
    entry = PipelineTable.of(table)
    entry.split_column = plan.split_column
    entry.remember_shape(schema)
    if not spec.recopy and not key.keyless:  # a multiset joins where its one snapshot was taken (below)
        checkpoints.register(spec.pipeline, entry, start, again=spec.restart)
    ledger.write_load(state)
    todo = state.todo()
    before = {i: (s.records_read, s.chunks) for i, s in state.shards.items()}  # finished chunks of earlier runs
    log.info(f"bootstrap {schema.qualified} (pipeline {spec.pipeline!r}, from {start}): {len(todo)} of "
          f"{len(plan.shards)} shards to read in chunks of {chunk:,} rows, {plan.channels} channel(s) "
          + ("in the driver" if in_driver else "as Spark tasks"))
    # the live copy has the final layout: rows carry no shard id
    copy = Copy(mappings, weight, mysql_reader.select_list(mappings, weight), native_sql, mariadb, True, split,
                multiset=key.keyless)
    copier = BootstrapCopy(load, plan, copy, state, ledger, Chunking(key, chunk, fence))
    copier.stopping = lambda: lock.lost and (
        f"the bootstrap of {schema.qualified}: this job lost its lock on the source ({lock.lost}), so another run may "
        "own it now; it writes nothing more. Run it again: it resumes after each shard's last finished chunk")
    per_shard = copier.run(session, in_driver) if todo else []
    state = copier.settle(per_shard, in_driver and bool(todo))
    snapshot = _snapshot_of(state) if key.keyless else None
    dropped = _drop_older(ch, load, snapshot or start, schema)
    if snapshot is not None and not spec.recopy:
        checkpoints.register(spec.pipeline, entry, snapshot, again=True)
    state.status = LOAD_PUBLISHED
    ledger.write_load(state)
    shards = [vars(s) | {"seconds": s.seconds} for s in state.shards.values()]
    log.info("%s", shard_table(shards))
    return _summary(state, load, plan, started) | _read_now(before, per_shard) | {
        "older_rows_dropped": dropped, "shards_read": len(todo)} | (
        {"snapshot_position": snapshot.to_dict()} if snapshot is not None else {})


def _snapshot_of(state: LoadState) -> BinlogPosition:
    """A table without a key: the position of its one snapshot (the shard's resume point)."""
    [shard] = [s for s in state.shards.values() if s.resume_key]
    return BinlogPosition.from_dict(shard.resume_key)


def copied_rows(ledger: Ledger, pipeline: str, table: dict) -> dict:
    """A finished bootstrap (or re-copy) of ``table`` as the ledger has it: {"rows": …}."""
    state = ledger.state(bootstrap_load_key(pipeline, table))
    keyless = state is not None and not state.plan.get("split_column")
    return {"rows": sum(s.records_written for s in state.shards.values()) if state else 0} | (
        {"snapshot_position": _snapshot_of(state).to_dict()} if keyless and any(
            s.resume_key for s in state.shards.values()) else {})


def _summary(state: LoadState, load: FullLoadSpec, plan: Plan, started: float) -> dict:
    return {"table": state.source_table, "target": f"{load.target_database}.{load.target_table}",
            "load_key": load.load_key, "generation": state.generation, "start_position": state.start_position,
            "rows": sum(s.records_written for s in state.shards.values()), "rows_read_now": 0,
            "chunks": sum(s.chunks for s in state.shards.values()), "chunks_read_now": 0,
            "shards": len(plan.shards), "shards_read": 0, "older_rows_dropped": 0, "skipped": False,
            "split_column": plan.split_column, "seconds": round(time.time() - started, 3)}


def _read_now(before: dict, per_shard: list) -> dict:
    """Rows and chunks this run read (``before``: each shard's (rows, chunks) of earlier runs)."""
    return {"rows_read_now": sum(r["records_read"] - before.get(r["shard_id"], (0, 0))[0] for r in per_shard),
            "chunks_read_now": sum(r["chunks"] - before.get(r["shard_id"], (0, 0))[1] for r in per_shard)}


def run_cdc_bootstrap(spec: CdcBootstrapSpec, spark) -> dict:
    """``spark``: a SparkSession or a :class:`LazySession`, started only for a table whose
    channels run as Spark tasks (spark/channels.py)."""
    started = time.time()
    session = lazy(spark)
    ch = shared_client(spec.target)
    ledger, checkpoints = Ledger(ch, spec.ledger_database), Checkpoints(ch, spec.ledger_database)
    ledger.ensure()
    checkpoints.ensure()
    if spec.tableset.select:  # the pipeline keeps its patterns: every later run applies them
        selection = checkpoints.selection_for(spec.pipeline, spec.tableset.select, spec.change_selection)
        if selection != checkpoints.selection(spec.pipeline):
            checkpoints.write_selection(spec.pipeline, selection)
    selected, unstreamable = _selected(spec)
    tables = [bootstrap_table(spec, session, ch, ledger, checkpoints, table)
              for table in [*spec.tableset.tables, *selected]]
    with mysql_reader.connect(spec.source) as conn:
        end = current_position(conn)
    start = min((BinlogPosition.from_dict(t["start_position"]) for t in tables), key=BinlogPosition.key,
                default=end)
    return {"pipeline": spec.pipeline, "tables": tables, "rows": sum(t["rows"] for t in tables),
            "unstreamable": unstreamable, "start_position": start.to_dict(), "end_position": end.to_dict(),
            "seconds": round(time.time() - started, 3)}


def _selected(spec: CdcBootstrapSpec) -> tuple[list[dict], dict[str, str]]:
    """The tables ``spec.tableset.select`` names now (besides ``spec.tableset.tables``), and those of them CDC cannot
    stream, with the reason (they are left out, not failed: the others go on)."""
    selection = TableSelection.of(spec.tableset.select)
    if selection is None:
        return [], {}
    named = {f"{t['source_database']}.{t['source_table']}" for t in spec.tableset.tables}
    selected, unstreamable = [], {}
    with mysql_reader.connect(spec.source) as conn:
        names = [n for n in selection.resolve(conn) if n not in named]
        for name in names:
            config = table_config(selection.config(name))
            problem = streaming_problem(copied_schema(conn, config, spec.salt))
            if problem:
                unstreamable[name] = problem
            else:
                selected.append(config)
    log.info(f"pipeline {spec.pipeline!r}: {selection.to_dict()} selects {len(names)} table(s): "
          f"{', '.join(names) or 'none'}" + ("; not streamable, left out: " + "; ".join(
              f"{n} ({why})" for n, why in unstreamable.items()) if unstreamable else ""))
    return selected, unstreamable

"""Snapshot diff: old (a ClickHouse table) vs new (the MySQL source or another ClickHouse table).

Driver: resolve the columns and the canonical schema, plan shards on the source (the planner;
evaluated on ClickHouse as reconciliation does), fix the apply's version and clear the
previous change set of this diff. Channels (threads of the driver on a local master or for a
small table, Spark tasks otherwise), per shard: both databases count and checksum buckets of
row positions level by level, cutting only the buckets that differ (core/verify/pruning.py),
so a shard whose buckets all agree is identical without a row being read and a scattered change
costs the rows near it. The rows of the buckets left to read travel once per side, ordered by
position, and are compared in aligned batches of about ``bucket_rows`` rows per side. Each
batch's changes go to the change set, and with ``on_change="apply"`` into the old table:
``new``/``changed`` rows upserted, ``deleted`` rows as tombstones, all with one version of the
shared scheme (below the binlog position read at the diff's start, so any later change outranks
them).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import queue
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa

from airflow_sync_provider.core.cdc.servers import source_epoch
from airflow_sync_provider.core.jobspec import SnapshotDiffSpec
from airflow_sync_provider.core.ledger import Ledger
from airflow_sync_provider.core.positions import position_if_readable
from airflow_sync_provider.core.source import reader as mysql_reader
from airflow_sync_provider.core.source.group import SOURCE_COLUMNS, Member, member_filter, member_view, merged_schema
from airflow_sync_provider.core.source.locks import LockHeld, NamedLock, lock_name
from airflow_sync_provider.core.source.planning import Plan, Shard, SpeedLimits, explain, plan_table
from airflow_sync_provider.core.source.schema import TableSchema, read_table_schema
from airflow_sync_provider.core.sql import ch_ident, ch_string, ch_table, mysql_ident, mysql_table
from airflow_sync_provider.core.target import clickhouse as target
from airflow_sync_provider.core.target.shards import (
    SPLIT_WEIGHT_COLUMN,
    cut_points,
    mysql_weight_sql,
    needs_weight,
    read_weights,
    target_predicates,
    weight_width,
)
from airflow_sync_provider.core.typemap import MySQLColumn, map_column
from airflow_sync_provider.core.verify.diff import (
    CHANGED,
    DELETED,
    FLAGS,
    IDENTICAL,
    NEW,
    DiffColumns,
    DiffError,
    change_samples,
    compare,
    new_name,
    nullable,
    old_name,
)
from airflow_sync_provider.core.verify.pruning import (
    SCAN_SHARE,
    Positions,
    Pruning,
    Scope,
    aligned_batches,
    first_rows,
    interval_sql,
    label_sql,
    pieces,
)
from airflow_sync_provider.core.verify.rowhash import ch_row_hash, mysql_row_hash, row_text
from airflow_sync_provider.core.verify.shape import CopyShape, column_problems, read_copy_shape
from airflow_sync_provider.spark.channels import driver_copy_limit, run_channels
from airflow_sync_provider.spark.groups import group_members
from airflow_sync_provider.spark.session import lazy

log = logging.getLogger(__name__)
BUCKET = "_diff_bucket"  # aliases no table column should shadow
POSITION = "_diff_position"
_POSITION_MAPPING = map_column(MySQLColumn(POSITION, "int", "int unsigned", False))
_INTEGER_TYPES = ("tinyint", "smallint", "mediumint", "int", "integer", "bigint")


@dataclass(frozen=True)
class _ChColumn:
    """A column of a ClickHouse-vs-ClickHouse diff: its text is ClickHouse's own."""

    name: str
    plain_text = False  # any type's text: length-prefixed in the row text
    text_may_be_null = True

    def ch_text(self, col_sql: str) -> str:
        return f"toString({col_sql})"


@dataclass(frozen=True)
class _ChTable:
    """A ClickHouse snapshot as the diff reads it: ``FINAL`` on a ReplacingMergeTree (each key's
    newest version), tombstones left out, and whether its engine takes ``PREWHERE``."""

    name: str  # db.t
    final: bool
    deleted_filter: bool  # the table has our _deleted column
    prewhere: bool  # a MergeTree engine

    @classmethod
    def of(cls, ch, name: str) -> "_ChTable":
        database, table = _split(name)
        engine = str(ch.command("SELECT engine FROM system.tables WHERE database = {d:String} AND name = {t:String}",
                                parameters={"d": database, "t": table}))
        return cls(name, "Replacing" in engine, target.DELETED_COLUMN in target.column_types(ch, database, table),
                   engine.endswith("MergeTree"))

    @property
    def from_sql(self) -> str:
        return ch_table(*_split(self.name)) + (" FINAL" if self.final else "")

    def where_sql(self, key_filter: str, where: str) -> str:
        """``FROM … [PREWHERE key_filter] WHERE where`` with tombstones left out. ``key_filter``
        depends on the key alone, so every version of a key passes it or none does: it may run
        before FINAL's merge (PREWHERE), which then merges only the rows near a change (a
        scattered read of 3 % of a shard: 0.57 -> 0.27 s per 5M rows). ``where`` (the shard's
        predicate, possibly on a non-key column that differs between versions) runs after it."""
        tombstones = f" AND {ch_ident(target.DELETED_COLUMN)} = 0" if self.deleted_filter else ""
        if self.prewhere:
            return f"FROM {self.from_sql} PREWHERE {key_filter} WHERE ({where}){tombstones}"
        return f"FROM {self.from_sql} WHERE ({where}){tombstones} AND {key_filter}"


@dataclass
class _Context:
    """Everything a channel needs, built once by the driver (no secrets beyond the spec's)."""

    spec: SnapshotDiffSpec
    run_id: str
    columns: DiffColumns
    schema: pa.Schema  # canonical: the carried columns
    texts: dict  # column → mapping (MySQL mode) or _ChColumn (ClickHouse mode)
    plan: Plan
    old_predicates: dict  # shard id → (where, params) on the old table
    old: _ChTable
    weight: bool  # rows carry the copy's _split_weight (read from MySQL, written back)
    version: int | None  # the apply's version
    mysql_columns_sql: str = ""
    key_position: bool = False  # positions are the first key column's values (else CRC32 of the key text)
    positions: Positions = Positions.of_hash()
    first_width: int = 1
    new_ch: _ChTable | None = None  # a ClickHouse new side
    advice: dict = dataclasses.field(default_factory=dict)  # what to say of a key found twice on a side


# --- the two sides -----------------------------------------------------------------------------

def _position(ctx: _Context, side: str) -> str:
    """A row's position (core/verify/pruning.py): its integer first key column, or CRC32 of its key text."""
    if ctx.key_position:
        name = ctx.columns.keys[0]
        return mysql_ident(name) if side == "mysql" else ch_ident(name)
    text = row_text([ctx.texts[k] for k in ctx.columns.keys], side)
    return f"CRC32({text})"


def _bucket_sql(ctx: _Context, side: str, width: int) -> str:
    """``offset DIV width``, exact for every integer type (offsets are never negative)."""
    position, base = _position(ctx, side), int(ctx.positions.base)
    if side == "mysql":
        offset = position
        if ctx.key_position:
            # BIGINT arithmetic when every offset fits in it (0.1 µs a row less than DECIMAL's)
            wide = ctx.positions.top >= 1 << 63
            offset = f"(CAST({position} AS DECIMAL(20,0)) - {base})" if wide else f"({position} - ({base}))"
        return f"{offset} DIV {int(width)}"
    offset = f"(toInt128({position}) - {base})" if ctx.key_position else position
    return f"intDiv({offset}, {int(width)})"


FEW_INTERVALS = 8  # the most intervals said as BETWEENs without a label lookup


def _ch_settings(sql: str) -> dict:
    """Room to parse ``sql``: a scattered change's label list can pass ClickHouse's 256 KiB default."""
    return {"max_query_size": max(1 << 18, 2 * len(sql))}


def _within(ctx: _Context, side: str, scope: Scope | None) -> str:
    """The rows of ``scope``'s buckets: the outer bounds of its intervals (an index range with
    integer keys) and a lookup of each row's bucket label in a sorted set. An ``OR`` of a
    thousand ``BETWEEN``s instead is evaluated term by term on every row: on 1M rows MariaDB took
    2–4 s for it against 0.15 s for the lookup, ClickHouse similar. A few intervals (the
    buckets are exactly their union) are said as ``BETWEEN``s alone: when everything changed, one
    interval stands for a shard's 150,000 labels."""
    if scope is None:
        return "1 = 1"
    position, base = _position(ctx, side), ctx.positions.base
    if not scope.intervals:
        return "1 = 0"
    if len(scope.intervals) <= FEW_INTERVALS:
        return interval_sql(position, scope.intervals, base)
    bounds = interval_sql(position, [(scope.intervals[0][0], scope.intervals[-1][1])], base)
    return f"{bounds} AND {label_sql(lambda width: _bucket_sql(ctx, side, width), scope.labels)}"


def _hashed(ctx: _Context) -> list:
    return [ctx.texts[c] for c in (*ctx.columns.keys, *ctx.columns.compared)]


def _ch_buckets(ctx: _Context, ch, table: _ChTable, shard_id: int, width: int, scope) -> dict:
    where, params = ctx.old_predicates[shard_id]
    sql = (f"SELECT {_bucket_sql(ctx, 'clickhouse', width)} AS {BUCKET}, count(), "
           f"sum(toUInt128({ch_row_hash(_hashed(ctx))})) {table.where_sql(_within(ctx, 'clickhouse', scope), where)}"
           f" GROUP BY {BUCKET}")
    rows = ch.query(sql, parameters=params, settings=_ch_settings(sql)).result_rows
    return {int(b): (int(n), int(s)) for b, n, s in rows}


def _new_buckets(ctx: _Context, ch, conn, shard: Shard, width: int, scope) -> dict:
    if ctx.spec.new_table:
        return _ch_buckets(ctx, ch, ctx.new_ch, shard.id, width, scope)
    out = {}
    with conn.cursor() as cur:
        for within in _mysql_within(ctx, scope):
            cur.execute(f"SELECT {_bucket_sql(ctx, 'mysql', width)}, COUNT(*), SUM({mysql_row_hash(_hashed(ctx))})"
                        f" {ctx.plan.from_clause()} WHERE ({shard.where}) AND {within} GROUP BY 1",  # 1: not a column
                        shard.params)
            out.update({int(b): (int(n), int(s)) for b, n, s in cur.fetchall()})  # batches hold disjoint buckets
    return out


RANGE_BATCH = 32  # key ranges per MySQL query: MariaDB's range optimizer costs grow faster than the list


def _by_key(ctx: _Context) -> bool:
    """Are the shards read through the index whose first column gives the positions?"""
    return ctx.key_position and ctx.plan.split_column == ctx.columns.keys[0]


def _mysql_within(ctx: _Context, scope: Scope | None) -> list[str]:
    """The MySQL predicates (one query each, in position order) selecting ``scope``'s rows. With
    integer key positions its intervals are exactly its buckets, so a few dozen ``BETWEEN``s per
    query read them through the primary key: at 0.1 % of 10M rows changed, the second level's
    5,000 intervals per shard took 0.5 µs a row this way against a full scan of the shard for the
    label lookup (5x the time). Hash positions have no index to use, nor does a plan that forces
    another index (split on another column): the label lookup, in one query."""
    if scope is None or not _by_key(ctx) or not scope.intervals:
        return [_within(ctx, "mysql", scope)]
    position, base, intervals = _position(ctx, "mysql"), ctx.positions.base, scope.intervals  # sorted, merged
    return [interval_sql(position, intervals[i:i + RANGE_BATCH], base) for i in range(0, len(intervals), RANGE_BATCH)]


def _cast(batch: pa.RecordBatch, schema: pa.Schema, where: str) -> pa.Table:
    table = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch
    try:
        return table.select(schema.names).cast(schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise DiffError(f"{where}: a value does not fit the canonical type: {exc}") from exc


def _read_ch(ctx: _Context, ch, table: _ChTable, shard_id: int, scope: Scope, weight: bool, where: str):
    """The rows of ``scope``'s buckets in one shard of a ClickHouse table, ordered by position."""
    pred, params = ctx.old_predicates[shard_id]
    names = list(ctx.schema.names) + ([SPLIT_WEIGHT_COLUMN] if weight else [])
    schema = ctx.schema.append(pa.field(SPLIT_WEIGHT_COLUMN, pa.binary())) if weight else ctx.schema
    position = _position(ctx, "clickhouse")
    extra = ""
    if not ctx.key_position:
        schema = schema.append(pa.field(POSITION, pa.uint32()))
        extra = f", {position} AS {POSITION}"
    sql = (f"SELECT {', '.join(ch_ident(n) for n in names)}{extra} "
           f"{table.where_sql(_within(ctx, 'clickhouse', scope), pred)} ORDER BY {position}")
    with ch.query_arrow_stream(sql, parameters=params, settings=_ch_settings(sql)) as stream:
        for block in stream:
            yield _cast(block, schema, where)


# the most rows of one MySQL read query: connectorx holds a query's result while the comparison lags
PIECE_ROWS = 100_000
NATIVE_ROWS = 20_000  # a shard reading this many rows or more reads them through connectorx
NATIVE_RANGES = 256  # key ranges per connectorx query (a connection each): a scattered change's piece holds ~8,000 rows
_native: dict = {}  # run id -> the native reader's SELECT list, or None (mysqlclient): one probe per process
_native_lock = threading.Lock()


def _native_sql(ctx: _Context) -> str | None:
    """The native reader's SELECT list for this diff, probed once per process on first need (a
    diff that reads no rows pays no probe): ``spec.reader`` as a full load's."""
    with _native_lock:
        if ctx.run_id not in _native:
            mappings = [ctx.texts[c] for c in ctx.schema.names]
            keys = [k for k in ctx.columns.keys if ctx.texts[k].source.in_table]  # not a merged copy's source columns
            sql, note = mysql_reader.native_reader(ctx.spec.reader, ctx.spec.source, ctx.plan, mappings, keys)
            log.info(f"diff {ctx.spec.diff_key}: rows are read by {note}")
            _native[ctx.run_id] = sql
        return _native[ctx.run_id]


def _read_pieces(ctx: _Context, pruning: Pruning, ranges: int) -> list[tuple[str, int]]:
    """The read's MySQL predicates in position order, with their rows (the larger side's count):
    with integer key positions, pieces of the read buckets (core/verify/pruning.py: pieces), each
    at most ``ranges`` key ranges through the primary key; else the label lookup in one query."""
    if not _by_key(ctx):
        return [(_within(ctx, "mysql", pruning.read_scope), sum(n for _, _, n in pruning.read))]
    position, base = _position(ctx, "mysql"), ctx.positions.base
    return [(interval_sql(position, intervals, base), rows)
            for intervals, rows in pieces(pruning.read, PIECE_ROWS, ranges)]


def _read_mysql(ctx: _Context, shard: Shard, pruning: Pruning, where: str):
    """The read buckets' rows from MySQL, ordered by position. A shard that reads many rows reads
    them through connectorx (Arrow, decoded off the GIL: a scattered change's 160,000 rows of a
    shard in 0.37 s against 0.6 s for mysqlclient's tuples alone, which two shards' threads then
    decode one at a time), in pieces of up to ``NATIVE_RANGES`` key ranges, each taken whole
    before it is compared, so that a piece connectorx cannot read is read again by mysqlclient
    instead. A small read (no probe, no connection per piece), and the one unbounded label-lookup
    query of other plans, stream through one mysqlclient connection, 32 ranges a query."""
    position = _position(ctx, "mysql")
    mappings = [ctx.texts[c] for c in ctx.schema.names] + ([] if ctx.key_position else [_POSITION_MAPPING])
    columns_sql = ctx.mysql_columns_sql.replace("{position}", position)
    # bounded pieces only; a copy with collation weights is split on its string column, never by key
    many = sum(n for _, _, n in pruning.read) >= NATIVE_ROWS
    native = _native_sql(ctx) if _by_key(ctx) and not ctx.weight and many else None
    conn = None
    try:
        for predicate, _rows in _read_pieces(ctx, pruning, NATIVE_RANGES if native else RANGE_BATCH):
            part = dataclasses.replace(shard, where=f"({shard.where}) AND {predicate} ORDER BY {position}", pieces=())
            if native is not None:
                try:
                    batches = list(mysql_reader.read_shard_native(
                        ctx.spec.source, mysql_reader.ShardRead(ctx.plan, mappings, native, ctx.spec.fetch_rows), part))
                except mysql_reader.NativeReadError as exc:
                    log.info(f"{where}: the native reader failed ({exc}); reading the piece again with "
                          "mysqlclient")
                else:
                    yield from (pa.Table.from_batches([b]) for b in batches)
                    continue
            conn = conn or mysql_reader.stream_connect(ctx.spec.source)
            read = mysql_reader.ShardRead(ctx.plan, mappings, columns_sql, ctx.spec.fetch_rows, bool(ctx.weight))
            for batch in mysql_reader.read_shard(conn, read, part):
                yield pa.Table.from_batches([batch])
    finally:
        if conn is not None:
            conn.close()


# --- one shard ---------------------------------------------------------------------------------

def _write(ch, ctx: _Context, result) -> None:
    spec = ctx.spec
    changes = result.changes
    changes = changes.add_column(0, "diff_key", pa.array([spec.diff_key] * changes.num_rows, pa.string()))
    changes = changes.add_column(1, "run_id", pa.array([ctx.run_id] * changes.num_rows, pa.string()))
    database, table = spec.changes_table.split(".", 1)
    ch.insert_arrow(table, changes, database=database)
    if spec.on_change != "apply":
        return
    database, table = spec.old_table.split(".", 1)
    for rows, deleted in ((result.upserts, 0), (result.tombstones, 1)):
        if rows is None:
            continue
        n = rows.num_rows
        rows = rows.append_column(target.VERSION_COLUMN, pa.array([ctx.version] * n, pa.uint64()))
        rows = rows.append_column(target.DELETED_COLUMN, pa.array([deleted] * n, pa.uint8()))
        ch.insert_arrow(table, rows, database=database, settings=target.WEIGHT_SETTINGS if ctx.weight else None)


def _descend(ctx: _Context, clients: _Clients, shard: Shard) -> Pruning:
    """Aggregate level after level on both sides at once, cutting only the differing buckets."""
    # without key ranges every level scans the shard: small cuts are read instead (SCAN_SHARE)
    pruning = Pruning(ctx.positions, ctx.first_width, read_share=0.0 if _by_key(ctx) else SCAN_SHARE)
    with ThreadPoolExecutor(2) as pool:
        while not pruning.done:
            old = pool.submit(_ch_buckets, ctx, clients.old, ctx.old, shard.id, pruning.width, pruning.scope)
            new = pool.submit(_new_buckets, ctx, clients.new, clients.mysql, shard, pruning.width, pruning.scope)
            pruning.feed(old.result(), new.result())
    return pruning


AHEAD = 2  # tables a side's reader may hold before the comparison takes them


def _ahead(tables, depth: int = AHEAD):
    """``tables`` read on a thread of their own, up to ``depth`` ahead of the caller: both sides'
    reads and the comparison run at once, where they used to take turns (the MySQL read waited
    while ClickHouse's rows were read and compared). The reading generator is advanced and
    closed on that thread only, so its connection never changes threads."""
    out: queue.Queue = queue.Queue(depth)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                out.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for table in tables:
                if not put((False, table)):
                    return
            put((True, None))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            put((True, exc))
        finally:
            tables.close()

    thread = threading.Thread(target=produce, name="diff-read", daemon=True)
    thread.start()
    try:
        while True:
            end, value = out.get()
            if end:
                if value is not None:
                    raise value
                return
            yield value
    finally:
        stop.set()
        thread.join()


def _counted(tables, record: dict, key: str):
    for table in tables:
        record[key] += table.num_rows
        yield table


def _diff_shard(ctx: _Context, clients: _Clients, shard: Shard) -> dict:
    started = time.time()
    spec = ctx.spec
    where = f"diff {spec.diff_key!r}, shard {shard.id}"
    pruning = _descend(ctx, clients, shard)
    record = {"shard_id": shard.id, "old_rows": 0, "new_rows": 0, "buckets": pruning.first_buckets,
              "buckets_read": len(pruning.read), "levels": pruning.levels, "rows_read_old": 0, "rows_read_new": 0,
              **dict.fromkeys(FLAGS, 0)}
    record[IDENTICAL] = pruning.identical
    scope = pruning.read_scope
    if scope.intervals:
        old = _read_ch(ctx, clients.old, ctx.old, shard.id, scope, ctx.weight, where)
        if spec.new_table:
            new = _read_ch(ctx, clients.new, ctx.new_ch, shard.id, scope, False, where)
        else:
            new = _read_mysql(ctx, shard, pruning, where)
        old_schema = ctx.schema.append(pa.field(SPLIT_WEIGHT_COLUMN, pa.binary())) if ctx.weight else ctx.schema
        new_schema = old_schema if not spec.new_table else ctx.schema
        label = ctx.columns.keys[0] if ctx.key_position else POSITION
        for old_rows, new_rows in aligned_batches(_counted(_ahead(old), record, "rows_read_old"),
                                                  _counted(_ahead(new), record, "rows_read_new"), label,
                                                  spec.bucket_rows):
            old_rows = old_schema.empty_table() if old_rows is None else old_rows.select(old_schema.names)
            new_rows = new_schema.empty_table() if new_rows is None else new_rows.select(new_schema.names)
            result = compare(old_rows, new_rows, ctx.columns, where, ctx.advice)
            for flag in FLAGS:
                record[flag] += result.counts[flag]
            if result.changes is not None:
                _write(clients.writer, ctx, result)
    record["old_rows"] = record[IDENTICAL] + record[CHANGED] + record[DELETED]
    record["new_rows"] = record[IDENTICAL] + record[CHANGED] + record[NEW]
    record["seconds"] = round(time.time() - started, 3)
    return record


@dataclass
class _Clients:
    """One channel's connections: each ClickHouse client runs one statement at a time, and the
    old side is still streaming while changes are written."""

    old: object
    writer: object
    new: object = None  # the new ClickHouse table's reader
    mysql: object = None

    @classmethod
    def open(cls, spec: SnapshotDiffSpec) -> "_Clients":
        return cls(target.client(spec.target), target.client(spec.target),
                   target.client(spec.target) if spec.new_table else None,
                   _aggregation_connect(spec) if spec.source_table else None)

    def close(self) -> None:
        for client in (self.old, self.writer, self.new, self.mysql):
            if client is not None:
                client.close()


def _aggregation_connect(spec: SnapshotDiffSpec):
    """The bucket queries' MySQL connection: the C client (a first level returns up to
    MAX_BUCKETS rows, which pymysql parses at 2 µs each) with room for their grouping in memory
    (16 MiB by default; beyond it MySQL groups on disk)."""
    conn = mysql_reader.stream_connect(spec.source)
    cur = conn.cursor()
    cur.execute("SET SESSION tmp_table_size = 67108864, max_heap_table_size = 67108864")
    cur.close()
    return conn


def _diff_channel(ctx: _Context, shard_ids: list[int]):
    """One channel (a Spark task, or a thread of the driver) diffs a queue of shards."""
    clients = _Clients.open(ctx.spec)
    shards = {s.id: s for s in ctx.plan.shards}
    try:
        for shard_id in shard_ids:
            yield _diff_shard(ctx, clients, shards[shard_id])
    finally:
        clients.close()


# --- the driver --------------------------------------------------------------------------------

def _split(name: str) -> tuple[str, str]:
    database, _, table = name.partition(".")
    return database, table


def _user_columns(types: dict) -> list[str]:
    return [c for c in types if c not in target.INTERNAL_COLUMNS]


def _copy_split_column(ledger: Ledger, old_table: str) -> str | None:
    """The column whose collation weight the copy's ``_split_weight`` holds: the split column of
    the newest load (full load or bootstrap) that wrote the table."""
    rows = ledger.ch.query(f"SELECT plan FROM {ledger.table('loads')} FINAL WHERE target_table = {{t:String}}"
                           " AND status = 'published' ORDER BY updated_at DESC LIMIT 1",
                           parameters={"t": old_table}).result_rows
    return json.loads(rows[0][0]).get("split_column") if rows else None


def _create_copy(spec: SnapshotDiffSpec, ch) -> dict:
    with mysql_reader.connect(spec.source) as conn:
        schema = read_table_schema(conn, spec.source_database, spec.source_table)
    target.check_columns(schema)
    database, table = _split(spec.old_table)
    log.info(f"diff {spec.diff_key}: creating {spec.old_table} (it did not exist)")
    ch.command(f"CREATE DATABASE IF NOT EXISTS {ch_ident(database)}")
    ch.command(target.create_table_sql(schema, database, table))
    return target.column_types(ch, database, table)


def _resolve_mysql(spec: SnapshotDiffSpec, ch, ledger: Ledger, old_types: dict, copy: CopyShape,
                   merged: TableSchema | None = None) -> dict:
    """Columns, canonical schema, shards and version when the new snapshot is the MySQL table
    (``merged``: a merged copy's shape, which a member's table is seen through)."""
    with mysql_reader.connect(spec.source) as conn:
        schema = read_table_schema(conn, spec.source_database, spec.source_table)
        if merged is not None:
            schema = member_view(merged, Member.of(spec.member), schema)
        table = schema.qualified
        skipped = [c.name for c in schema.columns if c.name not in old_types]
        if spec.compare_columns and set(spec.compare_columns) & set(skipped):
            raise DiffError(f"table {table}: compare_columns {sorted(set(spec.compare_columns) & set(skipped))} "
                            f"are not in the old snapshot {spec.old_table}")
        keys = spec.key_columns or list(schema.target_key)
        _check_copy_shape(spec, ch, copy, schema, old_types, keys)
        if skipped:
            log.info(f"diff {spec.diff_key}: column(s) {skipped} of {table} are not in {spec.old_table}; "
                  "not compared")
        schema = dataclasses.replace(schema, primary_key=tuple(k for k in schema.primary_key if k in old_types))
        schema = schema.select([c.name for c in schema.columns if c.name in old_types])
        mappings = {m.name: m for m in schema.mappings()}
        floats = [m.name for m in mappings.values() if m.source.data_type in ("float", "double", "real")]
        columns = DiffColumns.resolve(table, list(mappings), keys, spec.compare_columns, spec.ignore_columns,
                                      spec.tolerances, floats)
        weight_col = _copy_split_column(ledger, spec.old_table) if SPLIT_WEIGHT_COLUMN in old_types else None
        plan = plan_table(conn, schema, speed=SpeedLimits(channels=spec.channels),
                          split_column=spec.split_column or weight_col or keys[0], split_factor=spec.split_factor)
        column = schema.column(plan.split_column) if plan.split_column else None
        database, name = _split(spec.old_table)
        if needs_weight(column) and column.name != weight_col:
            log.info(f"diff {spec.diff_key}: {spec.old_table} holds no collation weights of "
                  f"{column.name!r}; one shard, pruned by buckets only")
            plan = _one_shard(plan, conn)
            column = None
        weights = width = None
        if needs_weight(column):
            weights = read_weights(conn, column, cut_points(plan))
            width = weight_width(ch, database, name) if weights.space is not None else 0
        predicates = dict(zip((s.id for s in plan.shards), target_predicates(plan, column, weights, None, width or 0,
                                                                             member_filter(schema))))
        position = position_if_readable(conn, table, source_epoch(conn, ch, spec.ledger_database))
        first = mappings[keys[0]].source
        key_position = first.data_type in _INTEGER_TYPES and not first.nullable
        if key_position:
            with conn.cursor() as cur:
                cur.execute(f"SELECT MIN({mysql_ident(first.name)}), MAX({mysql_ident(first.name)}) "
                            f"FROM {mysql_table(spec.source_database, spec.source_table)}")
                low, high = cur.fetchone()
            ch_low, ch_high = _ch_key_range(ch, spec.old_table, first.name)
            positions = Positions.of_keys([low, ch_low], [high, ch_high])
    weight_column = schema.column(weight_col) if weight_col is not None else None
    columns_sql = mysql_reader.select_list(list(mappings.values())) + ("" if key_position else ", {position}")
    if weight_column is not None:
        columns_sql += f", COALESCE({mysql_weight_sql(weight_column)}, '')"
    return {"columns": columns, "schema": mysql_reader.arrow_schema(list(mappings.values())), "texts": mappings,
            "plan": plan, "old_predicates": predicates, "weight": weight_column is not None, "position": position,
            "mysql_columns_sql": columns_sql, "key_position": key_position,
            "positions": positions if key_position else Positions.of_hash(),
            "ch_types": {m.name: m.ch_type for m in mappings.values()}}


def _reload_remedy(spec: SnapshotDiffSpec) -> str:
    return (f"a retry does not help: reload {spec.source_database}.{spec.source_table} in full into {spec.old_table} "
            "(its full load; a CDC copy: re-bootstrap it), then diff again")


def _check_copy_shape(spec: SnapshotDiffSpec, ch, copy: CopyShape, schema, old_types: dict, keys: list[str]) -> None:
    """The copy's columns and key against the MySQL table now (core/verify/shape.py): a key the copy
    lacks, or a column the copy holds in another type than a load would now give it, cannot be
    compared (nor applied) value for value: a clear error naming them and the remedy, not a
    ClickHouse exception or flags of values read in the wrong type."""
    table = schema.qualified
    if not keys:
        hint = (f"; its copy {spec.old_table} is keyed by ({', '.join(copy.key)}): pass key_columns={list(copy.key)!r} "
                f"(--key) to pair the rows by it, or reload the table in full" if copy is not None and copy.replacing
                and copy.key else "")
        raise DiffError(f"table {table} has no primary key: a diff needs key_columns to pair the rows{hint}")
    missing = [k for k in keys if k not in old_types]
    if missing:
        raise DiffError(f"table {table}: key column(s) {missing} are not in the old snapshot {spec.old_table} (its "
                        f"columns: {_user_columns(old_types)}); {_reload_remedy(spec)}")
    both = [c for c in schema.columns if c.name in old_types]
    problems = column_problems(ch, dataclasses.replace(schema, columns=tuple(both), primary_key=()), old_types)
    if problems:
        raise DiffError(f"table {table}: its copy {spec.old_table} no longer has the source's shape: "
                        f"{'; '.join(problems)}; {_reload_remedy(spec)}")


def _shape_notes(spec: SnapshotDiffSpec, copy: CopyShape, keys: tuple[str, ...]) -> tuple[list[str], dict]:
    """What a person should know about the old table's engine and key against the diff's key, and
    what to say about a key found twice in it."""
    key = f"({', '.join(keys)})"
    if not copy.replacing:
        return ([f"{spec.old_table} is a {copy.engine}, not a ReplacingMergeTree (as a copy loaded while the table had "
                 f"no primary key is): read without FINAL, every stored row counts; the diff pairs rows by {key}"],
                {"old": f"{spec.old_table} is a {copy.engine}, which merges no rows by key (e.g. a copy loaded while "
                        f"the table had no primary key): reload it in full to get a copy keyed by {key}"})
    if set(copy.key) != set(keys):
        return ([f"{spec.old_table} is keyed by ({', '.join(copy.key)}) but the diff pairs rows by {key}: the flags "
                 "describe the copy as its readers see it (FINAL keeps one row per copy key)"],
                {"old": f"{spec.old_table} is keyed by ({', '.join(copy.key)}), not by the diff's key {key}"})
    return [], {}


def _check_apply(spec: SnapshotDiffSpec, copy: CopyShape, keys: tuple[str, ...]) -> None:
    """An apply upserts rows and tombstones keys with versions: only a ReplacingMergeTree keyed by
    exactly the diff's key makes a newer version replace the old row of its key. Anything else
    would keep both rows (a plain MergeTree) or merge rows of different keys (another key)."""
    key = f"({', '.join(keys)})"
    if not copy.replacing:
        raise DiffError(f"cannot apply to {spec.old_table}: it is a {copy.engine}, not a ReplacingMergeTree (e.g. a "
                        f"copy loaded while the table had no primary key): an upserted row would stand beside the row "
                        f"it replaces. "
                        f"A retry does not help: reload it in full (a keyed source gets a ReplacingMergeTree copy "
                        f"keyed by {key}), or diff without apply")
    if set(copy.key) != set(keys):
        raise DiffError(f"cannot apply to {spec.old_table}: it is keyed by ({', '.join(copy.key)}), but the diff pairs "
                        f"rows by {key}; its ReplacingMergeTree would merge rows by the wrong key. A retry does not "
                        "help: reload it in full (its key becomes the source's primary key), or diff without apply")


def _ch_key_range(ch, name: str, column: str) -> tuple:
    """The smallest and largest value of an integer key column (every stored version: a bound
    is all positions need), or (None, None) for an empty table."""
    count, low, high = ch.query(f"SELECT count(), min({ch_ident(column)}), max({ch_ident(column)}) FROM "
                                f"{ch_table(*_split(name))}").result_rows[0]
    return (int(low), int(high)) if count else (None, None)


def _one_shard(plan: Plan, conn) -> Plan:
    one = Plan(plan.database, plan.table, None, None, plan.strategy, 1, 1, (Shard(0, "1=1"),), plan.warnings)
    rows = explain(conn, one, one.shards[0]).get("rows")  # sets the first bucket width (an estimate is enough)
    return dataclasses.replace(one, shards=(Shard(0, "1=1", (), int(rows or 0)),))


def _resolve_clickhouse(spec: SnapshotDiffSpec, ch, old_types: dict) -> dict:
    """The same when the new snapshot is another ClickHouse table: one shard, pruned by buckets."""
    new_types = target.column_types(ch, *_split(spec.new_table))
    if not new_types:
        raise DiffError(f"the new snapshot {spec.new_table} does not exist on ClickHouse")
    names = [c for c in _user_columns(old_types) if c in new_types]
    keys = spec.key_columns or target.sorting_key(ch, *_split(spec.old_table))
    floats = [c for c in names if "Float" in old_types[c]]
    columns = DiffColumns.resolve(spec.old_table, names, keys, spec.compare_columns, spec.ignore_columns,
                                  spec.tolerances, floats)
    schema = ch.query_arrow(f"SELECT {', '.join(ch_ident(n) for n in names)} FROM "
                            f"{ch_table(*_split(spec.old_table))} LIMIT 0").schema
    new_ch = _ChTable.of(ch, spec.new_table)
    rows = int(ch.command(f"SELECT count() FROM {new_ch.from_sql}"))
    plan = Plan(*_split(spec.new_table), None, None, "balanced", 1, 1, (Shard(0, "1", (), rows),))
    return {"columns": columns, "schema": schema, "texts": {n: _ChColumn(n) for n in names}, "plan": plan,
            "old_predicates": {0: ("1", {})}, "weight": False, "position": None, "mysql_columns_sql": "",
            "key_position": False, "positions": Positions.of_hash(), "ch_types": {n: old_types[n] for n in names},
            "new_ch": new_ch}


def _changes_ddl(columns: DiffColumns, ch_types: dict) -> tuple[str, list[str]]:
    """The change-set table's DDL with ``{table}`` for its name, and its column names. One partition
    per diff key: a diff clears its previous change set by dropping its partition, where a DELETE
    re-read every row the table had ever held (lightweight deletes only mask rows): 1.3-1.8 s per
    diff, whatever it found, once a 10M-row change set had been written there."""
    cols = ["diff_key String", "run_id String", "flag LowCardinality(String)", "changed Array(String)"]
    cols += [f"{ch_ident(k)} {ch_types[k]}" for k in columns.keys]
    for c in columns.compared:
        cols += [f"{ch_ident(old_name(c))} {nullable(ch_types[c])}", f"{ch_ident(new_name(c))} {nullable(ch_types[c])}"]
    sql = ("CREATE TABLE {table} (\n  " + ",\n  ".join(cols) + "\n) ENGINE = MergeTree PARTITION BY diff_key "
           f"ORDER BY (diff_key, flag, {', '.join(ch_ident(k) for k in columns.keys)})")
    return sql, [c.split(" ", 1)[0].strip("`") for c in cols]


def _prepare_changes(ch, spec: SnapshotDiffSpec, columns: DiffColumns, ch_types: dict) -> None:
    """The change-set table, recreated when this diff's columns changed; this diff's rows cleared
    (a rerun writes the same change set, not a second one)."""
    database, table = _split(spec.changes_table)
    name = ch_table(database, table)
    sql, names = _changes_ddl(columns, ch_types)
    ch.command(f"CREATE DATABASE IF NOT EXISTS {ch_ident(database)}")
    existing = target.column_types(ch, database, table)
    if existing and list(existing) != names:
        ch.command(f"DROP TABLE {name}")
        existing = {}
    if not existing:
        ch.command(sql.format(table=name))
        return
    partition_key = ch.command("SELECT partition_key FROM system.tables"
                               " WHERE database = {d:String} AND name = {t:String}",
                               parameters={"d": database, "t": table})
    if str(partition_key).strip() != "diff_key":  # written by an earlier release: one partition for all keys
        staging = ch_table(database, f"{table}__repartition")
        ch.command(f"DROP TABLE IF EXISTS {staging}")
        ch.command(sql.format(table=staging))
        ch.command(f"INSERT INTO {staging} SELECT * FROM {name} WHERE diff_key != {{k:String}}",
                   parameters={"k": spec.diff_key})  # the other diff keys' change sets carry over
        ch.command(f"EXCHANGE TABLES {name} AND {staging}")
        ch.command(f"DROP TABLE {staging}")
        return
    ch.command(f"ALTER TABLE {name} DROP PARTITION {ch_string(spec.diff_key)}")


def _apply_version(spec: SnapshotDiffSpec, ch, old_types: dict, position) -> int:
    """Rows an apply writes rank below every change after the diff started reading (the binlog
    position then, as a repair's read) or, without a binlog, above everything the table holds."""
    missing = [c for c in (target.VERSION_COLUMN, target.DELETED_COLUMN) if c not in old_types]
    if missing:
        raise DiffError(f"cannot apply to {spec.old_table}: it has no {missing} column(s); apply writes versioned "
                        "rows and tombstones into a copy made by a full load, a bootstrap or CDC")
    target.check_layout(ch, *_split(spec.old_table))
    if position is not None:
        return position.snapshot_version(repair=True)
    top = ch.command(f"SELECT max({ch_ident(target.VERSION_COLUMN)}) FROM {ch_table(*_split(spec.old_table))}")
    return int(top or 0) + 1


CHANGES_WAIT_SECONDS = 3600  # a diff waits this long for another one writing its change set


def run_snapshot_diff(spec: SnapshotDiffSpec, spark, merged: TableSchema | None = None) -> dict:
    """One diff; diffs that write one change-set table (e.g. a backfill's runs) take turns: each
    clears its rows there and may recreate the table (a lock on the source, when there is one).
    ``merged``: a member's diff of a merged copy (:func:`run_group_diff`)."""
    if spec.source is None:  # ClickHouse against ClickHouse: no source to hold a lock on
        return _diff(spec, spark)
    name = lock_name(spec.ledger_database, f"changes:{spec.changes_table}")
    try:
        lock = NamedLock.take(spec.source, name, wait_seconds=CHANGES_WAIT_SECONDS)
    except LockHeld as held:
        raise DiffError(f"diff {spec.diff_key!r}: another diff has written the change set {spec.changes_table} for "
                        f"over {CHANGES_WAIT_SECONDS} s ({held.where} holds lock {held.name!r}); run it again later, "
                        "or give this diff a changes_table of its own") from None
    try:
        return _diff(spec, spark, merged)
    finally:
        lock.release()


def _diff(spec: SnapshotDiffSpec, spark, merged: TableSchema | None = None) -> dict:
    started = time.time()
    ch = target.client(spec.target)
    ledger = Ledger(ch, spec.ledger_database)
    ledger.ensure()
    old_types = target.column_types(ch, *_split(spec.old_table))
    if not old_types and spec.on_change == "apply" and spec.source_table:
        old_types = _create_copy(spec, ch)  # a first run seeds the copy: every row is new
    if not old_types:
        raise DiffError(f"the old snapshot {spec.old_table} does not exist on ClickHouse")
    copy = read_copy_shape(ch, *_split(spec.old_table))
    found = (_resolve_clickhouse(spec, ch, old_types) if spec.new_table
             else _resolve_mysql(spec, ch, ledger, old_types, copy, merged))
    if spec.on_change == "apply":
        _check_apply(spec, copy, found["columns"].keys)
    notes, advice = _shape_notes(spec, copy, found["columns"].keys)
    for note in notes:
        log.info("diff %s: %s", spec.diff_key, note)
    version = _apply_version(spec, ch, old_types, found["position"]) if spec.on_change == "apply" else None
    run_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
    _prepare_changes(ch, spec, found["columns"], found["ch_types"])
    plan = found["plan"]
    rows = sum(s.estimated_rows or 0 for s in plan.shards)
    # hash positions spread each shard's rows over the whole range; key positions, the table's
    spread = rows if found["key_position"] else rows / max(1, len(plan.shards))
    width = found["positions"].first_width(int(spread), first_rows(max(s.estimated_rows or 0 for s in plan.shards)))
    ctx = _Context(spec, run_id, found["columns"], found["schema"], found["texts"], plan,
                   found["old_predicates"], _ChTable.of(ch, spec.old_table),
                   found["weight"], version, found["mysql_columns_sql"], found["key_position"], found["positions"],
                   width, found.get("new_ch"), advice)
    ids = [s.id for s in plan.shards]
    channels = max(1, min(spec.channels, len(ids)))
    queues = [ids[i::channels] for i in range(channels)]
    # the comparisons run inside the databases: a local master or a small table needs no SparkContext
    session = lazy(spark)
    in_driver = rows <= driver_copy_limit(None, session)
    shards = sorted(run_channels(session, queues, lambda q, _: _diff_channel(ctx, q), in_driver),
                    key=lambda r: r["shard_id"])
    counts = {flag: sum(s[flag] for s in shards) for flag in FLAGS}
    changed = counts[CHANGED] + counts[NEW] + counts[DELETED]
    verdict = "identical" if not changed else ("applied" if spec.on_change == "apply" else "changed")
    result = {
        "diff_key": spec.diff_key, "run_id": run_id, "old": spec.old_table, "new": spec.new_name,
        "verdict": verdict, "on_change": spec.on_change, "counts": counts,
        "rows_old": sum(s["old_rows"] for s in shards), "rows_new": sum(s["new_rows"] for s in shards),
        "rows_read_old": sum(s["rows_read_old"] for s in shards),
        "rows_read_new": sum(s["rows_read_new"] for s in shards),
        "shards": len(shards), "shards_read": sum(1 for s in shards if s["buckets_read"]),
        "buckets_read": sum(s["buckets_read"] for s in shards), "version": version,
        "changes_table": spec.changes_table, "keys": list(ctx.columns.keys), "compared": list(ctx.columns.compared),
        "levels": max((s["levels"] for s in shards), default=0),
        "positions": "key" if ctx.key_position else "hash", "in_driver": in_driver, "spark_started": session.started,
        "notes": notes,
    }
    ledger.write_diff(result, shards)
    _native.pop(run_id, None)
    samples = change_samples(ch, spec.changes_table, spec.diff_key, run_id, spec.sample_rows)
    ch.close()
    return result | {"shard_results": shards, "samples": samples, "seconds": round(time.time() - started, 3)}


def run_group_diff(spec: SnapshotDiffSpec, spark) -> dict:
    """A merged copy (core/source/group.py) against its sources: every member's table against the
    copy's rows of it (its source columns in the key), each a diff of its own
    (``<diff key>:<source>:<db>.<table>``) into one change set; rows of the copy from a source
    table no longer selected are counted as ``orphans`` (a re-load removes them)."""
    started = time.time()
    session = lazy(spark)
    members = group_members(spec)
    merged = merged_schema([(m, schema) for m, _, _, schema in members], spec.merge_into)
    ch = target.client(spec.target)
    try:
        database, table = _split(spec.merge_into)
        if not target.table_exists(ch, database, table):
            if spec.on_change != "apply":
                raise DiffError(f"the merged copy {spec.merge_into} does not exist on ClickHouse")
            ch.command(f"CREATE DATABASE IF NOT EXISTS {ch_ident(database)}")
            ch.command(target.create_table_sql(member_view(merged, members[0][0], members[0][3]), database, table))
        tags = ", ".join(ch_ident(c) for c in SOURCE_COLUMNS)
        present = {tuple(r) for r in ch.query(f"SELECT DISTINCT {tags} FROM {ch_table(database, table)} FINAL"
                                              ).result_rows}
    finally:
        ch.close()
    orphans = sorted(":".join((s, f"{d}.{t}")) for s, d, t in present - {m.tags for m, *_ in members})
    results = []
    for member, source, _, _ in members:  # one at a time: they share the change set's table
        one = run_snapshot_diff(spec.for_member(member, source.endpoint), session, merged)
        results.append(one | {"member": member.name, "table": f"{member.database}.{member.table}"})
    counts = {flag: sum(r["counts"][flag] for r in results) for flag in FLAGS}
    if orphans:
        log.warning("diff %s: %s holds rows of source tables no longer selected: %s", spec.diff_key, spec.merge_into,
                    ", ".join(orphans))
    changed = any(r["verdict"] != "identical" for r in results)
    return {"diff_key": spec.diff_key, "merge_into": spec.merge_into, "tables": results, "counts": counts,
            "orphans": orphans, "verdict": ("applied" if spec.on_change == "apply" else "changed") if changed
            else "identical", "selected": [m.name for m, *_ in members], "seconds": round(time.time() - started, 3)}

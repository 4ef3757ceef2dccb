"""One shard of a snapshot diff, in a channel (spark/diff.py is the driver): both databases
count and checksum buckets of row positions level by level, cutting only the buckets that differ
(core/verify/pruning.py), so a shard whose buckets all agree is identical without a row being
read and a scattered change costs the rows near it. The rows of the buckets left to read travel
once per side, ordered by position, and are compared in aligned batches of about ``bucket_rows``
rows per side. Each batch's changes go to the change set, and with ``on_change="apply"`` into the
old table, with the diff's one version. Also here: what a channel is handed (:class:`DiffContext`)
and the two snapshots' forms (:class:`ChTable`, :class:`ChColumn`)."""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa

from airflow_sync_provider.core.clickhouse.client import client
from airflow_sync_provider.core.clickhouse.columns import DELETED_COLUMN, VERSION_COLUMN, WEIGHT_SETTINGS
from airflow_sync_provider.core.clickhouse.described import column_types
from airflow_sync_provider.core.clickhouse.history import HistoryTable, Stamp
from airflow_sync_provider.core.content.shaping import DELETED_AT_SOURCE
from airflow_sync_provider.core.jobspec import SnapshotDiffSpec
from airflow_sync_provider.core.source import reader as mysql_reader
from airflow_sync_provider.core.source.planning import Plan, Shard
from airflow_sync_provider.core.source.weights import SPLIT_WEIGHT_COLUMN
from airflow_sync_provider.core.sql import ch_ident, ch_table, mysql_ident
from airflow_sync_provider.core.typemap import MySQLColumn, map_column
from airflow_sync_provider.core.verify.diff import (
    CHANGED,
    DELETED,
    FLAGS,
    IDENTICAL,
    NEW,
    DiffColumns,
    DiffError,
    compare,
)
from airflow_sync_provider.core.verify.pruning import (
    SCAN_SHARE,
    Positions,
    Pruning,
    Scope,
    aligned_batches,
    interval_sql,
    label_sql,
    pieces,
)
from airflow_sync_provider.core.verify.rowhash import ch_row_hash, mysql_row_hash, row_text

log = logging.getLogger(__name__)
BUCKET = "_diff_bucket"  # aliases no table column should shadow
POSITION = "_diff_position"
POSITION_MAPPING = map_column(MySQLColumn(POSITION, "int", "int unsigned", False))
INTEGER_TYPES = ("tinyint", "smallint", "mediumint", "int", "integer", "bigint")


@dataclass(frozen=True)
class ChColumn:
    """A column of a ClickHouse-vs-ClickHouse diff: its text is ClickHouse's own."""

    name: str
    plain_text = False  # any type's text: length-prefixed in the row text
    text_may_be_null = True

    def ch_text(self, col_sql: str) -> str:
        return f"toString({col_sql})"


@dataclass(frozen=True)
class ChTable:
    """A ClickHouse snapshot as the diff reads it: ``FINAL`` on a ReplacingMergeTree (each key's
    newest version), tombstones left out, and whether its engine takes ``PREWHERE``."""

    name: str  # db.t
    final: bool
    deleted_filter: bool  # the table has our _deleted column
    prewhere: bool  # a MergeTree engine
    keeps: bool = False  # it keeps deletes (core/content/): its rows deleted at the source are not compared

    @classmethod
    def of(cls, ch, name: str) -> "ChTable":
        database, table = split_name(name)
        engine = str(ch.command("SELECT engine FROM system.tables WHERE database = {d:String} AND name = {t:String}",
                                parameters={"d": database, "t": table}))
        columns = column_types(ch, database, table)
        return cls(name, "Replacing" in engine, DELETED_COLUMN in columns, engine.endswith("MergeTree"),
                   DELETED_AT_SOURCE in columns)

    @property
    def from_sql(self) -> str:
        return ch_table(*split_name(self.name)) + (" FINAL" if self.final else "")

    def where_sql(self, key_filter: str, where: str) -> str:
        """``FROM … [PREWHERE key_filter] WHERE where`` with tombstones left out. ``key_filter``
        depends on the key alone, so every version of a key passes it or none does: it may run
        before FINAL's merge (PREWHERE), which then merges only the rows near a change (a
        scattered read of 3 % of a shard: 0.57 -> 0.27 s per 5M rows). ``where`` (the shard's
        predicate, possibly on a non-key column that differs between versions) runs after it."""
        tombstones = f" AND {ch_ident(DELETED_COLUMN)} = 0" if self.deleted_filter else ""
        if self.keeps:
            tombstones += f" AND {ch_ident(DELETED_AT_SOURCE)} = 0"
        if self.prewhere:
            return f"FROM {self.from_sql} PREWHERE {key_filter} WHERE ({where}){tombstones}"
        return f"FROM {self.from_sql} WHERE ({where}){tombstones} AND {key_filter}"


@dataclass
class DiffContext:
    """Everything a channel needs, built once by the driver (no secrets beyond the spec's)."""

    spec: SnapshotDiffSpec
    run_id: str
    columns: DiffColumns
    schema: pa.Schema  # canonical: the carried columns
    texts: dict  # column → mapping (MySQL mode) or ChColumn (ClickHouse mode)
    plan: Plan
    old_predicates: dict  # shard id → (where, params) on the old table
    old: ChTable
    weight: bool  # rows carry the copy's _split_weight (read from MySQL, written back)
    version: int | None  # the apply's version
    mysql_columns_sql: str = ""
    key_position: bool = False  # positions are the first key column's values (else CRC32 of the key text)
    positions: Positions = Positions.of_hash()
    first_width: int = 1
    new_ch: ChTable | None = None  # a ClickHouse new side
    advice: dict = dataclasses.field(default_factory=dict)  # what to say of a key found twice on a side
    moves: bool = False  # the copy's layout places rows by columns beyond the key (diff._moves)
    # the copy's history (core/clickhouse/history.py) and the apply's stamp, when it keeps one
    history: "tuple[HistoryTable, Stamp] | None" = None



# --- the two sides -----------------------------------------------------------------------------

def _position(ctx: DiffContext, side: str) -> str:
    """A row's position (core/verify/pruning.py): its integer first key column, or CRC32 of its key text."""
    if ctx.key_position:
        name = ctx.columns.keys[0]
        return mysql_ident(name) if side == "mysql" else ch_ident(name)
    text = row_text([ctx.texts[k] for k in ctx.columns.keys], side)
    return f"CRC32({text})"


def _bucket_sql(ctx: DiffContext, side: str, width: int) -> str:
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


def _within(ctx: DiffContext, side: str, scope: Scope | None) -> str:
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


def _hashed(ctx: DiffContext) -> list:
    return [ctx.texts[c] for c in (*ctx.columns.keys, *ctx.columns.compared)]


def _ch_buckets(ctx: DiffContext, ch, table: ChTable, shard_id: int, width: int, scope) -> dict:
    where, params = ctx.old_predicates[shard_id]
    sql = (f"SELECT {_bucket_sql(ctx, 'clickhouse', width)} AS {BUCKET}, count(), "
           f"sum(toUInt128({ch_row_hash(_hashed(ctx))})) {table.where_sql(_within(ctx, 'clickhouse', scope), where)}"
           f" GROUP BY {BUCKET}")
    rows = ch.query(sql, parameters=params, settings=_ch_settings(sql)).result_rows
    return {int(b): (int(n), int(s)) for b, n, s in rows}


def _new_buckets(ctx: DiffContext, ch, conn, shard: Shard, width: int, scope) -> dict:
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


def _by_key(ctx: DiffContext) -> bool:
    """Are the shards read through the index whose first column gives the positions?"""
    return ctx.key_position and ctx.plan.split_column == ctx.columns.keys[0]


def _mysql_within(ctx: DiffContext, scope: Scope | None) -> list[str]:
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


def _read_ch(ctx: DiffContext, ch, table: ChTable, shard_id: int, scope: Scope, weight: bool, where: str):
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


def _native_sql(ctx: DiffContext) -> str | None:
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


def forget_run(run_id: str) -> None:
    """A diff's run is over: its probe result is not needed any more."""
    _native.pop(run_id, None)


def _read_pieces(ctx: DiffContext, pruning: Pruning, ranges: int) -> list[tuple[str, int]]:
    """The read's MySQL predicates in position order, with their rows (the larger side's count):
    with integer key positions, pieces of the read buckets (core/verify/pruning.py: pieces), each
    at most ``ranges`` key ranges through the primary key; else the label lookup in one query."""
    if not _by_key(ctx):
        return [(_within(ctx, "mysql", pruning.read_scope), sum(n for _, _, n in pruning.read))]
    position, base = _position(ctx, "mysql"), ctx.positions.base
    return [(interval_sql(position, intervals, base), rows)
            for intervals, rows in pieces(pruning.read, PIECE_ROWS, ranges)]


def _read_mysql(ctx: DiffContext, shard: Shard, pruning: Pruning, where: str):
    """The read buckets' rows from MySQL, ordered by position. A shard that reads many rows reads
    them through connectorx (Arrow, decoded off the GIL: a scattered change's 160,000 rows of a
    shard in 0.37 s against 0.6 s for mysqlclient's tuples alone, which two shards' threads then
    decode one at a time), in pieces of up to ``NATIVE_RANGES`` key ranges, each taken whole
    before it is compared, so that a piece connectorx cannot read is read again by mysqlclient
    instead. A small read (no probe, no connection per piece), and the one unbounded label-lookup
    query of other plans, stream through one mysqlclient connection, 32 ranges a query."""
    position = _position(ctx, "mysql")
    mappings = [ctx.texts[c] for c in ctx.schema.names] + ([] if ctx.key_position else [POSITION_MAPPING])
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
            conn = conn or mysql_reader.stream_connect(ctx.spec.source, ctx.spec.salt)
            read = mysql_reader.ShardRead(ctx.plan, mappings, columns_sql, ctx.spec.fetch_rows, bool(ctx.weight))
            for batch in mysql_reader.read_shard(conn, read, part):
                yield pa.Table.from_batches([batch])
    finally:
        if conn is not None:
            conn.close()


# --- one shard ---------------------------------------------------------------------------------

KEEP = "keep"  # _write: rows to keep, marked deleted at the source


def _write(ch, ctx: DiffContext, result) -> None:
    spec = ctx.spec
    changes = result.changes
    changes = changes.add_column(0, "diff_key", pa.array([spec.diff_key] * changes.num_rows, pa.string()))
    changes = changes.add_column(1, "run_id", pa.array([ctx.run_id] * changes.num_rows, pa.string()))
    database, table = spec.changes_table.split(".", 1)
    ch.insert_arrow(table, changes, database=database)
    if spec.on_change != "apply":
        return
    database, table = spec.old_table.split(".", 1)
    # a copy laid out by more than the key (core/clickhouse/layout.py): a changed row may move to
    # another sorting key or partition, where it would not replace its old row; its old row gets a
    # tombstone of the apply's version, inserted first (of two rows of one version in one place,
    # the one inserted last is kept: the upsert, where old and new place turn out the same)
    moved = (result.replaced, 1) if ctx.moves else (None, 1)
    # a copy that keeps deletes (core/content/) keeps a row the source no longer has: marked now
    gone = (result.tombstones, KEEP) if ctx.old.keeps else (result.tombstones, 1)
    # the history's events (none for a moved row's old place): the changed rows come first in the upserts
    upserted = ["update"] * result.counts[CHANGED] + ["insert"] * result.counts[NEW]
    writes = []
    for (rows, deleted), events in zip((moved, (result.upserts, 0), gone),
                                       (None, upserted, ["delete"] * result.counts[DELETED])):
        if rows is None:
            continue
        n = rows.num_rows
        rows = rows.append_column(VERSION_COLUMN, pa.array([ctx.version] * n, pa.uint64()))
        rows = rows.append_column(DELETED_COLUMN, pa.array([0 if deleted == KEEP else deleted] * n, pa.uint8()))
        if ctx.old.keeps:
            rows = rows.append_column(DELETED_AT_SOURCE, pa.array([int(time.time()) if deleted == KEEP else 0] * n,
                                                                  pa.uint32()))
        writes.append((rows, events))
    if ctx.history is not None:  # the history first: a copy changed without it would be a silent miss
        history, stamp = ctx.history
        for rows, events in writes:
            if events is not None:
                history.insert(ch, history.arrow(rows, dataclasses.replace(stamp, event=events)))
    for rows, _ in writes:
        ch.insert_arrow(table, rows, database=database, settings=WEIGHT_SETTINGS if ctx.weight else None)


def _descend(ctx: DiffContext, clients: DiffClients, shard: Shard) -> Pruning:
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


def _diff_shard(ctx: DiffContext, clients: DiffClients, shard: Shard) -> dict:
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
class DiffClients:
    """One channel's connections: each ClickHouse client runs one statement at a time, and the
    old side is still streaming while changes are written."""

    old: object
    writer: object
    new: object = None  # the new ClickHouse table's reader
    mysql: object = None

    @classmethod
    def open(cls, spec: SnapshotDiffSpec) -> "DiffClients":
        return cls(client(spec.target), client(spec.target),
                   client(spec.target) if spec.new_table else None,
                   _aggregation_connect(spec) if spec.source_table else None)

    def close(self) -> None:
        for conn in (self.old, self.writer, self.new, self.mysql):
            if conn is not None:
                conn.close()


def _aggregation_connect(spec: SnapshotDiffSpec):
    """The bucket queries' MySQL connection: the C client (a first level returns up to
    MAX_BUCKETS rows, which pymysql parses at 2 µs each) with room for their grouping in memory
    (16 MiB by default; beyond it MySQL groups on disk)."""
    conn = mysql_reader.stream_connect(spec.source, spec.salt)
    cur = conn.cursor()
    cur.execute("SET SESSION tmp_table_size = 67108864, max_heap_table_size = 67108864")
    cur.close()
    return conn


def diff_channel(ctx: DiffContext, shard_ids: list[int]):
    """One channel (a Spark task, or a thread of the driver) diffs a queue of shards."""
    clients = DiffClients.open(ctx.spec)
    shards = {s.id: s for s in ctx.plan.shards}
    try:
        for shard_id in shard_ids:
            yield _diff_shard(ctx, clients, shards[shard_id])
    finally:
        clients.close()


def split_name(name: str) -> tuple[str, str]:
    """``db.table`` → (db, table)."""
    database, _, table = name.partition(".")
    return database, table

"""Stream one shard of a MySQL table as Arrow record batches, in bounded memory.

Two readers produce the same batches (same Arrow types, same values):

* **native** (the default): connectorx decodes MySQL's binary protocol straight into Arrow in
  Rust — no Python object per value, and the server formats no text. About 3x less CPU per row
  on both sides than the text reader (bench/results/full_load.md).
* **mysqlclient** (the fallback): the text protocol, whole columns cast by Arrow.

Both SELECT the type rules' ``source_sql`` (core/typemap.py), so every conversion still happens
in one place. :func:`choose_reader` picks native unless a probe of the table's first rows
disagrees with the text reader or fails.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import quote

import MySQLdb
import MySQLdb.cursors
import numpy as np
import pyarrow as pa

from airflow_sync_provider.core.content.transforms import salt_sql, set_salt
from airflow_sync_provider.core.endpoints import MySQLEndpoint
from airflow_sync_provider.core.source.planning import Plan, Shard
from airflow_sync_provider.core.source.weights import SPLIT_WEIGHT_COLUMN, mysql_weight_sql
from airflow_sync_provider.core.sql import mysql_ident, mysql_inline, mysql_table
from airflow_sync_provider.core.tls import open_mysqlclient
from airflow_sync_provider.core.typemap import ColumnMapping, MySQLColumn, check_array, map_column


def connect(endpoint: MySQLEndpoint, salt: bytes = b""):
    """A pymysql connection for metadata and planning queries; with ``salt``, one whose SQL can
    hash as a copy's hash transforms do (core/content/transforms.py: a session variable)."""
    conn = endpoint.connect(autocommit=True)
    with conn.cursor() as cur:
        cur.execute("SET time_zone = '+00:00'")
        if salt:
            set_salt(cur, salt)
    return conn


def stream_connect(endpoint: MySQLEndpoint, salt: bytes = b""):
    """A mysqlclient connection with an unbuffered cursor and no value conversions, for bulk rows.

    mysqlclient (the C driver the MySQL provider already depends on) fetches rows about 3x
    faster than pymysql; without its per-value conversions (``conv={}``) the values stay text
    and Arrow casts whole columns. Rows are streamed, never held in memory.
    """
    conn = open_mysqlclient(endpoint, cursorclass=MySQLdb.cursors.SSCursor, autocommit=True, conv={})
    cur = conn.cursor()
    cur.execute("SET time_zone = '+00:00'")  # TIMESTAMP values come back as UTC instants
    if salt:  # the checks' SQL hashes as the copy's hash transforms do
        set_salt(cur, salt)
    cur.close()
    return conn


def arrow_schema(mappings: list[ColumnMapping]) -> pa.Schema:
    return pa.schema([pa.field(m.name, m.arrow_type, nullable=m.ch_type.startswith("Nullable(")) for m in mappings])


def selected(mappings: list[ColumnMapping]) -> list[ColumnMapping]:
    """The columns a read SELECTs: not a merged copy's source columns (their values are the
    member's constants, added to each batch by :func:`to_batch` / :func:`native_batch`: sent by
    MySQL on every row they cost a shard read about 40 %)."""
    return [m for m in mappings if m.source.tag is None]


def select_list(mappings: list[ColumnMapping], weight: MySQLColumn | None = None) -> str:
    """The SELECT list of a shard read: each column's target value computed in MySQL (the type
    rules' ``source_sql``, a content transform's SQL: ``read_sql``), and with ``weight`` (a collated
    split column) its collation weight."""
    columns = ", ".join(m.read_sql(mysql_ident(m.name)) for m in selected(mappings))
    if weight is not None:
        columns += f", COALESCE({mysql_weight_sql(weight)}, '')"
    return columns


# The split column's collation weight, read along when the split column is a collated string.
WEIGHT_MAPPING = map_column(MySQLColumn(SPLIT_WEIGHT_COLUMN, "varbinary", "varbinary", False))


@dataclass(frozen=True)
class ShardRead:
    """How a copy reads its shards: the plan (its table and split index), the columns' mappings,
    the SELECT list (:func:`select_list` for mysqlclient, :func:`native_select_list` for
    connectorx; built once by the driver), rows per fetch, and whether each row also carries the
    split column's collation weight."""

    plan: Plan
    mappings: list[ColumnMapping]
    columns_sql: str
    fetch_rows: int
    weight: bool = False

    def arrow(self) -> tuple[list[ColumnMapping], pa.Schema]:
        """The mappings of what a read returns, and its Arrow schema."""
        mappings = [*self.mappings, WEIGHT_MAPPING] if self.weight else self.mappings
        return mappings, arrow_schema(mappings)

    def where(self, shard: Shard) -> str:
        return f"table {self.plan.database}.{self.plan.table}, shard {shard.id}"


@dataclass(frozen=True)
class Chunk:
    """A bootstrap chunk's place in its shard (core/cdc/chunks.py): the next ``limit`` rows in
    ``key`` order after the key ``after`` (None: from the shard's start)."""

    key: object
    after: list | None
    limit: int


def read_shard(conn, read: ShardRead, shard: Shard) -> Iterator[pa.RecordBatch]:
    """The shard's rows through the plan's split index (FORCE INDEX: range access), ``fetch_rows``
    at a time from an unbuffered cursor (``conn``: :func:`stream_connect`), so memory stays
    bounded whatever the shard's size."""
    mappings, schema = read.arrow()
    cur = _salted_cursor(conn, mappings)
    cur.execute(f"SELECT {read.columns_sql} {read.plan.from_clause()} WHERE {shard.where}", shard.params)
    while rows := cur.fetchmany(read.fetch_rows):
        yield to_batch(rows, mappings, schema, read.where(shard))
    cur.close()


def read_chunk(conn, read: ShardRead, shard: Shard, chunk: Chunk, holder: dict | None = None
               ) -> Iterator[pa.RecordBatch]:
    """One bootstrap chunk of ``shard``, through the primary key. ``holder["last"]`` is set to
    the chunk's last key (bindable values) and ``holder["rows"]`` to its row count."""
    mappings, schema = read.arrow()
    key, plan = chunk.key, read.plan
    where, params = key.after(chunk.after)
    cur = _salted_cursor(conn, mappings)
    if key.keyless:  # the whole table, one snapshot, streamed (core/cdc/chunks.ChunkKey.keyless)
        cur.execute(f"SELECT {read.columns_sql} FROM {mysql_table(plan.database, plan.table)} WHERE ({shard.where})",
                    shard.params)
    else:
        cur.execute(f"SELECT {read.columns_sql}, {key.raw_select()} FROM {mysql_table(plan.database, plan.table)}"
                    f" FORCE INDEX (PRIMARY) WHERE ({shard.where}) AND ({where})"
                    f" ORDER BY {key.order_by()} LIMIT {int(chunk.limit)}",
                    (*shard.params, *params))
    width, rows_seen, last = len(selected(mappings)), 0, None
    while rows := cur.fetchmany(read.fetch_rows):
        rows_seen += len(rows)
        last = rows[-1][width:]
        yield to_batch(rows, mappings, schema, read.where(shard))  # the trailing key columns are not converted
    cur.close()
    if holder is not None:
        holder["rows"], holder["last"] = rows_seen, key.from_raw(last) if last and not key.keyless else None


def _salted_cursor(conn, mappings: list[ColumnMapping]):
    """A cursor of ``conn`` whose session hashes as the mappings' hash transforms do: their salt
    set on it (as the native reader sets it on its own connection), whatever salt the connection
    was opened with. Without it MySQL's SHA2(CONCAT(NULL, …)) is NULL: every hashed value of the
    copy would silently be NULL."""
    cur = conn.cursor()
    salt = _salt(mappings)
    if salt:
        set_salt(cur, salt)
    return cur


def _column(values, mapping: ColumnMapping, where: str) -> pa.Array:
    """Arrow casts the whole column from the text protocol (every conversion already happened in
    the SELECT: core/typemap.py)."""
    try:
        raw = pa.array(values)  # str → string, bytes → binary, all None → null
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, ValueError) as exc:
        raise ValueError(f"{where}, column {mapping.name!r}: value does not fit {mapping.ch_type}: {exc}") from exc
    return _typed(raw, mapping, where)


def _typed(raw: pa.Array, mapping: ColumnMapping, where: str) -> pa.Array:
    """``raw`` cast to the column's Arrow type (safe casts: an overflow or a lost digit is an error)."""
    target = mapping.arrow_type
    try:
        if raw.type == target:
            return raw
        if pa.types.is_large_binary(raw.type):
            raw = raw.cast(pa.binary())
        if pa.types.is_binary(raw.type) and not pa.types.is_binary(target):
            raw = raw.cast(pa.string())  # validates UTF-8
        return raw.cast(target)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, ValueError) as exc:
        raise ValueError(f"{where}, column {mapping.name!r}: value does not fit {mapping.ch_type}: {exc}") from exc


def to_batch(rows, mappings, schema, where: str) -> pa.RecordBatch:
    """Rows of the text protocol (tuples of the ``source_sql`` values of the :func:`selected`
    columns) as one Arrow batch of ``schema``, each value checked against its column's type rule
    (``where`` names the place)."""
    raw = iter(zip(*rows))
    arrays = []
    for mapping in mappings:
        if mapping.source.tag is not None:
            arrays.append(_constant(mapping, len(rows)))
            continue
        array = _column(next(raw), mapping, where)
        if mapping.transform is None:  # a transform's value was computed by MySQL from a checked one
            check_array(array, mapping, where)
        arrays.append(array)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _constant(mapping: ColumnMapping, rows: int) -> pa.Array:
    """A merged copy's source column: the member's tag on every row."""
    return pa.repeat(pa.scalar(mapping.source.tag, mapping.arrow_type), rows)


# --- the Arrow-native reader (connectorx) ------------------------------------------------------

class NativeReadError(RuntimeError):
    """connectorx failed (it panics on values it cannot decode): the shard is read again with
    mysqlclient."""


# connectorx decodes DECIMAL through rust_decimal (28 digits) into decimal128(38, 10): exact up to
# 28 digits with at most 10 after the point. Wider ones travel as their text. Up to 18 digits a
# DECIMAL travels as its unscaled integer instead (CAST(col * 10^scale AS SIGNED): exact decimal
# arithmetic in MySQL, below 2**63), which connectorx decodes for a quarter of a decimal's cost
# (orders' two DECIMALs: 0.74 -> 0.56 CPU-s per million rows, docs/performance.md); the integer is
# the decimal128's own representation, widened to 128 bits (:func:`_from_unscaled`).
_NATIVE_DECIMAL_DIGITS, _NATIVE_DECIMAL_SCALE, _UNSCALED_DIGITS = 28, 10, 18


def _unscaled(col: MySQLColumn) -> bool:
    return col.data_type in ("decimal", "numeric") and (col.precision or 10) <= _UNSCALED_DIGITS


def _from_unscaled(raw: pa.Array, target: pa.DataType) -> pa.Array:
    """A DECIMAL read as its unscaled integer (int64) as the decimal128 ``target``: the same
    integer in two's complement, sign-extended to 128 bits; no digit can be lost (the column's
    scale is the target's) and none overflow (at most 18 digits)."""
    if raw.offset:
        raw = pa.concat_arrays([raw])  # (buffers from offset 0)
    validity, data = raw.buffers()[0], raw.buffers()[1]
    low = np.frombuffer(data, dtype=np.int64, count=len(raw))
    wide = np.empty((len(raw), 2), dtype=np.int64)
    wide[:, 0], wide[:, 1] = low, low >> 63
    return pa.Array.from_buffers(target, len(raw), [validity, pa.py_buffer(wide)], null_count=raw.null_count)

# MariaDB's own binlog position of the consistent snapshot the read runs in, as one number
# (file sequence << 32 | offset: core/positions.py's version of that position), read inside
# the SELECT because connectorx opens its own connection.
SNAPSHOT_COLUMN_SQL = (
    "(SELECT (CAST(SUBSTRING_INDEX(f.VARIABLE_VALUE, '.', -1) AS UNSIGNED) << 32)"
    " | CAST(p.VARIABLE_VALUE AS UNSIGNED) FROM information_schema.SESSION_STATUS f"
    " JOIN information_schema.SESSION_STATUS p ON f.VARIABLE_NAME = 'BINLOG_SNAPSHOT_FILE'"
    " AND p.VARIABLE_NAME = 'BINLOG_SNAPSHOT_POSITION')")


def _native_sql(mapping: ColumnMapping) -> str:
    if mapping.transform is not None:  # text, computed by MySQL (ColumnMapping.read_sql)
        return mapping.read_sql(mysql_ident(mapping.name))
    sql = mapping.source_sql(mysql_ident(mapping.name))
    col = mapping.source
    if _unscaled(col):  # (an integer literal: decimal arithmetic, never a DOUBLE's)
        return f"CAST({sql} * {10 ** (col.scale or 0)} AS SIGNED)"
    if col.data_type in ("decimal", "numeric") and ((col.precision or 10) > _NATIVE_DECIMAL_DIGITS
                                                    or (col.scale or 0) > _NATIVE_DECIMAL_SCALE):
        return f"CAST({sql} AS CHAR)"
    return sql


def native_select_list(mappings: list[ColumnMapping], weight: MySQLColumn | None = None) -> str:
    """:func:`select_list` for the native reader."""
    columns = ", ".join(_native_sql(m) for m in selected(mappings))
    if weight is not None:
        columns += f", COALESCE({mysql_weight_sql(weight)}, '')"
    return columns


def _redacted(exc: BaseException, endpoint: MySQLEndpoint, salt: bytes = b"") -> str:
    """connectorx's message, first line, without the password (its URL carries it) or the salt."""
    text = (str(exc).splitlines() or [type(exc).__name__])[0][:500]
    for secret in {endpoint.password, quote(endpoint.password, safe=""), salt.hex(), salt.hex().upper()} - {""}:
        text = text.replace(secret, "***")
    return text


def _salt(mappings: list[ColumnMapping]) -> bytes:
    """The salt the mappings' hash transforms read in MySQL (b"": none)."""
    return next((m.salt for m in mappings if m.transform is not None and m.salt), b"")


def _native_stream(endpoint: MySQLEndpoint, database: str, query: str, batch_rows: int,
                   salt: bytes = b"") -> Iterator[pa.RecordBatch]:
    """connectorx's batches of ``query``, run inside a consistent snapshot with UTC sessions (and
    the session's hash salt: core/content/transforms.py; on connectorx's own connection, which
    carries the rows themselves)."""
    import connectorx  # here: a CDC run never reads through it, and its import costs 0.2 s

    pre = [*([endpoint.init_command] if endpoint.init_command else []), "SET time_zone = '+00:00'",
           *([salt_sql(salt)] if salt else []), "START TRANSACTION WITH CONSISTENT SNAPSHOT"]
    stream = None
    try:
        try:
            stream = connectorx.read_sql(endpoint.connectorx_url(database), query, return_type="arrow_stream",
                                         batch_size=batch_rows, pre_execution_query=pre)
        except BaseException as exc:  # pyo3's PanicException is a BaseException
            if not isinstance(exc, Exception) and type(exc).__name__ != "PanicException":
                raise
            raise NativeReadError(_redacted(exc, endpoint, salt)) from exc
        while True:
            try:
                batch = stream.read_next_batch()
            except StopIteration:
                return
            except BaseException as exc:
                if not isinstance(exc, Exception) and type(exc).__name__ != "PanicException":
                    raise
                raise NativeReadError(_redacted(exc, endpoint, salt)) from exc
            yield batch
    finally:
        if stream is not None:
            stream.close()


def read_shard_native(endpoint: MySQLEndpoint, read: ShardRead, shard: Shard, snapshot: bool = False,
                      holder: dict | None = None) -> Iterator[pa.RecordBatch]:
    """:func:`read_shard` through connectorx (``read.columns_sql``: :func:`native_select_list`), one
    query per piece of the shard (core/source/planning.py): connectorx buffers a query's whole
    result when the caller lags, so a piece bounds the memory. Each piece reads its own
    snapshot. With ``snapshot`` (MariaDB) ``holder["snapshot"]`` is set, before the first batch is
    yielded, to the version of the first piece's binlog position (:data:`SNAPSHOT_COLUMN_SQL`),
    the earliest: rows of later pieces saw at least as much, so that version under-ranks them,
    never over-ranks (every later change still wins). A shard without rows leaves it unset."""
    mappings, schema = read.arrow()
    extra = f", {SNAPSHOT_COLUMN_SQL}" if snapshot else ""
    for predicate, params in shard.queries():
        query = f"SELECT {read.columns_sql}{extra} {read.plan.from_clause()} WHERE {mysql_inline(predicate, params)}"
        for batch in _native_stream(endpoint, read.plan.database, query, read.fetch_rows, _salt(mappings)):
            if not batch.num_rows:  # connectorx also sends empty batches
                continue
            if snapshot:
                if holder is not None and "snapshot" not in holder:
                    holder["snapshot"] = batch.column(batch.num_columns - 1)[0].as_py()
                batch = batch.drop_columns([batch.schema.names[-1]])
            yield native_batch(batch, mappings, schema, read.where(shard))


def read_chunk_native(endpoint: MySQLEndpoint, read: ShardRead, shard: Shard, chunk: Chunk,
                      snapshot: bool = False, holder: dict | None = None) -> Iterator[pa.RecordBatch]:
    """:func:`read_chunk` through connectorx; ``snapshot`` as in :func:`read_shard_native`."""
    mappings, schema = read.arrow()
    key, plan = chunk.key, read.plan
    where, params = key.after(chunk.after)
    extra = f", {SNAPSHOT_COLUMN_SQL}" if snapshot else ""
    query = (f"SELECT {read.columns_sql}, {key.native_raw_select()}{extra}"
             f" FROM {mysql_table(plan.database, plan.table)}"
             f" FORCE INDEX (PRIMARY) WHERE {mysql_inline(f'({shard.where}) AND ({where})', (*shard.params, *params))}"
             f" ORDER BY {key.order_by()} LIMIT {int(chunk.limit)}")
    width, rows_seen, last = len(selected(mappings)), 0, None
    for batch in _native_stream(endpoint, plan.database, query, read.fetch_rows, _salt(mappings)):
        if not batch.num_rows:
            continue
        if snapshot and holder is not None and "snapshot" not in holder:
            holder["snapshot"] = batch.column(batch.num_columns - 1)[0].as_py()
        rows_seen += batch.num_rows
        last = [batch.column(i)[batch.num_rows - 1].as_py() for i in range(width, width + len(key.columns))]
        yield native_batch(batch.select(range(width)), mappings, schema, read.where(shard))
    if holder is not None:
        holder["rows"], holder["last"] = rows_seen, key.from_raw(last) if last is not None else None


def native_batch(batch: pa.RecordBatch, mappings: list[ColumnMapping], schema: pa.Schema, where: str) -> pa.RecordBatch:
    """connectorx's batch of the :func:`selected` columns as a batch of ``schema``."""
    raw_columns = iter(batch.columns)
    arrays = []
    for mapping in mappings:
        if mapping.source.tag is not None:
            arrays.append(_constant(mapping, batch.num_rows))
            continue
        raw = next(raw_columns)
        if mapping.transform is None and _unscaled(mapping.source) and pa.types.is_integer(raw.type):
            arrays.append(_from_unscaled(raw.cast(pa.int64()), mapping.arrow_type))  # nothing to check
            continue
        array = _typed(raw, mapping, where)
        if mapping.transform is None:  # a transform's value was computed by MySQL from a checked one
            check_array(array, mapping, where)
        arrays.append(array)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


NATIVE, MYSQLCLIENT = "native", "mysqlclient"
PROBE_ROWS = 1000
PROBE_TRIES = 3


def choose_reader(endpoint: MySQLEndpoint, plan: Plan, mappings: list[ColumnMapping], key: list[str],
                  weight: MySQLColumn | None = None) -> tuple[str, str]:
    """The reader for this table and why: native, unless the source asks for TLS (connectorx has
    none), or the native reader fails on the table's first rows or reads them differently from
    mysqlclient (a type connectorx maps in a way we did not expect)."""
    if endpoint.ssl_mode != "DISABLED":
        return MYSQLCLIENT, (f"mysqlclient: the source asks for TLS (ssl_mode={endpoint.ssl_mode}), which "
                             "connectorx lacks")
    order = f" ORDER BY {', '.join(mysql_ident(k) for k in key)}" if key else ""
    tail = f" FROM {mysql_table(plan.database, plan.table)}{order} LIMIT {PROBE_ROWS}"
    where = f"table {plan.database}.{plan.table} (reader probe)"
    full = [*mappings, WEIGHT_MAPPING] if weight is not None else mappings
    schema = arrow_schema(full)
    # the two reads are not one snapshot: a row a writer changes between them differs without
    # any fault of the reader's, so a difference is looked at again before it counts
    for _ in range(PROBE_TRIES):
        try:
            native = [native_batch(b, full, schema, where) for b in
                      _native_stream(endpoint, plan.database, f"SELECT {native_select_list(mappings, weight)}{tail}",
                                     PROBE_ROWS, _salt(mappings))]
        except (NativeReadError, ValueError) as exc:
            return MYSQLCLIENT, f"the native reader failed on the first rows ({exc})"
        conn = stream_connect(endpoint)
        try:
            cur = _salted_cursor(conn, mappings)
            cur.execute(f"SELECT {select_list(mappings, weight)}{tail}")
            rows = cur.fetchall()
            cur.close()
        finally:
            conn.close()
        text = pa.Table.from_batches([to_batch(rows, full, schema, where)] if rows else [], schema=schema)
        mine = pa.Table.from_batches([b for b in native if b.num_rows], schema=schema)
        if mine.equals(text):
            return NATIVE, f"Arrow-native (connectorx, binary protocol); {len(mine)} probe rows equal mysqlclient's"
    return MYSQLCLIENT, f"the native reader read the first rows differently from mysqlclient ({PROBE_TRIES} tries)"


def native_reader(choice: str, endpoint: MySQLEndpoint, plan: Plan, mappings: list[ColumnMapping], key: list[str],
                  weight: MySQLColumn | None = None) -> tuple[str | None, str]:
    """The native reader's SELECT list, or None when mysqlclient reads, and why (for the task
    log): ``choice`` is a spec's ``reader`` (auto: :func:`choose_reader`'s probe decides)."""
    if choice == MYSQLCLIENT:
        return None, "mysqlclient (reader='mysqlclient')"
    if choice == NATIVE:
        if endpoint.ssl_mode != "DISABLED":
            raise ValueError(f"table {plan.database}.{plan.table}: reader='native' cannot read {endpoint.address}: "
                             "connectorx has no TLS; use reader='auto' or 'mysqlclient' (TLS), or ssl_mode=DISABLED")
        return native_select_list(mappings, weight), "Arrow-native (connectorx; reader='native')"
    reader, note = choose_reader(endpoint, plan, mappings, key, weight)
    return (native_select_list(mappings, weight) if reader == NATIVE else None), note

"""Stream one shard of a MySQL table as Arrow record batches, in bounded memory."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import MySQLdb
import MySQLdb.cursors
import pyarrow as pa
import pyarrow.compute as pc
import pymysql

from airflow_sync_provider.core.endpoints import MySQLEndpoint
from airflow_sync_provider.core.planning import Plan, Shard
from airflow_sync_provider.core.sql import mysql_ident
from airflow_sync_provider.core.target_shards import SPLIT_WEIGHT_COLUMN, mysql_weight_sql
from airflow_sync_provider.core.typemap import ColumnMapping, MySQLColumn, raw_converter


def connect(endpoint: MySQLEndpoint):
    """A pymysql connection for metadata and planning queries."""
    conn = pymysql.connect(**endpoint.connect_args(), autocommit=True)
    with conn.cursor() as cur:
        cur.execute("SET time_zone = '+00:00'")
    return conn


def stream_connect(endpoint: MySQLEndpoint):
    """A mysqlclient connection with an unbuffered cursor and no value conversions, for bulk rows.

    mysqlclient (the C driver the MySQL provider already depends on) fetches rows about 3x
    faster than pymysql; without its per-value conversions (``conv={}``) the values stay text
    and Arrow casts whole columns. Rows are streamed, never held in memory.
    """
    conn = MySQLdb.connect(**endpoint.connect_args(), cursorclass=MySQLdb.cursors.SSCursor, autocommit=True,
                           conv={})
    cur = conn.cursor()
    cur.execute("SET time_zone = '+00:00'")  # TIMESTAMP values come back as UTC instants
    cur.close()
    return conn


def arrow_schema(mappings: list[ColumnMapping]) -> pa.Schema:
    return pa.schema([pa.field(m.name, m.arrow_type, nullable=m.source.nullable) for m in mappings])


def select_sql(mapping: ColumnMapping) -> str:
    """How a column is selected. FLOAT is widened to DOUBLE: MariaDB's text protocol prints FLOAT
    with 6 significant digits (123456792 → 1.23457e8), DOUBLE exactly (shortest round trip)."""
    col = mysql_ident(mapping.name)
    return f"{col} + 0e0" if mapping.source.data_type == "float" else col


# The split column's collation weight, read along when the split column is a collated string.
WEIGHT_MAPPING = ColumnMapping(MySQLColumn(SPLIT_WEIGHT_COLUMN, "varbinary", "varbinary", False), "String", pa.binary())


def read_shard(endpoint: MySQLEndpoint, plan: Plan, mappings: list[ColumnMapping], shard: Shard,
               fetch_rows: int, weight: MySQLColumn | None = None) -> Iterator[pa.RecordBatch]:
    """The shard's rows through the plan's split index (FORCE INDEX: range access), ``fetch_rows``
    at a time from an unbuffered cursor, so memory stays bounded whatever the shard's size.
    With ``weight`` (a collated split column) each row also carries its weight (WEIGHT_MAPPING)."""
    columns = ", ".join(select_sql(m) for m in mappings)
    if weight is not None:
        columns += f", COALESCE({mysql_weight_sql(weight)}, '')"
        mappings = [*mappings, WEIGHT_MAPPING]
    schema = arrow_schema(mappings)
    converters = [raw_converter(m) for m in mappings]
    sql = f"SELECT {columns} {plan.from_clause()} WHERE {shard.where}"
    conn = stream_connect(endpoint)
    try:
        cur = conn.cursor()
        cur.execute(sql, shard.params)
        while rows := cur.fetchmany(fetch_rows):
            yield _to_batch(rows, mappings, converters, schema, f"table {plan.database}.{plan.table}, shard {shard.id}")
    finally:
        conn.close()


# ClickHouse's Date32 / DateTime64 range; MySQL's is wider, and ClickHouse would clamp silently.
_CH_MIN, _CH_MAX = dt.datetime(1900, 1, 1), dt.datetime(2299, 12, 31, 23, 59, 59, 999999)


def _check(array: pa.Array, mapping: ColumnMapping, where: str) -> None:
    """Refuse values the target would store wrongly, naming the column (never a silent change)."""
    if array.null_count and not mapping.source.nullable:
        raise ValueError(
            f"{where}, column {mapping.name!r}: {array.null_count} NULL values read from a NOT NULL "
            f"{mapping.source.column_type} column — MySQL zero or invalid dates ('0000-00-00', '2025-00-10') "
            "read as NULL and have no ClickHouse equivalent; fix those rows or load through a view that maps them")
    if mapping.source.data_type in ("date", "datetime", "timestamp") and len(array) > array.null_count:
        lo, hi = pc.min_max(array).values()
        lo, hi = lo.as_py(), hi.as_py()
        if not isinstance(lo, dt.datetime):
            lo, hi = dt.datetime.combine(lo, dt.time()), dt.datetime.combine(hi, dt.time())
        if lo < _CH_MIN or hi > _CH_MAX:
            raise ValueError(f"{where}, column {mapping.name!r}: values from {lo} to {hi} fall outside ClickHouse's "
                             f"{mapping.ch_type} range (1900-01-01 … 2299-12-31)")


def _parse_temporal(values, mapping: ColumnMapping) -> pa.Array:
    """Slow path for a batch Arrow could not cast: zero/invalid dates become NULL (as drivers do)."""
    parse = dt.date.fromisoformat if mapping.source.data_type == "date" else dt.datetime.fromisoformat
    out = []
    for v in values:
        try:
            out.append(None if v is None else parse(v.decode() if isinstance(v, bytes) else v))
        except ValueError:
            out.append(None)
    return pa.array(out, type=mapping.arrow_type)


def _column(values, mapping: ColumnMapping, convert, where: str) -> pa.Array:
    target = mapping.arrow_type
    try:
        if convert is not None:
            return pa.array([convert(v) for v in values], type=target)
        raw = pa.array(values)  # str → string, bytes → binary, all None → null
        if raw.type == target:
            return raw
        if pa.types.is_binary(raw.type) and not pa.types.is_binary(target):
            raw = raw.cast(pa.string())  # validates UTF-8
        try:
            return raw.cast(target)
        except pa.ArrowInvalid:
            if mapping.source.data_type in ("date", "datetime", "timestamp"):
                return _parse_temporal(values, mapping)
            raise
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, ValueError) as exc:
        raise ValueError(f"{where}, column {mapping.name!r}: value does not fit {mapping.ch_type}: {exc}") from exc


def _to_batch(rows, mappings, converters, schema, where: str) -> pa.RecordBatch:
    arrays = []
    for values, mapping, convert in zip(zip(*rows), mappings, converters):
        array = _column(values, mapping, convert, where)
        _check(array, mapping, where)
        arrays.append(array)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)

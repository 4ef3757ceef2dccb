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
from airflow_sync_provider.core.typemap import ColumnMapping, python_converter


def connect(endpoint: MySQLEndpoint):
    """A pymysql connection for metadata and planning queries."""
    conn = pymysql.connect(**endpoint.connect_args(), autocommit=True)
    with conn.cursor() as cur:
        cur.execute("SET time_zone = '+00:00'")
    return conn


def stream_connect(endpoint: MySQLEndpoint):
    """A mysqlclient connection with an unbuffered cursor, for bulk rows.

    mysqlclient (the C driver the MySQL provider already depends on) decodes rows about
    3x faster than pymysql (300k orders rows: 0.95 s vs 2.95 s here); rows are streamed,
    never held in memory.
    """
    conn = MySQLdb.connect(**endpoint.connect_args(), cursorclass=MySQLdb.cursors.SSCursor, autocommit=True)
    cur = conn.cursor()
    cur.execute("SET time_zone = '+00:00'")  # TIMESTAMP values come back as UTC instants
    cur.close()
    return conn


def arrow_schema(mappings: list[ColumnMapping]) -> pa.Schema:
    return pa.schema([pa.field(m.name, m.arrow_type, nullable=m.source.nullable) for m in mappings])


def read_shard(endpoint: MySQLEndpoint, plan: Plan, mappings: list[ColumnMapping], shard: Shard,
               fetch_rows: int) -> Iterator[pa.RecordBatch]:
    """The shard's rows through the plan's split index (FORCE INDEX: range access), ``fetch_rows``
    at a time from an unbuffered cursor, so memory stays bounded whatever the shard's size."""
    schema = arrow_schema(mappings)
    converters = [python_converter(m) for m in mappings]
    columns = ", ".join(mysql_ident(m.name) for m in mappings)
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


def _to_batch(rows, mappings, converters, schema, where: str) -> pa.RecordBatch:
    arrays = []
    for i, (mapping, convert) in enumerate(zip(mappings, converters)):
        values = [row[i] for row in rows]
        if convert is not None:
            values = [convert(v) for v in values]
        try:
            array = pa.array(values, type=mapping.arrow_type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
            raise ValueError(f"{where}, column {mapping.name!r}: value does not fit {mapping.ch_type}: {exc}") from exc
        _check(array, mapping, where)
        arrays.append(array)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)

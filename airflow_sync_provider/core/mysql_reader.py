"""Stream one shard of a MySQL table as Arrow record batches, in bounded memory."""

from __future__ import annotations

from collections.abc import Iterator

import MySQLdb
import MySQLdb.cursors
import pyarrow as pa
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


def _to_batch(rows, mappings, converters, schema, where: str) -> pa.RecordBatch:
    arrays = []
    for i, (mapping, convert) in enumerate(zip(mappings, converters)):
        values = [row[i] for row in rows]
        if convert is not None:
            values = [convert(v) for v in values]
        try:
            arrays.append(pa.array(values, type=mapping.arrow_type))
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
            raise ValueError(f"{where}, column {mapping.name!r}: value does not fit {mapping.ch_type}: {exc}") from exc
    return pa.RecordBatch.from_arrays(arrays, schema=schema)

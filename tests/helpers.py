"""Row-for-row comparison of a MySQL table with its ClickHouse copy (FINAL).

Source values are brought to the documented target representation here, independently of
the code under test (BIT → integer, TIME → text, binary strings compared as bytes, zero and
invalid dates — which pymysql returns as text — NULL).
"""

from __future__ import annotations

import datetime as dt
from collections import Counter

from airflow_sync_provider.core.clickhouse.columns import VERSION_COLUMN
from airflow_sync_provider.core.selection import TableSet
from airflow_sync_provider.core.source.group import one_server
from airflow_sync_provider.core.source.schema import read_table_schema
from airflow_sync_provider.core.sql import ch_ident, ch_table, mysql_ident, mysql_table

BINARY_TYPES = {"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob",
                # spatial values: MySQL's own bytes (SRID + WKB), which the copy holds
                "geometry", "point", "linestring", "polygon", "multipoint", "multilinestring", "multipolygon",
                "geometrycollection", "geomcollection"}


def _time_text(value: dt.timedelta) -> str:
    micros = value.days * 86_400_000_000 + value.seconds * 1_000_000 + value.microseconds
    sign, micros = ("-" if micros < 0 else ""), abs(micros)
    h, rest = divmod(micros, 3_600_000_000)
    m, rest = divmod(rest, 60_000_000)
    s, us = divmod(rest, 1_000_000)
    return f"{sign}{h:02d}:{m:02d}:{s:02d}" + (f".{us:06d}" if us else "")


def _normalise(value, data_type: str):
    if value is None:
        return None
    if data_type == "bit":
        return int.from_bytes(value, "big")
    if data_type == "time":
        return _time_text(value)
    if data_type in ("date", "datetime", "timestamp") and isinstance(value, str):
        return None
    if data_type in BINARY_TYPES and isinstance(value, str):
        return value.encode()
    return value


def _keyed(rows, schema):
    """Rows by primary key; without one, by the whole row with a duplicate counter (a multiset)."""
    names = [c.name for c in schema.columns]
    if not schema.primary_key:
        return Counter(tuple(r) for r in rows)
    key = [names.index(k) for k in schema.primary_key]
    return {tuple(r[i] for i in key): tuple(r) for r in rows}


# Types whose values pymysql and mysqlclient return alike (and _normalise leaves alone): a large
# table of only these is read through mysqlclient's C parser, about five times faster than pymysql
# (a 1M-row table: 10.6 s -> 3.5 s); anything else keeps the one reader every small table uses.
_PLAIN = {"tinyint", "smallint", "mediumint", "int", "bigint", "decimal", "double", "float", "char", "varchar",
          "tinytext", "text", "mediumtext", "longtext", "date", "datetime", "timestamp"}
LARGE = 50_000  # rows (the server's estimate)
_DATES = {"date", "datetime", "timestamp"}


def _fetch(conn, database: str, table: str, schema, selected: str) -> list:
    with conn.cursor() as cur:
        cur.execute("SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
                    (database, table))
        estimate = (cur.fetchone() or (0,))[0] or 0
    query = f"SELECT {selected} FROM {mysql_table(database, table)}"
    if estimate < LARGE or conn.ssl or conn.unix_socket or any(c.data_type not in _PLAIN for c in schema.columns):
        with conn.cursor() as cur:
            cur.execute("SET time_zone = '+00:00'")
            cur.execute(query)
            return cur.fetchall()
    import MySQLdb

    text = lambda v: v.decode() if isinstance(v, bytes) else v  # noqa: E731 (pymysql keeps some as bytes)
    fast = MySQLdb.connect(host=conn.host, port=conn.port, user=text(conn.user), password=text(conn.password),
                           charset="utf8mb4", autocommit=True)
    try:
        cur = fast.cursor()
        cur.execute("SET time_zone = '+00:00'")
        cur.execute(query)
        return cur.fetchall()
    finally:
        fast.close()


def source_rows(conn, database: str, table: str) -> dict:
    schema = read_table_schema(conn, database, table)
    # FLOAT as DOUBLE: the text protocol prints FLOAT with 6 significant digits only
    selected = ", ".join(mysql_ident(c.name) + (" + 0e0" if c.data_type == "float" else "") for c in schema.columns)
    rows = _fetch(conn, database, table, schema, selected)
    types = [c.data_type for c in schema.columns]
    # of the plain types, _normalise changes only zero dates (pymysql gives them as text)
    if any(t not in _PLAIN or (t in _DATES and any(isinstance(r[i], str) for r in rows)) for i, t in enumerate(types)):
        rows = [tuple(_normalise(v, t) for v, t in zip(r, types)) for r in rows]
    return _keyed(rows, schema)


def target_rows(ch, conn, database: str, table: str, target_database: str | None = None) -> dict:
    schema = read_table_schema(conn, database, table)
    names = ", ".join(ch_ident(c.name) for c in schema.columns)
    copy = ch_table(target_database or database, table)
    formats = {c.name: "bytes" for c in schema.columns if c.data_type in BINARY_TYPES}
    if not schema.primary_key and "_sign" in {r[0] for r in ch.query(f"DESCRIBE {copy}").result_rows}:
        # a multiset copy (docs/keyless-tables.md): each distinct row as often as its signs add up to
        counts = ch.query(f"SELECT {names}, sum(_sign) FROM {copy} FINAL GROUP BY {names} HAVING sum(_sign) != 0",
                          column_formats=formats).result_rows
        negative = [r for r in counts if r[-1] < 0]
        assert not negative, f"{table}: occurrences counted below zero: {negative[:3]}"
        return Counter(tuple(r[:-1]) for r in counts for _ in range(r[-1]))
    result = ch.query(
        f"SELECT {names} FROM {copy}{' FINAL' if schema.primary_key else ''}", column_formats=formats)
    assert VERSION_COLUMN not in result.column_names
    return _keyed(result.result_rows, schema)


def _short(row) -> str:
    return repr(tuple(v[:40] + "…" if isinstance(v, str) and len(v) > 40 else v for v in row))


def assert_same_rows(conn, ch, database: str, table: str, target_database: str | None = None) -> int:
    source = source_rows(conn, database, table)
    target = target_rows(ch, conn, database, table, target_database)
    if source == target:  # compared in C; only a difference is looked at row by row
        return sum(source.values()) if isinstance(source, Counter) else len(source)
    missing = source.keys() - target.keys()
    extra = target.keys() - source.keys()
    assert not missing and not extra, f"{table}: {len(missing)} missing keys, {len(extra)} extra keys"
    changed = [k for k in source if source[k] != target[k]]
    assert not changed, (f"{table}: {len(changed)} rows differ, e.g.\n{_short(source[changed[0]])} !=\n"
                         f"{_short(target[changed[0]])}")
    return sum(source.values()) if isinstance(source, Counter) else len(source)


def assert_merged_rows(conns: dict, ch, merged: str, members: list[tuple[str, str, str]]) -> int:
    """A merged copy (core/source/group.py) FINAL equals the union of its ``members``' rows
    ((source, database, table); ``conns``: a connection per source), each with its source
    columns and NULL in the columns its table lacks, row for row."""
    database, table = merged.split(".", 1)
    internal = {"_version", "_deleted", "_split_weight"}
    sources = ("_source", "_source_database", "_source_table")
    # (not the columns ClickHouse derives for queries: MATERIALIZED)
    columns = [n for n, _ in ch.query("SELECT name, type FROM system.columns WHERE database = {d:String} AND "
                                      "table = {t:String} AND default_kind != 'MATERIALIZED' ORDER BY position",
                                      parameters={"d": database, "t": table}).result_rows
               if n not in internal and n not in sources]
    expected, key = {}, None
    for source, db, name in members:
        schema = read_table_schema(conns[source], db, name)
        key = [columns.index(k) for k in schema.primary_key]
        for row in source_rows(conns[source], db, name).values():
            values = dict(zip([c.name for c in schema.columns], row))
            merged_row = tuple(values.get(c) for c in columns) + (source, db, name)
            expected[tuple(merged_row[i] for i in key) + (source, db, name)] = merged_row
    binary = _binary_columns(conns, members) & set(columns)
    result = ch.query(f"SELECT {', '.join(ch_ident(c) for c in [*columns, *sources])} FROM {ch_table(database, table)} "
                      "FINAL", column_formats={c: "bytes" for c in binary})
    actual = {tuple(r[i] for i in key) + tuple(r[-3:]): tuple(r) for r in result.result_rows}
    missing, extra = expected.keys() - actual.keys(), actual.keys() - expected.keys()
    assert not missing and not extra, (f"{merged}: {len(missing)} missing keys (e.g. {sorted(missing)[:3]}), "
                                       f"{len(extra)} extra keys (e.g. {sorted(extra)[:3]})")
    changed = [k for k in expected if expected[k] != actual[k]]
    assert not changed, (f"{merged}: {len(changed)} rows differ, e.g.\n{_short(expected[changed[0]])} !=\n"
                         f"{_short(actual[changed[0]])}")
    return len(expected)


def _binary_columns(conns: dict, members) -> set[str]:
    return {c.name for source, db, name in members for c in read_table_schema(conns[source], db, name).columns
            if c.data_type in BINARY_TYPES}


def run_sql(conn, *statements) -> None:
    with conn.cursor() as cur:
        for statement in statements:
            cur.execute(statement)


def recreate_tables(conn, database: str, *ddls: str) -> None:
    """Create ``database`` if missing and (re)create each ``CREATE TABLE database.name (…)``."""
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE IF NOT EXISTS {database}")
        for ddl in ddls:
            name = ddl.split("(")[0].split(".")[-1].strip()
            cur.execute(f"DROP TABLE IF EXISTS {database}.{name}")
            cur.execute(ddl)


def bootstrap_tables(endpoints, spark, pipeline: str, database: str, target: str, *tables: str, **kwargs):
    """A CDC bootstrap of ``database``'s ``tables`` into ``target`` (two channels)."""
    from airflow_sync_provider.core.jobspec import CdcBootstrapSpec
    from airflow_sync_provider.spark.cdc_bootstrap import run_cdc_bootstrap

    return run_cdc_bootstrap(CdcBootstrapSpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline=pipeline,
                                              channels=kwargs.pop("channels", 2),
                                              tableset=TableSet(tables=[{"source_database": database,
                                                                         "source_table": t,
                                                                         "target_database": target} for t in tables]),
                                              **kwargs), spark)


def in_background(run) -> tuple:
    """``run()`` started in a thread of its own (a CDC service under test): (thread, its result
    dict, the exceptions it raised), for the test to join and assert on."""
    import threading

    result, errors = {}, []

    def serve():
        try:
            result.update(run())
        except Exception as exc:  # reported by the test
            errors.append(exc)

    thread = threading.Thread(target=serve)
    thread.start()
    return thread, result, errors


def stop_service(ch, pipeline: str, thread, past=None, timeout: float = 120) -> None:
    """Ask a service under test to stop (what `airflow-sync cdc stop` does) once every table of its
    pipeline is durable ``past`` a BinlogPosition, and wait for it: a test whose work is done does
    not sit out the service's ``max_seconds`` (which stays the bound, should this never happen)."""
    import time

    from airflow_sync_provider.core.cdc.checkpoints import Checkpoints

    checkpoints, deadline = Checkpoints(ch), time.monotonic() + timeout
    checkpoints.ensure()  # the service may not have made the ledger yet
    while thread.is_alive() and time.monotonic() < deadline:
        position = checkpoints.position(pipeline)
        if (past is None or (position is not None and position.key() >= past.key())) \
                and checkpoints.request_stop(pipeline, "the test is done") is not None:
            break
        time.sleep(0.2)
    thread.join()

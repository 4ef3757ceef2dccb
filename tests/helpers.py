"""Row-for-row comparison of a MySQL table with its ClickHouse copy (FINAL)."""

from __future__ import annotations

from airflow_sync_provider.core.clickhouse_target import VERSION_COLUMN
from airflow_sync_provider.core.mysql_schema import read_table_schema
from airflow_sync_provider.core.sql import ch_ident, ch_table, mysql_ident, mysql_table


def source_rows(conn, database: str, table: str) -> dict:
    schema = read_table_schema(conn, database, table)
    names = [c.name for c in schema.columns]
    key = [names.index(k) for k in schema.primary_key] or list(range(len(names)))
    with conn.cursor() as cur:
        cur.execute("SET time_zone = '+00:00'")
        cur.execute(f"SELECT {', '.join(mysql_ident(n) for n in names)} FROM {mysql_table(database, table)}")
        rows = cur.fetchall()
    return {tuple(r[i] for i in key): tuple(r) for r in rows}


def target_rows(ch, conn, database: str, table: str, target_database: str | None = None) -> dict:
    schema = read_table_schema(conn, database, table)
    names = [c.name for c in schema.columns]
    key = [names.index(k) for k in schema.primary_key] or list(range(len(names)))
    result = ch.query(f"SELECT {', '.join(ch_ident(n) for n in names)} "
                      f"FROM {ch_table(target_database or database, table)} FINAL")
    assert VERSION_COLUMN not in result.column_names
    return {tuple(r[i] for i in key): tuple(r) for r in result.result_rows}


def assert_same_rows(conn, ch, database: str, table: str, target_database: str | None = None) -> int:
    source = source_rows(conn, database, table)
    target = target_rows(ch, conn, database, table, target_database)
    missing = source.keys() - target.keys()
    extra = target.keys() - source.keys()
    assert not missing and not extra, f"{table}: {len(missing)} missing keys, {len(extra)} extra keys"
    changed = [k for k in source if source[k] != target[k]]
    assert not changed, f"{table}: {len(changed)} rows differ, e.g. {source[changed[0]]} != {target[changed[0]]}"
    return len(source)

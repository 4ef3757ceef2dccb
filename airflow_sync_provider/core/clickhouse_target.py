"""Target-side DDL and publishing on ClickHouse (clickhouse-connect client)."""

from __future__ import annotations

import clickhouse_connect

from airflow_sync_provider.core.endpoints import ClickHouseEndpoint
from airflow_sync_provider.core.mysql_schema import TableSchema
from airflow_sync_provider.core.sql import ch_ident, ch_table

VERSION_COLUMN = "_version"


def client(endpoint: ClickHouseEndpoint, **kwargs):
    return clickhouse_connect.get_client(**endpoint.client_args(), **kwargs)


def create_table_sql(schema: TableSchema, database: str, table: str) -> str:
    """ReplacingMergeTree keyed by the primary key, versioned so re-loads replace old rows.

    A table without a primary key gets a plain MergeTree: ReplacingMergeTree with an empty
    sorting key would collapse every row into one.
    """
    cols = [f"{ch_ident(m.name)} {m.ch_type}" for m in schema.mappings()]
    cols.append(f"{ch_ident(VERSION_COLUMN)} UInt64 DEFAULT 0")
    if schema.primary_key:
        engine = f"ReplacingMergeTree({ch_ident(VERSION_COLUMN)})"
        order = "(" + ", ".join(ch_ident(c) for c in schema.primary_key) + ")"
    else:
        engine, order = "MergeTree", "tuple()"
    return (f"CREATE TABLE {ch_table(database, table)} (\n  " + ",\n  ".join(cols)
            + f"\n) ENGINE = {engine} ORDER BY {order}")


def shadow_name(table: str) -> str:
    return f"{table}__shadow"


def table_exists(ch, database: str, table: str) -> bool:
    return bool(ch.command("EXISTS TABLE " + ch_table(database, table)))


def publish_shadow(ch, database: str, table: str) -> None:
    """Swap the fully loaded shadow table in: readers see the old or the new table, never half."""
    shadow = shadow_name(table)
    if table_exists(ch, database, table):
        ch.command(f"EXCHANGE TABLES {ch_table(database, shadow)} AND {ch_table(database, table)}")
        ch.command(f"DROP TABLE {ch_table(database, shadow)}")
    else:
        ch.command(f"RENAME TABLE {ch_table(database, shadow)} TO {ch_table(database, table)}")

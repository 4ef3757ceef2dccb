"""Target-side DDL and publishing on ClickHouse (clickhouse-connect client)."""

from __future__ import annotations

import hashlib

import clickhouse_connect

from airflow_sync_provider.core.endpoints import ClickHouseEndpoint
from airflow_sync_provider.core.mysql_schema import TableSchema
from airflow_sync_provider.core.sql import ch_ident, ch_string, ch_table
from airflow_sync_provider.core.target_shards import SPLIT_WEIGHT_COLUMN

VERSION_COLUMN = "_version"
SHARD_COLUMN = "_shard"
DELETED_COLUMN = "_deleted"
# Columns the target tables use for themselves (and ClickHouse's _partition_id, which period
# reconciliation reads): a source column of the same name would collide with them.
INTERNAL_COLUMNS = (VERSION_COLUMN, DELETED_COLUMN, SPLIT_WEIGHT_COLUMN, SHARD_COLUMN, "_partition_id")


class ReservedColumn(ValueError):
    pass


def check_columns(schema: TableSchema) -> None:
    """Refuse source columns named like the target's internal columns, before any work is done."""
    clash = [c.name for c in schema.columns if c.name in INTERNAL_COLUMNS]
    if clash:
        keyed = [c for c in clash if c in schema.primary_key]
        remedy = ("load through a view that renames them (key columns cannot be left out)" if keyed else
                  f"leave them out (exclude_columns={clash!r} / --exclude-column) or load through a view that "
                  "renames them")
        raise ReservedColumn(f"table {schema.qualified}: column(s) {clash} have the names of the target's internal "
                             f"columns {list(INTERNAL_COLUMNS)}; {remedy}")
# Writing the hidden weight column (MATERIALIZED: not in SELECT *, '' when a writer omits it).
WEIGHT_SETTINGS = {"insert_allow_materialized_columns": 1}


def client(endpoint: ClickHouseEndpoint, **kwargs):
    return clickhouse_connect.get_client(**endpoint.client_args(), **kwargs)


def _columns(schema: TableSchema) -> list[str]:
    return [f"{ch_ident(m.name)} {m.ch_type}" for m in schema.mappings()]


def _weight(weight: bool, hidden: bool) -> list[str]:
    """The split column's collation weight (core/target_shards.py), for tables split on a collated string."""
    if not weight:
        return []
    return [f"{ch_ident(SPLIT_WEIGHT_COLUMN)} String" + (" MATERIALIZED ''" if hidden else "")]


def _order_by(schema: TableSchema) -> str:
    return "(" + ", ".join(ch_ident(c) for c in schema.primary_key) + ")" if schema.primary_key else "tuple()"


def create_table_sql(schema: TableSchema, database: str, table: str, partition_by: str | None = None,
                     weight: bool = False) -> str:
    """ReplacingMergeTree keyed by the primary key, versioned so re-loads replace old rows.

    A table without a primary key gets a plain MergeTree: ReplacingMergeTree with an empty
    sorting key would collapse every row into one. ``partition_by`` is a ClickHouse expression
    (e.g. ``toYYYYMMDD(created_at)``) for period-scoped loads. ``weight``: the table is loaded
    split on a collated string and keeps each row's weight, hidden.
    """
    cols = _columns(schema) + [f"{ch_ident(VERSION_COLUMN)} UInt64 DEFAULT 0"] + _weight(weight, hidden=True)
    engine = f"ReplacingMergeTree({ch_ident(VERSION_COLUMN)})" if schema.primary_key else "MergeTree"
    partition = f" PARTITION BY {partition_by}" if partition_by else ""
    return (f"CREATE TABLE {ch_table(database, table)} (\n  " + ",\n  ".join(cols)
            + f"\n) ENGINE = {engine}{partition} ORDER BY {_order_by(schema)}")


def create_parts_sql(schema: TableSchema, database: str, table: str, weight: bool = False) -> str:
    """A load's working table: one partition per shard, so re-reading a shard first drops
    exactly what its earlier attempts wrote (no duplicates, no mutations)."""
    cols = (_columns(schema) + _weight(weight, hidden=False)
            + [f"{ch_ident(VERSION_COLUMN)} UInt64", f"{ch_ident(SHARD_COLUMN)} UInt32"])
    return (f"CREATE TABLE IF NOT EXISTS {ch_table(database, table)} (\n  " + ",\n  ".join(cols)
            + f"\n) ENGINE = MergeTree PARTITION BY {ch_ident(SHARD_COLUMN)} ORDER BY {_order_by(schema)}")


def parts_table_name(load_key: str, generation: int) -> str:
    return "parts_" + hashlib.sha1(f"{load_key}\0{generation}".encode()).hexdigest()[:16]


def drop_shard(ch, database: str, parts: str, shard_id: int) -> None:
    ch.command(f"ALTER TABLE {ch_table(database, parts)} DROP PARTITION ID {ch_string(str(shard_id))}")


def table_exists(ch, database: str, table: str) -> bool:
    return bool(ch.command("EXISTS TABLE " + ch_table(database, table)))


def copy_parts(ch, schema: TableSchema, parts: str, parts_db: str, database: str, table: str,
               weight: bool = False) -> None:
    """Server-side copy of the loaded rows (without the shard column) into ``table``."""
    names = [m.name for m in schema.mappings()] + [VERSION_COLUMN] + ([SPLIT_WEIGHT_COLUMN] if weight else [])
    names = ", ".join(ch_ident(n) for n in names)
    ch.command(f"INSERT INTO {ch_table(database, table)} ({names}) SELECT {names} FROM {ch_table(parts_db, parts)}",
               settings=WEIGHT_SETTINGS if weight else None)


def publish_full(ch, schema: TableSchema, parts: str, parts_db: str, database: str, table: str,
                 weight: bool = False) -> int:
    """Copy into a shadow table and swap it in: readers see the old or the new table, never half."""
    shadow = f"{table}__shadow"
    ch.command(f"CREATE DATABASE IF NOT EXISTS {ch_ident(database)}")
    ch.command(f"DROP TABLE IF EXISTS {ch_table(database, shadow)}")
    ch.command(create_table_sql(schema, database, shadow, weight=weight))
    copy_parts(ch, schema, parts, parts_db, database, shadow, weight)
    rows = int(ch.command(f"SELECT count() FROM {ch_table(database, shadow)}"))
    if table_exists(ch, database, table):
        ch.command(f"EXCHANGE TABLES {ch_table(database, shadow)} AND {ch_table(database, table)}")
        ch.command(f"DROP TABLE {ch_table(database, shadow)}")
    else:
        ch.command(f"RENAME TABLE {ch_table(database, shadow)} TO {ch_table(database, table)}")
    return rows


def publish_partitions(ch, schema: TableSchema, parts: str, parts_db: str, database: str, table: str,
                       partition_by: str, partitions: list[str], weight: bool = False) -> int:
    """Replace exactly ``partitions`` of ``table`` with the loaded rows (each partition atomically).

    Loaded rows outside those partitions mean the period filter and the partitions disagree:
    nothing is published then. A partition with no loaded rows is dropped (the period is empty).
    """
    stage = f"{table}__stage"
    ch.command(f"CREATE DATABASE IF NOT EXISTS {ch_ident(database)}")
    if not table_exists(ch, database, table):
        ch.command(create_table_sql(schema, database, table, partition_by, weight))
    elif weight:  # REPLACE PARTITION needs the same columns on both sides
        ch.command(f"ALTER TABLE {ch_table(database, table)} ADD COLUMN IF NOT EXISTS {_weight(True, True)[0]}")
    ch.command(f"DROP TABLE IF EXISTS {ch_table(database, stage)}")
    ch.command(create_table_sql(schema, database, stage, partition_by, weight))
    copy_parts(ch, schema, parts, parts_db, database, stage, weight)
    present = {r[0]: r[1] for r in ch.query(
        f"SELECT _partition_id, count() FROM {ch_table(database, stage)} GROUP BY _partition_id").result_rows}
    outside = sorted(set(present) - set(partitions))
    if outside:
        ch.command(f"DROP TABLE {ch_table(database, stage)}")
        raise ValueError(f"table {database}.{table}: the loaded rows fall in partitions {outside} (by {partition_by}) "
                         f"outside replace_partitions {partitions}; the where filter and the partitions disagree")
    for partition in partitions:
        pid = ch_string(partition)
        if partition in present:
            ch.command(f"ALTER TABLE {ch_table(database, table)} REPLACE PARTITION ID {pid} FROM {ch_table(database, stage)}")
        else:
            ch.command(f"ALTER TABLE {ch_table(database, table)} DROP PARTITION ID {pid}")
    ch.command(f"DROP TABLE {ch_table(database, stage)}")
    return sum(present.values())


def publish_repair(ch, schema: TableSchema, parts: str, parts_db: str, database: str, table: str,
                   predicates: list[tuple[str, dict]], version: int, weight: bool = False) -> int:
    """Replace some shards of a published table in place (re-import after a reconciliation).

    The shards' rows, re-read with a newer ``version``, are inserted first: ReplacingMergeTree
    keeps the newest version of a key, so a ``FINAL`` reader sees the source's values at once
    and never misses a row. Then the shards' older rows are deleted (lightweight ``DELETE``):
    superseded versions and rows the source no longer has. ``predicates`` are the shards on the
    target (core/target_shards.py); their parameters agree where their names do.

    Idempotent, so a repair resumed after a crash duplicates nothing: ``version`` is this
    repair's own, so rows carrying it were copied by an earlier attempt. All of them: skip the
    copy; some (an ``INSERT … SELECT`` is not atomic): drop them first — the older versions are
    still there then, because the delete only runs after a complete copy.
    """
    final, version_column = ch_table(database, table), ch_ident(VERSION_COLUMN)
    rows = int(ch.command(f"SELECT count() FROM {ch_table(parts_db, parts)}"))
    mine = {"repair_version": version}
    copied = int(ch.command(f"SELECT count() FROM {final} WHERE {version_column} = {{repair_version:UInt64}}",
                            parameters=mine))
    if copied and copied != rows:
        ch.command(f"DELETE FROM {final} WHERE {version_column} = {{repair_version:UInt64}}", parameters=mine)
    if copied != rows:
        copy_parts(ch, schema, parts, parts_db, database, table, weight)
    params = {k: v for _, p in predicates for k, v in p.items()} | mine
    shards = " OR ".join(f"({where})" for where, _ in predicates)
    ch.command(f"DELETE FROM {final} WHERE ({shards}) AND {version_column} < {{repair_version:UInt64}}",
               parameters=params)
    return rows

"""Creating copies and a load's working tables: their CREATE TABLE (engine, columns, layout,
comment) and names."""

from __future__ import annotations

import hashlib

from clickhouse_connect.driver.exceptions import DatabaseError

from airflow_sync_provider.core.clickhouse import ttl
from airflow_sync_provider.core.clickhouse.columns import (
    DELETED_COLUMN,
    ORDINAL_COLUMN,
    SHARD_COLUMN,
    SIGN_COLUMN,
    TABLE_COMMENT,
    VERSION_COLUMN,
)
from airflow_sync_provider.core.clickhouse.derived import derived_columns
from airflow_sync_provider.core.clickhouse.described import working_marker
from airflow_sync_provider.core.clickhouse.layout import MIRROR, Layout, layout_comment
from airflow_sync_provider.core.content import shaping
from airflow_sync_provider.core.content.shaping import DELETED_AT_SOURCE
from airflow_sync_provider.core.source.schema import TableSchema
from airflow_sync_provider.core.source.weights import SPLIT_WEIGHT_COLUMN
from airflow_sync_provider.core.sql import ch_ident, ch_string, ch_table


def _columns(schema: TableSchema) -> list[str]:
    return [f"{ch_ident(m.name)} {m.ch_type}" for m in schema.mappings()]


def weight_columns(weight: bool, hidden: bool) -> list[str]:
    """The split column's collation weight (core/clickhouse/shards.py), for tables split on a collated string."""
    if not weight:
        return []
    return [f"{ch_ident(SPLIT_WEIGHT_COLUMN)} String" + (" MATERIALIZED ''" if hidden else "")]


def _order_by(schema: TableSchema) -> str:
    return "(" + ", ".join(ch_ident(c) for c in schema.target_key) + ")" if schema.primary_key else "tuple()"


def create_table_sql(schema: TableSchema, database: str, table: str, layout: Layout = MIRROR,
                     weight: bool = False, if_not_exists: bool = False, marker: str = "") -> str:
    """ReplacingMergeTree keyed by the primary key, versioned in binlog order
    (core/positions.py), with ``_deleted`` tombstones: ``FINAL`` shows each key's newest
    version and hides deleted keys; an older row arriving late never resurrects one. ``layout``
    (core/clickhouse/layout.py): the sorting key, partitions, TTL, settings and engine the user chose
    (a period load's partitions too); the comment records it with the source key, and the
    schema's content settings (core/content/) with a fingerprint of its salt. A copy that keeps
    deletes has ``_deleted_at_source``: when the source deleted the row (0 while it lives).

    A table without a primary key gets a plain MergeTree: ReplacingMergeTree with an empty
    sorting key would collapse every row into one. ``weight``: the table is loaded split on a
    collated string and keeps each row's weight, hidden. The layout's derived columns (JSON, typed
    geo: core/clickhouse/derived.py) follow the copy's columns, computed by ClickHouse.
    """
    names = [m.name for m in schema.mappings()]
    cols = _table_columns(schema, layout, f"{database}.{table}") + weight_columns(weight, hidden=True)
    if schema.primary_key:
        nullable = tuple(m.name for m in schema.mappings() if m.ch_type.startswith("Nullable("))
        engine = layout.engine_sql(VERSION_COLUMN, DELETED_COLUMN) + layout.clauses(schema.target_key, names, nullable)
    else:
        engine = "MergeTree" + (f" PARTITION BY {layout.partition_by}" if layout.partition_by else "") + \
            " ORDER BY tuple()"
    return _create(schema, ch_table(database, table), cols, engine, layout, marker, if_not_exists)


def create_multiset_sql(schema: TableSchema, database: str, table: str, layout: Layout = MIRROR,
                        marker: str = "") -> str:
    """A table without a primary key followed by CDC: a ReplacingMergeTree of signed occurrences
    (:data:`SIGN_COLUMN`), one row per change told apart by (_version, _ordinal), so a replayed
    change is the same row again (docs/keyless-tables.md). ``marker``: a working table's."""
    cols = _table_columns(schema, layout, f"{database}.{table}") + [
        f"{ch_ident(ORDINAL_COLUMN)} UInt64 DEFAULT 0", f"{ch_ident(SIGN_COLUMN)} Int8 DEFAULT 1"]
    engine = (f"ReplacingMergeTree({ch_ident(VERSION_COLUMN)})"
              + (f" PARTITION BY {layout.partition_by}" if layout.partition_by else "")
              + f" ORDER BY ({ch_ident(VERSION_COLUMN)}, {ch_ident(ORDINAL_COLUMN)})")
    return _create(schema, ch_table(database, table), cols, engine, layout, marker, bool(marker))


def _table_columns(schema: TableSchema, layout: Layout, where: str) -> list[str]:
    """A copy's columns (the layout checked against them): the source's as copied, the derived
    ones, the version and tombstone, and when the source's deletes are kept when each was."""
    layout.check(where, schema.target_key, [m.name for m in schema.mappings()])
    ttl.check_columns(ttl.expiries(layout.ttl, where.split(".", 1)[1]), schema.mappings(), where)
    return (_columns(schema) + [d.ddl() for d in derived_columns(layout, schema.mappings(), where)]
            + [f"{ch_ident(VERSION_COLUMN)} UInt64 DEFAULT 0", f"{ch_ident(DELETED_COLUMN)} UInt8 DEFAULT 0"]
            + ([f"{ch_ident(DELETED_AT_SOURCE)} DateTime('UTC') DEFAULT 0"] if schema.content.keep_deletes else []))


def _create(schema: TableSchema, name: str, cols: list[str], engine: str, layout: Layout, marker: str,
            if_not_exists: bool) -> str:
    """The CREATE TABLE of ``name`` (quoted); its comment records what the copy is (its version
    scheme, layout, content settings) and, for a working table, ``marker``."""
    comment = (TABLE_COMMENT + layout_comment(layout, schema.target_key)
               + shaping.content_comment(schema.content, schema.salt) + marker)
    return (f"CREATE TABLE {'IF NOT EXISTS ' if if_not_exists else ''}{name} (\n  "
            + ",\n  ".join(cols) + f"\n) ENGINE = {engine} COMMENT {ch_string(comment)}")


# A direct working table is not merged while it is filled: merging while rows still arrive
# rewrites the same rows level after level (a source group's members' overlapping keys make each
# of those merges a true k-way merge), and a stand-in target merges on the readers' cores. Its
# merges wait until this many parts are waiting (far below parts_to_delay_insert, 150 before
# ClickHouse 23.6), and the setting is reset when it is published, so the copy then merges as usual.
DEFER_MERGES = {"min_parts_to_merge_at_once": 64}


UNKNOWN_SETTING, ACCESS_DENIED = 115, 497  # ClickHouse error codes


def create_working_sql(schema: TableSchema, database: str, table: str, weight: bool, direct: bool,
                       layout: Layout = MIRROR) -> str:
    """A load's working table. ``direct`` (a full reload): already the final table's layout, so
    publishing is a swap and no copy; a re-read shard first deletes what its earlier attempts
    wrote (by the shard's target predicate, core/clickhouse/shards.py). Otherwise (period loads,
    repairs, split columns ClickHouse cannot compare) the parts layout."""
    if direct:  # the comment names the load's working table: publish_working sees a swap that happened
        return create_table_sql(schema, database, table, layout.holding_ttl(), weight=weight, if_not_exists=True,
                                marker=working_marker(table))
    return create_parts_sql(schema, database, table, weight)


def create_working(ch, schema: TableSchema, database: str, table: str, weight: bool, direct: bool,
                   layout: Layout = MIRROR) -> None:
    """:func:`create_working_sql`; a direct one's merges deferred (DEFER_MERGES) by the same
    privilege that resets them at publish (ALTER MODIFY SETTING): a server that does not know the
    setting (an older ClickHouse) or a user without the privilege gets the table as it is."""
    ch.command(create_working_sql(schema, database, table, weight, direct, layout))
    if not direct:
        return
    try:
        ch.command(f"ALTER TABLE {ch_table(database, table)} MODIFY SETTING "
                   + ", ".join(f"{name} = {int(value)}" for name, value in DEFER_MERGES.items()))
    except DatabaseError as exc:
        if getattr(exc, "code", None) not in (UNKNOWN_SETTING, ACCESS_DENIED):
            raise


def create_parts_sql(schema: TableSchema, database: str, table: str, weight: bool = False) -> str:
    """A load's parts table: one partition per shard, so re-reading a shard first drops
    exactly what its earlier attempts wrote (no duplicates, no mutations)."""
    cols = (_columns(schema) + weight_columns(weight, hidden=False)
            + [f"{ch_ident(VERSION_COLUMN)} UInt64", f"{ch_ident(SHARD_COLUMN)} UInt32"])
    return (f"CREATE TABLE IF NOT EXISTS {ch_table(database, table)} (\n  " + ",\n  ".join(cols)
            + f"\n) ENGINE = MergeTree PARTITION BY {ch_ident(SHARD_COLUMN)} ORDER BY {_order_by(schema)}")


def parts_table_name(load_key: str, generation: int) -> str:
    return "parts_" + hashlib.sha1(f"{load_key}\0{generation}".encode()).hexdigest()[:16]


# ClickHouse keeps a table's metadata in a file named after it (bytes outside [A-Za-z0-9_]
# escaped as %XX), and refuses names whose file would pass the file system's 255 bytes.
_NAME_FILE_BYTES = 64


def file_bytes(name: str) -> int:
    return sum(1 if (c.isascii() and (c.isalnum() or c == "_")) else 3 * len(c.encode()) for c in name)


def drop_working_tables(ch, parts_db: str, parts: str, target_table: str) -> None:
    """A load's working tables: its parts table and its private stage and shadow tables."""
    database, table = target_table.split(".", 1)
    ch.command(f"DROP TABLE IF EXISTS {ch_table(parts_db, parts)}")
    for role in ("stage", "shadow"):
        ch.command(f"DROP TABLE IF EXISTS {ch_table(database, private_name(table, role, parts))}")


def private_name(table: str, role: str, owner: str) -> str:
    """A working table of ``table`` (``role``: stage, shadow) that only ``owner`` uses: its load's
    parts table, so one per load key and generation. Overlapping loads into one table (backfill
    runs, retries) then never drop or fill each other's, and a resumed load finds, and first
    drops, the one it left behind when it crashed. The name starts with ``table`` (cut short
    when long) so a person sees whose it is."""
    prefix = table
    while file_bytes(prefix) > _NAME_FILE_BYTES:
        prefix = prefix[:-1]
    return f"{prefix}__{role}_{hashlib.sha1(owner.encode()).hexdigest()[:12]}"


def drop_shard(ch, database: str, parts: str, shard_id: int) -> None:
    ch.command(f"ALTER TABLE {ch_table(database, parts)} DROP PARTITION ID {ch_string(str(shard_id))}")

"""Publishing a load's rows into its copy: a swap (readers see the old or the new table, never
half), a shadow copy, partitions replaced, and the rows a copy keeps after the source deleted them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from airflow_sync_provider.core.clickhouse.columns import DELETED_COLUMN, VERSION_COLUMN, WEIGHT_SETTINGS
from airflow_sync_provider.core.clickhouse.ddl import DEFER_MERGES, create_table_sql, private_name, weight_columns
from airflow_sync_provider.core.clickhouse.described import (
    check_layout,
    column_types,
    comment_of,
    copy_key,
    swapped_in,
    table_exists,
)
from airflow_sync_provider.core.clickhouse.layout import MIRROR, Layout, LayoutError, check_same, stored
from airflow_sync_provider.core.content.shaping import DELETED_AT_SOURCE
from airflow_sync_provider.core.source.schema import TableSchema
from airflow_sync_provider.core.source.weights import SPLIT_WEIGHT_COLUMN
from airflow_sync_provider.core.sql import ch_ident, ch_string, ch_table


def _merges_resumed(ch, database: str, table: str) -> None:
    """A working table's deferred merges back to the server's default (before it is swapped in)."""
    engine = ch.query("SELECT engine_full FROM system.tables WHERE database = {d:String} AND name = {t:String}",
                      parameters={"d": database, "t": table}).result_rows
    for name in DEFER_MERGES:
        if engine and name in engine[0][0]:
            ch.command(f"ALTER TABLE {ch_table(database, table)} RESET SETTING {name}")


def _ttl_applied(ch, database: str, table: str) -> None:
    """A counted working table's TTL (Layout.holding_ttl) into its DDL, before it is swapped in:
    a change of metadata only; merges delete the expired rows from then on."""
    ttl = stored(comment_of(ch, database, table))[0].ttl
    if ttl:
        ch.command(f"ALTER TABLE {ch_table(database, table)} MODIFY TTL {ttl}",
                   settings={"materialize_ttl_after_modify": 0})


def copy_parts(ch, schema: TableSchema, parts: str, parts_db: str, database: str, table: str,
               weight: bool = False) -> None:
    """Server-side copy of the loaded rows (without the shard column) into ``table``."""
    names = [m.name for m in schema.mappings()] + [VERSION_COLUMN] + ([SPLIT_WEIGHT_COLUMN] if weight else [])
    names = ", ".join(ch_ident(n) for n in names)
    ch.command(f"INSERT INTO {ch_table(database, table)} ({names}) SELECT {names} FROM {ch_table(parts_db, parts)}",
               settings=WEIGHT_SETTINGS if weight else None)


@dataclass(frozen=True)
class Loaded:
    """A load's rows in its parts-layout working table ``parts_db.parts``, to publish into
    ``database.table``: their schema (as copied), and whether they carry the split column's weight."""

    schema: TableSchema
    parts_db: str
    parts: str
    database: str
    table: str
    weight: bool = False
    layout: Layout = MIRROR  # the copy's (core/clickhouse/layout.py)

    def copy_into(self, ch, table: str) -> None:
        """Every loaded row into ``database.table`` (the copy or one of its own shadow tables)."""
        copy_parts(ch, self.schema, self.parts, self.parts_db, self.database, table, self.weight)


def publish_full(ch, loaded: Loaded) -> int:
    """Copy into a shadow table (this load's own) and swap it in: readers see the old or the new
    table, never half."""
    database, table = loaded.database, loaded.table
    shadow = private_name(table, "shadow", loaded.parts)
    ch.command(f"CREATE DATABASE IF NOT EXISTS {ch_ident(database)}")
    ch.command(f"DROP TABLE IF EXISTS {ch_table(database, shadow)}")
    ch.command(create_table_sql(loaded.schema, database, shadow, loaded.layout.holding_ttl(), weight=loaded.weight))
    loaded.copy_into(ch, shadow)
    return _swap_in(ch, database, shadow, database, table)


def _loaded_rows(ch, database: str, table: str, kept: bool | None = None) -> int:
    """A fresh copy's rows as its load wrote them: not the kept rows carried over (:func:`_carry_kept`).
    ``kept``: does the copy keep deletes (None: look)."""
    if kept is None:
        kept = DELETED_AT_SOURCE in column_types(ch, database, table)
    return int(ch.command(f"SELECT count() FROM {ch_table(database, table)}"
                          + (f" WHERE {ch_ident(DELETED_AT_SOURCE)} = 0" if kept else "")))


def _swap_in(ch, source_db: str, source: str, database: str, table: str) -> int:
    """``source`` becomes ``table`` atomically (the old table is dropped); returns its rows."""
    names = list(column_types(ch, source_db, source))
    kept = DELETED_AT_SOURCE in names
    if kept:  # a copy that keeps deletes: nothing it kept is lost to the swap
        _carry_kept(ch, names, source_db, source, database, table)
    rows = _loaded_rows(ch, source_db, source, kept)
    _ttl_applied(ch, source_db, source)
    if table_exists(ch, database, table):
        ch.command(f"EXCHANGE TABLES {ch_table(source_db, source)} AND {ch_table(database, table)}")
        ch.command(f"DROP TABLE {ch_table(source_db, source)}")
    else:
        ch.command(f"RENAME TABLE {ch_table(source_db, source)} TO {ch_table(database, table)}")
    return rows


def publish_working(ch, working_db: str, working: str, database: str, table: str) -> int:
    """Swap a direct working table (final layout) in as ``table``: readers see the old or the new
    table, never half; nothing is copied. Idempotent: after a crash between the swap and the
    drop, the working table holds the *old* copy, and is dropped rather than swapped back."""
    ch.command(f"CREATE DATABASE IF NOT EXISTS {ch_ident(database)}")
    if swapped_in(ch, working_db, working, database, table):
        ch.command(f"DROP TABLE IF EXISTS {ch_table(working_db, working)}")
        return _loaded_rows(ch, database, table)
    _merges_resumed(ch, working_db, working)
    return _swap_in(ch, working_db, working, database, table)


def publish_partitions(ch, loaded: Loaded, partition_by: str, partitions: list[str]) -> int:
    """Replace exactly ``partitions`` of ``table`` with the loaded rows (each partition atomically).

    Loaded rows outside those partitions mean the period filter and the partitions disagree:
    nothing is published then. A partition with no loaded rows is dropped (the period is empty).
    The stage table is this load's own, so period loads into one table may publish at once.
    """
    schema, database, table, weight = loaded.schema, loaded.database, loaded.table, loaded.weight
    if loaded.layout.partition_by and loaded.layout.partition_by != partition_by:
        raise LayoutError(f"table {database}.{table}: the period load's partition_by {partition_by!r} is not the "
                          f"layout's {loaded.layout.partition_by!r}: give one")
    layout = dataclasses.replace(loaded.layout, partition_by=partition_by)
    stage = private_name(table, "stage", loaded.parts)
    ch.command(f"CREATE DATABASE IF NOT EXISTS {ch_ident(database)}")
    # IF NOT EXISTS: the first loads of a new table may be publishing side by side
    ch.command(create_table_sql(schema, database, table, layout, weight, if_not_exists=True))
    comment = comment_of(ch, database, table)
    check_layout(ch, database, table, comment)
    check_same(f"{database}.{table}", layout, comment)  # an existing copy laid out otherwise is refused
    if weight:  # REPLACE PARTITION needs the same columns on both sides
        ch.command(f"ALTER TABLE {ch_table(database, table)} ADD COLUMN IF NOT EXISTS {weight_columns(True, True)[0]}")
    ch.command(f"DROP TABLE IF EXISTS {ch_table(database, stage)}")
    if stored(comment)[1] is None:  # made before layouts: its sorting key is the key alone
        ch.command(f"CREATE TABLE {ch_table(database, stage)} AS {ch_table(database, table)}")
    else:
        ch.command(create_table_sql(schema, database, stage, layout.holding_ttl(), weight))  # counted as loaded
    loaded.copy_into(ch, stage)
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
            ch.command(f"ALTER TABLE {ch_table(database, table)} REPLACE PARTITION ID {pid}"
                       f" FROM {ch_table(database, stage)}")
        else:
            ch.command(f"ALTER TABLE {ch_table(database, table)} DROP PARTITION ID {pid}")
    ch.command(f"DROP TABLE {ch_table(database, stage)}")
    return sum(present.values())


def mark_kept(ch, database: str, table: str, names: list[str], where: str, params: dict,
               source: tuple[str, str] | None = None) -> None:
    """Mark the live rows of ``source`` (default: the table itself; ``FINAL``) that ``where``
    selects as deleted at the source now, into ``table``: at their own version, inserted after
    the row they mark (of two equal versions ReplacingMergeTree keeps the last inserted)."""
    columns = [c for c in names if c not in (VERSION_COLUMN, DELETED_COLUMN, DELETED_AT_SOURCE)]
    listed = ", ".join(ch_ident(c) for c in columns)
    mark = ch_ident(DELETED_AT_SOURCE)
    ch.command(f"INSERT INTO {ch_table(database, table)} ({listed}, {ch_ident(VERSION_COLUMN)}, "
               f"{ch_ident(DELETED_COLUMN)}, {mark}) SELECT {listed}, {ch_ident(VERSION_COLUMN)}, 0, "
               f"if({mark} = 0, now(), {mark}) FROM {ch_table(*(source or (database, table)))} FINAL "
               f"WHERE {where} AND {ch_ident(DELETED_COLUMN)} = 0"
               + ("" if source else f" AND {mark} = 0"), parameters=params, settings=WEIGHT_SETTINGS)


def _carry_kept(ch, names: list[str], new_db: str, new: str, database: str, table: str) -> None:
    """Before a fresh table of a copy that keeps deletes replaces it: the rows of the old copy
    whose key the new one lacks — kept ones as they are, live ones marked deleted at the source
    now (the source no longer has them). A key the new table holds in any form is newer there.
    Run again after a crash, it finds those keys in the new table and copies nothing twice.
    ``names``: the new table's columns."""
    key = copy_key(ch, new_db, new)
    if not key or not table_exists(ch, database, table):
        return
    old = set(column_types(ch, database, table))
    if DELETED_AT_SOURCE not in old or not set(names) <= old | {SPLIT_WEIGHT_COLUMN}:
        return  # not a copy that kept deletes (it had none to keep), or of another shape: reloaded afresh
    keys = "(" + ", ".join(ch_ident(k) for k in key) + ")"
    mark_kept(ch, new_db, new, [n for n in names if n != SPLIT_WEIGHT_COLUMN],
               f"{keys} NOT IN (SELECT {keys} FROM {ch_table(new_db, new)})", {}, source=(database, table))

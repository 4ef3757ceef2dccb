"""Repairs of a published copy in place, and the rows a change without row events removes:
a re-import's shards replaced (:func:`publish_repair`), tombstones of every live row below a
version (:func:`tombstone_older`: a TRUNCATE, a verification's repair, a bootstrap's leftovers),
(a multiset's counterparts: core/clickhouse/multisets.py)."""

from __future__ import annotations

from airflow_sync_provider.core.clickhouse.columns import DELETED_COLUMN, VERSION_COLUMN, WEIGHT_SETTINGS
from airflow_sync_provider.core.clickhouse.described import check_layout, column_types
from airflow_sync_provider.core.clickhouse.publishing import Loaded, mark_kept
from airflow_sync_provider.core.content.shaping import DELETED_AT_SOURCE
from airflow_sync_provider.core.sql import ch_ident, ch_table


def tombstone_older(ch, database: str, table: str, version: int, where: str = "1", params: dict | None = None,
                    at: int = 0) -> None:
    """A tombstone of ``version`` for every live row of the copy (``where``: those of one shard)
    whose version is below it: rows the source no longer had at the position ``version`` stands
    for (a TRUNCATE, a verification's repair, a bootstrap's leftovers). Rows written since rank
    above it and stay. A copy that keeps deletes (core/content/) keeps them: marked deleted at the
    source at ``at`` (the TRUNCATE's commit time; 0: now) instead."""
    name = ch_table(database, table)
    names = [c for c in column_types(ch, database, table) if c not in (VERSION_COLUMN, DELETED_COLUMN)]
    columns = ", ".join(ch_ident(c) for c in names)
    values, deleted = columns, 1
    if DELETED_AT_SOURCE in names:
        mark = f"toDateTime({int(at)}, 'UTC')" if at else "now()"
        values = ", ".join(ch_ident(c) if c != DELETED_AT_SOURCE else
                           f"if({ch_ident(c)} = 0, {mark}, {ch_ident(c)})" for c in names)
        deleted = 0
    ch.command(f"INSERT INTO {name} ({columns}, {ch_ident(VERSION_COLUMN)}, {ch_ident(DELETED_COLUMN)}) "
               f"SELECT {values}, {int(version)}, {deleted} FROM {name} FINAL WHERE ({where}) "
               f"AND {ch_ident(DELETED_COLUMN)} = 0 AND {ch_ident(VERSION_COLUMN)} < {int(version)}",
               parameters=params or {}, settings=WEIGHT_SETTINGS)


def publish_repair(ch, loaded: Loaded, shards: list[tuple[str, dict, int]]) -> int:
    """Replace some shards of a published table in place (re-import after a reconciliation).

    ``shards``: each re-read shard's target predicate (core/clickhouse/shards.py; parameters agree
    where their names do) and the version of its read. Its rows are inserted first:
    ReplacingMergeTree keeps the newest version of a key, so a ``FINAL`` reader sees the
    source's values at once and never misses a row. Then the shard's rows older than its read
    are deleted (lightweight ``DELETE``): superseded versions and rows the source no longer had.
    Rows newer than the read (changes CDC applied meanwhile) stay.

    A copy that keeps a history hears of the repair first (spark/full_load._history_first).
    Idempotent, so a repair resumed after a crash duplicates nothing: the versions are this
    repair's own (a repair's read outranks a snapshot at the same binlog position), so rows
    carrying them were copied by an earlier attempt. All of them: skip the copy; some (an
    ``INSERT … SELECT`` is not atomic): drop them first — the older versions are still there
    then, because the deletes only run after a complete copy.
    """
    database, table = loaded.database, loaded.table
    check_layout(ch, database, table)
    final, version_column = ch_table(database, table), ch_ident(VERSION_COLUMN)
    rows = int(ch.command(f"SELECT count() FROM {ch_table(loaded.parts_db, loaded.parts)}"))
    mine = {"repair_versions": sorted({v for *_, v in shards})}
    copied = int(ch.command(f"SELECT count() FROM {final} WHERE {version_column} IN {{repair_versions:Array(UInt64)}}",
                            parameters=mine))
    if copied and copied != rows:
        ch.command(f"DELETE FROM {final} WHERE {version_column} IN {{repair_versions:Array(UInt64)}}", parameters=mine)
    if copied != rows:
        loaded.copy_into(ch, table)
    params = {k: v for _, p, _ in shards for k, v in p.items()} | {f"rv{i}": v for i, (*_, v) in enumerate(shards)}
    older = " OR ".join(f"(({where}) AND {version_column} < {{rv{i}:UInt64}})"
                        for i, (where, _, _) in enumerate(shards))
    names = list(column_types(ch, database, table))
    if DELETED_AT_SOURCE in names:  # a copy that keeps deletes (core/content/): nothing it kept disappears
        mark_kept(ch, database, table, names, f"({older})", params)
        return rows  # superseded versions stay until merged: FINAL shows the repaired ones
    ch.command(f"DELETE FROM {final} WHERE {older}", parameters=params)
    return rows


"""What a write without a binlog (a load, a repair) tells a copy's history (issue 61, slice 4 of
docs/design/history-tables.md): the rows it brings that the history's newest versions lack, and
the deletes of the keys it leaves out. Written through :meth:`HistoryTable.insert_select` (the
one writer of a history), always *before* the copy changes.

Every value written is a function of what the write publishes (its rows and their ``_version``,
the stamp the caller derives from the load's ledger records), and both selections are relative
to the history and the copy as they were before the publish: a publish retried after a crash
anywhere between the history's write and the copy's selects the same rows again, or nothing
(what the first attempt wrote is the history's newest now), and what it selects again is the
same row at the same (key, version), which collapses (core/clickhouse/history.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from airflow_sync_provider.core.clickhouse.columns import DELETED_COLUMN, VERSION_COLUMN
from airflow_sync_provider.core.clickhouse.described import column_types
from airflow_sync_provider.core.clickhouse.history import HistoryTable, Stamp, unresolved_keys_sql
from airflow_sync_provider.core.content.shaping import DELETED_AT_SOURCE, HistorySettings
from airflow_sync_provider.core.sql import ch_ident, ch_table

# NULL equals NULL inside IN / NOT IN (a row's NULL value is the same value as the history's)
NULL_IN = {"transform_null_in": 1}


@dataclass(frozen=True)
class Scope:
    """A part of the copy a write replaces whole (``where`` on the copy, its ``params``; "1": all
    of it) and the version at which its keys the write lacks are deleted from the history: the
    read's that left them out (rows of the copy ranked at or above it were written since and stay)."""

    where: str
    params: dict
    version: int


def history_of(schema, database: str, table: str, layout, weight: bool) -> HistoryTable | None:
    """The history a write of ``schema``'s rows into ``database.table`` owes (None: its content
    keeps none); refused before anything is written when a history cannot hold the table."""
    if HistorySettings.of(schema.content.history) is None:
        return None
    history = HistoryTable(schema, database, table, layout, weight)
    history.check()
    return history


def write_published(ch, history: HistoryTable, rows: tuple[str, str], stamp: Stamp, scopes: list[Scope]) -> None:
    """Before ``rows`` (database, table: a load's working, shadow, stage or parts table, copy-shaped
    rows with their ``_version``) are published into the copy in place of ``scopes``: into its
    history, the rows whose values the history's newest version of their key lacks (every row with
    ``snapshots="all"``), at their own versions; then a delete, at its scope's version, of each key
    live in the copy there that the rows lack. ``stamp``: the write's (event, via, commit time). A
    ``repair`` also writes the rows of the keys whose history holds two different rows at one
    version that no repair answers yet (core/verify/history.py): both stay, the source's value
    goes above them."""
    ch.command(f"CREATE DATABASE IF NOT EXISTS {ch_ident(history.database)}")  # a first load's (it makes the copy's)
    history.create(ch)
    table = ch_table(*rows)
    names = [ch_ident(c) for c in history.data_columns()]
    live = _live(column_types(ch, *rows))
    select = f"SELECT {', '.join(names)}, {ch_ident(VERSION_COLUMN)} FROM {table} WHERE {live}"
    if history.settings.snapshots != "all":
        columns, newest = history.newest_sql()
        values = ", ".join(ch_ident(c) for c in columns)
        lowest = f"(SELECT min({ch_ident(VERSION_COLUMN)}) FROM {table} WHERE {live})"
        keys = ", ".join(ch_ident(k) for k in history.key)
        # what the history holds already, and keys it holds a version of at or after this write's
        # reads (a change written since: the write's older row is no event to add beneath it)
        lacked = f"({values}) NOT IN (SELECT {values} FROM ({newest}))"
        if stamp.event == "repair":  # a key with two rows at one version gets the source's value above them
            lacked = f"({lacked} OR ({keys}) IN ({unresolved_keys_sql(history)}))"
        select += (f" AND {lacked} AND ({keys}) NOT IN (SELECT {keys} FROM {history.qualified} "
                   f"WHERE {ch_ident(VERSION_COLUMN)} >= {lowest})")
    history.insert_select(ch, select, dataclasses.replace(stamp, deleted=0), settings=NULL_IN)
    keys = "(" + ", ".join(ch_ident(k) for k in history.key) + ")"
    copy = column_types(ch, history.database, history.table)
    for i, scope in enumerate(scopes):
        if not copy:
            break  # a first load: nothing vanished
        where = (f"({scope.where}) AND {_live(copy)} AND {ch_ident(VERSION_COLUMN)} < {{scope_version_{i}:UInt64}} "
                 f"AND {keys} NOT IN (SELECT {keys} FROM {table} WHERE {live})")
        deleted, params = dataclasses.replace(stamp, version=scope.version, deleted=1), \
            {**scope.params, f"scope_version_{i}": scope.version}
        history.insert_select(ch, history.copy_rows_sql(where), deleted, params)
        if stamp.event == "repair":  # keys the history's newest holds live there that the rows lack (the copy not)
            lacked = (f"{keys} NOT IN (SELECT {keys} FROM {table} WHERE {live}) AND {keys} NOT IN (SELECT {keys} "
                      f"FROM {history.qualified} WHERE {ch_ident(VERSION_COLUMN)} >= {{scope_version_{i}:UInt64}})")
            history.insert_select(ch, f"SELECT * FROM ({history.newest_in_sql(scope.where)}) WHERE {lacked}",
                                  deleted, params)


def _live(columns: dict) -> str:
    """Rows that are the source's: not a tombstone, not a kept delete (carried into a fresh table)."""
    return " AND ".join([f"{ch_ident(DELETED_COLUMN)} = 0"] * (DELETED_COLUMN in columns)
                        + [f"{ch_ident(DELETED_AT_SOURCE)} = 0"] * (DELETED_AT_SOURCE in columns)) or "1"


"""A copy as it describes itself: whether it exists, its columns, key, layout and content read back
from ClickHouse (the table's comment records what the copy is: core/clickhouse/ddl.py)."""

from __future__ import annotations

from dataclasses import dataclass

from airflow_sync_provider.core.clickhouse import layout as layouts
from airflow_sync_provider.core.clickhouse.columns import (
    DELETED_COLUMN,
    SHARD_COLUMN,
    TABLE_COMMENT,
    VERSION_COLUMN,
    WRITTEN,
)
from airflow_sync_provider.core.clickhouse.layout import Layout, check_same, stored
from airflow_sync_provider.core.content import shaping
from airflow_sync_provider.core.content.shaping import DELETED_AT_SOURCE, Content
from airflow_sync_provider.core.source.schema import TableSchema
from airflow_sync_provider.core.sql import ch_ident, ch_string, ch_table


class OldLayout(RuntimeError):
    """A target table written by an earlier release (wall-clock versions, no _deleted)."""

    retry_helps = False


def check_layout(ch, database: str, table: str, comment: str | None = None) -> None:
    """Refuse to add rows to a table whose ``_version`` is not in binlog order: an earlier
    release stamped rows with wall-clock nanoseconds, which would out-rank every change.
    ``comment``: the table's, when the caller has read it (:func:`table_facts`)."""
    if comment is None:
        comment = comment_of(ch, database, table) if table_exists(ch, database, table) else TABLE_COMMENT
    if TABLE_COMMENT not in comment:
        raise OldLayout(f"table {database}.{table} was written by an earlier airflow-sync release: its _version "
                        "values are wall-clock times that would out-rank every binlog-ordered change, and it has "
                        "no _deleted column. Reload it in full (a full load replaces the table) before repairing, "
                        "period-loading or applying changes to it")


def is_parts_layout(ch, database: str, table: str) -> bool:
    return SHARD_COLUMN in column_types(ch, database, table)


def table_exists(ch, database: str, table: str) -> bool:
    return bool(ch.command("EXISTS TABLE " + ch_table(database, table)))


def column_types(ch, database: str, table: str) -> dict[str, str]:
    """The table's columns and their ClickHouse types, in order: those writers write (:data:`WRITTEN`),
    not those ClickHouse derives from them."""
    return dict(ch.query("SELECT name, type FROM system.columns WHERE database = {d:String} AND table = {t:String}"
                         f" AND {WRITTEN} ORDER BY position", parameters={"d": database, "t": table}).result_rows)


def sorting_key(ch, database: str, table: str) -> list[str]:
    """The ORDER BY columns (the copy's key: the MySQL primary key when it was loaded)."""
    key = ch.command("SELECT sorting_key FROM system.tables WHERE database = {d:String} AND name = {t:String}",
                     parameters={"d": database, "t": table})
    return _key_columns(key)


def _source_key(comment: str, sorting: list) -> list:
    """The source key a copy collapses rows by: recorded in its comment when it has a layout of its
    own (core/clickhouse/layout.py), else its sorting key (the key, as a mirror is ordered)."""
    key = stored(comment)[1]
    if key is None and sorting[:1] == [VERSION_COLUMN]:  # a multiset's occurrences: no source key
        return []
    return key if key is not None else sorting


def copy_key(ch, database: str, table: str) -> list[str]:
    """:func:`_source_key` of the table."""
    return _source_key(comment_of(ch, database, table), sorting_key(ch, database, table))


def copy_layout(ch, database: str, table: str) -> Layout:
    return stored(comment_of(ch, database, table))[0]


def resolve_layout(ch, database: str, table: str, requested: Layout | None, reshape: bool = False) -> Layout:
    """The one rule for the layout a job writes ``table`` under (every job asks here):

    * ``requested`` None (a re-copy of a table without a layout of its own): the copy's own, or the default;
    * ``reshape`` (a load or a re-copy asked to lay the copy out anew): ``requested``;
    * else the one asked for, which an existing copy must have (refused naming both); none asked
      for (the default): the copy's own."""
    exists = table_exists(ch, database, table)
    if requested is None:
        return copy_layout(ch, database, table) if exists else Layout()
    if reshape or not exists:
        return requested
    comment = comment_of(ch, database, table)
    if not requested:
        return stored(comment)[0]
    check_same(f"{database}.{table}", requested, comment)
    return requested


def relaid(ch, database: str, table: str, requested: Layout | None) -> bool:
    """Does ``requested`` ask for another layout than the copy has (a reshape)? None asks for none."""
    return requested is not None and requested != copy_layout(ch, database, table)


def version_above(ch, database: str, table: str) -> int:
    """The version a write without a binlog takes (core/positions.py): one above every version the
    copy holds (1 when there is no copy, or an empty one), so it still out-ranks the older rows."""
    if not table_exists(ch, database, table):
        return 1
    return int(ch.command(f"SELECT max({ch_ident(VERSION_COLUMN)}) FROM {ch_table(database, table)}") or 0) + 1


def copy_content(ch, database: str, table: str) -> Content:
    """What an existing copy holds (core/content/shaping.py; the mirror's for a copy without settings)."""
    return shaping.stored(comment_of(ch, database, table))[0]


def kept_rows(ch, database: str, table: str) -> int:
    """The rows a copy keeps after the source deleted them (core/content/, on_delete="keep")."""
    return int(ch.command(f"SELECT count() FROM {ch_table(database, table)} FINAL WHERE {ch_ident(DELETED_COLUMN)} = 0 "
                          f"AND {ch_ident(DELETED_AT_SOURCE)} > 0"))


def relay_comment(ch, database: str, table: str, layout: Layout) -> None:
    """Record ``layout`` in the copy's comment instead of the one it records (a derived column
    dropped under a schema change: spark/cdc_ddl.py)."""
    comment = layouts.relaid_comment(comment_of(ch, database, table), layout)
    ch.command(f"ALTER TABLE {ch_table(database, table)} MODIFY COMMENT {ch_string(comment)}")


def check_content(ch, schema: TableSchema, database: str, table: str, comment: str | None = None) -> None:
    """Refuse writing ``schema``'s rows into an existing copy that holds other content (other
    transforms, filter, delete rule or salt): rows of two shapes never compare equal."""
    if comment is None:
        if not table_exists(ch, database, table):
            return
        comment = comment_of(ch, database, table)
    shaping.check_same(f"{database}.{table}", schema.content, schema.salt, comment)


def _key_columns(key) -> list[str]:
    return [k.strip().strip("()`") for k in str(key or "").split(",") if k.strip().strip("()")]


@dataclass(frozen=True)
class TableFacts:
    comment: str
    sorting_key: list
    columns: dict  # name → type, in order

    @property
    def key(self) -> list:
        """The source key the copy collapses rows by (:func:`_source_key`)."""
        return _source_key(self.comment, self.sorting_key)

    @property
    def layout(self) -> Layout:
        return stored(self.comment)[0]

    @property
    def content(self) -> Content:
        return shaping.stored(self.comment)[0]


def table_facts(ch, tables: list[tuple[str, str]]) -> dict[tuple[str, str], TableFacts]:
    """Comment, sorting key and columns of each of ``tables`` (database, table) that exists, in
    two queries however many there are (a run of a pipeline of many tables looks at all)."""
    wanted = set(tables)
    if not wanted:
        return {}
    params = {"d": sorted({d for d, _ in wanted}), "t": sorted({t for _, t in wanted})}
    found = {(d, t): (comment, key) for d, t, comment, key in ch.query(
        "SELECT database, name, comment, sorting_key FROM system.tables WHERE has({d:Array(String)}, database) "
        "AND has({t:Array(String)}, name)", parameters=params).result_rows if (d, t) in wanted}
    columns: dict = {}
    for d, t, name, kind in ch.query(
            "SELECT database, table, name, type FROM system.columns WHERE has({d:Array(String)}, database) "
            f"AND has({{t:Array(String)}}, table) AND {WRITTEN} ORDER BY database, table, position",
            parameters=params).result_rows:
        if (d, t) in found:
            columns.setdefault((d, t), {})[name] = kind
    return {pair: TableFacts(comment or "", _key_columns(key), columns.get(pair, {}))
            for pair, (comment, key) in found.items()}


def working_marker(working: str) -> str:
    return f" load={working}"


def comment_of(ch, database: str, table: str) -> str:
    rows = ch.query("SELECT comment FROM system.tables WHERE database = {d:String} AND name = {t:String}",
                    parameters={"d": database, "t": table}).result_rows
    return rows[0][0] or "" if rows else ""


def swapped_in(ch, working_db: str, working: str, database: str, table: str) -> bool:
    """Has :func:`publish_working` swapped ``working`` in as ``table`` already?"""
    return comment_of(ch, database, table).endswith(working_marker(working))

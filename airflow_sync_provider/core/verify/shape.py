"""Does a copy still have the shape a load of its source would give it today?

A reconciliation and a snapshot diff compare a ClickHouse copy with the MySQL table *as it is
now*: its columns, their types, its primary key. A copy is made in the shape the source had
when it was loaded (core/clickhouse/ddl.py: ``create_table_sql``) and a source can change
after that (``ALTER TABLE … ADD PRIMARY KEY``, a column added, dropped or retyped). This module
says, before any row is counted, whether the two shapes still agree and, if not, what follows:

* **same shape**: compare as usual; ``FINAL`` exactly when the copy is a ReplacingMergeTree.
* **a plain MergeTree copy of a source that now has a key** (a table loaded while it had none):
  still exact to compare, without ``FINAL`` — a plain MergeTree collapses nothing, so every
  stored row is a row, and only the key's *engine* is missing. A note says so and names the
  remedy for a keyed copy (a full reload).
* **anything else** (a column missing, extra or of another type; a ReplacingMergeTree copy
  whose key is not the source's key, or whose source lost its key; an engine a load never
  makes; a collated split column whose collation changed): the copy cannot stand for the source
  shard by shard, and re-importing shards would not fix it. ``problems`` names each difference;
  the remedy is a full reload (or a re-bootstrap of a CDC copy).

Pure logic plus two queries on ClickHouse (no Airflow, no pyspark).
"""

from __future__ import annotations

import logging
import shlex
from dataclasses import dataclass, field

from airflow_sync_provider.core.clickhouse.columns import INTERNAL_COLUMNS, SIGN_COLUMN, WRITTEN
from airflow_sync_provider.core.clickhouse.layout import stored
from airflow_sync_provider.core.source.schema import TableSchema
from airflow_sync_provider.core.source.weights import SPLIT_WEIGHT_COLUMN, needs_weight
from airflow_sync_provider.core.typemap import MySQLColumn, map_column

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CopyShape:
    """A ClickHouse table as it is: engine, sorting key and columns (with their types)."""

    database: str
    table: str
    engine: str
    key: tuple[str, ...]
    columns: dict = field(default_factory=dict)  # every column → its ClickHouse type, in order
    comment: str = ""  # its table comment (the layout it was created with: core/clickhouse/layout.py)

    @property
    def qualified(self) -> str:
        return f"{self.database}.{self.table}"

    @property
    def replacing(self) -> bool:
        """A ReplacingMergeTree (any flavour: Replicated…, Shared…): ``FINAL`` shows each key once."""
        return "ReplacingMergeTree" in self.engine

    @property
    def merge_tree(self) -> bool:
        return self.engine.endswith("MergeTree")

    @property
    def multiset(self) -> bool:
        """A copy of a table without a key followed by CDC: signed occurrences (core/clickhouse/multisets.py)."""
        return SIGN_COLUMN in self.columns

    def user_columns(self) -> dict:
        return {c: t for c, t in self.columns.items() if c not in INTERNAL_COLUMNS}


def read_copy_shape(ch, database: str, table: str) -> CopyShape | None:
    """The copy's shape on ClickHouse, or None when it does not exist."""
    rows = ch.query("SELECT engine, comment FROM system.tables WHERE database = {d:String} AND name = {t:String}",
                    parameters={"d": database, "t": table}).result_rows
    if not rows:
        return None
    # the key's columns by system.columns (a name may hold a comma, which sorting_key's text would split)
    # (those writers write: not the columns ClickHouse derives for queries, core/clickhouse/derived.py)
    columns = ch.query("SELECT name, type, is_in_sorting_key FROM system.columns WHERE database = {d:String} AND "
                       f"table = {{t:String}} AND {WRITTEN} ORDER BY position",
                       parameters={"d": database, "t": table}).result_rows
    key = stored(rows[0][1])[1]  # a copy with a layout of its own records its source key
    if key is None and any(name == SIGN_COLUMN for name, _, _ in columns):
        key = ()  # a multiset's sorting key tells its occurrences apart, not source rows
    return CopyShape(database, table, str(rows[0][0]),
                     tuple(key) if key is not None else tuple(name for name, _, in_key in columns if in_key),
                     {name: ch_type for name, ch_type, _ in columns}, rows[0][1] or "")


def _key_text(key) -> str:
    return "(" + ", ".join(key) + ")"


@dataclass
class ShapeCheck:
    """The verdict on a copy's shape: ``problems`` (empty: comparable) and ``notes`` (comparable,
    with something a person should know)."""

    copy: CopyShape
    source: str  # db.table in MySQL
    source_key: tuple[str, ...]
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def comparable(self) -> bool:
        return not self.problems

    @property
    def final(self) -> bool:
        """Read the copy with ``FINAL``: what its engine needs, not what the source's key says."""
        return self.copy.replacing

    @property
    def multiset(self) -> bool:
        """Count the copy's rows by their signs (a multiset: core/clickhouse/clickhouse.SIGN_COLUMN)."""
        return self.copy.multiset

    def to_dict(self) -> dict:
        return {"engine": self.copy.engine, "copy_key": list(self.copy.key), "source_key": list(self.source_key),
                "final": self.final, "problems": list(self.problems), "notes": list(self.notes)}


def _normalised(ch, types: list[str]) -> dict[str, str]:
    """ClickHouse's own spelling of each type (``Decimal(12,2)`` → ``Decimal(12, 2)``), in one query."""
    if not types:
        return {}
    select = ", ".join(f"toTypeName(defaultValueOfTypeName({{t{i}:String}}))" for i in range(len(types)))
    try:
        row = ch.query(f"SELECT {select}", parameters={f"t{i}": t for i, t in enumerate(types)}).result_rows[0]
    except Exception as exc:  # a spelling this server does not take: the types stay as written (they differ)
        log.warning("could not ask ClickHouse to spell the types %s: %s", types, exc)
        return {}
    return dict(zip(types, row))


def _about(problems: list[str], column: str) -> bool:
    return any(p.startswith(f"column {column!r} ") for p in problems)


def column_problems(ch, schema: TableSchema, present: dict) -> list[str]:
    """The source's columns that the copy holds (``present``: name → ClickHouse type) in another
    type than a load would give them now, or that have no mapping any more: one line each."""
    problems, expected = [], {}
    for column in schema.columns:
        try:
            expected[column.name] = map_column(column, schema.qualified).ch_type
        except ValueError as exc:  # retyped to a type without a mapping
            problems.append(f"column {column.name!r} is now {column.column_type}, which has no ClickHouse "
                            f"mapping ({exc})")
    odd = sorted({t for name, t in expected.items() if name in present and present[name] != t})
    spelled = _normalised(ch, odd)
    for name, ch_type in expected.items():
        if name in present and present[name] != ch_type and present[name] != spelled.get(ch_type, ch_type):
            problems.append(f"column {name!r} is {present[name]} in the copy, but the source's "
                            f"{schema.column(name).column_type} is copied as {ch_type}")
    return problems


def check_copy(ch, schema: TableSchema, copy: CopyShape, split_column: str | None = None,
               loaded_split: MySQLColumn | None = None) -> ShapeCheck:
    """Compare ``copy`` with the copy a load of ``schema`` (the source now, as the load selects
    its columns) would make. ``split_column``: the load's split column, whose collation weights
    the copy may hold; ``loaded_split``: that column as it was when the load read it (if known)."""
    check = ShapeCheck(copy, schema.qualified, tuple(schema.target_key))
    problems = check.problems
    if not copy.merge_tree:
        problems.append(f"the copy {copy.qualified} is a {copy.engine} table; a load makes a MergeTree "
                        "(ReplacingMergeTree when the source has a primary key)")
        return check
    present = copy.user_columns()
    problems += column_problems(ch, schema, present)
    for column in schema.columns:
        if column.name not in present and not _about(problems, column.name):
            problems.append(f"column {column.name!r} ({column.column_type}) is in the source but not in the copy")
    names = {c.name for c in schema.columns}
    problems += [f"column {name!r} is in the copy but no longer in the source" for name in present if name not in names]
    key = tuple(schema.target_key)
    if copy.multiset and key:
        problems.append(f"the source has PRIMARY KEY {_key_text(key)} now, but the copy is a multiset of a table "
                        "without one (docs/keyless-tables.md); its pipeline re-copies it under the key when it "
                        "follows that DDL, or bootstrap it again")
    elif copy.multiset:
        pass  # a table without a key, followed as a multiset: counted by its signs
    elif copy.replacing:
        if not key:
            problems.append(f"the source has no primary key any more, but the copy is a ReplacingMergeTree keyed by "
                            f"{_key_text(copy.key)}: it keeps one row per {_key_text(copy.key)} and would merge source "
                            "rows that share it")
        elif set(copy.key) != set(key):
            problems.append(f"the source's primary key is {_key_text(key)}, but the copy is a ReplacingMergeTree "
                            f"keyed by {_key_text(copy.key)}: it keeps one row per {_key_text(copy.key)}")
    elif key:
        check.notes.append(f"the copy is a plain MergeTree (the table had no primary key when it was loaded); the "
                           f"source now has PRIMARY KEY {_key_text(key)}. Compared without FINAL, which is exact for "
                           "a plain MergeTree (it merges no rows). A full reload makes it a keyed ReplacingMergeTree "
                           "copy, which CDC and a snapshot diff's apply need")
    split = next((c for c in schema.columns if c.name == split_column), None)
    if needs_weight(split) and not _about(problems, split.name):
        if SPLIT_WEIGHT_COLUMN not in copy.columns:
            problems.append(f"the copy holds no collation weights of its split column {split.name!r} (loaded by an "
                            "earlier release)")
        elif loaded_split is not None and (loaded_split.charset, loaded_split.collation) != (split.charset,
                                                                                             split.collation):
            problems.append(f"split column {split.name!r} is now {split.charset}/{split.collation}, but the copy's "
                            f"collation weights were taken under {loaded_split.charset}/{loaded_split.collation}: "
                            "its shards cannot be told apart on the copy")
    return check


def reload_remedy(load_key: str, table: str, target_table: str) -> str:
    """What to do about a copy whose shape no longer matches its source (a retry does not help)."""
    if load_key.startswith("cdc:"):
        pipeline = load_key.split(":", 2)[1]
        return (f"a retry does not help: if pipeline {pipeline!r} has not applied the table's latest DDL yet, let it "
                f"catch up and reconcile again; otherwise re-bootstrap {table} (CdcBootstrapOperator(restart=True) / "
                f"airflow-sync cdc bootstrap --pipeline {pipeline} --table {table} --restart) and start the pipeline "
                "again")
    (database, name), (target_database, target_name) = table.split(".", 1), target_table.split(".", 1)
    return (f"a retry does not help: reload {table} in full into {target_table} (run its full load again: a published "
            f"load key copies afresh, e.g. airflow-sync load --database {database} --table {name} --target-database "
            f"{target_database} --target-table {target_name} --load-key {shlex.quote(load_key)}); a re-import of "
            "shards cannot change a copy's columns or key")

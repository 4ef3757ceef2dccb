"""A copy's history table, ``<table>_history``: every version of every row, with what happened,
when the source committed it and where (issue 61; the plan: docs/design/history-tables.md §3).

Slice 1 built the table and its views; slice 2 the writer primitives (below) and the CDC stream's
writes (spark/cdc_history.py). Other jobs asked for one refuse the table
(core/content/shaping.refuse_history), and a path that would write a copy that keeps one without
writing its history stops first (:func:`refuse_unwritten`).

* Found from the copy itself (:meth:`HistoryTable.of`): the copy's comment keeps its content
  settings, the history's among them; None when it keeps none.
* Written (:meth:`HistoryTable.arrow` + :meth:`HistoryTable.insert`, :meth:`HistoryTable.insert_select`):
  only ever from copy-shaped rows (a copy's Arrow, the copy, its working table, a table of its
  columns) plus the write's :class:`Stamp`. A kept delete (live in the copy, ``_deleted_at_source``)
  is an absence in the history; a layout move's tombstone is no event and is left out.

* The table (:meth:`HistoryTable.create_sql`): the columns writers write to the copy, in the
  copy's shape (its transforms applied: no clear value of a shaped column can reach a history
  built from copy-shaped rows), its derived columns MATERIALIZED as in the copy, then the history's
  own: ``_version``, ``_deleted``, ``_event``, ``_via``, ``_commit_time``, ``_server``, ``_source``
  (a merged copy's own ``_source`` column serves), ``_gtid_domain``, ``_gtid_seq`` and
  ``_row_hash``. A ReplacingMergeTree without a version, ORDER BY (key…, _version, _row_hash):
  every column of a history row is a function of (key, version), so a replayed write is the same
  row again and collapses, while a *different* row at the same (key, version) keeps its own
  sorting key and survives merges, to be counted (:func:`conflicts_sql`). Partitioned by the
  month of ``_commit_time`` unless the settings say otherwise; ``retention_days`` a TTL.
* ``_row_hash`` (:func:`row_hash_sql`): a column's part in it is 0 while it holds its default, so
  a column added later (:meth:`HistoryTable.add_column_sql`) leaves the hash of every row written
  before it, or replayed without it, as it was. Being in the sorting key, it also makes
  ClickHouse refuse to drop a hashed column: what a dropped source column becomes in a history is
  the schema-change follower's to decide (slice 3), not a silent loss.
* The views (:meth:`HistoryTable.views_sql`): ``<table>_asof(at_version=…)``, the copy as of a
  version; ``<table>_asof_time(at_time=…)``, as of a commit time: the longest prefix of binlog
  order committed by then, so a clock that went back after a failover never yields a state that
  did not exist; ``<table>_scd2``, each version's validity (``_valid_from`` … ``_valid_to``, NULL
  while current), its operation and the columns it changed.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc

from airflow_sync_provider.core.clickhouse.columns import DELETED_COLUMN, TABLE_COMMENT, VERSION_COLUMN, WEIGHT_SETTINGS
from airflow_sync_provider.core.clickhouse.ddl import weight_columns
from airflow_sync_provider.core.clickhouse.derived import derived_columns
from airflow_sync_provider.core.clickhouse.described import TableFacts, table_facts
from airflow_sync_provider.core.clickhouse.layout import MIRROR, REPLICATED, REPLICATION_DEFAULT, Layout, setting_sql
from airflow_sync_provider.core.content import ContentError
from airflow_sync_provider.core.content.shaping import (
    DELETED_AT_SOURCE,
    HISTORY_SUFFIX,
    HistorySettings,
    content_comment,
)
from airflow_sync_provider.core.positions import EPOCH_SHIFT
from airflow_sync_provider.core.source.group import SOURCE_COLUMNS
from airflow_sync_provider.core.source.schema import TableSchema
from airflow_sync_provider.core.source.weights import SPLIT_WEIGHT_COLUMN
from airflow_sync_provider.core.sql import ch_ident, ch_string, ch_table

SUFFIX = HISTORY_SUFFIX
DEFAULT_PARTITION = "toYYYYMM(_commit_time)"

# what happened to the row at this version, and which path of the package wrote it (§1 of the plan)
EVENTS = ("insert", "update", "delete", "truncate", "snapshot", "repair", "diff")
VIAS = ("binlog", "xa", "cascade", "ddl", "bootstrap", "recopy", "load", "enable", "reconcile", "verify", "diff",
        "history_repair", "source_left")

EVENT, VIA, COMMIT_TIME, SERVER = "_event", "_via", "_commit_time", "_server"
SOURCE = SOURCE_COLUMNS[0]  # which source of a group (a merged copy has the column already)
GTID_DOMAIN, GTID_SEQ, ROW_HASH = "_gtid_domain", "_gtid_seq", "_row_hash"
# a version's binlog position, read from it (core/positions.py), stored nowhere
ALIASES = {"_epoch": f"toUInt8(bitShiftRight({ch_ident(VERSION_COLUMN)}, {EPOCH_SHIFT}))",
           "_binlog_seq": f"toUInt32(bitAnd(bitShiftRight({ch_ident(VERSION_COLUMN)}, 32), {(1 << 24) - 1}))",
           "_binlog_offset": f"toUInt32(bitAnd({ch_ident(VERSION_COLUMN)}, {(1 << 32) - 1}))"}
# the views' own columns
VALID_FROM_VERSION, VALID_FROM, VALID_TO_VERSION, VALID_TO = ("_valid_from_version", "_valid_from",
                                                              "_valid_to_version", "_valid_to")
OP, CHANGED = "_op", "_changed"
_WORKING = ("_first_after", "_operation", "_changes")  # the views' names for their intermediate values
RESERVED = (VERSION_COLUMN, DELETED_COLUMN, EVENT, VIA, COMMIT_TIME, SERVER, SOURCE, GTID_DOMAIN, GTID_SEQ, ROW_HASH,
            *ALIASES, VALID_FROM_VERSION, VALID_FROM, VALID_TO_VERSION, VALID_TO, OP, CHANGED, *_WORKING)

AS_OF_VERSION, AS_OF_TIME = "at_version", "at_time"  # the views' parameters


def history_name(table: str) -> str:
    return table + SUFFIX


def _enum(values: tuple[str, ...]) -> str:
    return "Enum8(" + ", ".join(f"{ch_string(v)} = {i}" for i, v in enumerate(values, 1)) + ")"


def same_sql(a: str, b: str) -> str:
    """``a`` and ``b`` equal, two NULLs included (1 or 0, never NULL). Not isNotDistinctFrom: ClickHouse
    documents it for JOIN ON only, and servers of 2025 refuse it elsewhere (chDB 26.9 takes it)."""
    return f"if(isNull({a}), isNull({b}), ifNull({a} = {b}, 0))"


def row_hash_sql(stamps: list[str], columns: list[tuple[str, str]]) -> str:
    """``_row_hash``'s expression: the stamp columns (``stamps``) and, for each of ``columns``
    ((name, its DEFAULT expression or "" for its type's default)), 0 while it holds its default, else
    a hash of its name and its value's text (a type widened later hashes alike); the columns' parts
    combined by XOR, so their order and a column added later at its default change nothing."""
    parts = []
    for name, default in columns:
        column = ch_ident(name)
        default = default or f"defaultValueOfTypeName(toTypeName({column}))"
        parts.append(f"if({same_sql(column, default)}, toUInt64(0), "
                     f"cityHash64({ch_string(name)}, toString(assumeNotNull({column}))))")
    combined = f"arrayReduce('groupBitXor', [{', '.join(parts)}])" if parts else "toUInt64(0)"
    return f"cityHash64({', '.join(ch_ident(s) for s in stamps)}, {combined})"


def _micros(value) -> int:
    """A commit time as microseconds since the Unix epoch: an aware datetime, or the microseconds."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError(f"history commit time {value!r}: give an aware datetime (UTC) or microseconds")
        delta = value - datetime(1970, 1, 1, tzinfo=timezone.utc)
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"history commit time {value!r}: give an aware datetime (UTC) or microseconds")
    return value


def _each(value) -> bool:
    """Is a stamp given per row (a sequence or an Arrow array) rather than once for the write?"""
    return isinstance(value, (pa.Array, pa.ChunkedArray)) or (isinstance(value, Sequence)
                                                               and not isinstance(value, (str, bytes)))


@dataclass(frozen=True)
class Stamp:
    """What a write is, beyond the copy's rows it writes (§3 of the plan): what happened (``event``,
    :data:`EVENTS`), which path wrote it (``via``, :data:`VIAS`), when the source committed it
    (``commit_time``: an aware datetime or microseconds since the epoch; for a snapshot, its read's
    time at the source, never now()), the server and group member, the transaction's GTID.
    ``version`` / ``deleted``: None takes each row's own (the copy-shaped rows' ``_version``, and
    ``_deleted`` or a kept delete's ``_deleted_at_source``); a value stamps every row (a TRUNCATE's
    tombstones at its version). :meth:`HistoryTable.arrow` takes ``event``, ``commit_time``,
    ``gtid_domain`` and ``gtid_seq`` per row too (a sequence as long as the rows);
    :meth:`HistoryTable.insert_select` takes one value of each. Every value must be a function of
    the write's (key, version): a replay stamps the same."""

    event: "str | Sequence[str]"
    via: str
    commit_time: "datetime | int | Sequence"
    server: str = ""
    source: str = ""
    gtid_domain: "str | Sequence[str]" = ""
    gtid_seq: "int | Sequence[int]" = 0
    version: "int | None" = None
    deleted: "int | None" = None

    def __post_init__(self):
        for name, allowed in (("event", EVENTS), ("via", VIAS)):
            value = getattr(self, name)
            if isinstance(value, (pa.Array, pa.ChunkedArray)):  # its distinct values, not a Python object a row
                value = pc.unique(value.cast(pa.string())).to_pylist()
            wrong = sorted({str(v) for v in (value if _each(value) else [value])} - set(allowed))
            if wrong:
                raise ValueError(f"history {name} {wrong}: give one of {list(allowed)}")
        if self.deleted not in (None, 0, 1):
            raise ValueError(f"history deleted={self.deleted!r}: give 0, 1 or None (each row's own)")

    def per_row(self) -> bool:
        return any(_each(getattr(self, n)) for n in ("event", "commit_time", "gtid_domain", "gtid_seq"))


@dataclass(frozen=True)
class HistoryTable:
    """The history of the copy ``database.table`` of ``schema`` (the table as copied:
    TableSchema.shaped), laid out as its ``layout`` says where a history follows it (its engine
    family and table settings; not its sorting key, partitions or TTL, which the history has its
    own of). ``weight``: the copy keeps a split column's weight (core/clickhouse/shards.py), so every
    shard predicate runs on the history too. ``defaults``: the DEFAULT expressions of columns added
    after the history was made (:meth:`add_column_sql`), for the hash."""

    schema: TableSchema
    database: str
    table: str
    layout: Layout = MIRROR
    weight: bool = False
    defaults: dict = field(default_factory=dict)

    @classmethod
    def of(cls, ch, schema: TableSchema, database: str, table: str) -> "HistoryTable | None":
        """The history of the copy ``database.table`` as the copy itself says (its comment keeps its
        content settings: core/content/shaping.content_comment), None when the copy keeps none or
        does not exist. ``schema``: the table as copied (a writer has it; the copy's ClickHouse types
        cannot give the source's back)."""
        facts = table_facts(ch, [(database, table)]).get((database, table))
        return None if facts is None else cls.of_facts(facts, schema, database, table)

    @classmethod
    def of_facts(cls, facts: TableFacts, schema: TableSchema, database: str, table: str) -> "HistoryTable | None":
        """:meth:`of` from the copy's facts read already (core/clickhouse/described.table_facts: a run
        of many tables reads them all in two queries). The copy's content, layout and split weight
        are taken from the copy, not from the job: they say what its history holds."""
        content = facts.content
        if HistorySettings.of(content.history) is None:
            return None
        return cls(dataclasses.replace(schema, content=content), database, table, facts.layout,
                   SPLIT_WEIGHT_COLUMN in facts.columns)

    @property
    def name(self) -> str:
        return history_name(self.table)

    @property
    def qualified(self) -> str:
        return ch_table(self.database, self.name)

    @property
    def settings(self) -> HistorySettings:
        return HistorySettings.of(self.schema.content.history) or HistorySettings()

    @property
    def key(self) -> tuple[str, ...]:
        return self.schema.target_key

    def key_sql(self) -> str:
        return ", ".join(ch_ident(k) for k in self.key)

    def data_columns(self) -> list[str]:
        """The copy's columns a history row holds (writers write them), in order."""
        return [m.name for m in self.schema.mappings()] + ([SPLIT_WEIGHT_COLUMN] if self.weight else [])

    def stamps(self) -> list[str]:
        """The history's own columns every writer stamps (``_source``: a merged copy's serves)."""
        own_source = [] if any(c.name == SOURCE and c.tag is not None for c in self.schema.columns) else [SOURCE]
        return [VERSION_COLUMN, DELETED_COLUMN, EVENT, VIA, COMMIT_TIME, SERVER, *own_source, GTID_DOMAIN, GTID_SEQ]

    def check(self) -> None:
        """Refuse, naming the table, what a history cannot hold: a table without a key (its
        multiset history is slice 6 of the plan) or a column named like one of the history's own."""
        where = f"table {self.schema.qualified}"
        if not self.key:
            raise ContentError(f"{where}: a history of a table without a primary key is not built yet (issue 61); "
                               "give the table a key, or leave history out for it")
        taken = sorted({c.name for c in self.schema.columns if c.tag is None} & set(RESERVED))
        if taken:
            raise ContentError(f"{where}: column(s) {taken} have the names of a history's own columns "
                               f"({', '.join(RESERVED)}); leave them out (exclude_columns) or copy through a view "
                               "that renames them, or leave history out for this table")

    # --- DDL -------------------------------------------------------------------------------------

    def _hash(self, columns: list[str]) -> str:
        """``_row_hash`` over the stamps (not the version: it is in the sorting key) and ``columns``."""
        return row_hash_sql([s for s in self.stamps() if s != VERSION_COLUMN],
                            [(c, self.defaults.get(c, "")) for c in columns])

    def _hash_columns(self) -> list[str]:
        """The data columns in the hash: the copy's own (the weight is a function of the split column)."""
        return [m.name for m in self.schema.mappings()]

    def _engine(self) -> str:
        if self.layout.engine != REPLICATED:
            return "ReplacingMergeTree"
        path, replica = self.layout.replication or REPLICATION_DEFAULT
        # the default path names the table ({table}: the history's own); a path given is the copy's
        path = path if "{table}" in path else path + SUFFIX
        return f"{REPLICATED}({ch_string(path)}, {ch_string(replica)})"

    def create_sql(self) -> str:
        """The history's CREATE TABLE (IF NOT EXISTS: creating it beside an existing one is a no-op)."""
        self.check()
        where = f"{self.database}.{self.table}"
        mappings = self.schema.mappings()
        cols = ([f"{ch_ident(m.name)} {m.ch_type}" for m in mappings]
                + [d.ddl() for d in derived_columns(self.layout, mappings, where)]
                + weight_columns(self.weight, hidden=True)
                + [f"{ch_ident(VERSION_COLUMN)} UInt64 CODEC(Delta, ZSTD)", f"{ch_ident(DELETED_COLUMN)} UInt8",
                   f"{ch_ident(EVENT)} {_enum(EVENTS)}", f"{ch_ident(VIA)} {_enum(VIAS)}",
                   f"{ch_ident(COMMIT_TIME)} DateTime64(6, 'UTC') CODEC(Delta, ZSTD)",
                   f"{ch_ident(SERVER)} LowCardinality(String)"]
                + ([f"{ch_ident(SOURCE)} LowCardinality(String)"] if SOURCE in self.stamps() else [])
                + [f"{ch_ident(GTID_DOMAIN)} LowCardinality(String)", f"{ch_ident(GTID_SEQ)} UInt64 CODEC(Delta, ZSTD)",
                   f"{ch_ident(ROW_HASH)} UInt64 DEFAULT {self._hash(self._hash_columns())}"]
                + [f"{ch_ident(name)} {'UInt8' if name == '_epoch' else 'UInt32'} ALIAS {expression}"
                   for name, expression in ALIASES.items()])
        settings = self.settings
        engine = self._engine() + f" PARTITION BY {settings.partition_by or DEFAULT_PARTITION}"
        engine += " ORDER BY (" + ", ".join(ch_ident(c) for c in (*self.key, VERSION_COLUMN, ROW_HASH)) + ")"
        if settings.retention_days:
            engine += f" TTL toDateTime({ch_ident(COMMIT_TIME)}) + INTERVAL {int(settings.retention_days)} DAY"
        if self.layout.settings:
            engine += " SETTINGS " + ", ".join(f"{n} = {setting_sql(v)}" for n, v in self.layout.settings)
        return (f"CREATE TABLE IF NOT EXISTS {self.qualified} (\n  " + ",\n  ".join(cols) + f"\n) ENGINE = {engine}"
                f" COMMENT {ch_string(self.comment())}")

    def comment(self) -> str:
        """What the history is: of which copy, keyed how, and the copy's content settings (its
        shaping: the history holds values shaped alike; its history settings)."""
        of = json.dumps({"table": self.table, "key": list(self.key)}, sort_keys=True, separators=(",", ":"))
        return f"{TABLE_COMMENT} history_of={of}" + content_comment(self.schema.content, self.schema.salt)

    def view_names(self) -> tuple[str, str, str]:
        """``<table>_asof``, ``<table>_asof_time``, ``<table>_scd2``."""
        return self.table + "_asof", self.table + "_asof_time", self.table + "_scd2"

    def _latest(self, where: str) -> str:
        """Each key's newest version passing ``where``, unless it is an absence. A value is taken
        inside a tuple: argMax skips NULLs, and would give an older version's value for a NULL."""
        key = ", ".join(ch_ident(k) for k in self.key)
        values = [f"tupleElement(argMax(tuple({ch_ident(c)}), {ch_ident(VERSION_COLUMN)}), 1) AS {ch_ident(c)}"
                  for c in self._values()]
        version = ch_ident(VERSION_COLUMN)
        return (f"SELECT {', '.join([key, *values])}, max({version}) AS {ch_ident(VALID_FROM_VERSION)}, "
                f"argMax({ch_ident(COMMIT_TIME)}, {version}) AS {ch_ident(VALID_FROM)} FROM {self.qualified} FINAL "
                f"WHERE {where} GROUP BY {key} HAVING argMax({ch_ident(DELETED_COLUMN)}, {version}) = 0")

    def newest_sql(self) -> tuple[list[str], str]:
        """Each key's newest version, unless it is an absence: the columns that tell a row (the key,
        then the values) and the SELECT giving them (core/clickhouse/history_snapshots.py)."""
        return [*self.key, *self._values()], self._latest("1")

    def newest_in_sql(self, where: str, below: str = "") -> str:
        """Each key's newest version passing ``where`` (a shard's predicate on the copy's columns, as
        on the copy: on the newest), unless it is an absence; the copy's columns by name, the split
        weight among them. Only the keys of which some version passes ``where`` are grouped (a
        shard's worth, not the whole history; a key whose split value changed has one). ``below``: as
        of that version (a bound parameter), the versions at or above it left out."""
        keys, version = self.key_sql(), ch_ident(VERSION_COLUMN)
        at = f" AND {version} < {below}" if below else ""
        values = [f"tupleElement(argMax(tuple({ch_ident(c)}), {version}), 1) AS {ch_ident(c)}"
                  for c in self.data_columns() if c not in self.key]
        return (f"SELECT * FROM (SELECT {', '.join([keys, *values])}, argMax({ch_ident(DELETED_COLUMN)}, {version}) "
                f"AS airflow_sync_gone FROM {self.qualified} FINAL WHERE ({keys}) IN (SELECT {keys} FROM "
                f"{self.qualified} WHERE {where}){at} GROUP BY {keys}) WHERE airflow_sync_gone = 0 AND ({where})")

    def _values(self) -> list[str]:
        """The columns the views show beside the key: the copy's, not its derived or hidden ones."""
        return [m.name for m in self.schema.mappings() if m.name not in self.key]

    def views_sql(self, replace: bool = False) -> list[str]:
        """The as-of views and the SCD2 view (``replace``: after the history's columns changed)."""
        asof, asof_time, scd2 = (ch_table(self.database, v) for v in self.view_names())
        create = "CREATE OR REPLACE VIEW" if replace else "CREATE VIEW IF NOT EXISTS"
        version = ch_ident(VERSION_COLUMN)
        first_after = (f"(SELECT minOrNull({version}) FROM {self.qualified} WHERE {ch_ident(COMMIT_TIME)} > "
                       f"{{{AS_OF_TIME}:DateTime64(6, 'UTC')}})")
        return [f"{create} {asof} AS " + self._latest(f"{version} <= {{{AS_OF_VERSION}:UInt64}}"),
                f"{create} {asof_time} AS WITH {first_after} AS _first_after "
                + self._latest(f"_first_after IS NULL OR {version} < _first_after"),
                f"{create} {scd2} AS " + self._scd2()]

    def _scd2(self) -> str:
        """Each version that is a presence: valid from its commit until the key's next version
        (NULL: current), ``insert`` when the key was absent before it, else ``update`` with the
        columns it changed (compared as the copy holds them: shaped)."""
        key = ", ".join(ch_ident(k) for k in self.key)
        version, deleted = ch_ident(VERSION_COLUMN), ch_ident(DELETED_COLUMN)
        values = [ch_ident(c) for c in self._values()]
        changes = [f"if({same_sql(f'lagInFrame(toNullable({c})) OVER _previous', c)}, '', {ch_string(n)})"
                   for c, n in zip(values, self._values())]
        changed = f"arrayFilter(x -> x != '', [{', '.join(changes)}])" if changes else "CAST([], 'Array(String)')"
        inner = (f"SELECT {', '.join([key, *values])}, {version} AS {ch_ident(VALID_FROM_VERSION)}, "
                 f"{ch_ident(COMMIT_TIME)} AS {ch_ident(VALID_FROM)}, "
                 f"leadInFrame(toNullable({version})) OVER _next AS {ch_ident(VALID_TO_VERSION)}, "
                 f"leadInFrame(toNullable({ch_ident(COMMIT_TIME)})) OVER _next AS {ch_ident(VALID_TO)}, "
                 f"if(row_number() OVER _all = 1 OR (lagInFrame({deleted}) OVER _previous) = 1, 'insert', 'update') "
                 f"AS _operation, {changed} AS _changes, {deleted} FROM {self.qualified} FINAL "
                 f"WINDOW _next AS (PARTITION BY {key} ORDER BY {version} ROWS BETWEEN CURRENT ROW AND 1 FOLLOWING), "
                 f"_previous AS (PARTITION BY {key} ORDER BY {version} ROWS BETWEEN 1 PRECEDING AND CURRENT ROW), "
                 f"_all AS (PARTITION BY {key} ORDER BY {version})")
        shown = [key, *values, *(ch_ident(c) for c in (VALID_FROM_VERSION, VALID_FROM, VALID_TO_VERSION, VALID_TO))]
        return (f"SELECT {', '.join(shown)}, _operation AS {ch_ident(OP)}, "
                f"if(_operation = 'update', _changes, CAST([], 'Array(String)')) AS {ch_ident(CHANGED)} "
                f"FROM ({inner}) WHERE {deleted} = 0")

    def create(self, ch) -> None:
        """The history and its views, where they do not exist yet."""
        ch.command(self.create_sql())
        for sql in self.views_sql():
            ch.command(sql)

    # --- writing -----------------------------------------------------------------------------------

    def _stamp_arrays(self, stamp: Stamp, rows: pa.Table) -> list[pa.Array]:
        """The stamps of ``rows`` (:meth:`stamps` order) as Arrow arrays, one value per row."""
        n = rows.num_rows

        def column(value, kind, convert=None):
            if not _each(value):
                return pa.repeat(pa.scalar(convert(value) if convert else value, kind), n)
            if isinstance(value, (pa.Array, pa.ChunkedArray)):
                array = value.cast(kind)
            else:
                array = pa.array([convert(v) for v in value] if convert else list(value), kind)
            if len(array) != n:
                raise ValueError(f"history of {self.database}.{self.table}: a stamp has {len(array)} values for "
                                 f"{n} rows")
            return array.combine_chunks() if isinstance(array, pa.ChunkedArray) else array

        time = pa.timestamp("us", tz="UTC")
        times = stamp.commit_time
        if isinstance(times, (pa.Array, pa.ChunkedArray)):  # Arrow times of any unit, as microseconds
            times = times.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
        times = column(times, pa.int64(), None if isinstance(times, (pa.Array, pa.ChunkedArray)) else _micros)
        values = {VERSION_COLUMN: self._row_versions(stamp, rows), DELETED_COLUMN: self._row_deleted(stamp, rows),
                  EVENT: column(stamp.event, pa.string()), VIA: column(stamp.via, pa.string()),
                  COMMIT_TIME: times.cast(time), SERVER: column(stamp.server, pa.string()),
                  SOURCE: column(stamp.source, pa.string()), GTID_DOMAIN: column(stamp.gtid_domain, pa.string()),
                  GTID_SEQ: column(stamp.gtid_seq, pa.uint64())}
        return [values[name] for name in self.stamps()]

    def _row_versions(self, stamp: Stamp, rows: pa.Table) -> pa.Array:
        if stamp.version is not None:
            return pa.repeat(pa.scalar(stamp.version, pa.uint64()), rows.num_rows)
        if VERSION_COLUMN not in rows.column_names:
            raise ValueError(f"history of {self.database}.{self.table}: the rows have no {VERSION_COLUMN} and the "
                             "stamp gives none")
        return rows[VERSION_COLUMN].combine_chunks().cast(pa.uint64())

    def _row_deleted(self, stamp: Stamp, rows: pa.Table) -> pa.Array:
        """Each row's absence: the stamp's, else the copy's tombstone flag or a kept delete (live in a
        copy with on_delete="keep", marked ``_deleted_at_source``; an absence in its history)."""
        if stamp.deleted is not None:
            return pa.repeat(pa.scalar(stamp.deleted, pa.uint8()), rows.num_rows)
        if DELETED_COLUMN not in rows.column_names:
            raise ValueError(f"history of {self.database}.{self.table}: the rows have no {DELETED_COLUMN} and the "
                             "stamp gives none")
        deleted = pc.not_equal(rows[DELETED_COLUMN].combine_chunks().cast(pa.uint8()), 0)
        if DELETED_AT_SOURCE in rows.column_names:
            kept = rows[DELETED_AT_SOURCE].combine_chunks()
            kept = kept.cast(pa.int64()) if not pa.types.is_timestamp(kept.type) else \
                kept.cast(pa.timestamp("s")).cast(pa.int64())
            deleted = pc.or_(deleted, pc.greater(kept, 0))
        return deleted.cast(pa.uint8())

    def arrow(self, rows: pa.Table, stamp: Stamp, moved=None) -> pa.Table:
        """History rows from copy-shaped Arrow ``rows`` (as TableRoute.arrow, a load's or a repair's
        read made them: the copy's columns in its shape, ``_version``, ``_deleted`` and a kept
        delete's ``_deleted_at_source``) and the write's ``stamp``. ``moved``: a flag per row, true for
        the tombstone a layout move leaves at a row's old place (core/cdc/binlog/routes.moved_rows):
        a copy's bookkeeping, not a row change, so it is left out. A kept delete becomes an absence
        (``_deleted`` 1); ``_deleted_at_source`` and other columns the history lacks are dropped."""
        names = self.data_columns()
        missing = [c for c in names if c not in rows.column_names]
        if missing:
            raise ValueError(f"history of {self.database}.{self.table}: the rows lack the copy's column(s) {missing}")
        if moved is not None:
            moved = moved.cast(pa.bool_()) if isinstance(moved, (pa.Array, pa.ChunkedArray)) else \
                pa.array([bool(m) for m in moved], pa.bool_())
            if len(moved) != rows.num_rows:
                raise ValueError(f"history of {self.database}.{self.table}: {len(moved)} moved flags for "
                                 f"{rows.num_rows} rows")
        table = pa.Table.from_arrays([rows[c] for c in names] + self._stamp_arrays(stamp, rows),
                                     names=names + self.stamps())
        return table if moved is None else table.filter(pc.invert(moved))

    def insert(self, ch, rows: pa.Table) -> None:
        """One INSERT of :meth:`arrow`'s rows (``_row_hash`` from its DEFAULT)."""
        if rows.num_rows:
            ch.insert_arrow(self.qualified, rows, settings=WEIGHT_SETTINGS if self.weight else None)

    def insert_select_sql(self, select: str, stamp: Stamp) -> tuple[str, dict]:
        """:meth:`insert_select`'s statement and its stamps' parameters (``history_*``)."""
        if stamp.per_row():
            raise ValueError(f"history of {self.database}.{self.table}: INSERT … SELECT takes one stamp for the "
                             "write; give per-row stamps to arrow()")
        names = self.data_columns()
        deleted = ("{history_deleted:UInt8}" if stamp.deleted is not None else
                   f"toUInt8({ch_ident(DELETED_COLUMN)} != 0" + (
                       f" OR toUInt32({ch_ident(DELETED_AT_SOURCE)}) > 0)" if self.schema.content.keep_deletes
                       else ")"))
        values = {VERSION_COLUMN: "{history_version:UInt64}" if stamp.version is not None else ch_ident(VERSION_COLUMN),
                  DELETED_COLUMN: deleted, EVENT: "{history_event:String}", VIA: "{history_via:String}",
                  COMMIT_TIME: "fromUnixTimestamp64Micro({history_commit_time:Int64}, 'UTC')",
                  SERVER: "{history_server:String}", SOURCE: "{history_source:String}",
                  GTID_DOMAIN: "{history_gtid_domain:String}", GTID_SEQ: "{history_gtid_seq:UInt64}"}
        params = {"history_event": stamp.event, "history_via": stamp.via,
                  "history_commit_time": _micros(stamp.commit_time), "history_server": stamp.server,
                  "history_source": stamp.source, "history_gtid_domain": stamp.gtid_domain,
                  "history_gtid_seq": int(stamp.gtid_seq),
                  **({"history_version": int(stamp.version)} if stamp.version is not None else {}),
                  **({"history_deleted": int(stamp.deleted)} if stamp.deleted is not None else {})}
        columns = ", ".join(ch_ident(c) for c in (*names, *self.stamps()))
        selected = ", ".join([ch_ident(c) for c in names] + [values[c] for c in self.stamps()])
        return (f"INSERT INTO {self.qualified} ({columns}) SELECT {selected} FROM ({select}) AS _rows",
                params if SOURCE in self.stamps() else {k: v for k, v in params.items() if k != "history_source"})

    def copy_rows_sql(self, where: str = "1") -> str:
        """The copy's rows passing ``where`` (FINAL: each place's newest), every column a history
        row takes from them named (the split weight is MATERIALIZED: ``*`` would leave it out)."""
        names = [*self.data_columns(), VERSION_COLUMN, DELETED_COLUMN,
                 *([DELETED_AT_SOURCE] if self.schema.content.keep_deletes else [])]
        return (f"SELECT {', '.join(ch_ident(c) for c in names)} FROM {ch_table(self.database, self.table)} FINAL "
                f"WHERE {where}")

    def baseline_sql(self, below: str) -> str:
        """Each key's newest row in the copy ranked below ``below`` (a bound parameter, e.g.
        ``{enable_below:UInt64}``): the copy as of that version, what a history begun on an existing
        copy starts from. Rows ranked above it (a killed run's writes past its checkpoint) are left
        to the stream's replay, which writes their history. Of a moved row's tombstone and its new
        row at one version, the row."""
        names = [*self.data_columns(), VERSION_COLUMN, DELETED_COLUMN,
                 *([DELETED_AT_SOURCE] if self.schema.content.keep_deletes else [])]
        return (f"SELECT {', '.join(ch_ident(c) for c in names)} FROM {ch_table(self.database, self.table)} "
                f"WHERE {ch_ident(VERSION_COLUMN)} < {below} ORDER BY {ch_ident(VERSION_COLUMN)} DESC, "
                f"{ch_ident(DELETED_COLUMN)} LIMIT 1 BY {', '.join(ch_ident(k) for k in self.key)}")

    def insert_select(self, ch, select: str, stamp: Stamp, params: dict | None = None,
                      settings: dict | None = None) -> None:
        """INSERT INTO the history the rows of ``select`` — a SELECT of copy-shaped columns (the copy,
        its working table, a scratch table of its columns; its own values bound as ``{name:Type}``
        in ``params``) — with the write's ``stamp``, one value of each, bound (the names
        ``history_*`` are the stamps'). Version and absence are each row's own unless the stamp
        gives them (as :meth:`arrow`: a kept delete is an absence)."""
        sql, stamps = self.insert_select_sql(select, stamp)
        clash = sorted(set(params or {}) & set(stamps))
        if clash:
            raise ValueError(f"history of {self.database}.{self.table}: parameter(s) {clash} are the stamps' own")
        settings = {**(WEIGHT_SETTINGS if self.weight else {}), **(settings or {})}
        ch.command(sql, parameters={**(params or {}), **stamps}, settings=settings or None)

    # --- schema changes --------------------------------------------------------------------------

    def add_column_sql(self, name: str, default: str = "") -> list[str]:
        """The copy's new column ``name`` added to its history (``default``: its DEFAULT expression,
        "" for its type's) and to the hash — at 0 while it holds its default, so the rows written
        before it, and a replay of them, keep their hash — then the views over the new columns.
        ``self``: the history as it is after the change (its schema has the column)."""
        mappings = self.schema.mappings()
        mapping = next(m for m in mappings if m.name == name)
        after = [m.name for m in mappings if m.name != name]
        added = HistoryTable(self.schema, self.database, self.table, self.layout, self.weight,
                             {**self.defaults, **({name: default} if default else {})})
        return ([f"ALTER TABLE {self.qualified} ADD COLUMN IF NOT EXISTS {ch_ident(name)} {mapping.ch_type}"
                 + (f" DEFAULT {default}" if default else "") + (f" AFTER {ch_ident(after[-1])}" if after else ""),
                 f"ALTER TABLE {self.qualified} MODIFY COLUMN {ch_ident(ROW_HASH)} UInt64 DEFAULT "
                 + added._hash(added._hash_columns())]
                + added.views_sql(replace=True))


def conflicts_sql(database: str, table: str, key: tuple[str, ...]) -> str:
    """Keys with more than one row at one version in the history of ``database.table`` after
    FINAL (an identical replay collapses; a different row at the same (key, version) does not):
    rows (key…, _version, rows)."""
    columns = ", ".join(ch_ident(c) for c in (*key, VERSION_COLUMN))
    return (f"SELECT {columns}, count() AS _rows FROM {ch_table(database, history_name(table))} FINAL "
            f"GROUP BY {columns} HAVING _rows > 1 ORDER BY {columns}")


def conflicts_found_sql(history: HistoryTable, where: str = "1") -> str:
    """(key…, version, rows, repaired_at) of each (key, version) holding different rows in the
    history (rows passing ``where``), with the key's newest ``repair`` event's version (0: none)."""
    keys, version = history.key_sql(), ch_ident(VERSION_COLUMN)
    found = (f"SELECT {keys}, {version} AS airflow_sync_version, count() AS airflow_sync_rows "
             f"FROM {history.qualified} FINAL WHERE {where} GROUP BY {keys}, {version} HAVING airflow_sync_rows > 1")
    repaired = (f"SELECT {keys}, max({version}) AS airflow_sync_repaired FROM {history.qualified} "
                f"WHERE {ch_ident(EVENT)} = 'repair' AND ({keys}) IN (SELECT {keys} FROM ({found})) GROUP BY {keys}")
    return (f"SELECT {keys}, airflow_sync_version, airflow_sync_rows, airflow_sync_repaired FROM ({found}) AS _found "
            f"LEFT JOIN ({repaired}) AS _repaired USING ({keys}) ORDER BY {keys}, airflow_sync_version")


def unresolved_keys_sql(history: HistoryTable, where: str = "1") -> str:
    """The keys (passing ``where``) with a conflict no later ``repair`` event of theirs answers."""
    keys = history.key_sql()
    return (f"SELECT DISTINCT {keys} FROM ({conflicts_found_sql(history, where)}) "
            "WHERE airflow_sync_repaired <= airflow_sync_version")


# what is not built yet, by the writer that would leave its history behind (docs/design/history-tables.md §5)
NOT_YET = {"slice 3": "XA transactions, foreign-key cascades, TRUNCATE, schema changes, re-copies and the bootstrap",
           "slice 4": "a diff's apply whose new side is a ClickHouse table",
           "slice 6": "tables without a primary key (multisets)"}


def refuse_unwritten(history, table: str, write: str, later: str, error: type = ContentError) -> None:
    """Refuse ``write`` (what would happen, e.g. "a TRUNCATE") into the copy of ``table`` when it
    keeps a history (``history``: its HistoryTable or settings; None/False: it keeps none) and that
    path does not write the history yet (``later``: the slice of the plan that builds it,
    :data:`NOT_YET`): never a change of a copy its history misses. ``error``: the job's kind of
    stop (a pipeline's BinlogError stays stopped, every retry too)."""
    if history:
        raise error(f"table {table}: {write} would change its copy, which keeps a history ({table}'s "
                    f"<table>{SUFFIX}), and that path does not write the history yet (issue 61, {later}: "
                    f"{NOT_YET[later]}). Nothing was written; a retry stops here again. Leave the table's "
                    "history off (a copy made without one), or wait for that part of the history")

"""One followed table's row changes as its copy's rows: :class:`TableRoute`."""

from __future__ import annotations

import operator
from dataclasses import dataclass

import pyarrow as pa
from pymysqlreplication.constants import NONE_SOURCE

from airflow_sync_provider.core.cdc.tables import PipelineTable
from airflow_sync_provider.core.clickhouse.columns import ORDINAL_COLUMN, SIGN_COLUMN
from airflow_sync_provider.core.content.shaping import DELETED_AT_SOURCE
from airflow_sync_provider.core.positions import BinlogError, ValueRefused
from airflow_sync_provider.core.source.schema import TableSchema
from airflow_sync_provider.core.typemap import MySQLColumn, check_array

# A row change's deleted flag for the tombstone a moved row leaves at its old place (its layout's
# sorting key or partition: TableRoute.keyed). Written as a tombstone (1); not a row change of its own.
MOVED = 2
# A delete a copy keeps (core/content/, on_delete="keep") is flagged with its commit time (a Unix
# time, far above MOVED): the deleted row is written live, marked _deleted_at_source at that time.
KEPT_FROM = MOVED + 1
FILTER_DECISIONS = 65536  # a route remembers at most this many of its filter's decisions


def moved_rows(deleted: list) -> list[bool]:
    """Which of a table's row changes (their deleted flags, as :meth:`TableRoute.arrow` takes them)
    are the tombstone a layout move leaves at a row's old place: a copy's bookkeeping, not a row
    change, so its history leaves them out (core/clickhouse/history.HistoryTable.arrow). A kept
    delete's flag (its commit time, >= KEPT_FROM) is a delete, not a move."""
    return [d == MOVED for d in deleted]


def _no_place(row: tuple) -> tuple:
    """A multiset's rows have no place (a module function: routes go to reader processes pickled)."""
    return ()


@dataclass
class TableRoute:
    """One replicated table: its source schema (as copied) and its ClickHouse target."""

    schema: TableSchema
    target_database: str
    target_table: str
    table: PipelineTable | None = None  # the pipeline's entry (names, columns)
    weight: MySQLColumn | None = None  # the collated split column whose weight rows carry
    skip_before: int = 0  # changes ranked below this are skipped: a re-copy from there covers them
    partitioned: bool = False  # its copy has partitions (its layout's): a batch's rows in one insert
    # a reshape's old copy (database, table), kept current with the same rows until the new copy is
    # swapped in (spark/cdc_ddl.py: its place columns are both layouts')
    also: tuple[str, str] | None = None
    # a table without a primary key, copied as a multiset of signed occurrences
    # (core/clickhouse/clickhouse.SIGN_COLUMN): an insert is +1 of its row, a delete -1, an update -1
    # of the old row and +1 of the new; nothing collapses, so every change of a batch is written
    multiset: bool = False
    # the copy's history (core/clickhouse/history.HistoryTable; None: it keeps none): every change
    # of a batch is written there, not only each place's last (spark/cdc_history.py)
    history: object = None

    def __post_init__(self):
        self._source = self.schema.qualified  # per row change on the reader's path
        self.mappings = self.schema.mappings()
        self.names = [m.name for m in self.mappings]
        self.key = list(self.schema.primary_key)
        if not self.key and not self.multiset:
            raise BinlogError(f"table {self.schema.qualified} has no primary key and its copy is not a multiset "
                              "(a full load's plain MergeTree): CDC follows a table without a key only in a copy "
                              "its bootstrap made (docs/keyless-tables.md). Bootstrap it (restart=True)")
        # per row and value on the hot path: resolved once
        self._converters = [(m.name, m.rule.from_binlog, m.source) for m in self.mappings]
        # a merged copy's member (core/source/group.py): columns its table lacks (NULL) and its
        # source columns (its tags) are not in its rows events; every row carries their values
        self.virtual = {m.name: m.source.tag for m in self.mappings if not m.source.in_table}
        self.table_names = [n for n in self.names if n not in self.virtual]
        self.keyed(self.key, [])
        # what the copy holds (core/content/): the rows its filter selects; deletes kept or not
        self.row_filter = self.schema.row_filter
        self.keep = self.schema.content.keep_deletes
        # the filter reads its own columns only: their places in a row, resolved once; its decisions
        # are remembered by those columns' values (a status, a tenant: few values, many rows)
        self._filter_at = [] if self.row_filter is None else [(n, self.names.index(n)) for n in self.row_filter.columns]
        self._decided: dict = {}
        # columns the copy leaves out on purpose; any other column a rows event carries that the
        # copy lacks means a schema change was not followed
        chosen = self.table.columns if self.table is not None else None
        self._left_out = None if chosen is not None else \
            {c.lower() for c in (self.table.exclude_columns if self.table is not None else ())}
        self._shapes_seen: set = set()

    def keyed(self, key: list[str], place: list[str]) -> None:
        """The copy's key, and the columns beyond it that place a row in the copy (its layout's
        sorting key and partition: core/clickhouse/layout.py). A change to any of them moves the row,
        so the old place gets a tombstone; each place keeps only its last change of a batch."""
        self.key = list(key)
        # where the key's values are in a row: a merged copy's source columns (constants of every
        # row of this route, not in its rows events) tell no two rows apart
        self.key_at = [self.names.index(k) for k in self.key if k not in self.virtual]
        self.place_at = self.key_at + [self.names.index(c) for c in place if c not in self.key]
        self.moves = len(self.place_at) > len(self.key_at)  # can an update move a row?
        # a row's place (a value, not a tuple, for one column): the copy's key plus its layout's columns
        self.place_getter = operator.itemgetter(*self.place_at) if self.place_at else _no_place

    def check_shape(self, names: tuple, where: str) -> None:
        """Compare a rows event's own column names (binlog_row_metadata=FULL) with the copy's."""
        if names in self._shapes_seen:
            return
        missing = [n for n in self.table_names if n not in names]
        extra = [] if self._left_out is None else \
            [n for n in names if n not in self.table_names and n.lower() not in self._left_out]
        if missing or extra:
            raise BinlogError(f"table {self.source}, {where}: the binlog's rows have columns {list(names)} but the "
                              f"copy follows {self.table_names} (missing {missing}, unknown {extra}): a schema change "
                              "was not followed. Stopped before writing; re-bootstrap the table (restart=True) "
                              "and report the DDL that led here")
        self._shapes_seen.add(names)

    @property
    def source(self) -> str:
        return self._source

    def row(self, values: dict, none_sources: dict | None = None) -> tuple:
        missing = [n for n in self.table_names if n not in values]
        if self.virtual:
            values = {**values, **self.virtual}
        if missing:
            raise BinlogError(f"table {self.source}: the binlog rows lack columns {missing} "
                              "(binlog_row_image must be FULL and binlog_row_metadata FULL)")
        if none_sources:  # the reader decodes an empty SET as None; MySQL shows ''
            values = {k: "" if v is None and none_sources.get(k) == NONE_SOURCE.EMPTY_SET else v
                      for k, v in values.items()}
        return tuple(None if (value := values[name]) is None else convert(value, column)
                     for name, convert, column in self._converters)

    def wanted(self, row: tuple) -> bool:
        """Does the copy hold this row (its filter selects it)?"""
        if self.row_filter is None:
            return True
        return self.decided(tuple(row[i] for _, i in self._filter_at))

    @property
    def filter_at(self) -> list[int]:
        """Where the filter's columns are in a row."""
        return [i for _, i in self._filter_at]

    def decided(self, values: tuple) -> bool:
        """The filter's decision for its columns' ``values`` (in :attr:`filter_at` order)."""
        decided = self._decided.get(values)
        if decided is None:
            if len(self._decided) >= FILTER_DECISIONS:
                self._decided.clear()
            decided = self._decided[values] = self.row_filter.matches(
                {name: value for (name, _), value in zip(self._filter_at, values)})
        return decided

    def delete_flag(self, timestamp: int):
        """A delete's flag: a tombstone, or for a copy that keeps deletes its commit time."""
        return max(int(timestamp), KEPT_FROM) if self.keep else True

    def update(self, before: tuple, after: tuple) -> list[tuple[tuple, object]]:
        """An update's (row, deleted flag) items under a row filter (both images whole): the new
        row if the filter selects it, with a tombstone at the old place when the row moved; a
        tombstone of the old row when the update takes it out of the filter; nothing when neither
        image is selected. A row leaving the filter is removed, not kept: it was not deleted."""
        return self.settle(self.wanted(before), after, lambda: before, self.place_of(before))

    def settle(self, was: bool, after: tuple, before, place: tuple) -> list[tuple[tuple, object]]:
        """:meth:`update` from whether the filter selected the old row (``was``), its ``place``,
        and ``before``: a function giving the whole old row, called only for a tombstone (the
        binlog decoder reads an old image whole only then: core/cdc/rowimage.py)."""
        if not self.wanted(after):
            return [(before(), True)] if was else []
        if was and place != self.place_of(after):
            old = before()
            return [(old, MOVED if self.key_of(old) == self.key_of(after) else True), (after, False)]
        return [(after, False)]

    def key_of(self, row: tuple) -> tuple:
        return tuple(row[i] for i in self.key_at)

    def place_of(self, row: tuple) -> tuple:
        return tuple(row[i] for i in self.place_at)

    def arrow(self, rows: list[tuple], versions: list[int], deleted: list[int], where: str) -> pa.Table:
        """Rows with their versions and tombstone flags as an Arrow table for the target; values
        the target would store wrongly are refused as by the full load."""
        columns = list(zip(*rows)) if rows else [[] for _ in self.mappings]
        # a tombstone keeps the old row's values: only live rows must satisfy NOT NULL etc.
        live = pa.array([not d for d in deleted]) if any(deleted) else None
        arrays = []
        for values, mapping in zip(columns, self.mappings):
            try:
                array = pa.array(values, type=mapping.base_arrow_type)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, ValueError) as exc:
                raise ValueRefused(f"{where}, column {mapping.name!r}: value does not fit {mapping.ch_type}: "
                                   f"{exc}") from exc
            try:
                check_array(array if live is None else array.filter(live), mapping, where)
            except ValueError as exc:
                raise ValueRefused(f"{exc}. A retry stops here again: fix the value in MySQL (the change after "
                                   "it then carries the fixed value) and re-bootstrap the table") from exc
            arrays.append(mapping.shaped(array))  # a content transform (core/content/) after the checks
        extra, names = [], []
        if self.multiset:  # signed occurrences, told apart within a version by their ordinal
            counts: dict = {}
            ordinals = []
            for v in versions:  # an update's two rows share its version; an XA commit's all rows
                ordinals.append(counts.get(v, 0))
                counts[v] = ordinals[-1] + 1
            extra = [pa.array(ordinals, pa.uint64()), pa.array([-1 if d else 1 for d in deleted], pa.int8())]
            names = [ORDINAL_COLUMN, SIGN_COLUMN]
            deleted = [0] * len(deleted)
        elif self.keep:  # a kept delete: live, marked with its commit time
            extra, names = [pa.array([int(d) if d >= KEPT_FROM else 0 for d in deleted], pa.uint32())], \
                [DELETED_AT_SOURCE]
            deleted = [1 if 0 < d < KEPT_FROM else 0 for d in deleted]
        elif self.moves:  # a moved row's tombstone (MOVED) is a tombstone like any other
            deleted = [1 if d else 0 for d in deleted]
        return pa.Table.from_arrays(arrays + [pa.array(versions, pa.uint64()), pa.array(deleted, pa.uint8())] + extra,
                                    names=self.names + ["_version", "_deleted"] + names)

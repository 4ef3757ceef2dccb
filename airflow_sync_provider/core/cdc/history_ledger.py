"""What a pipeline wrote to its copies' histories (issue 61; docs/design/history-tables.md §3, §4),
kept in the ledger beside its checkpoints (core/cdc/checkpoints.py) and like them append-only
ReplacingMergeTree tables read ``FINAL``:

* ``history_applied``: per pipeline, source table and batch, the versions the batch covered
  (``from_version`` ≤ v < ``to_version``), how many history rows it wrote (one per key and version)
  and the sum of their versions — what the gap-free check (§4.2) counts in the history again: a
  version missing makes the count low, one too many the count high or the sum off. Keyed by
  (pipeline, source table, from_version): a batch replayed after a crash records itself again.
* ``history_ranges``: ranges of versions a table's history covers (``covered``) or lacks
  (``hole``, with its reason: a lost binlog, changes before the history began), so a gap the
  check finds is either recorded with its reason or reported.

Written by the applier under its lease (``lease``, as :class:`~.checkpoints.Checkpoints`): the
records from ``PipelineRun.advance`` before the checkpoint moves, a history's beginning as a hole
(spark/cdc_history.RunHistory).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from airflow_sync_provider.core.ledger import TIME_TYPE, LedgerTables
from airflow_sync_provider.core.ledger import utc_datetime as _ts

COVERED, HOLE = "covered", "hole"  # a range's kinds
GAP, OVERLAP = "gap", "overlap"  # what :meth:`HistoryLedger.breaks` finds between applied batches

_APPLIED = (("pipeline", "String"), ("source_table", "String"), ("from_version", "UInt64"), ("to_version", "UInt64"),
            ("rows", "UInt64"), ("version_sum", "UInt128"), ("generation", "UInt64"), ("updated_at", TIME_TYPE))
_RANGES = (("pipeline", "String"), ("source_table", "String"), ("kind", "LowCardinality(String)"),
           ("from_version", "UInt64"), ("to_version", "UInt64"), ("reason", "String"), ("updated_at", TIME_TYPE))


@dataclass(frozen=True)
class Applied:
    """One batch's history rows of one table: versions ``from_version`` ≤ v < ``to_version``, ``rows``
    (distinct key and version) and ``version_sum`` (their versions' sum, unbounded)."""

    source_table: str
    from_version: int
    to_version: int
    rows: int
    version_sum: int

    @classmethod
    def of(cls, source_table: str, from_version: int, to_version: int, versions: Iterable[int]) -> "Applied":
        """The record of a batch whose history rows have ``versions`` (one per key and version)."""
        versions = [int(v) for v in versions]
        outside = [v for v in versions if not from_version <= v < to_version]
        if outside:
            raise ValueError(f"table {source_table}: history versions {outside[:5]} lie outside the batch's "
                             f"[{from_version}, {to_version})")
        return cls(source_table, from_version, to_version, len(versions), sum(versions))


@dataclass(frozen=True)
class Range:
    """A range of versions of a table's history, ``from_version`` ≤ v < ``to_version``: ``covered``,
    a ``hole`` (``reason``: why), or what :meth:`HistoryLedger.breaks` finds (a ``gap``, an ``overlap``)."""

    source_table: str
    kind: str
    from_version: int
    to_version: int
    reason: str = ""


class HistoryLedger(LedgerTables):
    """``history_applied`` and ``history_ranges`` in the ledger database."""

    lease = None  # the applier's Lease while it holds one: every write checks it first

    def ensure(self) -> None:
        self._ensure_tables([
            ("history_applied", _APPLIED,
             "ReplacingMergeTree(updated_at) ORDER BY (pipeline, source_table, from_version)"),
            ("history_ranges", _RANGES,
             "ReplacingMergeTree(updated_at) ORDER BY (pipeline, source_table, kind, from_version)"),
        ])

    def fence(self) -> None:
        if self.lease is not None:
            self.lease.check()

    def write_applied(self, pipeline: str, batch: list[Applied], generation: int = 0) -> None:
        """A batch's records, one per table it wrote history for, in one INSERT."""
        if not batch:
            return
        self.fence()
        at = _ts(self._stamp())
        self._insert("history_applied", [[pipeline, a.source_table, a.from_version, a.to_version, a.rows,
                                          a.version_sum, generation, at] for a in batch], _APPLIED)

    def applied(self, pipeline: str, source_table: str) -> list[Applied]:
        """The table's batch records, by ``from_version``."""
        return [Applied(source_table, *map(int, r)) for r in self.ch.query(
            f"SELECT from_version, to_version, rows, version_sum FROM {self.table('history_applied')} FINAL "
            "WHERE pipeline = {p:String} AND source_table = {t:String} ORDER BY from_version",
            parameters={"p": pipeline, "t": source_table}).result_rows]

    def write_range(self, pipeline: str, covered: Range) -> None:
        """Record a ``covered`` range or a ``hole`` with its reason (the same range again replaces it)."""
        if covered.kind not in (COVERED, HOLE):
            raise ValueError(f"table {covered.source_table}: a history range is {COVERED!r} or {HOLE!r}, "
                             f"not {covered.kind!r}")
        if covered.kind == HOLE and not covered.reason:
            raise ValueError(f"table {covered.source_table}: a hole in its history needs its reason")
        self.fence()
        self._insert("history_ranges", [[pipeline, covered.source_table, covered.kind, covered.from_version,
                                         covered.to_version, covered.reason, _ts(self._stamp())]], _RANGES)

    def ranges(self, pipeline: str, source_table: str, kind: str | None = None) -> list[Range]:
        """The table's recorded ranges (of ``kind``, or all), by ``from_version``."""
        result = self.ch.query(
            f"SELECT kind, from_version, to_version, reason FROM {self.table('history_ranges')} FINAL "
            "WHERE pipeline = {p:String} AND source_table = {t:String} AND ({k:String} = '' OR kind = {k:String}) "
            "ORDER BY from_version, kind", parameters={"p": pipeline, "t": source_table, "k": kind or ""})
        return [Range(source_table, k, int(f), int(t), reason) for k, f, t, reason in result.result_rows]

    def breaks(self, pipeline: str, source_table: str) -> list[Range]:
        """Where the table's batch records do not chain (the ``to_version`` of one the ``from_version``
        of the next): a ``gap`` no recorded hole covers, or an ``overlap`` (two records counting the
        same versions). Empty: the records chain, or every gap is a recorded hole."""
        holes = self.ranges(pipeline, source_table, HOLE)
        found, end = [], None
        for record in self.applied(pipeline, source_table):
            if end is not None and record.from_version > end:
                if not any(h.from_version <= end and h.to_version >= record.from_version for h in holes):
                    found.append(Range(source_table, GAP, end, record.from_version))
            elif end is not None and record.from_version < end:
                found.append(Range(source_table, OVERLAP, record.from_version, end))
            end = record.to_version if end is None else max(end, record.to_version)
        return found

    def complete_from(self, pipeline: str, source_table: str) -> int | None:
        """The version from which the table's history is complete: the end of its last hole, else its
        first batch's start (None: nothing recorded)."""
        holes = self.ranges(pipeline, source_table, HOLE)
        if holes:
            return max(h.to_version for h in holes)
        applied = self.applied(pipeline, source_table)
        return applied[0].from_version if applied else None

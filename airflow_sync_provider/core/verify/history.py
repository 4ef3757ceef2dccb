"""The three checks of a copy's history (issue 61, slice 5 of docs/design/history-tables.md §4),
as ClickHouse SQL run per shard or slice, so no check holds a table's keys in memory:

* **latest == copy** (:func:`latest_sql`, :func:`latest_examples`): each key's newest version in
  the history, unless it is an absence, against the copy's live rows (FINAL; a kept delete,
  live in the copy and marked ``_deleted_at_source``, is an absence in the history and left out
  of both), by key and values: the count and an order-free sum of row hashes
  (core/verify/rowhash.py) of one shard on each side. A shard's predicate (core/clickhouse/shards.py)
  is evaluated on the newest version of a key, as on the copy: the history's rows are first
  narrowed to the keys of which some version passes it (a key whose split value changed has one),
  then grouped by key, then the predicate is applied again to the newest.
* **gap-free** (:func:`gaps`): for a followed table, every batch the pipeline recorded in
  ``history_applied`` (core/cdc/history_ledger.py) has as many distinct (key, version) rows written
  by the stream in its range, with the same sum of versions; a record whose range is a recorded
  ``hole`` is explained, not counted; ``HistoryLedger.breaks`` adds the gaps between records no
  hole explains and the overlaps.
* **no version twice** (:func:`conflicts`): two different rows at one (key, version) after FINAL
  (core/clickhouse/history.conflicts_sql; an identical replay collapses). A conflict that a
  ``repair`` event of its key at a higher version answers is *resolved* (both rows stay: the past
  is never deleted silently) and counted apart.

Each check returns a :class:`Finding`: what it counted and a few keys or versions at fault. The
repair of what they find: a ``repair`` event from a source snapshot for each key whose newest
version is wrong or in conflict (core/clickhouse/history_snapshots.write_published, run by the
re-import and the verification's slice repair), and a hole recorded for a range counted wrong
(:func:`record_holes`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from airflow_sync_provider.core.cdc.history_ledger import GAP, HOLE, HistoryLedger, Range
from airflow_sync_provider.core.clickhouse.columns import DELETED_COLUMN, VERSION_COLUMN
from airflow_sync_provider.core.clickhouse.history import VIA, HistoryTable, conflicts_found_sql, unresolved_keys_sql
from airflow_sync_provider.core.content.shaping import DELETED_AT_SOURCE
from airflow_sync_provider.core.sql import ch_ident, ch_table
from airflow_sync_provider.core.verify.rowhash import ch_row_hash

EXAMPLES = 5  # keys or ranges at fault a finding names
LATEST, GAPS, CONFLICTS = "latest", "gaps", "conflicts"
# the history's rows the pipeline's records count (what the stream writes: spark/cdc_history.py)
STREAM_VIAS = ("binlog", "xa", "cascade", "ddl")


@dataclass
class Finding:
    """One check of one table's history: ``faults`` counted (0: it passes), ``examples`` at fault,
    ``notes`` (what was explained, e.g. resolved conflicts or recorded holes)."""

    table: str
    check: str
    faults: int = 0
    examples: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    ranges: list = field(default_factory=list)  # gaps: every range at fault, (from, to, what)

    @property
    def ok(self) -> bool:
        return not self.faults

    def to_dict(self) -> dict:
        return {"check": self.check, "faults": self.faults, "examples": self.examples, "notes": self.notes}

    def describe(self) -> str:
        return f"history {self.check}: {self.faults} fault(s), e.g. {self.examples[:EXAMPLES]}"


def live_copy_where(history: HistoryTable, where: str) -> str:
    """``where`` on the copy's live rows (FINAL drops its tombstones; a kept delete is left out)."""
    kept = f" AND {ch_ident(DELETED_AT_SOURCE)} = 0" if history.schema.content.keep_deletes else ""
    return f"({where}) AND {ch_ident(DELETED_COLUMN)} = 0{kept}"


def latest_sql(history: HistoryTable, where: str) -> str:
    """One row: (copy rows, copy checksum, history rows, history checksum) of the shard ``where``."""
    hashed = f"toUInt128({ch_row_hash(history.schema.mappings())})"
    copy = ch_table(history.database, history.table)
    return (f"SELECT c_rows, c_sum, h_rows, h_sum FROM (SELECT count() AS c_rows, ifNull(sum({hashed}), 0) AS c_sum "
            f"FROM {copy} FINAL WHERE {live_copy_where(history, where)}) AS _copy, (SELECT count() AS h_rows, "
            f"ifNull(sum({hashed}), 0) AS h_sum FROM ({history.newest_in_sql(where)})) AS _history")


def latest(ch, history: HistoryTable, where: str, params: dict) -> tuple[tuple[int, int], tuple[int, int]]:
    """The shard's (rows, checksum) in the copy and in the history's newest versions."""
    row = [int(v) for v in ch.query(latest_sql(history, where), parameters=params).result_rows[0]]
    return (row[0], row[1]), (row[2], row[3])


def latest_at(ch, history: HistoryTable, where: str, params: dict, at: int) -> tuple[int, int, int]:
    """The rolling verification's look at a slice ``where`` as of version ``at`` (a snapshot's S):
    (rows, checksum) of each key's newest version below ``at``, the keys with a version at or
    above it set aside (changed since S, as the copy's are: spark/cdc_slices.copy_at), and the
    number of keys in the slice with two different rows at one version no repair answers."""
    hashed = f"toUInt128({ch_row_hash(history.schema.mappings())})"
    keys, aside = history.key_sql(), "airflow_sync_at"
    newest = history.newest_in_sql(where, f"{{{aside}:UInt64}}")
    conflicted = f"(SELECT count() FROM ({unresolved_keys_sql(history, where)}))"
    sql = (f"SELECT count(), ifNull(sum({hashed}), 0), {conflicted} FROM ({newest}) WHERE ({keys}) NOT IN "
           f"(SELECT {keys} FROM {history.qualified} WHERE {ch_ident(VERSION_COLUMN)} >= {{{aside}:UInt64}})")
    row = ch.query(sql, parameters={**params, aside: int(at)}).result_rows[0]
    return int(row[0]), int(row[1]), int(row[2])


def latest_examples(ch, history: HistoryTable, where: str, params: dict, limit: int = EXAMPLES) -> list:
    """A few keys of the shard whose newest history version and copy row differ (values or
    presence): [(key…), …]."""
    keys, hashed = history.key_sql(), f"toUInt128({ch_row_hash(history.schema.mappings())})"
    copy = ch_table(history.database, history.table)
    a, b = "airflow_sync_copy", "airflow_sync_history"
    sql = (f"SELECT {keys} FROM (SELECT {keys}, {hashed} AS {a} FROM {copy} FINAL "
           f"WHERE {live_copy_where(history, where)}) AS _copy FULL OUTER JOIN (SELECT {keys}, {hashed} AS {b} "
           f"FROM ({history.newest_in_sql(where)})) AS _history USING ({keys}) WHERE {a} != {b} ORDER BY {keys} "
           f"LIMIT {int(limit)}")
    # join_use_nulls 0 (the default): a side without the key gives its hash as 0
    return [r[0] if len(r) == 1 else tuple(r) for r in ch.query(sql, parameters=params).result_rows]


def conflicts(ch, history: HistoryTable, where: str = "1", params: dict | None = None) -> Finding:
    """Different rows at one (key, version): unresolved ones are faults, resolved ones notes."""
    finding = Finding(f"{history.database}.{history.table}", CONFLICTS)
    n = len(history.key)
    for row in ch.query(conflicts_found_sql(history, where), parameters=params or {}).result_rows:
        key = row[0] if n == 1 else tuple(row[:n])
        version, rows, repaired = (int(v) for v in row[n:])
        if repaired > version:
            finding.notes.append(f"key {key!r}: {rows} rows at version {version}, kept; the repair at version "
                                 f"{repaired} answers it")
        else:
            finding.faults += 1
            if len(finding.examples) < EXAMPLES:
                finding.examples.append({"key": key, "version": version, "rows": rows})
    return finding


def counted_sql(history: HistoryTable, ledger: HistoryLedger) -> str:
    """Per batch record of ``history_applied`` (pipeline {p:String}, source table {t:String}): the
    distinct (key, version) rows the stream wrote in its range and the sum of their versions. A
    row in no record's range counts under from_version 0 (ASOF: each row under the record that
    starts at or below it; ``to_version`` tells whether it lies inside)."""
    keys, version = history.key_sql(), ch_ident(VERSION_COLUMN)
    vias = ", ".join(f"'{v}'" for v in STREAM_VIAS)
    rows = (f"SELECT DISTINCT {keys}, {version} AS v, toUInt8(1) AS j FROM {history.qualified} "
            f"WHERE {ch_ident(VIA)} IN ({vias})")
    records = (f"SELECT toUInt8(1) AS j, from_version, to_version FROM {ledger.table('history_applied')} FINAL "
               "WHERE pipeline = {p:String} AND source_table = {t:String}")
    return (f"SELECT if(h.v < r.to_version, r.from_version, 0) AS start, count(), sum(toUInt128(h.v)) "
            f"FROM ({rows}) AS h ASOF LEFT JOIN ({records}) AS r ON h.j = r.j AND h.v >= r.from_version "
            "GROUP BY start")


def gaps(ch, history: HistoryTable, ledger: HistoryLedger, pipeline: str, source_table: str) -> Finding:
    """The stream's records of ``source_table`` against the history's rows in their ranges: a record
    counted low (a version missing) or high / off in its sum (a version too many), stream rows in
    no record's range, and the breaks between records no hole explains. A record inside a
    recorded hole is explained (a note)."""
    finding = Finding(f"{history.database}.{history.table}", GAPS)
    holes = ledger.ranges(pipeline, source_table, HOLE)
    counted = {int(s): (int(n), int(total)) for s, n, total in ch.query(
        counted_sql(history, ledger), parameters={"p": pipeline, "t": source_table}).result_rows}

    def fault(example: dict, what: str = "") -> None:
        finding.faults += 1
        if len(finding.examples) < EXAMPLES:
            finding.examples.append(example)
        if what:
            finding.ranges.append((example["from_version"], example["to_version"], what))

    for record in ledger.applied(pipeline, source_table):
        found = counted.pop(record.from_version, (0, 0))
        if found == (record.rows, record.version_sum):
            continue
        hole = next((h for h in holes if h.from_version <= record.from_version and h.to_version >= record.to_version),
                    None)
        if hole is not None:
            finding.notes.append(f"versions {record.from_version}…{record.to_version}: a recorded hole ({hole.reason})")
            continue
        what = "missing" if found[0] < record.rows else "extra"
        fault({"from_version": record.from_version, "to_version": record.to_version, "recorded": record.rows,
               "found": found[0], what: abs(record.rows - found[0]) or "versions differ"}, what)
    outside = counted.pop(0, None)
    if outside:
        fault({"outside_records": outside[0]})
    for start, (n, _) in counted.items():  # a record's start the ledger no longer lists (should not happen)
        fault({"from_version": start, "found": n, "recorded": None})
    for found in ledger.breaks(pipeline, source_table):
        fault({"from_version": found.from_version, "to_version": found.to_version, found.kind: True},
              "unrecorded" if found.kind == GAP else "")
    return finding


def record_holes(ledger: HistoryLedger, pipeline: str, source_table: str, finding: Finding, why: str) -> list[Range]:
    """Each range the gap-free check counted wrong (``finding.ranges``) recorded as a ``hole`` with
    its reason (``why``: who found it): the binlog is not read again for it here, so the history
    before its end is said to be incomplete (``HistoryLedger.complete_from``) rather than left to
    look whole. The versions found there stay (never deleted). Returns the holes recorded."""
    recorded = []
    for start, end, what in finding.ranges:
        hole = Range(source_table, HOLE, start, end, f"the history check found versions {what} here ({why}); "
                                                     "the binlog was not read again")
        ledger.write_range(pipeline, hole)
        recorded.append(hole)
    return recorded


@dataclass
class Review:
    """The three checks of one copy's history over a set of shards (reconcile's): ``shards`` maps a
    shard id to what its history got wrong (its newest versions unlike the copy's rows, keys in
    conflict), which a re-import of the shard repairs; ``gaps`` the followed pipelines' findings,
    which a repair records as holes."""

    table: str
    latest: Finding
    conflicts: Finding
    gaps: dict = field(default_factory=dict)  # pipeline → Finding
    shards: dict = field(default_factory=dict)  # shard id → [problem, …]
    holes: list = field(default_factory=list)  # recorded by :meth:`record_holes`

    @property
    def ok(self) -> bool:
        return self.latest.ok and self.conflicts.ok and all(f.ok for f in self.gaps.values())

    def problems(self) -> list[str]:
        return [f.describe() + (f" (pipeline {p!r})" if p else "") for p, f in
                [("", self.latest), ("", self.conflicts), *self.gaps.items()] if not f.ok]

    def record_holes(self, ledger: HistoryLedger, source_table: str, why: str) -> None:
        for pipeline, finding in self.gaps.items():
            self.holes += [dataclasses.asdict(h) | {"pipeline": pipeline}
                           for h in record_holes(ledger, pipeline, source_table, finding, why)]

    def to_dict(self) -> dict:
        return {"table": self.table, "ok": self.ok, "latest": self.latest.to_dict(),
                "conflicts": self.conflicts.to_dict(), "gaps": {p: f.to_dict() for p, f in self.gaps.items()},
                **({"holes_recorded": self.holes} if self.holes else {})}


def review(ch, history: HistoryTable, predicates: dict, ledger: HistoryLedger, pipelines: list[str],
           source_table: str) -> Review:
    """The three checks of ``history`` over the shards ``predicates`` (shard id → (where, params)
    on the copy's columns), and gap-free for each of ``pipelines`` following the copy."""
    name = f"{history.database}.{history.table}"
    found = Review(name, Finding(name, LATEST), conflicts(ch, history))
    for shard, (where, params) in predicates.items():
        copy, newest = latest(ch, history, where, params)
        if copy != newest:
            found.latest.faults += 1
            keys = latest_examples(ch, history, where, params)
            if len(found.latest.examples) < EXAMPLES:
                found.latest.examples.append({"shard": shard, "copy_rows": copy[0], "history_rows": newest[0],
                                              "keys": keys})
            found.shards.setdefault(shard, []).append(
                f"history: its newest versions differ from the copy (rows {newest[0]} vs {copy[0]}; keys {keys})")
        if found.conflicts.faults:
            n = int(ch.command(f"SELECT count() FROM ({unresolved_keys_sql(history, where)})", parameters=params) or 0)
            if n:
                found.shards.setdefault(shard, []).append(f"history: {n} key(s) with two different rows at one version")
    for pipeline in pipelines:
        found.gaps[pipeline] = gaps(ch, history, ledger, pipeline, source_table)
    return found

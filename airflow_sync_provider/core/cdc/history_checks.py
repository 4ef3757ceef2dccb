"""The gap-free check of a followed copy's history (issue 61, slice 5: docs/design/history-tables.md
§4.2) against what the pipeline recorded writing (core/cdc/history_ledger.py), the holes its repair
records, and the three checks of a history together (:func:`review`: the other two are
core/verify/history.py's) as reconcile runs them.

Gap-free: every batch the pipeline recorded in ``history_applied`` has as many distinct (key,
version) rows written by the stream in its range, with the same sum of versions; a record whose
range is a recorded ``hole`` is explained, not counted; ``HistoryLedger.breaks`` adds the gaps
between records no hole explains and the overlaps.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from airflow_sync_provider.core.cdc.history_ledger import GAP, HOLE, HistoryLedger, Range
from airflow_sync_provider.core.clickhouse.columns import VERSION_COLUMN
from airflow_sync_provider.core.clickhouse.history import VIA, HistoryTable, unresolved_keys_sql
from airflow_sync_provider.core.sql import ch_ident
from airflow_sync_provider.core.verify.history import (
    EXAMPLES,
    GAPS,
    LATEST,
    Finding,
    conflicts,
    latest,
    latest_examples,
)

# the history's rows the pipeline's records count (what the stream writes: spark/cdc_history.py)
STREAM_VIAS = ("binlog", "xa", "cascade", "ddl")


def counted_sql(history: HistoryTable, ledger: HistoryLedger) -> str:
    """Per batch record of ``history_applied`` (pipeline {p:String}, source table {t:String}) ending
    at or below {upto:UInt64}: the distinct (key, version) rows the stream wrote in its range and
    the sum of their versions, rows below ``upto`` and outside the recorded holes ({hole_from},
    {hole_to}: what a hole explains is not counted) only. A row in no record's range counts under
    from_version 0 (ASOF: each row under the record that starts at or below it; ``to_version``
    tells whether it lies inside)."""
    keys, version = history.key_sql(), ch_ident(VERSION_COLUMN)
    vias = ", ".join(f"'{v}'" for v in STREAM_VIAS)
    rows = (f"SELECT DISTINCT {keys}, {version} AS v, toUInt8(1) AS j FROM {history.qualified} "
            f"WHERE {ch_ident(VIA)} IN ({vias}) AND {version} < {{upto:UInt64}} AND NOT arrayExists((f, t) -> "
            f"{version} >= f AND {version} < t, {{hole_from:Array(UInt64)}}, {{hole_to:Array(UInt64)}})")
    records = (f"SELECT toUInt8(1) AS j, from_version, to_version FROM {ledger.table('history_applied')} FINAL "
               "WHERE pipeline = {p:String} AND source_table = {t:String} AND to_version <= {upto:UInt64}")
    return (f"SELECT if(h.v < r.to_version, r.from_version, 0) AS start, count(), sum(toUInt128(h.v)) "
            f"FROM ({rows}) AS h ASOF LEFT JOIN ({records}) AS r ON h.j = r.j AND h.v >= r.from_version "
            "GROUP BY start")


def gaps(ch, history: HistoryTable, ledger: HistoryLedger, pipeline: str, source_table: str) -> Finding:
    """The stream's records of ``source_table`` against the history's rows in their ranges: a record
    counted low (a version missing) or high / off in its sum (a version too many), stream rows in
    no record's range, and the breaks between records no hole explains. A record inside a
    recorded hole is explained (a note). A running pipeline writes a batch's rows, then its record:
    the records are read first, and only the rows below the last one's end are counted (the rows
    of a batch whose record is not written yet are no gap)."""
    finding = Finding(f"{history.database}.{history.table}", GAPS)
    records = ledger.applied(pipeline, source_table)
    holes = ledger.ranges(pipeline, source_table, HOLE)
    upto = max((r.to_version for r in records), default=0)
    counted = {int(s): (int(n), int(total)) for s, n, total in ch.query(
        counted_sql(history, ledger), parameters={"p": pipeline, "t": source_table, "upto": upto,
                                                  "hole_from": [h.from_version for h in holes],
                                                  "hole_to": [h.to_version for h in holes]}).result_rows}

    def fault(example: dict, what: str = "") -> None:
        finding.faults += 1
        if len(finding.examples) < EXAMPLES:
            finding.examples.append(example)
        if what:
            finding.ranges.append((example["from_version"], example["to_version"], what))

    for record in records:
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

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
* **gap-free**: against what a pipeline recorded writing, so it lives beside those records
  (core/cdc/history_checks.py, which also gathers the three into a :class:`Review` for reconcile).
* **no version twice** (:func:`conflicts`): two different rows at one (key, version) after FINAL
  (core/clickhouse/history.conflicts_sql; an identical replay collapses). A conflict that a
  ``repair`` event of its key at a higher version answers is *resolved* (both rows stay: the past
  is never deleted silently) and counted apart.

Each check returns a :class:`Finding`: what it counted and a few keys or versions at fault. The
repair of what they find: a ``repair`` event from a source snapshot for each key whose newest
version is wrong or in conflict (core/clickhouse/history_snapshots.write_published, run by the
re-import and the verification's slice repair), and a hole recorded for a range counted wrong
(core/cdc/history_checks.record_holes).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from airflow_sync_provider.core.clickhouse.columns import DELETED_COLUMN
from airflow_sync_provider.core.clickhouse.history import HistoryTable, conflicts_found_sql, unresolved_keys_sql
from airflow_sync_provider.core.content.shaping import DELETED_AT_SOURCE
from airflow_sync_provider.core.sql import ch_ident, ch_table
from airflow_sync_provider.core.verify.rowhash import ch_row_hash

EXAMPLES = 5  # keys or ranges at fault a finding names
LATEST, GAPS, CONFLICTS = "latest", "gaps", "conflicts"


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


def latest_at(ch, history: HistoryTable, where: str, params: dict, at: int, set_aside: list) -> tuple[int, int, int]:
    """The rolling verification's look at a slice ``where`` as of version ``at`` (a snapshot's S):
    (rows, checksum) of each key's newest version below ``at`` but the keys ``set_aside`` (the ones
    the copy's read found changed at or after S: spark/cdc_slices.copy_at; the same keys as the
    source leaves out, though the stream has gone on since), and the number of keys in the slice
    with two different rows at one version no repair answers. The history holds every version
    below S once the stream has passed S (its rows are written before the checkpoint moves)."""
    hashed = f"toUInt128({ch_row_hash(history.schema.mappings())})"
    keys, at_name = history.key_sql(), "airflow_sync_at"
    types = {m.name: m.ch_type for m in history.schema.mappings()}
    aside = f"{{airflow_sync_aside:Array(Tuple({', '.join(types[k] for k in history.key)}))}}"
    newest = history.newest_in_sql(where, f"{{{at_name}:UInt64}}")
    conflicted = f"(SELECT count() FROM ({unresolved_keys_sql(history, where)}))"
    sql = (f"SELECT count(), ifNull(sum({hashed}), 0), {conflicted} FROM ({newest}) "
           f"WHERE NOT has({aside}, tuple({keys}))")
    row = ch.query(sql, parameters={**params, at_name: int(at),
                                    "airflow_sync_aside": [tuple(k) for k in set_aside]}).result_rows[0]
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

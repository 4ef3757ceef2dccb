"""Staging for XA transactions larger than the batch bounds (core/cdc/binlog/reader.BinlogReader).

A prepared XA transaction's rows exist only at its XA COMMIT, maybe hours and many runs later,
so they cannot be written to the copy as they are read; held in memory they would make the
applier's memory grow with the transaction. Beyond the bounds they go to staging instead: one
table per transaction and source table in the ledger database, named after the pipeline, where
the transaction began and the table (:func:`stage_table`), with the copy's columns. At XA
COMMIT each key's last change is written to the copy at the commit's version (the rule for
parked rows, core/cdc/binlog/reader.BinlogReader._xa_end) by one INSERT … SELECT; ClickHouse keeps
the last change per key, not the applier. Staging is dropped once the checkpoint has passed
the transaction's end (XA COMMIT or XA ROLLBACK); a crash before that replays the end from
staging again (idempotent: the same rows at the same version).

Staging is trusted between runs only as the checkpoint describes it: a parked transaction the
state lists as staged whose tables are all there is not read again; any other staging of the
pipeline is dropped, and a transaction read again is written to staging afresh.
"""

from __future__ import annotations

import hashlib

from airflow_sync_provider.core.clickhouse.columns import DELETED_COLUMN, VERSION_COLUMN, WEIGHT_SETTINGS
from airflow_sync_provider.core.content.shaping import DELETED_AT_SOURCE
from airflow_sync_provider.core.positions import BinlogPosition
from airflow_sync_provider.core.source.weights import SPLIT_WEIGHT_COLUMN
from airflow_sync_provider.core.sql import ch_ident, ch_table


def _tag(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def stage_prefix(pipeline: str, began: BinlogPosition | None = None) -> str:
    """The name every staging table of ``pipeline`` (of the transaction that began at ``began``) starts with."""
    prefix = f"xa_{_tag(pipeline)}_"
    return prefix + (f"{began.epoch}_{began.seq}_{began.pos}_" if began is not None else "")


def stage_table(pipeline: str, began: BinlogPosition, source: str) -> str:
    return stage_prefix(pipeline, began) + _tag(source)


class XaStaging:
    """A pipeline's staging tables, as its applier uses them (``ch``: the run's client)."""

    def __init__(self, ch, database: str, pipeline: str):
        self.ch, self.database, self.pipeline = ch, database, pipeline
        self.kept: set = set()  # transactions (where they began) whose staging the checkpoint vouches for
        self._fresh: set = set()  # transactions this run writes to staging from their start
        self._made: set = set()  # staging tables known to exist

    def _names(self, began: BinlogPosition | None = None) -> set[str]:
        return {name for (name,) in self.ch.query(
            "SELECT name FROM system.tables WHERE database = {d:String} AND startsWith(name, {p:String})",
            parameters={"d": self.database, "p": stage_prefix(self.pipeline, began)}).result_rows}

    def trusted(self, prepared: dict) -> dict:
        """``prepared`` (the checkpoint's parked XA transactions) with "staged" kept where all its
        staging tables are there; without it (the reader then reads the transaction again) where
        one is missing. Staging of no parked transaction (left by a crash after its end) is dropped."""
        present, wanted, out = self._names(), set(), {}
        for xid, entry in prepared.items():
            staged = entry.get("staged") if isinstance(entry, dict) else None
            if staged is not None:
                began = BinlogPosition.from_dict(entry)
                names = {stage_table(self.pipeline, began, source) for source in staged}
                if names <= present:
                    wanted |= names
                    self.kept.add(began.key())
                else:
                    entry = {k: v for k, v in entry.items() if k != "staged"}
            out[xid] = entry
        for name in sorted(present - wanted):
            self.ch.command(f"DROP TABLE IF EXISTS {ch_table(self.database, name)}")
        self._made = wanted
        return out

    def forget(self) -> None:
        """The stream's tables changed (a table joined): parked transactions are read again, into
        fresh staging."""
        self.kept.clear()
        self._fresh.clear()

    def prepare(self, began: BinlogPosition, targets: dict[str, tuple]) -> None:
        """Before writing rows of the transaction that began at ``began``: staging an earlier
        attempt left is dropped (this run writes it from the start), and the tables of
        ``targets`` (stage table → the route of its source table) are made, of the copy's columns."""
        if began.key() not in self.kept and began.key() not in self._fresh:
            self.drop(began)
            self._fresh.add(began.key())
        for name, route in targets.items():
            if name in self._made:
                continue
            weight = f", {ch_ident(SPLIT_WEIGHT_COLUMN)}" if route.weight is not None else ""
            self.ch.command(f"CREATE TABLE IF NOT EXISTS {ch_table(self.database, name)} ENGINE = MergeTree "
                            f"ORDER BY tuple() AS SELECT *{weight} FROM "
                            f"{ch_table(route.target_database, route.target_table)} LIMIT 0")
            self._made.add(name)

    def commit(self, began: BinlogPosition, route, low: int, version: int | None) -> int:
        """Write a committed transaction's staged rows of ``route``'s table to its copy: each place's
        (key's) last change at the commit's ``version`` (None: XA COMMIT … ONE PHASE, an ordinary commit:
        every change at its own version from ``low`` up). Returns the rows written."""
        stage = ch_table(self.database, stage_table(self.pipeline, began, route.source))
        columns = (list(route.names) + ([SPLIT_WEIGHT_COLUMN] if route.weight is not None else [])
                   + ([DELETED_AT_SOURCE] if route.keep else []))
        names = ", ".join(ch_ident(c) for c in columns + [VERSION_COLUMN, DELETED_COLUMN])
        # tombstones first: of two rows of one version in one place, the one inserted last is kept
        # (a moved row's tombstone and its new row, when its layout places both alike: cdc_stream._latest)
        first = f" ORDER BY {ch_ident(DELETED_COLUMN)} DESC"
        if version is None:
            select = f"SELECT {names} FROM {stage} WHERE {ch_ident(VERSION_COLUMN)} >= {int(low)}{first}"
        else:
            keep = ", ".join(ch_ident(c) for c in columns)
            key = ", ".join(ch_ident(route.names[i]) for i in route.place_at)  # a place's last change
            select = (f"SELECT {keep}, toUInt64({int(version)}), {ch_ident(DELETED_COLUMN)} FROM (SELECT {keep}, "
                      f"{ch_ident(DELETED_COLUMN)} FROM {stage} ORDER BY {ch_ident(VERSION_COLUMN)} DESC "
                      f"LIMIT 1 BY {key}){first}")
        written = 0
        for database, table in [(route.target_database, route.target_table), *([route.also] if route.also else [])]:
            result = self.ch.query(f"INSERT INTO {ch_table(database, table)} ({names}) {select}",
                                   settings=WEIGHT_SETTINGS if route.weight is not None else None)
            written = written or int((result.summary or {}).get("written_rows") or 0)  # the copy's, not the old one's
        return written

    def drop(self, began: BinlogPosition) -> None:
        """The transaction's staging (its end is behind the checkpoint, or it is written afresh)."""
        for name in sorted(self._names(began)):
            self.ch.command(f"DROP TABLE IF EXISTS {ch_table(self.database, name)}")
            self._made.discard(name)
        self.kept.discard(began.key())

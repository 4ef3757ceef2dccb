"""The CDC stream's part of a copy's history (issue 61, slice 2: docs/design/history-tables.md §3).

In the reader process (:func:`history_lane`): every row change of a batch of a table whose copy
keeps a history — not only each place's last, which is what the copy takes — becomes one history
row, stamped from the batch's side table (core/cdc/binlog/commits.py: commit time, GTID,
operation), as one more lane entry (:class:`HistoryRows`) written beside the copy's lanes. Both
are acknowledged before the checkpoint moves, so a replay after a kill writes the same rows again,
which collapse (core/clickhouse/history.py: every column a function of key and version).

In the driver (:class:`RunHistory`): the batch's history rows per table go to the ledger's
``history_applied`` from ``PipelineRun.advance`` before the checkpoint moves (a replay records the
same range again); a history asked of the applier for a copy without one begins from the copy as
it is at the checkpoint (:meth:`RunHistory.enable`); and the stream's other writers to a copy
that keeps a history — not built yet — stop the pipeline before they write (:meth:`RunHistory.refuse`).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import pyarrow as pa

from airflow_sync_provider.core.cdc.binlog.commits import stamps
from airflow_sync_provider.core.cdc.binlog.routes import TableRoute, moved_rows
from airflow_sync_provider.core.cdc.history_ledger import HOLE, Applied, HistoryLedger, Range
from airflow_sync_provider.core.clickhouse.columns import VERSION_COLUMN
from airflow_sync_provider.core.clickhouse.described import comment_of, table_facts
from airflow_sync_provider.core.clickhouse.history import VIA, HistoryTable, Stamp, refuse_unwritten
from airflow_sync_provider.core.content.shaping import HistorySettings, restored
from airflow_sync_provider.core.positions import BinlogError, BinlogPosition
from airflow_sync_provider.core.source.weights import SPLIT_WEIGHT_COLUMN
from airflow_sync_provider.core.sql import ch_string, ch_table


class HistoryRows(tuple):
    """A lane entry (database, table, counts, Arrow IPC bytes) of a copy's history rows: its counts
    are empty (they are no changes of their own: the counters count the copy's)."""


def history_lane(batch, routes: dict[str, TableRoute], every: dict, ipc) -> tuple[list[HistoryRows], dict]:
    """The history rows of ``batch``: ``every`` maps a source table to its changes, each lane's as
    (copy-shaped Arrow of all of them, their deleted flags). Returns the lane's entries and, per
    source table, [history rows, sum of their versions] (for ``history_applied``)."""
    entries, counts = [], {}
    for source, parts in every.items():
        route = routes[source]
        rows = pa.concat_tables([table for table, _ in parts])
        deleted = [flag for _, flags in parts for flag in flags]
        where = f"table {route.source}, binlog {batch.start}…{batch.end}"
        found = stamps(batch.commits, batch.kinds, rows[VERSION_COLUMN].to_numpy(), deleted, where)
        stamp = Stamp(found.event, "binlog", found.commit_us, found.server, gtid_domain=found.gtid_domain,
                      gtid_seq=found.gtid_seq)
        history: HistoryTable = route.history
        table = history.arrow(rows, stamp, moved_rows(deleted) if route.moves else None)  # MOVED only where rows move
        counts[route.source] = [table.num_rows, sum(table[VERSION_COLUMN].to_pylist())]
        entries.append(HistoryRows((history.database, history.name, (), ipc(table))))
    return entries, counts


class RunHistory:
    """A pipeline run's history bookkeeping (``run``: its PipelineRun)."""

    def __init__(self, run):
        self.run = run
        self._ledger: HistoryLedger | None = None
        self._pieces: dict = defaultdict(lambda: [0, 0])  # a large transaction's pieces' counts, until its commit

    @property
    def ledger(self) -> HistoryLedger:
        if self._ledger is None:
            self._ledger = HistoryLedger(self.run.ch, self.run.spec.ledger_database)
            self._ledger.ensure()
            self._ledger.lease = self.run.lease
        return self._ledger

    def piece(self, batch) -> None:
        """A piece of a transaction still open was written: its history rows count with its commit."""
        for source, (rows, total) in batch.history.items():
            self._pieces[source][0] += rows
            self._pieces[source][1] += total

    def applied(self, stream, end: BinlogPosition, batch=None) -> None:
        """Before the checkpoint moves from ``stream.position`` to ``end``: per table of the stream
        that keeps a history, what the range wrote into it (0 rows: the range is still covered).
        A replay after a kill records the same range again (one record per start)."""
        pieces, self._pieces = self._pieces, defaultdict(lambda: [0, 0])
        routes = [r for r in stream.routes.values() if r.history is not None]
        if not routes:
            return
        counts = batch.history if batch is not None else {}
        start, stop = stream.position.version(), end.version()
        self.ledger.write_applied(self.run.spec.pipeline, [
            Applied(r.source, start, stop, counts.get(r.source, [0, 0])[0] + pieces[r.source][0],
                    counts.get(r.source, [0, 0])[1] + pieces[r.source][1]) for r in routes],
            self.run.lease.generation)

    def refuse(self, route: TableRoute | None, write: str, later: str = "slice 3") -> None:
        """Stop the pipeline before ``write`` changes a copy that keeps a history which that path
        does not write yet (core/clickhouse/history.refuse_unwritten)."""
        if route is not None:
            refuse_unwritten(route.history, route.source, write, later, BinlogError)

    def refuse_ddl(self, routes: dict[str, TableRoute], statement, text: str) -> None:
        """A DDL (a schema change, TRUNCATE, RENAME, DROP) on a table whose copy keeps a history."""
        for name in sorted(set(getattr(statement, "tables", None) or ()) & set(routes)):
            self.refuse(routes[name], f"the statement {text.strip()[:120]!r}")

    def enable(self, routes: dict[str, TableRoute]) -> None:
        """The tables this run is asked to keep a history of (the job's ``history``, or a named
        table's) whose copies keep none yet: each history begins from its copy as it is at the
        checkpoint — each key's newest row below it, at its own version, an ``enable`` snapshot at
        the pipeline's last commit time — and the range before is recorded as a hole. The copy's
        comment then says so (last: a kill before it begins again, writing the same rows)."""
        spec, checkpoint = self.run.spec, self.run.state.checkpoint
        named = {f"{t['source_database']}.{t['source_table']}": t for t in spec.tableset.tables if isinstance(t, dict)}
        for name, route in routes.items():
            settings = HistorySettings.of(spec.tableset.content_of(named.get(name)).history)
            if settings is None or route.history is not None:
                continue
            self._refuse_enable(route, routes)
            database, copy = route.target_database, route.target_table
            facts = table_facts(self.run.ch, [(database, copy)])[(database, copy)]
            content = dataclasses.replace(route.schema.content, history=settings)
            history = HistoryTable(dataclasses.replace(route.schema, content=content), database, copy, facts.layout,
                                   SPLIT_WEIGHT_COLUMN in facts.columns)
            history.check()
            self._refuse_earlier(history, name)
            self.run.checkpoints.fence()  # the copies and their histories are written only under the lease
            history.create(self.run.ch)
            stamp = Stamp("snapshot", "enable", int(self.run.state.source_time * 1_000_000))
            history.insert_select(self.run.ch, history.baseline_sql("{enable_below:UInt64}"), stamp,
                                  {"enable_below": checkpoint.version()})
            self.ledger.write_range(spec.pipeline, Range(name, HOLE, 0, checkpoint.version(),
                                                         f"before the history began on the copy at {checkpoint}"))
            comment = restored(comment_of(self.run.ch, database, copy), content)
            self.run.ch.command(f"ALTER TABLE {ch_table(database, copy)} MODIFY COMMENT {ch_string(comment)}")
            route.history = history
            self.run.log(f"{name}: its history {database}.{history.name} begins at {checkpoint}")

    def _refuse_earlier(self, history: HistoryTable, name: str) -> None:
        """A history table left from before (kept when a history was turned off) holds versions a new
        baseline could meet at the same key and version: refused, never mixed (an ``enable``
        baseline alone is this one's, begun by a run killed before the copy's comment said so)."""
        key = (history.database, history.name)
        if table_facts(self.run.ch, [key]) and int(self.run.ch.command(
                f"SELECT count() FROM {history.qualified} WHERE {VIA} != 'enable'")):
            raise BinlogError(f"table {name}: {history.database}.{history.name} exists already with versions of an "
                              "earlier history; a new one begins only beside none: drop or rename it, then run again "
                              "(a retry stops here again)")

    def _refuse_enable(self, route: TableRoute, routes: dict[str, TableRoute]) -> None:
        """What a history cannot follow yet, refused by name before it begins."""
        table = route.table
        if table is not None and table.member:
            refuse_unwritten(True, route.source, "a merged copy's member (a source group)", "slice 3", BinlogError)
        if route.source in self.run.cascading.children(routes):
            refuse_unwritten(True, route.source, "a foreign-key cascade from its parent", "slice 3", BinlogError)
        if table is not None and table.recopying:
            refuse_unwritten(True, route.source, "its re-copy under way", "slice 3", BinlogError)

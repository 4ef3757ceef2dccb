"""Where a pipeline's run starts: the first steps of spark/cdc_apply.PipelineRun, by concern.

The patterns the run applies (the pipeline keeps the ones it was first given), its tables and its
checkpoint (a new pipeline starts where its tables' copies began: their registrations), the
server it reads now — the one its checkpoint is a position of, another one after a failover
(resumed by the checkpoint's GTID state, core/cdc/servers.py), or one that no longer has the
binlog the checkpoint needs (then the stream restarts at the source's position now and every
table is copied again beside it) — and where a bounded run stops. The records a run holds (its
stream, a transaction applied in pieces, the totals) are in spark/cdc_run.py with its views.
"""

from __future__ import annotations

import dataclasses
import time

from airflow_sync_provider.core.cdc.binlog.preflight import BinlogLost, preflight
from airflow_sync_provider.core.cdc.checkpoints import (
    PIPELINE_IDLE,
    PIPELINE_RUNNING,
)
from airflow_sync_provider.core.cdc.servers import (
    GtidNotFound,
    Server,
    common_state,
    gtid_state,
    locate,
    missing_from,
    server_of,
    shared_history,
    with_their_domains,
)
from airflow_sync_provider.core.cdc.tables import PipelineTable
from airflow_sync_provider.core.loads import LOAD_PUBLISHED
from airflow_sync_provider.core.positions import BinlogError, BinlogPosition, current_position
from airflow_sync_provider.core.selection import TableSelection
from airflow_sync_provider.core.source import reader as mysql_reader
from airflow_sync_provider.spark import cdc_ddl
from airflow_sync_provider.spark.cdc_run import Stream
from airflow_sync_provider.spark.cdc_stream import (
    ApplyFailed,
)

JOIN_POLL_SECONDS = 2.0  # how often a running pipeline looks for tables waiting to join


class RunStart:
    """PipelineRun's start steps (a base class: they read and set the run's own state, which
    PipelineRun's constructor makes)."""

    def _selection(self) -> TableSelection | None:
        """The patterns this run applies: the pipeline's own (kept in the ledger by the bootstrap
        or the apply that first gave them), or the run's when it gives them first or changes
        them explicitly (``change_selection``; a ``reset`` starts the pipeline afresh)."""
        spec = self.spec
        self._kept_selection = TableSelection.of(self.checkpoints.selection(spec.pipeline))
        return TableSelection.of(self.checkpoints.selection_for(spec.pipeline, spec.tableset.select,
                                                                spec.change_selection or spec.reset,
                                                                kept=self._kept_selection))

    def _begin(self) -> None:
        """Where the run starts, its tables' routes, the source checked, where it stops."""
        spec, state = self.spec, self.state
        if self.selection != self._kept_selection:
            self.checkpoints.write_selection(spec.pipeline, self.selection.to_dict() if self.selection else None)
        with mysql_reader.connect(spec.source) as conn:
            here = server_of(conn)
            self.epochs.ensure()
            epoch = self.epochs.epoch(here)  # registered when first seen
            start, state.tables = self._start_and_tables(epoch)
            self._start_at(self._on_server(conn, here, start, epoch))
        # a look at every table: asked for, or after a takeover (the last applier died running)
        if spec.verify or (self.previous is not None and self.previous.status == PIPELINE_RUNNING):
            for table in state.tables:
                if table.streaming:
                    table.mark_due()
        self.recopies.settle(state.tables)
        with mysql_reader.connect(spec.source) as conn:
            routes = cdc_ddl.open_routes(conn, self.ch, state.tables, self.spec.salt)
            self.cascading.start(conn, routes)
            self.history.enable(routes)  # the histories asked of this run begin at the checkpoint
            try:
                preflight(conn, self.start, spec.source, spec.server_id + 70)  # the dump probe's own replica id
            except BinlogLost as lost:  # the binlog the checkpoint needs is gone
                self._start_at(self._lost(conn, str(lost)))
            self.stop = BinlogPosition.from_dict(spec.stop_position) or (
                None if spec.service else current_position(conn, epoch=self.epoch))
        if state.prepared or (self.previous is not None and self.previous.status != PIPELINE_IDLE):
            # parked XA transactions whose staging is whole are not read again; staging a crash
            # left behind (after its transaction's end) is dropped
            state.prepared = self.staging.trusted(state.prepared)
        self.stream = Stream(routes, state.tables, self.start)
        if self.totals.binlog_lost:  # every table copied again beside the stream restarted at the source's now
            for table in state.tables:
                if table.streaming and self.recopies.start(routes, table, f"the binlog was lost: "
                                                                          f"{self.totals.binlog_lost['why'][:300]}"):
                    self.totals.recopied.append(table.name)
        state.source_position = self.stop
        self.checkpoints.write(state)
        self.log(f"{len(routes)} table(s) from {self.start} to {self.stop or 'until stopped'}, {spec.lanes} lane(s), "
                 f"lease generation {self.lease.generation}"
                 + (f", tables selected by {self.selection.to_dict()}" if self.selection else ""))

    def _start_at(self, position: BinlogPosition) -> None:
        """Where the run reads from: the checkpoint as this server names it (a failover's
        translation), or the source's now when the binlog it needs is gone (every table re-copied
        beside the stream). The run's other move of the checkpoint is PipelineRun.advance, after a
        batch's writes."""
        self.start = self.state.checkpoint = position

    def _register(self, fresh: bool) -> None:
        """Tables named by the run (full loads, or tables with a start position) join the pipeline
        from where their copies began; a table already in it keeps its place."""
        spec = self.spec
        for key in spec.start_from_loads:
            load = self.loads.state(key)
            if load is None or load.status != LOAD_PUBLISHED:
                raise ApplyFailed(f"pipeline {spec.pipeline!r}: full load {key!r} is "
                                  f"{load.status if load else 'not in the ledger'}; start from a published load")
            if not load.start_position:
                raise ApplyFailed(f"pipeline {spec.pipeline!r}: full load {key!r} recorded no binlog position "
                                  "(binlog off or not visible to its user when it ran); reload with binlog access "
                                  "to start CDC")
            source_db, source_table = load.source_table.split(".", 1)
            target_db, target_table = load.target_table.split(".", 1)
            table = PipelineTable(source_db, source_table, target_db, target_table, load.spec.get("columns"),
                                  load.spec.get("exclude_columns") or [], load.plan.get("split_column"))
            shape = load.spec.get("source_shape") or {}
            table.shape, table.key = shape.get("shape"), shape.get("key")
            self.checkpoints.register(spec.pipeline, table, BinlogPosition.from_dict(load.start_position))
        known = ({r.name for r in self.checkpoints.registrations(spec.pipeline)} | {t.name for t in self.state.tables}
                 if spec.tableset.tables else set())
        for entry in spec.tableset.tables:
            table = PipelineTable.of(entry)
            if table.name in known:
                continue
            if not spec.start_position:
                raise ApplyFailed(f"pipeline {spec.pipeline!r}: table {table.name} is not part of it; bootstrap it "
                                  "(CdcBootstrapOperator / airflow-sync cdc bootstrap), start from its full load "
                                  "(start_from_loads) or give start_position")
            self.checkpoints.register(spec.pipeline, table, BinlogPosition.from_dict(spec.start_position))
        if fresh and not self.checkpoints.registrations(spec.pipeline) and self.selection is None:
            raise ApplyFailed(f"pipeline {spec.pipeline!r} has no tables yet: bootstrap them (CdcBootstrapOperator), "
                              "start from full loads of them (start_from_loads=[load keys]) or give start_position "
                              "with tables")

    @property
    def epoch(self) -> int:
        """The source server's epoch (core/cdc/servers.py): the top byte of every version written."""
        return self.state.checkpoint.epoch

    def _on_server(self, conn, here: Server, start: BinlogPosition, epoch: int) -> BinlogPosition:
        """The run's start on the server it reads: the checkpoint itself on the server it is a
        position of; on another server (a failover) the checkpoint's GTID state found there."""
        origin = Server.from_dict(self.state.server) or self.epochs.server_of_epoch(start.epoch) or here
        self.state.server = here.to_dict()
        if origin.key == here.key:  # the checkpoint's epoch is the server's (earlier releases: 0)
            return dataclasses.replace(start, epoch=max(start.epoch, epoch))
        return self._move(conn, origin, here, start)

    def _move(self, conn, origin: Server, here: Server, start: BinlogPosition) -> BinlogPosition:
        """Resume on another server with the same history (a promoted replica behind the same
        address, or a connection pointed at it): find the checkpoint's GTID state in its binlog.
        What the copy holds that the server never had (a replica promoted while behind) is
        brought level by a look at every table; a history the server cannot serve (purged, or a
        gap) is handled as a lost binlog."""
        spec = self.spec
        if not start.gtid:
            raise BinlogError(f"pipeline {spec.pipeline!r}: its checkpoint {start} is a position on {origin}, and "
                              f"the source is now {here}; the checkpoint carries no GTID state (written by an earlier "
                              "release, or GTIDs are off), so its place in this server's binlog cannot be found. A "
                              "retry stops here again: bootstrap the tables again (restart=True)")
        epoch = self.epochs.register(here)  # above every server before: what is read from here out-ranks them
        theirs = gtid_state(conn)
        missing = missing_from(start.gtid, theirs, here.mariadb)
        resume = with_their_domains(common_state(start.gtid, theirs, here.mariadb) if missing else start.gtid, theirs,
                                    here.mariadb)
        self.totals.failover = {"from": origin.to_dict(), "to": here.to_dict(), "checkpoint": start.to_dict(),
                                "epoch": epoch, "missing": missing}
        try:
            position = locate(spec.source, resume, here.mariadb, spec.server_id + 50, epoch)
        except GtidNotFound as exc:  # its history left ours (promoted while behind), or does not reach back
            shared = shared_history(conn, start.gtid) if here.mariadb else None
            if shared is None:
                return self._lost(conn, f"{here} cannot serve the checkpoint's GTID state {resume!r} ({exc})", epoch)
            missing = missing_from(start.gtid, shared, True)
            self.totals.failover["missing"] = missing
            position = locate(spec.source, with_their_domains(shared, theirs, True), True, spec.server_id + 50,
                              epoch)
        self.totals.failover["resumed_at"] = position.to_dict()
        if self.state.prepared:  # where they began is a position on the old server: forgotten, and
            # their commits here count as unseen (every table is looked at after them)
            self.log(f"XA transaction(s) prepared on {origin} and not committed: {sorted(self.state.prepared)}")
            self.state.prepared = {}
        self.log(f"the source is now {here} (was {origin}): resuming at GTID {resume} = {position}"
                 + (f"; it never had {missing}, which the copy holds: every table is looked at and brought level"
                    if missing else ""))
        if missing:
            for table in self.state.tables:
                if table.streaming:
                    table.mark_due()
        return position

    def _lost(self, conn, why: str, epoch: int | None = None) -> BinlogPosition:
        """The binlog the checkpoint needs is gone: with ``on_binlog_lost="recopy"`` (the default)
        the stream restarts at the source's position now and every table is copied again beside it
        (:meth:`_begin`); with ``"stop"`` the pipeline stops, at every retry."""
        spec = self.spec
        if spec.on_binlog_lost == "stop":
            raise BinlogLost(f"pipeline {spec.pipeline!r}: {why}. A retry stops here again: let the pipeline copy "
                             "its tables again beside the stream (on_binlog_lost='recopy', the default), or "
                             "re-bootstrap them (restart=True)")
        position = current_position(conn, epoch=self.epoch if epoch is None else epoch)
        self.totals.binlog_lost = {"why": why, "checkpoint": self.state.checkpoint.to_dict(),
                                   "restarted_at": position.to_dict()}
        self.state.prepared = {}  # their rows are in the copies made beside the stream
        self.log(f"{why}: the stream restarts at {position} and every table is copied again beside it")
        return position

    def _start_and_tables(self, epoch: int) -> tuple[BinlogPosition, list[PipelineTable]]:
        """Where the run starts and the pipeline's tables: those of the checkpoint, as it knew
        them (the others join during the run)."""
        spec, previous = self.spec, self.previous
        fresh = previous is None or previous.checkpoint is None or spec.reset
        if spec.reset:
            self.checkpoints.forget_tables(spec.pipeline)
        self._register(fresh)
        registrations = self._registrations = self.checkpoints.registrations(spec.pipeline)
        if not fresh:
            tables = list(previous.tables)
            known = {t.name for t in tables}
            # joined, but the state written after joining was lost with its applier
            tables += [r.table for r in registrations if r.joined and r.name not in known]
            return previous.checkpoint, tables
        if not registrations:  # a new pipeline of patterns alone: its tables are copied beside the stream from now
            with mysql_reader.connect(spec.source) as conn:
                return current_position(conn, epoch=epoch), []
        start = min((r.since for r in registrations), key=BinlogPosition.key)  # a new pipeline: all join now
        for registration in registrations:
            if not registration.joined:
                registration.joined = True
                self.checkpoints.write_registration(spec.pipeline, registration)
        return start, [r.table for r in registrations]

    def _asked_to_stop(self) -> bool:
        """Has `cdc stop` asked this service (its lease generation) to stop? Sets ``stop_asked``
        to the reason given."""
        if not self.spec.service:
            return False
        self.stop_asked = self.checkpoints.stop_requested(self.spec.pipeline, self.lease.generation)
        if self.stop_asked is None:
            return False
        self.log(f"stopping at the next batch boundary, as asked ({self.stop_asked or 'cdc stop'})")
        return True

    def _await_tables(self) -> None:
        """A service started for a new pipeline before any table joined it (e.g. ahead of the
        bootstrap) waits for the first table instead of failing; bounded runs do not wait."""
        spec, previous = self.spec, self.previous
        if (not spec.service or spec.tableset.tables or spec.start_from_loads or (previous and previous.checkpoint)
                or self.selection is not None):
            return
        announced = False
        while not self.checkpoints.registrations(spec.pipeline):
            if spec.max_seconds and time.time() - self.started > spec.max_seconds:
                raise ApplyFailed(f"pipeline {spec.pipeline!r}: no table joined within {spec.max_seconds:.0f} s")
            if self._asked_to_stop():
                return
            if not announced:
                self.log("waiting for a table to join (a bootstrap or a full load given to start_from_loads)")
                announced = True
            self.checkpoints.write(self.state)  # heartbeat: `cdc status` shows it waiting
            time.sleep(JOIN_POLL_SECONDS)

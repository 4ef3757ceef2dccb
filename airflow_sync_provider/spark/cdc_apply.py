"""CDC catch-up: binlog → ClickHouse, versions in binlog order, checkpoint after the write.

A run of a pipeline's applier is a :class:`PipelineRun`: it takes the pipeline's lease, finds
its checkpoint (or, for a new pipeline, the earliest position its tables' copies began at:
the registrations of core/cdc/checkpoints.py), checks the source, then follows the binlog in
batches of complete transactions, read and decoded by reader processes (spark/cdc_stream.py)
and written by apply lanes. Only when every lane's write of a batch has been acknowledged does
the checkpoint advance past it (:meth:`PipelineRun.advance`, the one place it moves), so it is
never ahead of durable data; a failed write leaves it before the batch, and the next run
replays from there (same versions: idempotent). A transaction larger than a batch comes in
pieces (core/cdc/binlog/batches.Batch): each is written as it comes, but the checkpoint, the counters
and the totals take the transaction only with its commit (:meth:`PipelineRun._piece`), so a
crash inside it replays it from its start. A DDL on a pipeline table is followed before
the checkpoint passes it (spark/cdc_ddl.py). Tables registered meanwhile join, re-copies run
beside the stream, tables due a check are verified against the source (spark/cdc_verify.py).

A run that stops for a reason a retry cannot fix (a :class:`BinlogError`) leaves the pipeline
``stopped`` with its checkpoint before the cause, so every retry stops there again until the
remedy in the error is applied; other failures leave it ``failed`` (a retry replays).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass, field

from airflow_sync_provider.core.cdc import ddl
from airflow_sync_provider.core.cdc.binlog.preflight import BinlogLost, preflight
from airflow_sync_provider.core.cdc.binlog.routes import TableRoute
from airflow_sync_provider.core.cdc.checkpoints import (
    PIPELINE_FAILED,
    PIPELINE_IDLE,
    PIPELINE_RUNNING,
    PIPELINE_STOPPED,
    Checkpoints,
    PipelineState,
)
from airflow_sync_provider.core.cdc.lease import Lease, LeaseError
from airflow_sync_provider.core.cdc.servers import (
    GtidNotFound,
    Server,
    ServerEpochs,
    common_state,
    gtid_state,
    locate,
    missing_from,
    server_of,
    shared_history,
    with_their_domains,
)
from airflow_sync_provider.core.cdc.staging import XaStaging
from airflow_sync_provider.core.cdc.tables import PipelineTable, Registration
from airflow_sync_provider.core.crash_points import crash_point
from airflow_sync_provider.core.jobspec import CdcApplySpec
from airflow_sync_provider.core.ledger import LOAD_PUBLISHED, Ledger
from airflow_sync_provider.core.positions import BinlogError, BinlogPosition, current_position
from airflow_sync_provider.core.source import reader as mysql_reader
from airflow_sync_provider.core.source.selection import TableSelection
from airflow_sync_provider.core.target import clickhouse as target
from airflow_sync_provider.spark import cdc_ddl, cdc_verify
from airflow_sync_provider.spark.cdc_stream import (
    ApplyFailed,
    Decoded,
    Readers,
    ReadRange,
    reader_processes,
    write_lanes,
)
from airflow_sync_provider.spark.session import LazySession, lazy

__all__ = ["ApplyFailed", "PipelineRun", "run_cdc_apply"]

JOIN_POLL_SECONDS = 2.0  # how often a running pipeline looks for tables waiting to join


@dataclass
class Applying:
    """A transaction being applied in pieces: written past the stream's position, not claimed."""

    began: BinlogPosition
    since: float
    through: BinlogPosition | None = None
    pieces: int = 0
    changes: int = 0  # row changes written to the copy
    staged: int = 0  # rows of an XA transaction written to staging (core/cdc/staging.py)
    per_table: dict = field(default_factory=dict)  # source table → [row changes, rows written]

    def to_dict(self, joining: str = "") -> dict:
        return {"began": self.began.to_dict(), "through": (self.through or self.began).to_dict(), "since": self.since,
                "pieces": self.pieces, "changes": self.changes, "staged": self.staged} | (
                    {"joining": joining} if joining else {})


@dataclass
class Stream:
    """What one follow of the binlog applies: ``routes`` (name → route) of ``tables``, from
    ``position``. The pipeline's stream moves its checkpoint; a table joining replays its own
    changes up to the checkpoint first, moving its registration's ``since`` (``joining``)."""

    routes: dict[str, TableRoute]
    tables: list[PipelineTable]
    position: BinlogPosition
    joining: Registration | None = None
    applying: Applying | None = None  # the open transaction's pieces written so far


@dataclass
class Totals:
    events: int = 0
    rows_written: int = 0
    joined: list = field(default_factory=list)
    ddl: int = 0
    recopied: list = field(default_factory=list)
    verified: list = field(default_factory=list)
    repaired_shards: int = 0
    failover: dict = field(default_factory=dict)  # the source became another server: from, to, where
    binlog_lost: dict = field(default_factory=dict)  # the binlog the checkpoint needed was gone: what it cost
    xa_commits_unseen: int = 0  # commits of XA transactions prepared before the copy (BinlogReader)
    pieces: int = 0  # pieces of large transactions written (core/cdc/binlog/batches.Batch)
    xa_staged: int = 0  # rows of large XA transactions written to staging (core/cdc/staging.py)


class PipelineRun:
    """One run of a pipeline's applier: bounded (to ``stop``) or a service (until stopped or
    ``max_seconds``). Holds the run's context once: spec, Spark session, ClickHouse client,
    ledger, lease, the pipeline's state and stream, re-copies and totals."""

    def __init__(self, spec: CdcApplySpec, session: LazySession, ch, checkpoints: Checkpoints, lease: Lease):
        self.spec, self.session, self.ch, self.checkpoints, self.lease = spec, session, ch, checkpoints, lease
        self._loads: Ledger | None = None
        self.started = time.time()
        self.deadline = self.started + spec.max_seconds if spec.max_seconds else None
        self.previous = checkpoints.state(spec.pipeline)  # read under the lease: the last holder's final word
        self.state = PipelineState(
            spec.pipeline, PIPELINE_RUNNING, self.previous.checkpoint if self.previous else None,
            self.previous.tables if self.previous else [], "",
            self.previous.source_position if self.previous else None,
            self.previous.source_time if self.previous else 0.0,
            self.previous.events if self.previous and not spec.reset else 0,
            generation=lease.generation, holder=lease.holder,
            server=self.previous.server if self.previous and not spec.reset else None,
            prepared=self.previous.prepared if self.previous and not spec.reset else {})
        self.selection = self._selection()
        self.stream: Stream | None = None
        self.stop: BinlogPosition | None = None
        self.start: BinlogPosition | None = None
        self.totals = Totals()
        self.recopies = cdc_ddl.Recopies(self)
        self.epochs = ServerEpochs(checkpoints)
        self.staging = XaStaging(ch, spec.ledger_database, spec.pipeline)
        self.writing = threading.RLock()  # a DDL is followed, a copy swapped, while no verification looks
        self.verifier = cdc_verify.Verifier(self)
        self.stream_ended = False
        self._polled = time.monotonic()
        self._registrations: list | None = None

    def log(self, text: str) -> None:
        cdc_ddl.note(self.spec.pipeline, text)

    @property
    def loads(self) -> Ledger:
        """The load ledger (full loads to start from, re-copies), made sure of when first used."""
        if self._loads is None:
            self._loads = Ledger(self.ch, self.spec.ledger_database)
            self._loads.ensure()
        return self._loads

    # --- the run ------------------------------------------------------------------------

    def run(self) -> dict:
        state = self.state
        try:
            self.checkpoints.write(state)  # from now on older generations' writes are ignored
            self._await_tables()
            self._begin()
            self._loop()
            state.status, state.error = PIPELINE_IDLE, ""
            self.checkpoints.write(state)
        except BaseException as exc:
            stopped = isinstance(exc, BinlogError) and not exc.retry_helps
            state.status = PIPELINE_STOPPED if stopped else PIPELINE_FAILED
            state.error = f"{type(exc).__name__}: {exc}"
            if stopped and "retry" not in state.error:  # whether a retry helps, in every stop's words
                state.error += " (a retry stops here again until the remedy is applied)"
            state.error = state.error[:4000]
            if not self.lease.lost:  # else the state is the next holder's to write
                self.checkpoints.write(state)  # the checkpoint stays at the last durable batch
            if isinstance(exc, (BinlogError, ApplyFailed, LeaseError, ValueError)):
                raise
            raise ApplyFailed(f"pipeline {self.spec.pipeline!r} failed at checkpoint {state.checkpoint}: "
                              f"{type(exc).__name__}: {exc}. A retry may help: it replays from the checkpoint") \
                from exc
        finally:
            self.stream_ended = True
            self.verifier.shut()
            self.recopies.close()
        totals = dataclasses.asdict(self.totals)
        return {"pipeline": self.spec.pipeline, "tables": sorted(self.stream.routes) if self.stream else [],
                "start": self.start.to_dict(), "checkpoint": state.checkpoint.to_dict(),
                "stop": self.stop.to_dict() if self.stop else None, **totals, "lanes": self.spec.lanes,
                "generation": self.lease.generation, "selection": self.selection.to_dict() if self.selection else None,
                "prepared_xa": len(state.prepared), "seconds": round(time.time() - self.started, 3)}

    def _selection(self) -> TableSelection | None:
        """The patterns this run applies: the pipeline's own (kept in the ledger by the bootstrap
        or the apply that first gave them), or the run's when it gives them first or changes
        them explicitly (``change_selection``; a ``reset`` starts the pipeline afresh)."""
        spec = self.spec
        self._kept_selection = TableSelection.of(self.checkpoints.selection(spec.pipeline))
        return TableSelection.of(self.checkpoints.selection_for(spec.pipeline, spec.select,
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
            self.start = state.checkpoint = self._on_server(conn, here, start, epoch)
        # a look at every table: asked for, or after a takeover (the last applier died running)
        if spec.verify or (self.previous is not None and self.previous.status == PIPELINE_RUNNING):
            for table in state.tables:
                if table.streaming:
                    table.mark_due()
        self.recopies.settle(state.tables)
        with mysql_reader.connect(spec.source) as conn:
            routes = cdc_ddl.open_routes(conn, self.ch, state.tables)
            try:
                preflight(conn, self.start, spec.source, spec.server_id + 70)  # the dump probe's own replica id
            except BinlogLost as lost:  # the binlog the checkpoint needs is gone
                self.start = state.checkpoint = self._lost(conn, str(lost))
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
                 if spec.tables else set())
        for entry in spec.tables:
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

    def _await_tables(self) -> None:
        """A service started for a new pipeline before any table joined it (e.g. ahead of the
        bootstrap) waits for the first table instead of failing; bounded runs do not wait."""
        spec, previous = self.spec, self.previous
        if (not spec.service or spec.tables or spec.start_from_loads or (previous and previous.checkpoint)
                or self.selection is not None):
            return
        announced = False
        while not self.checkpoints.registrations(spec.pipeline):
            if spec.max_seconds and time.time() - self.started > spec.max_seconds:
                raise ApplyFailed(f"pipeline {spec.pipeline!r}: no table joined within {spec.max_seconds:.0f} s")
            if not announced:
                self.log("waiting for a table to join (a bootstrap or a full load given to start_from_loads)")
                announced = True
            self.checkpoints.write(self.state)  # heartbeat: `cdc status` shows it waiting
            time.sleep(JOIN_POLL_SECONDS)

    def _loop(self) -> None:
        """Follow the binlog from the checkpoint until the stop; tables registered meanwhile join,
        re-copies run beside the stream, tables due a verification are checked."""
        self.recopies.resume(self.state.tables)  # a crashed applier's unfinished re-copies
        self.totals.recopied += self._adopt_selected()
        self.verifier.collect()
        self.verifier.start()  # looks at the tables beside the stream
        while True:
            self.recopies.collect()
            self.totals.joined += self.join()
            self.verifier.collect()
            if self.follow(self.stream, self.stop, self.deadline, self._waiting):
                break
        for name in list(self.recopies.running):  # a run ends with its re-copies done and recorded
            self.recopies.wait(name)
        self.stream_ended = True
        self.verifier.close()
        self.verifier.collect()
        if not self.spec.service:  # a bounded run checks what is due before it ends
            self.verifier.catch_up()

    def _waiting(self) -> bool:
        """Should the stream pause (a re-copy finished, a table waits to join)? The verifier's looks
        are recorded meanwhile (between batches: the entries travel with the next checkpoint)."""
        self.verifier.collect()
        if self.recopies.finished():
            return True
        if time.monotonic() - self._polled < JOIN_POLL_SECONDS:
            return False
        self._polled = time.monotonic()
        return any(not r.joined for r in self.checkpoints.registrations(self.spec.pipeline))

    # --- following the binlog --------------------------------------------------------------

    def advance(self, stream: Stream, end: BinlogPosition, batch: Decoded | None = None) -> None:
        """The one place a checkpoint moves: to ``end``, once every write it covers has been
        acknowledged (and every DDL before it followed). The pipeline's checkpoint travels with
        its tables' entries; a joining table's replay moves its registration's ``since``."""
        if stream.joining is not None:
            stream.joining.since = end
            self.checkpoints.write_registration(self.spec.pipeline, stream.joining)
        else:
            self.state.checkpoint = end
            if batch is not None:
                self.state.prepared = batch.prepared
                self.state.events += batch.events
                self.state.source_time = batch.last_event_at or self.state.source_time
            self.checkpoints.write(self.state)
        stream.position = end

    def follow(self, stream: Stream, stop: BinlogPosition | None, deadline: float | None = None,
               poll=lambda: False) -> bool:
        """Apply ``stream``'s changes from its position until ``stop`` (True) or until ``poll()``
        asks to pause (False), following each DDL on its tables before reading on."""
        if stop is not None and stop.key() <= stream.position.key():
            return True  # nothing to read (a service's blocking reader would wait for the next event)
        while True:
            main = stream.joining is None
            part = ReadRange(stream.routes, frozenset(t.name for t in stream.tables), stream.position, stop, deadline,
                             self.selection.to_dict() if self.selection and main else None,
                             self.state.prepared if main else None)
            reader = Readers(self.spec, part)
            try:
                batch = self._apply_batches(stream, reader, poll)
            finally:
                reader.close()
            if batch is None:
                return False
            if batch.ddl:
                self._follow_ddl(stream, batch)
            if batch.done or (stop is not None and stop.key() <= stream.position.key()):
                return True

    def _apply_batches(self, stream: Stream, reader: Readers, poll) -> Decoded | None:
        """Write the reader's batches lane by lane and advance the checkpoint past each once all
        its writes are acknowledged; returns the last batch (done: the stop was reached; ddl: it
        must be followed before reading on), or None when ``poll()`` asks to pause."""
        while True:
            batch = reader.next_batch()
            crash_point("cdc.batch-read")
            staged = self._stage(stream, batch) if batch.stage is not None else 0
            payloads = [lane for lane in batch.payloads if lane]
            per_table = {source: [count, 0, 0] for source, count in batch.per_table.items()}
            if payloads:
                try:
                    results = write_lanes(self.spec, self.session, payloads, batch.events)
                except Exception:
                    if batch.through is None:  # a piece's changes count with its commit
                        self.checkpoints.count(self.spec.pipeline,
                                               {t: [n, 0, n] for t, (n, _, _) in per_table.items()})
                    raise
                for lane in results:
                    for source, rows in lane:
                        per_table[source][1] += rows
                        self.totals.rows_written += rows
            if batch.through is not None:
                self._piece(stream, batch, per_table, staged)
                if batch.done:  # the binlog ended inside it (not at a commit): claimed by a later run
                    return batch
                continue
            crash_point("cdc.written")
            for end in batch.staged_ends:  # XA transactions in staging committed here: into the copies
                self._staged_end(stream, end, per_table)
            batch = self._claim(stream, batch, per_table, staged)
            self.totals.events += batch.events
            if batch.xa_commits_unseen:
                self._unseen_xa_commits(stream, batch)
            self.advance(stream, batch.end, batch)  # every write acknowledged: the checkpoint may pass the batch
            for end in batch.staged_ends:  # their ends are behind the checkpoint: staging no longer needed
                self.staging.drop(BinlogPosition.from_dict(end["began"]))
            self.checkpoints.count(self.spec.pipeline, per_table)
            crash_point("cdc.checkpointed")
            if batch.ddl or batch.done:
                return batch
            if poll():
                return None

    def _piece(self, stream: Stream, batch: Decoded, per_table: dict, staged: int) -> None:
        """A piece of a transaction still open (core/cdc/binlog/batches.Batch) has been written at its
        versions; its changes are claimed — checkpoint, counters, totals — only with the batch
        of its commit (:meth:`_claim`), so nothing half-applied is acknowledged. Meanwhile the
        state says how far the transaction got (``applying``), the checkpoint unchanged."""
        open_ = stream.applying = stream.applying or Applying(batch.end, time.time())
        open_.through, open_.pieces = batch.through, open_.pieces + 1
        open_.changes += batch.events
        open_.staged += staged
        for source, (changes, written, _) in per_table.items():
            counts = open_.per_table.setdefault(source, [0, 0])
            counts[0] += changes
            counts[1] += written
        self.totals.pieces += 1
        self.state.applying = open_.to_dict(stream.joining.name if stream.joining else "")
        self.checkpoints.write(self.state)
        crash_point("cdc.piece-written")

    def _claim(self, stream: Stream, batch: Decoded, per_table: dict, staged: int) -> Decoded:
        """The batch holding the end of the transaction whose pieces came before: its changes
        count now, with the batch's own."""
        open_, stream.applying = stream.applying, None
        if open_ is None:
            return batch
        self.state.applying = None
        for source, (changes, written) in open_.per_table.items():
            counts = per_table.setdefault(source, [0, 0, 0])
            counts[0] += changes
            counts[1] += written
        seconds = time.time() - open_.since
        if open_.staged and not open_.changes:
            self.log(f"an XA transaction from {open_.began}: {open_.staged + staged:,} rows written to staging in "
                     f"{open_.pieces + 1} pieces over {seconds:.1f} s (core/cdc/staging.py)")
        else:
            self.log(f"a large transaction from {open_.began} applied: {open_.changes:,} row changes in "
                     f"{open_.pieces} piece(s), then the batch of its commit, over {seconds:.1f} s")
        return dataclasses.replace(batch, events=batch.events + open_.changes)

    def _stage(self, stream: Stream, batch: Decoded) -> int:
        """Write a batch's staging rows (an XA transaction beyond the bounds, core/cdc/staging.py)."""
        payloads = [lane for lane in batch.staging if lane]
        targets = {stage: stream.routes[counts[0][0]] for lane in payloads for _, stage, counts, _ in lane}
        self.checkpoints.fence()  # staging is written only under the lease, as the copies are
        self.staging.prepare(batch.stage, targets)
        rows = sum(n for lane in write_lanes(self.spec, self.session, payloads, 0) for _, n in lane) if payloads else 0
        self.totals.xa_staged += rows
        return rows

    def _staged_end(self, stream: Stream, end: dict, per_table: dict) -> None:
        """An XA transaction in staging committed: each key's last change written to its copy at
        the commit's version (XA ROLLBACK: nothing; its staging is dropped after the checkpoint)."""
        if not end["commit"]:
            return
        began = BinlogPosition.from_dict(end["began"])
        for source, low in end["sources"].items():
            route = stream.routes.get(source)
            if route is None:  # the table left the pipeline since
                continue
            written = self.staging.commit(began, route, low, end["version"])
            per_table.setdefault(source, [0, 0, 0])[1] += written
            self.totals.rows_written += written

    def _unseen_xa_commits(self, stream: Stream, batch: Decoded) -> None:
        """XA COMMITs of transactions prepared before the stream began (before a copy's snapshot,
        or a joining table's): their rows are in no snapshot and not in the stream, so the
        stream's tables are looked at (and repaired)."""
        self.totals.xa_commits_unseen += batch.xa_commits_unseen
        for table in stream.tables:
            if table.streaming:
                table.mark_due()
        self.log(f"{batch.xa_commits_unseen} XA transaction(s) prepared before the stream began committed by "
                 f"{batch.end}: {', '.join(t.name for t in stream.tables if t.streaming)} looked at")

    def _follow_ddl(self, stream: Stream, batch: Decoded) -> None:
        """Follow the DDL the batch ended before; the checkpoint passes it only then (a crash in
        between follows it again: following is idempotent)."""
        text, schema, after, _ = batch.ddl
        self.checkpoints.fence()  # the ALTERs and a re-copy write the copy: only under the lease
        with self.writing:
            changed, recopied = cdc_ddl.follow(self, stream.routes, stream.tables, ddl.parse(text, schema), after,
                                               text)
        self.totals.ddl += 1
        self.totals.recopied += recopied
        crash_point("cdc.ddl-followed")
        # the DDL's effects and the tables' new shapes are recorded with the checkpoint past it
        self.advance(stream, after)
        if changed:
            self.log(f"{', '.join(changed)} changed at {after}: {text[:200]}")

    # --- tables joining -----------------------------------------------------------------------

    def join(self) -> list[str]:
        """Tables registered since the stream started (a bootstrap under way, a full load) join it:
        each first replays its own changes from where its copy began up to the checkpoint."""
        joined, state = [], self.state
        # the run's first look reuses what its start read a moment before
        registrations, self._registrations = self._registrations or self.checkpoints.registrations(
            self.spec.pipeline), None
        for registration in registrations:
            if registration.joined:
                continue
            table = registration.table
            with mysql_reader.connect(self.spec.source) as conn:
                routes = cdc_ddl.open_routes(conn, self.ch, [table])
            if registration.since.key() < state.checkpoint.key():
                self.log(f"{table.name} replays {registration.since} … {state.checkpoint} before joining")
                self.follow(Stream(routes, [table], registration.since, registration), state.checkpoint)
            # its copy covers every change before its start: skipped from now on (a table that
            # stopped the pipeline is re-bootstrapped past the change that stopped it)
            table.skip_before = max(table.skip_before, registration.since.version())
            for route in routes.values():
                route.skip_before = table.skip_before
            earlier = state.table(table.name)
            if earlier is not None:  # bootstrapped again: its counts stay, the rest is the new copy's
                for name in ("recopies", "last_recopy", "verified", "verifications", "repaired"):
                    setattr(table, name, getattr(earlier, name))
                state.tables.remove(earlier)
            state.tables.append(table)
            self.stream.routes.pop(table.name, None)
            self.stream.routes.update(routes)
            if any("staged" in e for e in state.prepared.values()):  # staged without the new table's rows
                self.staging.forget()
                state.prepared = {x: {k: v for k, v in e.items() if k != "staged"} for x, e in state.prepared.items()}
            self.checkpoints.write(state)  # the table is the pipeline's now ...
            registration.joined, registration.since = True, state.checkpoint
            self.checkpoints.write_registration(self.spec.pipeline, registration)  # ... and no longer waits
            joined.append(table.name)
            self.log(f"{table.name} joined at {state.checkpoint}")
        return joined

    def _adopt_selected(self) -> list[str]:
        """Tables the pipeline's patterns select now that it does not have yet join it (copied
        beside the stream); later ones join as their CREATE / RENAME TABLE is read. Returns those
        being copied."""
        if self.selection is None:
            return []
        with mysql_reader.connect(self.spec.source) as conn:
            names = self.selection.resolve(conn)
        selected = set(names)
        for table in self.state.tables:  # no longer selected (the patterns changed, the table is gone): it leaves
            if table.by_selection and table.streaming and table.name not in selected:
                route = self.stream.routes.pop(table.name, None)
                table.leave(f"no longer selected by {self.selection.to_dict()}")
                self.log(f"{table.name} is no longer selected: it leaves the pipeline"
                         + ("" if table.member and self.spec.on_shard_removed == "delete" else ", its copy is kept"))
                if route is not None:  # a merged copy's member: its rows as on_shard_removed says, ranked
                    with mysql_reader.connect(self.spec.source) as conn:  # above all it wrote (a re-copy's too)
                        cdc_ddl.shard_removed(self, route, current_position(conn, epoch=self.epoch))
        known = {t.name for t in self.state.tables}
        new = [n for n in names if n not in known]
        self.log(f"{self.selection.to_dict()} selects {len(names)} table(s)"
                 + (f"; {len(new)} join now: {', '.join(new)}" if new else ""))
        copied = [n for n in new if self.recopies.adopt(self.stream.routes, self.state.tables, n,
                                                        f"selected by the patterns at {self.state.checkpoint}")]
        unstreamable = [f"{t.name} ({t.unstreamable})" for t in self.state.tables if t.unstreamable]
        if unstreamable:
            self.log("not streamed: " + "; ".join(unstreamable))
        self.checkpoints.write(self.state)
        return copied

    # --- verification ---------------------------------------------------------------------

    def follow_to(self, position: BinlogPosition) -> bool:
        """Apply up to ``position`` (the verifier's snapshot, at a bounded run's end)."""
        self.follow(self.stream, position)
        return True


def run_cdc_apply(spec: CdcApplySpec, spark) -> dict:
    """``spark``: a SparkSession or a :class:`LazySession` (spark_jobs/cdc_apply.py), built only
    when a batch is too large for the driver to write (``driver_write_rows``)."""
    if spec.service:  # its reader is a process: have the fork server warm by the time it is needed
        reader_processes()
    ch = target.client(spec.target)
    try:
        checkpoints = Checkpoints(ch, spec.ledger_database)
        checkpoints.ensure()
        lease = Lease.acquire(spec.source, checkpoints, spec.pipeline)  # refused: names the holder
        try:
            # From here every ledger write checks the lease first (Checkpoints.fence): the
            # checkpoint after each batch, so also before the next batch's write and before a
            # DDL's ALTER, which follows its batch's checkpoint.
            checkpoints.lease = lease
            return PipelineRun(spec, lazy(spark), ch, checkpoints, lease).run()
        finally:
            lease.release()
    finally:
        ch.close()

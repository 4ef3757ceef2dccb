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

from airflow_sync_provider.core.cdc import ddl
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
    ServerEpochs,
)
from airflow_sync_provider.core.cdc.staging import XaStaging
from airflow_sync_provider.core.clickhouse import multisets
from airflow_sync_provider.core.clickhouse.client import client
from airflow_sync_provider.core.clickhouse.described import relaid
from airflow_sync_provider.core.clickhouse.layout import reshape_refused
from airflow_sync_provider.core.crash_points import crash_point
from airflow_sync_provider.core.jobspec import CdcApplySpec
from airflow_sync_provider.core.ledger import Ledger
from airflow_sync_provider.core.positions import BinlogError, BinlogPosition, current_position
from airflow_sync_provider.core.source import reader as mysql_reader
from airflow_sync_provider.core.source.group import member_filter
from airflow_sync_provider.spark import cdc_ddl, cdc_verify
from airflow_sync_provider.spark.cdc_cascades import Cascading
from airflow_sync_provider.spark.cdc_history import RunHistory
from airflow_sync_provider.spark.cdc_run import Applying, Stream, Totals
from airflow_sync_provider.spark.cdc_start import JOIN_POLL_SECONDS, RunStart
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

class PipelineRun(RunStart):
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
            prepared=self.previous.prepared if self.previous and not spec.reset else {},
            foreign_keys=self.previous.foreign_keys if self.previous and not spec.reset else None)
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
        self.cascading = Cascading(self)  # what foreign keys change without binlog events
        self.history = RunHistory(self)  # the copies' histories: what the stream wrote there, what it may not
        self.stream_ended = False
        self._polled = time.monotonic()
        self._registrations: list | None = None
        self.stop_asked: str | None = None  # `cdc stop`: the reason given, once seen

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
            if self.stop_asked is None:  # else asked to stop before any table joined
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
                "start": self.start.to_dict() if self.start else None,
                "checkpoint": state.checkpoint.to_dict() if state.checkpoint else None,
                "stop": self.stop.to_dict() if self.stop else None, **totals, "lanes": self.spec.lanes,
                "generation": self.lease.generation, "selection": self.selection.to_dict() if self.selection else None,
                "prepared_xa": len(state.prepared), "seconds": round(time.time() - self.started, 3),
                "stopped_as_asked": self.stop_asked is not None}

    def _loop(self) -> None:
        """Follow the binlog from the checkpoint until the stop; tables registered meanwhile join,
        re-copies run beside the stream, tables due a verification are checked."""
        self.recopies.resume(self.state.tables)  # a crashed applier's unfinished re-copies
        self.totals.recopied += self._adopt_selected() + self._reshape()
        self.verifier.collect()
        self.verifier.start()  # looks at the tables beside the stream
        while True:
            self.recopies.collect()
            self.totals.joined += self.join()
            self.verifier.collect()
            self.verifier.replay()
            if self.follow(self.stream, self.stop, self.deadline, self._waiting) or self.stop_asked is not None:
                break
        for name in list(self.recopies.running):  # a run ends with its re-copies done and recorded
            self.recopies.wait(name)
        self.stream_ended = True
        self.verifier.close()
        self.verifier.collect()
        self.verifier.replay()
        if not self.spec.service:  # a bounded run checks what is due before it ends
            self.verifier.catch_up()

    def _reshape(self) -> list[str]:
        """The named tables' copies this run is asked to lay out otherwise (``spec.reshape``): each
        re-copied beside the stream into a new table under its layout, swapped in when done, while
        the stream goes on into it (spark/cdc_ddl.py). Returns their names."""
        if not self.spec.reshape:
            return []
        tables, began = {t.name: t for t in self.state.tables}, []
        for config in self.spec.tableset.tables:
            name = f"{config['source_database']}.{config['source_table']}"
            table = tables.get(name)
            if table is None or table.left:
                raise ValueError(f"pipeline {self.spec.pipeline!r}: cannot reshape {name}: it is not a table the "
                                 f"pipeline streams ({sorted(n for n, t in tables.items() if not t.left)})")
            wanted = self.spec.tableset.layout_of(config)
            if table.recopying or not relaid(self.ch, table.target_database, table.target_table, wanted):
                continue  # under way already, or laid out so
            table.layout = wanted
            if self.recopies.start(self.stream.routes, table, f"reshape to {wanted.describe()}"):
                began.append(name)
        return began

    def _waiting(self) -> bool:
        """Should the stream pause (a re-copy finished, a repair's cascades to resolve again, a
        table waits to join)? The verifier's looks
        are recorded meanwhile (between batches: the entries travel with the next checkpoint)."""
        self.verifier.collect()
        if self.recopies.finished() or self.verifier.replays:
            return True
        if time.monotonic() - self._polled < JOIN_POLL_SECONDS:
            return False
        self._polled = time.monotonic()
        if self._asked_to_stop():
            return True
        return any(not r.joined for r in self.checkpoints.registrations(self.spec.pipeline))

    # --- following the binlog --------------------------------------------------------------

    def advance(self, stream: Stream, end: BinlogPosition, batch: Decoded | None = None) -> None:
        """The one place a checkpoint moves: to ``end``, once every write it covers has been
        acknowledged (and every DDL before it followed). The pipeline's checkpoint travels with
        its tables' entries; a joining table's replay moves its registration's ``since``."""
        if stream.cascades_only:  # a replay of cascades moves nothing but itself
            stream.position = end
            return
        self.history.applied(stream, end, batch)  # recorded before the checkpoint passes it
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
            main = stream.joining is None and not stream.cascades_only
            part = ReadRange({} if stream.cascades_only else stream.routes, frozenset(t.name for t in stream.tables),
                             stream.position, stop, deadline,
                             self.selection.to_dict() if self.selection and main else None,
                             self.state.prepared if main else None, self.cascading.watch(stream.routes),
                             frozenset() if stream.cascades_only else self.cascading.children(stream.routes))
            reader = Readers(self.spec, part)
            try:
                batch = self._apply_batches(stream, reader, poll)
            finally:
                reader.close()
            if batch is None:
                return False
            if batch.ddl and stream.cascades_only:  # followed by the stream already
                stream.position = batch.ddl[2]
            elif batch.ddl:
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
            if batch.through is None:
                for end in batch.staged_ends:  # XA transactions in staging committed here: into the copies
                    self._staged_end(stream, end, per_table)
            # what the batch's parent changes do to their children, resolved against the copies as
            # they are before the batch's rows go in (core/cdc/cascades.py) and written first
            after = self._cascades(stream, batch, per_table) if batch.cascades else []
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
            if after:  # an XA transaction's cascades, at the version its rows have too: after them
                self._cascades_after(stream, after, per_table)
            if batch.through is not None:
                self._piece(stream, batch, per_table, staged)
                if batch.done:  # the binlog ended inside it (not at a commit): claimed by a later run
                    return batch
                continue
            crash_point("cdc.written")
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

    def _cascades(self, stream: Stream, batch: Decoded, per_table: dict) -> list:
        """Resolve and write the children's changes of the batch's cascading parent changes
        (spark/cdc_cascades.py) before the batch's own rows are written; returns those of XA
        transactions, which go after them."""
        began, rows = time.monotonic(), self.cascading.rows
        after = self.cascading.follow(stream.routes, batch.cascades, batch.changed, per_table)
        self._cascaded(began, rows)
        crash_point("cdc.cascaded")
        return after

    def _cascades_after(self, stream: Stream, changes: list, per_table: dict) -> None:
        began, rows = time.monotonic(), self.cascading.rows
        self.cascading.write_after(stream.routes, changes, per_table)
        self._cascaded(began, rows)

    def _cascaded(self, began: float, rows: int) -> None:
        self.totals.cascaded_rows += self.cascading.rows - rows
        self.totals.cascade_seconds = round(self.totals.cascade_seconds + time.monotonic() - began, 3)

    def _piece(self, stream: Stream, batch: Decoded, per_table: dict, staged: int) -> None:
        """A piece of a transaction still open (core/cdc/binlog/batches.Batch) has been written at its
        versions; its changes are claimed — checkpoint, counters, totals — only with the batch
        of its commit (:meth:`_claim`), so nothing half-applied is acknowledged. Meanwhile the
        state says how far the transaction got (``applying``), the checkpoint unchanged."""
        self.history.piece(batch)
        open_ = stream.applying = stream.applying or Applying(batch.end, time.time())
        open_.through, open_.pieces = batch.through, open_.pieces + 1
        open_.changes += batch.events
        open_.staged += staged
        for source, (changes, written, _) in per_table.items():
            counts = open_.per_table.setdefault(source, [0, 0])
            counts[0] += changes
            counts[1] += written
        self.totals.pieces += 1
        if stream.cascades_only:
            return
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
            self.history.refuse(route, "an XA transaction's commit from staging")
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
        text, schema, after, committed = batch.ddl
        self.checkpoints.fence()  # the ALTERs and a re-copy write the copy: only under the lease
        statement = ddl.parse(text, schema)
        self.history.refuse_ddl(stream.routes, statement, text)
        with self.writing:
            changed, recopied = cdc_ddl.follow(self, stream.routes, stream.tables, statement, after,
                                               text, int(committed))
        self.cascading.after_ddl(text, schema, statement, after)
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
                routes = cdc_ddl.open_routes(conn, self.ch, [table], self.spec.salt)
                self.cascading.joined(conn, [table.name])
            if registration.since.key() < state.checkpoint.key():
                self.log(f"{table.name} replays {registration.since} … {state.checkpoint} before joining")
                self.follow(Stream(routes, [table], registration.since, registration), state.checkpoint)
            # its copy covers every change before its start: skipped from now on (a table that
            # stopped the pipeline is re-bootstrapped past the change that stopped it)
            table.skip_before = max(table.skip_before, registration.since.version())
            for route in routes.values():
                route.skip_before = table.skip_before
                if route.multiset:  # its rows add up: what an earlier stream wrote before its snapshot goes
                    multisets.drop_before(self.ch, route.target_database, route.target_table,
                                                registration.since, *member_filter(route.schema))
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
                         + ("" if table.member and cdc_ddl.shard_rows_deleted(self.spec) else ", its copy is kept"))
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

    def replay_cascades(self, table, since: BinlogPosition, cause: str = "re-copy") -> None:
        """After ``table``'s rows were rewritten as the source held them at ``since`` — a re-copy
        from there (a chunk read before a cascade may have landed after it was resolved) or a
        verification's repair at that snapshot (the stream went on past it before the repair, and
        resolved the cascades meanwhile against the rows the repair then replaced) — its cascades
        since then are resolved again against the copy as it is now. Resolving is idempotent: rows
        already right (ranked at or above their trigger) are not written again."""
        route = self.stream.routes.get(table.name) if self.stream else None
        if route is None:
            return
        plan = self.cascading.plan(self.stream.routes)
        below = plan.below(table.name) & set(self.stream.routes)
        done = {"re-copy": "re-copied", "repair": "repaired"}[cause]
        if below:  # a chain through it was followed from its stale rows meanwhile: the net looks
            # (also when the stream is still short of ``since``: it walked through rows the re-copy replaced)
            for name in sorted(below):
                self.stream.routes[name].table.mark_due()
            self.log(f"{table.name} was {done} while cascades passed through it: {sorted(below)} verified "
                     "against the source")
        if not plan.into(table.name):
            return
        if since.key() >= self.stream.position.key():
            self.log(f"{table.name} was {done} as of {since}, which the stream has not reached "
                     f"({self.stream.position}): its cascades from there on are resolved as the stream reaches them")
            return
        # a re-copied table's own cascades; after a repair every copy's (a chain into the table
        # passes through its parents' copies; resolving again writes only what is missing)
        replay = Stream({table.name: route}, [table], since, cascades_only=True) if cause == "re-copy" else \
            Stream(dict(self.stream.routes), list(self.stream.tables), since, cascades_only=True)
        before = self.totals.cascaded_rows
        self.follow(replay, self.stream.position)
        self.log(f"{table.name}: its cascades {since} … {self.stream.position} resolved again after its {cause} "
                 f"({self.totals.cascaded_rows - before:,} rows written)")

    def follow_to(self, position: BinlogPosition) -> bool:
        """Apply up to ``position`` (the verifier's snapshot, at a bounded run's end)."""
        self.follow(self.stream, position)
        return True


def _refuse_merged_reshape(spec: CdcApplySpec, checkpoints: Checkpoints) -> None:
    """A reshape named by a group's pipeline (or one source's part of it) whose tables make a
    merged copy: refused before the run begins (core/clickhouse/layout.reshape_refused)."""
    if not spec.reshape:
        return
    group = checkpoints.group(spec.pipeline)
    into = group.merge_into if group else ""
    if not into:
        state = checkpoints.state(spec.pipeline)
        named = {f"{t['source_database']}.{t['source_table']}" for t in spec.tableset.tables}
        into = next((f"{t.target_database}.{t.target_table}" for t in (state.tables if state else [])
                     if t.member and t.name in named), "")
    if into:
        raise reshape_refused(spec.pipeline, into)


def run_cdc_apply(spec: CdcApplySpec, spark) -> dict:
    """``spark``: a SparkSession or a :class:`LazySession` (spark_jobs/cdc_apply.py), built only
    when a batch is too large for the driver to write (``driver_write_rows``)."""
    if spec.service:  # its reader is a process: have the fork server warm by the time it is needed
        reader_processes()
    ch = client(spec.target)
    try:
        checkpoints = Checkpoints(ch, spec.ledger_database)
        checkpoints.ensure()
        _refuse_merged_reshape(spec, checkpoints)
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

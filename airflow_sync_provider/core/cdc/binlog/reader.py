"""A resumable stream of complete transactions for a set of tables, cut into batches:
:class:`BinlogReader` (its large transactions in pieces, its XA transactions parked)."""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass

import pymysql
from pymysqlreplication.event import (
    GtidEvent,
    HeartbeatLogEvent,
    MariadbGtidEvent,
    QueryEvent,
    RotateEvent,
    XAPrepareEvent,
    XidEvent,
)
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from airflow_sync_provider.core.cdc import ddl
from airflow_sync_provider.core.cdc.binlog.batches import BATCH_BYTES, Batch, MidTransaction, Parked
from airflow_sync_provider.core.cdc.binlog.commits import KINDS, Commit, commit_of
from airflow_sync_provider.core.cdc.binlog.gate import CheckedBinLogStream
from airflow_sync_provider.core.cdc.binlog.parents import ParentWatch, triggers_of
from airflow_sync_provider.core.cdc.binlog.routes import MOVED, TableRoute
from airflow_sync_provider.core.cdc.cascades import Rows, Trigger
from airflow_sync_provider.core.cdc.ring import HashRing
from airflow_sync_provider.core.cdc.rowimage import Decoders
from airflow_sync_provider.core.cdc.servers import GtidState
from airflow_sync_provider.core.clickhouse.history import refuse_unwritten
from airflow_sync_provider.core.endpoints import MySQLEndpoint
from airflow_sync_provider.core.positions import BinlogError, BinlogPosition, event_version, file_seq

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Watch:
    """What a reader looks out for besides its routes' changes: a DDL on one of ``names`` (tables
    that left the pipeline too) or on a name ``selection`` (core/selection.TableSelection)
    matches ends a batch; ``prepared``: XA transactions prepared before its start (xid → where
    each began, the checkpoint's), read again first."""

    names: frozenset = frozenset()
    selection: object = None
    prepared: dict | None = None
    # tables whose row events cascade into the routes' tables (core/cdc/binlog/parents.py): name → watch
    parents: dict | None = None
    # routes' tables a cascade can change: their changes go with the triggers, in order (cascades.Rows)
    children: frozenset = frozenset()
    # a service's: is the applier waiting for a batch? Then a batch goes at the next commit (or
    # the next heartbeat, when the stream went quiet) instead of waiting for its time to run out
    ready: object = None


# A service's binlog heartbeat while it waits for events: how long the stream may be quiet before
# a batch waiting for its commit-time is handed to an idle applier (and the least gap between two
# batches handed over early, which bounds the inserts a second ClickHouse gets from a busy stream)
QUIET_SECONDS = 0.05


class BinlogReader:
    """A resumable stream of complete transactions for a set of tables, cut into batches.

    **Large transactions.** A transaction whose open changes reach the batch bounds
    (``max_events`` row changes or ``max_bytes`` of row events) is handed on in pieces as it is
    read (:attr:`Batch.through`); a batch is either complete transactions or one piece, so the
    applier can tell what it may claim. A reader may also start inside a transaction
    (:class:`MidTransaction`, a share of a split backlog) and stop inside one.

    **XA transactions.** A prepared XA transaction's rows are written at ``XA PREPARE`` (after
    ``XA END``), but exist only at its ``XA COMMIT`` — a transaction of its own, maybe hours and
    many batches later — and never after ``XA ROLLBACK``. The reader parks the rows under the xid
    and adds them to the batch of the commit; the checkpoint moves on meanwhile and carries the
    parked xids with where each began (``Batch.prepared``), so a new reader reads just those
    transactions again (a prepared transaction is one contiguous group in the binlog). Their
    rows take the commit's version (:meth:`_xa_end`). Rows beyond the batch bounds go to staging
    instead of memory (:attr:`Batch.staging`, written by the applier; the commit is then a
    :attr:`Batch.staged_ends` entry), and a transaction the checkpoint says is in staging is not
    read again. ``XA COMMIT … ONE PHASE`` is an ordinary commit. A commit of a transaction
    prepared before the reader's start (a copy's snapshot cannot see a prepared transaction) is
    counted in ``Batch.xa_commits_unseen``: its rows are not in the stream, and the applier has
    every table looked at.
    """

    def __init__(self, endpoint: MySQLEndpoint, start: BinlogPosition | MidTransaction,
                 routes: dict[str, TableRoute], ring: HashRing, server_id: int, blocking: bool = False,
                 watch: Watch | None = None):
        watch = watch or Watch()
        prepared = watch.prepared
        self.routes, self.ring = routes, ring
        self.parents: dict[str, ParentWatch] = watch.parents or {}
        self.children = watch.children
        # DDL on these names ends a batch (tables that left too, and the parents of cascades)
        self.watched = set(routes) | set(watch.names) | set(self.parents)
        self.selection = watch.selection  # and on names the pipeline's patterns select (a table joining)
        inside = start if isinstance(start, MidTransaction) else None
        at = inside.at if inside else start
        self.position = inside.began if inside else start  # where the open transaction began
        self.stream = CheckedBinLogStream(  # stops on events it cannot read (see the end of this module)
            **endpoint.replication_args(), server_id=server_id, resume_stream=True, log_file=at.file,
            log_pos=inside.maps if inside else at.pos, blocking=blocking,
            slave_heartbeat=(QUIET_SECONDS if watch.ready is not None else 1) if blocking else None,
            only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent, XidEvent, QueryEvent, RotateEvent,
                         MariadbGtidEvent, GtidEvent, HeartbeatLogEvent, XAPrepareEvent],
            only_schemas=sorted({r.schema.database for r in routes.values()}
                                | {p.route.schema.database for p in self.parents.values()}), freeze_schema=True,
            followed=lambda: self.routes)
        self.epoch = at.epoch  # the server's (core/cdc/servers.py): every version read here carries it
        self._file = at.file  # the binlog file being read (its table ids are valid while it is)
        self.gtids = GtidState(at.gtid)  # the server's GTID state as the stream passes transactions
        self._pending: list = []  # the open transaction's row changes
        # and its parent changes that cascade (core/cdc/cascades.Trigger), between its changes of the
        # children (cascades.Rows), in binlog order
        self._cascading: list = []
        self._pending_bytes = 0  # and their row events' bytes
        # a share starting inside a transaction: rows events ending by here are the share before's
        self._skip_to = (at.seq, at.pos) if inside else None
        self._open = inside is not None  # inside a transaction whose changes were partly handed on
        self._endpoint, self._server_id = endpoint, server_id
        self._prepared: dict[str, Parked] = {}  # xid → prepared, not yet committed
        self._spilled: dict = defaultdict(int)  # the open XA transaction's rows in staging, per table
        self._reread: list = []  # (xid, where it began): parked before this reader, read again first
        self._again: BinlogReader | None = None  # reading one of them
        for xid, entry in (prepared or {}).items():
            began = BinlogPosition.from_dict(entry)
            if isinstance(entry, dict) and entry.get("staged") is not None:  # the applier found its staging whole
                self._prepared[xid] = Parked(began, staged=dict(entry["staged"]))
            else:
                self._reread.append((xid, began))
        self._unseen = 0
        self._xa_open = False  # the open transaction is an XA one (its rows are versioned at its commit)
        self._decoders = Decoders(ring)  # row images read by code made per table map (core/cdc/rowimage.py)
        self._parent_decoders = Decoders(ring)  # the parents' own routes' (a decoder is made per route)
        self._ready, self._handed = watch.ready, time.monotonic()
        # the open transaction's Commit (from its GTID event) and its rows events' kinds, handed on
        # with its changes (core/cdc/binlog/commits.py: what its history rows are stamped with)
        self._commit: Commit | None = None
        self._commit_open = False
        self._kinds: list = []

    def close(self):
        if self._again is not None:
            self._again.close()
        self.stream.close()

    def _here(self) -> BinlogPosition:
        return BinlogPosition(self.stream.log_file, self.stream.log_pos, self.gtids.text(), self.epoch)

    def read(self, stop: BinlogPosition | MidTransaction | None, max_events: int, max_seconds: float,
             max_bytes: int = BATCH_BYTES) -> Batch:
        """The next batch: complete transactions until ``max_events`` row changes or ``max_bytes``
        of their row events or ``max_seconds`` have gone by, a DDL on a replicated table,
        ``stop`` or the binlog's end; or a piece of a transaction that outgrew the bounds."""
        batch = self._read_prepared(max_events, max_bytes) or self._read(stop, max_events, max_seconds, max_bytes)
        self._handed = time.monotonic()
        # the XA transactions open at the batch's end (a batch ends at a boundary, where the
        # reader's own state is the end's), and the commits it saw of ones prepared before the start
        batch.prepared = {xid: parked.to_dict() for xid, parked in self._prepared.items()}
        batch.xa_commits_unseen, self._unseen = self._unseen, 0
        return batch

    def _read(self, stop, max_events: int, max_seconds: float, max_bytes: int) -> Batch:
        batch = Batch(self.position, self.position)
        if self._piece_due(stop, max_events, max_bytes):  # held back from the batch before
            return self._piece(batch, stop)
        deadline = time.monotonic() + max_seconds
        for event in iter(self.stream.fetchone, None):
            if isinstance(event, (MariadbGtidEvent, GtidEvent)):
                mariadb = isinstance(event, MariadbGtidEvent)
                self.gtids.add(event.gtid, mariadb=mariadb)
                self._xa_open = mariadb and bool(event.flags & MARIADB_FL_PREPARED_XA)
                self._commit = commit_of(event, event_version(self.stream.log_file,
                                                              self.stream.log_pos - event.event_size, 0, self.epoch))
                self._commit_open = True
            elif isinstance(event, RotateEvent):
                # Table ids are the server's until it restarts, and a restart begins a new file:
                # forget them at a new file (with freeze_schema the library would keep a table map
                # whose id a restarted server gave to another table, and apply its rows to the
                # wrong table). Not at the rotate a reconnection starts with (the library
                # reconnects by itself when the server dropped the connection, e.g. a reader that
                # waited longer than net_write_timeout to hand a batch on): it resumes inside a
                # statement, whose rows need the maps read before (forgotten, the library
                # skipped them as rows of an unfollowed table).
                if event.next_binlog != self._file:
                    self.stream.table_map.clear()
                    self._file = event.next_binlog
            elif isinstance(event, (WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent)):
                if self._skip_to is not None:
                    if (file_seq(self.stream.log_file), self.stream.log_pos) <= self._skip_to:
                        continue  # the share before this one read it; not decoded
                    self._skip_to = None
                if isinstance(stop, MidTransaction) and self._reached(stop.at, after=True):
                    return batch if batch.end.key() != batch.start.key() else self._piece(batch, stop)
                self._row_event(event)
            elif isinstance(event, XAPrepareEvent) and not event.one_phase:  # parked until its XA COMMIT
                self._park(xa_id(event), batch, max_events, max_bytes)
                batch.end = self.position = self._here()
                if stop is not None and batch.end.key() >= stop.key():
                    batch.done = True
                    return batch
                if batch.staging is not None:  # a batch carries one transaction's staging rows
                    return batch
            elif (isinstance(event, (XidEvent, XAPrepareEvent))
                  or (isinstance(event, QueryEvent) and self._boundary(event, batch))):
                if self._xa_open:  # MySQL's XA COMMIT … ONE PHASE: rows gathered unskipped, as for a prepare
                    self._one_phase(batch)
                self._take_pending(batch)
                self._xa_open = self._open = self._commit_open = False
                if batch.ddl:
                    # the batch ends *before* the DDL: the checkpoint may pass the statement only
                    # once the applier has followed it (a crash in between re-reads it)
                    batch.end, self.position = self.position, self._here()
                    return batch
                batch.end = self.position = self._here()
                batch.last_event_at = float(event.timestamp)
                if stop is not None and batch.end.key() >= stop.key():
                    batch.done = True
                    return batch
                if batch.events >= max_events or batch.bytes >= max_bytes or batch.staging is not None:
                    return batch
                if self._early(batch):  # the applier waits: no reason to hold a committed change
                    return batch
            if self._piece_due(stop, max_events, max_bytes):
                # complete transactions and a piece never share a batch: the piece comes next
                return batch if batch.end.key() != batch.start.key() else self._piece(batch, stop)
            if time.monotonic() >= deadline and not self._pending and not self._open:
                return batch
            if isinstance(event, HeartbeatLogEvent) and not self._pending and not self._open and self._early(batch):
                return batch  # the stream went quiet with changes waiting for their time
        if self._pending or self._open:  # the binlog ends inside a transaction: nothing of it is claimed
            batch = self._piece(batch, stop)
        batch.done = True  # the end of the binlog (non-blocking reads)
        return batch

    def _early(self, batch: Batch) -> bool:
        """Hand ``batch`` (at a commit) over before its time: a service's applier is waiting for it,
        and the last batch went at least QUIET_SECONDS ago (a busy stream still batches large)."""
        return (self._ready is not None and batch.events > 0 and time.monotonic() - self._handed >= QUIET_SECONDS
                and self._ready())

    def _reached(self, position: BinlogPosition, after: bool = False) -> bool:
        """Has the stream read up to ``position`` (``after``: an event ending past it)?"""
        here = (file_seq(self.stream.log_file), self.stream.log_pos)
        return here > (position.seq, position.pos) if after else here >= (position.seq, position.pos)

    def _piece_due(self, stop, max_events: int, max_bytes: int) -> bool:
        """Must the open transaction's changes go on now: they reached the bounds, or this share
        stops inside the transaction here?"""
        return (len(self._pending) >= max_events or self._pending_bytes >= max_bytes
                or isinstance(stop, MidTransaction) and self._reached(stop.at))

    def _piece(self, batch: Batch, stop) -> Batch:
        """The open transaction's changes read so far, as a piece (see :class:`Batch`); an XA
        transaction's go to staging (its rows exist only at its commit)."""
        if self._xa_open:
            self._spill(batch, self.position)
        else:
            self._take_pending(batch)
        self._open = True
        batch.through = self._here()
        if isinstance(stop, MidTransaction) and self._reached(stop.at):  # this share ends: the next goes on
            batch.through, batch.done = stop.at, True
        return batch

    def _take_pending(self, batch: Batch, cascading: bool = True) -> None:
        """The open transaction's changes (so far) into ``batch`` (and, unless it is staging, the
        parent changes that cascade: an XA transaction keeps those in memory until its commit)."""
        if cascading:
            batch.cascades += self._cascading
            self._cascading = []
        # only a transaction with changes here: a batch of unrelated ones must not grow with their number
        if self._pending and self._commit is not None and (not batch.commits or batch.commits[-1] is not self._commit):
            batch.commits.append(self._commit)
        batch.kinds += self._kinds if self._pending else []
        self._kinds = []
        moved = 0
        for item in self._pending:
            batch.add(*item)
            if item[4] == MOVED:  # a moved row's old place: part of its change, not another one
                moved += 1
                continue
            batch.per_table[item[0].source] += 1
        batch.events += len(self._pending) - moved
        batch.bytes += self._pending_bytes
        self._pending, self._pending_bytes = [], 0

    def _spill(self, batch: Batch, began: BinlogPosition, reader: BinlogReader | None = None) -> None:
        """``reader``'s pending changes of the XA transaction that began at ``began`` into
        ``batch``'s staging (counted in ``reader._spilled``, claimed at the commit)."""
        reader = reader or self
        _no_history(reader._pending, f"an XA transaction that began at {began}, kept in staging")
        keyless = sorted({item[0].source for item in reader._pending if item[0].multiset})
        if keyless:
            raise BinlogError(f"an XA transaction that began at {began} outgrew the batch bounds and changes "
                              f"{keyless}, tables without a primary key: their rows cannot wait in staging (a "
                              "multiset's rows are told apart by their order, which staging does not keep). Raise "
                              "batch_events / batch_bytes above the transaction's size; a retry stops here again")
        batch.staging = Batch(began, began)
        reader._take_pending(batch.staging, cascading=False)
        # its triggers wait for the commit in memory; its rows do not, so neither do their changes
        # of the children (its staged rows are in the copies before its triggers are resolved)
        reader._cascading = [item for item in reader._cascading if isinstance(item, Trigger)]
        for source, count in batch.staging.per_table.items():
            reader._spilled[source] += count

    def _parked_over(self, changes: int, size: int, max_events: int, max_bytes: int) -> bool:
        """Would ``changes`` more parked in memory pass the bounds (for all parked transactions)?"""
        return (sum(len(p.changes) for p in self._prepared.values()) + changes > max_events
                or sum(p.bytes for p in self._prepared.values()) + size > max_bytes)

    def _park(self, xid: str, batch: Batch, max_events: int, max_bytes: int) -> None:
        """XA PREPARE: the open transaction's changes wait for its XA COMMIT, in memory or (beyond
        the bounds) in staging."""
        _no_history(self._pending, f"the XA transaction {xid} (prepared, committed later)")
        if self._spilled or self._parked_over(len(self._pending), self._pending_bytes, max_events, max_bytes):
            if self._pending:
                self._spill(batch, self.position)
            self._prepared[xid] = Parked(self.position, staged=dict(self._spilled), cascades=self._cascading)
        else:
            self._prepared[xid] = Parked(self.position, self._pending, self._pending_bytes, cascades=self._cascading)
            self._pending, self._pending_bytes = [], 0
        self._spilled, self._xa_open, self._open, self._cascading = defaultdict(int), False, False, []

    def _one_phase(self, batch: Batch) -> None:
        """MySQL's XA COMMIT … ONE PHASE ends the open XA transaction as an ordinary commit: its
        rows keep their versions (skipped below a table's ``skip_before``); rows already in
        staging are written from there."""
        if not self._spilled:
            self._pending = [item for item in self._pending if item[3] >= item[0].skip_before]
            return
        if self._pending:
            self._spill(batch, self.position)
        kept = {s: self.routes[s].skip_before for s in self._spilled if s in self.routes}
        batch.staged_ends.append({"began": self.position.to_dict(), "commit": True, "version": None, "sources": kept})
        self._claim(batch, self._spilled)
        self._spilled = defaultdict(int)

    @staticmethod
    def _claim(batch: Batch, counts: dict) -> None:
        """Row changes written from staging at a commit count in the commit's batch."""
        for source, count in counts.items():
            batch.per_table[source] += count
            batch.events += count

    def _boundary(self, event: QueryEvent, batch: Batch) -> bool:
        """Is this query event a transaction boundary? COMMIT (non-transactional tables) and
        DDL are; a DDL on a replicated table ends the batch so the target changes first."""
        statement = event.query.decode(errors="replace") if isinstance(event.query, bytes) else event.query
        head = statement.strip().upper()
        if head.startswith(("XA START", "XA BEGIN")):  # MySQL's (MariaDB's is a flag of the GTID event)
            self._xa_open = True
        if head == "BEGIN" or head.startswith(("XA START", "XA BEGIN", "XA END")):
            return False  # the transaction goes on (to COMMIT, or XA END … XA PREPARE)
        if head.startswith(("XA COMMIT", "XA ROLLBACK")):
            self._xa_end(event, statement, head.startswith("XA COMMIT"), batch)
            return True
        schema = event.schema.decode() if isinstance(event.schema, bytes) else event.schema
        parsed = ddl.parse(statement, schema)
        if parsed is not None and (self.watched.intersection(parsed.tables) or (
                self.selection is not None and any(self.selection.matches(t) for t in parsed.tables))):
            batch.ddl = (statement, schema, self._here(),
                         float(event.timestamp))
        return True

    def _xa_end(self, event: QueryEvent, statement: str, commit: bool, batch: Batch) -> None:
        """``XA COMMIT xid`` brings the parked rows into the open transaction (``… ONE PHASE``:
        its rows are the open transaction's already); ``XA ROLLBACK xid`` drops them.

        Committed rows take the commit's version, not their events': they exist from the commit
        on, and a copy's snapshot taken between prepare and commit did not see them, so they
        must out-rank it (and are skipped exactly when the copy began after the commit). Only
        each key's last change is kept (one atomic transaction: its final state is what exists),
        so one version serves them all. Rows in staging are written from there by the applier
        (the same rule: :attr:`Batch.staged_ends`)."""
        if " ONE PHASE" in statement.upper():
            return
        xid = xa_id_of_statement(statement)
        parked = self._prepared.pop(xid, None)
        version = event_version(self.stream.log_file, self.stream.log_pos - event.event_size, 0, self.epoch)
        if parked is not None and commit:  # its cascades at the commit's version too, in their order
            for item in parked.cascades:
                if isinstance(item, Trigger):
                    self._cascading.append(dataclasses.replace(item, version=version, inclusive=True))
                elif item.table in self.routes and version >= self.routes[item.table].skip_before:
                    self._cascading.append(item)  # its rows are written too (as below)
        if parked is not None and parked.staged is not None:
            kept = {s: version for s in parked.staged if s in self.routes and version >= self.routes[s].skip_before}
            batch.staged_ends.append({"began": parked.began.to_dict(), "commit": commit, "version": version,
                                      "sources": kept if commit else {}})
            if commit:
                self._claim(batch, {s: parked.staged[s] for s in kept})
        elif parked is not None:
            if commit:  # one parked before this reader (read again: not through _park) meets the refusal here
                _no_history(parked.changes, f"the XA transaction {xid} (prepared, committed later)")
                last = {}
                for i, (route, lane, row, _, deleted) in enumerate(parked.changes):  # a multiset keeps them all
                    last[(route.source, i if route.multiset else route.place_of(row))] = (route, lane, row, version,
                                                                                         deleted)
                self._pending.extend(item for item in last.values() if version >= item[0].skip_before)
                self._pending_bytes += parked.bytes
        elif commit:  # prepared before this reader's start: not before a copy's snapshot, say so
            self._unseen += 1
            log.warning("binlog %s: %s of a transaction prepared before the stream's start: its rows are not in "
                         "the stream; every table is looked at", self._here(), statement.strip()[:200])

    def _read_prepared(self, max_events: int, max_bytes: int) -> Batch | None:
        """The XA transactions parked before this reader's start, read again from where each
        began (a prepared transaction is one contiguous group in the binlog) before the stream
        goes on: parked in memory within the bounds, else written to staging piece by piece
        (returned as pieces). None once all are read."""
        while self._reread:
            xid, began = self._reread[0]
            if self._again is None:
                self._again = BinlogReader(self._endpoint, began, self.routes, self.ring, self._server_id + 90,
                                           watch=Watch(parents=self.parents, children=self.children))
                self._again._xa_open = True
            try:
                piece = self._read_again(xid, began, self._again, max_events, max_bytes)
            except pymysql.err.OperationalError as exc:
                if exc.args[0] != 1236:  # not "the server cannot serve that binlog position"
                    raise
                # purged: its commit counts as unseen (the tables are looked at after it)
                log.warning("binlog %s: the prepared XA transaction %s can no longer be read (%s)", began, xid, exc)
                self._read_again_done()
                continue
            if piece is not None:
                return piece
        return None

    def _read_again(self, xid: str, began: BinlogPosition, again: BinlogReader, max_events: int,
                    max_bytes: int) -> Batch | None:
        for event in iter(again.stream.fetchone, None):
            if isinstance(event, (WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent)):
                again._row_event(event)
                if len(again._pending) >= max_events or again._pending_bytes >= max_bytes:
                    return self._spilled_again(again, began)
            elif isinstance(event, XAPrepareEvent) and xa_id(event) == xid:
                staged = again._spilled or self._parked_over(len(again._pending), again._pending_bytes, max_events,
                                                             max_bytes)
                piece = self._spilled_again(again, began) if staged and again._pending else None
                self._prepared[xid] = (Parked(began, staged=dict(again._spilled), cascades=again._cascading)
                                       if staged else Parked(began, again._pending, again._pending_bytes,
                                                             cascades=again._cascading))
                self._read_again_done()
                return piece
            elif isinstance(event, (XidEvent, XAPrepareEvent)):
                break
        raise BinlogError(f"the prepared XA transaction {xid} is not where the checkpoint says it began ({began}); "
                          "a retry stops here again: bootstrap the tables again (restart=True)")

    def _spilled_again(self, again: BinlogReader, began: BinlogPosition) -> Batch:
        batch = Batch(self.position, self.position, through=self.position)
        self._spill(batch, began, again)
        return batch

    def _read_again_done(self) -> None:
        self._again.close()
        self._again = None
        self._reread.pop(0)

    def _row_event(self, event) -> None:
        """A rows event: its changes of a followed table, and the cascades of a parent's."""
        name = f"{event.schema}.{event.table}"
        route, parent, first = self.routes.get(name), self.parents.get(name), len(self._pending)
        if route is not None:
            self._changes(event, route)
            self._pending_bytes += event.event_size
            if name in self.children and len(self._pending) > first:  # before its own triggers (a tree's)
                self._cascading.append(child_rows(name, self._pending[first:]))
        if parent is None or isinstance(event, WriteRowsEvent):  # an insert references nothing yet
            return
        version = event_version(self.stream.log_file, self.stream.log_pos - event.event_size, 0, self.epoch)
        if parent.lends and route is not None and (self._xa_open or version >= route.skip_before):
            items, by = self._pending[first:], route  # the followed route's own changes tell
        else:
            items, by = [], parent.route
            self._changes(event, parent.route, items, self._parent_decoders)
        if items:
            self._cascading += triggers_of(items, parent.places(by), name, int(event.timestamp))

    def _changes(self, event, route: TableRoute, out: list | None = None, decoders: Decoders | None = None):
        """``event``'s row changes of ``route``'s table, as items (route, lane, row, version, flag)
        onto ``out`` (the open transaction's, by default)."""
        out = self._pending if out is None else out
        decoders = decoders or self._decoders
        start = self.stream.log_pos - event.event_size  # the event's first byte
        version = event_version(self.stream.log_file, start, 0, self.epoch)  # its first row's; the others follow
        if not self._xa_open and version < route.skip_before:
            return  # a re-copy of the table from a later position covers it (an XA's rows: at its commit)
        route.check_shape(tuple(c.name for c in event.columns), f"binlog {self.stream.log_file}:{start}")
        if out is self._pending and route.history is not None:  # its history rows' operation (commits.py)
            self._kind(event, version)
        decoder = decoders.get(event, route)
        if decoder is not None:
            decoders.changes(decoder, event, version, out)
            return
        # the reference: python-mysql-replication's values through the type rules
        flag = route.delete_flag(event.timestamp) if isinstance(event, DeleteRowsEvent) else False
        for index, change in enumerate(event.rows):
            if isinstance(event, UpdateRowsEvent):
                before = route.row(change["before_values"], change.get("before_none_sources"))
                after = route.row(change["after_values"], change.get("after_none_sources"))
                if route.multiset:  # the old occurrence goes, the new one comes (rowimage: the same)
                    if before != after:
                        gone = MOVED if route.wanted(after) else True  # MOVED: counted with the new one
                        out += [self._item(route, image, version + index, flag, decoders)
                                for image, flag in ((before, gone), (after, False)) if route.wanted(image)]
                    continue
                if route.row_filter is not None:  # what the copy holds of it (core/content/)
                    out += [self._item(route, image, version + index, deleted, decoders)
                            for image, deleted in route.update(before, after)]
                    continue
                if route.place_of(before) != route.place_of(after):  # the row moved: its old place is gone
                    moved = route.key_of(before) == route.key_of(after)  # within its key (a layout's place)
                    out.append(self._item(route, before, version + index, MOVED if moved else True, decoders))
                out.append(self._item(route, after, version + index, False, decoders))
            else:
                row = route.row(change["values"], change.get("none_sources"))
                if route.wanted(row):  # a row the filter leaves out was never in the copy
                    out.append(self._item(route, row, version + index, flag, decoders))

    def _kind(self, event, version: int) -> None:
        """A rows event of the open transaction: its kind, and the transaction's Commit when no
        GTID event gave one (MySQL with gtid_mode=OFF: the statement's time, no GTID)."""
        if not self._commit_open:
            self._commit, self._commit_open = Commit(version, int(event.timestamp) * 1_000_000), True
        self._kinds.append((version, KINDS.index("insert" if isinstance(event, WriteRowsEvent) else
                                                 "update" if isinstance(event, UpdateRowsEvent) else "delete")))

    @staticmethod
    def _item(route: TableRoute, row: tuple, version: int, deleted: bool, decoders: Decoders):
        return route, decoders.lane_of(route)(route.place_of(row)), row, version, deleted


def _no_history(items: list, what: str) -> None:
    """XA transactions do not write a copy's history yet: one changing such a copy stops the stream."""
    kept = sorted({item[0].source for item in items if item[0].history is not None})
    if kept:
        refuse_unwritten(True, kept[0], what, "slice 3", BinlogError)


def child_rows(table: str, items: list) -> Rows:
    """A rows event's changes of a child table as the cascades see them (core/cdc/cascades.Rows):
    a moved row's old place is no change of its own; a tombstone or a kept delete leaves the copy's live rows."""
    kept = [item for item in items if item[4] != MOVED]
    return Rows(table, tuple(bool(item[4]) for item in kept), rows=[item[2] for item in kept])


MARIADB_FL_PREPARED_XA = 0x40  # a GTID event's flag: its group is an XA transaction's prepare (log_event.h)
_XA_ID = re.compile(r"X'([0-9A-Fa-f]*)'\s*,\s*X'([0-9A-Fa-f]*)'\s*,\s*(\d+)")


def xa_id(event: XAPrepareEvent) -> str:
    """An XA transaction's id as the binlog's XA statements write it (gtrid, bqual, format)."""
    return f"{event.xid_gtrid.hex()},{event.xid_bqual.hex()},{event.xid_format_id}"


def xa_id_of_statement(statement: str) -> str:
    match = _XA_ID.search(statement)
    if not match:
        raise BinlogError(f"cannot tell which XA transaction {statement.strip()[:200]!r} ends (expected "
                          "X'gtrid',X'bqual',format as MySQL and MariaDB write it)")
    return f"{match.group(1).lower()},{match.group(2).lower()},{int(match.group(3))}"


def batches(reader: BinlogReader, stop: BinlogPosition | MidTransaction | None, max_events: int, max_seconds: float,
            max_bytes: int = BATCH_BYTES) -> Iterator[Batch]:
    while True:
        batch = reader.read(stop, max_events, max_seconds, max_bytes)
        yield batch
        if batch.done:
            return

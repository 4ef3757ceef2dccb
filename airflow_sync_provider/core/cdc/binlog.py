"""Read row changes from the binlog (python-mysql-replication) as versioned target rows.

The reader resumes at a checkpoint by file and offset (``resume_stream=True``) on MySQL and
MariaDB alike: with ``is_mariadb=True`` the library ignores both unless given a GTID, and file
and offset are what versions are made of anyway. It cuts batches only at transaction
boundaries, so a checkpoint is always a position a new reader can start from.

Three decoding defects of python-mysql-replication 1.0.17 are corrected here, for every reader
in the process (found by tests/test_type_domain.py): a DATE the server accepted under a lax
``sql_mode`` ('2025-02-30') raised ValueError and killed the stream (it now decodes as NULL,
as the full load stores it); negative TIME values with a fraction came out wrong; and strings
were decoded with Python codecs that are not MySQL's (utf16 without a BOM as little-endian,
latin1 as strict cp1252). Values are then brought to the target's form by the
type rules' ``from_binlog`` (core/typemap.py), the same rules the full load follows.
"""

from __future__ import annotations

import codecs
import datetime as dt
import logging as _logging
import operator
import re
import time
import zlib as _zlib
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa
import pymysql
import sqlglot as _sqlglot
from pymysql.protocol import MysqlPacket as _MysqlPacket
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication import event as _event
from pymysqlreplication import row_event as _row_event
from pymysqlreplication.constants import NONE_SOURCE
from pymysqlreplication.event import (
    GtidEvent,
    HeartbeatLogEvent,
    MariadbGtidEvent,
    QueryEvent,
    RotateEvent,
    XAPrepareEvent,
    XidEvent,
)
from pymysqlreplication.packet import BinLogPacketWrapper as _BinLogPacketWrapper
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from airflow_sync_provider.core.cdc import ddl
from airflow_sync_provider.core.cdc.ring import HashRing
from airflow_sync_provider.core.cdc.rowimage import Decoders
from airflow_sync_provider.core.cdc.servers import GtidState
from airflow_sync_provider.core.cdc.tables import PipelineTable
from airflow_sync_provider.core.endpoints import MySQLEndpoint
from airflow_sync_provider.core.positions import (
    BinlogError,
    BinlogPosition,
    ValueRefused,
    event_version,
    file_seq,
    flavor,
    grant,
    monitor_privilege,
)
from airflow_sync_provider.core.source.schema import TableSchema
from airflow_sync_provider.core.typemap import MySQLColumn, check_array

# --- corrections to python-mysql-replication's decoding (see the module docstring) ---

# MariaDB's latin1 is cp1252 with its five undefined bytes mapped to the same code points
_LATIN1 = "".join(chr(b) if b in (0x81, 0x8D, 0x8F, 0x90, 0x9D) else bytes([b]).decode("cp1252") for b in range(256))
_LATIN1_ENCODE = codecs.charmap_build(_LATIN1)
# (the library names latin1 by its Python codec, cp1252)
_ENCODINGS = {"utf8mb4": "utf-8", "utf8mb3": "utf-8", "utf8": "utf-8", "utf16": "utf-16-be", "ucs2": "utf-16-be",
              "utf16le": "utf-16-le", "utf32": "utf-32-be", "latin1": "mysql_latin1", "cp1252": "mysql_latin1"}
codecs.register(lambda name: codecs.CodecInfo(
    name="mysql_latin1", encode=lambda text, errors="strict": codecs.charmap_encode(text, errors, _LATIN1_ENCODE),
    decode=lambda data, errors="strict": codecs.charmap_decode(data, errors, _LATIN1))
    if name == "mysql_latin1" else None)


def _charset_to_encoding(name):
    return _ENCODINGS.get(name, name)


def _read_date_or_null(self):
    value = self.packet.read_uint24()
    year, month, day = value >> 9, (value >> 5) & 0xF, value & 0x1F
    try:
        return dt.date(year, month, day) if year and month and day else None
    except ValueError:  # invalid dates a lax sql_mode allowed: NULL, as the full load stores them
        return None


def _read_time2(self, column):
    """TIME(fsp) as MySQL packs it (my_time_packed_from_binary): the library decoded negative
    times with a fraction wrongly (-1:02:03.9 came out as -1:02:03.1)."""
    fsp = column.fsp or 0
    size = (fsp + 1) // 2
    raw = self.packet.read(3 + size)
    if size == 3:
        packed = int.from_bytes(raw, "big") - 0x800000000000
    else:
        intpart, frac = int.from_bytes(raw[:3], "big") - 0x800000, int.from_bytes(raw[3:], "big") if size else 0
        if intpart < 0 and frac:
            intpart, frac = intpart + 1, frac - (1 << (8 * size))
        packed = (intpart << 24) + frac * (10_000 if size == 1 else 100)
    sign, packed = (-1 if packed < 0 else 1), abs(packed)
    hms, micros = packed >> 24, packed % (1 << 24)
    return sign * dt.timedelta(hours=(hms >> 12) % 1024, minutes=(hms >> 6) % 64, seconds=hms % 64,
                               microseconds=micros)


_row_event.RowsEvent.charset_to_encoding = staticmethod(_charset_to_encoding)
_row_event.RowsEvent._RowsEvent__read_date = _read_date_or_null
_row_event.RowsEvent._RowsEvent__read_time2 = _read_time2

class BinlogLost(BinlogError):
    """The binlog a checkpoint needs is no longer on the source (purged)."""


# --- row changes → versioned target rows ---


@dataclass
class TableRoute:
    """One replicated table: its source schema (as copied) and its ClickHouse target."""

    schema: TableSchema
    target_database: str
    target_table: str
    table: PipelineTable | None = None  # the pipeline's entry (names, columns)
    weight: MySQLColumn | None = None  # the collated split column whose weight rows carry
    skip_before: int = 0  # changes ranked below this are skipped: a re-copy from there covers them

    def __post_init__(self):
        self._source = self.schema.qualified  # per row change on the reader's path
        self.mappings = self.schema.mappings()
        self.names = [m.name for m in self.mappings]
        self.key = list(self.schema.primary_key)
        if not self.key:
            raise BinlogError(f"table {self.schema.qualified} has no primary key: CDC needs one to know which "
                              "target row a change replaces (give it a primary key, or keep it on full loads)")
        # per row and value on the hot path: resolved once
        self._converters = [(m.name, m.rule.from_binlog, m.source) for m in self.mappings]
        # a merged copy's member (core/source/group.py): columns its table lacks (NULL) and its
        # source columns (its tags) are not in its rows events; every row carries their values
        self.virtual = {m.name: m.source.tag for m in self.mappings if not m.source.in_table}
        self.table_names = [n for n in self.names if n not in self.virtual]
        self.key_at = [self.names.index(k) for k in self.key]  # where the key's values are in a row
        self.key_getter = operator.itemgetter(*self.key_at)  # a row's key (a value, not a tuple, for one column)
        # columns the copy leaves out on purpose; any other column a rows event carries that the
        # copy lacks means a schema change was not followed
        chosen = self.table.columns if self.table is not None else None
        self._left_out = None if chosen is not None else \
            {c.lower() for c in (self.table.exclude_columns if self.table is not None else ())}
        self._shapes_seen: set = set()

    def check_shape(self, names: tuple, where: str) -> None:
        """Compare a rows event's own column names (binlog_row_metadata=FULL) with the copy's."""
        if names in self._shapes_seen:
            return
        missing = [n for n in self.table_names if n not in names]
        extra = [] if self._left_out is None else \
            [n for n in names if n not in self.table_names and n.lower() not in self._left_out]
        if missing or extra:
            raise BinlogError(f"table {self.source}, {where}: the binlog's rows have columns {list(names)} but the "
                              f"copy follows {self.table_names} (missing {missing}, unknown {extra}): a schema change "
                              "was not followed. Stopped before writing; re-bootstrap the table (restart=True) "
                              "and report the DDL that led here")
        self._shapes_seen.add(names)

    @property
    def source(self) -> str:
        return self._source

    def row(self, values: dict, none_sources: dict | None = None) -> tuple:
        missing = [n for n in self.table_names if n not in values]
        if self.virtual:
            values = {**values, **self.virtual}
        if missing:
            raise BinlogError(f"table {self.source}: the binlog rows lack columns {missing} "
                              "(binlog_row_image must be FULL and binlog_row_metadata FULL)")
        if none_sources:  # the reader decodes an empty SET as None; MySQL shows ''
            values = {k: "" if v is None and none_sources.get(k) == NONE_SOURCE.EMPTY_SET else v
                      for k, v in values.items()}
        return tuple(None if (value := values[name]) is None else convert(value, column)
                     for name, convert, column in self._converters)

    def key_of(self, row: tuple) -> tuple:
        return tuple(row[i] for i in self.key_at)

    def arrow(self, rows: list[tuple], versions: list[int], deleted: list[int], where: str) -> pa.Table:
        """Rows with their versions and tombstone flags as an Arrow table for the target; values
        the target would store wrongly are refused as by the full load."""
        columns = list(zip(*rows)) if rows else [[] for _ in self.mappings]
        # a tombstone keeps the old row's values: only live rows must satisfy NOT NULL etc.
        live = pa.array([not d for d in deleted]) if any(deleted) else None
        arrays = []
        for values, mapping in zip(columns, self.mappings):
            try:
                array = pa.array(values, type=mapping.arrow_type)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, ValueError) as exc:
                raise ValueRefused(f"{where}, column {mapping.name!r}: value does not fit {mapping.ch_type}: "
                                   f"{exc}") from exc
            try:
                check_array(array if live is None else array.filter(live), mapping, where)
            except ValueError as exc:
                raise ValueRefused(f"{exc}. A retry stops here again: fix the value in MySQL (the change after "
                                   "it then carries the fixed value) and re-bootstrap the table") from exc
            arrays.append(array)
        return pa.Table.from_arrays(arrays + [pa.array(versions, pa.uint64()), pa.array(deleted, pa.uint8())],
                                    names=self.names + ["_version", "_deleted"])


# the bound on a batch's and an open transaction's row-event bytes (CdcApplySpec.batch_bytes)
BATCH_BYTES = 16 << 20


@dataclass(frozen=True)
class MidTransaction:
    """A cut inside a transaction, at a rows event (:func:`split_backlog`). The share that
    starts here reads the statement's table maps from offset ``maps`` of ``at``'s file on, skips
    the rows events before ``at`` undecoded and continues the transaction that began at
    ``began`` (whose GTID state is the one before it); the share before it stops here. ``at``
    carries the epoch and the GTID state after the transaction: the share passes its commit."""

    at: BinlogPosition
    maps: int
    began: BinlogPosition

    def key(self) -> tuple[int, int, int]:
        return self.at.key()

    def __str__(self) -> str:
        return f"{self.at.file}:{self.at.pos} (inside the transaction that began at {self.began.file}:{self.began.pos})"


@dataclass
class Batch:
    """Complete transactions read from ``start`` up to ``end``, grouped by table and lane — or,
    when ``through`` is set, a **piece**: changes of one transaction still open at ``through``
    (it began at ``start``, which is also ``end``), handed on before its commit so that memory
    stays bounded whatever the transaction's size. The applier writes a piece at its versions
    but claims it (checkpoint, counters) only with the batch that holds the commit."""

    start: BinlogPosition
    end: BinlogPosition
    # table → lane → (rows, versions, deleted flags)
    lanes: dict = field(default_factory=lambda: defaultdict(lambda: defaultdict(lambda: ([], [], []))))
    events: int = 0  # row changes read
    per_table: dict = field(default_factory=lambda: defaultdict(int))
    # (statement, schema, position after it, timestamp): follow it before reading on. The batch
    # itself ends before the statement (``end``), so its checkpoint never passes an unfollowed DDL
    ddl: tuple | None = None
    done: bool = False  # the stop position (or the end of the binlog) was reached
    last_event_at: float = 0.0  # the source's timestamp of the last transaction
    # XA transactions prepared and not yet committed at ``end``: xid → where each began (a new
    # reader reads their rows again from there: see BinlogReader) and, for one kept in staging,
    # "staged": its row changes per table
    prepared: dict = field(default_factory=dict)
    xa_commits_unseen: int = 0  # XA COMMITs in it of transactions prepared before the reader's start
    through: BinlogPosition | None = None  # a piece: how far the open transaction was read
    bytes: int = 0  # row-event bytes of its changes
    # rows of one XA transaction kept in staging until its XA COMMIT (a batch of their own whose
    # ``start`` is where the transaction began): the applier writes them to staging tables
    staging: Batch | None = None
    # XA transactions kept in staging that ended here: {"began": position dict, "commit": bool,
    # "version": the commit's (None: XA COMMIT … ONE PHASE, rows keep theirs), "sources": {table:
    # lowest version kept}}
    staged_ends: list = field(default_factory=list)

    def add(self, route: TableRoute, lane: int, row: tuple, version: int, deleted: bool):
        rows, versions, flags = self.lanes[route.source][lane]
        rows.append(row)
        versions.append(version)
        flags.append(int(deleted))


@dataclass
class Parked:
    """A prepared XA transaction waiting for its XA COMMIT: its changes in memory, or — once they
    or everything parked outgrow the batch bounds — in staging (``staged``: rows per table)."""

    began: BinlogPosition
    changes: list = field(default_factory=list)
    bytes: int = 0
    staged: dict | None = None

    def to_dict(self) -> dict:
        return self.began.to_dict() | ({"staged": dict(self.staged)} if self.staged is not None else {})


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
                 watched: frozenset = frozenset(), selection=None, prepared: dict | None = None):
        self.routes, self.ring = routes, ring
        self.watched = set(routes) | set(watched)  # DDL on these names ends a batch (tables that left too)
        self.selection = selection  # and on names the pipeline's patterns select (a table joining)
        inside = start if isinstance(start, MidTransaction) else None
        at = inside.at if inside else start
        self.position = inside.began if inside else start  # where the open transaction began
        self.stream = CheckedBinLogStream(  # stops on events it cannot read (see the end of this module)
            **endpoint.replication_args(), server_id=server_id, resume_stream=True, log_file=at.file,
            log_pos=inside.maps if inside else at.pos, blocking=blocking, slave_heartbeat=1 if blocking else None,
            only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent, XidEvent, QueryEvent, RotateEvent,
                         MariadbGtidEvent, GtidEvent, HeartbeatLogEvent, XAPrepareEvent],
            only_schemas=sorted({r.schema.database for r in routes.values()}), freeze_schema=True,
            followed=lambda: self.routes)
        self.epoch = at.epoch  # the server's (core/cdc/servers.py): every version read here carries it
        self._file = at.file  # the binlog file being read (its table ids are valid while it is)
        self.gtids = GtidState(at.gtid)  # the server's GTID state as the stream passes transactions
        self._pending: list = []  # the open transaction's row changes
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
            if isinstance(event, MariadbGtidEvent):
                self.gtids.add(event.gtid, mariadb=True)
                self._xa_open = bool(event.flags & MARIADB_FL_PREPARED_XA)
            elif isinstance(event, GtidEvent):
                self.gtids.add(event.gtid, mariadb=False)
                self._xa_open = False
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
                route = self.routes.get(f"{event.schema}.{event.table}")
                if route is not None:
                    self._changes(event, route)
                    self._pending_bytes += event.event_size
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
                self._xa_open = self._open = False
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
            if self._piece_due(stop, max_events, max_bytes):
                # complete transactions and a piece never share a batch: the piece comes next
                return batch if batch.end.key() != batch.start.key() else self._piece(batch, stop)
            if time.monotonic() >= deadline and not self._pending and not self._open:
                return batch
        if self._pending or self._open:  # the binlog ends inside a transaction: nothing of it is claimed
            batch = self._piece(batch, stop)
        batch.done = True  # the end of the binlog (non-blocking reads)
        return batch

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

    def _take_pending(self, batch: Batch) -> None:
        """The open transaction's changes (so far) into ``batch``."""
        for item in self._pending:
            batch.add(*item)
            batch.per_table[item[0].source] += 1
        batch.events += len(self._pending)
        batch.bytes += self._pending_bytes
        self._pending, self._pending_bytes = [], 0

    def _spill(self, batch: Batch, began: BinlogPosition, reader: BinlogReader | None = None) -> None:
        """``reader``'s pending changes of the XA transaction that began at ``began`` into
        ``batch``'s staging (counted in ``reader._spilled``, claimed at the commit)."""
        reader = reader or self
        batch.staging = Batch(began, began)
        reader._take_pending(batch.staging)
        for source, count in batch.staging.per_table.items():
            reader._spilled[source] += count

    def _parked_over(self, changes: int, size: int, max_events: int, max_bytes: int) -> bool:
        """Would ``changes`` more parked in memory pass the bounds (for all parked transactions)?"""
        return (sum(len(p.changes) for p in self._prepared.values()) + changes > max_events
                or sum(p.bytes for p in self._prepared.values()) + size > max_bytes)

    def _park(self, xid: str, batch: Batch, max_events: int, max_bytes: int) -> None:
        """XA PREPARE: the open transaction's changes wait for its XA COMMIT, in memory or (beyond
        the bounds) in staging."""
        if self._spilled or self._parked_over(len(self._pending), self._pending_bytes, max_events, max_bytes):
            if self._pending:
                self._spill(batch, self.position)
            self._prepared[xid] = Parked(self.position, staged=dict(self._spilled))
        else:
            self._prepared[xid] = Parked(self.position, self._pending, self._pending_bytes)
            self._pending, self._pending_bytes = [], 0
        self._spilled, self._xa_open, self._open = defaultdict(int), False, False

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
        if parked is not None and parked.staged is not None:
            kept = {s: version for s in parked.staged if s in self.routes and version >= self.routes[s].skip_before}
            batch.staged_ends.append({"began": parked.began.to_dict(), "commit": commit, "version": version,
                                      "sources": kept if commit else {}})
            if commit:
                self._claim(batch, {s: parked.staged[s] for s in kept})
        elif parked is not None:
            if commit:
                last = {}
                for route, lane, row, _, deleted in parked.changes:
                    last[(route.source, route.key_of(row))] = (route, lane, row, version, deleted)
                self._pending.extend(item for item in last.values() if version >= item[0].skip_before)
                self._pending_bytes += parked.bytes
        elif commit:  # prepared before this reader's start: not before a copy's snapshot, say so
            self._unseen += 1
            _log.warning("binlog %s: %s of a transaction prepared before the stream's start: its rows are not in "
                         "the stream; every table is looked at", self._here(), statement.strip()[:200])

    def _read_prepared(self, max_events: int, max_bytes: int) -> Batch | None:
        """The XA transactions parked before this reader's start, read again from where each
        began (a prepared transaction is one contiguous group in the binlog) before the stream
        goes on: parked in memory within the bounds, else written to staging piece by piece
        (returned as pieces). None once all are read."""
        while self._reread:
            xid, began = self._reread[0]
            if self._again is None:
                self._again = BinlogReader(self._endpoint, began, self.routes, self.ring, self._server_id + 90)
                self._again._xa_open = True
            try:
                piece = self._read_again(xid, began, self._again, max_events, max_bytes)
            except pymysql.err.OperationalError as exc:
                if exc.args[0] != 1236:  # not "the server cannot serve that binlog position"
                    raise
                # purged: its commit counts as unseen (the tables are looked at after it)
                _log.warning("binlog %s: the prepared XA transaction %s can no longer be read (%s)", began, xid, exc)
                self._read_again_done()
                continue
            if piece is not None:
                return piece
        return None

    def _read_again(self, xid: str, began: BinlogPosition, again: BinlogReader, max_events: int,
                    max_bytes: int) -> Batch | None:
        for event in iter(again.stream.fetchone, None):
            if isinstance(event, (WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent)):
                route = self.routes.get(f"{event.schema}.{event.table}")
                if route is not None:
                    again._changes(event, route)
                    again._pending_bytes += event.event_size
                if len(again._pending) >= max_events or again._pending_bytes >= max_bytes:
                    return self._spilled_again(again, began)
            elif isinstance(event, XAPrepareEvent) and xa_id(event) == xid:
                staged = again._spilled or self._parked_over(len(again._pending), again._pending_bytes, max_events,
                                                             max_bytes)
                piece = self._spilled_again(again, began) if staged and again._pending else None
                self._prepared[xid] = (Parked(began, staged=dict(again._spilled)) if staged
                                       else Parked(began, again._pending, again._pending_bytes))
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

    def _changes(self, event, route: TableRoute):
        start = self.stream.log_pos - event.event_size  # the event's first byte
        version = event_version(self.stream.log_file, start, 0, self.epoch)  # its first row's; the others follow
        if not self._xa_open and version < route.skip_before:
            return  # a re-copy of the table from a later position covers it (an XA's rows: at its commit)
        route.check_shape(tuple(c.name for c in event.columns), f"binlog {self.stream.log_file}:{start}")
        decoder = self._decoders.get(event, route)
        if decoder is not None:
            self._decoders.changes(decoder, event, version, self._pending)
            return
        # the reference: python-mysql-replication's values through the type rules
        for index, change in enumerate(event.rows):
            if isinstance(event, UpdateRowsEvent):
                before = route.row(change["before_values"], change.get("before_none_sources"))
                after = route.row(change["after_values"], change.get("after_none_sources"))
                if route.key_of(before) != route.key_of(after):  # a key change: the old key is gone
                    self._pending.append(self._item(route, before, version + index, True))
                self._pending.append(self._item(route, after, version + index, False))
            else:
                self._pending.append(self._item(route, route.row(change["values"], change.get("none_sources")),
                                                version + index, isinstance(event, DeleteRowsEvent)))

    def _item(self, route: TableRoute, row: tuple, version: int, deleted: bool):
        return route, self._decoders.lane_of(route)(route.key_of(row)), row, version, deleted


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


# --- splitting a backlog between reader processes ---

_ROWS_EVENT = re.compile(r"^(Write|Update|Delete)_rows")
_USE_PREFIX = re.compile(r"^\s*use\s+`(?:[^`]|``)*`\s*;\s*", re.IGNORECASE)
_GTID_INFO = re.compile(r"GTID (\d+-\d+-\d+)|GTID_NEXT\s*=\s*'([^']+)'")  # MariaDB's / MySQL's Gtid event
MAX_CUT_CANDIDATES = 4096  # kept while reading a backlog (every other one dropped beyond): bounded memory


def split_backlog(events, parts: int, min_bytes: int,
                  start: BinlogPosition | None = None) -> list[BinlogPosition | MidTransaction] | None:
    """Cut points that split the row-event bytes of ``events`` — (file, pos, type, end_pos,
    info) rows of SHOW BINLOG EVENTS from ``start``, in binlog order — into about ``parts``
    equal shares: positions right after a commit, or inside a transaction at a rows event
    (:class:`MidTransaction`), so that a large transaction's pieces are decoded in parallel
    too. Given ``start``, every cut carries its epoch and the GTID state there (``start``'s
    plus the transactions passed): what a reader starting at the cut continues from.
    ``[]``: too little to split (under ``min_bytes``); None: a DDL statement lies in the range,
    so its reading must stay in one piece (the routes change there), or an XA transaction (its
    rows are applied at its commit, which one reader must see)."""
    epoch = start.epoch if start is not None else 0
    gtids = GtidState(start.gtid) if start is not None else None
    state = gtids.text() if gtids else ""  # the GTID state after the last commit
    candidates, weight = [], 0  # (cut, row-event bytes before it)
    began = start  # where the open transaction began (after the last commit)
    maps, in_maps, rows = None, False, 0  # its statement's first Table_map event, rows events so far
    for file, pos, kind, end_pos, info in events:
        kind = "Query" if kind == "Query_compressed" else kind  # MariaDB's log_bin_compress=ON
        if began is None:
            began = BinlogPosition(file, pos, state, epoch)
        if kind == "Gtid" and gtids is not None and (match := _GTID_INFO.search(info or "")):
            gtids.add(match.group(1) or match.group(2), mariadb=bool(match.group(1)))
        elif kind == "Table_map":
            maps, in_maps = (maps if in_maps else pos), True
        elif _ROWS_EVENT.match(kind):  # Write_rows_v1, Write_rows_compressed_v1 …: bytes as written
            if rows and maps is not None:  # a share may start here, reading from the statement's table maps
                at = BinlogPosition(file, pos, gtids.text() if gtids else "", epoch)
                candidates.append((MidTransaction(at, maps, began), weight))
            weight += end_pos - pos
            in_maps, rows = False, rows + 1
        elif kind == "Xid" or kind == "Query" and _USE_PREFIX.sub("", info or "").strip().upper() == "COMMIT":
            state = gtids.text() if gtids else ""
            began = BinlogPosition(file, end_pos, state, epoch)
            candidates.append((began, weight))
            maps, in_maps, rows = None, False, 0
        elif kind == "Query" and ddl.parse(_USE_PREFIX.sub("", info or ""), "") is not None:
            return None
        elif kind == "XA_prepare" or kind == "Query" and _USE_PREFIX.sub("", info or "").upper().startswith("XA "):
            return None  # a prepared transaction's rows travel to its commit: one reader sees both
        if len(candidates) > MAX_CUT_CANDIDATES:
            candidates = candidates[1::2]
    if parts < 2 or weight < min_bytes:
        return []
    cuts, share = [], weight / parts
    for position, before in candidates:
        if before >= share * (len(cuts) + 1) and before < weight:
            cuts.append(position)
            if len(cuts) == parts - 1:
                break
    return cuts


BACKLOG_PAGE = 20_000  # SHOW BINLOG EVENTS rows read at a time (a large transaction is many events)


def backlog_events(endpoint: MySQLEndpoint, start: BinlogPosition, stop: BinlogPosition):
    """SHOW BINLOG EVENTS from ``start`` (an event boundary: a checkpoint) up to ``stop``, read a
    page at a time. Raw bytes: an Info column quotes statements, binary values and all."""
    conn = endpoint.connect(use_unicode=False)
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW BINARY LOGS")
            files = [row[0].decode() for row in cur.fetchall()]
            for file in [f for f in files if start.seq <= file_seq(f) <= stop.seq]:
                at = start.pos if file == start.file else 4
                while True:
                    cur.execute(f"SHOW BINLOG EVENTS IN %s FROM %s LIMIT {BACKLOG_PAGE}", (file, at))
                    rows = cur.fetchall()
                    for name, pos, kind, _server, end_pos, info in rows:
                        if (stop.epoch, file_seq(name.decode()), pos) >= stop.key():
                            return
                        yield file, pos, kind.decode(), end_pos, (info or b"").decode(errors="replace")
                    if len(rows) < BACKLOG_PAGE:
                        break
                    at = rows[-1][4]  # the next event begins where the page's last ended
    finally:
        conn.close()


def preflight(conn, start: BinlogPosition | None, endpoint: MySQLEndpoint, server_id: int) -> list[str]:
    """Refuse, with what to do, a source that cannot feed CDC from ``start``; returns the
    binlog files the server still has (``conn``: pymysql, to ``endpoint``). The user's right to
    stream the binlog is tried with a dump from its end as replica ``server_id`` (one no
    pipeline uses: a server drops a replica's older dump when another registers with its id)."""
    with conn.cursor() as cur:
        cur.execute("SHOW GLOBAL VARIABLES WHERE Variable_name IN"
                    " ('log_bin', 'binlog_format', 'binlog_row_image', 'binlog_row_metadata')")
        settings = {name.lower(): str(value).upper() for name, value in cur.fetchall()}
        wanted = {"log_bin": "ON", "binlog_format": "ROW", "binlog_row_image": "FULL", "binlog_row_metadata": "FULL"}
        wrong = {k: settings.get(k, "(not supported)") for k, v in wanted.items() if settings.get(k) != v}
        if wrong:
            raise BinlogError("the source cannot feed CDC: " + ", ".join(f"{k}={v}" for k, v in wrong.items())
                              + "; it needs log_bin=ON, binlog_format=ROW, binlog_row_image=FULL and "
                                "binlog_row_metadata=FULL (MySQL >= 8.0.14 or MariaDB >= 10.5) and a server_id")
        try:
            cur.execute("SHOW BINARY LOGS")
            files = [row[0] for row in cur.fetchall()]
        except pymysql.err.OperationalError as exc:  # access denied
            privilege = monitor_privilege(flavor(conn))
            raise BinlogError(f"user {endpoint.user!r} may not read the binlog ({exc}); CDC needs {privilege} to "
                              f"list it and REPLICATION SLAVE to stream it: {grant(conn, privilege)}") from exc
    check_compression(conn)
    check_dump(endpoint, files[-1] if files else None, server_id)
    if start is not None and start.file not in files:
        raise BinlogLost(f"the binlog file {start.file} holding the checkpoint {start} was purged from the source "
                          f"(it has {files[0] if files else 'none'} … {files[-1] if files else ''}): the changes "
                          "since then are gone. Re-bootstrap: run a fresh full load of the tables and start the "
                          "pipeline again from it (start_from_loads=[...], reset=True)")
    return files


def check_dump(endpoint: MySQLEndpoint, last_file: str | None, server_id: int) -> None:
    """Preflight: the user may stream the binlog (REPLICATION SLAVE): a dump of the last file's
    head, nothing of it read (CheckedBinLogStream names the grant when the server refuses)."""
    if last_file is None:
        return
    stream = CheckedBinLogStream(**endpoint.replication_args(), server_id=server_id, blocking=False,
                                 resume_stream=True, log_file=last_file, log_pos=4, only_events=[RotateEvent],
                                 followed=lambda: {})
    try:
        stream.fetchone()
    finally:
        stream.close()


# ==== No event passes unread (issue 34): compressed events, and a stop on what the reader cannot read ====
#
# python-mysql-replication 1.0.17 maps every event type it does not know to NotImplementedEvent
# and drops it (``filter_non_implemented_events``), and drops known types that are not in
# ``only_events`` before anyone sees them. On a MariaDB source with ``log_bin_compress=ON`` that
# meant every row change and every DDL vanished without a word (issue 34).
#
# * **MariaDB's compressed events** (``QUERY_COMPRESSED_EVENT``, ``WRITE/UPDATE/DELETE_ROWS_
#   COMPRESSED_EVENT(_V1)``, MariaDB's log_event.h) are the ordinary events with the part after
#   their fixed header zlib-compressed behind a 1-byte header (bit 7 set, algorithm in bits 4-6,
#   0 = zlib; bits 0-2 = how many big-endian bytes of uncompressed length follow). The shims
#   below decompress that part and hand the plain event to the library's own QueryEvent /
#   RowsEvent code (nothing of the row format is parsed here); they are registered in the
#   library's event map. ``log_pos``, ``event_size`` and so ``event_version`` stay those of the
#   compressed event in the file; a DDL in a compressed query is a QueryEvent like any other.
# * **Everything the server sends is looked at** (:class:`CheckedBinLogStream`): the library is
#   asked for every event class it has (and NotImplementedEvent); :class:`EventGate` lets through
#   what the reader asked for and what carries no row change (an allow-list), and stops with a
#   BinlogError on anything that could carry changes of a followed table and is not read: an
#   unknown event type (unless the server marks it ignorable), MySQL's compressed transactions
#   (``TRANSACTION_PAYLOAD_EVENT``: 1.0.17 has no class for them, and its inner rows would share
#   one position, which the version scheme cannot rank), partial JSON updates, an Incident event,
#   a change of a followed table logged as a statement, and any event class a later library
#   version adds until it is classified here.

_log = _logging.getLogger(__name__)

QUERY_COMPRESSED_EVENT = 0xA5
WRITE_ROWS_COMPRESSED_EVENT_V1, UPDATE_ROWS_COMPRESSED_EVENT_V1, DELETE_ROWS_COMPRESSED_EVENT_V1 = 0xA6, 0xA7, 0xA8
WRITE_ROWS_COMPRESSED_EVENT, UPDATE_ROWS_COMPRESSED_EVENT, DELETE_ROWS_COMPRESSED_EVENT = 0xA9, 0xAA, 0xAB
TRANSACTION_PAYLOAD_EVENT = 0x28  # MySQL >= 8.0.20, binlog_transaction_compression=ON
INCIDENT_EVENT = 0x1A
LOG_EVENT_IGNORABLE_F = 0x80  # header flag: "a replica that does not know this event may skip it"

EVENT_TYPE_NAMES = {
    1: "Start_v3", 2: "Query", 3: "Stop", 4: "Rotate", 5: "Intvar", 6: "Load", 7: "Slave", 8: "Create_file",
    9: "Append_block", 10: "Exec_load", 11: "Delete_file", 12: "New_load", 13: "RAND", 14: "User var",
    15: "Format_desc", 16: "Xid", 17: "Begin_load_query", 18: "Execute_load_query", 19: "Table_map",
    20: "Write_rows_event_old", 21: "Update_rows_event_old", 22: "Delete_rows_event_old", 23: "Write_rows_v1",
    24: "Update_rows_v1", 25: "Delete_rows_v1", 26: "Incident", 27: "Heartbeat", 28: "Ignorable",
    29: "Rows_query", 30: "Write_rows", 31: "Update_rows", 32: "Delete_rows", 33: "Gtid", 34: "Anonymous_Gtid",
    35: "Previous_gtids", 36: "Transaction_context", 37: "View_change", 38: "XA_prepare",
    39: "Update_rows_partial", 40: "Transaction_payload", 41: "Heartbeat_v2", 42: "Gtid_tagged",
    160: "Annotate_rows", 161: "Binlog_checkpoint", 162: "Gtid (MariaDB)", 163: "Gtid_list",
    164: "Start_encryption", 165: "Query_compressed", 166: "Write_rows_compressed_v1",
    167: "Update_rows_compressed_v1", 168: "Delete_rows_compressed_v1", 169: "Write_rows_compressed",
    170: "Update_rows_compressed", 171: "Delete_rows_compressed",
}

# event types the library does not decode that carry no row change (MySQL's GTID and group
# replication bookkeeping, heartbeats, pieces of a statement-logged LOAD DATA whose statement
# comes in an Execute_load_query event, an old format's start event)
HARMLESS_UNKNOWN_TYPES = frozenset({1, 7, 9, 11, 28, 34, 36, 37, 41, 42})

_NO_RETRY = "A retry stops here again: the event stays in the binlog."


def _rebootstrap(tables: str) -> str:
    return (f"then re-bootstrap {tables} from a position after this one (CdcBootstrapOperator with restart=True, "
            "or fresh full loads and reset=True): the changes in the events not read cannot be recovered "
            "from this binlog")


def uncompress_body(data: bytes) -> bytes:
    """MariaDB's compressed record (log_event.cc, binlog_buf_uncompress): a header byte (bit 7 set,
    algorithm in bits 4-6 — 0 is zlib, the only one — and in bits 0-2 the number of big-endian
    bytes of the uncompressed length that follow), then a zlib stream."""
    if not data or not data[0] & 0x80:
        raise ValueError("not a compressed record (bit 7 of its header is clear)")
    algorithm, lenlen = (data[0] & 0x70) >> 4, data[0] & 0x07
    if algorithm != 0 or not 1 <= lenlen <= 4:
        raise ValueError(f"unsupported compressed record header 0x{data[0]:02x} (algorithm {algorithm})")
    size = int.from_bytes(data[1:1 + lenlen], "big")
    body = _zlib.decompress(data[1 + lenlen:])
    if len(body) != size:
        raise ValueError(f"compressed record holds {len(body)} bytes, its header says {size}")
    return body


def _packed_int(data: bytes, i: int) -> tuple[int, int]:
    """A length-encoded integer at ``data[i]``: (value, index after it)."""
    first = data[i]
    if first < 251:
        return first, i + 1
    size = {252: 2, 253: 3, 254: 8}[first]
    return int.from_bytes(data[i + 1:i + 1 + size], "little"), i + 1 + size


class _Decompressed:
    """The shim: a compressed event decoded by the library's class for the plain event.

    The packet's event body is replaced by the plain one (the uncompressed head, then the
    decompressed rest) and the library's __init__ runs on it with the plain event type; then
    ``event_type`` and ``event_size`` are set back to the compressed event's, so positions and
    versions are those of the event in the file (``log_pos`` is the header's anyway)."""

    PLAIN_TYPES: dict = {}
    compressed = True

    def __init__(self, from_packet, event_size, table_map, ctl_connection, **kwargs):
        wire_type = from_packet.event_type
        raw = from_packet.packet.get_all_data()  # OK byte, 19-byte header, body, [checksum]
        body, tail = raw[20:20 + event_size], raw[20 + event_size:]
        head = self._head_len(body, table_map, kwargs.get("post_header_lengths"), wire_type)
        if head is None:  # a rows event of a table the reader does not track: the library skips it
            super().__init__(from_packet, event_size, table_map, ctl_connection, **kwargs)
            return
        verify = kwargs.pop("verify_checksum", False) and len(tail) >= 4
        try:
            plain = body[:head] + uncompress_body(body[head:])
        except (ValueError, _zlib.error) as exc:
            raise BinlogError(f"a {EVENT_TYPE_NAMES.get(wire_type, wire_type)} event ending at offset "
                              f"{from_packet.log_pos} cannot be decompressed: {exc}") from exc
        packet = _MysqlPacket(raw[:20] + plain + tail, None)
        packet.advance(20)
        from_packet.packet, from_packet.event_type = packet, self.PLAIN_TYPES[wire_type]
        try:
            super().__init__(from_packet, len(plain), table_map, ctl_connection, verify_checksum=False, **kwargs)
        finally:
            from_packet.event_type = wire_type
        self.event_type, self.event_size, self._plain_size = wire_type, event_size, len(plain)
        if verify:  # the server's checksum covers the compressed event
            self._is_event_valid = _zlib.crc32(raw[1:20 + event_size]).to_bytes(4, "little") == tail[:4]

    @staticmethod
    def _post_header(lengths, wire_type: int, default: int) -> int:
        return lengths[wire_type - 1] if lengths and len(lengths) >= wire_type else default


class QueryCompressedEvent(_Decompressed, QueryEvent):
    """MariaDB's QUERY_COMPRESSED_EVENT: post-header, status variables and schema as in a query
    event, then the statement compressed. A QueryEvent to the reader (DDL, COMMIT)."""

    PLAIN_TYPES = {QUERY_COMPRESSED_EVENT: 0x02}

    def _head_len(self, body: bytes, table_map, lengths, wire_type: int) -> int:
        schema_len, status_len = body[8], int.from_bytes(body[11:13], "little")
        return self._post_header(lengths, wire_type, 13) + status_len + schema_len + 1


class _CompressedRows(_Decompressed):
    """MariaDB's compressed rows events: table id and flags (and a V2 event's extra data), the
    column count and the columns-present bitmap(s) plain, the row images compressed."""

    def _head_len(self, body: bytes, table_map, lengths, wire_type: int) -> int | None:
        if int.from_bytes(body[:6], "little") not in table_map:
            return None
        i = 8  # table id (6) and flags (2)
        if self._post_header(lengths, wire_type, 10 if wire_type >= WRITE_ROWS_COMPRESSED_EVENT else 8) == 10:
            i += int.from_bytes(body[8:10], "little")  # the extra data's length counts its own 2 bytes
        width, i = _packed_int(body, i)
        bitmaps = 2 if isinstance(self, UpdateRowsEvent) else 1
        return i + bitmaps * ((width + 7) // 8)

    def _fetch_rows(self):
        # the library reads row images until event_size bytes are read: the plain event's size
        wire, self.event_size = self.event_size, self._plain_size
        try:
            super()._fetch_rows()
        finally:
            self.event_size = wire


class WriteRowsCompressedEvent(_CompressedRows, WriteRowsEvent):
    PLAIN_TYPES = {WRITE_ROWS_COMPRESSED_EVENT_V1: 0x17, WRITE_ROWS_COMPRESSED_EVENT: 0x1E}


class UpdateRowsCompressedEvent(_CompressedRows, UpdateRowsEvent):
    PLAIN_TYPES = {UPDATE_ROWS_COMPRESSED_EVENT_V1: 0x18, UPDATE_ROWS_COMPRESSED_EVENT: 0x1F}


class DeleteRowsCompressedEvent(_CompressedRows, DeleteRowsEvent):
    PLAIN_TYPES = {DELETE_ROWS_COMPRESSED_EVENT_V1: 0x19, DELETE_ROWS_COMPRESSED_EVENT: 0x20}


COMPRESSED_EVENTS = {code: cls for cls in (QueryCompressedEvent, WriteRowsCompressedEvent, UpdateRowsCompressedEvent,
                                           DeleteRowsCompressedEvent) for code in cls.PLAIN_TYPES}
_EVENT_MAP = _BinLogPacketWrapper._BinLogPacketWrapper__event_map  # the library's type → class table
_EVENT_MAP.update(COMPRESSED_EVENTS)

# classes that carry no row change: the reader may drop them unread
HARMLESS_EVENTS = frozenset({
    _event.FormatDescriptionEvent, RotateEvent, _event.StopEvent, HeartbeatLogEvent, _event.GtidEvent,
    _event.PreviousGtidsEvent, MariadbGtidEvent, _event.MariadbGtidListEvent, _event.MariadbBinLogCheckPointEvent,
    _event.MariadbAnnotateRowsEvent, _event.MariadbStartEncryptionEvent, _event.RowsQueryLogEvent,
    _row_event.TableMapEvent, XidEvent, _event.XAPrepareEvent, _event.IntvarEvent, _event.RandEvent,
    _event.UserVarEvent, _event.BeginLoadQueryEvent,
})

_DML = re.compile(r"^\s*(?:(?:/\*.*?\*/|#[^\n]*\n|--[^\n]*\n)\s*)*(insert|replace|update|delete|load|with)\b",
                  re.IGNORECASE | re.DOTALL)


def statement_targets(statement: str, schema: str) -> tuple[str, ...] | None:
    """The ``db.table`` names a data-changing statement writes to (None: not a data change);
    when the statement cannot be parsed, every name it mentions (a followed table in it then stops
    the reader: wrongly stopping beats silently skipping)."""
    match = _DML.match(statement)
    if not match:
        return None
    if match.group(1).upper() == "REPLACE":  # INSERT's grammar; sqlglot parses only INSERT
        statement = statement[:match.start(1)] + "INSERT" + statement[match.end(1):]
    qualified = lambda t: f"{t.db or schema}.{t.name}"  # noqa: E731
    try:
        tree = _sqlglot.parse_one(statement, read="mysql", error_level=_sqlglot.ErrorLevel.RAISE)
    except Exception:  # sqlglot's ParseError / TokenError
        tree = None
    if isinstance(tree, (_sqlglot.exp.Insert, _sqlglot.exp.LoadData)):
        target = tree.this.this if isinstance(tree.this, _sqlglot.exp.Schema) else tree.this
        if isinstance(target, _sqlglot.exp.Table):
            return (qualified(target),)
    if isinstance(tree, (_sqlglot.exp.Update, _sqlglot.exp.Delete)):
        # the tables it names outside subqueries: a multi-table UPDATE / DELETE writes to any of them
        tables = [t for t in tree.find_all(_sqlglot.exp.Table) if t.find_ancestor(_sqlglot.exp.Subquery,
                                                                                  _sqlglot.exp.Select) is None]
        if tables:
            return tuple(qualified(t) for t in tables)
    try:
        tokens = _sqlglot.Dialect.get_or_raise("mysql").tokenize(statement)
    except Exception:
        tokens = []
    words = [t.text.upper() for t in tokens]
    if match.group(1).upper() == "LOAD" and "TABLE" in words:  # LOAD DATA … INTO TABLE name
        at = words.index("TABLE") + 1
        if at < len(tokens):
            return (ddl.name_at(tokens, at, schema)[0],)
    names = [t.text for t in tokens if t.token_type in (_sqlglot.tokens.TokenType.VAR,
                                                        _sqlglot.tokens.TokenType.IDENTIFIER)]
    return tuple(f"{schema}.{n}" for n in names) + tuple(f"{a}.{b}" for a, b in zip(names, names[1:]))


class EventGate:
    """Decides, for every event the server sends, whether the reader may go on: ``wanted``
    classes are the reader's to handle; classes in HARMLESS_EVENTS carry no row change; the rest
    stops with a BinlogError when it could carry a change of a ``followed()`` table."""

    def __init__(self, wanted: frozenset, followed):
        self.wanted, self.followed = wanted, followed

    def check(self, event, file: str, start: int) -> None:
        where = f"binlog {file}:{start}"
        cls = event.__class__
        if isinstance(event, _event.NotImplementedEvent):
            self._unknown(event, where)
        elif isinstance(event, QueryEvent) and cls in self.wanted:
            self._statement(event.query, event.schema, where)
        elif isinstance(event, _event.ExecuteLoadQueryEvent):  # LOAD DATA logged as a statement
            packet = event.packet  # the library reads its post-header only: status vars, schema, statement
            packet.advance(event.status_vars_length)
            schema = packet.read(event.schema_length)
            packet.advance(1)
            self._statement(packet.read(event.event_size - packet.read_bytes), schema, where)
        elif isinstance(event, _row_event.RowsEvent):
            table = f"{event.schema}.{event.table}"
            if table not in self.followed():
                return
            if isinstance(event, _row_event.PartialUpdateRowsEvent):
                raise BinlogError(
                    f"table {table}, {where}: a partial JSON update (Update_rows_partial, written with "
                    "binlog_row_value_options=PARTIAL_JSON) carries only the changed part of a JSON value, so "
                    "the row cannot be written whole; the reader stops instead of skipping it. "
                    f"{_NO_RETRY} Set binlog_row_value_options='' on the source (globally and in the "
                    f"sessions that set it), {_rebootstrap('the table')}")
            if cls not in self.wanted:
                self._not_handled(event, where, table)
            if getattr(event, "compressed", False):
                try:
                    rows = event.rows
                except BinlogError as exc:
                    raise BinlogError(f"table {table}, {where}: {exc}") from exc
                if len(rows) + 3 > event.event_size:  # versions are event start + row index (positions.py)
                    raise BinlogError(
                        f"table {table}, {where}: a compressed rows event of {event.event_size} bytes holds "
                        f"{len(rows)} rows, more than its bytes can rank (versions are the event's offset plus "
                        f"the row's index). {_NO_RETRY} Set log_bin_compress=OFF on the source, "
                        f"{_rebootstrap('the table')}")
        elif cls not in self.wanted and cls not in HARMLESS_EVENTS:
            self._not_handled(event, where, "")

    def _unknown(self, event, where: str) -> None:
        code, flags = event.event_type, event.packet.flags
        name = f"event type {code} ({EVENT_TYPE_NAMES.get(code, 'unknown')})"
        if code in HARMLESS_UNKNOWN_TYPES or code != INCIDENT_EVENT and flags & LOG_EVENT_IGNORABLE_F:
            _log.debug("%s: %s event skipped (carries no row change)", where, name)
            return
        if code == TRANSACTION_PAYLOAD_EVENT:
            raise BinlogError(
                f"{where}: a compressed transaction ({name}, written with binlog_transaction_compression=ON, "
                "MySQL >= 8.0.20) holds its row changes zstd-compressed; python-mysql-replication 1.0.17 does "
                "not decode it, so the reader stops instead of skipping the transaction (the tables it "
                f"changes are inside it). {_NO_RETRY} Set binlog_transaction_compression=OFF on the source "
                "(SET PERSIST, and in the sessions that set it), " + _rebootstrap("the pipeline's tables"))
        if code == INCIDENT_EVENT:
            raise BinlogError(
                f"{where}: the source wrote an Incident ({name}): it could not log some changes (e.g. LOST_EVENTS "
                "after a failed write to the binlog); a replica stops here too. The binlog misses changes "
                f"that may be the pipeline's. {_NO_RETRY} Find the cause in the source's error log, "
                + _rebootstrap("the pipeline's tables"))
        raise BinlogError(
            f"{where}: {name}, which python-mysql-replication 1.0.17 does not decode; it may carry "
            "changes of the pipeline's tables (which ones cannot be told without decoding it), so the reader "
            f"stops instead of skipping it. {_NO_RETRY} Turn off the source setting that writes this event "
            "type, or upgrade to a release that reads it, " + _rebootstrap("the pipeline's tables"))

    def _statement(self, statement, schema, where: str) -> None:
        statement = statement.decode(errors="replace") if isinstance(statement, bytes) else statement
        schema = schema.decode(errors="replace") if isinstance(schema, bytes) else schema
        targets = statement_targets(statement, schema or "")
        hit = sorted(set(targets or ()) & set(self.followed()))
        if hit:
            raise BinlogError(
                f"table {', '.join(hit)}, {where}: a change logged as a statement ({statement[:200]!r}; "
                "binlog_format=STATEMENT or MIXED in the session that ran it, or a change the server logs "
                "that way): row-based CDC cannot apply a statement, so the reader stops instead of skipping "
                f"it. {_NO_RETRY} Make every writer of the table use binlog_format=ROW, "
                + _rebootstrap("the table"))

    @staticmethod
    def _not_handled(event, where: str, table: str) -> None:
        name = EVENT_TYPE_NAMES.get(event.event_type, f"type {event.event_type}")
        raise BinlogError(
            f"{'table ' + table + ', ' if table else ''}{where}: python-mysql-replication decoded a {name} event "
            f"as {event.__class__.__name__}, which this reader does not handle, and it may carry changes of the "
            f"pipeline's tables; the reader stops instead of skipping it. {_NO_RETRY} Report it (the reader "
            "needs to learn this event), turn off the setting that writes it, " + _rebootstrap("the tables"))


ACCESS_DENIED_TO_DUMP = 1227  # ER_SPECIFIC_ACCESS_DENIED_ERROR, the dump's answer without REPLICATION SLAVE


class CheckedBinLogStream(BinLogStreamReader):
    """A BinLogStreamReader that lets no event pass unread: it asks the library for every event
    class it has and for the types it does not know (NotImplementedEvent), passes each through
    :class:`EventGate`, and returns only the classes of ``only_events`` (with the compressed
    classes of those kinds). ``followed()`` gives the ``db.table`` names whose changes matter."""

    def __init__(self, *args, only_events, followed, **kwargs):
        wanted = frozenset(only_events)
        wanted |= {cls for cls in COMPRESSED_EVENTS.values() if any(issubclass(cls, w) for w in wanted)}
        everything = set(_EVENT_MAP.values()) | {_event.NotImplementedEvent} | wanted
        super().__init__(*args, only_events=everything, filter_non_implemented_events=False, **kwargs)
        self._wanted, self._gate = wanted, EventGate(wanted, followed)

    def fetchone(self):
        while True:
            try:
                event = super().fetchone()
            except pymysql.err.OperationalError as exc:
                if exc.args[0] != ACCESS_DENIED_TO_DUMP:
                    raise
                raise BinlogError(f"the source refuses to stream its binlog to this user ({exc.args[1]}); CDC needs "
                                  f"REPLICATION SLAVE: {grant(self._ctl_connection, 'REPLICATION SLAVE')}. A retry "
                                  "stops here again until it is granted") from None
            if event is None:
                return None
            self._gate.check(event, self.log_file, self.log_pos - event.packet.event_size)
            if event.__class__ in self._wanted:
                return event


def check_compression(conn) -> None:
    """Preflight: refuse MySQL's compressed transactions (the reader cannot decode them); MariaDB's
    compressed events are decoded (the shims above)."""
    with conn.cursor() as cur:
        cur.execute("SHOW GLOBAL VARIABLES WHERE Variable_name IN ('binlog_transaction_compression', "
                    "'log_bin_compress', 'log_bin_compress_min_len')")
        settings = {str(name).lower(): str(value).upper() for name, value in cur.fetchall()}
    if settings.get("binlog_transaction_compression") == "ON":
        raise BinlogError(
            "the source cannot feed CDC: binlog_transaction_compression=ON (MySQL writes each transaction as "
            "one zstd-compressed Transaction_payload event, which python-mysql-replication 1.0.17 does not "
            "decode: the changes would be lost). Set binlog_transaction_compression=OFF (SET PERSIST, and in "
            "sessions that set it) and start again; a checkpoint older than the change needs a re-bootstrap "
            "if compressed transactions were written since")
    if settings.get("log_bin_compress") == "ON":
        _log.info("the source compresses its binlog events (log_bin_compress=ON, min length %s): decoded",
                  settings.get("log_bin_compress_min_len", "?"))

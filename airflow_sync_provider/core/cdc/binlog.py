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
import re
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication import row_event as _row_event
from pymysqlreplication.constants import NONE_SOURCE
from pymysqlreplication.event import (
    HeartbeatLogEvent, MariadbGtidEvent, QueryEvent, RotateEvent, XidEvent,
)
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from airflow_sync_provider.core.cdc import ddl
from airflow_sync_provider.core.cdc.positions import (
    BinlogError, BinlogPosition, ValueRefused, event_version, file_seq,
)
from airflow_sync_provider.core.cdc.ring import HashRing, route_key
from airflow_sync_provider.core.cdc.tables import PipelineTable
from airflow_sync_provider.core.endpoints import MySQLEndpoint
from airflow_sync_provider.core.source.schema import TableSchema
from airflow_sync_provider.core.typemap import MySQLColumn, check_array

# --- corrections to python-mysql-replication's decoding (see the module docstring) ---

# MariaDB's latin1 is cp1252 with its five undefined bytes mapped to the same code points
_LATIN1 = "".join(chr(b) if b in (0x81, 0x8D, 0x8F, 0x90, 0x9D) else bytes([b]).decode("cp1252") for b in range(256))
_LATIN1_ENCODE = codecs.charmap_build(_LATIN1)
_ENCODINGS = {"utf8mb4": "utf-8", "utf8mb3": "utf-8", "utf8": "utf-8", "utf16": "utf-16-be", "ucs2": "utf-16-be",
              "utf16le": "utf-16-le", "utf32": "utf-32-be", "latin1": "mysql_latin1"}
codecs.register(lambda name: codecs.CodecInfo(
    name="mysql_latin1", encode=lambda text, errors="strict": codecs.charmap_encode(text, errors, _LATIN1_ENCODE),
    decode=lambda data, errors="strict": codecs.charmap_decode(data, errors, _LATIN1)) if name == "mysql_latin1" else None)


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
        self.mappings = self.schema.mappings()
        self.names = [m.name for m in self.mappings]
        self.key = list(self.schema.primary_key)
        if not self.key:
            raise BinlogError(f"table {self.schema.qualified} has no primary key: CDC needs one to know which "
                              "target row a change replaces (give it a primary key, or keep it on full loads)")
        # per row and value on the hot path: resolved once
        self._converters = [(m.name, m.rule.from_binlog, m.source) for m in self.mappings]
        self._key_at = [self.names.index(k) for k in self.key]
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
        missing = [n for n in self.names if n not in names]
        extra = [] if self._left_out is None else \
            [n for n in names if n not in self.names and n.lower() not in self._left_out]
        if missing or extra:
            raise BinlogError(f"table {self.source}, {where}: the binlog's rows have columns {list(names)} but the "
                              f"copy follows {self.names} (missing {missing}, unknown {extra}): a schema change "
                              "was not followed. Stopped before writing; re-bootstrap the table (restart=True) "
                              "and report the DDL that led here")
        self._shapes_seen.add(names)

    @property
    def source(self) -> str:
        return self.schema.qualified

    def row(self, values: dict, none_sources: dict | None = None) -> tuple:
        missing = [n for n in self.names if n not in values]
        if missing:
            raise BinlogError(f"table {self.source}: the binlog rows lack columns {missing} "
                              "(binlog_row_image must be FULL and binlog_row_metadata FULL)")
        if none_sources:  # the reader decodes an empty SET as None; MySQL shows ''
            values = {k: "" if v is None and none_sources.get(k) == NONE_SOURCE.EMPTY_SET else v
                      for k, v in values.items()}
        return tuple(None if (value := values[name]) is None else convert(value, column)
                     for name, convert, column in self._converters)

    def key_of(self, row: tuple) -> tuple:
        return tuple(row[i] for i in self._key_at)

    def arrow(self, rows: list[tuple], versions: list[int], deleted: list[int], where: str) -> pa.Table:
        """Rows with their versions and tombstone flags as an Arrow table for the target; values
        the target would store wrongly are refused as by the full load."""
        columns = list(zip(*rows)) if rows else [[] for _ in self.mappings]
        arrays = []
        for values, mapping in zip(columns, self.mappings):
            try:
                array = pa.array(values, type=mapping.arrow_type)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, ValueError) as exc:
                raise ValueRefused(f"{where}, column {mapping.name!r}: value does not fit {mapping.ch_type}: "
                                   f"{exc}") from exc
            # a tombstone keeps the old row's values: only live rows must satisfy NOT NULL etc.
            try:
                check_array(array.filter(pa.array([not d for d in deleted])) if any(deleted) else array, mapping,
                            where)
            except ValueError as exc:
                raise ValueRefused(f"{exc}. A retry stops here again: fix the value in MySQL (the change after "
                                   "it then carries the fixed value) and re-bootstrap the table") from exc
            arrays.append(array)
        return pa.Table.from_arrays(arrays + [pa.array(versions, pa.uint64()), pa.array(deleted, pa.uint8())],
                                    names=self.names + ["_version", "_deleted"])


@dataclass
class Batch:
    """Complete transactions read from ``start`` up to ``end``, grouped by table and lane."""

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

    def add(self, route: TableRoute, lane: int, row: tuple, version: int, deleted: bool):
        rows, versions, flags = self.lanes[route.source][lane]
        rows.append(row)
        versions.append(version)
        flags.append(int(deleted))


class BinlogReader:
    """A resumable stream of complete transactions for a set of tables, cut into batches."""

    def __init__(self, endpoint: MySQLEndpoint, start: BinlogPosition, routes: dict[str, TableRoute],
                 ring: HashRing, server_id: int, blocking: bool = False, watched: frozenset = frozenset(),
                 selection=None):
        self.routes, self.ring = routes, ring
        self.watched = set(routes) | set(watched)  # DDL on these names ends a batch (tables that left too)
        self.selection = selection  # and on names the pipeline's patterns select (a table joining)
        self.position = start
        settings = endpoint.connect_args()
        settings.pop("database", None)
        self.stream = BinLogStreamReader(
            connection_settings=settings, server_id=server_id, resume_stream=True, log_file=start.file,
            log_pos=start.pos, blocking=blocking, slave_heartbeat=1 if blocking else None,
            only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent, XidEvent, QueryEvent, RotateEvent,
                         MariadbGtidEvent, HeartbeatLogEvent],
            only_schemas=sorted({r.schema.database for r in routes.values()}), freeze_schema=True)
        self.gtid = start.gtid
        self._pending: list = []  # the open transaction's row changes

    def close(self):
        self.stream.close()

    def _here(self) -> BinlogPosition:
        return BinlogPosition(self.stream.log_file, self.stream.log_pos, self.gtid)

    def read(self, stop: BinlogPosition | None, max_events: int, max_seconds: float) -> Batch:
        """The next batch: complete transactions until ``max_events`` row changes or
        ``max_seconds`` have gone by, a DDL on a replicated table, ``stop`` or the binlog's end."""
        batch = Batch(self.position, self.position)
        deadline = time.monotonic() + max_seconds
        for event in iter(self.stream.fetchone, None):
            if isinstance(event, MariadbGtidEvent):
                self.gtid = event.gtid
            elif isinstance(event, RotateEvent):
                # Table ids are the server's until it restarts, and a restart begins a new file:
                # forget them (with freeze_schema the library would keep a table map whose id a
                # restarted server gave to another table, and apply its rows to the wrong table).
                self.stream.table_map.clear()
            elif isinstance(event, (WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent)):
                route = self.routes.get(f"{event.schema}.{event.table}")
                if route is not None:
                    self._changes(event, route)
            elif isinstance(event, XidEvent) or (isinstance(event, QueryEvent) and self._boundary(event, batch)):
                for item in self._pending:
                    batch.add(*item)
                    batch.per_table[item[0].source] += 1
                batch.events += len(self._pending)
                self._pending = []
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
                if batch.events >= max_events:
                    return batch
            if time.monotonic() >= deadline and not self._pending:
                return batch
        batch.done = True  # the end of the binlog (non-blocking reads)
        return batch

    def _boundary(self, event: QueryEvent, batch: Batch) -> bool:
        """Is this query event a transaction boundary? COMMIT (non-transactional tables) and
        DDL are; a DDL on a replicated table ends the batch so the target changes first."""
        statement = event.query.decode(errors="replace") if isinstance(event.query, bytes) else event.query
        if statement.strip().upper() in ("BEGIN", "XA START"):
            return False
        schema = event.schema.decode() if isinstance(event.schema, bytes) else event.schema
        parsed = ddl.parse(statement, schema)
        if parsed is not None and (self.watched.intersection(parsed.tables) or (
                self.selection is not None and any(self.selection.matches(t) for t in parsed.tables))):
            batch.ddl = (statement, schema, BinlogPosition(self.stream.log_file, self.stream.log_pos),
                         float(event.timestamp))
        return True

    def _changes(self, event, route: TableRoute):
        start = self.stream.log_pos - event.event_size  # the event's first byte
        if event_version(self.stream.log_file, start) < route.skip_before:
            return  # a re-copy of the table from a later position covers it
        route.check_shape(tuple(c.name for c in event.columns), f"binlog {self.stream.log_file}:{start}")
        for index, change in enumerate(event.rows):
            version = event_version(self.stream.log_file, start, index)
            if isinstance(event, UpdateRowsEvent):
                before = route.row(change["before_values"], change.get("before_none_sources"))
                after = route.row(change["after_values"], change.get("after_none_sources"))
                if route.key_of(before) != route.key_of(after):  # a key change: the old key is gone
                    self._pending.append(self._item(route, before, version, True))
                self._pending.append(self._item(route, after, version, False))
            else:
                self._pending.append(self._item(route, route.row(change["values"], change.get("none_sources")), version,
                                                isinstance(event, DeleteRowsEvent)))

    def _item(self, route: TableRoute, row: tuple, version: int, deleted: bool):
        return route, self.ring.lane(route_key(route.source, route.key_of(row))), row, version, deleted


def batches(reader: BinlogReader, stop: BinlogPosition | None, max_events: int, max_seconds: float) -> Iterator[Batch]:
    while True:
        batch = reader.read(stop, max_events, max_seconds)
        yield batch
        if batch.done:
            return


# --- splitting a backlog between reader processes ---

_ROWS_EVENT = re.compile(r"^(Write|Update|Delete)_rows")
_USE_PREFIX = re.compile(r"^\s*use\s+`(?:[^`]|``)*`\s*;\s*", re.IGNORECASE)


def split_backlog(events, parts: int, min_bytes: int) -> list[BinlogPosition] | None:
    """Cut points (positions right after a commit) that split the row-event bytes of ``events``
    — (file, pos, type, end_pos, info) rows of SHOW BINLOG EVENTS, in binlog order — into about
    ``parts`` equal shares. ``[]``: too little to split (under ``min_bytes``); None: a DDL
    statement lies in the range, so its reading must stay in one piece (the routes change there)."""
    ends, weight = [], 0  # (position after a commit, row-event bytes before it)
    for file, pos, kind, end_pos, info in events:
        if _ROWS_EVENT.match(kind):
            weight += end_pos - pos
        elif kind == "Xid" or kind == "Query" and _USE_PREFIX.sub("", info or "").strip().upper() == "COMMIT":
            ends.append((BinlogPosition(file, end_pos), weight))
        elif kind == "Query" and ddl.parse(_USE_PREFIX.sub("", info or ""), "") is not None:
            return None
    if parts < 2 or weight < min_bytes:
        return []
    cuts, share = [], weight / parts
    for position, before in ends:
        if before >= share * (len(cuts) + 1) and before < weight:
            cuts.append(position)
            if len(cuts) == parts - 1:
                break
    return cuts


def backlog_events(endpoint: MySQLEndpoint, start: BinlogPosition, stop: BinlogPosition):
    """SHOW BINLOG EVENTS from ``start`` (an event boundary: a checkpoint) up to ``stop``. Raw
    bytes: an Info column quotes statements, binary values and all."""
    import pymysql

    conn = pymysql.connect(**endpoint.connect_args(), use_unicode=False)
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW BINARY LOGS")
            files = [row[0].decode() for row in cur.fetchall()]
            for file in [f for f in files if start.seq <= file_seq(f) <= stop.seq]:
                cur.execute("SHOW BINLOG EVENTS IN %s FROM %s", (file, start.pos if file == start.file else 4))
                for name, pos, kind, _server, end_pos, info in cur.fetchall():
                    if (file_seq(name.decode()), pos) >= stop.key():
                        return
                    yield file, pos, kind.decode(), end_pos, (info or b"").decode(errors="replace")
    finally:
        conn.close()


def preflight(conn, start: BinlogPosition | None, user: str = "") -> list[str]:
    """Refuse, with what to do, a source that cannot feed CDC from ``start``; returns the
    binlog files the server still has (pymysql connection)."""
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
        except Exception as exc:  # pymysql's access-denied errors
            raise BinlogError(f"user {user!r} may not read the binlog ({exc}); grant REPLICATION SLAVE and "
                              "REPLICATION CLIENT (MySQL) or BINLOG MONITOR (MariaDB)") from exc
    if start is not None and start.file not in files:
        raise BinlogError(f"the binlog file {start.file} holding the checkpoint {start} was purged from the source "
                          f"(it has {files[0] if files else 'none'} … {files[-1] if files else ''}): the changes "
                          "since then are gone. Re-bootstrap: run a fresh full load of the tables and start the "
                          "pipeline again from it (start_from_loads=[...], reset=True)")
    return files

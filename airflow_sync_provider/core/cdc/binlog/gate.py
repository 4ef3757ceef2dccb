"""No event passes unread (issue 34): a stop on what the reader cannot read.

python-mysql-replication 1.0.17 maps every event type it does not know to NotImplementedEvent
and drops it (``filter_non_implemented_events``), and drops known types that are not in
``only_events`` before anyone sees them. :class:`CheckedBinLogStream` asks the library for every
event class it has (and NotImplementedEvent); :class:`EventGate` lets through what the reader
asked for and what carries no row change (an allow-list), and stops with a BinlogError on
anything that could carry changes of a followed table and is not read: an unknown event type
(unless the server marks it ignorable), MySQL's compressed transactions
(``TRANSACTION_PAYLOAD_EVENT``: 1.0.17 has no class for them, and its inner rows would share one
position, which the version scheme cannot rank), partial JSON updates, an Incident event, a
change of a followed table logged as a statement, and any event class a later library version
adds until it is classified here. MariaDB's compressed events are decoded (library.py).
"""

from __future__ import annotations

import logging
import re

import pymysql
import sqlglot
from pymysqlreplication import BinLogStreamReader, row_event
from pymysqlreplication import event as events
from pymysqlreplication.event import HeartbeatLogEvent, MariadbGtidEvent, QueryEvent, RotateEvent, XidEvent

from airflow_sync_provider.core.cdc import ddl
from airflow_sync_provider.core.cdc.binlog.library import (
    COMPRESSED_EVENTS,
    EVENT_MAP,
    EVENT_TYPE_NAMES,
    HARMLESS_UNKNOWN_TYPES,
    INCIDENT_EVENT,
    LOG_EVENT_IGNORABLE_F,
    TRANSACTION_PAYLOAD_EVENT,
)
from airflow_sync_provider.core.positions import BinlogError, grant

log = logging.getLogger(__name__)

_NO_RETRY = "A retry stops here again: the event stays in the binlog."


def _rebootstrap(tables: str) -> str:
    return (f"then re-bootstrap {tables} from a position after this one (CdcBootstrapOperator with restart=True, "
            "or fresh full loads and reset=True): the changes in the events not read cannot be recovered "
            "from this binlog")


# classes that carry no row change: the reader may drop them unread
HARMLESS_EVENTS = frozenset({
    events.FormatDescriptionEvent, RotateEvent, events.StopEvent, HeartbeatLogEvent, events.GtidEvent,
    events.PreviousGtidsEvent, MariadbGtidEvent, events.MariadbGtidListEvent, events.MariadbBinLogCheckPointEvent,
    events.MariadbAnnotateRowsEvent, events.MariadbStartEncryptionEvent, events.RowsQueryLogEvent,
    row_event.TableMapEvent, XidEvent, events.XAPrepareEvent, events.IntvarEvent, events.RandEvent,
    events.UserVarEvent, events.BeginLoadQueryEvent,
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
        tree = sqlglot.parse_one(statement, read="mysql", error_level=sqlglot.ErrorLevel.RAISE)
    except Exception:  # sqlglot's ParseError / TokenError
        tree = None
    if isinstance(tree, (sqlglot.exp.Insert, sqlglot.exp.LoadData)):
        target = tree.this.this if isinstance(tree.this, sqlglot.exp.Schema) else tree.this
        if isinstance(target, sqlglot.exp.Table):
            return (qualified(target),)
    if isinstance(tree, (sqlglot.exp.Update, sqlglot.exp.Delete)):
        # the tables it names outside subqueries: a multi-table UPDATE / DELETE writes to any of them
        tables = [t for t in tree.find_all(sqlglot.exp.Table) if t.find_ancestor(sqlglot.exp.Subquery,
                                                                                  sqlglot.exp.Select) is None]
        if tables:
            return tuple(qualified(t) for t in tables)
    try:
        tokens = sqlglot.Dialect.get_or_raise("mysql").tokenize(statement)
    except Exception:
        tokens = []
    words = [t.text.upper() for t in tokens]
    if match.group(1).upper() == "LOAD" and "TABLE" in words:  # LOAD DATA … INTO TABLE name
        at = words.index("TABLE") + 1
        if at < len(tokens):
            return (ddl.name_at(tokens, at, schema)[0],)
    names = [t.text for t in tokens if t.token_type in (sqlglot.tokens.TokenType.VAR,
                                                        sqlglot.tokens.TokenType.IDENTIFIER)]
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
        if isinstance(event, events.NotImplementedEvent):
            self._unknown(event, where)
        elif isinstance(event, QueryEvent) and cls in self.wanted:
            self._statement(event.query, event.schema, where)
        elif isinstance(event, events.ExecuteLoadQueryEvent):  # LOAD DATA logged as a statement
            packet = event.packet  # the library reads its post-header only: status vars, schema, statement
            packet.advance(event.status_vars_length)
            schema = packet.read(event.schema_length)
            packet.advance(1)
            self._statement(packet.read(event.event_size - packet.read_bytes), schema, where)
        elif isinstance(event, row_event.RowsEvent):
            table = f"{event.schema}.{event.table}"
            if table not in self.followed():
                return
            if isinstance(event, row_event.PartialUpdateRowsEvent):
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
            log.debug("%s: %s event skipped (carries no row change)", where, name)
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
        everything = set(EVENT_MAP.values()) | {events.NotImplementedEvent} | wanted
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

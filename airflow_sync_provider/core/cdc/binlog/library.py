"""What this package changes in python-mysql-replication 1.0.17, for every reader in the process.

**Decoding corrections** (found by tests/test_type_domain.py): a DATE the server accepted under a
lax ``sql_mode`` ('2025-02-30') raised ValueError and killed the stream (it now decodes as NULL,
as the full load stores it); negative TIME values with a fraction came out wrong; and strings
were decoded with Python codecs that are not MySQL's (utf16 without a BOM as little-endian,
latin1 as strict cp1252). Values are then brought to the target's form by the type rules'
``from_binlog`` (core/typemap.py), the same rules the full load follows.

**MariaDB's compressed events** (``QUERY_COMPRESSED_EVENT``, ``WRITE/UPDATE/DELETE_ROWS_
COMPRESSED_EVENT(_V1)``, MariaDB's log_event.h) are the ordinary events with the part after their
fixed header zlib-compressed behind a 1-byte header (bit 7 set, algorithm in bits 4-6, 0 = zlib;
bits 0-2 = how many big-endian bytes of uncompressed length follow). The shims below decompress
that part and hand the plain event to the library's own QueryEvent / RowsEvent code (nothing of
the row format is parsed here); they are registered in the library's event map. ``log_pos``,
``event_size`` and so ``event_version`` stay those of the compressed event in the file; a DDL in
a compressed query is a QueryEvent like any other. Without them python-mysql-replication maps
every event type it does not know to NotImplementedEvent and drops it: on a MariaDB source with
``log_bin_compress=ON`` every row change and every DDL vanished without a word (issue 34).
"""

from __future__ import annotations

import codecs
import datetime as dt
import zlib

from pymysql.protocol import MysqlPacket
from pymysqlreplication import row_event
from pymysqlreplication.event import GtidEvent, QueryEvent
from pymysqlreplication.packet import BinLogPacketWrapper
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from airflow_sync_provider.core.positions import BinlogError

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


row_event.RowsEvent.charset_to_encoding = staticmethod(_charset_to_encoding)
row_event.RowsEvent._RowsEvent__read_date = _read_date_or_null
row_event.RowsEvent._RowsEvent__read_time2 = _read_time2


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
    body = zlib.decompress(data[1 + lenlen:])
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
        except (ValueError, zlib.error) as exc:
            raise BinlogError(f"a {EVENT_TYPE_NAMES.get(wire_type, wire_type)} event ending at offset "
                              f"{from_packet.log_pos} cannot be decompressed: {exc}") from exc
        packet = MysqlPacket(raw[:20] + plain + tail, None)
        packet.advance(20)
        from_packet.packet, from_packet.event_type = packet, self.PLAIN_TYPES[wire_type]
        try:
            super().__init__(from_packet, len(plain), table_map, ctl_connection, verify_checksum=False, **kwargs)
        finally:
            from_packet.event_type = wire_type
        self.event_type, self.event_size, self._plain_size = wire_type, event_size, len(plain)
        if verify:  # the server's checksum covers the compressed event
            self._is_event_valid = zlib.crc32(raw[1:20 + event_size]).to_bytes(4, "little") == tail[:4]

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
EVENT_MAP = BinLogPacketWrapper._BinLogPacketWrapper__event_map  # the library's type → class table
EVENT_MAP.update(COMPRESSED_EVENTS)


# --- MySQL's commit time in its GTID event (core/cdc/binlog/commits.py) ---
# MySQL >= 8.0.1 writes immediate_commit_timestamp (µs, 7 bytes little-endian) after
# sequence_number, then, when its bit 55 is set, original_commit_timestamp (7 more): the library
# (1.0.17) stops reading before it. Not run here (the test services are MariaDB only).
_COMMIT_TIME_LENGTH, _ORIGINAL_FOLLOWS = 7, 1 << 55
_gtid_init = GtidEvent.__init__


def _gtid_init_with_commit_time(self, from_packet, event_size, table_map, ctl_connection, **kwargs):
    _gtid_init(self, from_packet, event_size, table_map, ctl_connection, **kwargs)
    self.immediate_commit_us = None
    if self.mysql_version >= (8, 0, 1):
        data = self.packet.read(_COMMIT_TIME_LENGTH)
        if len(data) == _COMMIT_TIME_LENGTH:
            self.immediate_commit_us = int.from_bytes(data, "little") & ~_ORIGINAL_FOLLOWS


GtidEvent.__init__ = _gtid_init_with_commit_time

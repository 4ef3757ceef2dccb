"""No event passes unread (issue 34), without a server: events the reader cannot read stop it.

Events are built byte by byte and decoded by python-mysql-replication's own packet wrapper, as
the stream would hand them over; the reader (core/cdc/reader.BinlogReader) then meets them
through its stream. The same paths against a real MariaDB with compressed events:
tests/test_cdc_compressed_binlog.py. MySQL 8's compressed transactions cannot be produced here
(no MySQL 8 server): their refusal is tested with a synthetic Transaction_payload event.
"""

from __future__ import annotations

import struct
import zlib

import pytest
from pymysql.protocol import MysqlPacket
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import NotImplementedEvent, QueryEvent
from pymysqlreplication.packet import BinLogPacketWrapper

from airflow_sync_provider.core.cdc.binlog import batches, library
from airflow_sync_provider.core.cdc.binlog.gate import EventGate, statement_targets
from airflow_sync_provider.core.cdc.binlog.library import COMPRESSED_EVENTS, QueryCompressedEvent, uncompress_body
from airflow_sync_provider.core.cdc.binlog.preflight import check_compression
from airflow_sync_provider.core.cdc.binlog.reader import BinlogReader
from airflow_sync_provider.core.cdc.binlog.routes import TableRoute
from airflow_sync_provider.core.cdc.ring import HashRing
from airflow_sync_provider.core.endpoints import MySQLEndpoint
from airflow_sync_provider.core.positions import BinlogError, BinlogPosition
from airflow_sync_provider.core.source.schema import TableSchema
from airflow_sync_provider.core.typemap import MySQLColumn


class _Ctl:
    charset = "utf8mb4"

    def _get_dbms(self):
        return "mariadb"


EVERY_CLASS = frozenset(library.EVENT_MAP.values()) | {NotImplementedEvent}


def make_event(event_type: int, body: bytes, log_pos: int = 1000, flags: int = 0, table_map=None):
    """An event as the stream decodes it: OK byte, 19-byte header, body (no checksum)."""
    header = struct.pack("<IBIIIH", 1_700_000_000, event_type, 1, 19 + len(body), log_pos, flags)
    wrapper = BinLogPacketWrapper(MysqlPacket(b"\x00" + header + body, None), table_map or {}, _Ctl(), (10, 11, 0),
                                  False, EVERY_CLASS, None, None, None, None, True, False, False, True, False)
    return wrapper.event


def query_body(statement: bytes, schema: bytes = b"shop") -> bytes:
    return struct.pack("<IIBHH", 7, 0, len(schema), 0, 0) + schema + b"\x00" + statement


def compressed(data: bytes, lenlen: int = 0) -> bytes:
    lenlen = lenlen or max(1, (len(data).bit_length() + 7) // 8)
    return bytes([0x80 | lenlen]) + len(data).to_bytes(lenlen, "big") + zlib.compress(data)


def test_mariadb_compressed_records_decode_and_bad_ones_are_refused():
    text = b"ALTER TABLE shop.orders ADD COLUMN note VARCHAR(20) DEFAULT 'x'" * 3
    for lenlen in (1, 2, 3, 4):
        assert uncompress_body(compressed(text, lenlen)) == text
    with pytest.raises(ValueError, match="bit 7"):
        uncompress_body(zlib.compress(text))
    with pytest.raises(ValueError, match="algorithm 1"):
        uncompress_body(bytes([0x91, 10]) + zlib.compress(text))
    with pytest.raises(ValueError, match="header says"):
        uncompress_body(bytes([0x81, 10]) + zlib.compress(text))


def test_a_compressed_query_is_a_query_event_at_the_compressed_events_size():
    statement = b"ALTER TABLE orders ADD COLUMN note VARCHAR(20) DEFAULT 'x'"
    body = query_body(b"", b"shop") + compressed(statement)
    event = make_event(0xA5, body, log_pos=5000)
    assert type(event) is QueryCompressedEvent and isinstance(event, QueryEvent)
    assert event.query == statement.decode() and event.schema == b"shop"
    assert event.event_size == len(body) and event.event_type == 0xA5  # the event in the file, not the plain one
    assert event.packet.log_pos == 5000
    # every MariaDB compressed type is registered with the library, and the plain type is the library's own
    assert set(COMPRESSED_EVENTS) == set(range(0xA5, 0xAC))


def _rows_event(event_type: int, rows: list[tuple[int, int]], extra: bytes | None = None, compress=False):
    """A Write_rows event of table 42 (id INT, v INT): V1 layout, or V2 with ``extra`` data."""
    from pymysqlreplication.column import Column
    from pymysqlreplication.table import Table

    columns = [Column(type=3, name=n, unsigned=False, is_primary=n == "id", charset_id=None) for n in ("id", "v")]
    table_map = {42: Table(42, "shop", "orders", columns, primary_key="id", column_name_flag=True)}
    head = (42).to_bytes(6, "little") + b"\x00\x00"
    if extra is not None:
        head += (2 + len(extra)).to_bytes(2, "little") + extra
    head += b"\x02" + b"\x03"  # 2 columns, both present
    images = b"".join(b"\x00" + struct.pack("<ii", i, v) for i, v in rows)
    body = head + (compressed(images) if compress else images)
    return make_event(event_type, body, table_map=table_map), len(body)


@pytest.mark.parametrize("plain, packed, extra", [
    (0x17, 0xA6, None),  # Write_rows_v1 / Write_rows_compressed_v1: what MariaDB 10.11 writes
    (0x1E, 0xA9, b"\x01\x07\x00"),  # Write_rows (V2, with extra data: a partition id) / Write_rows_compressed
])
def test_compressed_rows_decode_as_the_plain_event_at_the_compressed_size(plain, packed, extra):
    rows = [(i, (-1) ** i * i * 1000) for i in range(1, 301)]
    expected, _ = _rows_event(plain, rows, extra)
    event, size = _rows_event(packed, rows, extra, compress=True)
    assert type(event) is library.WriteRowsCompressedEvent and event.event_type == packed
    assert event.rows == expected.rows and len(event.rows) == 300
    assert event.event_size == size < expected.event_size  # the compressed event's own bytes
    if extra:
        assert event.partition_id == 7


def _gate(*followed):
    return EventGate(frozenset({QueryEvent, QueryCompressedEvent}), lambda: set(followed))


@pytest.mark.parametrize("event_type, message", [
    (200, r"binlog mysql-bin\.000003:900: event type 200 \(unknown\), which python-mysql-replication 1\.0\.17 "
          r"does not decode.*A retry stops here again.*re-bootstrap"),
    (0xA6, r"event type 166 \(Write_rows_compressed_v1\)"),  # what the reader saw before the shim: now decoded
    (0x28, r"compressed transaction \(event type 40 \(Transaction_payload\).*A retry stops here again.*"
           r"binlog_transaction_compression=OFF"),
    (0x1A, r"Incident \(event type 26 \(Incident\)\).*a replica stops here too"),
    (0x27 + 200, r"event type 239 \(unknown\)"),
])
def test_events_the_reader_cannot_read_stop_it(event_type, message):
    event = NotImplementedEvent.__new__(NotImplementedEvent)
    event.event_type, event.packet = event_type, type("P", (), {"flags": 0})()
    with pytest.raises(BinlogError, match=message):
        _gate("shop.orders").check(event, "mysql-bin.000003", 900)


def test_events_that_carry_no_change_pass():
    gate = _gate("shop.orders")
    for event_type, flags in ((34, 0), (41, 0), (42, 0), (36, 0), (200, 0x80)):  # 0x80: "ignorable" by the server
        event = make_event(event_type, b"\x00" * 12, flags=flags)
        assert type(event) is NotImplementedEvent
        gate.check(event, "mysql-bin.000003", 900)
    incident = make_event(0x1A, b"\x01\x00\x00", flags=0x80)  # an incident is never skipped
    with pytest.raises(BinlogError, match="Incident"):
        gate.check(incident, "mysql-bin.000003", 900)


@pytest.mark.parametrize("statement, schema, written, not_written", [
    ("UPDATE orders SET n = 1 WHERE id = 2", "shop", {"shop.orders"}, set()),
    ("/* app */ insert into `shop`.`orders` (id) values (1)", "x", {"shop.orders"}, {"x.orders"}),
    ("INSERT INTO report SELECT * FROM orders", "shop", {"shop.report"}, {"shop.orders"}),
    ("DELETE o FROM orders o JOIN items i ON i.o = o.id", "shop", {"shop.orders", "shop.items"}, set()),
    ("DELETE FROM items WHERE o IN (SELECT id FROM orders)", "shop", {"shop.items"}, {"shop.orders"}),
    ("UPDATE items SET n = (SELECT max(n) FROM orders)", "shop", {"shop.items"}, {"shop.orders"}),
    ("REPLACE INTO orders VALUES (1)", "shop", {"shop.orders"}, set()),
    ("LOAD DATA INFILE '/tmp/x' INTO TABLE other.orders", "shop", {"other.orders"}, {"shop.orders"}),
])
def test_a_data_change_statement_names_the_tables_it_writes(statement, schema, written, not_written):
    found = set(statement_targets(statement, schema))
    assert written <= found and not found & not_written


@pytest.mark.parametrize("statement", ["COMMIT", "BEGIN", "ALTER TABLE orders ADD COLUMN c INT", "TRUNCATE t",
                                       "XA COMMIT 'x'", "SAVEPOINT a"])
def test_other_statements_are_no_data_change(statement):
    assert statement_targets(statement, "shop") is None


def test_a_statement_logged_change_of_a_followed_table_stops_the_reader_and_others_pass():
    gate = _gate("shop.orders")
    with pytest.raises(BinlogError, match=r"table shop\.orders, binlog b\.000001:77: a change logged as a statement"
                                          r".*binlog_format=ROW"):
        gate.check(make_event(2, query_body(b"UPDATE orders SET n = n + 1")), "b.000001", 77)
    # LOAD DATA logged as a statement (Execute_load_query: 13 more post-header bytes, then the statement)
    load = struct.pack("<IIBHH", 7, 0, 4, 0, 0) + struct.pack("<IIIB", 1, 10, 20, 0) + b"shop\x00" \
        + b"LOAD DATA INFILE '/tmp/x' INTO TABLE orders"
    with pytest.raises(BinlogError, match=r"table shop\.orders.*LOAD DATA"):
        gate.check(make_event(18, load), "b.000001", 99)
    for statement in (b"UPDATE other SET n = 1", b"INSERT INTO report SELECT * FROM orders", b"COMMIT",
                      b"ALTER TABLE orders ADD COLUMN c INT"):
        gate.check(make_event(2, query_body(statement)), "b.000001", 77)


def test_preflight_refuses_mysqls_compressed_transactions():
    class Conn:
        def __init__(self, rows):
            self.rows = rows

        def cursor(self):
            conn = self

            class Cursor:
                def __enter__(self):
                    return self

                def __exit__(self, *exc):
                    return False

                def execute(self, statement):
                    pass

                def fetchall(self):
                    return conn.rows
            return Cursor()

    with pytest.raises(BinlogError, match=r"binlog_transaction_compression=ON.*Set binlog_transaction_compression=OFF"):
        check_compression(Conn([("binlog_transaction_compression", "ON")]))
    check_compression(Conn([("binlog_transaction_compression", "OFF")]))
    check_compression(Conn([("log_bin_compress", "ON"), ("log_bin_compress_min_len", "10")]))  # decoded


def test_an_unknown_event_type_stops_the_reader(monkeypatch):
    """BinlogReader (not only the gate): an event type python-mysql-replication maps to
    NotImplementedEvent, which BinLogStreamReader used to drop, ends the read with the position."""
    events = iter([make_event(2, query_body(b"BEGIN"), log_pos=300), make_event(201, b"\x01" * 30, log_pos=349)])

    def fetchone(self):
        event = next(events, None)
        if event is not None:
            self.log_file, self.log_pos = "mysql-bin.000004", event.packet.log_pos
        return event

    monkeypatch.setattr(BinLogStreamReader, "fetchone", fetchone)
    schema = TableSchema("shop", "orders", (MySQLColumn("id", "int", "int(11)", False),), ("id",))
    route = TableRoute(schema, "shop_ch", "orders")
    reader = BinlogReader(MySQLEndpoint(), BinlogPosition("mysql-bin.000004", 4), {"shop.orders": route},
                          HashRing(2, 16), server_id=77)
    with pytest.raises(BinlogError, match=r"binlog mysql-bin\.000004:300: event type 201 \(unknown\).*"
                                          r"A retry stops here again"):
        reader.read(None, 1000, 5.0)


def test_a_compressed_rows_event_with_more_rows_than_bytes_stops_the_reader():
    """A row's version is its event's offset plus its index, so an event must hold fewer rows than
    bytes; zlib can pack rows tighter (here 2000 equal images into a few dozen bytes)."""
    gate = EventGate(frozenset({library.WriteRowsCompressedEvent}), lambda: {"shop.orders"})
    small, _ = _rows_event(0xA6, [(i, 0) for i in range(1, 11)], compress=True)
    gate.check(small, "b.000001", 400)
    dense, size = _rows_event(0xA6, [(1, 0)] * 2000, compress=True)
    assert size < 2000
    with pytest.raises(BinlogError, match=r"table shop\.orders, binlog b\.000001:400: a compressed rows event of "
                                          r"\d+ bytes holds 2000 rows.*log_bin_compress=OFF"):
        gate.check(dense, "b.000001", 400)
    other = EventGate(frozenset({library.WriteRowsCompressedEvent}), lambda: {"shop.items"})
    other.check(_rows_event(0xA6, [(1, 0)] * 2000, compress=True)[0], "b.000001", 400)  # not followed: not read


def _batch_of(events: int, lanes: dict):
    batch = batches.Batch(BinlogPosition("mysql-bin.000001", 4), BinlogPosition("mysql-bin.000001", 900))
    batch.events = events
    for source, per_lane in lanes.items():
        for lane, ids in per_lane.items():
            batch.lanes[source][lane] = ([(i, f"v{i}") for i in ids], [100 + i for i in ids], [0] * len(ids))
    return batch


def test_a_small_batch_is_one_insert_per_target_and_a_large_one_keeps_its_lanes():
    """Lane payloads (spark/cdc_stream._lane_payloads): a merged copy's members go to one insert
    per lane, a small batch to one lane; every row once, the rows per source table counted; staging
    (combine=False) keeps a payload per source table."""
    import pyarrow as pa

    from airflow_sync_provider.spark.cdc_stream import ONE_LANE_EVENTS, Weigher, _lane_payloads

    columns = (MySQLColumn("id", "int", "int(11)", False), MySQLColumn("v", "varchar", "varchar(8)", True))
    routes = {f"shop.o{i}": TableRoute(TableSchema("shop", f"o{i}", columns, ("id",)), "ch", "merged")
              for i in range(2)}
    routes["shop.other"] = TableRoute(TableSchema("shop", "other", columns, ("id",)), "ch", "other")
    lanes = {"shop.o0": {0: [1, 2], 1: [3]}, "shop.o1": {0: [1], 1: [4, 5]}, "shop.other": {1: [9]}}

    def rows(payloads):
        return sorted((t, r["id"]) for lane in payloads for _, t, _, data in lane
                      for r in pa.ipc.open_stream(data).read_all().to_pylist())

    small, history = _lane_payloads(_batch_of(7, lanes), routes, 2, Weigher(None))
    assert [len(lane) for lane in small] == [2, 0, 0] and history == {}  # one lane; one insert per target table
    # (the last lane: history rows, none here: no copy keeps a history)
    counts = {t: dict(c) for _, t, c, _ in small[0]}
    assert counts == {"merged": {"shop.o0": 3, "shop.o1": 3}, "other": {"shop.other": 1}}
    large = _lane_payloads(_batch_of(ONE_LANE_EVENTS + 1, lanes), routes, 2, Weigher(None))[0]
    assert [sorted(t for _, t, _, _ in lane) for lane in large] == [["merged"], ["merged", "other"], []]
    staged = _lane_payloads(_batch_of(7, lanes), routes, 2, Weigher(None), combine=False)[0]
    assert sorted(c[0][0] for lane in staged for _, _, c, _ in lane) == sorted(
        ["shop.o0", "shop.o0", "shop.o1", "shop.o1", "shop.other"])
    expected = sorted([("merged", i) for i in (1, 2, 3, 1, 4, 5)] + [("other", 9)])
    assert rows(small) == rows(large) == rows(staged) == expected


def test_a_history_rows_commit_gtid_and_operation_come_from_its_transaction_and_rows_event():
    """core/cdc/binlog/commits.py: each row finds its transaction's Commit and its rows event's kind
    by its version; a tombstone in an update event (a key change's old key) is a delete. MySQL's
    GTID event gives its immediate_commit_timestamp in µs (core/cdc/binlog/library.py), MariaDB's its
    header time; either names its server as core/cdc/servers.Server.key does."""
    import types
    import uuid

    from airflow_sync_provider.core.cdc.binlog.commits import Commit, commit_of, stamps

    commits = [Commit(100, 1_000_000, "0", 7, "mariadb:1:0"), Commit(200, 2_000_000, "0", 8, "mariadb:1:0")]
    kinds = [(101, 0), (150, 1), (201, 2)]
    found = stamps(commits, kinds, [101, 102, 150, 150, 151, 201], [0, 0, 1, 0, 0, 3], "t")
    assert found.event.to_pylist() == ["insert", "insert", "delete", "update", "update", "delete"]
    assert found.commit_us.to_pylist() == [1_000_000] * 5 + [2_000_000]
    assert found.gtid_seq.to_pylist() == [7] * 5 + [8] and found.server.to_pylist() == ["mariadb:1:0"] * 6
    with pytest.raises(RuntimeError, match="no transaction or rows event read before version 99"):
        stamps(commits, kinds, [99], [0], "t")
    mariadb = commit_of(types.SimpleNamespace(gtid="3-12-456", timestamp=1_700_000_000), 500)
    assert mariadb == Commit(500, 1_700_000_000_000_000, "3", 456, "mariadb:12:3")
    sid, micros = uuid.uuid4(), 1_700_000_000_123_456
    body = (b"\x01" + sid.bytes + struct.pack("<Q", 42) + b"\x02" + struct.pack("<QQ", 5, 6)
            + (micros | 1 << 55).to_bytes(7, "little") + (micros - 9).to_bytes(7, "little") + b"\x00" * 8)
    header = struct.pack("<IBIIIH", 1_700_000_000, 0x21, 1, 19 + len(body), 1000, 0)
    event = BinLogPacketWrapper(MysqlPacket(b"\x00" + header + body, None), {}, _Ctl(), (8, 0, 36), False,
                                EVERY_CLASS, None, None, None, None, True, False, False, True, False).event
    assert commit_of(event, 900) == Commit(900, micros, str(sid), 42, f"mysql:{sid}")

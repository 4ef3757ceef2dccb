"""The bootstrap's key paging (core/cdc/chunks.py) as pure logic: the "after the last key"
predicate is exactly the tuple order, for every key width (checked by running it in SQLite)."""

from __future__ import annotations

import sqlite3
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_sync_provider.core.cdc.chunks import CHUNK_BYTES, ChunkKey, chunk_rows
from airflow_sync_provider.core.typemap import MySQLColumn


def _key(width: int, data_type: str = "int") -> ChunkKey:
    return ChunkKey("db.t", tuple(MySQLColumn(f"k{i}", data_type, data_type, False) for i in range(width)))


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 3).flatmap(lambda w: st.tuples(
    st.just(w), st.lists(st.tuples(*[st.integers(-3, 3)] * w), min_size=1, max_size=30, unique=True),
    st.tuples(*[st.integers(-3, 3)] * w))))
def test_after_selects_exactly_the_keys_greater_than_the_last_one(case):
    width, rows, last = case
    key = _key(width)
    where, params = key.after(list(last))
    db = sqlite3.connect(":memory:")
    db.execute(f"CREATE TABLE t ({', '.join(f'k{i} INT' for i in range(width))})")
    db.executemany(f"INSERT INTO t VALUES ({', '.join('?' * width)})", rows)
    sql = where.replace("`", '"').replace("%s", "?")
    got = sorted(db.execute(f"SELECT * FROM t WHERE {sql}", params).fetchall())
    assert got == sorted(r for r in rows if r > last)


def test_the_predicate_leads_with_a_range_on_the_first_column():
    where, params = _key(2).after([5, 7])
    assert where == "`k0` >= %s AND (`k0` > %s OR (`k0` = %s AND (`k1` > %s)))" and params == (5, 5, 5, 7)
    assert _key(2).after(None) == ("1=1", ())


def test_keys_round_trip_through_the_ledger_form():
    key = ChunkKey("db.t", (MySQLColumn("a", "decimal", "decimal(65,30)", False),
                            MySQLColumn("b", "varbinary", "varbinary(8)", False),
                            MySQLColumn("c", "varchar", "varchar(9)", False),
                            MySQLColumn("d", "bigint", "bigint unsigned", False)))
    raw = [b"-12.500000000000000000000000000001", b"\x00\xff ", "Ä 🙂 ", b"18446744073709551615"]
    value = key.from_raw(raw)
    assert value == [Decimal("-12.500000000000000000000000000001"), b"\x00\xff ", "Ä 🙂 ", 2 ** 64 - 1]
    import json

    assert key.decode(json.loads(json.dumps(key.encode(value)))) == value


def test_chunks_of_wide_rows_are_cut_to_a_bounded_size():
    """A chunk is one reader query, whose whole result the reader may buffer: wide rows get fewer per chunk."""
    assert chunk_rows(500_000, 0) == 500_000  # row length unknown: as configured
    assert chunk_rows(500_000, 100) == min(500_000, CHUNK_BYTES // 100)
    assert chunk_rows(500_000, 700) * 700 <= CHUNK_BYTES < (chunk_rows(500_000, 700) + 1) * 700
    assert chunk_rows(1_000, 700) == 1_000  # never more than asked
    assert chunk_rows(500_000, 10**9) == 1

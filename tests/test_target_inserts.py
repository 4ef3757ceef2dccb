"""Streamed Arrow inserts (core/clickhouse/inserts.py) against the ClickHouse endpoint: rows land once,
in few inserts, counted exactly; a failed insert fails the writer instead of hanging it."""

from __future__ import annotations

import threading
import time
import uuid

import pyarrow as pa
import pytest

from airflow_sync_provider.core.clickhouse import inserts as inserts_module
from airflow_sync_provider.core.clickhouse.client import shared_client
from airflow_sync_provider.core.clickhouse.inserts import ArrowInserts, InsertLimits
from airflow_sync_provider.core.endpoints import ClickHouseEndpoint

SCHEMA = pa.schema([("id", pa.uint64()), ("s", pa.string())])


def batch(start: int, rows: int) -> pa.RecordBatch:
    ids = range(start, start + rows)
    return pa.record_batch([pa.array(ids, pa.uint64()), pa.array([f"v{i}" for i in ids])], schema=SCHEMA)


class Counting:
    """A client that counts its raw inserts (and passes them on)."""

    def __init__(self, ch):
        self.ch, self.inserts = ch, 0

    def raw_insert(self, *args, **kwargs):
        self.inserts += 1
        return self.ch.raw_insert(*args, **kwargs)


@pytest.fixture
def writer(clickhouse_url):
    """Session-less, as the copy paths' shared client: an insert may be acknowledged while the next streams."""
    return shared_client(ClickHouseEndpoint.from_url(clickhouse_url))


@pytest.fixture
def table(ch):
    name = f"ins_{uuid.uuid4().hex[:8]}"
    ch.command(f"CREATE TABLE {name} (id UInt64, s String) ENGINE = MergeTree ORDER BY id")
    yield name
    ch.command(f"DROP TABLE IF EXISTS {name}")


def contents(ch, table):
    return ch.query(f"SELECT count(), uniqExact(id), sum(id), countIf(s != concat('v', toString(id))) FROM {table}"
                    ).result_rows[0]


def test_rows_stream_into_few_inserts_each_row_once(ch, writer, table):
    counting, written = Counting(writer), []
    with ArrowInserts(counting, table, limits=InsertLimits(rows=3_000),
                      on_written=lambda rows, _: written.append(rows)) as inserts:
        for i in range(10):
            inserts.write(batch(i * 1_000, 1_000))
        inserts.finish()
    assert counting.inserts == 4 and sorted(written) == [1_000, 3_000, 3_000, 3_000]
    assert contents(ch, table) == (10_000, 10_000, sum(range(10_000)), 0)
    # finish() ends a shard's inserts: the next rows open a new one
    with ArrowInserts(counting, table) as inserts:
        inserts.write(batch(10_000, 10))
        inserts.finish()
        inserts.write(batch(10_010, 10))
        inserts.finish()
    assert counting.inserts == 6 and contents(ch, table)[0] == 10_020


def test_one_stream_carries_several_owners_each_counted_and_answered(ch, writer, table):
    """A channel's shards, one after another, into one stream: each owner's rows are counted as
    they are acknowledged, and ``sent()`` is answered only once every insert carrying its rows is
    (the open insert goes on taking the next owner's rows)."""
    counting, written = Counting(writer), {}
    def count(rows, owner):
        written[owner] = written.get(owner, 0) + rows

    with ArrowInserts(counting, table, limits=InsertLimits(rows=2_500), on_written=count) as inserts:
        tickets = {}
        for owner, start, sizes in (("a", 0, (1_000, 1_000)), ("b", 2_000, (1_000, 1_000)), ("c", 4_000, (500,))):
            for size in sizes:
                inserts.write(batch(start, size), owner)
                start += size
            tickets[owner] = inserts.sent()
        assert not tickets["c"].done()  # its rows are in the open insert, which takes more rows
        inserts.finish()
    assert all(t.done() and t.error() is None for t in tickets.values())
    assert written == {"a": 2_000, "b": 2_000, "c": 500} and counting.inserts == 2  # ended at 3,000, then finish()
    assert contents(ch, table) == (4_500, 4_500, sum(range(4_500)), 0)
    # limits.owners: an insert ends before a new owner's rows would make one too many
    counting.inserts = 0
    with ArrowInserts(counting, table, limits=InsertLimits(owners=2)) as inserts:
        for k, owner in enumerate("defg"):
            inserts.write(batch(10_000 + k * 10, 10), owner)
        inserts.finish()
    assert counting.inserts == 2


def test_an_idle_insert_is_kept_alive_with_empty_batches(ch, writer, table, monkeypatch):
    monkeypatch.setattr(inserts_module, "KEEPALIVE_SECONDS", 0.1)
    with ArrowInserts(writer, table) as inserts:
        inserts.write(batch(0, 5))
        time.sleep(0.6)  # the source is slow: several keep-alives
        inserts.write(batch(5, 5))
        inserts.finish()
    assert contents(ch, table) == (10, 10, sum(range(10)), 0)


def test_a_failed_insert_fails_the_writer_and_counts_its_rows(writer):
    failed, written = [], []
    inserts = ArrowInserts(writer, f"no_such_table_{uuid.uuid4().hex[:6]}",
                           on_written=lambda rows, _: written.append(rows),
                           on_failed=lambda rows, _: failed.append(rows))
    handed = 0  # a server may refuse before the body ends: the rows handed over by then all count failed, once
    with pytest.raises(Exception, match="(?i)no_such_table|unknown table|doesn't exist|does not exist"):
        for i in range(5):
            inserts.write(batch(i * 100, 100))
            handed += 100
        inserts.finish()
    inserts.close()
    assert handed >= 100 and failed == [handed] and written == []


class Refusing:
    """A server that answers at once with an error without reading the body (as ClickHouse
    does for a bad statement): the writer must notice instead of waiting on a full queue."""

    def raw_insert(self, table, names, body, **kwargs):
        raise RuntimeError("Code: 60. DB::Exception: refused")


def test_a_writer_never_hangs_on_an_insert_that_stopped_reading():
    failed = []
    inserts = ArrowInserts(Refusing(), "t", on_failed=lambda rows, _: failed.append(rows))
    done = threading.Event()
    outcome = {}

    def write_many():
        try:
            for i in range(50):
                inserts.write(batch(i * 10, 10))
            inserts.finish()
        except Exception as exc:
            outcome["error"] = exc
        done.set()

    threading.Thread(target=write_many, daemon=True).start()
    assert done.wait(30), "the writer hung on a dead insert"
    inserts.close()
    assert "refused" in str(outcome.get("error")) and sum(failed) >= 10

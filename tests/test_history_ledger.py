"""The history ledger (issue 61, docs/design/history-tables.md §3-§4): ``history_applied`` (per pipeline,
table and batch: versions covered, rows, sum of versions) and ``history_ranges`` (covered ranges,
holes with their reason), on the real ClickHouse endpoint, and the gap-free check's counting (§4.2)
against a history written with core/clickhouse/history.py: a version missing, or one too many, shows."""

from __future__ import annotations

from datetime import datetime, timezone

import pyarrow as pa
import pytest

from airflow_sync_provider.core.cdc.history_ledger import COVERED, GAP, HOLE, OVERLAP, Applied, HistoryLedger, Range
from airflow_sync_provider.core.clickhouse.history import HistoryTable, Stamp
from airflow_sync_provider.core.content.shaping import Content
from airflow_sync_provider.core.source.schema import TableSchema
from airflow_sync_provider.core.typemap import MySQLColumn

LEDGER = "hist_ledger"
DB = "hist_ledger_copy"
T0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=timezone.utc)


@pytest.fixture
def ledger(ch):
    ch.command(f"DROP DATABASE IF EXISTS {LEDGER}")
    made = HistoryLedger(ch, LEDGER)
    made.ensure()
    made.ensure()  # a second start finds them and changes nothing
    return made


def test_the_tables_are_made_like_the_other_ledger_tables(ch, ledger):
    engines = dict(ch.query("SELECT name, engine_full FROM system.tables WHERE database = {d:String}",
                            parameters={"d": LEDGER}).result_rows)
    assert sorted(engines) == ["history_applied", "history_ranges"]
    assert engines["history_applied"].startswith("ReplacingMergeTree(updated_at)") and \
        "ORDER BY (pipeline, source_table, from_version)" in engines["history_applied"]
    # a table made by an earlier release without a column gets it at the next start
    ch.command(f"ALTER TABLE {LEDGER}.history_applied DROP COLUMN generation")
    ledger.ensure()
    assert ch.command(f"SELECT count() FROM system.columns WHERE database = '{LEDGER}' AND "
                      "table = 'history_applied' AND name = 'generation'") == 1


def test_a_batch_record_is_read_back_replaced_by_its_replay_and_holds_any_sum(ledger):
    big = [(1 << 63) + 5, (1 << 63) + 6, (1 << 63) + 9]  # versions after failovers: their sum is beyond 64 bits
    ledger.write_applied("p", [Applied.of("shop.orders", 100, 200, [100, 150, 150]),
                               Applied.of("shop.items", 100, 200, [120])])
    ledger.write_applied("p", [Applied.of("shop.orders", 200, (1 << 63) + 10, [250, *big])], generation=3)
    ledger.write_applied("q", [Applied.of("shop.orders", 0, 10, [1])])  # another pipeline's
    assert ledger.applied("p", "shop.orders") == [Applied("shop.orders", 100, 200, 3, 400),
                                                  Applied("shop.orders", 200, (1 << 63) + 10, 4, 250 + sum(big))]
    assert sum(big) > (1 << 64)
    # the batch replayed after a crash (one row fewer this time: the record is the newest one)
    ledger.write_applied("p", [Applied.of("shop.orders", 100, 200, [100, 150])])
    assert ledger.applied("p", "shop.orders")[0] == Applied("shop.orders", 100, 200, 2, 250)
    assert ledger.applied("p", "shop.items") == [Applied("shop.items", 100, 200, 1, 120)]
    with pytest.raises(ValueError, match=r"table shop.orders: history versions \[200\] lie outside"):
        Applied.of("shop.orders", 100, 200, [150, 200])


def test_breaks_are_gaps_no_hole_explains_and_overlaps(ledger):
    table = "shop.orders"
    ledger.write_applied("p", [Applied(table, 100, 200, 1, 100), Applied(table, 200, 300, 1, 200),
                               Applied(table, 400, 500, 1, 400)])
    assert ledger.breaks("p", table) == [Range(table, GAP, 300, 400)]
    assert ledger.complete_from("p", table) == 100
    ledger.write_range("p", Range(table, HOLE, 300, 400, "binlog purged before the pipeline read it"))
    ledger.write_range("p", Range(table, COVERED, 100, 300))
    assert ledger.breaks("p", table) == []
    assert ledger.ranges("p", table) == [Range(table, COVERED, 100, 300),
                                         Range(table, HOLE, 300, 400, "binlog purged before the pipeline read it")]
    assert ledger.ranges("p", table, HOLE)[0].reason.startswith("binlog purged")
    assert ledger.complete_from("p", table) == 400
    ledger.write_applied("p", [Applied(table, 450, 600, 1, 450)])
    assert ledger.breaks("p", table) == [Range(table, OVERLAP, 450, 500)]
    assert ledger.complete_from("p", "shop.none") is None and ledger.breaks("p", "shop.none") == []
    with pytest.raises(ValueError, match="a hole in its history needs its reason"):
        ledger.write_range("p", Range(table, HOLE, 1, 2))
    with pytest.raises(ValueError, match="'covered' or 'hole', not 'gap'"):
        ledger.write_range("p", Range(table, GAP, 1, 2))


def test_writes_check_the_lease_first(ledger):
    class Lost:
        def check(self):
            raise RuntimeError("lease lost")

    ledger.lease = Lost()
    with pytest.raises(RuntimeError, match="lease lost"):
        ledger.write_applied("p", [Applied("shop.orders", 1, 2, 1, 1)])
    with pytest.raises(RuntimeError, match="lease lost"):
        ledger.write_range("p", Range("shop.orders", HOLE, 1, 2, "x"))
    ledger.lease = None
    assert ledger.applied("p", "shop.orders") == [] and ledger.ranges("p", "shop.orders") == []


def counted(ch, history: HistoryTable, record: Applied) -> tuple[int, int]:
    """§4.2's count over the history: distinct (key, version) in the batch's range, and their sum."""
    return tuple(int(v) for v in ch.query(
        f"SELECT count(), sum(toUInt128(_version)) FROM (SELECT DISTINCT id, _version FROM {history.qualified} "
        "WHERE _version >= {f:UInt64} AND _version < {t:UInt64})",
        parameters={"f": record.from_version, "t": record.to_version}).result_rows[0])


def test_the_records_count_what_the_history_holds_and_a_missing_or_extra_version_shows(ch, ledger):
    schema = TableSchema("shop", "orders", (MySQLColumn("id", "int", "int(11)", False),
                                            MySQLColumn("v", "int", "int(11)", True)), ("id",),
                         content=Content.of({"history": True}))
    ch.command(f"CREATE DATABASE IF NOT EXISTS {DB}")
    history = HistoryTable(schema, DB, "orders")
    ch.command(f"DROP TABLE IF EXISTS {history.qualified}")
    history.create(ch)
    batches = [(100, 200, [(1, 100), (2, 100), (1, 150)]), (200, 300, [(3, 210), (1, 290)])]
    for low, high, changes in batches:
        rows = pa.table({"id": pa.array([k for k, _ in changes], pa.int32()), "v": pa.array([v for _, v in changes],
                                                                                           pa.int32()),
                         "_version": pa.array([v for _, v in changes], pa.uint64()),
                         "_deleted": pa.array([0] * len(changes), pa.uint8())})
        written = history.arrow(rows, Stamp(event="update", via="binlog", commit_time=T0))
        history.insert(ch, written)
        history.insert(ch, written)  # replayed: the same rows, not counted twice
        ledger.write_applied("p", [Applied.of("shop.orders", low, high, [v for _, v in changes])])
    records = ledger.applied("p", "shop.orders")
    assert [counted(ch, history, r) for r in records] == [(r.rows, r.version_sum) for r in records] == [(3, 350),
                                                                                                         (2, 500)]
    ch.command(f"DELETE FROM {history.qualified} WHERE id = 1 AND _version = 150")  # a version lost
    assert counted(ch, history, records[0]) == (2, 200)
    extra = pa.table({"id": pa.array([4], pa.int32()), "v": pa.array([1], pa.int32()),
                      "_version": pa.array([250], pa.uint64()), "_deleted": pa.array([0], pa.uint8())})
    history.insert(ch, history.arrow(extra, Stamp(event="insert", via="binlog", commit_time=T0)))  # one too many
    assert counted(ch, history, records[1]) == (3, 750)

"""A TTL'd copy (core/clickhouse/ttl.py): the TTLs the checks can window, the window's arithmetic,
and — on the real services — reconcile, the snapshot diff and the rolling verification that pass
while ClickHouse has deleted the expired rows, and still find a difference among the others."""

from __future__ import annotations

import datetime as dt

import pytest

from airflow_sync_provider.core.clickhouse.ddl import create_table_sql
from airflow_sync_provider.core.clickhouse.layout import Layout
from airflow_sync_provider.core.clickhouse.ttl import CLAMPING, MARGIN, Expiry, TtlError, Window, expiries
from airflow_sync_provider.core.jobspec import SnapshotDiffSpec
from airflow_sync_provider.core.source.group import one_server
from airflow_sync_provider.core.source.schema import TableSchema
from airflow_sync_provider.core.typemap import MySQLColumn
from tests.test_layouts import DB, TARGET, _apply, _load, _reconcile

COLUMNS = ["id", "day", "at", "stamp", "maybe", "note"]


def _schema() -> TableSchema:
    def col(name, data_type, nullable=False, **kw):
        return MySQLColumn(name=name, data_type=data_type, column_type=data_type, nullable=nullable, **kw)

    return TableSchema(DB, "t", (col("id", "int"), col("day", "date"), col("at", "datetime", fsp=0),
                                 col("stamp", "timestamp", fsp=0), col("maybe", "date", nullable=True),
                                 col("note", "varchar", nullable=True, char_length=20)), ("id",))


# --- what a TTL may say (fast) -----------------------------------------------------------------

def test_the_deleting_ttls_the_checks_can_window_are_read_and_the_others_refused_by_name():
    assert expiries("day + INTERVAL 30 DAY", "t") == (Expiry("day", 30, "DAY"),)
    assert expiries("`at` + toIntervalMonth(6) DELETE", "t") == (Expiry("at", 6, "MONTH"),)
    assert expiries("assumeNotNull(maybe) + interval 1 year", "t") == (Expiry("maybe", 1, "YEAR"),)
    # clauses that keep their rows read anything; deleting ones are and-ed
    assert expiries("toStartOfMonth(day) + INTERVAL 1 MONTH TO DISK 'cold', at + INTERVAL 2 WEEK, "
                    "day + INTERVAL 1 DAY RECOMPRESS CODEC(ZSTD(3))", "t") == (Expiry("at", 2, "WEEK"),)
    for ttl, why in (("day + INTERVAL 30 DAY DELETE WHERE note = 'x'", "WHERE"),
                     ("toDate(at) + INTERVAL 1 DAY", "toDate"), ("day + INTERVAL 1 FORTNIGHT", "FORTNIGHT"),
                     ("day + INTERVAL 1 MONTH GROUP BY id SET note = any(note)", "GROUP BY")):
        with pytest.raises(TtlError, match=rf"table t: TTL clause .*{why}.*: a TTL that deletes rows must read "
                                           "COLUMN \\+ INTERVAL n UNIT"):
            expiries(ttl, "t")
    # the layout refuses it before any work, and the copy's DDL names a column that cannot hold a TTL
    with pytest.raises(TtlError, match="WHERE"):
        Layout.of({"ttl": "day + INTERVAL 1 DAY DELETE WHERE id > 3"}).check("lay.t", ("id",), COLUMNS)
    for ttl, why in (("note + INTERVAL 1 DAY", "TTL column 'note' is varchar"),
                     ("gone + INTERVAL 1 DAY", "TTL column 'gone' is not a column of the copy")):
        with pytest.raises(TtlError, match=f"table lay_ch.t: {why}"):
            create_table_sql(_schema(), TARGET, "t", Layout.of({"ttl": ttl}))
    sql = create_table_sql(_schema(), TARGET, "t", Layout.of({"ttl": "day + INTERVAL 30 DAY"}))
    assert "TTL day + INTERVAL 30 DAY" in sql


@pytest.mark.parametrize("moment,unit,amount,expected", [
    ("2024-03-31 10:00:00", "MONTH", 1, "2024-02-29 10:00:00"),  # clamped to the month's last day
    ("2024-02-29 00:00:00", "YEAR", 1, "2023-02-28 00:00:00"),
    ("2024-05-31 00:00:00", "QUARTER", 1, "2024-02-29 00:00:00"),
    ("2024-01-15 00:00:00", "MONTH", 13, "2022-12-15 00:00:00"),
    ("2024-01-01 00:00:30", "SECOND", 31, "2023-12-31 23:59:59"),
    ("2024-01-08 06:00:00", "WEEK", 1, "2024-01-01 06:00:00"),
])
def test_an_expiry_goes_back_as_both_databases_count(moment, unit, amount, expected):
    at = dt.datetime.fromisoformat(moment)
    assert Expiry("day", amount, unit).before(at) == dt.datetime.fromisoformat(expected)


def test_the_window_is_one_literal_on_both_sides_beyond_the_margin():
    now = dt.datetime(2026, 11, 28, 12, 0, 0)
    window = Window.of("day + INTERVAL 30 DAY, stamp + INTERVAL 1 HOUR, at + INTERVAL 1 MONTH", _schema().mappings(),
                       "t", now)
    since_day = (now + MARGIN - dt.timedelta(days=30)).date().isoformat()
    since_stamp = (now + MARGIN - dt.timedelta(hours=1)).isoformat(" ")
    since_at = "2026-11-02 12:00:00"  # now + 1 day + 3 days (a month's clamping) - 1 MONTH
    assert now + MARGIN + CLAMPING == dt.datetime(2026, 12, 2, 12)
    assert window.bounds == (("day", "date", since_day), ("stamp", "timestamp", since_stamp),
                             ("at", "datetime", since_at))
    sql, params = window.mysql_sql(_schema().mappings())
    # over the value the copy holds: zero and invalid dates are NULL there, and out on both sides
    assert sql == ("TIMESTAMPADD(DAY, 0, `day`) > %s AND TIMESTAMPADD(SECOND, 0, `stamp`) > %s AND "
                   "TIMESTAMPADD(SECOND, 0, `at`) > %s")
    assert params == (since_day, since_stamp, since_at)
    assert window.ch_sql() == (f"`day` > toDate32('{since_day}') AND "
                               f"`stamp` > toDateTime64('{since_stamp}', 0, 'UTC') AND "
                               f"`at` > toDateTime64('{since_at}', 0, 'UTC')")
    # a TTL within its margin compares only rows dated ahead, and says so
    assert "in the future" in Window.of("stamp + INTERVAL 1 HOUR", _schema().mappings(), "t").describe()
    assert "in the future" not in Window.of("day + INTERVAL 30 DAY", _schema().mappings(), "t").describe()
    assert not Window.of("", _schema().mappings(), "t") and not Window.of("day + INTERVAL 1 DAY TO DISK 'x'",
                                                                          _schema().mappings(), "t")


# --- on the real services ----------------------------------------------------------------------

def _source(mysql_conn, table: str, rows: int = 2000) -> None:
    """Rows of the last 200 days (and 20 ahead): a 60-day TTL expires about two thirds of them."""
    with mysql_conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE IF NOT EXISTS {DB}")
        cur.execute(f"DROP TABLE IF EXISTS {DB}.{table}")
        cur.execute(f"CREATE TABLE {DB}.{table} (id INT PRIMARY KEY, status VARCHAR(10) NOT NULL, day DATE NOT NULL, "
                    "amount DECIMAL(10, 2))")
        cur.execute(f"INSERT INTO {DB}.{table} SELECT seq, ELT(1 + seq % 3, 'new', 'paid', 'sent'), "
                    f"CURDATE() + INTERVAL 20 DAY - INTERVAL (seq % 220) DAY, seq / 8 FROM {DB}.seq_1_to_{rows}")


def _counts(mysql_conn, ch, table: str) -> tuple[int, int, int]:
    with mysql_conn.cursor() as cur:
        cur.execute(f"SELECT count(*), SUM(day <= CURDATE() - INTERVAL 60 DAY) FROM {DB}.{table}")
        source, expired = (int(v) for v in cur.fetchone())
    return source, expired, int(ch.command(f"SELECT count() FROM `{TARGET}`.`{table}` FINAL"))


@pytest.mark.slow
def test_the_checks_of_a_ttl_copy_pass_while_its_expired_rows_are_gone_and_find_a_drift(
        mysql_conn, ch, endpoints, spark):
    from airflow_sync_provider.spark.diff import run_snapshot_diff

    table = "ttl"
    _source(mysql_conn, table)
    key = _load(endpoints, spark, table, {"ttl": "day + INTERVAL 60 DAY", "order_by": ["status"]})
    ch.command(f"OPTIMIZE TABLE `{TARGET}`.`{table}` FINAL")  # a merge: ClickHouse deletes the expired rows
    source, expired, copy = _counts(mysql_conn, ch, table)
    assert expired > source // 2 and copy == source - expired
    checked = _reconcile(endpoints, spark, key)
    assert checked["verdict"] == "ok", [s for s in checked["shards"] if s["problems"]]
    assert checked["ttl_window"].startswith("day > ")
    compared = sum(s["source_rows"] for s in checked["shards"])
    assert 0 < compared < copy  # the rows nearer their expiry than the margin are not compared

    def diff(**kwargs):
        return run_snapshot_diff(SnapshotDiffSpec(target=endpoints[1], old_table=f"{TARGET}.{table}",
                                                  sources=one_server(endpoints[0]), source_database=DB,
                                                  source_table=table, **kwargs), spark)

    counts = diff()["counts"]
    assert (counts["new"], counts["deleted"], counts["changed"]) == (0, 0, 0), counts
    # CDC: changes in and out of the window; the rolling verification looks at every slice
    with mysql_conn.cursor() as cur:
        cur.execute(f"UPDATE {DB}.{table} SET amount = amount + 1 WHERE id % 3 = 0")
        cur.execute(f"UPDATE {DB}.{table} SET day = day + INTERVAL 100 DAY WHERE id % 29 = 0")  # back in the window
        cur.execute(f"DELETE FROM {DB}.{table} WHERE id % 31 = 0")
    applied = _apply(endpoints, spark, table, start_from_loads=[key], verify=True)
    assert applied["repaired_shards"] == 0, applied
    looked = [v for v in applied["verified"] if v["table"] == f"{DB}.{table}"]
    assert looked and all(v["mismatched"] == [] for v in looked), applied["verified"]
    assert _reconcile(endpoints, spark, key)["verdict"] == "ok"
    # a drift among the compared rows is still found, and repaired; one among the expired is not compared
    with mysql_conn.cursor() as cur:
        cur.execute("SET sql_log_bin = 0")
        cur.execute(f"UPDATE {DB}.{table} SET amount = amount + 5 WHERE id % 37 = 0 "
                    "AND day > CURDATE() - INTERVAL 40 DAY")
        drifted = cur.rowcount
        cur.execute(f"UPDATE {DB}.{table} SET amount = amount + 5 WHERE day < CURDATE() - INTERVAL 70 DAY")
        cur.execute("SET sql_log_bin = 1")
    assert drifted > 0
    assert diff()["counts"]["changed"] == drifted
    assert _reconcile(endpoints, spark, key)["verdict"] == "mismatch"
    assert _reconcile(endpoints, spark, key, reimport=True)["verdict"] == "ok"

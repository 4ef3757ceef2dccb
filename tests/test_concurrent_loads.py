"""Overlapping loads into one target table (backfill runs, retries): each writes only its own
working tables, so none drops or fills another's (real MariaDB and ClickHouse endpoint).

The bug this guards: two period loads of one table shared ``<table>__stage``; one dropped it
while the other was filling it (``Table demo.orders_daily__stage does not exist``).
"""

from __future__ import annotations

import threading

import pytest

from airflow_sync_provider.core.clickhouse.ddl import file_bytes, parts_table_name, private_name
from airflow_sync_provider.core.clickhouse.publishing import publish_partitions
from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
from airflow_sync_provider.core.failures import ServerUnreachable
from airflow_sync_provider.core.jobspec import FullLoadSpec
from airflow_sync_provider.core.source.group import one_server
from airflow_sync_provider.spark import full_load

pytestmark = pytest.mark.slow
DB = "overlap"
DAYS = ("2025-05-01", "2025-05-02", "2025-05-03", "2025-05-04")


def test_private_names_are_per_owner_short_and_start_with_the_table():
    a, b = private_name("orders", "stage", "parts_1"), private_name("orders", "stage", "parts_2")
    assert a != b and a.startswith("orders__stage_") and a == private_name("orders", "stage", "parts_1")
    long = private_name("ü" * 200, "shadow", "parts_1")
    assert long.startswith("ü" * 10 + "__shadow_") and file_bytes(long) <= 100


def _make_source(conn) -> None:
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE IF NOT EXISTS {DB}")
        cur.execute(f"DROP TABLE IF EXISTS {DB}.orders")
        cur.execute(f"CREATE TABLE {DB}.orders (id BIGINT PRIMARY KEY, created_at DATETIME(3) NOT NULL,"
                    f" amount DECIMAL(12, 2) NOT NULL, note VARCHAR(20) NULL, KEY ix_created (created_at))")
        # 6,000 rows over four days
        cur.execute(f"INSERT INTO {DB}.orders SELECT seq, TIMESTAMP('2025-05-01') + INTERVAL (seq * 57) SECOND,"
                    f" seq / 100, IF(seq % 5 = 0, NULL, CONCAT('n', seq)) FROM {DB}.seq_1_to_6000")


def _spec(mysql_url, clickhouse_url, day: str, **kwargs) -> FullLoadSpec:
    return FullLoadSpec(sources=one_server(MySQLEndpoint.from_url(mysql_url)),
                        target=ClickHouseEndpoint.from_url(clickhouse_url), source_database=DB, source_table="orders",
                        target_database=f"{DB}_ch", target_table="orders_daily", load_key=f"overlap.{day}",
                        split_column="created_at", where="`created_at` >= %s AND `created_at` < %s + INTERVAL 1 DAY",
                        where_params=[day, day], partition_by="toYYYYMMDD(created_at)",
                        replace_partitions=[day.replace("-", "")], channels=2, split_factor=2, **kwargs)


def _source_day(conn, day: str) -> set:
    with conn.cursor() as cur:
        cur.execute(f"SELECT id, created_at, amount, note FROM {DB}.orders WHERE created_at >= %s"
                    f" AND created_at < %s + INTERVAL 1 DAY", (day, day))
        return set(cur.fetchall())


def _target_day(ch, day: str) -> set:
    rows = ch.query(f"SELECT id, toTimeZone(created_at, 'UTC'), amount, note FROM {DB}_ch.orders_daily FINAL"
                    " WHERE _partition_id = {p:String}", parameters={"p": day.replace("-", "")}).result_rows
    return {(i, c.replace(tzinfo=None), a, n) for i, c, a, n in rows}


def _run_all(loads) -> dict:
    """Run ``{name: callable}`` at once; returns {name: result or the exception}."""
    results, barrier = {}, threading.Barrier(len(loads))

    def run(name, load):
        barrier.wait()
        try:
            results[name] = load()
        except Exception as exc:  # noqa: BLE001 - reported by the caller
            results[name] = exc

    threads = [threading.Thread(target=run, args=item) for item in loads.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    return results


def _leftovers(ch) -> list[str]:
    return [r[0] for r in ch.query("SELECT name FROM system.tables WHERE database = {d:String}"
                                   " AND name LIKE 'orders_daily\\_\\_%'", parameters={"d": f"{DB}_ch"}).result_rows]


class _FailingReplace:
    """A client that fails the first ``REPLACE PARTITION``: a load dying in the middle of publishing."""

    def __init__(self, ch):
        self._ch = ch

    def __getattr__(self, name):
        return getattr(self._ch, name)

    def command(self, sql, *args, **kwargs):
        if "REPLACE PARTITION" in sql:
            raise ConnectionError("target went away mid-publish (injected)")
        return self._ch.command(sql, *args, **kwargs)


def test_overlapping_period_loads_of_one_table_each_replace_exactly_their_day(mysql_url, clickhouse_url, mysql_conn,
                                                                             ch, spark, monkeypatch):
    _make_source(mysql_conn)
    ch.command(f"DROP DATABASE IF EXISTS {DB}_ch")
    for round_ in range(3):  # the source changes between rounds; every round reloads every day at once
        with mysql_conn.cursor() as cur:
            cur.execute(f"UPDATE {DB}.orders SET amount = amount + 1 WHERE MOD(id, 3) = %s", (round_,))
            cur.execute(f"DELETE FROM {DB}.orders WHERE MOD(id, 97) = %s", (round_,))
        results = _run_all({day: (lambda d=day: full_load.run_full_load(_spec(mysql_url, clickhouse_url, d), spark))
                            for day in DAYS})
        failed = {d: r for d, r in results.items() if isinstance(r, Exception)}
        assert not failed, f"round {round_}: {failed}"
        for day in DAYS:
            source = _source_day(mysql_conn, day)
            assert source and _target_day(ch, day) == source, f"round {round_}, day {day}"
        assert _leftovers(ch) == []

    # one day's load dies while publishing (its stage is left behind: the target stays away past the
    # job's bound), and is retried while the
    # other days load again: the retry drops its own leftover, nobody else's
    victim = DAYS[1]
    publish = publish_partitions

    def dying(ch_, loaded, *args, **kwargs):
        if loaded.parts == parts_table_name(f"overlap.{victim}", 4):
            ch_ = _FailingReplace(ch_)
        return publish(ch_, loaded, *args, **kwargs)

    monkeypatch.setattr(full_load, "publish_partitions", dying)
    with mysql_conn.cursor() as cur:
        cur.execute(f"UPDATE {DB}.orders SET note = 'changed' WHERE id % 4 = 0")
    # (a passing failure is retried inside the job's bound, here 1 s: core/failures.py)
    results = _run_all({day: (lambda d=day: full_load.run_full_load(_spec(mysql_url, clickhouse_url, d,
                                                                          failure_wait_seconds=1), spark))
                        for day in DAYS})
    died = results.pop(victim)
    assert isinstance(died, ServerUnreachable) and isinstance(died.__cause__, ConnectionError), died
    assert not [r for r in results.values() if isinstance(r, Exception)], results
    left = _leftovers(ch)
    assert len(left) == 1 and left[0].startswith("orders_daily__stage_"), left
    monkeypatch.setattr(full_load, "publish_partitions", publish)

    others = [d for d in DAYS if d != victim]
    results = _run_all({"retry": lambda: full_load.run_full_load(_spec(mysql_url, clickhouse_url, victim), spark)}
                       | {d: (lambda d=d: full_load.run_full_load(_spec(mysql_url, clickhouse_url, d), spark))
                          for d in others})
    assert not [r for r in results.values() if isinstance(r, Exception)], results
    assert results["retry"]["generation"] == 4 and results["retry"]["shards_read"] == 0  # resumed, not re-read
    for day in DAYS:
        assert _target_day(ch, day) == _source_day(mysql_conn, day), day
    assert _leftovers(ch) == []

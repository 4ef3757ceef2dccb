"""A source group's CDC (issue 42): three MariaDB servers (the third a primary with a GTID replica
behind a switchable address), two databases each, ``orders_0 … orders_3`` with overlapping ids
and one shard without a column, bootstrapped into one merged copy and followed by one pipeline
(a pipeline per source). After every step — writers on all three servers, a row moved between
shards, ``ADD COLUMN`` on one shard then the others, ``DROP COLUMN`` on two of three, a server
restarted, a fail-over to the replica, a fourth shard added — the merged copy (FINAL) equals the
union of the sources row for row (tests/helpers.assert_merged_rows); a column retyped on one
shard only stops that shard's pipeline naming both shards, at every retry."""

from __future__ import annotations

import json
import random
import threading

import pymysql
import pytest

from airflow_sync_provider.cli import main
from airflow_sync_provider.core.cdc.checkpoints import PIPELINE_STOPPED, Checkpoints
from airflow_sync_provider.core.endpoints import MySQLEndpoint
from airflow_sync_provider.core.jobspec import CdcApplySpec, CdcBootstrapSpec
from airflow_sync_provider.core.selection import TableSet
from airflow_sync_provider.core.source.group import Merge, Source
from airflow_sync_provider.spark.cdc_group import GroupFailed, run_group_apply, run_group_bootstrap
from devenv.mariadb import MariaDB, ReplicatedPair
from tests.helpers import assert_merged_rows, run_sql

pytestmark = pytest.mark.slow

SELECT = {"databases": ["shop_*"], "tables": ["orders_*"]}
MERGED = "analytics_cdc.orders"
PIPELINE = "shops"
ORDERS = """CREATE TABLE {name} (
  id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
  customer INT NOT NULL,
  amount DECIMAL(12, 2) NOT NULL,
  status VARCHAR(16) NOT NULL,
  {note}created DATETIME(6) NOT NULL
) CHARSET utf8mb4"""
LAYOUT = {"shop_x": ["orders_0", "orders_1"], "shop_y": ["orders_2", "orders_3"]}


class Estate:
    """s0, s1: MariaDB servers; s2: a primary with a replica behind one address (fail-over)."""

    def __init__(self, base):
        self.plain = {name: MariaDB(base / name, settings={"server_id": str(21 + i)})
                      for i, name in enumerate(("s0", "s1"))}
        self.pair = ReplicatedPair(base / "s2")
        self.layout = {name: {db: list(tables) for db, tables in LAYOUT.items()} for name in ("s0", "s1", "s2")}

    def start(self):
        for server in self.plain.values():
            server.start()
        self.pair.start()
        return self

    def stop(self):
        self.pair.stop()
        for server in self.plain.values():
            server.stop()

    def url(self, name: str) -> str:
        return self.pair.url if name == "s2" else self.plain[name].url

    def connect(self, name: str):
        return pymysql.connect(**MySQLEndpoint.from_url(self.url(name)).connect_args(), autocommit=True)

    def sources(self) -> list[Source]:
        return [Source(name, MySQLEndpoint.from_url(self.url(name))) for name in self.layout]

    def members(self) -> list[tuple[str, str, str]]:
        return [(s, d, t) for s, dbs in self.layout.items() for d, tables in dbs.items() for t in tables]

    def check(self, ch) -> int:
        conns = {name: self.connect(name) for name in self.layout}
        try:
            return assert_merged_rows(conns, ch, MERGED, self.members())
        finally:
            for conn in conns.values():
                conn.close()


@pytest.fixture(scope="module")
def estate(tmp_path_factory):
    estate = Estate(tmp_path_factory.mktemp("group-cdc")).start()
    rng = random.Random(42)
    for name in estate.layout:
        with estate.connect(name) as conn:
            for database, tables in LAYOUT.items():
                run_sql(conn, f"CREATE DATABASE {database}")
                for table in tables:
                    lacks = (name, table) == ("s2", "orders_3")
                    run_sql(conn, ORDERS.format(name=f"{database}.{table}",
                                                note="" if lacks else "note VARCHAR(64) NULL,\n  "))
                    _insert(conn, f"{database}.{table}", rng, rng.randint(100, 300), not lacks)
    yield estate
    estate.stop()


def _insert(conn, table: str, rng, rows: int, note: bool = True) -> None:
    columns = "customer, amount, status, created" + (", note" if note else "")
    values = "%s, %s, %s, %s" + (", %s" if note else "")
    with conn.cursor() as cur:
        cur.executemany(f"INSERT INTO {table} ({columns}) VALUES ({values})",
                        [(rng.randint(1, 99), f"{rng.randint(0, 9999)}.{rng.randint(0, 99):02d}",
                          rng.choice(("new", "paid")), f"2025-02-{rng.randint(1, 28):02d} 08:00:00.25",
                          *((rng.choice((None, "ünï 🚀")),) if note else ())) for _ in range(rows)])


def _columns(conn, table: str) -> set[str]:
    with conn.cursor() as cur:
        cur.execute(f"SHOW COLUMNS FROM {table}")
        return {row[0] for row in cur.fetchall()}


def _churn(estate, rng, rounds: int = 3) -> None:
    """Inserts, updates and deletes on every shard (the columns each one has now)."""
    for _ in range(rounds):
        for name, dbs in estate.layout.items():
            with estate.connect(name) as conn:
                for database, tables in dbs.items():
                    for table in tables:
                        qualified = f"{database}.{table}"
                        _insert(conn, qualified, rng, rng.randint(3, 20), "note" in _columns(conn, qualified))
                        run_sql(conn, f"UPDATE {qualified} SET status = 'sent', amount = amount + 1 "
                                      f"WHERE id % {rng.randint(5, 9)} = 0",
                                f"DELETE FROM {qualified} WHERE id % 31 = {rng.randint(0, 30)}")


def _apply(estate, endpoints, spark, on_shard_removed="keep"):
    # no verification: the stream and the DDL rules alone must keep the copy exact (a look would repair it)
    spec = CdcApplySpec(target=endpoints[1], pipeline=PIPELINE, sources=estate.sources(),
                        merge=Merge.of(MERGED, on_shard_removed=on_shard_removed), verify_period=0,
                        verify_after_ddl=False)
    return run_group_apply(spec, spark)


def test_a_group_pipeline_keeps_the_merged_copy_equal_to_its_shards_through_every_step(estate, endpoints, ch, spark,
                                                                                     clickhouse_url, monkeypatch,
                                                                                     capsys):
    rng = random.Random(7)
    boot = run_group_bootstrap(CdcBootstrapSpec(target=endpoints[1], pipeline=PIPELINE, sources=estate.sources(),
                                                merge=Merge.of(MERGED), tableset=TableSet(select=SELECT)), spark)
    assert len(boot["tables"]) == 12
    assert estate.check(ch) == boot["rows"]

    # writers on every server while the group applies, then a last bounded run
    stop = threading.Event()
    writer = threading.Thread(target=lambda: [_churn(estate, random.Random(i), 1) for i in range(100)
                                              if not stop.is_set()])
    writer.start()
    try:
        _apply(estate, endpoints, spark)
    finally:
        stop.set()
        writer.join()
    _apply(estate, endpoints, spark)
    estate.check(ch)

    # a row moved from one shard to another: a delete there, an insert here
    with estate.connect("s0") as a, estate.connect("s1") as b:
        with a.cursor() as cur:
            cur.execute("SELECT id, customer, amount, status, created, note FROM shop_x.orders_0 ORDER BY id LIMIT 1")
            moved, *row = cur.fetchone()
            cur.execute("DELETE FROM shop_x.orders_0 WHERE id = %s", (moved,))
        with b.cursor() as cur:
            cur.execute("INSERT INTO shop_x.orders_1 (id, customer, amount, status, created, note) "
                        "VALUES (100005, %s, %s, %s, %s, %s)", row)
    _apply(estate, endpoints, spark)
    estate.check(ch)

    # ADD COLUMN on one shard (existing rows take its default), then on the others
    with estate.connect("s0") as conn:
        run_sql(conn, "ALTER TABLE shop_x.orders_0 ADD COLUMN region VARCHAR(8) NOT NULL DEFAULT 'eu'")
    _churn(estate, rng, 1)
    _apply(estate, endpoints, spark)
    estate.check(ch)
    for name, dbs in estate.layout.items():
        with estate.connect(name) as conn:
            for database, tables in dbs.items():
                for table in tables:
                    if (name, table) != ("s0", "orders_0"):
                        run_sql(conn, f"ALTER TABLE {database}.{table} ADD COLUMN region VARCHAR(8) NULL")
    _churn(estate, rng, 1)
    _apply(estate, endpoints, spark)
    estate.check(ch)

    # DROP COLUMN note on two servers of three: the merged copy keeps it (s2's rows have it)
    for name in ("s0", "s1"):
        with estate.connect(name) as conn:
            for database, tables in LAYOUT.items():
                for table in tables:
                    run_sql(conn, f"ALTER TABLE {database}.{table} DROP COLUMN note")
    _churn(estate, rng, 1)
    _apply(estate, endpoints, spark)
    estate.check(ch)
    assert "note" in {n for (n,) in ch.query("SELECT name FROM system.columns WHERE database = 'analytics_cdc' "
                                             "AND table = 'orders'").result_rows}

    # a server restarted (its table ids renumbered), then the third fails over to its replica
    estate.plain["s1"].stop()
    estate.plain["s1"].start()
    _churn(estate, rng, 1)
    _apply(estate, endpoints, spark)
    estate.check(ch)
    estate.pair.wait_caught_up()
    estate.pair.fail_over()
    _churn(estate, rng, 1)
    _apply(estate, endpoints, spark)
    estate.check(ch)

    # a fourth shard: a new table matching the selection joins by bootstrap beside the stream
    with estate.connect("s1") as conn:
        run_sql(conn, ORDERS.format(name="shop_y.orders_9", note=""),
                "ALTER TABLE shop_y.orders_9 ADD COLUMN region VARCHAR(8) NULL")
        _insert(conn, "shop_y.orders_9", rng, 50, note=False)
    estate.layout["s1"]["shop_y"].append("orders_9")
    _churn(estate, rng, 1)
    _apply(estate, endpoints, spark)
    _apply(estate, endpoints, spark)
    estate.check(ch)

    # a table dropped on one shard, deleting its rows as asked; then a whole source leaves the group
    with estate.connect("s1") as conn:
        run_sql(conn, "DROP TABLE shop_y.orders_9")
    estate.layout["s1"]["shop_y"].remove("orders_9")
    _apply(estate, endpoints, spark, on_shard_removed="delete")
    estate.check(ch)
    del estate.layout["s2"]
    left = _apply(estate, endpoints, spark, on_shard_removed="delete")
    assert left["sources_removed"] == ["s2"]
    estate.check(ch)  # s2's rows are gone

    # a column retyped on one shard only: that shard's pipeline stops naming the shards that differ
    with estate.connect("s0") as conn:
        run_sql(conn, "ALTER TABLE shop_x.orders_1 MODIFY amount DECIMAL(14, 4) NOT NULL")
    for _ in range(2):  # and every retry stops there again
        with pytest.raises(GroupFailed) as failed:
            _apply(estate, endpoints, spark)
        text = str(failed.value)
        assert f"{PIPELINE}@s0" in text and "s0:shop_x.orders_1" in text and "s1:shop_x.orders_1" in text, text
        state = Checkpoints(ch).state(f"{PIPELINE}@s0")
        assert state.status == PIPELINE_STOPPED
    assert Checkpoints(ch).state(f"{PIPELINE}@s1").status != PIPELINE_STOPPED  # the other source's went on
    # `cdc status` shows the group as one copy with a row per source, lag against each source
    for name in ("s0", "s1"):
        monkeypatch.setenv(f"MYSQL_URL_{name.upper()}", estate.url(name))
    capsys.readouterr()
    assert main(["cdc", "status", "--pipeline", PIPELINE, "--clickhouse-url", clickhouse_url, "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["group"] == {"sources": ["s0", "s1"], "merge_into": MERGED}
    assert status["sources"]["s0"]["status"] == PIPELINE_STOPPED and "s1:shop_x.orders_1" in status["sources"]["s0"][
        "error"]
    assert status["sources"]["s1"]["caught_up"] is True and status["sources"]["s1"]["lag_seconds"] == 0.0
    assert main(["cdc", "status", "--pipeline", PIPELINE, "--clickhouse-url", clickhouse_url]) == 0
    text = capsys.readouterr().out
    assert "source group 'shops': 2 source(s) merged into analytics_cdc.orders; s0: stopped" in text, text
    assert "[s0]" in text and "[s1]" in text

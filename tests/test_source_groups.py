"""Source groups (issue 42): three MariaDB servers, two databases each, ``orders_0 … orders_3`` with
overlapping auto-increment ids and one shard missing a column, merged into one ClickHouse table;
loaded, reconciled with checksums, re-imported shard by shard, and refused when two shards
cannot be merged. Every check compares the merged copy (FINAL) with the union of the sources row
for row (tests/helpers.assert_merged_rows), each row with its source columns."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pymysql
import pytest

from airflow_sync_provider.core.clickhouse.described import sorting_key
from airflow_sync_provider.core.endpoints import MySQLEndpoint
from airflow_sync_provider.core.jobspec import FullLoadSpec, ReconcileSpec, SnapshotDiffSpec
from airflow_sync_provider.core.ledger import check_counters
from airflow_sync_provider.core.selection import TableSet
from airflow_sync_provider.core.source.group import IncompatibleShards, Merge, Source
from airflow_sync_provider.spark.diff import run_group_diff, run_snapshot_diff
from airflow_sync_provider.spark.full_load import run_full_load
from airflow_sync_provider.spark.group_load import run_group_load
from airflow_sync_provider.spark.groups import each_group
from airflow_sync_provider.spark.reconcile import run_group_reconcile, run_reconcile
from devenv.mariadb import group_servers
from tests.helpers import assert_merged_rows, assert_same_rows, run_sql

pytestmark = pytest.mark.slow

SOURCES = ("s0", "s1", "s2")
LAYOUT = {"shop_x": ("orders_0", "orders_1"), "shop_y": ("orders_2", "orders_3")}
SELECT = {"databases": ["shop_*"], "tables": ["orders_*"]}
MERGED = "analytics_g.orders"
ORDERS = """CREATE TABLE {name} (
  id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
  customer INT NOT NULL,
  amount DECIMAL(12, 2) NOT NULL,
  status VARCHAR(16) NOT NULL,
  {note}created DATETIME(6) NOT NULL
) CHARSET utf8mb4"""


def members() -> list[tuple[str, str, str]]:
    return [(s, d, t) for s in SOURCES for d, tables in LAYOUT.items() for t in tables]


@pytest.fixture(scope="module")
def trio(tmp_path_factory):
    """Three MariaDB servers (each its own binlog and server_id), named s0 … s2."""
    with group_servers(tmp_path_factory.mktemp("group"), SOURCES) as urls:
        yield urls


def _fill(urls: dict, rng: random.Random) -> None:
    """Every shard's tables from id 1 (ids overlap across shards); s2's shop_y.orders_3 has no
    ``note`` column."""
    for source, url in urls.items():
        with pymysql.connect(**MySQLEndpoint.from_url(url).connect_args(), autocommit=True) as conn:
            for database, tables in LAYOUT.items():
                run_sql(conn, f"DROP DATABASE IF EXISTS {database}", f"CREATE DATABASE {database}")
                for table in tables:
                    lacks = (source, database, table) == ("s2", "shop_y", "orders_3")
                    run_sql(conn, ORDERS.format(name=f"{database}.{table}",
                                                note="" if lacks else "note VARCHAR(64) NULL,\n  "))
                    rows = rng.randint(150, 600)
                    with conn.cursor() as cur:
                        columns = "customer, amount, status, created" + ("" if lacks else ", note")
                        values = "%s, %s, %s, %s" + ("" if lacks else ", %s")
                        cur.executemany(
                            f"INSERT INTO {database}.{table} ({columns}) VALUES ({values})",
                            [(rng.randint(1, 99), f"{rng.randint(0, 99999)}.{rng.randint(0, 99):02d}",
                              rng.choice(("new", "paid", "sent")), f"2025-01-{rng.randint(1, 28):02d} 10:00:00.5",
                              *(() if lacks else (rng.choice((None, f"from {source}", "ünïcødé 🚀")),)))
                             for _ in range(rows)])


def _spec(urls: dict, endpoints, **kwargs) -> FullLoadSpec:
    return FullLoadSpec(target=endpoints[1], source_database="", source_table="", target_database="", target_table="",
                        sources=[Source(n, MySQLEndpoint.from_url(u))
                                                                     for n, u in urls.items()], merge=Merge.of(MERGED),
                        tableset=TableSet(select=SELECT), channels=3, **kwargs)


def _conns(urls: dict) -> dict:
    return {name: pymysql.connect(**MySQLEndpoint.from_url(url).connect_args(), autocommit=True)
            for name, url in urls.items()}


def _assert_merged(trio: dict, ch, merged: str) -> int:
    """The merged copy FINAL equals the union of every member's rows (tests/helpers), row for row."""
    conns = _conns(trio)
    try:
        return assert_merged_rows(conns, ch, merged, members())
    finally:
        for conn in conns.values():
            conn.close()


load_group = each_group(run_full_load, run_group_load)
reconcile_group = each_group(run_reconcile, run_group_reconcile)


def test_merged_load_reconciles_exactly_and_keys_by_source(trio, endpoints, ch, spark):
    _fill(trio, random.Random(42))
    spec = _spec(trio, endpoints, load_key="group-load-1")
    result = load_group(spec, spark)
    assert sorted(t["table"] for t in result["tables"]) == sorted(f"{d}.{t}" for _, d, t in members())
    conns = _conns(trio)
    try:
        rows = assert_merged_rows(conns, ch, MERGED, members())
        assert rows == result["rows"] and rows > len(members()) * 150
        # ids overlap from shard to shard: only the source columns keep them apart
        assert ch.command(f"SELECT count() FROM {MERGED} FINAL WHERE id = 1") == len(members())
        assert sorting_key(ch, *MERGED.split(".")) == ["id", "_source", "_source_database", "_source_table"]
        # the shard without `note` reads NULL there
        assert ch.command(f"SELECT countIf(isNotNull(note)) FROM {MERGED} FINAL WHERE _source = 's2' AND "
                          "_source_table = 'orders_3'") == 0
    finally:
        for conn in conns.values():
            conn.close()
    verdict, message, summary = check_counters(endpoints[1], "group-load-1")
    assert verdict == "success", message
    assert summary["tables"] == len(members())
    check = ReconcileSpec(target=endpoints[1], load_key="group-load-1", checksum=True,
                          sources=spec.sources, merge=Merge.of(MERGED))
    reconciled = reconcile_group(check, spark)
    assert reconciled["verdict"] == "ok", reconciled
    assert len(reconciled["tables"]) == len(members())


def test_a_wrong_shard_of_one_source_table_is_found_and_reimported_alone(trio, endpoints, ch, spark):
    _fill(trio, random.Random(7))
    spec = _spec(trio, endpoints, load_key="group-load-2")
    load_group(spec, spark)
    # the copy loses rows of one member, and another member's row goes stale
    ch.command(f"DELETE FROM {MERGED} WHERE _source = 's1' AND _source_table = 'orders_2' AND id % 7 = 0")
    ch.command(f"ALTER TABLE {MERGED} UPDATE status = 'stale' WHERE _source = 's0' AND _source_table = 'orders_1' "
               "AND id = 3 SETTINGS mutations_sync = 1")
    check = ReconcileSpec(target=endpoints[1], load_key="group-load-2", checksum=True, reimport=True,
                          sources=spec.sources, merge=Merge.of(MERGED))
    result = reconcile_group(check, spark)
    before = {t["member"]: t["verdict"] for t in result["before"]["tables"]}
    assert {m for m, v in before.items() if v != "ok"} == {"s1:shop_y.orders_2", "s0:shop_x.orders_1"}
    assert result["verdict"] == "ok", result
    _assert_merged(trio, ch, MERGED)


def test_shards_that_cannot_be_merged_are_refused_naming_both(trio, endpoints, spark):
    _fill(trio, random.Random(3))
    with pymysql.connect(**MySQLEndpoint.from_url(trio["s1"]).connect_args(), autocommit=True) as conn:
        run_sql(conn, "ALTER TABLE shop_x.orders_0 MODIFY amount DECIMAL(14, 4) NOT NULL")
    with pytest.raises(IncompatibleShards) as refused:
        load_group(_spec(trio, endpoints, load_key="group-load-3"), spark)
    text = str(refused.value)
    assert "'amount'" in text and "s1:shop_x.orders_0" in text and "s0:shop_x.orders_0" in text


def test_without_merge_into_each_source_is_copied_side_by_side(trio, endpoints, ch, spark):
    _fill(trio, random.Random(11))
    spec = dataclasses.replace(_spec(trio, endpoints, load_key="group-load-4"), merge=None,
                               tableset=TableSet(select={**SELECT, "tables": ["orders_0"]}))
    result = load_group(spec, spark)
    assert sorted((t["source"], t["target"]) for t in result["tables"]) == [
        (s, f"{s}_shop_x.orders_0") for s in SOURCES]
    for source, url in trio.items():
        with pymysql.connect(**MySQLEndpoint.from_url(url).connect_args(), autocommit=True) as conn:
            assert_same_rows(conn, ch, "shop_x", "orders_0", f"{source}_shop_x")


def test_command_line_group_load_fails_on_one_shard_and_reimports_only_it(trio, endpoints, clickhouse_url, ch,
                                                                          tmp_path):
    """`airflow-sync load --source … --merge-into`: a bad value in one source table fails its
    shard alone; `status` names it; `reimport --failed` re-reads only that shard and publishes
    every member at once; `reconcile --checksum` then says ok. Source URLs only in the environment."""
    _fill(trio, random.Random(5))
    with pymysql.connect(**MySQLEndpoint.from_url(trio["s1"]).connect_args(), autocommit=True) as conn:
        run_sql(conn, "SET SESSION sql_mode = ''", "UPDATE shop_y.orders_2 SET created = '0000-00-00' WHERE id = 17")
    env = dict(os.environ, CLICKHOUSE_URL=clickhouse_url, **{f"MYSQL_URL_{n.upper()}": u for n, u in trio.items()})
    env.pop("MYSQL_URL", None)
    group = [arg for name in SOURCES for arg in ("--source", name)]
    merged = "analytics_g.orders_cli"
    load = cli(env, "load", *group, "--database", "shop_*", "--select-table", "orders_*", "--merge-into", merged,
               "--load-key", "group-cli", "--channels", "3")
    assert load.returncode == 1, load.stdout + load.stderr
    assert "s1:shop_y.orders_2" in load.stderr or "shop_y.orders_2" in load.stderr, load.stderr
    assert not ch.command(f"EXISTS TABLE {merged}")  # nothing published while one member failed
    status = cli(env, "status", "--load", "group-cli", "--json")
    summary = json.loads(status.stdout)
    assert summary["verdict"] == "failed" and summary["failed_loads"] == ["group-cli:s1:shop_y.orders_2"]
    with pymysql.connect(**MySQLEndpoint.from_url(trio["s1"]).connect_args(), autocommit=True) as conn:
        run_sql(conn, "UPDATE shop_y.orders_2 SET created = '2025-02-02' WHERE id = 17")
    again = cli(env, "reimport", "--load", "group-cli", "--failed", *group, "--json")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    result = json.loads(again.stdout)
    read = {t["member"]: t["shards_read"] for t in result["tables"]}
    assert read.pop("s1:shop_y.orders_2") == 1 and set(read.values()) == {0}
    _assert_merged(trio, ch, merged)
    check = cli(env, "reconcile", *group, "--merge-into", merged, "--load", "group-cli", "--checksum")
    assert check.returncode == 0, check.stdout + check.stderr
    assert "verdict of the 12 tables: ok" in check.stdout
    # `diff --source … --merge-into`: a change on one shard is a change of that member only
    with pymysql.connect(**MySQLEndpoint.from_url(trio["s0"]).connect_args(), autocommit=True) as conn:
        run_sql(conn, "UPDATE shop_x.orders_1 SET status = 'diffed' WHERE id = 3")
    select = ("--database", "shop_*", "--select-table", "orders_*")
    diff = cli(env, "diff", *group, "--merge-into", merged, *select, "--fail", "--json", "--report-dir", str(tmp_path))
    assert diff.returncode == 3, diff.stdout[-3000:] + diff.stderr[-3000:]
    flagged = {t["member"]: t["counts"]["changed"] for t in json.loads(diff.stdout)["tables"]
               if t["verdict"] != "identical"}
    assert flagged == {"s0:shop_x.orders_1": 1}, flagged
    applied = cli(env, "diff", *group, "--merge-into", merged, *select, "--apply", "--report-dir", str(tmp_path))
    assert applied.returncode == 0, applied.stdout[-3000:] + applied.stderr[-3000:]
    _assert_merged(trio, ch, merged)
    for url in trio.values():
        password = MySQLEndpoint.from_url(url).password
        assert password not in load.stdout + load.stderr + again.stdout + check.stdout + diff.stdout + applied.stdout


CLI = str(Path(sys.executable).parent / "airflow-sync")


def cli(env, *args):
    return subprocess.run([CLI, *args], env=env, capture_output=True, text=True, timeout=600)


def test_a_diff_of_the_merged_copy_with_its_sources_flags_and_applies_per_source(trio, endpoints, ch, spark,
                                                                                 tmp_path):
    """Each source table against the merged copy's rows of it, keyed by id and the source columns:
    a change on one shard is one changed row of that source only (the same id elsewhere stays
    identical); applied, the copy equals the sources again. Two merged snapshots diff by the copy's
    key (source columns in it)."""
    _fill(trio, random.Random(23))
    load_group(_spec(trio, endpoints, load_key="group-load-5"), spark)
    ch.command(f"DROP TABLE IF EXISTS {MERGED}_before")
    ch.command(f"CREATE TABLE {MERGED}_before AS {MERGED}")
    ch.command(f"INSERT INTO {MERGED}_before SELECT * FROM {MERGED}")
    with pymysql.connect(**MySQLEndpoint.from_url(trio["s2"]).connect_args(), autocommit=True) as conn:
        run_sql(conn, "UPDATE shop_x.orders_1 SET status = 'refunded' WHERE id = 5",
                "DELETE FROM shop_y.orders_3 WHERE id = 9",
                "INSERT INTO shop_y.orders_3 (customer, amount, status, created) VALUES (1, 2.50, 'new', NOW(6))")
    spec = SnapshotDiffSpec(target=endpoints[1], old_table="",
                            sources=[Source(n, MySQLEndpoint.from_url(u)) for n, u in trio.items()],
                            merge=Merge.of(MERGED), tableset=TableSet(select=SELECT), on_change="apply")
    result = diff_group(spec, spark)
    assert result["counts"]["changed"] == 1 and result["counts"]["deleted"] == 1 and result["counts"]["new"] == 1
    flagged = {t["member"]: t["counts"] for t in result["tables"] if t["verdict"] != "identical"}
    assert set(flagged) == {"s2:shop_x.orders_1", "s2:shop_y.orders_3"}, flagged
    # the operator's summary of it: a report per member, the members flagged named
    from airflow_sync_provider.operators.snapshot_diff import SnapshotDiffOperator
    xcom = SnapshotDiffOperator(task_id="d", sources=[], merge_into=MERGED, select=SELECT, on_change="apply",
                                report_dir=str(tmp_path)).summarize(result)
    assert {t["table"] for t in xcom["tables"] if t["verdict"] != "identical"} == set(flagged)
    assert all(Path(t["report"]).exists() for t in xcom["tables"]) and xcom["orphans"] == []
    _assert_merged(trio, ch, MERGED)
    both = SnapshotDiffSpec(target=endpoints[1], old_table=f"{MERGED}_before", new_table=MERGED,
                            diff_key="merged-vs-merged")
    compared = diff_group(both, spark)
    assert compared["keys"] == ["id", "_source", "_source_database", "_source_table"]
    assert (compared["counts"]["changed"], compared["counts"]["deleted"], compared["counts"]["new"]) == (1, 1, 1)


diff_group = each_group(run_snapshot_diff, run_group_diff)


def test_a_period_load_replaces_the_period_across_every_source(trio, endpoints, ch, spark):
    """A period of a group (where + partition_by + replace_partitions): every source's rows of the
    day, and only them, replace the day's partition of the merged copy, published at once; run
    again after the sources changed, the day follows them (idempotent per period)."""
    _fill(trio, random.Random(31))
    period = dict(merge=Merge("analytics_g.orders_days"), where="created >= %s AND created < %s",
                  where_params=["2025-01-05", "2025-01-06"], partition_by="toYYYYMMDD(created)",
                  replace_partitions=["20250105"])
    load_group(dataclasses.replace(_spec(trio, endpoints, load_key="group-day-1"), **period), spark)
    with pymysql.connect(**MySQLEndpoint.from_url(trio["s0"]).connect_args(), autocommit=True) as conn:
        run_sql(conn, "DELETE FROM shop_x.orders_0 WHERE created >= '2025-01-05' AND created < '2025-01-06' "
                      "LIMIT 3")
    load_group(dataclasses.replace(_spec(trio, endpoints, load_key="group-day-2"), **period), spark)
    expected = 0
    for url in trio.values():
        with pymysql.connect(**MySQLEndpoint.from_url(url).connect_args(), autocommit=True) as conn:
            with conn.cursor() as cur:
                for database, tables in LAYOUT.items():
                    for table in tables:
                        cur.execute(f"SELECT count(*) FROM {database}.{table} WHERE created >= '2025-01-05' "
                                    "AND created < '2025-01-06'")
                        expected += cur.fetchone()[0]
    assert expected > 0
    counts = dict(ch.query("SELECT toYYYYMMDD(created), count() FROM analytics_g.orders_days FINAL GROUP BY 1"
                           ).result_rows)
    assert counts == {20250105: expected}

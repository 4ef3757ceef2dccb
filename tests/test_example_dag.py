"""The example DAG end to end through `airflow dags test`: real MariaDB, ClickHouse endpoint, spark-submit."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pymysql
import pytest

from airflow_sync_provider.core.clickhouse.client import client
from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
from airflow_sync_provider.core.source.planning import auto_split_factor
from devenv.airflow_env import airflow_env
from tests.airflow_run import ArgvWatcher, airflow_cli, run_dag
from tests.helpers import assert_same_rows, recreate_tables

MYSQL_SECRET = "Pw-7f3c9d-s3cret"
CLICKHOUSE_SECRET = "Ch-91ab-s3cret"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def secret_urls(mysql_url, clickhouse_url):
    """A dedicated MySQL user and a ClickHouse password with distinctive secrets to look for."""
    root = MySQLEndpoint.from_url(mysql_url)
    conn = pymysql.connect(**root.connect_args(), autocommit=True)
    with conn, conn.cursor() as cur:
        cur.execute("CREATE USER IF NOT EXISTS 'sync_reader'@'127.0.0.1' IDENTIFIED BY %s", (MYSQL_SECRET,))
        cur.execute("GRANT SELECT, REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO 'sync_reader'@'127.0.0.1'")
    ch = ClickHouseEndpoint.from_url(clickhouse_url)
    return (f"mysql://sync_reader:{MYSQL_SECRET}@{root.host}:{root.port}/",
            f"http://default:{CLICKHOUSE_SECRET}@{ch.host}:{ch.port}/")


@pytest.fixture(scope="session")
def airflow_home(tmp_path_factory, secret_urls):
    home = tmp_path_factory.mktemp("airflow")
    env = airflow_env(home, *secret_urls)
    # the asset-scheduled consumer must be known and unpaused for a load to queue a run of it
    for command in (["db", "migrate"], ["dags", "reserialize"], ["dags", "unpause", "sync_demo_orders_consumer"]):
        done = airflow_cli(env, *command, timeout=300)  # the runner the DAG runs use: Airflow started once
        assert done.returncode == 0, done.stdout[-3000:]
    return home, env


def test_example_dag_copies_every_demo_table_row_for_row(airflow_home, demo_db, mysql_conn, ch):
    home, env = airflow_home
    watcher = ArgvWatcher([MYSQL_SECRET, CLICKHOUSE_SECRET])
    watcher.start()
    try:
        run = run_dag(env, "sync_demo_full_load")
    finally:
        watcher.stop.set()
        watcher.join()
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-5000:]
    for table, count in demo_db.items():
        assert assert_same_rows(mysql_conn, ch, "demo", table) == count
    # No secret on any command line (spark-submit, its JVM, Python workers) or in the task log.
    assert watcher.seen > 0, "the watcher never saw spark-submit running"
    assert watcher.leaks == []
    assert MYSQL_SECRET not in log and CLICKHOUSE_SECRET not in log
    task_logs = "".join(p.read_text(errors="replace") for p in Path(home).rglob("*.log"))
    assert MYSQL_SECRET not in task_logs and CLICKHOUSE_SECRET not in task_logs
    assert "driver in Python on local[2] (no spark-submit)" in log  # a local master needs no JVM
    # The XCom summary each task pushed.
    with sqlite3.connect(Path(home) / "airflow.db") as db:
        xcoms = {task: json.loads(value) for task, value in db.execute(
            "SELECT task_id, value FROM xcom WHERE dag_id = 'sync_demo_full_load' AND key = 'return_value'")}
    assert {t: x["rows"] for t, x in xcoms.items() if t.startswith("load_")} == \
        {f"load_{t}": n for t, n in demo_db.items()}
    for table, count in demo_db.items():  # the gates passed on verified counters
        assert xcoms[f"counters_{table}"]["verdict"] == "success"
        assert xcoms[f"counters_{table}"]["rows_written"] == count
    for table in demo_db:  # customers too: split on a utf8mb4_unicode_ci VARCHAR key
        assert xcoms[f"reconcile_{table}"]["verdict"] == "ok" and xcoms[f"reconcile_{table}"]["checksum"]
        assert "mismatched_before" not in xcoms[f"reconcile_{table}"]  # nothing had to be re-imported
    assert sorted(xcoms["report"].values()) == sorted(demo_db.values())
    # 2 channels, one range shard each on a table this small (planning.auto_split_factor), the NULL shard
    shards = 2 * auto_split_factor(demo_db["orders"], 2) + 1
    assert xcoms["load_orders"]["shards"] == shards and xcoms["load_orders"]["target"] == "demo.orders"
    assert xcoms["load_orders"]["shards_read"] == shards and xcoms["load_orders"]["generation"] == 1
    # the load's outlet asset: an event with the load's summary, and a run of the consumer queued
    with sqlite3.connect(Path(home) / "airflow.db") as db:
        extras = [json.loads(e) for (e,) in db.execute(
            "SELECT e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id "
            "WHERE a.uri = 'clickhouse://sync_clickhouse/demo/orders'")]
        queued = db.execute("SELECT target_dag_id FROM asset_dag_run_queue").fetchall()
    assert [e.get("rows") for e in extras] == [demo_db["orders"]], extras
    assert ("sync_demo_orders_consumer",) in queued
    consumer = run_dag(env, "sync_demo_orders_consumer")
    assert consumer.returncode == 0, (consumer.stdout + consumer.stderr)[-3000:]
    assert f"demo.orders on ClickHouse: {demo_db['orders']:,} rows" in consumer.stdout + consumer.stderr


def test_whole_database_dags_one_job_and_mapped_copy_every_selected_table(airflow_home, demo_db, mysql_conn, ch):
    """The two ways to sync a database by pattern: one job for all tables, and one mapped task
    instance per table; every selected copy equals its source row for row, the excluded table
    is left out, and the resolved list is in the XCom."""
    home, env = airflow_home
    for dag_id in ("sync_demo_database", "sync_demo_database_mapped"):
        run = run_dag(env, dag_id)
        assert run.returncode == 0, (run.stdout + run.stderr)[-5000:]
    for database in ("demo_all", "demo_mapped"):
        for table, count in demo_db.items():
            assert assert_same_rows(mysql_conn, ch, "demo", table, target_database=database) == count
        assert not ch.command(f"EXISTS TABLE {database}._demo_numbers")
    with sqlite3.connect(Path(home) / "airflow.db") as db:
        xcoms = [(dag, task, index, json.loads(value)) for dag, task, index, value in db.execute(
            "SELECT dag_id, task_id, map_index, value FROM xcom WHERE dag_id LIKE 'sync_demo_database%' "
            "AND key = 'return_value'")]
    one = {task: x for dag, task, _, x in xcoms if dag == "sync_demo_database"}
    assert sorted(one["load_database"]["selected"]) == sorted(f"demo.{t}" for t in demo_db)
    assert ({t["table"]: t["rows"] for t in one["load_database"]["tables"]}
            == {f"demo.{t}": n for t, n in demo_db.items()})
    assert one["reconcile_database"]["verdict"] == "ok" and len(one["reconcile_database"]["tables"]) == len(demo_db)
    mapped = [(task, index, x) for dag, task, index, x in xcoms if dag == "sync_demo_database_mapped"]
    loads = {x["table"]: x for task, index, x in mapped if task == "load"}
    assert {t: x["rows"] for t, x in loads.items()} == {f"demo.{t}": n for t, n in demo_db.items()}
    assert len({x["load_key"] for x in loads.values()}) == len(demo_db)  # one load key per mapped instance
    assert sorted(x["verdict"] for task, _, x in mapped if task == "reconcile") == ["ok"] * len(demo_db)


FAILING_DAG = '''
import datetime as dt
from airflow.sdk import DAG
from airflow_sync_provider.operators.full_load import FullLoadOperator
with DAG(dag_id="sync_failing_load", schedule=None, start_date=dt.datetime(2025, 1, 1), catchup=False):
    FullLoadOperator(task_id="load_missing", table="no_such_table", mysql_conn_id="sync_mysql",
                     clickhouse_conn_id="sync_clickhouse", target_database="demo")
'''


def test_failed_job_fails_the_task_with_the_jobs_own_error(airflow_home, demo_db, tmp_path):
    home, env = airflow_home
    (tmp_path / "failing.py").write_text(FAILING_DAG)
    run = run_dag(env, "sync_failing_load", dags_folder=tmp_path)
    log = run.stdout + run.stderr
    assert "full_load job failed: TableNotFound: MySQL table demo.no_such_table does not exist" in log, log[-4000:]
    assert run.returncode != 0
    assert MYSQL_SECRET not in log


def test_daily_period_dag_backfills_one_day_idempotently(airflow_home, demo_db, mysql_conn, ch):
    home, env = airflow_home

    def day_counts(table, day):
        with mysql_conn.cursor() as cur:
            cur.execute("SELECT COUNT(*) FROM demo.orders WHERE created_at >= %s AND created_at < %s + INTERVAL 1 DAY",
                        (day, day))
            source = cur.fetchone()[0]
        target = ch.command(f"SELECT count() FROM demo.{table} FINAL WHERE toDate(created_at) = '{day}'")
        return source, int(target)

    # A manual run at D covers the interval ending at D: these load 2025-01-03 and 2025-01-04,
    # and the third run is a backfill of a day already loaded.
    for date in ("2025-01-04", "2025-01-05", "2025-01-04"):
        run = run_dag(env, "sync_demo_daily_orders", None, date)
        assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    for day in ("2025-01-03", "2025-01-04"):
        source, target = day_counts("orders_daily", day)
        assert source == target > 0
    partitions = ch.query("SELECT DISTINCT _partition_id FROM demo.orders_daily ORDER BY 1").result_rows
    assert partitions == [("20250103",), ("20250104",)]
    raw, distinct = ch.query("SELECT count(), uniqExact(id) FROM demo.orders_daily").result_rows[0]
    assert raw == distinct  # the re-run replaced the day; nothing doubled


def test_cdc_example_dag_keeps_the_copy_current_across_runs(airflow_home, demo_db, mysql_conn, ch):
    """Run 1 bootstraps orders and order_items, catches up, waits for the bootstrap's end and
    reconciles with checksums; the source changes; run 2 skips the bootstrap and applies the
    changes (the sensor deferred on the checkpoint); both copies equal the source. The copy then
    damaged behind the pipeline's back: run 3's reconcile task re-imports the shards that differ."""
    home, env = airflow_home

    def run():
        result = run_dag(env, "sync_demo_cdc")
        assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
        with sqlite3.connect(Path(home) / "airflow.db") as db:
            return {task: json.loads(value) for task, value in db.execute(
                "SELECT task_id, value FROM xcom WHERE dag_id = 'sync_demo_cdc' AND key = 'return_value' "
                "AND run_id = (SELECT run_id FROM dag_run WHERE dag_id = 'sync_demo_cdc' "
                "ORDER BY id DESC LIMIT 1)")}

    first = run()
    assert [t["rows"] for t in first["bootstrap"]["tables"]] == [demo_db["orders"], demo_db["order_items"]]
    assert first["catch_up"]["start"] == first["bootstrap"]["start_position"]
    assert first["reconcile_orders"]["verdict"] == first["reconcile_order_items"]["verdict"] == "ok"
    assert first["report"]["checkpoint"] == first["catch_up"]["checkpoint"]
    with mysql_conn.cursor() as cur:  # changes, undone at the end (other tests count the demo tables)
        cur.execute("INSERT INTO demo.orders SELECT 1000000000 + seq, 'Cdc-1', seq, NULL, NOW(3), NULL, 'new', NULL,"
                    " 1, NULL FROM demo.seq_1_to_50")
        cur.execute("INSERT INTO demo.order_items SELECT 1000000000 + seq, 1, 'SKU-CDC', 1.5, 2 FROM demo.seq_1_to_50")
        cur.execute("UPDATE demo.orders SET note = CONCAT('moved ', id), discount = NULL WHERE id % 97 = 0")
        cur.execute("UPDATE demo.order_items SET qty = qty + 1 WHERE order_id % 89 = 0")
        cur.execute("DELETE FROM demo.orders WHERE id > 1000000040")  # their items go too (ON DELETE CASCADE)
        cur.execute("UPDATE demo.orders SET id = 2000000000 WHERE id = 1000000001")  # a key change: its item too
    second = run()
    assert all(t["skipped"] for t in second["bootstrap"]["tables"]) and second["catch_up"]["events"] >= 150
    assert second["caught_up"]["checkpoint"] == second["catch_up"]["checkpoint"]
    assert second["report"]["events"] == second["catch_up"]["events"]
    try:
        assert assert_same_rows(mysql_conn, ch, "demo", "orders", "demo_cdc") == demo_db["orders"] + 40
        # InnoDB deleted ten orders' items and renumbered one's without binlog events: the copy followed
        assert assert_same_rows(mysql_conn, ch, "demo", "order_items", "demo_cdc") == demo_db["order_items"] + 40
        assert second["catch_up"]["cascaded_rows"] == 10 + 2  # the renumbered item: a tombstone and its new key
        # the copy damaged behind the pipeline's back: the reconcile task re-imports what differs
        ch.command("DELETE FROM demo_cdc.orders WHERE id = 7")
        ch.command("INSERT INTO demo_cdc.orders (id, customer_id, amount, status, quantity, _version) "
                   "VALUES (1999999999, 'phantom', 1, 'new', 1, 1)")
        third = run()
        repaired = third["reconcile_orders"]
        assert repaired["verdict"] == "ok" and repaired["mismatched_before"], repaired
        assert repaired["reimported"]["repaired"] == repaired["mismatched_before"], repaired  # those shards alone
        assert third["reconcile_order_items"]["verdict"] == "ok"
        assert assert_same_rows(mysql_conn, ch, "demo", "orders", "demo_cdc") == demo_db["orders"] + 40
    finally:
        with mysql_conn.cursor() as cur:
            cur.execute("DELETE FROM demo.orders WHERE id > 1000000000")
            cur.execute("DELETE FROM demo.order_items WHERE order_id > 1000000000")


def test_snapshot_diff_dag_seeds_then_applies_each_days_changes(airflow_home, demo_db, mysql_conn, ch):
    """Run 1 creates the copy (every row new) and the verify task finds it identical; the source
    changes; run 2 flags exactly those changes, applies them, and the copy equals the source."""
    home, env = airflow_home

    def run():
        result = run_dag(env, "sync_demo_snapshot_diff")
        assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
        with sqlite3.connect(Path(home) / "airflow.db") as db:
            return {task: json.loads(value) for task, value in db.execute(
                "SELECT task_id, value FROM xcom WHERE dag_id = 'sync_demo_snapshot_diff' AND key = 'return_value' "
                "AND run_id = (SELECT run_id FROM dag_run WHERE dag_id = 'sync_demo_snapshot_diff' "
                "ORDER BY id DESC LIMIT 1)")}

    ch.command("DROP TABLE IF EXISTS demo_diff.orders")
    first = run()
    assert first["diff_and_apply"]["counts"]["new"] == demo_db["orders"]
    assert first["verify"]["verdict"] == "identical"
    assert Path(first["verify"]["report"]).read_text().count("identical") >= 1
    with mysql_conn.cursor() as cur:  # changes, undone at the end (other tests count the demo tables)
        cur.execute("INSERT INTO demo.orders SELECT 1100000000 + seq, 'Diff-1', seq, NULL, NOW(3), NULL, 'new', "
                    "NULL, 1, NULL FROM demo.seq_1_to_30")
        cur.execute("UPDATE demo.orders SET note = CONCAT('diffed ', id) WHERE id BETWEEN 11 AND 30")
        cur.execute("CREATE TABLE demo.orders_kept_for_diff AS SELECT * FROM demo.orders WHERE id BETWEEN 31 AND 35")
        cur.execute("DELETE FROM demo.orders WHERE id BETWEEN 31 AND 35")
    try:
        second = run()
        assert {k: v for k, v in second["diff_and_apply"]["counts"].items() if k != "identical"} == \
            {"changed": 20, "new": 30, "deleted": 5}
        assert second["verify"]["verdict"] == "identical"
        page = Path(second["diff_and_apply"]["report"]).read_text()
        assert "changed: 20" in page and "<td class='chg'><s>" in page  # changed cells marked old → new
        assert assert_same_rows(mysql_conn, ch, "demo", "orders", "demo_diff") == demo_db["orders"] + 25
    finally:
        with mysql_conn.cursor() as cur:
            cur.execute("DELETE FROM demo.orders WHERE id > 1100000000")
            cur.execute("INSERT INTO demo.orders SELECT * FROM demo.orders_kept_for_diff")
            cur.execute("DROP TABLE demo.orders_kept_for_diff")


def test_tls_example_dag_reads_a_tls_only_source_through_connection_extras(airflow_home, tls):
    """dags/example_tls_source.py under `airflow dags test`, its connections' extras as the MySQL
    and clickhousedb providers document them (tests/tls_source.py: the REQUIRE X509 account with
    its client certificate, VERIFY_IDENTITY, init_command; HTTPS with mutual TLS): full load,
    reconcile --checksum and a snapshot diff on one table, bootstrap and CDC apply on another,
    each copy equal to the source; then the source changes and the catch-up task alone applies it."""
    from tests.tls_source import PASSWORD

    home, env = airflow_home
    env = {**env, **tls.connection_env("tls_dag")}
    root = tls.root()
    for table in ("orders", "events"):
        recreate_tables(root, "tls_dag", f"CREATE TABLE tls_dag.{table} (id INT PRIMARY KEY, v VARCHAR(20) NULL, "
                                         "at DATETIME(6) NOT NULL)")
        with root.cursor() as cur:
            cur.execute(f"INSERT INTO tls_dag.{table} SELECT seq, IF(seq % 9 = 0, NULL, CONCAT('v😀', seq)), "
                        "TIMESTAMPADD(MICROSECOND, seq, '2025-02-01') FROM tls_dag.seq_1_to_3000")
    target = client(tls.target())
    try:
        run = run_dag(env, "sync_tls_source")
        log = run.stdout + run.stderr
        assert run.returncode == 0, log[-5000:]
        for table in ("orders", "events"):
            assert_same_rows(root, target, "tls_dag", table, "tls_dag_copy")
        with sqlite3.connect(Path(home) / "airflow.db") as db:
            xcoms = {task: json.loads(value) for task, value in db.execute(
                "SELECT task_id, value FROM xcom WHERE dag_id = 'sync_tls_source' AND key = 'return_value'")}
        assert xcoms["reconcile"]["verdict"] == "ok" and xcoms["reconcile"]["checksum"]
        assert xcoms["diff"]["verdict"] == "identical" and xcoms["bootstrap"]["tables"][0]["rows"] == 3000
        assert "reader: mysqlclient: the source asks for TLS (ssl_mode=VERIFY_IDENTITY)" in log
        with root.cursor() as cur:
            cur.execute("UPDATE tls_dag.events SET v = 'changed' WHERE id % 50 = 0")
            cur.execute("DELETE FROM tls_dag.events WHERE id % 77 = 0")
        again = airflow_cli(env, "tasks", "test", "sync_tls_source", "catch_up", timeout=600)
        log += again.stdout + again.stderr
        assert again.returncode == 0, (again.stdout + again.stderr)[-5000:]
        assert assert_same_rows(root, target, "tls_dag", "events", "tls_dag_copy") == 3000 - 3000 // 77
        assert PASSWORD not in log and "PRIVATE KEY" not in log
    finally:
        target.close()
        root.close()


def test_content_example_dag_hashes_masks_filters_and_keeps_deletes(airflow_home, demo_db, mysql_conn, ch):
    """dags/example_content.py under `airflow dags test`, its salt in an Airflow connection: the
    customers' emails hashed and names masked, the orders without test orders; reconciled with
    checksums (the source side shaped alike); CDC follows. The salt is on no command line and in
    no log."""
    import hashlib

    home, env = airflow_home
    salt = "Salt-5e9a-s3cret"
    env = {**env, "AIRFLOW_CONN_SYNC_HASH_SALT": json.dumps({"conn_type": "generic", "password": salt})}
    with mysql_conn.cursor() as cur:  # a few test orders for the filter to leave out (put back after)
        cur.execute("SELECT id, status FROM demo.orders WHERE id % 50 = 0")
        statuses = cur.fetchall()
        cur.execute("UPDATE demo.orders SET status = 'test' WHERE id % 50 = 0")
        moved = cur.rowcount
    watcher = ArgvWatcher([salt, MYSQL_SECRET, CLICKHOUSE_SECRET])
    watcher.start()
    try:
        run = run_dag(env, "sync_demo_content")
    finally:
        watcher.stop.set()
        watcher.join()
        with mysql_conn.cursor() as cur:
            cur.executemany("UPDATE demo.orders SET status = %s WHERE id = %s", [(s, i) for i, s in statuses])
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-5000:]
    assert watcher.seen > 0 and watcher.leaks == []
    task_logs = "".join(p.read_text(errors="replace") for p in Path(home).rglob("*.log"))
    assert salt not in log and salt not in task_logs
    with mysql_conn.cursor() as cur:
        cur.execute("SELECT id, email, name FROM demo.customers")
        source = {i: (e, n) for i, e, n in cur.fetchall()}
    copy = {i: (e, n) for i, e, n in ch.query("SELECT id, email, name FROM demo_shaped.customers FINAL").result_rows}
    assert copy.keys() == source.keys()
    for key, (email, name) in source.items():
        assert copy[key] == (None if email is None else hashlib.sha256((salt + email).encode()).hexdigest(),
                             name[:1] + "*" * (len(name) - 1) if len(name) > 1 else "*" * len(name))
    orders = int(ch.command("SELECT count() FROM demo_shaped.orders FINAL WHERE _deleted_at_source = 0"))
    assert moved > 0 and orders == demo_db["orders"] - moved
    with sqlite3.connect(Path(home) / "airflow.db") as db:
        xcoms = {task: json.loads(value) for task, value in db.execute(
            "SELECT task_id, value FROM xcom WHERE dag_id = 'sync_demo_content' AND key = 'return_value'")}
    assert xcoms["reconcile"]["verdict"] == "ok", xcoms["reconcile"]
    assert salt not in json.dumps(xcoms)

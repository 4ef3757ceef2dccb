"""The jobs on a real Spark standalone cluster (devenv/spark_cluster.py): a master and two
workers, worker b in its own network namespace, so the driver, the executors and the databases
talk across a real interface. Client deploy mode through spark-submit, as the operators submit."""

from __future__ import annotations

import os
import subprocess
import time

import pymysql
import pytest

from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
from airflow_sync_provider.core.jobspec import (
    CdcApplySpec,
    CdcBootstrapSpec,
    FullLoadSpec,
    ReconcileSpec,
    SnapshotDiffSpec,
)
from airflow_sync_provider.core.ledger import Ledger
from airflow_sync_provider.core.selection import TableSet
from airflow_sync_provider.core.source.group import Merge, one_server
from airflow_sync_provider.core.specfile import reimport_spec
from airflow_sync_provider.core.submission import prepare, read_result, spark_submit
from devenv.spark_cluster import NamespaceUnavailable, SparkCluster
from tests.helpers import assert_same_rows, recreate_tables

pytestmark = pytest.mark.slow
DB, TARGET, ROWS = "clu", "clu_ch", 1_000_000
MID = 200_000  # the kill and Airflow tests: what they check does not need the 1M rows


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    try:
        with SparkCluster(tmp_path_factory.mktemp("spark-cluster")) as running:
            yield running
    except NamespaceUnavailable as exc:
        pytest.skip(f"no network namespace for the second worker: {exc}")


@pytest.fixture(scope="module")
def endpoints(cluster, mysql_url, clickhouse_url):
    """The databases as the executors see them: through the host's end of the veth pair."""
    mysql, ch = MySQLEndpoint.from_url(mysql_url), ClickHouseEndpoint.from_url(clickhouse_url)
    return (MySQLEndpoint(cluster.host_ip, cluster.expose(mysql.port), mysql.user, mysql.password),
            ClickHouseEndpoint(cluster.host_ip, cluster.expose(ch.port), ch.user, ch.password))


@pytest.fixture(scope="module")
def big_table(mysql_url):
    conn = pymysql.connect(**MySQLEndpoint.from_url(mysql_url).connect_args(), autocommit=True)
    recreate_tables(conn, DB, f"CREATE TABLE {DB}.orders (id BIGINT PRIMARY KEY, customer VARCHAR(40) NOT NULL, "
                              "amount DECIMAL(12,2) NULL, created DATETIME(3) NOT NULL, note TEXT NULL)")
    with conn.cursor() as cur:
        cur.execute(f"INSERT INTO {DB}.orders SELECT seq, CONCAT('customer-', seq % 5000), seq / 100, "
                    f"TIMESTAMPADD(SECOND, seq, '2024-01-01'), IF(seq % 7 = 0, NULL, REPEAT('n', seq % 50)) "
                    f"FROM {DB}.seq_1_to_{ROWS}")
        cur.execute(f"DROP TABLE IF EXISTS {DB}.mid")
        cur.execute(f"CREATE TABLE {DB}.mid LIKE {DB}.orders")
        cur.execute(f"INSERT INTO {DB}.mid SELECT * FROM {DB}.orders WHERE id <= {MID}")
    yield conn
    conn.close()


def submit(cluster, spec, timeout=900):
    result = spark_submit(spec, master=cluster.url, conf=cluster.driver_conf, timeout=timeout)
    assert result.get("status") == "success", result
    return result


def _load(endpoints, key, table="orders", **kwargs):
    return FullLoadSpec(sources=one_server(endpoints[0]), target=endpoints[1], source_database=DB, source_table=table,
                        target_database=TARGET, target_table=table, load_key=key, channels=4,
                        driver_copy_rows=0, **kwargs)  # on the executors, however small


def test_full_load_and_reconciliation_run_on_both_workers(cluster, endpoints, big_table, ch):
    assert len(cluster.workers()) == 2
    load = submit(cluster, _load(endpoints, "clu.orders"))
    assert load["rows"] == ROWS
    assert assert_same_rows(big_table, ch, DB, "orders", TARGET) == ROWS
    state = Ledger(ch).state("clu.orders")
    where = {s.executor.split("/")[1] for s in state.shards.values()}
    assert where == {cluster.host_ip, cluster.netns.ns_ip}, where  # both workers read shards
    checked = submit(cluster, ReconcileSpec(sources=one_server(endpoints[0]), target=endpoints[1],
                                            load_key="clu.orders", checksum=True))
    assert checked["verdict"] == "ok", checked["shards"]


def test_cdc_bootstrap_and_catch_up_run_on_the_cluster(cluster, endpoints, big_table, ch):
    """The CDC jobs too: a bootstrap whose chunks run on both workers, then catch-up of inserts,
    updates, deletes and a key change (the binlog read by the driver through the veth pair)."""
    recreate_tables(big_table, DB, f"CREATE TABLE {DB}.small (id INT PRIMARY KEY, v VARCHAR(20) NULL)")
    with big_table.cursor() as cur:
        cur.execute(f"INSERT INTO {DB}.small SELECT seq, CONCAT('v', seq) FROM {DB}.seq_1_to_40000")
    boot = submit(cluster, CdcBootstrapSpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline="clu",
                                            tableset=TableSet(tables=[f"{DB}.small"]), channels=2, chunk_rows=5000,
                                            driver_copy_rows=0))  # the chunks as tasks on the workers
    assert boot["tables"][0]["rows"] == 40_000
    with big_table.cursor() as cur:
        cur.execute(f"INSERT INTO {DB}.small VALUES (50001, 'new'), (50002, NULL)")
        cur.execute(f"UPDATE {DB}.small SET v = CONCAT(v, '!') WHERE id % 100 = 0")
        cur.execute(f"DELETE FROM {DB}.small WHERE id % 333 = 0")
        cur.execute(f"UPDATE {DB}.small SET id = 60000 WHERE id = 7")
    applied = submit(cluster, CdcApplySpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline="clu",
                                           lanes=2, driver_write_rows=0))  # the lanes as tasks on the workers
    assert applied["events"] >= 400 + 120 + 2
    assert assert_same_rows(big_table, ch, DB, "small") == 40_000 + 2 - 40_000 // 333
    state = Ledger(ch).state(boot["tables"][0]["load_key"])
    assert {s.executor.split("/")[1] for s in state.shards.values()} == {cluster.host_ip, cluster.netns.ns_ip}
    diff = submit(cluster, SnapshotDiffSpec(target=endpoints[1], old_table=f"{DB}.small",
                                            sources=one_server(endpoints[0]), source_database=DB, source_table="small",
                                            split_factor=2))
    assert diff["verdict"] == "identical" and diff["counts"]["identical"] == 40_000 + 2 - 40_000 // 333


def test_a_worker_killed_mid_load_ends_exact_and_no_shard_counts_twice(cluster, endpoints, big_table, ch, tmp_path):
    # slowed down (DataX flow control) so that the kill lands mid-shard
    spec = _load(endpoints, "clu.mid.kill", "mid", split_factor=3, channel_record_speed=6_000)
    cmd, env = prepare(spec, str(tmp_path), cluster.url, cluster.driver_conf)
    log = (tmp_path / "job.log").open("w")
    job = subprocess.Popen(cmd, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT)
    ledger = Ledger(ch)
    ledger.ensure()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:  # kill worker b once it has finished a shard and is reading another
        state = ledger.state(spec.load_key)
        shards = state.shards.values() if state else []
        mine = [s for s in shards if s.executor.endswith("/" + cluster.netns.ns_ip)]
        if any(s.status == "success" for s in mine) and any(s.status == "running" for s in mine):
            break
        assert job.poll() is None, "the job ended before worker b was killed"
        time.sleep(0.2)
    else:
        job.kill()
        pytest.fail("worker b never finished a shard")
    finished_by_b = {s.shard_id for s in mine if s.status == "success"}
    cluster.kill_worker("b")
    try:
        job.wait(600)
        result = read_result(spec.result_path)
        print(f"job after the kill: {result.get('status')}: {result.get('error', '')[:300]}")
        if result.get("status") != "success":  # it may fail naming the shards; a re-import finishes it
            assert "shard" in result.get("error", ""), result
            submit(cluster, reimport_spec(ledger.state(spec.load_key).spec, endpoints[0], endpoints[1]))
        assert assert_same_rows(big_table, ch, DB, "mid", TARGET) == MID
        raw = ch.command(f"SELECT count() FROM {TARGET}.mid")
        assert raw == MID  # nothing doubled, not even unmerged
        state = ledger.state(spec.load_key)
        assert state.status == "published"
        assert sum(s.records_written for s in state.shards.values()) == MID  # each shard counted once
        assert all(s.records_read == s.records_written and not s.records_failed for s in state.shards.values())
        # the shards worker b had finished were not read again when Spark re-ran its channel elsewhere
        assert all(state.shards[i].executor.endswith("/" + cluster.netns.ns_ip) for i in finished_by_b)
    finally:
        cluster.start_worker("b")  # for whatever runs next on the cluster
        cluster.wait_for_workers(2)


def test_a_load_over_tls_on_the_executors_uses_the_certificates_the_job_shipped(cluster, tls, tmp_path):
    """The source over TLS as the least-privileged REQUIRE SSL account (VERIFY_CA: the executors
    reach it at an address its certificate does not name) and the target over HTTPS with a client
    certificate (server_host_name=localhost), every shard read on the executors of both workers.
    The certificate files given are deleted before the job is submitted, and the executors run with
    a TMPDIR of their own: they connect with the contents the job carried, written there 0600."""
    import shutil
    import stat
    from urllib.parse import quote, urlencode

    from airflow_sync_provider.core.clickhouse.client import client
    from tests.tls_source import PASSWORD

    root = tls.root()
    recreate_tables(root, "tls_clu", "CREATE TABLE tls_clu.t (id BIGINT PRIMARY KEY, v VARCHAR(30) NULL, "
                                     "amount DECIMAL(12,2) NOT NULL)")
    with root.cursor() as cur:
        cur.execute("INSERT INTO tls_clu.t SELECT seq, IF(seq % 11 = 0, NULL, CONCAT('über ', seq)), seq / 7 "
                    "FROM tls_clu.seq_1_to_60000")
    given = tmp_path / "given"
    given.mkdir()
    for name in ("ca.pem", "client.pem", "client.key"):
        shutil.copy(tls.certs.path(name), given / name)
    mysql = (f"mysql://sync:{quote(PASSWORD, safe='')}@{cluster.host_ip}:{cluster.expose(tls.server.port)}/tls_clu?"
             + urlencode({"ssl_mode": "VERIFY_CA", "ssl_ca": given / "ca.pem"}))
    https = (f"https://default:@{cluster.host_ip}:{cluster.expose(tls.clickhouse.port)}/?"
             + urlencode({"ca_cert": given / "ca.pem", "client_cert": given / "client.pem",
                          "client_cert_key": given / "client.key", "server_host_name": "localhost"}))
    source, target = MySQLEndpoint.from_url(mysql), ClickHouseEndpoint.from_url(https)
    shutil.rmtree(given)  # from here the certificates exist only inside the endpoints
    executor_tmp = tmp_path / "executor-tmp"
    executor_tmp.mkdir()
    spec = FullLoadSpec(sources=one_server(source), target=target, source_database="tls_clu", source_table="t",
                        target_database="tls_clu_copy", target_table="t", load_key="clu.tls", channels=4,
                        driver_copy_rows=0)
    result = spark_submit(spec, master=cluster.url, conf={**cluster.driver_conf,
                                                          "spark.executorEnv.TMPDIR": str(executor_tmp)}, timeout=900)
    assert result.get("status") == "success", result
    ch = client(tls.target())
    try:
        assert assert_same_rows(root, ch, "tls_clu", "t", "tls_clu_copy") == 60_000
        state = Ledger(ch).state("clu.tls")
        assert {s.executor.split("/")[1] for s in state.shards.values()} == {cluster.host_ip, cluster.netns.ns_ip}
    finally:
        ch.close()
        root.close()
    private = executor_tmp / f"airflow-sync-{os.getuid()}"
    written = {p.read_text() for p in private.glob("tls-*.pem")}
    assert written == {source.ssl_ca, target.client_cert, target.client_cert_key}  # the CA is one file for both
    assert stat.S_IMODE(private.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in private.glob("tls-*.pem"))


CLUSTER_DAG = '''
import datetime as dt
from airflow.sdk import DAG
from airflow_sync_provider.operators.full_load import FullLoadOperator
with DAG(dag_id="sync_on_the_cluster", schedule=None, start_date=dt.datetime(2025, 1, 1), catchup=False):
    FullLoadOperator(task_id="load", table="mid", source_database="clu", target_database="clu_af",
                     mysql_conn_id="sync_mysql", clickhouse_conn_id="sync_clickhouse", channels=4, driver_copy_rows=0,
                     spark_conf={"spark.driver.host": "%(host)s", "spark.driver.bindAddress": "%(host)s"})
'''
MYSQL_SECRET, CLICKHOUSE_SECRET = "Clu-Pw-7a1e-s3cret", "Clu-Ch-55d0-s3cret"


def test_an_airflow_task_on_the_cluster_puts_no_secret_on_any_command_line(cluster, endpoints, big_table, ch,
                                                                          tmp_path):
    """FullLoadOperator through `airflow dags test` with the spark connection on the cluster:
    every process on this machine, in every namespace (spark-submit, the driver, the master,
    both workers, their executors and Python workers), is watched for the passwords."""
    from devenv.airflow_env import airflow_env, connection_env
    from tests.airflow_run import ArgvWatcher, airflow_cli, run_dag

    with big_table.cursor() as cur:
        cur.execute("CREATE USER IF NOT EXISTS 'clu_reader'@'127.0.0.1' IDENTIFIED BY %s", (MYSQL_SECRET,))
        cur.execute("GRANT SELECT, REPLICATION CLIENT ON *.* TO 'clu_reader'@'127.0.0.1'")
    mysql, clickhouse = endpoints
    env = airflow_env(tmp_path / "airflow", f"mysql://clu_reader:{MYSQL_SECRET}@{mysql.host}:{mysql.port}/",
                      f"http://default:{CLICKHOUSE_SECRET}@{clickhouse.host}:{clickhouse.port}/")
    env |= connection_env(f"mysql://clu_reader:{MYSQL_SECRET}@{mysql.host}:{mysql.port}/",
                          f"http://default:{CLICKHOUSE_SECRET}@{clickhouse.host}:{clickhouse.port}/", database=DB,
                          master=cluster.url)
    env.pop("SPARK_LOCAL_IP")
    env["AIRFLOW__CORE__DAGS_FOLDER"] = str(tmp_path / "dags")
    (tmp_path / "dags").mkdir()
    (tmp_path / "dags" / "cluster.py").write_text(CLUSTER_DAG % {"host": cluster.host_ip})
    migrated = airflow_cli(env, "db", "migrate", timeout=300)  # in the runner the DAG's run then uses
    assert migrated.returncode == 0, migrated.stdout[-3000:]
    watcher = ArgvWatcher([MYSQL_SECRET, CLICKHOUSE_SECRET])
    watcher.start()
    try:
        run = run_dag(env, "sync_on_the_cluster")
    finally:
        watcher.stop.set()
        watcher.join()
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-5000:]
    assert assert_same_rows(big_table, ch, DB, "mid", "clu_af") == MID
    assert watcher.seen > 0 and watcher.leaks == []
    assert MYSQL_SECRET not in log and CLICKHOUSE_SECRET not in log
    workers = [p for p in os.listdir("/proc") if p.isdigit() and _in_namespace(p, cluster)]
    assert workers, "nothing was running in worker b's namespace"


def _in_namespace(pid: str, cluster) -> bool:
    """Is process ``pid`` inside worker b's network namespace (where its executor ran)?"""
    try:
        mine = os.readlink(f"/proc/{pid}/ns/net")
        theirs = os.readlink(f"/proc/{cluster.procs['worker-b'].pid}/ns/net")
    except (OSError, KeyError):
        return False
    return mine == theirs


def test_a_source_groups_pipelines_run_as_tasks_on_the_executors(cluster, tmp_path_factory, ch, clickhouse_url):
    """placement="executors": each source's pipeline of a group is a long-running Spark task on a
    worker (its binlog reader and writers there, not in the driver), reaching its server and the
    target across the veth pair; the merged copy equals the shards row for row."""
    from airflow_sync_provider.core.source.group import Source
    from devenv.mariadb import group_servers
    from tests.helpers import assert_merged_rows

    target = ClickHouseEndpoint.from_url(clickhouse_url)
    target = ClickHouseEndpoint(cluster.host_ip, cluster.expose(target.port), target.user, target.password)
    with group_servers(tmp_path_factory.mktemp("cluster-group"), ["g0", "g1"]) as urls:
        seen = {name: MySQLEndpoint.from_url(url) for name, url in urls.items()}
        sources = [Source(name, MySQLEndpoint(cluster.host_ip, cluster.expose(e.port), e.user, e.password))
                   for name, e in seen.items()]
        conns = {name: pymysql.connect(**e.connect_args(), autocommit=True) for name, e in seen.items()}
        try:
            for i, conn in enumerate(conns.values()):
                with conn.cursor() as cur:
                    cur.execute("CREATE DATABASE shop")
                    cur.execute("CREATE TABLE shop.orders (id INT PRIMARY KEY, v VARCHAR(20) NOT NULL)")
                    cur.execute(f"INSERT INTO shop.orders SELECT seq, CONCAT('g{i}-', seq) FROM shop.seq_1_to_3000")
            select, merged = {"databases": ["shop"], "tables": ["orders"]}, "clu_group.orders"
            submit(cluster, CdcBootstrapSpec(target=target, pipeline="clu_group", sources=sources,
                                             tableset=TableSet(select=select), merge=Merge.of(merged)))
            for conn in conns.values():
                with conn.cursor() as cur:
                    cur.execute("UPDATE shop.orders SET v = CONCAT(v, '!') WHERE id % 10 = 0")
                    cur.execute("DELETE FROM shop.orders WHERE id % 97 = 0")
                    cur.execute("INSERT INTO shop.orders VALUES (5000, 'new')")
            applied = submit(cluster, CdcApplySpec(target=target, pipeline="clu_group", sources=sources,
                                                   merge=Merge.of(merged, placement="executors"), verify_period=0))
            ran = {part["executor"].split("/")[1] for part in applied["sources"].values()}
            assert ran <= {cluster.host_ip, cluster.netns.ns_ip} and all(
                part["events"] >= 300 for part in applied["sources"].values()), applied["sources"]
            assert assert_merged_rows(conns, ch, merged, [(n, "shop", "orders") for n in seen]) == 2 * (3001 - 30)
        finally:
            for conn in conns.values():
                conn.close()

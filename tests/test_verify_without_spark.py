"""A reconciliation and a snapshot diff run their comparisons inside the databases: for a small
table (or on a local master) they must not start a SparkContext. The job gets a session that
fails the test if anything asks it for Spark."""

from __future__ import annotations

import pytest

from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
from airflow_sync_provider.core.jobspec import FullLoadSpec, ReconcileSpec, SnapshotDiffSpec
from airflow_sync_provider.core.source.group import one_server
from airflow_sync_provider.spark.diff import run_snapshot_diff
from airflow_sync_provider.spark.full_load import run_full_load
from airflow_sync_provider.spark.reconcile import run_reconcile
from airflow_sync_provider.spark.session import LazySession
from tests.helpers import recreate_tables

DB, TARGET = "nospark", "nospark_ch"


class NoSpark(LazySession):
    """A cluster-looking session (not local) that refuses to be built."""

    def start(self) -> None:
        raise AssertionError("the job asked for a SparkContext")


@pytest.fixture
def endpoints(mysql_url, clickhouse_url):
    return MySQLEndpoint.from_url(mysql_url), ClickHouseEndpoint.from_url(clickhouse_url)


def test_small_table_reconcile_and_diff_start_no_spark(mysql_conn, ch, endpoints, monkeypatch):
    monkeypatch.delenv("MASTER", raising=False)  # not a local master: the table's size decides
    session = NoSpark("test")
    assert not session.local
    recreate_tables(mysql_conn, DB, f"CREATE TABLE {DB}.t (id INT PRIMARY KEY, v VARCHAR(10) NULL)")
    with mysql_conn.cursor() as cur:
        cur.execute(f"INSERT INTO {DB}.t SELECT seq, seq FROM {DB}.seq_1_to_20000")
    source, target = endpoints
    run_full_load(FullLoadSpec(sources=one_server(source), target=target, source_database=DB, source_table="t",
                               target_database=TARGET, target_table="t", load_key="nospark.t"), session)
    with mysql_conn.cursor() as cur:
        cur.execute(f"UPDATE {DB}.t SET v = 'x' WHERE id IN (5, 15005)")
    checked = run_reconcile(ReconcileSpec(sources=one_server(source), target=target, load_key="nospark.t",
                                          checksum=True),
                            session)
    assert checked["verdict"] == "mismatch" and checked["in_driver"] and not checked["spark_started"]
    found = run_snapshot_diff(SnapshotDiffSpec(target=target, old_table=f"{TARGET}.t", sources=one_server(source),
                                               source_database=DB, source_table="t"), session)
    assert found["counts"]["changed"] == 2 and found["in_driver"] and not found["spark_started"]
    assert found["rows_read_new"] < 200
    # a re-import of the mismatched shards copies them in the driver too (the full load's rule)
    repaired = run_reconcile(ReconcileSpec(sources=one_server(source), target=target, load_key="nospark.t",
                                           checksum=True, reimport=True), session)
    assert repaired["verdict"] == "ok" and repaired["before"]["verdict"] == "mismatch"
    assert not repaired["spark_started"] and not session.started

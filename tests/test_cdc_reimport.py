"""`reconcile --reimport` repairs a followed copy (issue 58): a CDC copy that drifted from its
source without a binlog event (written under ``sql_log_bin=0``) has its mismatched shards
re-imported in place (the full load's repair: spark/full_load.py), their rows versioned by the
source's binlog order, so the stream's later changes still win and its earlier ones do not —
bootstrapped or started from full loads, one table or by pattern, its pipeline stopped or
running. And a second bootstrap of a table with other settings than its copy's is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from airflow_sync_provider.core.clickhouse.layout import LayoutError
from airflow_sync_provider.core.content import ContentError
from airflow_sync_provider.core.jobspec import CdcApplySpec, CdcBootstrapSpec, FullLoadSpec, ReconcileSpec
from airflow_sync_provider.core.selection import TableSet
from airflow_sync_provider.core.source.group import one_server
from airflow_sync_provider.spark.cdc_apply import run_cdc_apply
from airflow_sync_provider.spark.cdc_bootstrap import run_cdc_bootstrap
from airflow_sync_provider.spark.full_load import run_full_load
from airflow_sync_provider.spark.reconcile import run_reconcile
from airflow_sync_provider.spark.tables import each_table
from tests.helpers import assert_same_rows, in_background, source_rows, stop_service, target_rows
from tests.helpers import run_sql as sql

pytestmark = pytest.mark.slow
ROWS = 1000
CLI = str(Path(sys.executable).parent / "airflow-sync")


def seeded(conn, database: str, *tables: str) -> None:
    sql(conn, f"CREATE DATABASE IF NOT EXISTS {database}")
    for table in tables:
        sql(conn, f"DROP TABLE IF EXISTS {database}.{table}",
            f"CREATE TABLE {database}.{table} (id INT PRIMARY KEY, note VARCHAR(20) NOT NULL, n INT NULL)",
            f"INSERT INTO {database}.{table} SELECT seq, CONCAT('n', seq), seq FROM {database}.seq_1_to_{ROWS}")


def pending(conn, database: str, table: str) -> None:
    """Changes the binlog carries, made before the drift and applied by a stopped pipeline only
    after the repair: older than the repair's reads, they must not out-rank it."""
    sql(conn, f"UPDATE {database}.{table} SET note = 'pending' WHERE id IN (17, 20)",
        f"INSERT INTO {database}.{table} VALUES (4000, 'pending', 4), (4001, 'pending', 4)")


def drift(conn, database: str, table: str, deleted: tuple = (19,)) -> None:
    """Changed values, deleted rows and an extra row, none of them in the binlog."""
    sql(conn, "SET SESSION sql_log_bin = 0",
        f"UPDATE {database}.{table} SET note = 'drifted', n = -n WHERE id IN (17, 18)",
        f"DELETE FROM {database}.{table} WHERE id IN ({', '.join(map(str, deleted))})",
        f"INSERT INTO {database}.{table} VALUES (5000, 'extra', 0)",
        "SET SESSION sql_log_bin = 1")


def changes(conn, database: str, table: str) -> None:
    """Changes the stream carries after the repair, to repaired rows and others: they must win."""
    sql(conn, f"UPDATE {database}.{table} SET note = 'after' WHERE id IN (17, 5000, 500)",
        f"DELETE FROM {database}.{table} WHERE id IN (18, 600)",
        f"INSERT INTO {database}.{table} VALUES (19, 'back', 19), (6000, 'new', 6)")


def apply(endpoints, spark, pipeline: str, **kwargs) -> dict:
    return run_cdc_apply(CdcApplySpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline=pipeline,
                                      lanes=2, verify_period=0, **kwargs), spark)


def bootstrap(endpoints, spark, pipeline: str, tableset: TableSet) -> dict:
    return run_cdc_bootstrap(CdcBootstrapSpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline=pipeline,
                                              tableset=tableset, channels=2, split_factor=2), spark)


def repaired(result: dict) -> None:
    """One table's reconciliation: its first pass mismatched, the re-import read only the
    mismatched shards (not the whole table), the second pass matched."""
    assert result["verdict"] == "ok" and result["before"]["verdict"] == "mismatch", result
    assert len(result["before"]["mismatched"]) < len(result["shards"]), result["before"]
    assert result["reimported"]["repaired"] == result["before"]["mismatched"]
    assert 0 < result["reimported"]["rows"] < ROWS


def test_reimport_repairs_a_bootstrapped_copy_by_pattern(mysql_conn, ch, endpoints, spark):
    """`reconcile --load cdc:<pipeline> --database <db> --checksum --reimport`, the pipeline stopped."""
    db, target, pipeline = "rimp_pat", "rimp_pat_ch", "rimp.pattern"
    seeded(mysql_conn, db, "a", "b")
    select = {"databases": [db], "target_database": target}
    bootstrap(endpoints, spark, pipeline, TableSet(select=select))
    apply(endpoints, spark, pipeline)
    for table in ("a", "b"):
        pending(mysql_conn, db, table)
        drift(mysql_conn, db, table)
    check = ReconcileSpec(sources=one_server(endpoints[0]), target=endpoints[1], load_key=f"cdc:{pipeline}",
                          checksum=True, reimport=True, tableset=TableSet(select=select))
    result = each_table(run_reconcile)(check, spark)
    assert result["verdict"] == "ok" and len(result["tables"]) == 2
    for one in result["tables"]:
        repaired(one)
        # the stopped pipeline is named: it has changes to apply that are older than the repair
        assert any(f"pipeline {pipeline!r} (idle" in w and "has not applied the binlog up to this repair's reads" in w
                   for w in one["reimported"]["warnings"]), one["reimported"]
    for table in ("a", "b"):
        assert_same_rows(mysql_conn, ch, db, table, target)
    apply(endpoints, spark, pipeline)  # the pending changes are older than the repair: they change nothing
    for table in ("a", "b"):
        assert_same_rows(mysql_conn, ch, db, table, target)
        changes(mysql_conn, db, table)
    apply(endpoints, spark, pipeline)
    for table in ("a", "b"):
        assert_same_rows(mysql_conn, ch, db, table, target)


def test_reimport_repairs_a_table_bootstrapped_alone_from_the_command_line(mysql_conn, mysql_url, clickhouse_url, ch,
                                                                             endpoints, spark, tmp_path):
    """The command of the report: `reconcile --load cdc:<pipeline>:<db>.<table> --checksum
    --reimport` of a pipeline bootstrapped with `--table` (exit 0, was a ValueError on an empty
    ClickHouse identifier: the bootstrap's copy has no working table)."""
    db, pipeline = "rimp_one", "rimp.one"
    seeded(mysql_conn, db, "t")
    bootstrap(endpoints, spark, pipeline, TableSet(tables=[f"{db}.t"]))
    apply(endpoints, spark, pipeline)
    pending(mysql_conn, db, "t")
    drift(mysql_conn, db, "t")
    env = dict(os.environ, MYSQL_URL=mysql_url, CLICKHOUSE_URL=clickhouse_url)
    out = subprocess.run([CLI, "reconcile", "--load", f"cdc:{pipeline}:{db}.t", "--checksum", "--reimport", "--json",
                          "--report-dir", str(tmp_path)], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    repaired(json.loads(out.stdout))
    assert_same_rows(mysql_conn, ch, db, "t")
    changes(mysql_conn, db, "t")
    apply(endpoints, spark, pipeline)
    assert_same_rows(mysql_conn, ch, db, "t")


def test_reimport_repairs_a_copy_while_its_pipeline_runs_as_a_service(mysql_conn, ch, endpoints, spark):
    """The repair writes beside a running stream: the changes the service applies after it (to
    repaired rows too) win over it, the changes it applies late (older than its read) do not."""
    db, pipeline = "rimp_svc", "rimp.service"
    seeded(mysql_conn, db, "t")
    bootstrap(endpoints, spark, pipeline, TableSet(tables=[f"{db}.t"]))
    spec = CdcApplySpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline=pipeline, lanes=2,
                        service=True, max_seconds=20, batch_seconds=0.2, verify_period=0)
    service, result, errors = in_background(lambda: run_cdc_apply(spec, spark))

    def caught_up(deadline: float) -> bool:
        while time.monotonic() < deadline and service.is_alive():
            if source_rows(mysql_conn, db, "t") == target_rows(ch, mysql_conn, db, "t"):
                return True
            time.sleep(0.2)
        return False

    try:
        assert caught_up(time.monotonic() + 20)
        pending(mysql_conn, db, "t")
        drift(mysql_conn, db, "t", deleted=(19, 4000))  # 4000: inserted by a change the service applies
        check = ReconcileSpec(sources=one_server(endpoints[0]), target=endpoints[1], load_key=f"cdc:{pipeline}:{db}.t",
                              checksum=True, reimport=True)
        outcome = run_reconcile(check, spark)
        assert service.is_alive()  # it ran beside the service
        assert outcome["verdict"] == "ok" and outcome["before"]["verdict"] == "mismatch", outcome
        assert outcome["reimported"]["rows"] < ROWS
        changes(mysql_conn, db, "t")
        assert caught_up(time.monotonic() + 15)
    finally:
        stop_service(ch, pipeline, service)
    assert not errors, errors
    assert_same_rows(mysql_conn, ch, db, "t")


def test_a_repair_publishes_once_a_running_pipeline_has_applied_the_binlog_up_to_its_reads(mysql_conn, ch,
                                                                                           endpoints, spark,
                                                                                           monkeypatch):
    """The wait that makes a repair beside a running stream exact (core/cdc/followers.py): a copy
    that a (stand-in) running pipeline follows is repaired only once that pipeline's checkpoint
    has passed the repair's reads. Not there in time: the job fails naming it, the reads kept;
    once it is there, the next re-import publishes them without reading again."""
    from airflow_sync_provider.core.cdc import followers
    from airflow_sync_provider.core.cdc.checkpoints import PIPELINE_IDLE, PIPELINE_RUNNING, Checkpoints, PipelineState
    from airflow_sync_provider.core.cdc.servers import source_epoch
    from airflow_sync_provider.core.cdc.tables import PipelineTable
    from airflow_sync_provider.core.ledger import DEFAULT_LEDGER_DATABASE, Ledger
    from airflow_sync_provider.core.positions import current_position

    db, key = "rimp_wait", "rimp.wait"
    seeded(mysql_conn, db, "t")
    run_full_load(FullLoadSpec(sources=one_server(endpoints[0]), target=endpoints[1], source_database=db,
                               source_table="t", target_database=db, target_table="t", load_key=key, split_factor=2),
                  spark)
    drift(mysql_conn, db, "t")
    checkpoints = Checkpoints(ch)
    checkpoints.ensure()
    epoch = source_epoch(mysql_conn, ch, DEFAULT_LEDGER_DATABASE)

    def follower(status: str) -> None:  # a pipeline following the copy, at the source's position now
        checkpoints.write(PipelineState("rimp.follower", status, current_position(mysql_conn, epoch=epoch),
                                        [PipelineTable(db, "t", db, "t")]))

    follower(PIPELINE_RUNNING)
    pending(mysql_conn, db, "t")  # changes it has not applied yet
    check = ReconcileSpec(sources=one_server(endpoints[0]), target=endpoints[1], load_key=key, checksum=True,
                          reimport=True)
    monkeypatch.setattr(followers, "WAIT_SECONDS", 1.0)
    try:
        with pytest.raises(followers.FollowerBehind, match=r"pipeline 'rimp.follower' did not apply the binlog up to "
                                                           r"the repair's reads .* within 1 s"):
            run_reconcile(check, spark)
        state = Ledger(ch).state(key)
        assert state.repair and all(state.shards[i].status == "success" for i in state.repair)  # read ...
        assert ch.command(f"SELECT count() FROM {db}.t FINAL WHERE id = 19") == 1  # ... not published
        attempts = {i: state.shards[i].attempt for i in state.repair}
        follower(PIPELINE_RUNNING)  # it has applied the binlog up to now: past the repair's reads
        result = run_reconcile(check, spark)  # finishes the repair first, then compares
    finally:
        follower(PIPELINE_IDLE)
    assert result["verdict"] == "ok"
    state = Ledger(ch).state(key)
    assert state.status == "published" and {i: state.shards[i].attempt for i in attempts} == attempts
    assert_same_rows(mysql_conn, ch, db, "t")


def test_the_operator_reimports_copies_started_from_full_loads(mysql_conn, mysql_url, clickhouse_url, ch, endpoints,
                                                               spark, tmp_path, monkeypatch):
    """ReconcileOperator(on_mismatch="reimport") by pattern, the pipeline started from full loads
    (start_from_loads)."""
    from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
    from airflow_sync_provider.core.ledger import Ledger
    from airflow_sync_provider.operators.reconcile import ReconcileOperator

    db, target, pipeline = "rimp_fl", "rimp_fl_ch", "rimp.loads"
    seeded(mysql_conn, db, "a", "b")
    select = {"databases": [db], "target_database": target}
    loaded = each_table(run_full_load)(FullLoadSpec(sources=one_server(endpoints[0]), target=endpoints[1],
                                                    source_database="", source_table="", target_database="",
                                                    target_table="", load_key="rimp", split_factor=2,
                                                    tableset=TableSet(select=select)), spark)
    keys = [t["load_key"] for t in loaded["tables"]]
    apply(endpoints, spark, pipeline, start_from_loads=keys)
    for table in ("a", "b"):
        pending(mysql_conn, db, table)
        drift(mysql_conn, db, table)
    source, copy = MySQLEndpoint.from_url(mysql_url), ClickHouseEndpoint.from_url(clickhouse_url)
    monkeypatch.setenv("AIRFLOW_CONN_RIMP_MYSQL", json.dumps(
        {"conn_type": "mysql", "host": source.host, "port": source.port, "login": source.user,
         "password": source.password}))
    monkeypatch.setenv("AIRFLOW_CONN_RIMP_CH", json.dumps(
        {"conn_type": "clickhouse", "host": copy.host, "port": copy.port, "login": copy.user,
         "password": copy.password}))
    monkeypatch.setenv("AIRFLOW_CONN_RIMP_SPARK", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    summary = ReconcileOperator(task_id="check", load_key="rimp", select=select, checksum=True,
                                on_mismatch="reimport", mysql_conn_id="rimp_mysql", clickhouse_conn_id="rimp_ch",
                                spark_conn_id="rimp_spark", report_dir=str(tmp_path)).execute({})
    assert summary["verdict"] == "ok" and len(summary["tables"]) == 2, summary
    for one in summary["tables"]:
        assert one["mismatched_before"] and one["reimported"]["repaired"] == one["mismatched_before"]
        assert 0 < one["reimported"]["rows"] < ROWS
        # the stopped pipeline following the copy is named: it has changes to apply older than the repair
        assert any(f"pipeline {pipeline!r} (idle" in w for w in one["reimported"]["warnings"]), one["reimported"]
    for table in loaded["tables"]:  # a pipeline started from the load again replays from where the load began
        assert Ledger(ch).state(table["load_key"]).start_position == table["start_position"]
    for table in ("a", "b"):
        assert_same_rows(mysql_conn, ch, db, table, target)
    apply(endpoints, spark, pipeline)
    for table in ("a", "b"):
        assert_same_rows(mysql_conn, ch, db, table, target)
        changes(mysql_conn, db, table)
    apply(endpoints, spark, pipeline)
    for table in ("a", "b"):
        assert_same_rows(mysql_conn, ch, db, table, target)


def test_a_second_bootstrap_with_other_settings_is_refused_naming_both(mysql_conn, ch, endpoints, spark):
    """`cdc bootstrap --pipeline P --table db.t --order-by status` of a table P bootstrapped with
    another layout (or other content settings) is refused as a full load is, naming both; the
    same settings again are skipped."""
    db, pipeline = "rimp_set", "rimp.settings"
    sql(mysql_conn, f"CREATE DATABASE IF NOT EXISTS {db}", f"DROP TABLE IF EXISTS {db}.t",
        f"CREATE TABLE {db}.t (id INT PRIMARY KEY, status VARCHAR(10) NOT NULL, n INT NULL)",
        f"INSERT INTO {db}.t SELECT seq, IF(seq % 2, 'open', 'done'), seq FROM {db}.seq_1_to_100")

    def again(**options):
        return bootstrap(endpoints, spark, pipeline, TableSet(tables=[f"{db}.t"], **options))

    assert not again(layout={"order_by": ["n"]})["tables"][0]["skipped"]
    with pytest.raises(LayoutError, match=r'laid out as \{"order_by": \["n"\]\} but this job asks for '
                                          r'\{"order_by": \["status"\]\}'):
        again(layout={"order_by": ["status"]})
    with pytest.raises(LayoutError, match=r'laid out as \{"order_by": \["n"\]\} but this job asks for '
                                          r'\{"order_by": \["n"\], "partition_by": "n % 4"\}'):
        again(layout={"order_by": ["n"], "partition_by": "n % 4"})
    with pytest.raises(ContentError, match=r"the copy holds the source's rows and values as they are but this job "
                                           r"asks for \{\"row_filter\": \"status = 'open'\"\}"):
        again(layout={"order_by": ["n"]}, content={"row_filter": "status = 'open'"})
    assert again(layout={"order_by": ["n"]})["tables"][0]["skipped"]  # the same settings: nothing to do
    assert again()["tables"][0]["skipped"]  # no layout asked for: the copy's own
    assert assert_same_rows(mysql_conn, ch, db, "t") == 100

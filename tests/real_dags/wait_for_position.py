"""A test-only DAG for the real-Airflow tier (tests/test_airflow_real.py): a deferrable
BinlogPositionSensor waiting for the pipeline and position given in the run's conf, so a test
can hold it in the triggerer until something else (a run of ``sync_demo_cdc``, a failure
report) decides it."""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG

from airflow_sync_provider.sensors.binlog_position import BinlogPositionSensor

with DAG(dag_id="sync_test_wait_for_position", schedule=None, start_date=dt.datetime(2025, 1, 1), catchup=False):
    BinlogPositionSensor(task_id="wait", pipeline="{{ dag_run.conf['pipeline'] }}",
                         position="{{ dag_run.conf['position'] }}", deferrable=True, poke_interval=2, timeout=3600,
                         mysql_conn_id="sync_mysql", clickhouse_conn_id="sync_clickhouse")

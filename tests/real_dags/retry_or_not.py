"""A test-only DAG for the real-Airflow tier (tests/test_airflow_real.py): two tasks with
``retries=2`` that fail, one for a reason no retry cures (its table does not exist: the task
fails at once, AirflowFailException) and one the failure policy does not know (Airflow's
retries apply): core/failures.py's classes as a real scheduler treats them."""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG

from airflow_sync_provider.operators.full_load import FullLoadOperator
from airflow_sync_provider.operators.reconcile import ReconcileOperator

CONNECTIONS = {"mysql_conn_id": "sync_mysql", "clickhouse_conn_id": "sync_clickhouse"}

with DAG(dag_id="sync_test_retry_or_not", schedule=None, start_date=dt.datetime(2025, 1, 1), catchup=False,
         default_args={"retries": 2, "retry_delay": dt.timedelta(seconds=1)}):
    FullLoadOperator(task_id="refused", table="no_such_table", target_database="demo_ch", **CONNECTIONS)
    ReconcileOperator(task_id="retried", load_key="no.such.load", **CONNECTIONS)

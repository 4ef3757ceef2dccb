"""A production-shaped source and target: a MySQL that takes TLS connections only, read by a
least-privileged account that must show a client certificate (``REQUIRE X509``), and ClickHouse
over HTTPS with mutual TLS. Every setting is in the Airflow connections' extras, named as the MySQL
and clickhousedb providers document them, so the same connections serve those providers' hooks:

    AIRFLOW_CONN_SYNC_MYSQL_TLS='{"conn_type": "mysql", "host": "db.example.com", "port": 3306,
      "login": "sync", "password": "…", "schema": "shop",
      "extra": {"ssl": {"ca": "/etc/sync/rds-ca.pem", "cert": "/etc/sync/client.pem",
                        "key": "/etc/sync/client.key"},
                "ssl_mode": "VERIFY_IDENTITY", "charset": "utf8mb4", "connect_timeout": 20,
                "init_command": "SET SESSION lock_wait_timeout = 60"}}'
    AIRFLOW_CONN_SYNC_CLICKHOUSE_TLS='{"conn_type": "clickhouse", "host": "ch.example.com",
      "port": 8443, "login": "sync", "password": "…", "schema": "default",
      "extra": {"secure": true, "verify": true,
                "client_kwargs": {"ca_cert": "/etc/sync/ch-ca.pem", "client_cert": "/etc/sync/client.pem",
                                  "client_cert_key": "/etc/sync/client.key"}}}'

The certificate files are read where a task starts; their contents travel with the job to the
Spark executors (written there 0600, never on a command line or in a log). The account needs
only ``SELECT`` on the database and ``REPLICATION SLAVE`` + ``BINLOG MONITOR`` (MariaDB;
``REPLICATION CLIENT`` on MySQL), and the server may be a read-only replica (docs/grants.md).

load → reconcile (per-shard counts and checksums) → diff (snapshot diff, applied to the copy);
bootstrap → catch_up (CDC from the binlog, over TLS too). tests/test_example_dag.py runs it
against the TLS-only MariaDB of tests/tls_source.py.
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG

from airflow_sync_provider.operators.cdc_apply import CdcApplyOperator
from airflow_sync_provider.operators.cdc_bootstrap import CdcBootstrapOperator
from airflow_sync_provider.operators.full_load import FullLoadOperator
from airflow_sync_provider.operators.reconcile import ReconcileOperator
from airflow_sync_provider.operators.snapshot_diff import SnapshotDiffOperator

CONNECTIONS = {"mysql_conn_id": "sync_mysql_tls", "clickhouse_conn_id": "sync_clickhouse_tls"}
SOURCE, COPY, PIPELINE = "tls_dag", "tls_dag_copy", "tls_dag"

with DAG(
    dag_id="sync_tls_source",
    schedule=None,
    start_date=dt.datetime(2025, 1, 1),
    catchup=False,
    max_active_runs=1,  # one applier per pipeline
    tags=["airflow-sync", "example", "tls"],
    doc_md=__doc__,
):
    load = FullLoadOperator(task_id="load", table="orders", target_database=COPY, channels=2, **CONNECTIONS)
    reconcile = ReconcileOperator(task_id="reconcile", load_key="{{ ti.xcom_pull(task_ids='load')['load_key'] }}",
                                  checksum=True, **CONNECTIONS)
    diff = SnapshotDiffOperator(task_id="diff", source_table=f"{SOURCE}.orders", old_table=f"{COPY}.orders",
                                on_change="apply", diff_key=f"{COPY}.orders", channels=2, **CONNECTIONS)
    bootstrap = CdcBootstrapOperator(task_id="bootstrap", pipeline=PIPELINE, channels=2, tables=[
        {"source_database": SOURCE, "source_table": "events", "target_database": COPY}], **CONNECTIONS)
    catch_up = CdcApplyOperator(task_id="catch_up", pipeline=PIPELINE, lanes=2, **CONNECTIONS)
    load >> reconcile >> diff
    bootstrap >> catch_up

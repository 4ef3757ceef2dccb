"""A copy that holds what it should (docs/content.md).

``customers`` copied without their personal data in the clear (the email hashed with a salt kept
in an Airflow connection, the name masked), ``orders`` without the test orders, and keeping the
orders the source purges: a row deleted in MySQL stays in the copy, marked in
``_deleted_at_source``. Reconciled with checksums — the source side is shaped the same way, so
the checks prove the shaped copy, and count the kept rows apart — then kept current by CDC,
which decides on each row image as MySQL would.
Connections: ``sync_mysql``, ``sync_clickhouse``, ``spark_default`` (``python -m devenv.demo`` sets
them), and ``sync_hash_salt``, whose password is the salt.
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG

from airflow_sync_provider.operators.cdc_apply import CdcApplyOperator
from airflow_sync_provider.operators.full_load import FullLoadOperator
from airflow_sync_provider.operators.reconcile import ReconcileOperator

TABLES = [
    {"source_database": "demo", "source_table": "customers", "target_database": "demo_shaped",
     "transform": {"email": "hash", "name": "mask(1, 0)"}},
    {"source_database": "demo", "source_table": "orders", "target_database": "demo_shaped",
     "row_filter": "status <> 'test'", "on_delete": "keep", "transform": {"note": "truncate(20)"}},
]

with DAG(
    dag_id="sync_demo_content",
    schedule=None,
    start_date=dt.datetime(2025, 1, 1),
    catchup=False,
    tags=["airflow-sync", "example"],
    doc_md=__doc__,
):
    load = FullLoadOperator(
        task_id="load",
        tables=TABLES,
        load_key="demo_shaped",
        hash_salt_conn_id="sync_hash_salt",
        mysql_conn_id="sync_mysql",
        clickhouse_conn_id="sync_clickhouse",
        skip_if_published=True,
    )
    check = ReconcileOperator(
        task_id="reconcile",
        load_key="demo_shaped",
        select={"databases": ["demo"], "tables": ["customers", "orders"]},
        checksum=True,
        on_mismatch="reimport",
        hash_salt_conn_id="sync_hash_salt",
        mysql_conn_id="sync_mysql",
        clickhouse_conn_id="sync_clickhouse",
    )
    follow = CdcApplyOperator(
        task_id="follow",
        pipeline="demo_shaped",
        start_from_loads=["demo_shaped:demo.customers", "demo_shaped:demo.orders"],
        hash_salt_conn_id="sync_hash_salt",
        mysql_conn_id="sync_mysql",
        clickhouse_conn_id="sync_clickhouse",
    )
    load >> check >> follow

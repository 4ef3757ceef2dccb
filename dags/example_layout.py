"""A copy laid out for the queries people run on it (docs/layouts.md).

``orders`` copied with a sorting key by customer and a partition per month of its creation,
reconciled with checksums (the checks read the copy by its source key whatever its layout),
then kept current by CDC: an update that moves an order to another customer or month leaves a
tombstone under its old sorting key and partition, so ``FINAL`` shows it once.
Connections: ``sync_mysql``, ``sync_clickhouse``, ``spark_default`` (``python -m devenv.demo`` sets them).
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG

from airflow_sync_provider.operators.cdc_apply import CdcApplyOperator
from airflow_sync_provider.operators.full_load import FullLoadOperator
from airflow_sync_provider.operators.reconcile import ReconcileOperator

LAYOUT = {
    "order_by": ["customer_id", "created_at"],  # the primary key (id) is appended
    "partition_by": "toYYYYMM(created_at)",
    "settings": {"index_granularity": 8192},
}

with DAG(
    dag_id="sync_demo_layout",
    schedule=None,
    start_date=dt.datetime(2025, 1, 1),
    catchup=False,
    tags=["airflow-sync", "example"],
    doc_md=__doc__,
):
    load = FullLoadOperator(
        task_id="load_orders",
        table="orders",
        target_database="demo_laid_out",
        layout=LAYOUT,
        mysql_conn_id="sync_mysql",
        clickhouse_conn_id="sync_clickhouse",
        skip_if_published=True,
    )
    check = ReconcileOperator(
        task_id="reconcile_orders",
        load_key="{{ ti.xcom_pull(task_ids='load_orders')['load_key'] }}",
        checksum=True,
        on_mismatch="reimport",
        mysql_conn_id="sync_mysql",
        clickhouse_conn_id="sync_clickhouse",
    )
    follow = CdcApplyOperator(
        task_id="follow_orders",
        pipeline="demo_laid_out",
        start_from_loads=["{{ ti.xcom_pull(task_ids='load_orders')['load_key'] }}"],
        mysql_conn_id="sync_mysql",
        clickhouse_conn_id="sync_clickhouse",
    )
    load >> check >> follow

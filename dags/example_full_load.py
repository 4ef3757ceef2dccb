"""Full load of the demo tables (orders, customers, order_items) from MySQL into ClickHouse.

Connections: ``sync_mysql`` (type mysql, schema = source database), ``sync_clickhouse``
(type clickhouse), ``spark_default`` (type spark, host = master, e.g. ``local[2]``).
``python -m devenv.demo`` sets all three for the local stand-ins.
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG

from airflow_sync_provider.operators.full_load import FullLoadOperator

with DAG(
    dag_id="sync_demo_full_load",
    schedule=None,
    start_date=dt.datetime(2025, 1, 1),
    catchup=False,
    tags=["airflow-sync", "example"],
    doc_md=__doc__,
):
    for table in ("customers", "orders", "order_items"):
        FullLoadOperator(
            task_id=f"load_{table}",
            table=table,
            mysql_conn_id="sync_mysql",
            clickhouse_conn_id="sync_clickhouse",
            target_database="demo",
            channels=2,
        )

"""Scheduled on the copy, not on a clock: Airflow runs this DAG after each task that refreshes
``demo.orders`` on ClickHouse succeeds (``FullLoadOperator`` declares the table as its outlet
asset; the CDC and diff operators declare theirs). The asset event carries the load's summary.
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG, task

from airflow_sync_provider.assets import clickhouse_table

ORDERS_COPY = clickhouse_table("sync_clickhouse", "demo", "orders")

with DAG(
    dag_id="sync_demo_orders_consumer",
    schedule=[ORDERS_COPY],
    start_date=dt.datetime(2025, 1, 1),
    catchup=False,
    tags=["airflow-sync", "example"],
    doc_md=__doc__,
):

    @task
    def count_the_copy(**context) -> dict:
        from airflow_sync_provider.core.clickhouse.client import client
        from airflow_sync_provider.hooks.endpoints import SyncEndpointsHook

        loads = [event.extra for events in context["triggering_asset_events"].values() for event in events]
        ch = client(SyncEndpointsHook(clickhouse_conn_id="sync_clickhouse").target())
        try:
            rows = int(ch.command("SELECT count() FROM demo.orders FINAL"))
        finally:
            ch.close()
        print(f"demo.orders on ClickHouse: {rows:,} rows; triggered by {loads or 'a manual run'}")
        return {"rows": rows, "triggered_by": loads}

    count_the_copy()

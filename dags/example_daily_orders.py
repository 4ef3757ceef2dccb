"""Daily period load: each run copies one day of ``demo.orders`` into the day's partition of
``demo.orders_daily`` and replaces exactly that partition, so a backfill (or a re-run from the
UI) of any day is idempotent and leaves every other day untouched.

    airflow dags test sync_demo_daily_orders 2025-01-04   # loads 2025-01-03 (the interval ending then)
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG
from airflow.timetables.interval import CronDataIntervalTimetable

from airflow_sync_provider.operators.full_load import FullLoadOperator
from airflow_sync_provider.sensors.shard_counters import ShardCountersSensor

with DAG(
    dag_id="sync_demo_daily_orders",
    # Data intervals [day, day + 1): Airflow 3's plain "@daily" has empty intervals (start == end).
    schedule=CronDataIntervalTimetable("@daily", timezone="UTC"),
    start_date=dt.datetime(2025, 1, 1),
    catchup=False,
    max_active_runs=4,
    tags=["airflow-sync", "example"],
    doc_md=__doc__,
):
    load = FullLoadOperator(
        task_id="load_day",
        table="orders",
        target_table="orders_daily",
        mysql_conn_id="sync_mysql",
        clickhouse_conn_id="sync_clickhouse",
        target_database="demo",
        split_column="created_at",  # the period column: shards are index ranges inside the day
        where="`created_at` >= %s AND `created_at` < %s",
        where_params=["{{ data_interval_start | ds }}", "{{ data_interval_end | ds }}"],
        partition_by="toYYYYMMDD(created_at)",
        replace_partitions=["{{ data_interval_start | ds_nodash }}"],
        load_key="daily_orders.{{ data_interval_start | ds }}",  # one key per day: re-runs resume or redo it
        channels=2,
    )
    load >> ShardCountersSensor(
        task_id="counters",
        load_key="{{ ti.xcom_pull(task_ids='load_day')['load_key'] }}",
        clickhouse_conn_id="sync_clickhouse",
        mode="reschedule",
        poke_interval=5,
        timeout=600,
    )

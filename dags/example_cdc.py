"""Keep the demo's ``customers`` copy current with CDC: a scheduled catch-up.

start_customers: the full load the pipeline starts from (once; later runs skip it) →
catch_up: apply the binlog from the pipeline's checkpoint to the source's position now →
caught_up: BinlogPositionSensor, deferrable, until the checkpoint has reached that position →
report (add a ReconcileOperator on the start load's key to compare the copy shard by shard).
Connections as in example_full_load.py (``python -m devenv.demo`` sets them).
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG, task

from airflow_sync_provider.operators.cdc_apply import CdcApplyOperator
from airflow_sync_provider.operators.full_load import FullLoadOperator
from airflow_sync_provider.sensors.binlog_position import BinlogPositionSensor

CONNECTIONS = {"mysql_conn_id": "sync_mysql", "clickhouse_conn_id": "sync_clickhouse"}

with DAG(
    dag_id="sync_demo_cdc",
    schedule=dt.timedelta(minutes=10),
    start_date=dt.datetime(2025, 1, 1),
    catchup=False,
    max_active_runs=1,  # one applier per pipeline
    tags=["airflow-sync", "example", "cdc"],
    doc_md=__doc__,
):
    start = FullLoadOperator(task_id="start_customers", table="customers", target_database="demo",
                             load_key="sync_demo_cdc.customers.start", skip_if_published=True, **CONNECTIONS)
    catch_up = CdcApplyOperator(task_id="catch_up", pipeline="demo_cdc",
                                start_from_loads=["sync_demo_cdc.customers.start"], lanes=2, **CONNECTIONS)
    caught_up = BinlogPositionSensor(task_id="caught_up", pipeline="demo_cdc",
                                     position="{{ ti.xcom_pull(task_ids='catch_up')['stop'] }}",
                                     deferrable=True, poke_interval=5, timeout=600, **CONNECTIONS)
    @task
    def report(applied: dict, position: dict) -> dict:
        """Downstream of the gate: runs only once the copy has caught up."""
        print(f"pipeline {applied['pipeline']}: {applied['events']:,} row changes applied; checkpoint "
              f"{position['checkpoint']['file']}:{position['checkpoint']['pos']}")
        return {"events": applied["events"], "checkpoint": position["checkpoint"]}

    start >> catch_up >> caught_up
    report(catch_up.output, caught_up.output)

"""Keep copies of the demo's ``orders`` and ``order_items`` current with CDC.

bootstrap: a lock-free chunked copy of both tables while the source keeps changing (the
first run; later runs skip tables already bootstrapped) →
catch_up: apply the binlog from the pipeline's checkpoint (a new pipeline: from the
bootstrap's start) to the source's position now →
caught_up: BinlogPositionSensor, deferrable, until the checkpoint has passed the bootstrap's end →
reconcile_<table>: per-shard counts and content checksums of source vs copy; shards that
differ are re-imported (on_mismatch="reimport") →
report, downstream of every gate.
Connections as in example_full_load.py (``python -m devenv.demo`` sets them).
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG, task

from airflow_sync_provider.core.jobspec import bootstrap_load_key
from airflow_sync_provider.operators.cdc_apply import CdcApplyOperator
from airflow_sync_provider.operators.cdc_bootstrap import CdcBootstrapOperator
from airflow_sync_provider.operators.reconcile import ReconcileOperator
from airflow_sync_provider.sensors.binlog_position import BinlogPositionSensor

CONNECTIONS = {"mysql_conn_id": "sync_mysql", "clickhouse_conn_id": "sync_clickhouse"}
PIPELINE = "demo_cdc"
TABLES = [{"source_database": "demo", "source_table": table, "target_database": "demo_cdc"}
          for table in ("orders", "order_items")]

with DAG(
    dag_id="sync_demo_cdc",
    schedule=dt.timedelta(minutes=10),
    start_date=dt.datetime(2025, 1, 1),
    catchup=False,
    max_active_runs=1,  # one applier per pipeline
    tags=["airflow-sync", "example", "cdc"],
    doc_md=__doc__,
):
    bootstrap = CdcBootstrapOperator(task_id="bootstrap", pipeline=PIPELINE, tables=TABLES, channels=2,
                                     **CONNECTIONS)
    catch_up = CdcApplyOperator(task_id="catch_up", pipeline=PIPELINE, lanes=2, **CONNECTIONS)
    caught_up = BinlogPositionSensor(task_id="caught_up", pipeline=PIPELINE,
                                     position="{{ ti.xcom_pull(task_ids='bootstrap')['end_position'] }}",
                                     deferrable=True, poke_interval=5, timeout=600, **CONNECTIONS)
    # a copy found to differ (written behind the pipeline's back) has those shards read again,
    # versioned so that the stream's next change of a row still wins
    checks = [ReconcileOperator(task_id=f"reconcile_{t['source_table']}", load_key=bootstrap_load_key(PIPELINE, t),
                                checksum=True, on_mismatch="reimport", **CONNECTIONS) for t in TABLES]

    @task
    def report(copied: dict, applied: dict, position: dict) -> dict:
        """Downstream of the gates: runs only once the copies have caught up and reconciled."""
        for table in copied["tables"]:
            print(f"{table['table']}: {table['rows']:,} rows bootstrapped"
                  + (" (earlier run)" if table["skipped"] else f" in {table['chunks']} chunks"))
        print(f"pipeline {applied['pipeline']}: {applied['events']:,} row changes applied; checkpoint "
              f"{position['checkpoint']['file']}:{position['checkpoint']['pos']}")
        return {"events": applied["events"], "checkpoint": position["checkpoint"]}

    bootstrap >> catch_up >> caught_up >> checks
    report(bootstrap.output, catch_up.output, caught_up.output) << checks

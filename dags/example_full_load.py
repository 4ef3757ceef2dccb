"""Full load of the demo tables (orders, customers, order_items) from MySQL into ClickHouse.

Each table: load → shard-counters sensor (every shard read == written, failed == 0) →
reconciliation (per-shard source vs target counts and content checksums; mismatched shards are
re-imported into the published table and compared again) → report.
Connections: ``sync_mysql`` (type mysql, schema = source database), ``sync_clickhouse``
(type clickhouse), ``spark_default`` (type spark, host = master, e.g. ``local[2]``).
``python -m devenv.demo`` sets all three for the local stand-ins.
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG, task

from airflow_sync_provider.operators.full_load import FullLoadOperator
from airflow_sync_provider.operators.reconcile import ReconcileOperator
from airflow_sync_provider.sensors.shard_counters import ShardCountersSensor

TABLES = ("customers", "orders", "order_items")

with DAG(
    dag_id="sync_demo_full_load",
    schedule=None,
    start_date=dt.datetime(2025, 1, 1),
    catchup=False,
    tags=["airflow-sync", "example"],
    doc_md=__doc__,
):

    @task
    def report(summaries: list[dict]) -> dict:
        """Downstream of the gates: everything here ran only after every shard was verified."""
        for s in summaries:
            print(f"{s['load_key']}: {s['rows_written']:,} rows in {s['shards']} shards, verdict {s['verdict']}")
        return {s["load_key"]: s["rows_written"] for s in summaries}

    gates, checks = [], []
    for table in TABLES:
        load = FullLoadOperator(
            task_id=f"load_{table}",
            table=table,
            mysql_conn_id="sync_mysql",
            clickhouse_conn_id="sync_clickhouse",
            target_database="demo",
            channels=2,
        )
        gate = ShardCountersSensor(
            task_id=f"counters_{table}",
            load_key=f"{{{{ ti.xcom_pull(task_ids='load_{table}')['load_key'] }}}}",
            clickhouse_conn_id="sync_clickhouse",
            deferrable=table == "orders",  # one of each: poke and deferrable (trigger)
            poke_interval=5,
            timeout=600,
        )
        load >> gate
        gates.append(gate)
        check = ReconcileOperator(
            task_id=f"reconcile_{table}",
            load_key=f"{{{{ ti.xcom_pull(task_ids='load_{table}')['load_key'] }}}}",
            mysql_conn_id="sync_mysql",
            clickhouse_conn_id="sync_clickhouse",
            checksum=True,
            on_mismatch="reimport",  # fails only if the shards still differ after the re-import
        )
        gate >> check
        checks.append(check)
    report([gate.output for gate in gates]) << checks

"""Daily snapshot diff of ``demo.orders`` into ``demo_diff.orders``: the sync path for a source
without a binlog (it works the same with one). The first run creates the copy (every row
``new``); each later run flags what changed since, writes the change set to
``demo_diff.orders__changes`` with an HTML report, and applies it (upserts and tombstones,
versioned so a CDC writer on the same copy is never out-ranked). ``verify`` then diffs again
and fails the run unless everything is identical.

    airflow dags test sync_demo_snapshot_diff
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG

from airflow_sync_provider.operators.snapshot_diff import SnapshotDiffOperator

with DAG(
    dag_id="sync_demo_snapshot_diff",
    schedule="@daily",
    start_date=dt.datetime(2025, 1, 1),
    catchup=False,
    tags=["airflow-sync", "example"],
    doc_md=__doc__,
):
    common = dict(source_table="demo.orders", old_table="demo_diff.orders", mysql_conn_id="sync_mysql",
                  clickhouse_conn_id="sync_clickhouse", channels=2)
    apply = SnapshotDiffOperator(task_id="diff_and_apply", on_change="apply", diff_key="demo_diff.orders", **common)
    verify = SnapshotDiffOperator(task_id="verify", on_change="fail", diff_key="demo_diff.orders.verify", **common)
    apply >> verify

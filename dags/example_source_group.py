"""A sharded estate merged into one ClickHouse table (docs/source-groups.md).

``sync_demo_source_group``: every ``orders_*`` table of the ``shop_*`` databases on each of two
MariaDB servers (connections ``sync_shard_s0`` and ``sync_shard_s1``; ids overlap from shard to
shard) — loaded into ``analytics_group.orders`` in one job, gated on every shard's hook counters,
reconciled with checksums against each source, then kept current by CDC in
``analytics_group.orders_live`` (a pipeline per source), a sensor waiting for every source's
pipeline to reach the position each source had when it first looked.
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG

from airflow_sync_provider.operators.cdc_apply import CdcApplyOperator
from airflow_sync_provider.operators.cdc_bootstrap import CdcBootstrapOperator
from airflow_sync_provider.operators.full_load import FullLoadOperator
from airflow_sync_provider.operators.reconcile import ReconcileOperator
from airflow_sync_provider.sensors.binlog_position import BinlogPositionSensor
from airflow_sync_provider.sensors.shard_counters import ShardCountersSensor

SHARDS = [{"name": "s0", "mysql_conn_id": "sync_shard_s0"}, {"name": "s1", "mysql_conn_id": "sync_shard_s1"}]
SELECT = {"databases": ["shop_*"], "tables": ["orders_*"]}
CLICKHOUSE = {"clickhouse_conn_id": "sync_clickhouse"}
LOAD_KEY = "{{ ti.xcom_pull(task_ids='load_orders')['load_key'] }}"

with DAG(
    dag_id="sync_demo_source_group",
    schedule=None,
    start_date=dt.datetime(2025, 1, 1),
    catchup=False,
    tags=["airflow-sync", "example"],
):
    load = FullLoadOperator(task_id="load_orders", sources=SHARDS, select=SELECT, merge_into="analytics_group.orders",
                            channels=2, **CLICKHOUSE)
    counters = ShardCountersSensor(task_id="counters", load_key=LOAD_KEY, poke_interval=2, timeout=600, **CLICKHOUSE)
    check = ReconcileOperator(task_id="reconcile", sources=SHARDS, merge_into="analytics_group.orders",
                              load_key=LOAD_KEY, checksum=True, on_mismatch="reimport", **CLICKHOUSE)
    bootstrap = CdcBootstrapOperator(task_id="bootstrap", pipeline="shop_orders", sources=SHARDS, select=SELECT,
                                     merge_into="analytics_group.orders_live", **CLICKHOUSE)
    catch_up = CdcApplyOperator(task_id="catch_up", pipeline="shop_orders", sources=SHARDS,
                                merge_into="analytics_group.orders_live", **CLICKHOUSE)
    caught_up = BinlogPositionSensor(task_id="caught_up", pipeline="shop_orders", sources=SHARDS, poke_interval=2,
                                     timeout=600, deferrable=True, **CLICKHOUSE)
    load >> counters >> check >> bootstrap >> catch_up >> caught_up

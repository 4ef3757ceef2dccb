"""A whole database by pattern, two ways (docs/whole-databases.md).

``sync_demo_database``: one task loads every selected table of ``demo`` in one job (one driver,
``parallel_tables`` at a time; tables created later are taken on the next run), one task
reconciles them all with checksums. Fewest moving parts and the lowest cost per table: the way
for hundreds of small tables.

``sync_demo_database_mapped``: a discovery task resolves the same patterns; the load and the
reconciliation are mapped over its list, so the Airflow UI shows one task instance per table
(clear and retry one table alone). Each instance is a job of its own: a second or so per table
on a local master, more where spark-submit starts a JVM.

Connections as in example_full_load.py (``python -m devenv.demo`` sets them).
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG

from airflow_sync_provider.operators.full_load import FullLoadOperator
from airflow_sync_provider.operators.reconcile import ReconcileOperator
from airflow_sync_provider.operators.select_tables import SelectTablesOperator

CONNECTIONS = {"mysql_conn_id": "sync_mysql", "clickhouse_conn_id": "sync_clickhouse"}


def _select(target_database: str) -> dict:
    # every table of demo but the generator's helper; copies into their own database
    return {"databases": ["demo"], "tables": ["*"], "exclude_tables": ["_demo_*"],
            "target_database": target_database}


with DAG(
    dag_id="sync_demo_database",
    schedule=None,
    start_date=dt.datetime(2025, 1, 1),
    catchup=False,
    tags=["airflow-sync", "example"],
    doc_md=__doc__,
):
    load = FullLoadOperator(task_id="load_database", select=_select("demo_all"), parallel_tables=2, **CONNECTIONS)
    ReconcileOperator(
        task_id="reconcile_database",
        select=_select("demo_all"),
        load_key="{{ ti.xcom_pull(task_ids='load_database')['load_key'] }}",
        checksum=True,
        on_mismatch="reimport",
        **CONNECTIONS,
    ) << load


def _load_key(summary: dict) -> str:
    return summary["load_key"]


with DAG(
    dag_id="sync_demo_database_mapped",
    schedule=None,
    start_date=dt.datetime(2025, 1, 1),
    catchup=False,
    tags=["airflow-sync", "example"],
    doc_md=__doc__,
):
    tables = SelectTablesOperator(task_id="select_tables", select=_select("demo_mapped"),
                                  mysql_conn_id="sync_mysql")
    loads = FullLoadOperator.partial(task_id="load", **CONNECTIONS).expand_kwargs(tables.output)
    ReconcileOperator.partial(task_id="reconcile", checksum=True, on_mismatch="reimport", **CONNECTIONS).expand(
        load_key=loads.output.map(_load_key))

"""Job entry: reconcile a published load shard by shard (or the loads of many tables)."""

from airflow_sync_provider.spark.entry import run_job
from airflow_sync_provider.spark.reconcile import run_reconcile
from airflow_sync_provider.spark.tables import each_table

if __name__ == "__main__":
    run_job(each_table(run_reconcile))

"""spark-submit entry: reconcile a published load shard by shard."""

from airflow_sync_provider.spark.entry import run_job
from airflow_sync_provider.spark.reconcile import run_reconcile

if __name__ == "__main__":
    run_job(run_reconcile, lazy_session=True)

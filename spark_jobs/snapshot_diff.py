"""spark-submit entry: compare an old and a new snapshot by key; write (and apply) the change set."""

from airflow_sync_provider.spark.diff import run_snapshot_diff
from airflow_sync_provider.spark.entry import run_job

if __name__ == "__main__":
    run_job(run_snapshot_diff, lazy_session=True)

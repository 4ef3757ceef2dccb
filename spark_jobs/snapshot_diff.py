"""Job entry: compare an old and a new snapshot by key (or many tables with their copies); write
(and apply) the change set."""

from airflow_sync_provider.spark.diff import run_snapshot_diff
from airflow_sync_provider.spark.entry import run_job
from airflow_sync_provider.spark.tables import each_table

if __name__ == "__main__":
    run_job(each_table(run_snapshot_diff))

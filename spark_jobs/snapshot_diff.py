"""Job entry: compare an old and a new snapshot by key (or many tables with their copies, or a
source group's merged copy with its sources); write (and apply) the change set."""

from airflow_sync_provider.spark.diff import run_group_diff, run_snapshot_diff
from airflow_sync_provider.spark.entry import run_job
from airflow_sync_provider.spark.groups import each_group

if __name__ == "__main__":
    run_job(each_group(run_snapshot_diff, run_group_diff))

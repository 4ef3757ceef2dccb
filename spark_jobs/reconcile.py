"""Job entry: reconcile a published load (counts, optionally checksums) per shard; a job of many
tables' loads; or a source group's (sources: each member against its own source)."""

from airflow_sync_provider.spark.entry import run_job
from airflow_sync_provider.spark.groups import each_group
from airflow_sync_provider.spark.reconcile import run_group_reconcile, run_reconcile

if __name__ == "__main__":
    run_job(each_group(run_reconcile, run_group_reconcile))

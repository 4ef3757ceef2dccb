"""Job entry: apply a CDC pipeline's binlog changes to its ClickHouse copies (a source group's:
every source's pipeline)."""

from airflow_sync_provider.spark.cdc_apply import run_cdc_apply
from airflow_sync_provider.spark.cdc_group import in_group, run_group_apply
from airflow_sync_provider.spark.entry import run_job

if __name__ == "__main__":
    run_job(in_group(run_cdc_apply, run_group_apply))

"""Job entry: apply a CDC pipeline's binlog changes to its ClickHouse copies."""

from airflow_sync_provider.spark.cdc_apply import run_cdc_apply
from airflow_sync_provider.spark.entry import run_job

if __name__ == "__main__":
    run_job(run_cdc_apply)

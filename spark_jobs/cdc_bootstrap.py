"""Job entry: bootstrap a CDC pipeline's tables (chunked snapshot under live writes)."""

from airflow_sync_provider.spark.cdc_bootstrap import run_cdc_bootstrap
from airflow_sync_provider.spark.entry import run_job

if __name__ == "__main__":
    run_job(run_cdc_bootstrap)

"""Job entry: bootstrap a CDC pipeline's tables (chunked snapshot under live writes); a source
group's: every source's selected tables, merged into one copy."""

from airflow_sync_provider.spark.cdc_bootstrap import run_cdc_bootstrap
from airflow_sync_provider.spark.cdc_group import in_group, run_group_bootstrap
from airflow_sync_provider.spark.entry import run_job

if __name__ == "__main__":
    run_job(in_group(run_cdc_bootstrap, run_group_bootstrap))

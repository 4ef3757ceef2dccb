"""spark-submit entry: full load of one MySQL table into ClickHouse."""

from airflow_sync_provider.spark.entry import run_job
from airflow_sync_provider.spark.full_load import run_full_load

if __name__ == "__main__":
    run_job(run_full_load, lazy_session=True)

"""Job entry: full load of one MySQL table, or of many (select / tables), into ClickHouse."""

from airflow_sync_provider.spark.entry import run_job
from airflow_sync_provider.spark.full_load import run_full_load
from airflow_sync_provider.spark.tables import each_table

if __name__ == "__main__":
    run_job(each_table(run_full_load))

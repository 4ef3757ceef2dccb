"""Job entry: full load of one MySQL table, of many (select / tables), or of a source group's
(sources, merged into one copy with merge_into) into ClickHouse."""

from airflow_sync_provider.spark.entry import run_job
from airflow_sync_provider.spark.full_load import run_full_load
from airflow_sync_provider.spark.group_load import run_group_load
from airflow_sync_provider.spark.groups import each_group

if __name__ == "__main__":
    run_job(each_group(run_full_load, run_group_load))

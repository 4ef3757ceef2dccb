"""airflow-sync-provider: ClickHouse copies of MySQL tables, kept complete and current."""

__version__ = "0.1.0"


def get_provider_info() -> dict:
    return {
        "package-name": "airflow-sync-provider",
        "name": "Airflow Sync (MySQL → ClickHouse)",
        "description": "Full loads, reconciliation, snapshot diff and CDC from MySQL to ClickHouse as PySpark jobs.",
        "versions": [__version__],
        "operators": [
            {
                "integration-name": "MySQL to ClickHouse sync",
                "python-modules": [
                    "airflow_sync_provider.operators.spark_job",
                    "airflow_sync_provider.operators.full_load",
                    "airflow_sync_provider.operators.reconcile",
                    "airflow_sync_provider.operators.cdc_apply",
                    "airflow_sync_provider.operators.cdc_bootstrap",
                    "airflow_sync_provider.operators.snapshot_diff",
                    "airflow_sync_provider.operators.select_tables",
                ],
            }
        ],
        "sensors": [
            {
                "integration-name": "MySQL to ClickHouse sync",
                "python-modules": ["airflow_sync_provider.sensors.shard_counters",
                                   "airflow_sync_provider.sensors.binlog_position"],
            }
        ],
        "triggers": [
            {
                "integration-name": "MySQL to ClickHouse sync",
                "python-modules": ["airflow_sync_provider.triggers.shard_counters",
                                   "airflow_sync_provider.triggers.binlog_position"],
            }
        ],
        "hooks": [
            {
                "integration-name": "MySQL to ClickHouse sync",
                "python-modules": ["airflow_sync_provider.hooks.endpoints"],
            }
        ],
        "extra-links": ["airflow_sync_provider.links.SyncViewLink"],
        # No "plugins" here: the Sync view registers through the ``airflow.plugins`` entry point
        # (pyproject.toml), which Airflow loads whatever [core] lazy_discover_providers says; named here
        # too, an Airflow with eager discovery would load it twice and report "already registered".
        "integrations": [
            {
                "integration-name": "MySQL to ClickHouse sync",
                "external-doc-url": "https://clickhouse.com/docs/integrations/python",
                "tags": ["software"],
            }
        ],
    }

"""Environment for running Airflow (``airflow dags test``) against the local stand-ins."""

from __future__ import annotations

import json
import os
from pathlib import Path

from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint

REPO = Path(__file__).resolve().parent.parent


def connection_env(mysql_url: str, clickhouse_url: str, database: str = "demo", master: str = "local[2]") -> dict:
    """AIRFLOW_CONN_* variables (kept in the environment: never on a command line or on disk)."""
    mysql, ch = MySQLEndpoint.from_url(mysql_url), ClickHouseEndpoint.from_url(clickhouse_url)
    return {
        "AIRFLOW_CONN_SYNC_MYSQL": json.dumps({"conn_type": "mysql", "host": mysql.host, "port": mysql.port,
                                               "login": mysql.user, "password": mysql.password,
                                               "schema": database}),
        "AIRFLOW_CONN_SYNC_CLICKHOUSE": json.dumps({"conn_type": "clickhouse", "host": ch.host, "port": ch.port,
                                                    "login": ch.user, "password": ch.password,
                                                    "schema": ch.database, "extra": {"secure": ch.secure}}),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": master}),
    }


def shard_connections(urls: dict) -> dict:
    """A source group's connections (dags/example_source_group.py): ``sync_shard_<name>`` each."""
    env = {}
    for name, url in urls.items():
        mysql = MySQLEndpoint.from_url(url)
        env[f"AIRFLOW_CONN_SYNC_SHARD_{name.upper()}"] = json.dumps(
            {"conn_type": "mysql", "host": mysql.host, "port": mysql.port, "login": mysql.user,
             "password": mysql.password})
    return env


def airflow_env(home: str | os.PathLike, mysql_url: str, clickhouse_url: str, shards: dict | None = None) -> dict:
    env = dict(os.environ)
    env.update(connection_env(mysql_url, clickhouse_url))
    env.update(shard_connections(shards or {}))
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    })
    return env

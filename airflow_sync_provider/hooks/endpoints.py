"""Build source/target endpoints from Airflow connections of the ecosystem's own types, and
the checks the sensors and their triggers poll through them.

``mysql`` is the MySQL provider's connection type, ``clickhouse`` the official clickhousedb
provider's (host, port, login, password, schema = database), their extras read as those providers
document them (TLS included): what changes the jobs' sessions is honoured, what cannot be is refused
by name, the rest is logged as not applied (docs/connections.md).
"""

from __future__ import annotations

from airflow_sync_provider.compat import BaseHook
from airflow_sync_provider.core.cdc.checkpoints import check_group_position, check_position
from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
from airflow_sync_provider.core.ledger import DEFAULT_LEDGER_DATABASE, check_counters
from airflow_sync_provider.core.source.group import Source, check_sources
from airflow_sync_provider.stats import watch_pipeline


class SyncEndpointsHook(BaseHook):
    """Resolves the source (MySQL) and target (ClickHouse) connections of a sync job."""

    hook_name = "MySQL → ClickHouse sync endpoints"

    def __init__(self, mysql_conn_id: str = "mysql_default", clickhouse_conn_id: str = "clickhouse_default"):
        super().__init__()
        self.mysql_conn_id = mysql_conn_id
        self.clickhouse_conn_id = clickhouse_conn_id

    def source(self) -> MySQLEndpoint:
        conn = self.get_connection(self.mysql_conn_id)
        return MySQLEndpoint.from_connection(
            conn.host or "127.0.0.1", int(conn.port or 3306), conn.login or "root", conn.password or "",
            conn.schema or "", conn.extra_dejson, f"connection {self.mysql_conn_id!r} (mysql)")

    def sources(self, entries: list) -> list[Source]:
        """A source group's sources from ``[{"name": "s0", "mysql_conn_id": "shard0"}, …]``, each
        connection read as :meth:`source` reads one."""
        group = []
        for entry in entries:
            unknown = set(entry) - {"name", "mysql_conn_id"}
            if unknown or "name" not in entry or "mysql_conn_id" not in entry:
                raise ValueError(f"source {entry!r}: give each as {{'name': …, 'mysql_conn_id': …}}"
                                 + (f" (unknown keys {sorted(unknown)})" if unknown else ""))
            group.append(Source(entry["name"], SyncEndpointsHook(entry["mysql_conn_id"],
                                                                 self.clickhouse_conn_id).source()))
        check_sources(group)
        return group

    def target(self) -> ClickHouseEndpoint:
        conn = self.get_connection(self.clickhouse_conn_id)
        return ClickHouseEndpoint.from_connection(
            conn.host or "127.0.0.1", int(conn.port) if conn.port else None, conn.login or "default",
            conn.password or "", conn.schema or "default", conn.extra_dejson,
            f"connection {self.clickhouse_conn_id!r} (clickhouse)")

    def group_position_check(self, pipeline: str, sources: list, positions: dict | None,
                             max_lag_seconds: float | None, ledger_database: str = DEFAULT_LEDGER_DATABASE
                             ) -> tuple[str, str, dict]:
        """:meth:`binlog_position_check` of a source group's pipeline: every source's (``sources``
        as operators take them; ``positions``: per source name)."""
        group = {s.name: s.endpoint for s in self.sources(sources)}
        return check_group_position(self.target(), pipeline, group, positions, max_lag_seconds, ledger_database)

    def group_positions(self, sources: list, ledger_database: str = DEFAULT_LEDGER_DATABASE) -> dict:
        """Every source's binlog position now (:meth:`source_position` of each)."""
        return {s["name"]: SyncEndpointsHook(s["mysql_conn_id"], self.clickhouse_conn_id).source_position(
            ledger_database) for s in sources}

    def binlog_position_check(self, pipeline: str, position: dict | str | None, max_lag_seconds: float | None,
                              ledger_database: str = DEFAULT_LEDGER_DATABASE) -> tuple[str, str, dict]:
        """Has ``pipeline``'s applied checkpoint reached ``position`` (or is its lag under
        ``max_lag_seconds``)? ``(verdict, message, summary)``: ``BinlogPositionSensor``'s poke and
        its trigger's. While it watches, the pipeline's gauges go to Airflow's metrics
        (docs/metrics.md): from the worker on each poke, from the triggerer while deferred."""
        source = self.source() if max_lag_seconds is not None else None
        target = self.target()
        verdict, message, summary = check_position(target, pipeline, position, max_lag_seconds, source,
                                                   ledger_database)
        watch_pipeline(target, pipeline, ledger_database, measured_lag=summary.get("lag_seconds"))
        return verdict, message, summary

    def source_position(self, ledger_database: str = DEFAULT_LEDGER_DATABASE) -> dict:
        """The source's binlog position now, with its GTID state and its server's epoch."""
        from airflow_sync_provider.core.cdc.servers import source_epoch
        from airflow_sync_provider.core.clickhouse.client import client
        from airflow_sync_provider.core.positions import current_position
        from airflow_sync_provider.core.source.reader import connect

        ch = client(self.target())
        try:
            with connect(self.source()) as conn:
                return current_position(conn, epoch=source_epoch(conn, ch, ledger_database)).to_dict()
        finally:
            ch.close()

    def shard_counters_check(self, load_key: str, ledger_database: str = DEFAULT_LEDGER_DATABASE
                             ) -> tuple[str, str, dict]:
        """The hook counters' verdict on ``load_key`` (``ShardCountersSensor``'s poke and its trigger's)."""
        return check_counters(self.target(), load_key, ledger_database)


def spark_deployment(spark_conn_id: str) -> dict:
    """``{"master", "deploy_mode"}`` of a ``spark`` connection as the Spark provider's
    ``SparkSubmitHook`` resolves them (``yarn`` when the connection does not exist, the deploy mode
    from the extra ``deploy-mode``): the hook that submits the job decides, nothing here re-reads
    the connection."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    # The hook keeps its resolution only in ``_connection`` (no public accessor): read just its
    # ``master`` / ``deploy_mode`` keys, which every version of the hook has used; the provider's
    # version is pinned in pyproject.toml and tests/test_deployments.py checks each form against it.
    resolved = SparkSubmitHook(conn_id=spark_conn_id)._connection
    return {"master": resolved["master"], "deploy_mode": resolved["deploy_mode"]}

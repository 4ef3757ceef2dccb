from __future__ import annotations

from airflow_sync_provider.core.jobspec import FullLoadSpec
from airflow_sync_provider.core.planning import DEFAULT_SPLIT_FACTOR
from airflow_sync_provider.hooks.endpoints import SyncEndpointsHook
from airflow_sync_provider.operators.spark_job import SparkJobOperator


class FullLoadOperator(SparkJobOperator):
    """Copy one MySQL table into ClickHouse (ReplacingMergeTree keyed by the primary key).

    The new copy is built in a shadow table and swapped in atomically.

    :param table: source table name.
    :param source_database: defaults to the MySQL connection's schema.
    :param target_database: defaults to the ClickHouse connection's schema, then the source database.
    :param target_table: defaults to ``table``.
    :param channels: concurrent source connections (= concurrent Spark tasks); derived from the
        speed limits instead when a global limit is set (DataX: global ÷ per-channel).
    :param batch_rows: rows per Arrow batch written to ClickHouse.
    :param split_column: column to shard on (default: primary key → unique → plain index).
    :param split_factor: shards per channel (DataX default 5); a NULL shard is added.
    :param strategy: ``balanced`` (index-ordered bounds, even shards) or ``equal`` (equal widths).
    :param byte_speed, record_speed: global limits (bytes/s, records/s).
    :param channel_byte_speed, channel_record_speed: per-channel limits.
    """

    job = "full_load"
    template_fields = ("table", "source_database", "target_database", "target_table", "split_column")

    def __init__(self, *, table: str, mysql_conn_id: str = "mysql_default",
                 clickhouse_conn_id: str = "clickhouse_default", source_database: str | None = None,
                 target_database: str | None = None, target_table: str | None = None,
                 channels: int | None = 2, batch_rows: int = 65536, split_column: str | None = None,
                 split_factor: int = DEFAULT_SPLIT_FACTOR, strategy: str = "balanced",
                 byte_speed: int | None = None, record_speed: int | None = None,
                 channel_byte_speed: int | None = None, channel_record_speed: int | None = None, **kwargs):
        super().__init__(**kwargs)
        self.table = table
        self.mysql_conn_id = mysql_conn_id
        self.clickhouse_conn_id = clickhouse_conn_id
        self.source_database = source_database
        self.target_database = target_database
        self.target_table = target_table
        self.channels = channels
        self.batch_rows = batch_rows
        self.split_column = split_column
        self.split_factor = split_factor
        self.strategy = strategy
        self.byte_speed = byte_speed
        self.record_speed = record_speed
        self.channel_byte_speed = channel_byte_speed
        self.channel_record_speed = channel_record_speed

    def build_spec(self, context) -> FullLoadSpec:
        hook = SyncEndpointsHook(self.mysql_conn_id, self.clickhouse_conn_id)
        source, target = hook.source(), hook.target()
        source_db = self.source_database or source.database
        if not source_db:
            raise ValueError(f"table {self.table!r}: no source database (set source_database or the "
                             f"schema of connection {self.mysql_conn_id!r})")
        target_db = self.target_database or (target.database if target.database != "default" else source_db)
        return FullLoadSpec(source=source, target=target, source_database=source_db, source_table=self.table,
                            target_database=target_db, target_table=self.target_table or self.table,
                            channels=self.channels, batch_rows=self.batch_rows, split_column=self.split_column,
                            split_factor=self.split_factor, strategy=self.strategy, byte_speed=self.byte_speed,
                            record_speed=self.record_speed, channel_byte_speed=self.channel_byte_speed,
                            channel_record_speed=self.channel_record_speed)

    def summarize(self, result: dict) -> dict:
        rows = [(s["shard"], s["rows"], s["seconds"]) for s in result["shards"]]
        for warning in result.get("warnings", []):
            self.log.warning("%s", warning)
        self.log.info("Loaded %s → %s: %d rows in %d shards, %.1f s", result["table"], result["target"],
                      result["rows"], len(rows), result["seconds"])
        return {"table": result["table"], "target": result["target"], "rows": result["rows"],
                "shards": len(rows), "channels": result["channels"], "split_column": result["split_column"],
                "strategy": result["strategy"], "seconds": result["seconds"]}

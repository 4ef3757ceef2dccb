"""Full load: shards read by ``channels`` concurrent Spark tasks, written as Arrow batches."""

from __future__ import annotations

import time

from airflow_sync_provider.core import clickhouse_target as target
from airflow_sync_provider.core import mysql_reader
from airflow_sync_provider.core.jobspec import FullLoadSpec
from airflow_sync_provider.core.mysql_schema import read_table_schema
from airflow_sync_provider.core.planning import plan_table
from airflow_sync_provider.core.sql import ch_ident, ch_table

def _load_channel(spec: FullLoadSpec, plan, mappings, shards, version: int):
    """Runs on an executor: one channel = one source connection, draining its queue of shards."""
    import pyarrow as pa

    ch = target.client(spec.target)
    shadow = target.shadow_name(spec.target_table)
    column_names = [m.name for m in mappings] + [target.VERSION_COLUMN]
    for shard in shards:
        started, rows = time.time(), 0
        for batch in mysql_reader.read_shard(spec.source, plan, mappings, shard, spec.batch_rows):
            table = pa.Table.from_batches([batch]).append_column(
                target.VERSION_COLUMN, pa.array([version] * batch.num_rows, pa.uint64()))
            ch.insert_arrow(shadow, table.rename_columns(column_names), database=spec.target_database)
            rows += batch.num_rows
        yield {"shard": shard.id, "rows": rows, "seconds": round(time.time() - started, 3)}
    ch.close()


def run_full_load(spec: FullLoadSpec, spark) -> dict:
    started = time.time()
    with mysql_reader.connect(spec.source) as conn:
        schema = read_table_schema(conn, spec.source_database, spec.source_table)
        mappings = schema.mappings()
        plan = plan_table(conn, schema, speed=spec.speed(), split_column=spec.split_column,
                          split_factor=spec.split_factor, strategy=spec.strategy)
    shards = list(plan.shards)
    ch = target.client(spec.target)
    ch.command(f"CREATE DATABASE IF NOT EXISTS {ch_ident(spec.target_database)}")
    shadow = target.shadow_name(spec.target_table)
    ch.command(f"DROP TABLE IF EXISTS {ch_table(spec.target_database, shadow)}")
    ch.command(target.create_table_sql(schema, spec.target_database, shadow))

    version = time.time_ns()  # a later load's rows replace an earlier load's
    channels = min(plan.channels, len(shards))
    queues = [shards[i::channels] for i in range(channels)]  # round-robin, like DataX task groups
    per_shard = (
        spark.sparkContext.parallelize(queues, channels)
        .mapPartitions(lambda qs: (r for q in qs for r in _load_channel(spec, plan, mappings, q, version)))
        .collect()
    )
    written = sum(r["rows"] for r in per_shard)
    landed = ch.command(f"SELECT count() FROM {ch_table(spec.target_database, shadow)}")
    if int(landed) != written:
        raise RuntimeError(f"table {schema.qualified}: {written} rows written but {landed} landed in "
                           f"{spec.target_database}.{shadow}; not publishing")
    target.publish_shadow(ch, spec.target_database, spec.target_table)
    ch.close()
    return {
        "table": schema.qualified,
        "target": f"{spec.target_database}.{spec.target_table}",
        "rows": written,
        "shards": sorted(per_shard, key=lambda r: r["shard"]),
        "channels": channels,
        "split_column": plan.split_column,
        "strategy": plan.strategy,
        "warnings": list(plan.warnings),
        "seconds": round(time.time() - started, 3),
    }

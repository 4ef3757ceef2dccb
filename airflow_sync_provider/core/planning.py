"""Shard planning. Walking-skeleton version: equal integer ranges on the first key column.

A shard is a WHERE clause with ``%s`` placeholders and its parameters, so it is always
executed with bound values.
"""

from __future__ import annotations

from dataclasses import dataclass

from airflow_sync_provider.core.sql import mysql_ident

_INTEGER_TYPES = {"tinyint", "smallint", "mediumint", "int", "integer", "bigint"}


@dataclass(frozen=True)
class Shard:
    id: int
    where: str
    params: tuple = ()


def integer_ranges(column: str, lo: int, hi: int, count: int) -> list[Shard]:
    """``count`` contiguous ranges covering [lo, hi] exactly, plus an IS NULL shard."""
    col = mysql_ident(column)
    span = hi - lo + 1
    count = max(1, min(count, span))
    bounds = [lo + span * i // count for i in range(count)] + [hi + 1]
    shards = [
        Shard(i, f"{col} >= %s AND {col} < %s", (bounds[i], bounds[i + 1])) for i in range(count - 1)
    ]
    shards.append(Shard(count - 1, f"{col} >= %s AND {col} <= %s", (bounds[count - 1], hi)))
    shards.append(Shard(count, f"{col} IS NULL"))
    return shards


def plan_shards(schema, conn, count: int) -> list[Shard]:
    """Integer ranges on the first primary-key column, else one shard of the whole table."""
    if schema.primary_key and schema.column(schema.primary_key[0]).data_type in _INTEGER_TYPES:
        key = schema.primary_key[0]
        with conn.cursor() as cur:
            cur.execute(f"SELECT MIN({mysql_ident(key)}), MAX({mysql_ident(key)}) FROM "
                        f"{mysql_ident(schema.database)}.{mysql_ident(schema.table)}")
            lo, hi = cur.fetchone()
        if lo is not None:
            return integer_ranges(key, int(lo), int(hi), count)
    return [Shard(0, "1=1")]

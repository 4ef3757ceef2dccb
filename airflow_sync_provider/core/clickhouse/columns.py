"""The columns a copy keeps for itself (version, tombstone, shard, sign, …) and the comment mark of
its version scheme: the names every writer and check of a copy agrees on."""

from __future__ import annotations

from airflow_sync_provider.core.content.shaping import DELETED_AT_SOURCE
from airflow_sync_provider.core.positions import SCHEME
from airflow_sync_provider.core.source.schema import TableSchema
from airflow_sync_provider.core.source.weights import SPLIT_WEIGHT_COLUMN
from airflow_sync_provider.core.sql import ch_string

VERSION_COLUMN = "_version"


SHARD_COLUMN = "_shard"


DELETED_COLUMN = "_deleted"


# A table without a primary key followed by CDC is a multiset: every row of its copy is a signed
# occurrence (+1 a row that came, -1 one that went), told apart by (_version, _ordinal), so a
# replayed change is the same row again and FINAL counts it once; the table is
# SELECT cols, sum(_sign) … GROUP BY cols (docs/keyless-tables.md)
SIGN_COLUMN, ORDINAL_COLUMN = "_sign", "_ordinal"


# Columns the target tables use for themselves (and ClickHouse's _partition_id, which period
# reconciliation reads): a source column of the same name would collide with them.
INTERNAL_COLUMNS = (VERSION_COLUMN, DELETED_COLUMN, SPLIT_WEIGHT_COLUMN, SHARD_COLUMN, DELETED_AT_SOURCE,
                    SIGN_COLUMN, ORDINAL_COLUMN, "_partition_id")


TABLE_COMMENT = f"airflow_sync version={SCHEME}"  # what a table's _version means (core/positions.py)


class ReservedColumn(ValueError):
    retry_helps = False  # core/failures.py: the message says what to change


def check_columns(schema: TableSchema) -> None:
    """Refuse source columns named like the target's internal columns, before any work is done."""
    clash = [c.name for c in schema.columns if c.name in INTERNAL_COLUMNS]
    if clash:
        keyed = [c for c in clash if c in schema.primary_key]
        remedy = ("load through a view that renames them (key columns cannot be left out)" if keyed else
                  f"leave them out (exclude_columns={clash!r} / --exclude-column) or load through a view that "
                  "renames them")
        raise ReservedColumn(f"table {schema.qualified}: column(s) {clash} have the names of the target's internal "
                             f"columns {list(INTERNAL_COLUMNS)}; {remedy}")


# Writing the hidden weight column (MATERIALIZED: not in SELECT *, '' when a writer omits it).
WEIGHT_SETTINGS = {"insert_allow_materialized_columns": 1}


# The columns writers write, of system.columns: not those ClickHouse derives itself
# (MATERIALIZED: core/clickhouse/derived.py), but the hidden weight column, which writers carry.
WRITTEN = f"(default_kind != 'MATERIALIZED' OR name = {ch_string(SPLIT_WEIGHT_COLUMN)})"

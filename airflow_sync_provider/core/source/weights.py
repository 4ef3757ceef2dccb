"""A collated split column's order, as MySQL knows it: ``WEIGHT_STRING``.

Strings under a collation are compared by MySQL by collation (case/accent-insensitive, PAD
SPACE), by ClickHouse as bytes. A load split on such a column also stores each row's sort key,
MySQL's ``WEIGHT_STRING(col)``, in a hidden column of the copy (``SPLIT_WEIGHT_COLUMN``); bytes
of weights order as the collation orders strings. The cuts' weights come from MySQL too
(core/clickhouse/shards.py compares them on the copy).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from airflow_sync_provider.core.sql import mysql_ident
from airflow_sync_provider.core.typemap import MySQLColumn

SPLIT_WEIGHT_COLUMN = "_split_weight"

_COLLATED = {"char", "varchar", "tinytext", "text", "mediumtext", "longtext"}
_NAME = re.compile(r"^[A-Za-z0-9_]+$")


class NotComparable(ValueError):
    pass


def needs_weight(column: MySQLColumn | None) -> bool:
    """Is ``column`` a split column whose rows must carry their collation weight?"""
    return column is not None and column.data_type in _COLLATED and column.collation is not None


def mysql_weight_sql(column: MySQLColumn) -> str:
    return f"WEIGHT_STRING({mysql_ident(column.name)})"


def _collated(column: MySQLColumn, value_sql: str) -> str:
    for name in (column.charset, column.collation):
        if not _NAME.match(name or ""):
            raise NotComparable(f"column {column.name!r}: unexpected character set/collation {name!r}")
    return f"CAST({value_sql} AS CHAR CHARACTER SET {column.charset}) COLLATE {column.collation}"


@dataclass(frozen=True)
class Weights:
    """What MySQL says about a collated split column: the cuts' weights and padding."""

    cuts: list[bytes] = field(default_factory=list)
    space: bytes | None = None  # the space's weight for PAD SPACE collations, None for NO PAD


def read_weights(conn, column: MySQLColumn, cuts: list) -> Weights:
    """Ask MySQL (pymysql connection) for the cut points' weights and whether the collation pads."""
    with conn.cursor() as cur:
        cur.execute(f"SELECT {_collated(column, '%s')} = {_collated(column, '%s')},"
                    f" WEIGHT_STRING({_collated(column, '%s')} AS CHAR(1))", ("a", "a ", ""))
        pads, space = cur.fetchone()
        weights = []
        for cut in cuts:
            cur.execute(f"SELECT WEIGHT_STRING({_collated(column, '%s')})", (cut,))
            weights.append(bytes(cur.fetchone()[0]))
    return Weights(weights, bytes(space) if pads else None)


def weights_of(conn, column: MySQLColumn, values: list, chunk: int = 500) -> list[bytes]:
    """MySQL's ``WEIGHT_STRING`` of each value under ``column``'s collation (b'' for NULL): what
    a full load stores in ``_split_weight``, for rows written by CDC (pymysql connection)."""
    out: list[bytes] = []
    expr = f"COALESCE(WEIGHT_STRING({_collated(column, '%s')}), '')"
    with conn.cursor() as cur:
        for start in range(0, len(values), chunk):
            part = values[start:start + chunk]
            cur.execute("SELECT " + ", ".join([expr] * len(part)), part)
            out += [bytes(w) for w in cur.fetchone()]
    return out

"""Primary-key chunks for the CDC bootstrap (DBLog / Debezium incremental snapshots).

A shard of the planner is read as a sequence of chunks, each ``ORDER BY <primary key> LIMIT n``
after the previous chunk's last key, each in a consistent snapshot of its own (so no read view
is held for long on a busy primary). The "after the last key" predicate is the expanded
keyset form, led by a range on the first column so the index is used:

    k1 >= %s AND (k1 > %s OR (k1 = %s AND (k2 > %s OR (k2 = %s AND k3 > %s))))

Every comparison and the ORDER BY are made by the database with the columns' own collations,
so case/accent/PAD SPACE variants and 4-byte characters page exactly as MySQL orders them; the
last key is read back raw (not through the type rules' conversions) and bound as a value of
its own type. Key types whose ``>`` and ``ORDER BY`` disagree or whose text form is not exact
(ENUM/SET order by index but compare as strings; FLOAT/DOUBLE) are refused.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from decimal import Decimal

from airflow_sync_provider.core.clickhouse.columns import ReservedColumn, check_columns
from airflow_sync_provider.core.source.schema import TableSchema
from airflow_sync_provider.core.sql import mysql_ident
from airflow_sync_provider.core.typemap import MySQLColumn, UnsupportedType

_INTEGER = {"tinyint", "smallint", "mediumint", "int", "integer", "bigint", "year"}
_DECIMAL = {"decimal", "numeric"}
_TEXT = {"char", "varchar"}
_BYTES = {"binary", "varbinary"}
_TEMPORAL = {"date", "datetime", "timestamp", "time"}


# A chunk is one reader query, and connectorx buffers a query's whole result when writing lags
# (core/source/planning.py, pieces): chunks of wide rows are cut to about this many bytes.
CHUNK_BYTES = 32 * 1024 * 1024


def chunk_rows(configured: int, row_bytes: int) -> int:
    """Rows per chunk: ``configured``, fewer for rows so wide that a chunk would pass
    :data:`CHUNK_BYTES` (``row_bytes``: InnoDB's average row length, 0 when unknown)."""
    return max(1, min(configured, CHUNK_BYTES // row_bytes)) if row_bytes > 0 else configured


class UnchunkableTable(ValueError):
    """A table the bootstrap cannot chunk (the message says why and what to do)."""

    retry_helps = False


def streaming_problem(schema: TableSchema) -> str | None:
    """Why a table cannot be bootstrapped and streamed by CDC, with the remedy (None: it can)."""
    try:
        ChunkKey.of(schema)
        schema.mappings()
        check_columns(schema)
    except (UnchunkableTable, UnsupportedType, ReservedColumn) as exc:
        return str(exc)
    return None


@dataclass(frozen=True)
class ChunkKey:
    """The primary key a table is chunked by (columns in index order)."""

    table: str  # db.table, for messages
    columns: tuple[MySQLColumn, ...]

    @classmethod
    def of(cls, schema: TableSchema) -> "ChunkKey":
        if not schema.primary_key:  # one chunk, one snapshot: its copy a multiset (docs/keyless-tables.md)
            return cls(schema.qualified, ())
        columns = tuple(schema.column(name) for name in schema.primary_key)
        for col in columns:
            if col.data_type not in _INTEGER | _DECIMAL | _TEXT | _BYTES | _TEMPORAL:
                raise UnchunkableTable(f"table {schema.qualified}: primary key column {col.name!r} is "
                                       f"{col.column_type}, which cannot be paged through exactly (ENUM/SET sort by "
                                       "index but compare as text; FLOAT/DOUBLE/BIT have no exact text form); copy "
                                       "the table with FullLoadOperator")
        return cls(schema.qualified, columns)

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    @property
    def keyless(self) -> bool:
        """A table without a primary key: read whole in one snapshot (no order, no resume point)."""
        return not self.columns

    def order_by(self) -> str:
        return ", ".join(mysql_ident(c.name) for c in self.columns)

    def raw_select(self) -> str:
        """The key columns as stored (appended to a chunk's SELECT list, read back by ``from_raw``)."""
        return ", ".join(mysql_ident(c.name) for c in self.columns)

    def native_raw_select(self) -> str:
        """:meth:`raw_select` for the Arrow-native reader: what mysqlclient would return (text,
        except integers and bytes), so :meth:`from_raw` reads both alike."""
        return ", ".join(mysql_ident(c.name) if c.data_type in _INTEGER | _BYTES
                         else f"CAST({mysql_ident(c.name)} AS CHAR)" for c in self.columns)

    def after(self, last: list | None) -> tuple[str, tuple]:
        """(SQL, params): rows whose key sorts after ``last`` (everything when None)."""
        if last is None:
            return "1=1", ()
        names = [mysql_ident(c.name) for c in self.columns]
        sql, params = f"{names[-1]} > %s", [last[-1]]
        for name, value in zip(reversed(names[:-1]), reversed(last[:-1])):
            sql, params = f"{name} > %s OR ({name} = %s AND ({sql}))", [value, value, *params]
        return f"{names[0]} >= %s AND ({sql})", (last[0], *params)

    def from_raw(self, values) -> list:
        """A key read by a ``conv={}`` mysqlclient connection (bytes or str) → bindable values."""
        out = []
        for col, value in zip(self.columns, values):
            if isinstance(value, bytes) and col.data_type not in _BYTES:
                value = value.decode()
            if col.data_type in _INTEGER:
                value = int(value)
            elif col.data_type in _DECIMAL:
                value = Decimal(value)
            out.append(value)
        return out

    def encode(self, key: list | None):
        """A key as JSON for the ledger (binary keys as base64, decimals as text)."""
        if key is None:
            return None
        return [{"b64": base64.b64encode(v).decode()} if isinstance(v, bytes) else str(v) if isinstance(v, Decimal)
                else v for v in key]

    def decode(self, stored) -> list | None:
        if stored is None:
            return None
        out = []
        for col, value in zip(self.columns, stored):
            if isinstance(value, dict):
                value = base64.b64decode(value["b64"])
            elif col.data_type in _DECIMAL:
                value = Decimal(value)
            out.append(value)
        return out

"""A multiset copy: a table without a primary key followed by CDC (docs/keyless-tables.md).

Every row of the copy is a signed occurrence (``_sign`` +1 or -1, core/clickhouse/columns.py),
told apart by ``(_version, _ordinal)``; the table is each distinct row as often as its signs add
up to (``FINAL`` only removes a change written twice). Here: what removes rows from one
(:func:`drop_before` a snapshot that holds them, :func:`empty` for a TRUNCATE), and its
difference with the source's rows put beside it (:class:`Beside`, :func:`differences`,
:func:`write_differences`), which the verification's repair and the snapshot diff both use.
"""

from __future__ import annotations

import time

from airflow_sync_provider.core.clickhouse.client import shared_client
from airflow_sync_provider.core.clickhouse.columns import ORDINAL_COLUMN, SIGN_COLUMN, VERSION_COLUMN
from airflow_sync_provider.core.clickhouse.ddl import private_name
from airflow_sync_provider.core.clickhouse.inserts import ArrowInserts
from airflow_sync_provider.core.sql import ch_ident, ch_table

_SIGN, _VERSION, _ORDINAL = ch_ident(SIGN_COLUMN), ch_ident(VERSION_COLUMN), ch_ident(ORDINAL_COLUMN)


def drop_before(ch, database: str, table: str, position, where: str = "1", params: dict | None = None) -> None:
    """The copy's rows ranked below a snapshot read at ``position`` (a BinlogPosition): older reads
    and the changes before it, which the snapshot holds already (its own rows rank exactly at its
    version and stay). A multiset's rows add up, so they must go."""
    ch.command(f"DELETE FROM {ch_table(database, table)} WHERE {_VERSION} < {{v:UInt64}} AND {where}",
               parameters={**(params or {}), "v": position.snapshot_version()})


def empty(ch, database: str, table: str, columns: list[str], position) -> int:
    """The copy emptied at ``position`` (a TRUNCATE): a -1 for every occurrence it holds below it,
    ranked at the position, numbered in the rows' order (a replay writes the same rows). Returns
    the occurrences removed."""
    names = ", ".join(map(ch_ident, columns))
    version, copy = position.snapshot_version(), ch_table(database, table)
    held = (f"SELECT {names}, j FROM (SELECT {names}, sum({_SIGN}) AS n FROM {copy} FINAL "
            f"WHERE {_VERSION} < {version} GROUP BY {names} HAVING n > 0) ARRAY JOIN range(n) AS j")
    rows = int(ch.command(f"SELECT count() FROM ({held})"))
    ch.command(f"INSERT INTO {copy} ({names}, {_VERSION}, {_ORDINAL}, {_SIGN}) SELECT {names}, {version}, "
               f"row_number() OVER (ORDER BY {names}, j) - 1, -1 FROM ({held})")
    return rows


class Beside:
    """A plain table beside the copy with the copy's ``columns``, filled with source rows (Arrow
    batches streamed in: no Python holds them), dropped on exit."""

    def __init__(self, ch, endpoint, database: str, copy: str, columns: list[str], owner: str):
        self.ch, self.endpoint, self.columns = ch, endpoint, columns
        self.copy = ch_table(database, copy)
        self.name = ch_table(database, private_name(copy, "beside", owner))

    def __enter__(self) -> Beside:
        self.ch.command(f"DROP TABLE IF EXISTS {self.name}")
        self.ch.command(f"CREATE TABLE {self.name} ENGINE = MergeTree ORDER BY tuple() AS SELECT "
                        f"{', '.join(map(ch_ident, self.columns))} FROM {self.copy} WHERE 0")
        return self

    def fill(self, batches) -> None:
        inserts = ArrowInserts(shared_client(self.endpoint), self.name, compression=self.endpoint.insert_compression)
        try:
            for batch in batches:
                inserts.write(batch)
            inserts.finish()
        finally:
            inserts.close()

    def __exit__(self, *exc) -> None:
        self.ch.command(f"DROP TABLE IF EXISTS {self.name}")

    def counts(self, where: str = "1", below: int | None = None) -> str:
        """Per distinct row: how often the source holds it (``n_new``) and the copy (``n_old``: its
        rows matching ``where``, ranked below ``below`` — the copy as of a snapshot — when given)."""
        names = ", ".join(map(ch_ident, self.columns))
        ranked = f"{_VERSION} < {int(below)} AND " if below is not None else ""
        return (f"SELECT {names}, sum(s) AS n_new, sum(c) AS n_old FROM ("
                f"SELECT {names}, toInt64(1) AS s, toInt64(0) AS c FROM {self.name} UNION ALL "
                f"SELECT {names}, toInt64(0) AS s, toInt64({_SIGN}) AS c FROM {self.copy} FINAL WHERE {ranked}{where}) "
                f"GROUP BY {names}")

    def differences(self, where: str = "1", below: int | None = None) -> str:
        """Every occurrence the two differ by: the row, ``d`` (+ the copy lacks it, - it has it too
        often) and ``j``, its number among the row's (a query of :meth:`counts`' parameters)."""
        names = ", ".join(map(ch_ident, self.columns))
        return (f"SELECT {names}, d, j FROM (SELECT {names}, n_new - n_old AS d FROM ({self.counts(where, below)}) "
                "WHERE d != 0) ARRAY JOIN range(toUInt64(abs(d))) AS j")

    def write_differences(self, differences: str, version: int, params: dict | None = None) -> int:
        """The copy brought level: +1 per occurrence it lacks, -1 per one too many, at ``version``.
        A repair or a diff's apply is not replayed, so its ordinals only need to differ from
        another's at the same version: they start at the clock. Returns the occurrences written."""
        names = ", ".join(map(ch_ident, self.columns))
        written = int(self.ch.command(f"SELECT count() FROM ({differences})", parameters=params or {}) or 0)
        if written:
            base = time.time_ns() % (1 << 40) << 20
            self.ch.command(f"INSERT INTO {self.copy} ({names}, {_VERSION}, {_ORDINAL}, {_SIGN}) SELECT {names}, "
                            f"{int(version)}, {base} + row_number() OVER (ORDER BY {names}, j), if(d > 0, 1, -1) "
                            f"FROM ({differences})", parameters=params or {})
        return written

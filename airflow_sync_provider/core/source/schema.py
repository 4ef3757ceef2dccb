"""Read a MySQL table's columns and keys from information_schema (pymysql, bound values)."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field

from airflow_sync_provider.core.content import ContentError
from airflow_sync_provider.core.content.row_filter import RowFilter
from airflow_sync_provider.core.content.shaping import NONE, Content, refuse_history
from airflow_sync_provider.core.content.transforms import Transform
from airflow_sync_provider.core.positions import grant
from airflow_sync_provider.core.sql import mysql_ident
from airflow_sync_provider.core.typemap import ColumnMapping, MySQLColumn, map_column


class TableNotFound(LookupError):
    retry_helps = False  # core/failures.py: the table must exist (or be visible to the user) first


@dataclass(frozen=True)
class Index:
    name: str
    columns: tuple[str, ...]
    unique: bool


@dataclass(frozen=True)
class TableSchema:
    database: str
    table: str
    columns: tuple[MySQLColumn, ...]
    primary_key: tuple[str, ...]
    indexes: tuple[Index, ...] = ()  # PRIMARY first, then in information_schema order
    # what the copy holds of it (core/content/): transforms, row filter, delete rule; the salt a
    # hash transform needs (a secret: never shown, never compared)
    content: Content = NONE
    salt: bytes = field(default=b"", repr=False, compare=False)

    @property
    def qualified(self) -> str:
        return f"{self.database}.{self.table}"

    def mappings(self) -> list[ColumnMapping]:
        """Each column's mapping: its type rule, and its content transform if it has one."""
        transforms = dict(self.content.transform)
        return [map_column(c, self.qualified) if c.name not in transforms else
                dataclasses.replace(map_column(c, self.qualified), transform=Transform.parse(transforms[c.name]),
                                    salt=self.salt)
                for c in self.columns]

    @functools.cached_property
    def row_filter(self) -> RowFilter | None:
        """The rows the copy holds (None: all of them)."""
        if not self.content.row_filter:
            return None
        return RowFilter.parse(self.content.row_filter, self.columns, f"table {self.qualified}")

    def shaped(self, content: Content | dict | None, salt: bytes = b"", writer: str = "") -> "TableSchema":
        """The table as a copy with these content settings holds it (after :meth:`select`): each
        transform checked against its column, the filter against the table's columns; a history
        refused unless ``writer`` writes one (core/content/shaping.refuse_history)."""
        content = Content.of(content, f"table {self.qualified}: ")
        if not content:
            return self
        refuse_history(content, self.qualified, writer)  # only some writers write a history yet (issue 61)
        shaped = dataclasses.replace(self, content=content, salt=salt)
        names = [c.name for c in self.columns]
        for name, _ in content.transform:
            if name not in names:
                raise ContentError(f"table {self.qualified}: transform of column {name!r}, which the copy does not "
                                   f"hold (columns: {', '.join(names)})")
        if content.hashes and not salt:
            raise ContentError(f"table {self.qualified}: a hash transform needs a salt: give hash_salt_env= (an "
                               "environment variable's name) or hash_salt_conn_id= (an Airflow connection whose "
                               "password is the salt); on the command line --hash-salt-env NAME")
        keyed = [name for name, _ in content.transform if name in self.primary_key]
        if keyed:
            # a hashed key would stay unique, but the copy is cut, resumed and verified by ranges of
            # the key's values, which a hash does not keep
            raise ContentError(f"table {self.qualified}: key column(s) {keyed} cannot be transformed: shards, "
                               "resumed chunks and rolling verification find a key's rows by ranges of its values, "
                               "which a transform does not keep; leave the key as it is (transform other columns)")
        for mapping in shaped.mappings():
            if mapping.transform is not None:
                mapping.transform.check(mapping, mapping.name in self.primary_key, f"table {self.qualified}")
        shaped.row_filter  # noqa: B018 - parsed here: an expression it cannot evaluate exactly fails before any work
        return shaped

    @property
    def target_key(self) -> tuple[str, ...]:
        """The copy's key on the target: the primary key, then (a merged copy: core/source/group.py)
        the source columns, so rows of different source tables never share a key. A table
        without a primary key has no key (a plain MergeTree copy collapses no rows)."""
        if not self.primary_key:
            return ()
        return self.primary_key + tuple(c.name for c in self.columns if c.tag is not None)

    def shape(self) -> dict:
        """The table's shape as a copy was made from it (kept with a load in the ledger and with a
        pipeline's table): CDC decodes the table's first changes with it, not with the source's
        current definition."""
        return {"shape": [dataclasses.asdict(c) for c in self.columns], "key": list(self.primary_key)}

    def select(self, columns=None, exclude=()) -> "TableSchema":
        """The table as copied: only ``columns`` (all when None), without ``exclude``. Key
        columns cannot be left out (the target is keyed and versioned by them); indexes that
        touch a left-out column are dropped, so the planner never splits on one."""
        names = [c.name for c in self.columns]
        for name in [*(columns or ()), *exclude]:
            if name not in names:
                raise KeyError(f"table {self.qualified} has no column {name!r} (columns: {', '.join(names)})")
        kept = [c for c in self.columns if (columns is None or c.name in columns) and c.name not in exclude]
        kept_names = {c.name for c in kept}
        missing_key = [k for k in self.primary_key if k not in kept_names]
        if missing_key:
            raise ValueError(f"table {self.qualified}: primary key column(s) {missing_key} cannot be left out "
                             "(the target is keyed by them)")
        if len(kept) == len(self.columns):
            return self
        return dataclasses.replace(self, columns=tuple(kept),
                                   indexes=tuple(i for i in self.indexes if set(i.columns) <= kept_names))

    def column(self, name: str) -> MySQLColumn:
        for col in self.columns:
            if col.name == name:
                return col
        raise KeyError(f"table {self.qualified} has no column {name!r}")


def read_table_schema(conn, database: str, table: str) -> TableSchema:
    """``conn`` is an open pymysql connection."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, IS_NULLABLE, NUMERIC_PRECISION, NUMERIC_SCALE,"
            " DATETIME_PRECISION, CHARACTER_MAXIMUM_LENGTH, CHARACTER_SET_NAME, COLLATION_NAME, VERSION()"
            " FROM information_schema.COLUMNS"
            " WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION",
            (database, table),
        )
        rows = cur.fetchall()
        if not rows:
            raise TableNotFound(f"MySQL table {database}.{table} does not exist or has no columns visible to this user "
                                f"(reading it needs: {grant(conn, 'SELECT', mysql_ident(database) + '.*')})")
        columns = tuple(
            MySQLColumn(name=r[0], data_type=r[1].lower(), column_type=r[2], nullable=r[3] == "YES",
                        precision=r[4], scale=r[5], fsp=r[6], char_length=r[7], charset=r[8],
                        collation=r[9], mariadb="mariadb" in str(r[10]).lower())
            for r in rows
        )
        cur.execute(
            "SELECT INDEX_NAME, NON_UNIQUE, COLUMN_NAME FROM information_schema.STATISTICS"
            " WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s"
            " ORDER BY INDEX_NAME = 'PRIMARY' DESC, INDEX_NAME, SEQ_IN_INDEX",
            (database, table),
        )
        grouped: dict[str, tuple[bool, list[str]]] = {}
        for name, non_unique, column in cur.fetchall():
            grouped.setdefault(name, (not int(non_unique), []))[1].append(column)
    indexes = tuple(Index(name, tuple(cols), unique) for name, (unique, cols) in grouped.items())
    primary_key = next((i.columns for i in indexes if i.name == "PRIMARY"), ())
    return TableSchema(database, table, columns, primary_key, indexes)


def _table_status(conn, database: str, table: str, column: str) -> int:
    with conn.cursor() as cur:
        cur.execute(f"SELECT {column} FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
                    (database, table))
        row = cur.fetchone()
    return int(row[0] or 0) if row else 0


def table_rows(conn, database: str, table: str) -> int:
    """InnoDB's estimate of the table's rows (free to read; can be off by tens of percent)."""
    return _table_status(conn, database, table, "TABLE_ROWS")


def average_row_bytes(conn, database: str, table: str) -> int:
    """InnoDB's average row length of the table (an estimate; 0 when unknown)."""
    return _table_status(conn, database, table, "AVG_ROW_LENGTH")

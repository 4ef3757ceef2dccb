"""Identifier quoting for MySQL and ClickHouse, and MySQL literals for the one client that binds
no parameters (the Arrow-native reader). Everywhere else values are bound, never formatted in."""

from __future__ import annotations


def mysql_ident(name: str) -> str:
    """Quote a MySQL identifier: backticks, embedded backticks doubled."""
    if not name or "\x00" in name:
        raise ValueError(f"invalid MySQL identifier {name!r}")
    return "`" + name.replace("`", "``") + "`"


def mysql_table(database: str, table: str) -> str:
    return f"{mysql_ident(database)}.{mysql_ident(table)}"


def mysql_literal(value) -> str:
    """A JSON-typed value (a shard's or filter's parameter) as a MySQL literal. Text goes as a
    hex literal with a character set introducer: no quoting, whatever the server's sql_mode
    (NO_BACKSLASH_ESCAPES) — and, like a bound parameter, coercible to the column's collation."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"{value!r} has no MySQL literal")
        return repr(value)
    if isinstance(value, str):
        return f"_utf8mb4 X'{value.encode('utf-8').hex()}'"
    if isinstance(value, (bytes, bytearray)):
        return f"X'{bytes(value).hex()}'"
    raise TypeError(f"cannot render a {type(value).__name__} as a MySQL literal")


def mysql_inline(sql: str, params) -> str:
    """``sql`` with each ``%s`` replaced by its parameter's literal (``%%`` is a literal %, as in
    the DB-API ``format`` style the other readers bind with)."""
    return sql % tuple(mysql_literal(v) for v in params)


def ch_ident(name: str) -> str:
    """Quote a ClickHouse identifier: backticks, with backslash and backtick escaped."""
    if not name or "\x00" in name:
        raise ValueError(f"invalid ClickHouse identifier {name!r}")
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def ch_table(database: str, table: str) -> str:
    return f"{ch_ident(database)}.{ch_ident(table)}"


def ch_string(value: str) -> str:
    """A ClickHouse string literal (for DDL places where parameters are not accepted)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"

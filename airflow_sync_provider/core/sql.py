"""Identifier quoting for MySQL and ClickHouse. Values are always bound, never formatted in."""

from __future__ import annotations


def mysql_ident(name: str) -> str:
    """Quote a MySQL identifier: backticks, embedded backticks doubled."""
    if not name or "\x00" in name:
        raise ValueError(f"invalid MySQL identifier {name!r}")
    return "`" + name.replace("`", "``") + "`"


def mysql_table(database: str, table: str) -> str:
    return f"{mysql_ident(database)}.{mysql_ident(table)}"


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

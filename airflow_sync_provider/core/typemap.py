"""MySQL → ClickHouse type mapping: one rule per type family, the one definition of a value.

Every path that writes or compares values uses these rules, so "the same value" means one
thing everywhere:

* ``source_sql``: the target value computed inside MySQL. The loader SELECTs it (text
  protocol) and Arrow casts whole columns; the checksum's MySQL side renders the very same
  expression. Conversions therefore happen in exactly one place: zero and invalid dates become
  NULL (``TIMESTAMPADD(…, 0, col)`` is NULL for them), FLOAT is widened to DOUBLE (MariaDB's
  text protocol prints FLOAT with 6 digits), BIT and YEAR become integers (``YEAR '0000'`` is
  0), TIME becomes ``[-]HH:MM:SS[.ffffff]``.
* ``from_binlog``: the same target value from what python-mysql-replication decodes out of a
  row event (CDC), e.g. its YEAR 0 arrives as 1900, BIT as a string of bits, a zero TIMESTAMP
  as the epoch, a BINARY(n) without its zero padding.
* ``mysql_text`` / ``ch_text``: the canonical text of a target value computed in MySQL and in
  ClickHouse (checksums, the snapshot diff): identical for equal values. Texts of
  ``plain_text`` rules are numbers, dates, times or hex (never a ',' and never 'N'), so the
  row text that checksums hash (core/verify/rowhash.py) writes them as they are; other texts
  get a length prefix there.

``docs/type-mapping.md`` holds :func:`markdown_table`'s output (a test keeps them equal).
Choices that are not obvious:

* DATETIME has no zone in MySQL: it is copied as wall-clock time into ``DateTime64(p, 'UTC')``
  so it reads back unchanged whatever the server's zone. TIMESTAMP is read with the session
  zone set to UTC, so it is the true instant.
* DECIMAL keeps its precision and scale (ClickHouse allows 76 digits); Arrow decimal128 carries
  up to 38 digits, decimal256 the rest. Never Float64: sums must not drift.
* ENUM/SET/JSON/TIME become String; BIT becomes UInt64; BINARY/VARBINARY/BLOB become String
  holding the raw bytes (BINARY(n) with its zero padding, as MySQL returns it); the spatial
  types become String holding MySQL's internal value (SRID + WKB, :class:`SpatialRule`).
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field

import pyarrow as pa

from airflow_sync_provider.core.sql import mysql_literal


class UnsupportedType(ValueError):
    retry_helps = False  # core/failures.py: the table must change, or the column be left out


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
    # the server is MariaDB, whose text of a DOUBLE is exact (see FloatRule); not part of the
    # column's definition, so shapes stored before it existed still compare equal
    mariadb: bool = field(default=False, compare=False)
    # a column of a merged copy (core/source/group.py) that is not this source table's own: one
    # the table lacks (NULL in its rows), or a source column holding ``tag`` (where a row came from)
    absent: bool = False
    tag: str | None = None

    @property
    def unsigned(self) -> bool:
        return "unsigned" in self.column_type.lower()

    @property
    def in_table(self) -> bool:
        """The source table has this column (it is neither absent nor a source column)."""
        return not self.absent and self.tag is None


_UTF8 = ("utf8mb4", "utf8mb3", "utf8", "ascii")


def _cast_char(expr: str) -> str:
    return f"CAST({expr} AS CHAR CHARACTER SET utf8mb4)"


class Rule:
    """How values of one MySQL type family are copied and compared (see the module docstring)."""

    mysql: str  # the family as the docs name it
    notes: str = ""
    plain_text: bool = False  # True: the canonical text never holds ',' and is never 'N'
    null_for_invalid: bool = False  # True: a NOT NULL column's text can still be NULL (zero dates)

    def ch_type(self, col: MySQLColumn) -> str:
        raise NotImplementedError

    def arrow_type(self, col: MySQLColumn) -> pa.DataType:
        raise NotImplementedError

    def source_sql(self, col_sql: str, col: MySQLColumn) -> str:
        return col_sql

    def from_binlog(self, value, col: MySQLColumn):
        return value

    def mysql_text(self, expr: str, col: MySQLColumn) -> str:
        # numbers and dates: the row text's CONCAT_WS converts them as CAST(… AS CHAR) would,
        # without a CAST's cost per value
        return expr

    def ch_text(self, col_sql: str, col: MySQLColumn) -> str:
        return f"toString({col_sql})"


_INT_BITS = {"tinyint": 8, "smallint": 16, "mediumint": 32, "int": 32, "integer": 32, "bigint": 64}


class IntRule(Rule):
    mysql = "TINYINT / SMALLINT / MEDIUMINT / INT / BIGINT [UNSIGNED], BOOLEAN"
    plain_text = True
    notes = ("Int8 / Int16 / Int32 / Int32 / Int64, unsigned as UInt…; BIGINT UNSIGNED max is kept; "
             "BOOLEAN (TINYINT(1)) is Int8: MySQL lets it hold -128..127")

    def ch_type(self, col):
        return f"{'U' if col.unsigned else ''}Int{_INT_BITS[col.data_type]}"

    def arrow_type(self, col):
        return getattr(pa, f"{'u' if col.unsigned else ''}int{_INT_BITS[col.data_type]}")()


class YearRule(Rule):
    mysql = "YEAR"
    plain_text = True
    notes = "UInt16; `0000` is 0 (as `YEAR + 0`), not the text '0000'"

    def ch_type(self, col):
        return "UInt16"

    def arrow_type(self, col):
        return pa.uint16()

    def source_sql(self, col_sql, col):
        return f"({col_sql} + 0)"

    def from_binlog(self, value, col):
        return 0 if value == 1900 else value  # stored 0 (YEAR 0000) decodes as 0 + 1900


class BitRule(Rule):
    mysql = "BIT(n)"
    plain_text = True
    notes = "UInt64: the bits as an unsigned integer"

    def ch_type(self, col):
        return "UInt64"

    def arrow_type(self, col):
        return pa.uint64()

    def source_sql(self, col_sql, col):
        return f"({col_sql} + 0)"

    def from_binlog(self, value, col):
        return int(value, 2) if isinstance(value, str) else value  # decoded as a string of bits


class DecimalRule(Rule):
    mysql = "DECIMAL(p, s)"
    plain_text = True
    notes = "Decimal(p, s): exact, up to DECIMAL(65, 30); never Float64; compared at its scale"

    def ch_type(self, col):
        return f"Decimal({col.precision or 10}, {col.scale or 0})"

    def arrow_type(self, col):
        p, s = col.precision or 10, col.scale or 0
        return pa.decimal128(p, s) if p <= 38 else pa.decimal256(p, s)

    def ch_text(self, col_sql, col):
        return f"toDecimalString({col_sql}, {col.scale or 0})"


# Floats are compared by their exact value. Both databases print the shortest round-trip digits
# of a DOUBLE, in different notations (MariaDB '1e15', '0.00000015'; ClickHouse
# '1000000000000000', '1.5e-7'). On MariaDB the text is MariaDB's own (my_gcvt: plain when the
# decimal point sits at -14..15 digits from the first digit, or inside the digits; else
# 'd.ddde±k') and ClickHouse rewrites its text into that notation where the two differ
# (1e-15 <= |x| < 1e-6 and integers 1e15 <= |x| < 1e21): cheap in ClickHouse, and MariaDB
# pays one float-to-text conversion. MySQL 8 prints doubles in a fixed width that can drop
# digits, so there both sides write |x| = m × 2^e with m in [1, 2) (the log2 estimate corrected
# by one step either way) as '[-]<m·2^52>p<e>', zero (and -0) as '0', with arithmetic that is
# exact in IEEE doubles (three times MariaDB's cost). Both forms are checked equal on every
# power of two, its neighbours and random bit patterns (tests/test_reconcile.py).

def _ch_mariadb_double(x: str) -> str:
    """MariaDB's text of the Float64 ``x`` (not NULL), computed in ClickHouse."""
    a = f"abs({x})"
    s = f"toString({a})"  # ClickHouse: plain when 1e-7 < |x| < 1e21, else 'd.ddde-k' / 'd.dddek'
    exp = f"splitByChar('e', {s})"
    # every branch must be safe on every row: a server may evaluate multiIf's branches eagerly
    # (short_circuit_function_evaluation), so no parse that throws, no repeat of 2^32 zeros
    small = (f"concat('0.', repeat('0', toUInt32(greatest(0, -toInt32OrZero({exp}[2]) - 1))),"
             f" replaceOne({exp}[1], '.', ''))")
    digits = f"trimRight({s}, '0')"
    large = (f"concat(substring({digits}, 1, 1), if(length({digits}) > 1, concat('.', substring({digits}, 2)), ''),"
             f" 'e', toString(length({s}) - 1))")
    body = (f"multiIf({a} >= 1e-6 AND {a} < 1e15 OR {a} >= 1e21 OR {a} < 1e-15, {s}, {a} < 1e-6, {small},"
            f" position({s}, '.') > 0, {s}, {large})")
    return f"concat(if({x} < 0, '-', ''), {body})"


class FloatRule(Rule):
    mysql = "FLOAT / DOUBLE"
    plain_text = True
    notes = ("Float32 / Float64; FLOAT is read as DOUBLE (exact; MariaDB's text protocol prints it "
             "with 6 digits); compared by exact value, -0 = 0")

    def ch_type(self, col):
        return "Float32" if col.data_type == "float" else "Float64"

    def arrow_type(self, col):
        return pa.float32() if col.data_type == "float" else pa.float64()

    def source_sql(self, col_sql, col):
        return f"({col_sql} + 0e0)"  # -0 + 0 is 0

    def mysql_text(self, expr, col):
        if col.mariadb:
            return _cast_char(expr)
        a = f"ABS({expr})"
        e0 = f"LEAST(GREATEST(FLOOR(LOG2({a})), -1074), 1023)"
        m0 = f"({a} / POW(2, {e0}))"
        e = f"({e0} + ({m0} >= 2) - ({m0} < 1))"
        mantissa = f"CAST({a} / POW(2, {e}) * 4503599627370496 AS UNSIGNED)"
        return f"IF({expr} = 0, '0', CONCAT(IF({expr} < 0, '-', ''), {mantissa}, 'p', {e}))"

    def ch_text(self, col_sql, col):
        x = f"toFloat64({col_sql})"
        if col.mariadb:
            return f"if(isNull({col_sql}), NULL, {_ch_mariadb_double(x)})" if col.nullable else _ch_mariadb_double(x)
        # 0 takes the smallest double's arithmetic: log2(0) is -inf and 0/0 NaN, which toInt64 and
        # toUInt64 refuse even in the branch for 0 that a server may evaluate (its text is '0')
        a = f"greatest(abs({x}), 5e-324)"
        e0 = f"least(greatest(toInt64(floor(log2({a}))), -1074), 1023)"
        m0 = f"({a} / pow(2, {e0}))"
        e = f"({e0} + ({m0} >= 2) - ({m0} < 1))"
        mantissa = f"toUInt64({a} / pow(2, {e}) * 4503599627370496)"
        return (f"if(isNull({col_sql}), NULL, if({x} = 0, '0', concat(if({x} < 0, '-', ''), toString({mantissa}),"
                f" 'p', toString({e}))))")


# Zero and invalid dates ('0000-00-00', '2025-00-10', '2025-02-30' under a lax sql_mode) have
# no ClickHouse equivalent: they become NULL. Adding 0 days/seconds is NULL for exactly those
# values in MySQL and MariaDB and keeps the type and precision of valid ones.

_EPOCH = dt.datetime(1970, 1, 1)


class DateRule(Rule):
    mysql = "DATE"
    plain_text = True
    null_for_invalid = True
    notes = "Date32 (1900-01-01 … 2299-12-31); zero and invalid dates become NULL"

    def ch_type(self, col):
        return "Date32"

    def arrow_type(self, col):
        return pa.date32()

    def source_sql(self, col_sql, col):
        return f"TIMESTAMPADD(DAY, 0, {col_sql})"


class DateTimeRule(Rule):
    mysql = "DATETIME(fsp) / TIMESTAMP(fsp)"
    plain_text = True
    null_for_invalid = True
    notes = ("DateTime64(fsp, 'UTC'): DATETIME as its wall-clock value, TIMESTAMP read with session "
             "`time_zone = '+00:00'` (the true instant); zero and invalid values become NULL")

    def ch_type(self, col):
        return f"DateTime64({col.fsp or 0}, 'UTC')"

    def arrow_type(self, col):
        return pa.timestamp("us")

    def source_sql(self, col_sql, col):
        return f"TIMESTAMPADD(SECOND, 0, {col_sql})"

    def from_binlog(self, value, col):
        # a zero TIMESTAMP is stored as 0 and decodes as the epoch, which a TIMESTAMP cannot hold
        if col.data_type == "timestamp" and value == _EPOCH:
            return None
        return value


class TimeRule(Rule):
    mysql = "TIME(fsp)"
    plain_text = True
    notes = ("String `[-]HH:MM:SS[.ffffff]` (fraction only when not zero), e.g. `-838:59:59`: "
             "ClickHouse has no TIME of ±838 h")

    def ch_type(self, col):
        return "String"

    def arrow_type(self, col):
        return pa.string()

    def source_sql(self, col_sql, col):
        return (f"CONCAT(SUBSTRING_INDEX(CAST({col_sql} AS CHAR), '.', 1),"
                f" IF(MICROSECOND({col_sql}) = 0, '', CONCAT('.', LPAD(MICROSECOND({col_sql}), 6, '0'))))")

    def from_binlog(self, value, col):
        if not isinstance(value, dt.timedelta):
            return value
        micros = (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
        sign, micros = ("-" if micros < 0 else ""), abs(micros)
        hours, rest = divmod(micros, 3_600_000_000)
        minutes, rest = divmod(rest, 60_000_000)
        seconds, fraction = divmod(rest, 1_000_000)
        return f"{sign}{hours:02d}:{minutes:02d}:{seconds:02d}" + (f".{fraction:06d}" if fraction else "")


class StringRule(Rule):
    mysql = "CHAR / VARCHAR / TEXT family, ENUM, SET, JSON (any character set)"
    notes = ("String, UTF-8; CHAR without trailing spaces (as MySQL returns it); ENUM/SET as their "
             "label(s), e.g. `x,y` (ENUM's error value is ''); JSON as its text")

    def ch_type(self, col):
        return "String"

    def arrow_type(self, col):
        return pa.string()

    def from_binlog(self, value, col):
        if isinstance(value, (set, frozenset)):  # SET: its labels in definition order, as MySQL prints it
            return ",".join(label for label in set_labels(col.column_type) if label in value)
        if col.data_type == "char" and isinstance(value, str):
            return value.rstrip(" ")  # as MySQL returns CHAR (without PAD_CHAR_TO_FULL_LENGTH)
        return value

    def mysql_text(self, expr, col):
        # the row text joins bytes (core/verify/rowhash.py): a UTF-8 column's bytes are already
        # what the copy holds; others (latin1, JSON on MySQL) are converted
        return expr if (col.charset or "").lower() in _UTF8 else _cast_char(expr)


def set_labels(column_type: str) -> list[str]:
    """The labels of ``set('a','b')`` / ``enum(…)`` in definition order (quotes doubled inside)."""
    body = column_type[column_type.index("(") + 1: column_type.rindex(")")]
    return [m.replace("''", "'") for m in re.findall(r"'((?:[^']|'')*)'", body)]


class BinaryRule(Rule):
    mysql = "BINARY / VARBINARY / BLOB family"
    plain_text = True
    notes = "String holding the raw bytes (BINARY(n) zero-padded, as MySQL stores it); compared as hex"

    def ch_type(self, col):
        return "String"

    def arrow_type(self, col):
        return pa.binary()

    def from_binlog(self, value, col):
        if isinstance(value, str):  # the reader decodes b"" with the "binary" charset to ""
            value = value.encode()
        if col.data_type == "binary" and col.char_length:
            return value.ljust(col.char_length, b"\0")  # the binlog drops BINARY(n)'s zero padding
        return value

    def mysql_text(self, expr, col):
        return f"HEX({expr})"

    def ch_text(self, col_sql, col):
        return f"hex({col_sql})"


# MySQL's spatial types. MySQL stores a geometry as its SRID (4 bytes, little-endian) followed by
# the WKB (little-endian), and that internal value is what ``SELECT col`` returns and what the
# binlog carries: the copy holds exactly those bytes (ST_AsBinary would drop the SRID, ST_AsText
# the exact doubles). connectorx cannot read a GEOMETRY field ("not implemented:
# MYSQL_TYPE_GEOMETRY"), so the value is read as ``CAST(col AS BINARY)``: the same bytes, typed
# as a binary string. A typed ClickHouse column (Point, Polygon, …) derived from these bytes is a
# layout option (core/clickhouse/derived.py).
SPATIAL_TYPES = ("geometry", "point", "linestring", "polygon", "multipoint", "multilinestring", "multipolygon",
                 "geometrycollection", "geomcollection")  # MySQL 8 names GEOMETRYCOLLECTION 'geomcollection'


class SpatialRule(Rule):
    mysql = ("GEOMETRY / POINT / LINESTRING / POLYGON / MULTIPOINT / MULTILINESTRING / MULTIPOLYGON / "
             "GEOMETRYCOLLECTION")
    plain_text = True
    notes = ("String holding MySQL's own value: the SRID (4 bytes, little-endian) then the WKB, as `SELECT col` "
             "and the binlog give it; compared as hex. A typed column derived from it (`Point`, `Polygon`, …) "
             "is a layout option: see below")

    def ch_type(self, col):
        return "String"

    def arrow_type(self, col):
        return pa.binary()

    def source_sql(self, col_sql, col):
        return f"CAST({col_sql} AS BINARY)"

    def mysql_text(self, expr, col):
        return f"HEX({expr})"

    def ch_text(self, col_sql, col):
        return f"hex({col_sql})"


_INT, _STRING, _BINARY = IntRule(), StringRule(), BinaryRule()
RULES: dict[str, Rule] = {
    **dict.fromkeys(_INT_BITS, _INT),
    "year": YearRule(), "bit": BitRule(),
    **dict.fromkeys(("decimal", "numeric"), DecimalRule()),
    **dict.fromkeys(("float", "double", "real"), FloatRule()),
    "date": DateRule(), **dict.fromkeys(("datetime", "timestamp"), DateTimeRule()), "time": TimeRule(),
    **dict.fromkeys(("char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set", "json"), _STRING),
    **dict.fromkeys(("binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"), _BINARY),
    **dict.fromkeys(SPATIAL_TYPES, SpatialRule()),
}
BINARY_TYPES = frozenset(t for t, rule in RULES.items() if rule is _BINARY)


@dataclass(frozen=True)
class ColumnMapping:
    source: MySQLColumn
    rule: Rule
    # a content transform of the value the rule gives (core/content/transforms.py: hash, mask, …)
    # and the salt a hash needs (a secret: never shown, never compared)
    transform: object = None
    salt: bytes | None = field(default=None, repr=False, compare=False)

    @property
    def name(self) -> str:
        return self.source.name

    @property
    def ch_type(self) -> str:
        """The ClickHouse type, ``Nullable(…)`` included."""
        if self.transform is not None:
            return self.transform.ch_type(self)
        base = self.rule.ch_type(self.source)
        return f"Nullable({base})" if self.source.nullable else base

    @property
    def arrow_type(self) -> pa.DataType:
        """The Arrow type of the copy's values (a transform's, when the column has one)."""
        return self.transform.arrow_type(self) if self.transform is not None else self.base_arrow_type

    @property
    def base_arrow_type(self) -> pa.DataType:
        """The Arrow type of the rule's values: what readers and the binlog decoders produce."""
        return self.rule.arrow_type(self.source)

    def shaped(self, array: pa.Array) -> pa.Array:
        """The rule's values (of :attr:`base_arrow_type`) as the copy holds them: a binlog row
        image's, shaped in Python (a read's are shaped by its SELECT: :meth:`read_sql`)."""
        return array if self.transform is None else self.transform.arrow(array, self, self.salt)

    def read_sql(self, col_sql: str) -> str:
        """The copy's value as a SELECT of the source table computes it: the rule's value, and a
        transform's of it. A read computes its transforms in MySQL (a salted SHA-256 costs MySQL
        about 0.1 µs a value, Python 0.4 µs); CDC's row images in Python (:meth:`shaped`);
        tests/test_content_transforms.py holds the two equal."""
        if self.transform is not None:
            return self.transform.mysql_sql(self.source_sql(col_sql), self)
        return self.source_sql(col_sql)

    def source_sql(self, col_sql: str) -> str:
        """The rule's value as a SELECT of the source table computes it from ``col_sql`` (before
        any transform); for a column the table does not hold (a merged copy's), its value: NULL or
        the source's tag."""
        if self.source.absent:  # typed: a NULL-typed result column is one the Arrow-native reader cannot read
            return "CAST(NULL AS CHAR)"
        if self.source.tag is not None:
            return mysql_literal(self.source.tag)
        return self.rule.source_sql(col_sql, self.source)

    def from_binlog(self, value):
        return None if value is None else self.rule.from_binlog(value, self.source)

    @property
    def plain_text(self) -> bool:
        # a transform's value is text: length-prefixed in the row text
        return self.rule.plain_text and self.transform is None

    @property
    def text_may_be_null(self) -> bool:
        return self.source.nullable or self.rule.null_for_invalid or (
            self.transform is not None and self.transform.name == "null")

    def mysql_text(self, col_sql: str) -> str:
        """Canonical text of the target value, computed in MySQL from the source column (NULL for NULL)."""
        if self.transform is not None:
            return self.read_sql(col_sql)
        return self.rule.mysql_text(self.source_sql(col_sql), self.source)

    def ch_text(self, col_sql: str) -> str:
        """Canonical text of the stored value, computed in ClickHouse (NULL for NULL)."""
        if self.transform is not None:
            return f"toString({col_sql})"
        return self.rule.ch_text(col_sql, self.source)


def map_column(col: MySQLColumn, table: str = "?") -> ColumnMapping:
    rule = RULES.get(col.data_type.lower())
    if rule is None:
        raise UnsupportedType(
            f"table {table}, column {col.name!r}: MySQL type {col.column_type!r} has no ClickHouse mapping; "
            "leave the column out (exclude_columns=[…] / --exclude-column) or cast it in a view")
    return ColumnMapping(col, rule)


# ClickHouse's Date32 / DateTime64 range; MySQL's is wider, and ClickHouse would clamp silently.
_CH_MIN, _CH_MAX = dt.datetime(1900, 1, 1), dt.datetime(2299, 12, 31, 23, 59, 59, 999999)


def check_array(array: pa.Array, mapping: ColumnMapping, where: str) -> None:
    """Refuse values the target would store wrongly, naming the column (never a silent change):
    NULLs in a NOT NULL column (zero or invalid dates become NULL), dates ClickHouse would clamp."""
    if array.null_count and not mapping.source.nullable:
        raise ValueError(
            f"{where}, column {mapping.name!r}: {array.null_count} NULL values read from a NOT NULL "
            f"{mapping.source.column_type} column — MySQL zero or invalid dates ('0000-00-00', '2025-00-10') "
            "read as NULL and have no ClickHouse equivalent; fix those rows or load through a view that maps them")
    if mapping.source.data_type in ("date", "datetime", "timestamp") and len(array) > array.null_count:
        import pyarrow.compute as pc  # here: its import costs a CDC run's start 0.1-0.5 s

        lo, hi = pc.min_max(array).values()
        lo, hi = lo.as_py(), hi.as_py()
        if not isinstance(lo, dt.datetime):
            lo, hi = dt.datetime.combine(lo, dt.time()), dt.datetime.combine(hi, dt.time())
        if lo < _CH_MIN or hi > _CH_MAX:
            raise ValueError(f"{where}, column {mapping.name!r}: values from {lo} to {hi} fall outside ClickHouse's "
                             f"{mapping.ch_type} range (1900-01-01 … 2299-12-31)")



def markdown_table() -> str:
    """The type table of docs/type-mapping.md, from the rules themselves."""
    seen, lines = [], ["| MySQL | ClickHouse and conversion |", "|---|---|"]
    for rule in RULES.values():
        if rule not in seen:
            seen.append(rule)
            lines.append(f"| {rule.mysql} | {rule.notes} |")
    lines.append("| other (e.g. MariaDB's UUID / INET6, MySQL 9's VECTOR) | refused with an error naming table and "
                 "column (leave it out with `exclude_columns`) |")
    return "\n".join(lines) + "\n"

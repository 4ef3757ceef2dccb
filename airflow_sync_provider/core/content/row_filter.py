"""A copy's standing row filter (docs/content.md): a MySQL boolean expression over the table's
columns, e.g. ``tenant_id = 7 AND status <> 'test'``.

One parse gives the filter twice, and the two must select the same rows: :meth:`RowFilter.sql`
is the ``WHERE`` a full load reads with, :meth:`RowFilter.matches` decides on each binlog row
image in Python, from the row's base target values (core/typemap.py). So the filter language is
what can be evaluated exactly as MySQL evaluates it (tests/test_content_row_filter.py checks
both against MariaDB); everything else is refused by name rather than guessed.

The language and its parser are core/content/filter_syntax.py's; the conditions, and how each
kind compares, core/content/filter_terms.py's. Here the parsed names are bound to the table's
columns and the constants to the columns' terms, refusing what would not compare exactly.

MariaDB itself decides some comparisons one way through an index and another way without (the
differential test found each, running the user's text through the column's index): an index
lookup first stores the constant into the column's type. So these are refused too, whatever the
table's indexes, since the plan could change the rows a load selects: an equality (=, <>, <=>,
IN) with a number the column cannot hold (``int_col = 1.5`` selects the 2s, ``dec2_col = 1.005``
the 1.01s), any comparison with a YEAR outside 0, 1…99, 1901…2155 (``NOT y > 3000`` selects only
the 0000s) or a TIME with more fraction digits than the column (``time0 > '-00:00:00.5'`` skips
00:00:00), an equality on a SET (``' '`` is no SET value but equals the empty set as a string),
and any comparison on a CHAR of a NO PAD collation (the index pads it, the row does not).

Zero and invalid dates ('0000-00-00', '2025-02-30') are NULL in the copy, and that is what the
filter sees on both sides: ``sql()`` reads a DATE / DATETIME / TIMESTAMP column as its copied
value, ``TIMESTAMPADD(DAY|SECOND, 0, col)`` (core/typemap.py), which is NULL for them. So on
such a row ``d IS NULL`` is TRUE and ``d < '2000-01-01'`` is NULL — whereas MySQL on the raw
column would order a zero date before every date. (So the load's WHERE uses no index of such a
column, and none of MariaDB's index inconsistencies above reaches temporal columns.)

Strings of a case- or accent-insensitive collation need their weight table from the server:
:meth:`RowFilter.prepare` loads it (no privilege needed, read-only; cached per server version),
and :meth:`RowFilter.matches` refuses to run without it.

``sql()`` means the same under any sql_mode and connection character set (hex string literals,
no ``||``, every operation parenthesised). The rules are MySQL's and MariaDB's alike; the
differential test runs on MariaDB, and ``prepare()`` checks each weighted collation on the server
it will be compared against (MySQL 8's default utf8mb4_0900_ai_ci is refused).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from dataclasses import dataclass, field
from decimal import Decimal

from airflow_sync_provider.core.content import ContentError
from airflow_sync_provider.core.content import collation as coll
from airflow_sync_provider.core.content.filter_syntax import Parser
from airflow_sync_provider.core.content.filter_terms import (
    BYTES,
    DOUBLE,
    EXACT,
    LOGIC,
    TEMPORAL,
    TIME,
    Between,
    Column,
    Compare,
    Condition,
    Constant,
    In,
    IsBool,
    IsNull,
    Literal,
    Logic,
    Not,
    Text,
    time_micros,
)
from airflow_sync_provider.core.sql import mysql_ident, mysql_literal
from airflow_sync_provider.core.typemap import RULES, MySQLColumn, map_column

# --- binding: names to columns, constants to the columns' terms ---------------------------------

_INTEGERS = {"tinyint", "smallint", "mediumint", "int", "integer", "bigint", "bit"}
_STRINGS = {"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set"}
_NUMERIC = {"int", "year", "decimal", "float"}
_DATE = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})")
_DATETIME = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2}) ([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,6}))?")
_TIME_TEXT = re.compile(r"(-?)([0-9]{1,3}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,6}))?")
_FLIPPED = {"=": "=", "<=>": "<=>", "<>": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


def _year(value: int) -> int:
    """An integer as MySQL stores it into a YEAR to compare (1…69 → 20xx, 70…99 → 19xx); others
    (0, 1901…2155, out of range) compare as they are."""
    return value + 2000 if 1 <= value <= 69 else value + 1900 if 70 <= value <= 99 else value


def _fraction_digits(value: Decimal) -> int:
    """Digits after the point, trailing zeros aside (no context: it could round)."""
    _, digits, exponent = value.as_tuple()
    if exponent >= 0:
        return 0
    return len("".join(map(str, digits)).rjust(-exponent, "0")[exponent:].rstrip("0"))


def _number_sql(value) -> str:
    return format(value, "f") if isinstance(value, Decimal) else str(value)


class _Binder:
    def __init__(self, columns, fail):
        self.columns = list(columns)
        self.fail = fail

    def column(self, node) -> MySQLColumn:
        name, pos = node[1], node[2]
        found = [c for c in self.columns if c.name == name] or \
            [c for c in self.columns if c.name.lower() == name.lower()]
        if len(found) != 1 or not found[0].in_table:
            names = [c.name for c in self.columns if c.in_table]
            listed = ", ".join(names[:30]) + (", …" if len(names) > 30 else "")
            self.fail(f"unknown column {name!r} (at character {pos + 1}); the table's columns: {listed}")
        col = found[0]
        if col.data_type.lower() not in RULES:
            self.fail(f"column {col.name!r} has type {col.column_type}, which is not copied; leave it out of the "
                      "filter")
        return col

    @staticmethod
    def node(col: MySQLColumn) -> Column:
        ident = mysql_ident(col.name)
        if col.data_type.lower() in ("date", "datetime", "timestamp"):
            return Column(col.name, map_column(col).source_sql(ident))  # NULL for zero and invalid dates
        return Column(col.name, ident)

    def kind(self, col: MySQLColumn) -> str:
        t = col.data_type.lower()
        if t in _INTEGERS:
            return "int"
        if t in ("year", "date", "time"):
            return t
        if t in ("decimal", "numeric"):
            return "decimal"
        if t in ("float", "double", "real"):
            if col.scale is not None:
                self.fail(f"column {col.name!r} is {col.column_type}: MySQL compares FLOAT(M,D) / DOUBLE(M,D) with a "
                          "tolerance that is not emulated; filter on another column, or make it DECIMAL or FLOAT")
            return "float"
        if t in ("datetime", "timestamp"):
            return "datetime"
        if t in _STRINGS:
            return "string"
        if t in RULES and RULES[t] is RULES["blob"]:
            return "binary"
        if t in RULES and RULES[t] is RULES["geometry"]:
            self.fail(f"column {col.name!r} is {col.column_type}, a spatial value that the filter does not compare; "
                      "leave it out of the filter")
        self.fail(f"column {col.name!r} is {col.column_type}, which MySQL compares as JSON values, not emulated; "
                  "leave it out of the filter")

    def text_domain(self, col: MySQLColumn) -> Text:
        collation = coll.static(col.collation or "")
        if collation is None:
            self.fail(f"column {col.name!r} has collation {col.collation}, which the filter cannot compare exactly "
                      f"(supported: {', '.join(coll.SUPPORTED)}); filter on another column, or give this one a "
                      "supported collation")
        if col.data_type.lower() == "char" and not collation.pad:
            # MariaDB's index holds CHAR values padded with spaces, its own comparison strips them: under a NO
            # PAD collation the two order '' and '\t' differently, and the rows selected would depend on the plan
            self.fail(f"column {col.name!r} is {col.column_type} with the NO PAD collation {col.collation}, which "
                      "MariaDB compares one way through an index and another without; filter on another column")
        return Text(collation, col.collation, col.charset or collation.charset)

    def domain(self, col: MySQLColumn, kind: str):
        return {"int": EXACT, "year": EXACT, "decimal": EXACT, "float": DOUBLE, "date": TEMPORAL,
                "datetime": TEMPORAL, "time": TIME, "binary": BYTES}.get(kind) or self.text_domain(col)

    # conditions

    def condition(self, node) -> Condition:
        tag = node[0]
        if tag == "PAREN":
            return self.condition(node[1])
        if tag in LOGIC:
            return Logic(tag, self.condition(node[1]), self.condition(node[2]))
        if tag in ("NOT", "BANG"):
            return Not(self.condition(node[1]))
        if tag == "IS":
            operand, what, negated = _unwrap(node[1]), node[2], node[3]
            if what in ("NULL", "UNKNOWN"):
                if operand[0] == "COL":
                    return IsNull(self.node(self.column(operand)), negated)
                if operand[0] == "LIT":
                    self.fail(f"IS {what} tests a constant ({_describe(operand)}); test a column or a condition")
                return IsNull(self.condition(operand), negated)
            return IsBool(self.condition(operand), what == "TRUE", negated)
        if tag == "CMP":
            return self.compare(*node[1:])
        if tag == "IN":
            return self.in_list(*node[1:])
        if tag == "BETWEEN":
            return self.between(*node[1:])
        if tag == "COL":
            col = self.column(node)
            kind = self.kind(col)
            if kind not in _NUMERIC:
                self.fail(f"column {col.name!r} ({col.column_type}) is used as a condition: MySQL would convert it to a"
                          f" number; compare it explicitly, e.g. {col.name} <> ''")
            domain = self.domain(col, kind)
            return Compare("<>", self.node(col), Literal(0, "0", domain.of(0)), domain)
        if node[1] in ("bool", "null"):
            return Constant(None if node[2] is None else bool(node[2]))
        self.fail(f"the constant {_describe(node)} is used as a condition; write TRUE, FALSE or a comparison")

    def operands(self, what: str, node, pos: int):
        node = _unwrap(node)
        if node[0] == "LIT":
            self.fail(f"{what} at character {pos + 1} applies to a constant ({_describe(node)}); apply it to a column")
        if node[0] != "COL":
            self.fail(f"{what} at character {pos + 1} applies to a condition, not a column")
        return self.column(node)

    def compare(self, op, a, b, pos):
        a, b = _unwrap(a), _unwrap(b)
        for side in (a, b):
            if side[0] not in ("COL", "LIT"):
                hint = " ('!' binds tighter than comparisons in MySQL: write NOT (…))" if side[0] == "BANG" else ""
                self.fail(f"{op} at character {pos + 1} compares a condition{hint}; compare a column with a constant "
                          "or another column")
        if a[0] == "LIT" and b[0] == "LIT":
            self.fail(f"{op} at character {pos + 1} compares two constants; compare a column")
        if a[0] == "LIT":
            a, b, op = b, a, _FLIPPED[op]
        col = self.column(a)
        if b[0] == "COL":
            other = self.column(b)
            return Compare(op, self.node(col), self.node(other), self.pair_domain(col, other, op, pos))
        kind = self.kind(col)
        domain = self.domain(col, kind)
        if op in ("=", "<>", "<=>"):
            self.held(col, kind, b, op)
        return Compare(op, self.node(col), self.literal(col, kind, domain, b), domain)

    def in_list(self, left, items, negated, pos):
        col = self.operands("IN", left, pos)
        kind = self.kind(col)
        domain = self.domain(col, kind)
        for item in items:
            self.held(col, kind, _unwrap(item), "IN")
        return In(self.node(col), tuple(self.constant(col, kind, domain, i, "IN") for i in items), negated, domain)

    def held(self, col: MySQLColumn, kind: str, node, op: str) -> None:
        """Refuse an equality (=, <>, <=>, IN: negations and the optimizer turn each into =) that
        MariaDB's index lookup decides otherwise than its own comparison (module docstring): a
        number the column cannot hold, or any text against a SET."""
        if node[0] != "LIT" or node[1] == "null":
            return
        if col.data_type.lower() == "set":
            self.fail(f"column {col.name!r} is a SET compared with {op}: MariaDB's index lookup reads the constant as "
                      "a SET value first and selects rows its own string comparison does not (' ' equals the empty "
                      "set as a string, not as a SET value); filter on another column")
        if kind not in ("int", "decimal") or node[1] != "num":
            return
        digits, allowed = _fraction_digits(Decimal(node[2])), (col.scale or 0) if kind == "decimal" else 0
        if digits > allowed:
            self.fail(f"column {col.name!r} ({col.column_type}) is compared with {op} to {_describe(node)}, which it "
                      f"cannot hold ({allowed} digits after the point): no row equals it, yet MariaDB's index lookup "
                      "rounds the constant to the column's type and selects rows its own comparison does not; write "
                      f"a constant with at most {allowed} digits after the point, or a range (<, >)")

    def between(self, left, low, high, negated, pos):
        col = self.operands("BETWEEN", left, pos)
        kind = self.kind(col)
        domain = self.domain(col, kind)
        return Between(self.node(col), self.constant(col, kind, domain, low, "BETWEEN"),
                       self.constant(col, kind, domain, high, "BETWEEN"), negated, domain)

    def constant(self, col, kind, domain, node, what) -> Literal:
        node = _unwrap(node)
        if node[0] != "LIT":
            self.fail(f"{what} takes constants only (column {col.name!r}): a column or condition in its list or bounds "
                      "is not supported")
        return self.literal(col, kind, domain, node)

    def pair_domain(self, a: MySQLColumn, b: MySQLColumn, op: str, pos: int):
        ka, kb = self.kind(a), self.kind(b)
        if ka in _NUMERIC and kb in _NUMERIC:
            return DOUBLE if "float" in (ka, kb) else EXACT
        if {ka, kb} <= {"date", "datetime"}:
            return TEMPORAL
        if ka == kb and ka in ("time", "binary"):
            return self.domain(a, ka)
        if ka == kb == "string" and not {a.data_type, b.data_type} & {"enum", "set"}:
            da, db = self.text_domain(a), self.text_domain(b)
            if da.collation.name == db.collation.name:
                return da
        self.fail(f"{op} at character {pos + 1} compares column {a.name!r} ({a.column_type}"
                  f"{', ' + a.collation if a.collation else ''}) with column {b.name!r} ({b.column_type}"
                  f"{', ' + b.collation if b.collation else ''}): only numbers with numbers, dates with dates, TIME "
                  "with TIME, binary with binary and strings (not ENUM / SET) of one collation are compared exactly")

    def literal(self, col: MySQLColumn, kind: str, domain, node) -> Literal:
        lit_kind, raw = node[1], node[2]
        if lit_kind == "null":
            return Literal(None, "NULL")

        def refuse(why: str):
            self.fail(f"column {col.name!r} ({col.column_type}) is compared with {_describe(node)}: {why}")

        if kind in _NUMERIC:
            if lit_kind not in ("num", "bool"):
                refuse("MySQL would compare them after converting (as doubles, or the string to a number); "
                       "compare it with a number")
            if kind == "year" and isinstance(raw, Decimal):
                refuse("MySQL converts it to a YEAR first; write a whole year")
            if kind == "year" and not (0 <= raw <= 99 or 1901 <= raw <= 2155):
                # MariaDB's index lookup stores it into a YEAR as 0000 and then bounds ranges wrongly
                # (NOT y > 3000 selects only the 0000s), unlike its own comparison
                refuse("a YEAR holds 1901…2155 and 0 (0000), and MySQL reads 1…99 as 2001…2069 / 1970…1999: "
                       "MariaDB's index decides other numbers otherwise than its own comparison; compare with a year "
                       "in that range")
            value = _year(raw) if kind == "year" else raw
            sql = ("TRUE" if raw else "FALSE") if lit_kind == "bool" else _number_sql(raw)
            return Literal(value, sql, domain.of(value))
        if kind in ("date", "datetime"):
            value = self.temporal(node, refuse)
            sql = f"DATE'{value}'" if type(value) is dt.date else f"TIMESTAMP'{value.isoformat(' ')}'"
            return Literal(value, sql, domain.of(value))
        if kind == "time":
            if lit_kind not in ("str", "time") or not _TIME_TEXT.fullmatch(raw):
                refuse("a TIME compares with '[-]H:MM:SS[.ffffff]' (at most 6 fraction digits)")
            sign, hours, minutes, seconds, fraction = _TIME_TEXT.fullmatch(raw).groups()
            if int(hours) > 838 or int(minutes) > 59 or int(seconds) > 59:
                refuse("not a TIME value (-838:59:59.999999 … 838:59:59.999999)")
            if len((fraction or "").rstrip("0")) > (col.fsp or 0):
                # MariaDB's index truncates it to the column's precision, and -00:00:00.5 becomes 00:00:00:
                # `tm0 > '-00:00:00.5'` would skip the 00:00:00s its own comparison selects
                refuse(f"the column holds {col.fsp or 0} digits after the point, and MariaDB's index truncates the "
                       "constant to them, selecting rows its own comparison does not; write at most "
                       f"{col.fsp or 0} digits after the point")
            text = f"{sign}{hours}:{minutes}:{seconds}" + (f".{fraction}" if fraction else "")
            return Literal(text, f"TIME'{text}'", time_micros(text))
        if kind == "binary":
            if lit_kind not in ("str", "hex"):
                refuse("MySQL would compare them as numbers; compare it with a quoted string or X'…'")
            value = raw.encode("utf-8") if lit_kind == "str" else raw
            return Literal(value, f"X'{value.hex()}'", value)
        if lit_kind != "str":
            if col.data_type in ("enum", "set") and lit_kind in ("num", "bool"):
                refuse(f"MySQL compares an {col.data_type.upper()} with a number by its index; compare it with a label")
            refuse("a string column compares exactly with a quoted string only")
        foreign = coll.foreign_character(domain.collation.charset, raw)
        if foreign is not None:
            refuse(f"its character U+{ord(foreign):04X} is not in the column's character set {col.charset} (MySQL "
                   "refuses the comparison); remove it")
        return Literal(raw, mysql_literal(raw), domain.of(raw) if domain.ready else None)

    def temporal(self, node, refuse):
        lit_kind, raw = node[1], node[2]
        if lit_kind not in ("str", "date", "timestamp"):
            refuse("compare a date with 'YYYY-MM-DD' or 'YYYY-MM-DD HH:MM:SS[.ffffff]'")
        date, stamp = _DATE.fullmatch(raw), _DATETIME.fullmatch(raw)
        if (date is None and stamp is None) or (lit_kind == "date" and date is None) or \
                (lit_kind == "timestamp" and stamp is None):
            refuse("not in the form 'YYYY-MM-DD' or 'YYYY-MM-DD HH:MM:SS[.ffffff]' (MySQL reads other forms loosely)")
        parts = (date or stamp).groups()
        try:
            if date is not None:
                return dt.date(*map(int, parts))
            fraction = parts[6] or ""
            return dt.datetime(*map(int, parts[:6]), int(fraction.ljust(6, "0")) if fraction else 0)
        except ValueError:
            refuse("not a valid date (zero and invalid dates are NULL in the copy)")


def _unwrap(node):
    while node[0] == "PAREN":
        node = node[1]
    return node


def _describe(node) -> str:
    kind, value = node[1], node[2]
    if kind == "null":
        return "NULL"
    if kind == "bool":
        return "TRUE" if value else "FALSE"
    if kind == "hex":
        return f"X'{value.hex()}'"
    if kind in ("date", "time", "timestamp"):
        return f"{kind.upper()} {value!r}"
    return repr(value) if kind == "str" else f"the number {_number_sql(value)}"


# --- the filter ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RowFilter:
    """A parsed row filter (see the module docstring); picklable, immutable."""

    text: str
    root: Condition = field(repr=False)
    where: str = field(default="", repr=False, compare=False)
    ready: bool = field(default=True, repr=False, compare=False)  # False: prepare() must load weight tables

    @classmethod
    def parse(cls, text: str, columns, where: str) -> RowFilter:
        """``columns``: the table's :class:`MySQLColumn` sequence; ``where`` names the table in
        messages (e.g. ``"table db.t"``). Raises :class:`ContentError` naming what is not supported."""

        def fail(message: str):
            raise ContentError(f"{where}: row filter {text!r}: {message}")

        columns = list(columns)
        root = _Binder(columns, fail).condition(Parser(text, {c.name.upper() for c in columns}, fail).parse())
        return cls(text, root, where, next(root.pending(), None) is None)

    @property
    def columns(self) -> tuple[str, ...]:
        """The columns the filter reads, in order of first use."""
        return tuple(dict.fromkeys(self.root.names()))

    def sql(self) -> str:
        """The filter as a MySQL condition, fully parenthesised, with quoted names and literals
        that mean the same whatever the session's sql_mode and character set."""
        return self.root.sql()

    def prepare(self, conn) -> RowFilter:
        """The filter with the weight tables its string comparisons need, read from the source
        server through ``conn`` (DB-API); ``self`` when it needs none."""
        pending = {d.collation.name: d for d in self.root.pending()}
        if not pending:
            return self
        loaded = {}
        for name, domain in pending.items():
            try:
                loaded[name] = coll.load(conn, domain.server_name, domain.charset)
            except coll.CollationMismatch as exc:
                raise ContentError(f"{self.where}: row filter {self.text!r}: collation {domain.server_name} cannot be "
                                   f"compared exactly on this server: {exc}; filter on columns of another collation"
                                   ) from exc
        return dataclasses.replace(self, root=self.root.prepared(loaded), ready=True)

    def matches(self, row) -> bool:
        """Whether MySQL's ``WHERE`` :meth:`sql` selects the row whose base target values are
        ``row`` (column name → value)."""
        if not self.ready:
            raise RuntimeError(f"{self.where}: row filter {self.text!r} compares strings of a collation whose weights "
                               "are not loaded: call prepare(conn) first")
        return self.root.test(row) is True

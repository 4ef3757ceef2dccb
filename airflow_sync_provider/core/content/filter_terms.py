"""A bound row filter (core/content/row_filter.py binds it): conditions of MySQL's three-valued
logic over the table's columns and constants in the columns' terms, each both a MySQL condition
(``sql()``) and a test of a row's base target values (``test(row)``), and the comparison domains
that order two values as MySQL orders them.

How each kind compares, as MySQL does:

* integers (BIT too), DECIMAL, YEAR: exactly (int and Decimal). A YEAR compared with 1…99 takes
  it as MySQL stores it into a YEAR (70…99 → 19xx, 1…69 → 20xx); a decimal against a YEAR is
  refused. FLOAT / DOUBLE: as doubles (the constant correctly rounded, as MySQL's strtod does);
  FLOAT(M,D) / DOUBLE(M,D) are refused (MySQL compares them with a tolerance).
* strings: under the column's collation (core/content/collation.py); the constant takes the
  column's collation and must fit its character set. ENUM and SET compare their labels as
  strings; against a number (an ENUM's index) they are refused. Two string columns compare only
  under one collation. Binary strings compare bytes (BINARY(n) with its zero padding); a quoted
  constant stands for its UTF-8 bytes.
* DATE / DATETIME / TIMESTAMP against 'YYYY-MM-DD' or 'YYYY-MM-DD HH:MM:SS[.ffffff]' (DATE
  against a datetime compares as a datetime, as in MySQL); TIMESTAMP as its UTC wall clock
  (sessions run with time_zone '+00:00'). TIME against '[-]H:MM:SS[.ffffff]'. Malformed and zero
  dates are refused.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass

from airflow_sync_provider.core.content import collation as coll

# --- comparison domains: how two values of a comparison order, as MySQL orders them -------------


@dataclass(frozen=True)
class _Exact:
    """Values Python orders as MySQL does: integers, DECIMAL, BIT, YEAR (int and Decimal compare
    exactly), binary strings (bytes, byte by byte, no padding)."""

    ready = True

    def of(self, value):
        return value

    def compare(self, a, b) -> int:
        return (a > b) - (a < b)


@dataclass(frozen=True)
class _Double(_Exact):
    """Anything against FLOAT / DOUBLE: as doubles (float() rounds correctly, as MySQL's strtod)."""

    def of(self, value):
        return None if value is None else float(value)


@dataclass(frozen=True)
class _Temporal(_Exact):
    """DATE, DATETIME, TIMESTAMP (UTC): a DATE compares as its midnight."""

    def of(self, value):
        if type(value) is dt.date:
            return dt.datetime.combine(value, dt.time())
        return value


@dataclass(frozen=True)
class _Time(_Exact):
    """TIME (the copy's '[-]H:MM:SS[.ffffff]' text): as signed microseconds."""

    def of(self, value):
        return None if value is None else time_micros(value)


@dataclass(frozen=True)
class Text:
    """Strings under a collation: by their collation keys (``ready`` once the table is loaded)."""

    collation: coll.Collation
    server_name: str  # the collation and character set as the server names them (for prepare)
    charset: str

    @property
    def ready(self) -> bool:
        return self.collation.ready

    def of(self, value):
        return None if value is None else self.collation.key(value)

    def compare(self, a, b) -> int:
        return self.collation.compare(a, b)


EXACT, DOUBLE, TEMPORAL, TIME, BYTES = _Exact(), _Double(), _Temporal(), _Time(), _Exact()


def time_micros(text: str) -> int:
    sign = -1 if text.startswith("-") else 1
    hours, minutes, seconds = text.lstrip("-").split(":")
    whole, _, fraction = seconds.partition(".")
    return sign * ((int(hours) * 3600 + int(minutes) * 60 + int(whole)) * 1_000_000 + int((fraction + "000000")[:6]))


# --- the bound filter: conditions of three-valued logic -----------------------------------------


@dataclass(frozen=True)
class Column:
    name: str  # as the table spells it: the row's key
    sql: str  # the column as the WHERE reads it (its copied value for temporal columns)

    def names(self):
        yield self.name


@dataclass(frozen=True)
class Literal:
    raw: object  # the constant in the column's terms: int, Decimal, float, str, bytes, datetime, µs; None is NULL
    sql: str
    value: object = None  # as the domain compares it (a string's collation key once the collation is ready)

    def names(self):
        return iter(())


class Condition:
    def prepared(self, collations: dict) -> Condition:
        return self

    def pending(self):
        return iter(())


def _value(operand, row, domain):
    return operand.value if isinstance(operand, Literal) else domain.of(row[operand.name])


def _ready(domain, collations):
    return dataclasses.replace(domain, collation=collations[domain.collation.name]) if isinstance(domain, Text) \
        and not domain.ready else domain


def _literal_ready(literal: Literal, domain) -> Literal:
    if literal.raw is None or not domain.ready or not isinstance(domain, Text):
        return literal
    return dataclasses.replace(literal, value=domain.of(literal.raw))


def _pending(domain):
    if isinstance(domain, Text) and not domain.ready:
        yield domain


_ORDER = {"=": lambda c: c == 0, "<>": lambda c: c != 0, "<": lambda c: c < 0, "<=": lambda c: c <= 0,
          ">": lambda c: c > 0, ">=": lambda c: c >= 0}


@dataclass(frozen=True)
class Compare(Condition):
    op: str
    left: Column
    right: Column | Literal
    domain: object

    def test(self, row):
        a, b = _value(self.left, row, self.domain), _value(self.right, row, self.domain)
        if a is None or b is None:
            return (a is None and b is None) if self.op == "<=>" else None
        return (self.domain.compare(a, b) == 0) if self.op == "<=>" else _ORDER[self.op](self.domain.compare(a, b))

    def sql(self):
        return f"({self.left.sql} {self.op} {self.right.sql})"

    def names(self):
        yield from self.left.names()
        yield from self.right.names()

    def pending(self):
        return _pending(self.domain)

    def prepared(self, collations):
        domain = _ready(self.domain, collations)
        right = _literal_ready(self.right, domain) if isinstance(self.right, Literal) else self.right
        return dataclasses.replace(self, domain=domain, right=right)


class _OfColumn(Condition):
    """A test of one column's value (``left``) in its ``domain``."""

    def names(self):
        return self.left.names()

    def pending(self):
        return _pending(self.domain)


@dataclass(frozen=True)
class In(_OfColumn):
    left: Column
    items: tuple[Literal, ...]
    negated: bool
    domain: object

    def test(self, row):
        a = _value(self.left, row, self.domain)
        if a is None:
            return None
        unknown = False
        for item in self.items:
            if item.value is None:
                unknown = True
            elif self.domain.compare(a, item.value) == 0:
                return not self.negated
        return None if unknown else self.negated

    def sql(self):
        return f"({self.left.sql} {'NOT IN' if self.negated else 'IN'} ({', '.join(i.sql for i in self.items)}))"

    def prepared(self, collations):
        domain = _ready(self.domain, collations)
        return dataclasses.replace(self, domain=domain, items=tuple(_literal_ready(i, domain) for i in self.items))


@dataclass(frozen=True)
class Between(_OfColumn):
    """``x BETWEEN a AND b`` is ``x >= a AND x <= b`` in three-valued logic (MySQL's own rule)."""

    left: Column
    low: Literal
    high: Literal
    negated: bool
    domain: object

    def test(self, row):
        a = _value(self.left, row, self.domain)
        if a is None:
            return None
        above = None if self.low.value is None else self.domain.compare(a, self.low.value) >= 0
        below = None if self.high.value is None else self.domain.compare(a, self.high.value) <= 0
        inside = _and(above, below)
        return inside if inside is None or not self.negated else not inside

    def sql(self):
        return f"({self.left.sql} {'NOT BETWEEN' if self.negated else 'BETWEEN'} {self.low.sql} AND {self.high.sql})"

    def prepared(self, collations):
        domain = _ready(self.domain, collations)
        return dataclasses.replace(self, domain=domain, low=_literal_ready(self.low, domain),
                                   high=_literal_ready(self.high, domain))


@dataclass(frozen=True)
class IsNull(Condition):
    operand: object  # a Column or a condition
    negated: bool

    def test(self, row):
        value = row[self.operand.name] if isinstance(self.operand, Column) else self.operand.test(row)
        return (value is None) != self.negated

    def sql(self):
        return f"({self.operand.sql if isinstance(self.operand, Column) else self.operand.sql()}" \
               f" IS {'NOT ' if self.negated else ''}NULL)"

    def names(self):
        return self.operand.names()

    def pending(self):
        return iter(()) if isinstance(self.operand, Column) else self.operand.pending()

    def prepared(self, collations):
        if isinstance(self.operand, Column):
            return self
        return dataclasses.replace(self, operand=self.operand.prepared(collations))


@dataclass(frozen=True)
class IsBool(Condition):
    operand: Condition
    truth: bool
    negated: bool

    def test(self, row):
        return (self.operand.test(row) is self.truth) != self.negated

    def sql(self):
        return f"({self.operand.sql()} IS {'NOT ' if self.negated else ''}{'TRUE' if self.truth else 'FALSE'})"

    def names(self):
        return self.operand.names()

    def pending(self):
        return self.operand.pending()

    def prepared(self, collations):
        return dataclasses.replace(self, operand=self.operand.prepared(collations))


@dataclass(frozen=True)
class Not(Condition):
    operand: Condition

    def test(self, row):
        value = self.operand.test(row)
        return None if value is None else not value

    def sql(self):
        return f"(NOT {self.operand.sql()})"

    def names(self):
        return self.operand.names()

    def pending(self):
        return self.operand.pending()

    def prepared(self, collations):
        return dataclasses.replace(self, operand=self.operand.prepared(collations))


def _and(a, b):
    if a is False or b is False:
        return False
    return None if a is None or b is None else True


def _or(a, b):
    if a is True or b is True:
        return True
    return None if a is None or b is None else False


def _xor(a, b):
    return None if a is None or b is None else a != b


LOGIC = {"AND": _and, "OR": _or, "XOR": _xor}


@dataclass(frozen=True)
class Logic(Condition):
    op: str  # AND, OR, XOR
    left: Condition
    right: Condition

    def test(self, row):
        left = self.left.test(row)
        if (left is False and self.op == "AND") or (left is True and self.op == "OR"):
            return left
        return LOGIC[self.op](left, self.right.test(row))

    def sql(self):
        return f"({self.left.sql()} {self.op} {self.right.sql()})"

    def names(self):
        yield from self.left.names()
        yield from self.right.names()

    def pending(self):
        yield from self.left.pending()
        yield from self.right.pending()

    def prepared(self, collations):
        return dataclasses.replace(self, left=self.left.prepared(collations), right=self.right.prepared(collations))


@dataclass(frozen=True)
class Constant(Condition):
    value: bool | None

    def test(self, row):
        return self.value

    def sql(self):
        return {True: "TRUE", False: "FALSE", None: "NULL"}[self.value]

    def names(self):
        return iter(())

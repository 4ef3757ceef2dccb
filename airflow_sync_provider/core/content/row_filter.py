"""A copy's standing row filter (docs/content.md): a MySQL boolean expression over the table's
columns, e.g. ``tenant_id = 7 AND status <> 'test'``.

One parse gives the filter twice, and the two must select the same rows: :meth:`RowFilter.sql`
is the ``WHERE`` a full load reads with, :meth:`RowFilter.matches` decides on each binlog row
image in Python, from the row's base target values (core/typemap.py). So the filter language is
what can be evaluated exactly as MySQL evaluates it (tests/test_content_row_filter.py checks
both against MariaDB); everything else is refused by name rather than guessed:

* logic: ``AND`` / ``&&``, ``OR`` / ``||``, ``XOR``, ``NOT`` / ``!``, parentheses, MySQL's
  precedence and three-valued logic (a row is selected only when the filter is TRUE);
* ``IS [NOT] NULL`` (any column or condition), ``IS [NOT] TRUE / FALSE / UNKNOWN``; a numeric
  column alone as a condition means ``<> 0``, as in MySQL;
* ``= <> != < <= > >= <=>`` between a column and a constant (either side) or two columns of one
  comparable kind; ``[NOT] IN (constant, …)``; ``[NOT] BETWEEN constant AND constant``;
* constants: integers and decimals (exact, at most 65 digits, 30 after the point), quoted
  strings with MySQL's escapes ('' \\' \\n \\t \\0 \\Z \\\\ …; adjacent strings join),
  ``_utf8mb4'…'`` / ``_utf8mb4 X'…'``, ``X'…'`` / ``0x…`` (binary columns only), TRUE, FALSE,
  NULL, and ``DATE'…'`` / ``TIMESTAMP'…'`` / ``TIME'…'``.

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

Zero and invalid dates ('0000-00-00', '2025-02-30') are NULL in the copy, and that is what the
filter sees on both sides: ``sql()`` reads a DATE / DATETIME / TIMESTAMP column as its copied
value, ``TIMESTAMPADD(DAY|SECOND, 0, col)`` (core/typemap.py), which is NULL for them. So on
such a row ``d IS NULL`` is TRUE and ``d < '2000-01-01'`` is NULL — whereas MySQL on the raw
column would order a zero date before every date. (The wrapped column cannot use an index on it.)

Strings of a case- or accent-insensitive collation need their weight table from the server:
:meth:`RowFilter.prepare` loads it (no privilege needed, read-only; cached per server version),
and :meth:`RowFilter.matches` refuses to run without it.

The text is read as MySQL reads it under the default sql_mode (backslash escapes, ``||`` is OR,
"…" is a string); ``sql()`` means the same under any sql_mode and connection character set (hex
string literals, no ``||``, every operation parenthesised). The rules are MySQL's and MariaDB's
alike; the differential test runs on MariaDB, and ``prepare()`` checks each weighted collation
on the server it will be compared against (MySQL 8's default utf8mb4_0900_ai_ci is refused).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import NamedTuple

from airflow_sync_provider.core.content import ContentError
from airflow_sync_provider.core.content import collation as coll
from airflow_sync_provider.core.sql import mysql_ident, mysql_literal
from airflow_sync_provider.core.typemap import RULES, MySQLColumn, map_column

# --- tokens ------------------------------------------------------------------------------------


class _Token(NamedTuple):
    kind: str  # num, str, hex, ident (backquoted), word, op, end
    value: object  # num: int | Decimal; str: str; hex: bytes; ident: name; word: upper case; op: text
    pos: int
    text: str


_SPACE = " \t\n\r\f\v"
_WORD = re.compile(r"[0-9A-Za-z_$\u0080-\uffff]+")
_NUMBER = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")  # ASCII digits only, as MySQL
_OPS = ("<=>", "<=", ">=", "<>", "!=", "&&", "||", "<<", ">>", "<", ">", "=", "!", "(", ")", ",", "-", "+", "*",
        "/", "%", "&", "|", "^", "~")
_ESCAPES = {"0": "\0", "b": "\b", "n": "\n", "r": "\r", "t": "\t", "Z": "\x1a"}
# characters no construct of the language starts with, by what they would start in MySQL
_FOREIGN = {"@": "variables (@var, @@var)", "?": "placeholders (?)", ";": "more than one statement (;)",
            "{": "ODBC escapes ({d '…'})", "}": "ODBC escapes ({d '…'})", "\\": "\\N (write NULL)",
            ":": "assignments (:=)", ".": "qualified names (t.col) and table references",
            "[": "brackets", "]": "brackets"}


def _lex(text: str, fail) -> list[_Token]:
    tokens, i, n = [], 0, len(text)
    while i < n:
        ch = text[i]
        if ch in _SPACE:
            i += 1
        elif ch == "#" or text.startswith(("/*", "--"), i):
            fail(f"comments (and '--', at character {i + 1}) cannot be used in a row filter; remove them")
        elif ch in "'\"":
            value, end = _string(text, i, fail)
            tokens.append(_Token("str", value, i, text[i:end]))
            i = end
        elif ch == "`":
            end = i + 1
            while True:
                end = text.find("`", end)
                if end < 0:
                    fail(f"the quoted name at character {i + 1} has no closing backquote")
                if not text.startswith("``", end):
                    break
                end += 2
            name = text[i + 1:end].replace("``", "`")
            if not name:
                fail(f"the empty quoted name at character {i + 1} is no column's name")
            tokens.append(_Token("ident", name, i, text[i:end + 1]))
            i = end + 1
        elif _NUMBER.match(text, i):
            i = _number(text, i, tokens, fail)
        elif _WORD.match(text, i):
            word = _WORD.match(text, i).group()
            end = i + len(word)
            quoted = text.startswith("'", end)
            if quoted and word in ("X", "x"):
                close = text.find("'", end + 1)
                digits = text[end + 1:close] if close > 0 else "?"
                if not re.fullmatch(r"(?:[0-9A-Fa-f]{2})*", digits):
                    fail(f"the hex literal at character {i + 1} is malformed: write X'…' with an even number of "
                         "hex digits")
                tokens.append(_Token("hex", bytes.fromhex(digits), i, text[i:close + 1]))
                i = close + 1
            elif quoted and word in ("B", "b"):
                fail(f"bit literals (b'…', at character {i + 1}) are not supported; write the number in decimal")
            elif quoted and word in ("N", "n"):
                fail(f"national string literals (N'…', at character {i + 1}) are not supported; write '…'")
            else:
                tokens.append(_Token("word", word.upper(), i, word))
                i = end
        else:
            op = next((o for o in _OPS if text.startswith(o, i)), None)
            if op is None:
                what = _FOREIGN.get(ch, f"the character {ch!r}")
                fail(f"{what} (at character {i + 1}) cannot be used in a row filter")
            tokens.append(_Token("op", op, i, op))
            i += len(op)
    tokens.append(_Token("end", None, n, "end of the filter"))
    return tokens


def _string(text: str, i: int, fail) -> tuple[str, int]:
    """The quoted string at ``i`` with MySQL's escapes (sql_mode without NO_BACKSLASH_ESCAPES)."""
    quote, out, j = text[i], [], i + 1
    while j < len(text):
        ch = text[j]
        if ch == "\\" and j + 1 < len(text):
            nxt = text[j + 1]
            out.append("\\" + nxt if nxt in "%_" else _ESCAPES.get(nxt, nxt))  # \% and \_ keep their backslash
            j += 2
        elif ch == quote and text.startswith(quote * 2, j):
            out.append(quote)
            j += 2
        elif ch == quote:
            return "".join(out), j + 1
        else:
            out.append(ch)
            j += 1
    fail(f"the string at character {i + 1} has no closing quote")


def _number(text: str, i: int, tokens: list, fail) -> int:
    word = _WORD.match(text, i)
    if word and re.fullmatch(r"0x[0-9A-Fa-f]+", word.group()):
        digits = word.group()[2:]
        tokens.append(_Token("hex", bytes.fromhex(digits.rjust(len(digits) + len(digits) % 2, "0")), i, word.group()))
        return word.end()
    match = _NUMBER.match(text, i)
    literal, end = match.group(), match.end()
    if _WORD.match(text, end):
        fail(f"{text[i:_WORD.match(text, end).end()]!r} at character {i + 1} is neither a number nor a name: quote a "
             "column name that starts with a digit with backquotes (bit literals 0b… are not supported)")
    if "e" in literal.lower():
        fail(f"the floating-point literal {literal} (at character {i + 1}) is not supported (MySQL compares it as a "
             "double): write it as a decimal number")
    digits = literal.replace(".", "").lstrip("0")
    fraction = literal.partition(".")[2]
    if len(digits) > 65 or len(fraction) > 30:
        fail(f"the number {literal} has more than 65 digits or 30 after the point (MySQL would read it as a double)")
    tokens.append(_Token("num", Decimal(literal) if "." in literal else int(literal), i, literal))
    return end


# --- parsing: MySQL's grammar and precedence, into tuples checked by the binder below ------------

_COMPARISONS = ("=", "<=>", "<>", "!=", "<", "<=", ">", ">=")
_ARITHMETIC = ("+", "-", "*", "/", "%", "&", "|", "^", "~", "<<", ">>")
_GRAMMAR = {"AND", "OR", "XOR", "NOT", "IS", "IN", "BETWEEN", "UNKNOWN"}
_REFUSED = {
    "LIKE": "LIKE (pattern matching)", "RLIKE": "REGEXP / RLIKE", "REGEXP": "REGEXP / RLIKE",
    "SOUNDS": "SOUNDS LIKE", "MEMBER": "MEMBER OF", "ESCAPE": "LIKE … ESCAPE",
    "CASE": "CASE expressions", "WHEN": "CASE expressions", "THEN": "CASE expressions", "ELSE": "CASE expressions",
    "END": "CASE expressions", "SELECT": "subqueries", "EXISTS": "subqueries (EXISTS)", "ANY": "ANY (subquery)",
    "ALL": "ALL (subquery)", "SOME": "SOME (subquery)", "INTERVAL": "INTERVAL arithmetic", "BINARY": "BINARY casts",
    "COLLATE": "COLLATE (the column's own collation is used)", "DIV": "arithmetic (DIV)", "MOD": "arithmetic (MOD)",
    "MATCH": "full-text search (MATCH … AGAINST)", "AGAINST": "full-text search (MATCH … AGAINST)",
    "ROW": "row constructors", "DEFAULT": "DEFAULT()", "VALUES": "VALUES()", "DISTINCT": "DISTINCT",
    "FROM": "a FROM clause", "WHERE": "a WHERE clause (write only the condition)", "UNION": "UNION",
    "ORDER": "ORDER BY", "GROUP": "GROUP BY", "HAVING": "HAVING", "LIMIT": "LIMIT",
}


class _Parser:
    def __init__(self, text: str, names: set[str], fail):
        self.names = names  # the table's column names, upper case: such a word is a column unless it is grammar
        self.fail = fail
        self.tokens = _lex(text, fail)
        self.i = 0

    def peek(self, ahead: int = 0) -> _Token:
        return self.tokens[min(self.i + ahead, len(self.tokens) - 1)]

    def take(self) -> _Token:
        token = self.peek()
        self.i += 1
        return token

    def word(self, *names, ahead: int = 0) -> bool:
        token = self.peek(ahead)
        return token.kind == "word" and token.value in names

    def op(self, *ops) -> bool:
        return self.peek().kind == "op" and self.peek().value in ops

    def unexpected(self, token: _Token):
        if token.kind == "word" and token.value in _REFUSED:
            self.fail(f"{_REFUSED[token.value]} (at character {token.pos + 1}) cannot be used in a row filter: it "
                      "is not evaluated exactly as MySQL does; write comparisons, IN, BETWEEN and IS tests")
        if token.kind == "op" and token.value in _ARITHMETIC:
            self.fail(f"arithmetic ({token.text}, at character {token.pos + 1}) cannot be used in a row filter: "
                      "compare a column with a constant or another column")
        if token.kind == "op" and token.value == ",":
            self.fail(f"a ',' at character {token.pos + 1}: row constructors and function arguments are not supported")
        self.fail(f"syntax error: unexpected {token.text!r} at character {token.pos + 1}")

    def parse(self):
        if self.peek().kind == "end":
            self.fail("the filter is empty")
        node = self.or_()
        if self.peek().kind != "end":
            self.unexpected(self.peek())
        return node

    def or_(self):
        node = self.xor()
        while self.word("OR") or self.op("||"):
            self.take()
            node = ("OR", node, self.xor())
        return node

    def xor(self):
        node = self.and_()
        while self.word("XOR"):
            self.take()
            node = ("XOR", node, self.and_())
        return node

    def and_(self):
        node = self.not_()
        while self.word("AND") or self.op("&&"):
            self.take()
            node = ("AND", node, self.not_())
        return node

    def not_(self):
        if self.word("NOT"):
            self.take()
            return ("NOT", self.not_())
        return self.test()

    def test(self):
        """Comparisons and IS tests, left-associative at one level (MariaDB's boolean_test)."""
        node = self.predicate()
        while True:
            if self.word("IS"):
                start = self.take().pos
                negated = self.word("NOT") and bool(self.take())
                what = self.take()
                if what.kind != "word" or what.value not in ("NULL", "TRUE", "FALSE", "UNKNOWN"):
                    self.fail(f"IS at character {start + 1} must be followed by [NOT] NULL, TRUE, FALSE or UNKNOWN")
                node = ("IS", node, what.value, negated)
            elif self.op(*_COMPARISONS):
                op = self.take()
                node = ("CMP", "<>" if op.value == "!=" else op.value, node, self.predicate(), op.pos)
            else:
                return node

    def predicate(self):
        node = self.value()
        negated = self.word("NOT") and self.word("IN", "BETWEEN", "LIKE", "REGEXP", "RLIKE", ahead=1)
        if negated:
            self.take()
        if self.word("IN"):
            start = self.take().pos
            if not self.op("("):
                self.fail(f"IN at character {start + 1} must be followed by a parenthesised list of constants")
            self.take()
            items = [self.value()]
            while self.op(","):
                self.take()
                items.append(self.value())
            if not self.op(")"):
                self.unexpected(self.peek())
            self.take()
            return ("IN", node, items, negated, start)
        if self.word("BETWEEN"):
            start = self.take().pos
            low = self.value()
            if not self.word("AND"):
                self.unexpected(self.peek())
            self.take()
            return ("BETWEEN", node, low, self.value(), negated, start)
        if negated or self.word(*_REFUSED):
            self.unexpected(self.peek())
        return node

    def value(self):
        """An operand: a unary expression not followed by arithmetic."""
        node = self.unary()
        if self.op(*_ARITHMETIC) or self.word("DIV", "MOD", "COLLATE"):
            self.unexpected(self.peek())
        return node

    def unary(self):
        token = self.peek()
        if token.kind == "op" and token.value == "!":
            self.take()
            return ("BANG", self.unary(), token.pos)
        if token.kind == "op" and token.value in ("-", "+"):
            self.take()
            number = self.take()
            if number.kind != "num":
                self.fail(f"the sign {token.text} at character {token.pos + 1} applies to something other than a "
                          "number: arithmetic cannot be used in a row filter")
            return ("LIT", "num", -number.value if token.value == "-" else number.value, token.pos)
        return self.primary()

    def joined(self, text: str) -> str:
        """A string and the strings right after it: 'a' 'b' is 'ab', as in MySQL."""
        while self.peek().kind == "str":
            text += self.take().value
        return text

    def primary(self):
        token = self.take()
        nxt = self.peek()
        if token.kind == "op" and token.value == "(":
            node = self.or_()
            if not self.op(")"):
                self.unexpected(self.peek())
            self.take()
            return ("PAREN", node)
        if token.kind in ("num", "hex"):
            return ("LIT", token.kind, token.value, token.pos)
        if token.kind == "str":
            return ("LIT", "str", self.joined(token.value), token.pos)
        if token.kind == "ident":
            return ("COL", token.value, token.pos)
        if token.kind != "word":
            self.unexpected(token)
        name = token.value
        if name in ("TRUE", "FALSE"):
            return ("LIT", "bool", int(name == "TRUE"), token.pos)
        if name == "NULL":
            return ("LIT", "null", None, token.pos)
        if name in ("DATE", "TIME", "TIMESTAMP") and nxt.kind == "str":
            self.take()
            return ("LIT", name.lower(), nxt.value, token.pos)
        if name.startswith("_") and nxt.kind in ("str", "hex"):
            if name != "_UTF8MB4":
                self.fail(f"the character set introducer {token.text} (at character {token.pos + 1}) cannot be used "
                          "in a row filter; write the string without it, or with _utf8mb4")
            self.take()
            if nxt.kind == "str":
                return ("LIT", "str", self.joined(nxt.value), token.pos)
            try:
                return ("LIT", "str", nxt.value.decode("utf-8"), token.pos)
            except UnicodeDecodeError:
                self.fail(f"_utf8mb4 {nxt.text} (at character {token.pos + 1}) is not UTF-8")
        if name in _GRAMMAR or (name in _REFUSED and name not in self.names):
            self.unexpected(token)
        if nxt.kind == "op" and nxt.value == "(":
            self.fail(f"function calls ({token.text}(…), at character {token.pos + 1}) are not supported")
        return ("COL", token.text, token.pos)


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
        return None if value is None else _time_micros(value)


@dataclass(frozen=True)
class _Text:
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


_EXACT, _DOUBLE, _TEMPORAL, _TIME, _BYTES = _Exact(), _Double(), _Temporal(), _Time(), _Exact()


def _time_micros(text: str) -> int:
    sign = -1 if text.startswith("-") else 1
    hours, minutes, seconds = text.lstrip("-").split(":")
    whole, _, fraction = seconds.partition(".")
    return sign * ((int(hours) * 3600 + int(minutes) * 60 + int(whole)) * 1_000_000 + int((fraction + "000000")[:6]))


# --- the bound filter: conditions of three-valued logic -----------------------------------------


@dataclass(frozen=True)
class _Column:
    name: str  # as the table spells it: the row's key
    sql: str  # the column as the WHERE reads it (its copied value for temporal columns)

    def names(self):
        yield self.name


@dataclass(frozen=True)
class _Literal:
    raw: object  # the constant in the column's terms: int, Decimal, float, str, bytes, datetime, µs; None is NULL
    sql: str
    value: object = None  # as the domain compares it (a string's collation key once the collation is ready)

    def names(self):
        return iter(())


class _Condition:
    def prepared(self, collations: dict) -> _Condition:
        return self

    def pending(self):
        return iter(())


def _value(operand, row, domain):
    return operand.value if isinstance(operand, _Literal) else domain.of(row[operand.name])


def _ready(domain, collations):
    return dataclasses.replace(domain, collation=collations[domain.collation.name]) if isinstance(domain, _Text) \
        and not domain.ready else domain


def _literal_ready(literal: _Literal, domain) -> _Literal:
    if literal.raw is None or not domain.ready or not isinstance(domain, _Text):
        return literal
    return dataclasses.replace(literal, value=domain.of(literal.raw))


def _pending(domain):
    if isinstance(domain, _Text) and not domain.ready:
        yield domain


_ORDER = {"=": lambda c: c == 0, "<>": lambda c: c != 0, "<": lambda c: c < 0, "<=": lambda c: c <= 0,
          ">": lambda c: c > 0, ">=": lambda c: c >= 0}
_FLIPPED = {"=": "=", "<=>": "<=>", "<>": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


@dataclass(frozen=True)
class _Compare(_Condition):
    op: str
    left: _Column
    right: _Column | _Literal
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
        right = _literal_ready(self.right, domain) if isinstance(self.right, _Literal) else self.right
        return dataclasses.replace(self, domain=domain, right=right)


@dataclass(frozen=True)
class _In(_Condition):
    left: _Column
    items: tuple[_Literal, ...]
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

    def names(self):
        return self.left.names()

    def pending(self):
        return _pending(self.domain)

    def prepared(self, collations):
        domain = _ready(self.domain, collations)
        return dataclasses.replace(self, domain=domain, items=tuple(_literal_ready(i, domain) for i in self.items))


@dataclass(frozen=True)
class _Between(_Condition):
    """``x BETWEEN a AND b`` is ``x >= a AND x <= b`` in three-valued logic (MySQL's own rule)."""

    left: _Column
    low: _Literal
    high: _Literal
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

    def names(self):
        return self.left.names()

    def pending(self):
        return _pending(self.domain)

    def prepared(self, collations):
        domain = _ready(self.domain, collations)
        return dataclasses.replace(self, domain=domain, low=_literal_ready(self.low, domain),
                                   high=_literal_ready(self.high, domain))


@dataclass(frozen=True)
class _IsNull(_Condition):
    operand: object  # a _Column or a condition
    negated: bool

    def test(self, row):
        value = row[self.operand.name] if isinstance(self.operand, _Column) else self.operand.test(row)
        return (value is None) != self.negated

    def sql(self):
        return f"({self.operand.sql if isinstance(self.operand, _Column) else self.operand.sql()}" \
               f" IS {'NOT ' if self.negated else ''}NULL)"

    def names(self):
        return self.operand.names()

    def pending(self):
        return iter(()) if isinstance(self.operand, _Column) else self.operand.pending()

    def prepared(self, collations):
        if isinstance(self.operand, _Column):
            return self
        return dataclasses.replace(self, operand=self.operand.prepared(collations))


@dataclass(frozen=True)
class _IsBool(_Condition):
    operand: _Condition
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
class _Not(_Condition):
    operand: _Condition

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


_LOGIC = {"AND": _and, "OR": _or, "XOR": _xor}


@dataclass(frozen=True)
class _Logic(_Condition):
    op: str  # AND, OR, XOR
    left: _Condition
    right: _Condition

    def test(self, row):
        left = self.left.test(row)
        if (left is False and self.op == "AND") or (left is True and self.op == "OR"):
            return left
        return _LOGIC[self.op](left, self.right.test(row))

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
class _Constant(_Condition):
    value: bool | None

    def test(self, row):
        return self.value

    def sql(self):
        return {True: "TRUE", False: "FALSE", None: "NULL"}[self.value]

    def names(self):
        return iter(())


# --- binding: names to columns, constants to the columns' terms ---------------------------------

_INTEGERS = {"tinyint", "smallint", "mediumint", "int", "integer", "bigint", "bit"}
_STRINGS = {"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set"}
_NUMERIC = {"int", "year", "decimal", "float"}
_DATE = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})")
_DATETIME = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2}) ([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,6}))?")
_TIME_TEXT = re.compile(r"(-?)([0-9]{1,3}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,6}))?")


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
    def node(col: MySQLColumn) -> _Column:
        ident = mysql_ident(col.name)
        if col.data_type.lower() in ("date", "datetime", "timestamp"):
            return _Column(col.name, map_column(col).source_sql(ident))  # NULL for zero and invalid dates
        return _Column(col.name, ident)

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
        self.fail(f"column {col.name!r} is {col.column_type}, which MySQL compares as JSON values, not emulated; "
                  "leave it out of the filter")

    def text_domain(self, col: MySQLColumn) -> _Text:
        collation = coll.static(col.collation or "")
        if collation is None:
            self.fail(f"column {col.name!r} has collation {col.collation}, which the filter cannot compare exactly "
                      f"(supported: {', '.join(coll.SUPPORTED)}); filter on another column, or give this one a "
                      "supported collation")
        return _Text(collation, col.collation, col.charset or collation.charset)

    def domain(self, col: MySQLColumn, kind: str):
        return {"int": _EXACT, "year": _EXACT, "decimal": _EXACT, "float": _DOUBLE, "date": _TEMPORAL,
                "datetime": _TEMPORAL, "time": _TIME, "binary": _BYTES}.get(kind) or self.text_domain(col)

    # conditions

    def condition(self, node) -> _Condition:
        tag = node[0]
        if tag == "PAREN":
            return self.condition(node[1])
        if tag in _LOGIC:
            return _Logic(tag, self.condition(node[1]), self.condition(node[2]))
        if tag in ("NOT", "BANG"):
            return _Not(self.condition(node[1]))
        if tag == "IS":
            operand, what, negated = _unwrap(node[1]), node[2], node[3]
            if what in ("NULL", "UNKNOWN"):
                if operand[0] == "COL":
                    return _IsNull(self.node(self.column(operand)), negated)
                if operand[0] == "LIT":
                    self.fail(f"IS {what} tests a constant ({_describe(operand)}); test a column or a condition")
                return _IsNull(self.condition(operand), negated)
            return _IsBool(self.condition(operand), what == "TRUE", negated)
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
            return _Compare("<>", self.node(col), _Literal(0, "0", domain.of(0)), domain)
        if node[1] in ("bool", "null"):
            return _Constant(None if node[2] is None else bool(node[2]))
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
            return _Compare(op, self.node(col), self.node(other), self.pair_domain(col, other, op, pos))
        kind = self.kind(col)
        domain = self.domain(col, kind)
        if op in ("=", "<>", "<=>"):
            self.held(col, kind, b, op)
        return _Compare(op, self.node(col), self.literal(col, kind, domain, b), domain)

    def in_list(self, left, items, negated, pos):
        col = self.operands("IN", left, pos)
        kind = self.kind(col)
        domain = self.domain(col, kind)
        for item in items:
            self.held(col, kind, _unwrap(item), "IN")
        return _In(self.node(col), tuple(self.constant(col, kind, domain, i, "IN") for i in items), negated, domain)

    def held(self, col: MySQLColumn, kind: str, node, op: str) -> None:
        """Refuse an equality (=, <>, <=>, IN: negations and the optimizer turn each into =) that
        MariaDB's index lookup (ref access) decides otherwise than its own comparison, so that
        the rows selected would depend on the plan. The lookup first stores the constant into the
        column's type: a number the column cannot hold is rounded or truncated and the comparison
        skipped (``int_col = 1.5`` selects the 2s, ``time0_col = '10:00:00.6'`` the 10:00:00s); a
        text that is no SET value finds nothing (``' '`` and ``'\\0'`` equal the empty set as
        strings). Ranges are rechecked, exact (the differential test runs them through indexes)."""
        if node[0] != "LIT" or node[1] == "null":
            return
        if col.data_type.lower() == "set":
            self.fail(f"column {col.name!r} is a SET compared with {op}: MariaDB's index lookup reads the constant as "
                      "a SET value first and selects rows its own string comparison does not (' ' equals the empty "
                      "set as a string, not as a SET value); filter on another column")
        time = _TIME_TEXT.fullmatch(node[2]) if kind == "time" and node[1] in ("str", "time") else None
        if kind in ("int", "decimal") and node[1] == "num":
            digits, allowed = _fraction_digits(Decimal(node[2])), (col.scale or 0) if kind == "decimal" else 0
        elif time is not None:
            digits, allowed = len((time.group(5) or "").rstrip("0")), col.fsp or 0
        else:
            return
        if digits > allowed:
            self.fail(f"column {col.name!r} ({col.column_type}) is compared with {op} to {_describe(node)}, which it "
                      f"cannot hold ({allowed} digits after the point): no row equals it, yet MariaDB's index lookup "
                      "rounds the constant to the column's type and selects rows its own comparison does not; write "
                      f"a constant with at most {allowed} digits after the point, or a range (<, >)")

    def between(self, left, low, high, negated, pos):
        col = self.operands("BETWEEN", left, pos)
        kind = self.kind(col)
        domain = self.domain(col, kind)
        return _Between(self.node(col), self.constant(col, kind, domain, low, "BETWEEN"),
                        self.constant(col, kind, domain, high, "BETWEEN"), negated, domain)

    def constant(self, col, kind, domain, node, what) -> _Literal:
        node = _unwrap(node)
        if node[0] != "LIT":
            self.fail(f"{what} takes constants only (column {col.name!r}): a column or condition in its list or bounds "
                      "is not supported")
        return self.literal(col, kind, domain, node)

    def pair_domain(self, a: MySQLColumn, b: MySQLColumn, op: str, pos: int):
        ka, kb = self.kind(a), self.kind(b)
        if ka in _NUMERIC and kb in _NUMERIC:
            return _DOUBLE if "float" in (ka, kb) else _EXACT
        if {ka, kb} <= {"date", "datetime"}:
            return _TEMPORAL
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

    def literal(self, col: MySQLColumn, kind: str, domain, node) -> _Literal:
        lit_kind, raw = node[1], node[2]
        if lit_kind == "null":
            return _Literal(None, "NULL")

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
            return _Literal(value, sql, domain.of(value))
        if kind in ("date", "datetime"):
            value = self.temporal(node, refuse)
            sql = f"DATE'{value}'" if type(value) is dt.date else f"TIMESTAMP'{value.isoformat(' ')}'"
            return _Literal(value, sql, domain.of(value))
        if kind == "time":
            if lit_kind not in ("str", "time") or not _TIME_TEXT.fullmatch(raw):
                refuse("a TIME compares with '[-]H:MM:SS[.ffffff]' (at most 6 fraction digits)")
            sign, hours, minutes, seconds, fraction = _TIME_TEXT.fullmatch(raw).groups()
            if int(hours) > 838 or int(minutes) > 59 or int(seconds) > 59:
                refuse("not a TIME value (-838:59:59.999999 … 838:59:59.999999)")
            text = f"{sign}{hours}:{minutes}:{seconds}" + (f".{fraction}" if fraction else "")
            return _Literal(text, f"TIME'{text}'", _time_micros(text))
        if kind == "binary":
            if lit_kind not in ("str", "hex"):
                refuse("MySQL would compare them as numbers; compare it with a quoted string or X'…'")
            value = raw.encode("utf-8") if lit_kind == "str" else raw
            return _Literal(value, f"X'{value.hex()}'", value)
        if lit_kind != "str":
            if col.data_type in ("enum", "set") and lit_kind in ("num", "bool"):
                refuse(f"MySQL compares an {col.data_type.upper()} with a number by its index; compare it with a label")
            refuse("a string column compares exactly with a quoted string only")
        foreign = coll.foreign_character(domain.collation.charset, raw)
        if foreign is not None:
            refuse(f"its character U+{ord(foreign):04X} is not in the column's character set {col.charset} (MySQL "
                   "refuses the comparison); remove it")
        return _Literal(raw, mysql_literal(raw), domain.of(raw) if domain.ready else None)

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
    root: _Condition = field(repr=False)
    where: str = field(default="", repr=False, compare=False)
    ready: bool = field(default=True, repr=False, compare=False)  # False: prepare() must load weight tables

    @classmethod
    def parse(cls, text: str, columns, where: str) -> RowFilter:
        """``columns``: the table's :class:`MySQLColumn` sequence; ``where`` names the table in
        messages (e.g. ``"table db.t"``). Raises :class:`ContentError` naming what is not supported."""

        def fail(message: str):
            raise ContentError(f"{where}: row filter {text!r}: {message}")

        columns = list(columns)
        root = _Binder(columns, fail).condition(_Parser(text, {c.name.upper() for c in columns}, fail).parse())
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

"""Column transforms: each defined once, rendered as Python (loads, bootstrap chunks, binlog row
images) and as MySQL SQL (the source side of checks); tests/test_content_transforms.py proves
the two renderings equal through a real MariaDB.

A transform applies to a column's *base target value* (core/typemap.py: what the copy would
hold untransformed; ``source_sql`` in MySQL, Arrow / ``from_binlog`` values in Python). NULL
stays NULL under every transform, and zero or invalid dates are already NULL there.

* ``hash``: lowercase hex SHA-256 of the salt's bytes followed by the value's canonical bytes:
  a string's UTF-8 bytes (any character set is converted to utf8mb4 first), a binary value's
  raw bytes, an integer's (YEAR and BIT too) decimal text, a DECIMAL's plain text with exactly the
  column's scale (as MySQL's CAST prints it: never an exponent, never '-0'), a DATE as
  'YYYY-MM-DD', a DATETIME / TIMESTAMP as 'YYYY-MM-DD HH:MM:SS' plus '.' and exactly fsp
  digits when fsp > 0, a TIME as its text. Salted so that a dictionary of likely values (emails,
  phone numbers) cannot be hashed to reverse the copy; deterministic so that equal values still
  join and group, and so the one transform a key column may take (distinct keys stay distinct).
  FLOAT / DOUBLE are refused: MySQL's text of a double is not Python's, so no canonical text
  is the same in both renderings.
* ``mask(keep_first, keep_last)``: the first keep_first and the last keep_last characters
  (code points, as MySQL's CHAR_LENGTH/LEFT/RIGHT count them) are kept and every character
  between them becomes '*', so the length shows but not the content. A value of no more than
  keep_first + keep_last characters is all stars: keeping it whole would hide nothing.
* ``truncate(n)``: the first n characters.
* ``redact(text)``: every value becomes ``text``.
* ``null``: every value becomes NULL; the column keeps its place and type (made Nullable), so
  the copy's shape and the queries of it stay as they were.

mask and truncate take string columns only (CHAR, VARCHAR, TEXT family, ENUM, SET, JSON):
characters of other types are not what a user means to keep. A key column takes only ``hash``:
anything else could make distinct keys equal.

Each SQL rendering gives a utf8mb4 string (or NULL). ``hash`` reads its salt from the session
variable :data:`SALT_VARIABLE` (:func:`set_salt`), never from the statement's text, so the salt
appears in no statement the jobs log; unset, every hash is NULL (and a check reports every row).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from dataclasses import dataclass
from decimal import Decimal

import pyarrow as pa
import pyarrow.compute as pc

from airflow_sync_provider.core.content import ContentError
from airflow_sync_provider.core.sql import mysql_literal
from airflow_sync_provider.core.typemap import (
    BinaryRule,
    BitRule,
    DateRule,
    DateTimeRule,
    DecimalRule,
    IntRule,
    SpatialRule,
    StringRule,
    TimeRule,
    YearRule,
)

SALT_VARIABLE = "@airflow_sync_hash_salt"

FORMS = "hash, null, mask(keep_first, keep_last), truncate(n), redact('text')"
_MAX_CHARS = 2 ** 32 - 1  # LONGTEXT's length: a larger count changes nothing
_HASHED = (StringRule, BinaryRule, SpatialRule, IntRule, YearRule, BitRule, DecimalRule, DateRule, DateTimeRule,
           TimeRule)
_SALT_HOW = ("put the salt in an environment variable and name it with hash_salt_env (CLI: --hash-salt-env), "
             "or keep it in an Airflow connection")


def salt_sql(salt: bytes) -> str:
    """The statement that sets :data:`SALT_VARIABLE`, for a connection that takes no bound values
    (connectorx's pre-execution statements). A secret: never logged."""
    _need_salt(salt, "the hash salt")
    return f"SET {SALT_VARIABLE} = UNHEX('{salt.hex()}')"


def set_salt(cursor, salt: bytes) -> None:
    """Set :data:`SALT_VARIABLE` on a pymysql or MySQLdb cursor's session. The salt goes as a bound
    hex string that UNHEX makes binary: MySQLdb sends bytes without pymysql's ``_binary`` prefix,
    as text of the connection's character set, which is not every salt's bytes."""
    _need_salt(salt, "the hash salt")
    cursor.execute(f"SET {SALT_VARIABLE} = UNHEX(%s)", (salt.hex(),))


def _need_salt(salt, what: str) -> None:
    if not isinstance(salt, (bytes, bytearray)) or not salt:
        raise ContentError(f"{what}: transform hash needs a non-empty salt (bytes) and none was given: {_SALT_HOW}")


@dataclass(frozen=True)
class Transform:
    name: str
    args: tuple = ()

    def __post_init__(self):
        shapes = {"hash": (), "null": (), "mask": (int, int), "truncate": (int,), "redact": (str,)}
        if self.name not in shapes:
            raise ContentError(f"unknown transform {self.name!r}; the transforms are: {FORMS}")
        shape = shapes[self.name]
        if len(self.args) != len(shape) or any(type(a) is not t for a, t in zip(self.args, shape)):
            wanted = ", ".join(t.__name__ for t in shape) or "no arguments"
            raise ContentError(f"transform {self.name} takes ({wanted}), not {self.args!r}; the forms are: {FORMS}")
        for a in self.args:
            if isinstance(a, int) and not 0 <= a <= _MAX_CHARS:
                raise ContentError(f"transform {self.spec()}: a character count is 0 … {_MAX_CHARS}, not {a}")
            if isinstance(a, str):
                try:
                    a.encode()
                except UnicodeEncodeError as exc:
                    raise ContentError(f"transform redact: its text must be valid Unicode (it holds a lone "
                                       f"surrogate at {exc.start}); give text without one") from None

    @classmethod
    def parse(cls, text: str) -> Transform:
        """``hash``, ``null``, ``mask(0, 4)``, ``truncate(100)``, ``redact('***')`` (quotes doubled
        inside, '' or \"\"); whitespace anywhere between the parts; names in any case."""
        m = re.fullmatch(r"\s*([A-Za-z]+)\s*(?:\((.*)\))?\s*", text, re.S) if isinstance(text, str) else None
        name, body = (m.group(1).lower(), m.group(2)) if m else (None, None)
        patterns = {"hash": None, "null": None, "mask": r"\s*([0-9]+)\s*,\s*([0-9]+)\s*", "truncate": r"\s*([0-9]+)\s*",
                    "redact": r"\s*(?:'((?:[^']|'')*)'|\"((?:[^\"]|\"\")*)\")\s*"}
        if name in patterns and (body is None) == (patterns[name] is None):
            if body is None:
                return cls(name)
            a = re.fullmatch(patterns[name], body, re.S)
            if a and name == "redact":
                single, double = a.groups()
                return cls(name, (single.replace("''", "'") if single is not None else double.replace('""', '"'),))
            if a:
                return cls(name, tuple(int(g) for g in a.groups()))
        raise ContentError(f"transform {text!r} is not one of: {FORMS} (counts are whole numbers >= 0; "
                           "a quote inside redact's text is doubled)")

    def spec(self) -> str:
        if self.name == "redact":
            return "redact('" + self.args[0].replace("'", "''") + "')"
        return f"{self.name}({', '.join(map(str, self.args))})" if self.args else self.name

    def check(self, mapping, key: bool, where: str) -> None:
        """Refuse this transform of ``mapping``'s column when it cannot apply (``key``: the column
        is in the primary key); ``where`` names the table."""
        what = f"{where}, column {mapping.name!r}: transform {self.spec()}"
        if key and self.name != "hash":
            raise ContentError(f"{what}: the column is part of the primary key, which the copy is keyed by; "
                               f"{self.name} could make distinct keys equal. Use hash (distinct keys stay distinct) "
                               "or leave the column untransformed")
        rule, column_type = mapping.rule, mapping.source.column_type
        if self.name in ("mask", "truncate") and not isinstance(rule, StringRule):
            raise ContentError(f"{what}: {self.name} applies to string columns (CHAR, VARCHAR, TEXT, ENUM, SET, JSON), "
                               f"not {column_type}; use hash, redact or null for it")
        if self.name == "hash" and not isinstance(rule, _HASHED):
            raise ContentError(f"{what}: a {column_type} value has no text that MySQL and Python both print the same, "
                               "so its hash could not be checked; use redact or null, or hash a DECIMAL copy of it "
                               "in a view")

    # the types below read the rule's, never the mapping's: a mapping that carries this transform
    # gives the transformed ones

    def ch_type(self, mapping) -> str:
        if self.name == "null":
            return f"Nullable({mapping.rule.ch_type(mapping.source)})"
        return "Nullable(String)" if _may_be_null(mapping) else "String"

    def arrow_type(self, mapping) -> pa.DataType:
        return mapping.rule.arrow_type(mapping.source) if self.name == "null" else pa.string()

    def py(self, value, mapping, salt: bytes | None):
        """The transformed value of the base target value ``value``."""
        if self.name == "hash":
            _need_salt(salt, f"column {mapping.name!r}")
            return None if value is None else _sha256(hashlib.sha256(salt), value, mapping.source)
        if value is None or self.name == "null":
            return None
        if self.name == "redact":
            return self.args[0]
        if self.name == "truncate":
            return value[: self.args[0]]
        first, last = self.args
        n = len(value)
        if n <= first + last:
            return "*" * n
        return value[:first] + "*" * (n - first - last) + value[n - last:]

    def arrow(self, array: pa.Array, mapping, salt: bytes | None) -> pa.Array:
        """:meth:`py` of each value of ``array`` (of the rule's Arrow type), as an array of :meth:`arrow_type`."""
        if self.name == "hash":
            _need_salt(salt, f"column {mapping.name!r}")
            if pa.types.is_string(array.type) or pa.types.is_binary(array.type):
                # the hot path (a load's batches): UTF-8 bytes straight from Arrow, no str per value
                sha256, raw = hashlib.sha256, array.cast(pa.binary()).to_pylist()
                return pa.array([None if v is None else sha256(salt + v).hexdigest() for v in raw], pa.string())
            salted = hashlib.sha256(salt)
            return pa.array([None if v is None else _sha256(salted, v, mapping.source) for v in array.to_pylist()],
                            pa.string())
        if self.name == "null":
            return pa.nulls(len(array), array.type)
        if self.name == "redact":
            return pc.if_else(pc.is_valid(array), pa.scalar(self.args[0]), pa.scalar(None, pa.string()))
        if self.name == "truncate":
            return pc.utf8_slice_codeunits(array, 0, self.args[0])  # code points, as the name does not say
        first, last = self.args
        n = pc.utf8_length(array)
        short = pc.less_equal(n, first + last)
        stars = pc.binary_repeat("*", pc.if_else(short, n, pc.subtract(n, first + last)))
        parts = [stars]
        if first:
            parts.insert(0, pc.if_else(short, "", pc.utf8_slice_codeunits(array, 0, first)))
        if last:
            parts.append(pc.if_else(short, "", pc.utf8_slice_codeunits(array, -last)))
        return pc.binary_join_element_wise(*parts, "") if len(parts) > 1 else stars

    def mysql_sql(self, expr: str, mapping) -> str:
        """The transformed value as MySQL computes it from ``expr``, the base target value's SQL."""
        if self.name == "null":
            return "CAST(NULL AS CHAR CHARACTER SET utf8mb4)"  # typed: a reader may take it as a column
        if self.name == "redact":
            text = mysql_literal(self.args[0])  # a hex literal: no quoting, whatever the sql_mode
            return f"IF({expr} IS NULL, NULL, {text})" if _may_be_null(mapping) else text
        if self.name == "hash":
            return f"SHA2(CONCAT({SALT_VARIABLE}, {_canonical_sql(expr, mapping)}), 256)"
        s = _utf8mb4(expr, mapping.source)
        if self.name == "truncate":
            return f"LEFT({s}, {self.args[0]})"
        first, last = self.args
        n = f"CHAR_LENGTH({s})"
        parts = [*([f"LEFT({s}, {first})"] if first else []), f"REPEAT(_utf8mb4'*', {n} - {first + last})",
                 *([f"RIGHT({s}, {last})"] if last else [])]
        return f"IF({n} <= {first + last}, REPEAT(_utf8mb4'*', {n}), CONCAT({', '.join(parts)}))"


def _may_be_null(mapping) -> bool:
    """The base target value can be NULL: a NULL-able column, or zero dates read as NULL."""
    return mapping.source.nullable or mapping.rule.null_for_invalid


def _utf8mb4(expr: str, col) -> str:
    """``expr`` of a string column in utf8mb4: the text Python holds, counted and hashed the same
    (latin1's 'é' is one byte there, two in UTF-8); MySQL 8's JSON has no character set."""
    if (col.charset or "").lower() == "utf8mb4" and col.data_type != "json":
        return expr
    return f"CAST({expr} AS CHAR CHARACTER SET utf8mb4)"


def _canonical_sql(expr: str, mapping) -> str:
    rule, col = mapping.rule, mapping.source
    if isinstance(rule, StringRule):
        return _utf8mb4(expr, col)
    if isinstance(rule, DateRule):
        return f"DATE_FORMAT({expr}, '%Y-%m-%d')"
    if isinstance(rule, DateTimeRule):
        # spelled out rather than CAST: the text does not hang on the fraction digits a server gives
        # TIMESTAMPADD's result
        if not col.fsp:
            return f"DATE_FORMAT({expr}, '%Y-%m-%d %H:%i:%s')"
        return f"LEFT(DATE_FORMAT({expr}, '%Y-%m-%d %H:%i:%s.%f'), {20 + col.fsp})"
    # binary values as their bytes; TIME is text already; numbers as CONCAT converts them: CAST(… AS CHAR)
    return expr


def _canonical(value, col) -> bytes:
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, Decimal):
        # a MySQL server's binlog image can hold -0, which the copy (and Arrow) holds as 0; the
        # format spells out every digit at the scale, where str() would write 0E-10
        return format(value.copy_abs() if value.is_zero() else value, f".{col.scale or 0}f").encode()
    if isinstance(value, dt.datetime):
        text = value.isoformat(" ", "seconds")  # strftime's %Y does not pad years before 1000
        return (text + f".{value.microsecond:06d}"[: col.fsp + 1] if col.fsp else text).encode()
    if isinstance(value, dt.date):
        return value.isoformat().encode()
    if isinstance(value, int):
        return str(value).encode()
    raise ContentError(f"column {col.name!r}: transform hash has no canonical text for a {type(value).__name__} "
                       f"value of a {col.column_type} column; use redact or null for it")


def _sha256(salted, value, col) -> str:
    """The hex SHA-256 of the salt (``salted``: a hash object that has taken it) and ``value``'s canonical bytes."""
    h = salted.copy()
    h.update(_canonical(value, col))
    return h.hexdigest()

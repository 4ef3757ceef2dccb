"""Strings compared as MySQL compares them under a column's collation (the row filter's strings).

A collation orders strings by the sequence of their characters' weights. Each supported
collation becomes a translation of a string into a ``key``, a Python ``str`` of weight units,
so that comparing two keys by code point is comparing the strings as the server does:

* ``*_bin`` collations of Unicode character sets and ASCII order by code point: the key is the
  string itself. latin1's ``*_bin`` order by latin1 byte: the key maps each character to its byte.
  These need nothing from the server.
* the case- and accent-insensitive collations (``utf8mb4_general_ci``, ``utf8mb4_unicode_ci``,
  ``latin1_swedish_ci``, …) use each character's weight, read from the server with
  ``WEIGHT_STRING`` (:func:`load`): every character of the character set (the BMP, or the 256 /
  128 bytes of latin1 / ascii) one by one, and the 1,048,576 supplementary characters checked on
  the server to share one weight (MariaDB gives them U+FFFD's). The weight of a string must be
  the concatenation of its characters' weights (no contractions, no context): only collations
  whose definition has none are accepted, and :func:`load` checks it on the server with long
  strings of every character in code point order, shuffled, and each character followed by
  combining marks and letters that other collations contract.

PAD SPACE collations (all but ``*_nopad_*``) compare the shorter key as if padded with the space's
weight, so trailing spaces are ignored and a character weighing less than the space (a tab, under
``*_general_ci`` / ``*_bin``) sorts the string before its trimmed self, as MariaDB does.
"""

from __future__ import annotations

import random
import re
import sys
from array import array
from dataclasses import dataclass, field

# MariaDB's latin1: cp1252, with the five bytes cp1252 leaves undefined as the same code points
LATIN1 = "".join(chr(b) if b in (0x81, 0x8D, 0x8F, 0x90, 0x9D) else bytes([b]).decode("cp1252") for b in range(256))
_LATIN1_BYTE = {ord(c): chr(b) for b, c in enumerate(LATIN1)}

# name → (character set, PAD SPACE): ordered by code point (or latin1 byte), nothing to load
CODE_POINT = {
    "utf8mb4_bin": ("utf8mb4", True), "utf8mb4_nopad_bin": ("utf8mb4", False),
    "utf8mb3_bin": ("utf8mb3", True), "utf8mb3_nopad_bin": ("utf8mb3", False),
    "ascii_bin": ("ascii", True), "ascii_nopad_bin": ("ascii", False),
    "latin1_bin": ("latin1", True), "latin1_nopad_bin": ("latin1", False),
}
# collations whose definition weighs each character alone (no contractions, no context)
WEIGHTED = {
    "utf8mb4_general_ci": ("utf8mb4", True), "utf8mb4_general_nopad_ci": ("utf8mb4", False),
    "utf8mb4_unicode_ci": ("utf8mb4", True), "utf8mb4_unicode_nopad_ci": ("utf8mb4", False),
    "utf8mb3_general_ci": ("utf8mb3", True), "utf8mb3_general_nopad_ci": ("utf8mb3", False),
    "utf8mb3_unicode_ci": ("utf8mb3", True), "utf8mb3_unicode_nopad_ci": ("utf8mb3", False),
    "latin1_swedish_ci": ("latin1", True), "latin1_swedish_nopad_ci": ("latin1", False),
    "latin1_general_ci": ("latin1", True), "latin1_general_cs": ("latin1", True),
    "latin1_german1_ci": ("latin1", True), "latin1_danish_ci": ("latin1", True),
    "latin1_spanish_ci": ("latin1", True),
    "ascii_general_ci": ("ascii", True), "ascii_general_nopad_ci": ("ascii", False),
}
SUPPORTED = sorted({*CODE_POINT, *WEIGHTED})
_NAME = re.compile(r"^[a-z0-9_]+$")


def canonical(name: str) -> str:
    """``utf8_general_ci`` (older servers' name) → ``utf8mb3_general_ci``."""
    name = name.lower()
    return "utf8mb3_" + name[5:] if name.startswith("utf8_") else name


def foreign_character(charset: str, text: str) -> str | None:
    """The first character of ``text`` the character set cannot hold (None: all fit). MySQL
    refuses to compare a column with a literal holding one ("Illegal mix of collations")."""
    for ch in text:
        cp = ord(ch)
        if 0xD800 <= cp <= 0xDFFF or (charset == "utf8mb3" and cp > 0xFFFF) or (charset == "ascii" and cp > 0x7F) \
                or (charset == "latin1" and cp not in _LATIN1_BYTE):
            return ch
    return None


class _Table(dict):
    """Code point → weight units (a str; '' for an ignorable character); characters beyond the
    BMP weigh ``supplementary``. Never changed once built."""

    def __init__(self, items, supplementary: str | None):
        super().__init__(items)
        self.supplementary = supplementary

    def __missing__(self, cp: int) -> str:
        if cp > 0xFFFF and self.supplementary is not None:
            return self.supplementary
        # never kept as it is (what str.translate does on a LookupError): the table would be wrong
        raise ValueError(f"character U+{cp:04X} has no weight in this collation's table")

    def __reduce__(self):
        """Pickled small: which code points it holds (a bitmap), and only the weights that are not
        the character itself (about 1,100 of utf8mb4_general_ci's 63,488)."""
        present, odd, weights, lengths = bytearray(8192), [], [], bytearray()
        for cp, weight in self.items():
            present[cp >> 3] |= 1 << (cp & 7)
            if weight != chr(cp):
                odd.append(chr(cp))
                weights.append(weight)
                lengths.append(len(weight))  # a character weighs at most 8 units
        return _rebuilt, (bytes(present), "".join(odd), "".join(weights), bytes(lengths), self.supplementary)

    def __deepcopy__(self, memo):
        return self  # copies of a filter share it


def _rebuilt(present: bytes, odd: str, weights: str, lengths: bytes, supplementary: str | None) -> _Table:
    table = {cp: chr(cp) for cp in range(len(present) * 8) if present[cp >> 3] >> (cp & 7) & 1}
    start = 0
    for ch, length in zip(odd, lengths):
        table[ord(ch)] = weights[start:start + length]
        start += length
    return _Table(table.items(), supplementary)


_LATIN1_ORDER = _Table(_LATIN1_BYTE.items(), None)  # latin1_bin orders by byte


def _units(weight: bytes, unit: int) -> str:
    """A ``WEIGHT_STRING`` as a str of its big-endian units: comparing such strs compares weights."""
    if unit == 1:
        return weight.decode("latin-1")
    units = array("H", weight)
    if sys.byteorder == "little":
        units.byteswap()
    return "".join(map(chr, units))


@dataclass(frozen=True)
class Collation:
    """How strings of one collation compare (``ready`` once its table, if it needs one, is loaded)."""

    name: str
    charset: str
    pad: bool
    space: str = " "  # the space's key: one weight unit
    table: dict | None = field(default=None, compare=False, repr=False)  # None: the string is its key
    ready: bool = field(default=True, compare=False)

    def key(self, text: str) -> str:
        return text if self.table is None else text.translate(self.table)

    def compare(self, a: str, b: str) -> int:
        """-1, 0, 1 as MySQL orders the strings whose keys are ``a`` and ``b``."""
        if self.pad and len(a) != len(b):
            width = max(len(a), len(b))
            a, b = a.ljust(width, self.space), b.ljust(width, self.space)
        return (a > b) - (a < b)


def static(name: str) -> Collation | None:
    """The collation as far as it is known without a server: ready for the code point ones, a
    placeholder to :func:`load` for the weighted ones; None when it is not supported."""
    key = canonical(name)
    if key in CODE_POINT:
        charset, pad = CODE_POINT[key]
        return Collation(key, charset, pad, table=_LATIN1_ORDER if charset == "latin1" else None)
    if key in WEIGHTED:
        charset, pad = WEIGHTED[key]
        return Collation(key, charset, pad, ready=False)
    return None


class CollationMismatch(ValueError):
    """The server's collation is not what its name promises (checked by :func:`load`)."""


_DIGITS = "WITH d(i) AS (" + " UNION ALL ".join(f"SELECT {i}" for i in range(16)) + ")"
_LOADED: dict[tuple[str, str], Collation] = {}  # (server version, collation) → loaded collation


def _rows(conn, sql: str) -> list:
    cur = conn.cursor()
    try:
        cur.execute(sql)
        return list(cur.fetchall())
    finally:
        cur.close()


def _bytes(value) -> bytes:
    return value if isinstance(value, (bytes, bytearray)) else str(value).encode("latin1")


def _text(value) -> str:
    return value.decode() if isinstance(value, (bytes, bytearray)) else str(value)


def encode(charset: str, text: str) -> bytes:
    """``text`` in the character set's bytes (it must hold every character: :func:`foreign_character`)."""
    if charset == "latin1":
        return bytes(ord(_LATIN1_BYTE[ord(c)]) for c in text)
    return text.encode("ascii" if charset == "ascii" else "utf-8")


def load(conn, name: str, charset: str) -> Collation:
    """The collation ``name`` (a column's collation, of character set ``charset``) with its weight
    table read from the server (DB-API connection; nothing is written and no table read, so any
    user on any replica can). Raises :class:`CollationMismatch` when the server's collation is
    not what the emulation assumes."""
    placeholder = static(name)
    if placeholder is None or placeholder.ready:
        return placeholder
    for part in (name, charset):
        if not _NAME.match(part or ""):
            raise CollationMismatch(f"unexpected collation or character set name {part!r}")
    version, pads = _rows(conn, f"SELECT VERSION(), CONVERT(_utf8mb4'a' USING {charset}) COLLATE {name}"
                                f" = CONVERT(_utf8mb4'a ' USING {charset}) COLLATE {name}")[0]
    cached = _LOADED.get((_text(version), name))
    if cached is not None:
        return cached
    if bool(int(pads)) != placeholder.pad:
        raise CollationMismatch(f"the server's {name} {'pads' if int(pads) else 'does not pad'} trailing spaces")
    if placeholder.charset in ("latin1", "ascii"):
        (weights, supplementary), unit = _byte_weights(conn, placeholder, name, charset), 1
    else:
        (weights, supplementary), unit = _unicode_weights(conn, placeholder, name, charset), 2
    space = weights[" "]
    if len(space) != unit or any(len(w) % unit for w in weights.values()) or len(supplementary or b"") % unit:
        raise CollationMismatch(f"the server's {name} has weights of another width than {unit} byte(s)")
    table = _Table(((ord(c), _units(w, unit)) for c, w in weights.items()),
                   None if supplementary is None else _units(supplementary, unit))
    collation = Collation(placeholder.name, placeholder.charset, placeholder.pad, _units(space, unit), table)
    _check_concatenation(conn, collation, name, charset, list(weights), unit)
    _LOADED[(_text(version), name)] = collation
    return collation


def _byte_weights(conn, collation: Collation, name: str, charset: str) -> tuple[dict, None]:
    """Each character of latin1 / ascii → its weight, checking the server's bytes are this
    module's characters (literals are checked and encoded with them)."""
    last = 256 if collation.charset == "latin1" else 128
    rows = _rows(conn, f"{_DIGITS} SELECT n, HEX(CONVERT(CHAR(n USING {charset}) USING utf8mb4)),"
                       f" WEIGHT_STRING(CHAR(n USING {charset}) COLLATE {name})"
                       f" FROM (SELECT a.i * 16 + b.i AS n FROM d a, d b) x WHERE n < {last}")
    chars = {int(n): bytes.fromhex(_text(h)).decode() for n, h, _ in rows}
    if "".join(chars[n] for n in sorted(chars)) != LATIN1[:last]:
        raise CollationMismatch(f"the server's {charset} maps bytes to other characters than this emulation")
    return {chars[int(n)]: _bytes(w) for n, _, w in rows}, None


def _unicode_weights(conn, collation: Collation, name: str, charset: str) -> tuple[dict, bytes | None]:
    """Each BMP character → its weight, and (utf8mb4) the one weight every character beyond the
    BMP has, checked on the server for all of them."""
    char = f"CONVERT(CONVERT(UNHEX(LPAD(HEX(n), 8, '0')) USING utf32) USING {charset})"
    rows = _rows(conn, f"{_DIGITS} SELECT n, WEIGHT_STRING({char} COLLATE {name}) FROM (SELECT a.i * 4096"
                       " + b.i * 256 + c.i * 16 + e.i AS n FROM d a, d b, d c, d e) x WHERE n < 55296 OR n > 57343")
    weights = {chr(int(n)): _bytes(w) for n, w in rows}
    if collation.charset == "utf8mb4":
        count, low, high = _rows(
            conn, f"{_DIGITS} SELECT COUNT(*), MIN(w), MAX(w) FROM (SELECT WEIGHT_STRING({char} COLLATE {name}) AS w"
                  " FROM (SELECT 65536 + a.i * 65536 + b.i * 4096 + c.i * 256 + e.i * 16 + f.i AS n"
                  " FROM d a, d b, d c, d e, d f) x) y")[0]
        if int(count) != 0x100000 or low is None or low != high:
            raise CollationMismatch(f"the server's {name} does not weigh every supplementary character alike")
        return weights, _bytes(low)
    return weights, None


# characters that other collations contract with the one before (combining marks, 'h' of Czech
# 'ch', 'l' of Spanish 'll', 'a' of Danish 'aa', the middle dot of Catalan 'l·')
_FOLLOWERS = "\u0300\u0308\u030a\u0327hla\u00b7"


def _check_concatenation(conn, collation: Collation, name: str, charset: str, chars: list[str], unit: int) -> None:
    """Check on the server that strings weigh their characters' weights in a row."""
    shuffled = chars[:]
    random.Random(0).shuffle(shuffled)
    probes = ["".join(chars), "".join(shuffled)]
    probes += ["".join(c + f for c in chars) for f in _FOLLOWERS if foreign_character(collation.charset, f) is None]
    if collation.charset == "utf8mb4":
        probes.append("a\U0001F600b\U00010000\U0010FFFD ")
    pieces = [probe[i:i + 2048] for probe in probes for i in range(0, len(probe), 2048)]
    for start in range(0, len(pieces), 32):
        batch = pieces[start:start + 32]
        got = _rows(conn, "SELECT " + ", ".join(f"WEIGHT_STRING(CONVERT(X'{encode(collation.charset, p).hex()}'"
                                                f" USING {charset}) COLLATE {name})" for p in batch))[0]
        for piece, weight in zip(batch, got):
            if _units(_bytes(weight), unit) != collation.key(piece):
                raise CollationMismatch(f"the server's {name} weighs some strings otherwise than their characters'"
                                        " weights in a row (a contraction or a context)")

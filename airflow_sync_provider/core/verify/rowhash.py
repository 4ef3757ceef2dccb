"""The row text and 64-bit row hash that reconciliation's checksums, the snapshot diff's buckets
and CDC's verification compute in both databases, from one builder per dialect.

A row's text is one token per column, joined by ',':

* a NULL is ``N``;
* a value of a ``plain_text`` rule (numbers, dates, times, hex; core/typemap.py) is its
  canonical text, which never holds ',' and is never ``N``;
* any other value (strings, ENUM, SET, JSON) is ``<byte length>:<bytes>``.

Injective (docs/design-reconciliation.md): the table's columns fix which kind each token is, and
reading left to right a plain token ends at the next ',' (or the end), a length-prefixed one
after exactly its length's bytes; ``N`` cannot start either a plain value or a length. So the
text gives back every value's text and NULL-ness, which the type rules make equal only for equal
values. The old CHAR(31)-joined text was not: a value holding the separator could move a
boundary (issue 24).

The hash is the first 64 bits of SHA-1 of the text. MariaDB computes SHA-1 in about a fifth of
the time of MD5 (0.07 vs 0.35 s per 500k rows of the demo table), which is why it is not MD5.
"""

from __future__ import annotations

from airflow_sync_provider.core.sql import ch_ident, mysql_ident


def _token(m, side: str) -> str:
    if side == "mysql":
        text = m.mysql_text(mysql_ident(m.name))
        if not m.plain_text:
            text = f"CONCAT(LENGTH({text}), ':', {text})"  # LENGTH: bytes, as ClickHouse's length()
        return f"IFNULL({text}, 'N')" if m.text_may_be_null else text
    text = m.ch_text(ch_ident(m.name))
    if not m.plain_text:
        text = f"concat(toString(length({text})), ':', {text})"
    return f"ifNull({text}, 'N')" if m.text_may_be_null else text


def row_text(mappings, side: str) -> str:
    """The row text of ``mappings`` (columns with ``mysql_text``/``ch_text``, ``plain_text`` and
    ``text_may_be_null``) as an expression of ``side``: ``"mysql"`` or ``"clickhouse"``."""
    tokens = ", ".join(_token(m, side) for m in mappings)
    if side == "mysql":
        # each token's bytes are hashed as they are (UTF-8 columns unconverted, others CAST to
        # utf8mb4 by their rule); the separator is a binary literal so that it brings no collation
        # of its own. MariaDB joins columns of different collations here without an error
        # (utf8mb4_bin, _unicode_ci, _general_ci, utf8mb3, latin1: tests/test_row_text.py)
        return f"CONCAT_WS(_binary',', {tokens})"
    return f"concatWithSeparator(',', {tokens})"


def mysql_row_hash(mappings) -> str:
    """A row's 64-bit hash in MySQL: the first 64 bits of the SHA-1 of its row text."""
    return f"CAST(CONV(LEFT(SHA1({row_text(mappings, 'mysql')}), 16), 16, 10) AS UNSIGNED)"


def ch_row_hash(mappings) -> str:
    """The same row text and hash in ClickHouse (SHA1 is 20 raw bytes there, big-endian first)."""
    return f"reinterpretAsUInt64(reverse(substring(SHA1({row_text(mappings, 'clickhouse')}), 1, 8)))"

"""Column transforms (core/content/transforms.py): the spec language, the refusals, the target
types, the Arrow rendering equal to the Python one value for value, and — through the real
MariaDB — the MySQL rendering equal to the Python one on every column type a transform takes
(every string character set, binaries, integers at their extremes, DECIMALs at several scales,
dates, times, zero dates), hypothesis-drawn rows and fixed edge rows, under salts holding quotes,
a backslash, non-ASCII and non-UTF-8 bytes."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import uuid
from decimal import Context, Decimal
from typing import NamedTuple

import pyarrow as pa
import pymysql
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_sync_provider.core.content import ContentError
from airflow_sync_provider.core.content.transforms import SALT_VARIABLE, Transform, set_salt
from airflow_sync_provider.core.endpoints import MySQLEndpoint
from airflow_sync_provider.core.source import reader
from airflow_sync_provider.core.source.schema import read_table_schema
from airflow_sync_provider.core.sql import mysql_ident
from airflow_sync_provider.core.typemap import MySQLColumn, StringRule, map_column
from tests import spatial

SALT = "sél't\"\\ 🙂".encode() + b"\xff\x00'"  # not UTF-8: the salt is bytes, not text


def _mapping(data_type, column_type=None, nullable=True, **kw):
    return map_column(MySQLColumn("c", data_type, column_type or data_type, nullable, **kw))


VARCHAR = _mapping("varchar", "varchar(20)", charset="utf8mb4")
WHERE = "table shop.users"

# --- the spec language ----------------------------------------------------------------------------

_COUNT = st.integers(0, 2 ** 32 - 1)
_TEXT = st.characters(codec="utf-8", exclude_categories=("Cs",))
TRANSFORMS = st.one_of(
    st.sampled_from([Transform("hash"), Transform("null")]),
    st.tuples(_COUNT, _COUNT).map(lambda a: Transform("mask", a)),
    _COUNT.map(lambda n: Transform("truncate", (n,))),
    st.text(_TEXT).map(lambda t: Transform("redact", (t,))),
)


@given(TRANSFORMS)
def test_spec_parses_back_to_the_same_transform(t):
    assert Transform.parse(t.spec()) == t


@pytest.mark.parametrize("text, expected", [
    ("hash", Transform("hash")), (" HASH ", Transform("hash")), ("null", Transform("null")),
    ("mask(0,4)", Transform("mask", (0, 4))), ("mask ( 2 ,  0 )", Transform("mask", (2, 0))),
    ("truncate(100)", Transform("truncate", (100,))), ("redact('***')", Transform("redact", ("***",))),
    ("redact('it''s')", Transform("redact", ("it's",))), ('redact("x")', Transform("redact", ("x",))),
    ('redact( "say ""hi"", it\'s" )', Transform("redact", ('say "hi", it\'s',))),
    ("redact('')", Transform("redact", ("",))), ("redact('a\nb')", Transform("redact", ("a\nb",))),
])
def test_parse_accepts_the_documented_forms(text, expected):
    assert Transform.parse(text) == expected


@pytest.mark.parametrize("text", [
    "", "sha256", "hash()", "null(1)", "mask", "mask(1)", "mask(1,2,3)", "mask(-1,2)", "mask(1.5,2)", "mask(a,b)",
    "truncate()", "truncate(-1)", "truncate(1e3)", "redact", "redact(x)", "redact('it's')", "redact('a'",
    "redact(\"a')", "hash; DROP TABLE t", "mask(1,2) mask(1,2)", "truncate(4294967296)",
])
def test_parse_refuses_anything_else_naming_the_text_and_the_forms(text):
    with pytest.raises(ContentError) as err:
        Transform.parse(text)
    if "4294967296" not in text:
        assert repr(text) in str(err.value) and "mask(keep_first, keep_last)" in str(err.value)


@pytest.mark.parametrize("name, args", [
    ("sha1", ()), ("mask", (1,)), ("mask", (-1, 2)), ("mask", (True, 2)), ("truncate", ("3",)),
    ("redact", (3,)), ("redact", ("\ud800",)), ("hash", (1,)),
])
def test_a_transform_built_with_wrong_arguments_is_refused(name, args):
    with pytest.raises(ContentError):
        Transform(name, args)


# --- refusals ---------------------------------------------------------------------------------

@pytest.mark.parametrize("spec, mapping, key, said", [
    ("mask(0, 4)", VARCHAR, True, "primary key"),
    ("redact('x')", _mapping("int", "int(11)"), True, "primary key"),
    ("null", VARCHAR, True, "primary key"),
    ("mask(0, 4)", _mapping("int", "int(11)"), False, "int(11)"),
    ("truncate(3)", _mapping("time", "time(3)", fsp=3), False, "time(3)"),
    ("truncate(3)", _mapping("blob"), False, "blob"),
    ("hash", _mapping("double"), False, "double"),
    ("hash", _mapping("float"), False, "float"),
])
def test_refusals_name_the_table_column_transform_and_what_to_do(spec, mapping, key, said):
    with pytest.raises(ContentError) as err:
        Transform.parse(spec).check(mapping, key, WHERE)
    message = str(err.value)
    assert WHERE in message and "'c'" in message and Transform.parse(spec).spec() in message and said in message
    assert "use " in message.lower()


@pytest.mark.parametrize("spec, mapping", [
    ("hash", VARCHAR), ("hash", _mapping("bigint", "bigint(20) unsigned")), ("hash", _mapping("bit", "bit(64)")),
    ("hash", _mapping("decimal", "decimal(10,2)", precision=10, scale=2)), ("hash", _mapping("date")),
    ("hash", _mapping("blob")), ("mask(1, 1)", _mapping("enum", "enum('a')")), ("truncate(2)", _mapping("json")),
    ("redact('x')", _mapping("double")), ("null", _mapping("datetime", "datetime(3)", fsp=3)),
])
def test_accepted_transforms_pass_the_check(spec, mapping):
    Transform.parse(spec).check(mapping, spec == "hash", WHERE)


def test_hash_without_a_salt_says_how_to_give_one_and_the_salt_shows_nowhere():
    for call in (lambda t: t.py("x", VARCHAR, None), lambda t: t.arrow(pa.array([None], pa.string()), VARCHAR, None)):
        with pytest.raises(ContentError, match="hash_salt_env.*--hash-salt-env.*Airflow connection"):
            call(Transform("hash"))

    class Cursor:
        def execute(self, sql, args):
            self.sql, self.args = sql, args

    cur = Cursor()
    set_salt(cur, SALT)
    assert SALT_VARIABLE in cur.sql and SALT.hex() not in cur.sql and cur.args == (SALT.hex(),)
    with pytest.raises(ContentError):
        set_salt(cur, b"")


# --- target types -------------------------------------------------------------------------------

@pytest.mark.parametrize("spec, mapping, ch_type, arrow_type", [
    ("hash", VARCHAR, "Nullable(String)", pa.string()),
    ("hash", _mapping("int", "int(11)", nullable=False), "String", pa.string()),
    ("hash", _mapping("date", nullable=False), "Nullable(String)", pa.string()),  # zero dates read as NULL
    ("mask(0, 4)", _mapping("varchar", nullable=False), "String", pa.string()),
    ("redact('x')", _mapping("datetime", "datetime(6)", nullable=False, fsp=6), "Nullable(String)", pa.string()),
    ("null", _mapping("int", "int(10) unsigned", nullable=False), "Nullable(UInt32)", pa.uint32()),
    ("null", _mapping("decimal", "decimal(40,5)", precision=40, scale=5), "Nullable(Decimal(40, 5))",
     pa.decimal256(40, 5)),
])
def test_target_types(spec, mapping, ch_type, arrow_type):
    t = Transform.parse(spec)
    assert (t.ch_type(mapping), t.arrow_type(mapping)) == (ch_type, arrow_type)


# --- Python: the canonical text of hash, and Arrow equal to py() ------------------------------------

def _digest(text: bytes) -> str:
    return hashlib.sha256(SALT + text).hexdigest()


@pytest.mark.parametrize("value, mapping, text", [
    ("é🙂", VARCHAR, "é🙂".encode()),
    (b"\x00\xff", _mapping("binary", "binary(2)"), b"\x00\xff"),
    (-128, _mapping("tinyint", "tinyint(4)"), b"-128"),
    (Decimal("0E-10"), _mapping("decimal", "decimal(12,10)", precision=12, scale=10), b"0.0000000000"),
    (Decimal("-0.00"), _mapping("decimal", "decimal(5,2)", precision=5, scale=2), b"0.00"),
    (Decimal("1E+5"), _mapping("decimal", "decimal(9,0)", precision=9, scale=0), b"100000"),
    (Decimal("-12.5"), _mapping("decimal", "decimal(9,3)", precision=9, scale=3), b"-12.500"),
    (dt.date(2024, 2, 29), _mapping("date"), b"2024-02-29"),
    (dt.datetime(2024, 1, 2, 3, 4, 5), _mapping("datetime", fsp=0), b"2024-01-02 03:04:05"),
    (dt.datetime(2024, 1, 2, 3, 4, 5), _mapping("datetime", "datetime(3)", fsp=3), b"2024-01-02 03:04:05.000"),
    (dt.datetime(2024, 1, 2, 3, 4, 5, 120000), _mapping("timestamp", "timestamp(2)", fsp=2), b"2024-01-02 03:04:05.12"),
    ("-838:59:59.5", _mapping("time", "time(1)", fsp=1), b"-838:59:59.5"),
])
def test_hash_is_the_salted_sha256_of_the_canonical_text(value, mapping, text):
    assert Transform("hash").py(value, mapping, SALT) == _digest(text)
    assert Transform("hash").py(None, mapping, SALT) is None


_STRINGS = st.lists(st.none() | st.text(st.one_of(_TEXT, st.sampled_from("é\u0301🙂👍🏽 *'")), max_size=12))


_SMALL_MASKS = st.tuples(st.integers(0, 6), st.integers(0, 6)).map(lambda a: Transform("mask", a))


@given(values=_STRINGS, t=TRANSFORMS | _SMALL_MASKS)
def test_arrow_is_py_on_every_value(values, t):
    array = pa.array(values, pa.string())
    expected = [t.py(v, VARCHAR, SALT) for v in values]
    got = t.arrow(array, VARCHAR, SALT)
    assert got.type == t.arrow_type(VARCHAR) and got.to_pylist() == expected


@pytest.mark.parametrize("value, spec, expected", [
    ("abcdef", "mask(1, 2)", "a***ef"), ("abc", "mask(1, 2)", "***"), ("ab", "mask(1, 2)", "**"),
    ("", "mask(1, 2)", ""), ("e\u0301🙂xyz", "mask(2, 1)", "e\u0301***z"), ("abc", "mask(0, 0)", "***"),
    ("abcd", "mask(0, 2)", "**cd"), ("🙂🙂🙂", "truncate(2)", "🙂🙂"), ("ab", "truncate(5)", "ab"),
    ("ab", "truncate(0)", ""), ("x", "redact('*')", "*"), ("x", "null", None), (None, "redact('*')", None),
])
def test_mask_truncate_redact_null_examples(value, spec, expected):
    t = Transform.parse(spec)
    assert t.py(value, VARCHAR, None) == expected == t.arrow(pa.array([value], pa.string()), VARCHAR, None)[0].as_py()


def test_null_keeps_the_base_arrow_type():
    mapping = _mapping("decimal", "decimal(5,2)", precision=5, scale=2)
    got = Transform("null").arrow(pa.array([Decimal("1.50"), None], mapping.arrow_type), mapping, None)
    assert got.type == mapping.arrow_type and got.to_pylist() == [None, None]


# --- the MySQL rendering equals the Python one, through the real MariaDB ------------------------------

DB = f"transforms_{uuid.uuid4().hex[:8]}"
# MariaDB's latin1: cp1252, with the five bytes cp1252 leaves undefined as the same code points
LATIN1 = "".join(chr(b) if b in (0x81, 0x8D, 0x8F, 0x90, 0x9D) else bytes([b]).decode("cp1252") for b in range(256))
_MARKS = "é\u0301\u0308🙂👍🏽 *'\"\\,"
_U4 = st.one_of(_TEXT, st.sampled_from(_MARKS))
_BMP = st.one_of(st.characters(codec="utf-8", max_codepoint=0xFFFF, exclude_categories=("Cs",)),
                 st.sampled_from("é\u0301 *'"))
_EDGES4 = ["", "a", "ab", "abcd", "abcde", "ab  ", " 🙂e\u0301x", "it's \\ \"q\" *", "\x00z", "👍🏽"]
_EDGES3 = ["", "a", "ab", "abcd", "abcde", "ab  ", "日本語 ñ", "e\u0301\u0301", "\uffff"]
_EDGES1 = ["", "é", "ab", "Ünïc", "Ünïcö", "é  ", "\x81\x8d\x8f\x90\x9d", "Œ‰€"]
_EDGESA = ["", "a", "ab", "abcd", "abcde", "a  ", "\x7f\x01"]


def _text(name, ddl, alphabet, size, edges, longest):
    return name, ddl, st.text(alphabet, max_size=size), [e for e in edges if len(e) <= size] + [longest * size]


def _int(bits, unsigned):
    lo, hi = (0, 2 ** bits - 1) if unsigned else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    return st.integers(lo, hi), [lo, hi, 0, 1]


def _decimal(p, s):
    def text(n):  # scaleb rounds to the context's precision, 28 digits by default
        return format(Decimal(n).scaleb(-s, Context(prec=100)), "f")

    return st.integers(-(10 ** p - 1), 10 ** p - 1).map(text), [text(10 ** p - 1), text(1 - 10 ** p), text(1),
                                                                 text(-1), "0", "-0"]


def _time(micros):
    sign, micros = ("-" if micros < 0 else ""), abs(micros)
    h, rest = divmod(micros, 3_600_000_000)
    return f"{sign}{h}:{rest // 60_000_000:02d}:{rest // 1_000_000 % 60:02d}.{rest % 1_000_000:06d}"


_TIME_LIMIT = (838 * 3600 + 59 * 60 + 59) * 10 ** 6 + 999_999
# the copy's range (core/typemap.check_array refuses dates ClickHouse would clamp), and zero dates
_DATES = st.dates(dt.date(1900, 1, 1), dt.date(2299, 12, 31)).map(str)
_DATETIMES = st.datetimes(dt.datetime(1900, 1, 1), dt.datetime(2299, 12, 31, 23, 59, 59)).map(str)
_TIMESTAMPS = st.datetimes(dt.datetime(1970, 1, 1, 0, 0, 1), dt.datetime(2038, 1, 19, 3, 14, 7)).map(str)
_JSON = st.recursive(st.none() | st.booleans() | st.integers(-2 ** 53, 2 ** 53) | st.text(_U4, max_size=6),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(_U4, max_size=4), inner,
                                                                                 max_size=3), max_leaves=6)
_ENUM = ["a", "bé", "🙂x", "long label", ""]
_SET = ["x", "yé", "z"]

# (column, type, value strategy, edge values); every column is NULL-able but those named *_nn
COLUMNS = [
    _text("c4", "CHAR(10) CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci", _U4, 10, _EDGES4, "🙂"),
    _text("v4", "VARCHAR(40) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin", _U4, 40, _EDGES4, "é"),
    _text("v4_nn", "VARCHAR(12) CHARACTER SET utf8mb4 NOT NULL", _U4, 12, _EDGES4, "x"),
    _text("tx", "TEXT CHARACTER SET utf8mb4", _U4, 300, _EDGES4, "🙂"),
    _text("v3", "VARCHAR(20) CHARACTER SET utf8mb3 COLLATE utf8mb3_general_ci", _BMP, 20, _EDGES3, "日"),
    _text("l1", "VARCHAR(20) CHARACTER SET latin1", st.sampled_from(LATIN1), 20, _EDGES1, "é"),
    _text("cl", "CHAR(6) CHARACTER SET latin1 COLLATE latin1_bin", st.sampled_from(LATIN1), 6, _EDGES1, "ÿ"),
    _text("asc", "VARCHAR(10) CHARACTER SET ascii", st.characters(max_codepoint=127), 10, _EDGESA, "z"),
    ("e", f"ENUM({', '.join(repr(x) for x in _ENUM)}) CHARACTER SET utf8mb4", st.sampled_from(_ENUM), _ENUM),
    ("el", "ENUM('é', 'ab', 'abcde') CHARACTER SET latin1", st.sampled_from(["é", "ab", "abcde"]), ["é", "abcde"]),
    ("s", "SET('x', 'yé', 'z')", st.sets(st.sampled_from(_SET)).map(",".join), ["", "x,yé,z", "z"]),
    ("j", "JSON", _JSON.map(lambda v: json.dumps(v, ensure_ascii=False)), ["{}", "null", '{"k": "ü🙂"}', '"ab"']),
    ("bn", "BINARY(6)", st.binary(max_size=6), [b"", b"a", b"\x00" * 6, b"\xff" * 6]),
    ("vb", "VARBINARY(20)", st.binary(max_size=20), [b"", b"\x00", b"\x80\xff", b"'\\"]),
    ("bl", "BLOB", st.binary(max_size=300), [b"", bytes(range(256))]),
    ("ge", "GEOMETRY", spatial.values("geometry"), spatial.edge_values("geometry")),  # MySQL's SRID + WKB
    ("pt", "POINT", spatial.values("point"), spatial.edge_values("point")),
    *[(name, ddl, *_int(bits, "UNSIGNED" in ddl)) for name, ddl, bits in [
        ("i8", "TINYINT", 8), ("u8", "TINYINT UNSIGNED", 8), ("i16", "SMALLINT", 16), ("u16", "SMALLINT UNSIGNED", 16),
        ("i24", "MEDIUMINT", 24), ("u24", "MEDIUMINT UNSIGNED", 24), ("i32", "INT", 32), ("u32", "INT UNSIGNED", 32),
        ("i64", "BIGINT", 64), ("u64", "BIGINT UNSIGNED", 64), ("bo", "BOOLEAN", 8), ("i32_nn", "INT NOT NULL", 32)]],
    *[(f"d{p}_{s}", f"DECIMAL({p}, {s})", *_decimal(p, s))
      for p, s in [(65, 30), (65, 0), (39, 2), (38, 10), (30, 30), (10, 0), (5, 2), (1, 0), (12, 10)]],
    ("da", "DATE", _DATES | st.sampled_from(["0000-00-00", "2025-02-30"]),
     ["1900-01-01", "2299-12-31", "2024-02-29", "0000-00-00", "2025-00-10"]),
    ("da_nn", "DATE NOT NULL", _DATES, ["1900-01-01", "2024-02-29"]),
    *[(f"dt{fsp}", f"DATETIME({fsp})", _DATETIMES,
       ["1900-01-01 00:00:00", "2299-12-31 23:59:59.999999", "2024-01-01 00:00:00.000001", "2024-01-01 10:00:00.5",
        "0000-00-00 00:00:00"]) for fsp in range(7)],
    *[(f"ts{fsp}", f"TIMESTAMP({fsp}) NULL", _TIMESTAMPS,
       ["1970-01-01 00:00:01", "2038-01-19 03:14:07.999999", "2000-01-01 00:00:00.5", "0000-00-00 00:00:00"])
      for fsp in (0, 3, 6)],
    *[(f"t{fsp}", f"TIME({fsp})", st.integers(-_TIME_LIMIT, _TIME_LIMIT).map(_time),
       ["838:59:59.999999", "-838:59:59.999999", "-0:00:00.5", "0:00:00", "-1:02:03.000001"]) for fsp in (0, 3, 6)],
    ("y", "YEAR", st.sampled_from([0, 1901, 2155]) | st.integers(1901, 2155), [0, 1901, 2155]),
    ("b1", "BIT(1)", st.integers(0, 1), [0, 1]),
    ("b64", "BIT(64)", st.integers(0, 2 ** 64 - 1), [0, 2 ** 64 - 1, 2 ** 63]),
    ("f", "FLOAT", st.floats(width=32, allow_nan=False, allow_infinity=False), [0.0, -0.0, 1.5e-7, 3.4e38]),
    ("g", "DOUBLE", st.floats(allow_nan=False, allow_infinity=False), [0.0, 1e15, 5e-324, -1.7976931348623157e308]),
]
CANDIDATES = [Transform.parse(s) for s in (
    "hash", "null", "redact('it''s ☃ \"x\" \\')", "redact('')", "truncate(0)", "truncate(1)", "truncate(3)",
    "mask(0, 0)", "mask(0, 4)", "mask(2, 0)", "mask(1, 1)", "mask(3, 2)")]
SALTS = [SALT, "naïve 'salt' ☃".encode()]


def _refused(t: Transform, mapping, key: bool) -> bool:
    """Which (column, transform) pairs the check must refuse: the test's own statement of the rules."""
    return ((key and t.name != "hash") or (t.name in ("mask", "truncate") and not isinstance(mapping.rule, StringRule))
            or (t.name == "hash" and mapping.source.data_type in ("float", "double")))


class Table(NamedTuple):
    conn: pymysql.connections.Connection
    schema: object
    pairs: list  # (mapping, transform) the check accepts

    def __repr__(self):  # hypothesis prints a failing example's arguments
        return f"Table({DB}.t, {len(self.pairs)} column transforms)"


@pytest.fixture(scope="module")
def table(mysql_url):
    """The table, its mappings, and the (column, transform) pairs the check accepts."""
    conn = pymysql.connect(**MySQLEndpoint.from_url(mysql_url).connect_args(), autocommit=True)
    columns = ", ".join(f"`{name}` {ddl}" + ("" if ddl.endswith("NULL") else " NULL") for name, ddl, *_ in COLUMNS)
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE {DB}")
        cur.execute(f"CREATE TABLE {DB}.t (id INT NOT NULL PRIMARY KEY, {columns})")
    schema = read_table_schema(conn, DB, "t")
    pairs = []
    for mapping in schema.mappings():
        key = mapping.name in schema.primary_key
        for t in CANDIDATES:
            try:
                t.check(mapping, key, schema.qualified)
            except ContentError:
                assert _refused(t, mapping, key), (mapping.name, t.spec())
                continue
            assert not _refused(t, mapping, key), (mapping.name, t.spec())
            pairs.append((mapping, t))
    yield Table(conn, schema, pairs)
    with conn.cursor() as cur:
        cur.execute(f"DROP DATABASE {DB}")
    conn.close()


def _rows(data) -> list[tuple]:
    """Edge rows (each column's edge values in turn), a row of NULLs, then drawn rows."""
    depth = max(len(edges) for *_, edges in COLUMNS)
    rows = [tuple(edges[i % len(edges)] for *_, edges in COLUMNS) for i in range(depth)]
    rows.append(tuple(edges[0] if ddl.endswith("NOT NULL") else None for _, ddl, _, edges in COLUMNS))
    drawn = st.tuples(*(s if ddl.endswith("NOT NULL") else st.none() | s for _, ddl, s, _ in COLUMNS))
    return rows + data.draw(st.lists(drawn, max_size=12))


def _base_values(mysql_url, schema) -> pa.RecordBatch:
    """The table's base target values read as a load reads them (mysqlclient, text protocol, Arrow casts)."""
    mappings = schema.mappings()
    conn = reader.stream_connect(MySQLEndpoint.from_url(mysql_url))
    try:
        cur = conn.cursor()
        cur.execute(f"SELECT {reader.select_list(mappings)} FROM {DB}.t ORDER BY id")
        rows = cur.fetchall()
        cur.close()
    finally:
        conn.close()
    return reader.to_batch(rows, mappings, reader.arrow_schema(mappings), f"table {schema.qualified}")


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_mysql_computes_what_python_computes(mysql_url, table, data):
    conn, schema, pairs = table
    rows = _rows(data)
    names = ", ".join(f"`{name}`" for name, *_ in COLUMNS)
    with conn.cursor() as cur:
        cur.execute("SET SESSION sql_mode = 'STRICT_TRANS_TABLES,ALLOW_INVALID_DATES', time_zone = '+00:00'")
        cur.execute(f"DELETE FROM {DB}.t")
        cur.executemany(f"INSERT INTO {DB}.t (id, {names}) VALUES (%s{', %s' * len(COLUMNS)})",
                        [(i, *row) for i, row in enumerate(rows)])
    batch = _base_values(mysql_url, schema)
    exprs = [t.mysql_sql(m.source_sql(mysql_ident(m.name)), m) for m, t in pairs]
    with conn.cursor() as cur:
        # every rendering is a utf8mb4 string (or NULL), and no two collations clash in one statement
        cur.execute(f"SELECT {', '.join(f'CHARSET({e})' for e in exprs)} FROM {DB}.t LIMIT 1")
        charsets = cur.fetchone()
        assert {(m.name, t.spec()): c for (m, t), c in zip(pairs, charsets) if c != "utf8mb4"} == {}
        for salt in SALTS:
            set_salt(cur, salt)
            cur.execute(f"SELECT {', '.join(exprs)} FROM {DB}.t ORDER BY id")
            by_mysql = list(zip(*cur.fetchall()))
            wrong = []
            for (m, t), mysql_values in zip(pairs, by_mysql):
                base = batch.column(m.name)
                arrow = t.arrow(base, m, salt)
                assert arrow.type == t.arrow_type(m)
                arrow_values = arrow.to_pylist()
                for n, value in enumerate(base.to_pylist()):
                    py = t.py(value, m, salt)
                    if not mysql_values[n] == py == arrow_values[n]:
                        wrong.append((m.name, t.spec(), value, mysql_values[n], py, arrow_values[n]))
            assert not wrong, f"{len(wrong)} values differ (column, transform, base, MySQL, py, arrow): {wrong[:10]}"

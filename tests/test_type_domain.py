"""Every mapped type's whole domain round-trips: MariaDB → full load → ClickHouse, compared with
an independent read of the source (tests/helpers.py) and with ``reconcile --checksum``.

Hypothesis draws rows per type family; each family's edge values (zero and invalid dates,
YEAR 0, ENUM's error value, BIT(64) max, TIME ±838:59:59.999999, CHAR trailing spaces, BINARY
padding, float specials, DECIMAL extremes, non-ASCII text in latin1 / utf16 / utf8mb3) are in
every example. Rows are written under a lax ``sql_mode`` (zero and invalid dates accepted), as
the sources that hold such values run. A mutation check shows the test fails when one
conversion rule of core/typemap.py is changed.
"""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_sync_provider.core import typemap
from airflow_sync_provider.core.clickhouse.columns import ReservedColumn
from airflow_sync_provider.core.endpoints import MySQLEndpoint
from airflow_sync_provider.core.jobspec import FullLoadSpec, ReconcileSpec
from airflow_sync_provider.core.source.group import one_server
from airflow_sync_provider.spark.full_load import LoadFailed, run_full_load
from airflow_sync_provider.spark.reconcile import run_reconcile
from tests import spatial
from tests.helpers import assert_same_rows

pytestmark = pytest.mark.slow
DB, TARGET = "domain", "domain_ch"


def _int(bits, unsigned):
    return st.integers(0, 2 ** bits - 1) if unsigned else st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)


def _decimal(p, s):
    return st.integers(-(10 ** p - 1), 10 ** p - 1).map(lambda n: format(Decimal(n).scaleb(-s), "f"))


def _decimal_edges(p, s):
    top = format(Decimal(10 ** p - 1).scaleb(-s), "f")
    return [top, "-" + top, format(Decimal(1).scaleb(-s), "f"), "0"]


def _time_literal(micros: int) -> str:
    sign, micros = ("-" if micros < 0 else ""), abs(micros)
    h, rest = divmod(micros, 3_600_000_000)
    m, rest = divmod(rest, 60_000_000)
    s, us = divmod(rest, 1_000_000)
    return f"{sign}{h}:{m:02d}:{s:02d}.{us:06d}"  # MariaDB truncates to the column's precision


_TIME_LIMIT = (838 * 3600 + 59 * 60 + 59) * 10 ** 6 + 999_999
_times = st.integers(-_TIME_LIMIT, _TIME_LIMIT).map(_time_literal)


BAD_DATES = ["0000-00-00", "2025-00-10", "2025-02-30", "2023-04-31", "2025-01-00", "0000-01-01"]
BAD_DATETIMES = ["0000-00-00 00:00:00", "2025-00-10 10:00:00.5", "2025-02-30 01:02:03", "0000-00-00 10:11:12"]
_TEXT = st.characters(codec="utf-8", exclude_categories=("Cs",))
_LATIN1 = st.characters(codec="cp1252")
_BMP = st.characters(codec="utf-8", max_codepoint=0xFFFF, exclude_categories=("Cs",))
_json = st.recursive(st.none() | st.booleans() | st.integers(-2 ** 53, 2 ** 53) | st.text(_TEXT, max_size=8),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(_TEXT, max_size=5), inner,
                                                                                 max_size=3), max_leaves=8)

# family → [(column, DDL type, value strategy, edge values)]; every column is nullable
FAMILIES = {
    "integers": [
        (name, ddl, _int(bits, "UNSIGNED" in ddl), [0, *((2 ** bits - 1,) if "UNSIGNED" in ddl else
                                                        (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1))])
        for name, ddl, bits in [("i8", "TINYINT", 8), ("u8", "TINYINT UNSIGNED", 8), ("i16", "SMALLINT", 16),
                                ("u16", "SMALLINT UNSIGNED", 16), ("i24", "MEDIUMINT", 24),
                                ("u24", "MEDIUMINT UNSIGNED", 24), ("i32", "INT", 32), ("u32", "INT UNSIGNED", 32),
                                ("i64", "BIGINT", 64), ("u64", "BIGINT UNSIGNED", 64), ("bool", "BOOLEAN", 8)]
    ],
    "decimals": [(f"d{p}_{s}", f"DECIMAL({p}, {s})", _decimal(p, s), _decimal_edges(p, s))
                 for p, s in [(65, 30), (65, 0), (30, 30), (38, 10), (39, 2), (12, 2)]],
    "floats": [
        ("f", "FLOAT", st.floats(width=32, allow_nan=False, allow_infinity=False),
         [0.0, -0.0, 3.4028234663852886e38, -3.4028234663852886e38, 1.401298464324817e-45, 1.1754943508222875e-38,
          123456789.125, 0.1]),
        ("g", "DOUBLE", st.floats(allow_nan=False, allow_infinity=False),
         [0.0, -0.0, 5e-324, -5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, -1.7976931348623157e308,
          1e20, 1.5e-7]),
    ],
    "dates": [("d", "DATE", st.dates(dt.date(1900, 1, 1), dt.date(2299, 12, 31)).map(str) | st.sampled_from(BAD_DATES),
               [*BAD_DATES, "1900-01-01", "2299-12-31", "2024-02-29"])],
    "datetimes": [
        (f"dt{fsp}", f"DATETIME({fsp})",
         st.datetimes(dt.datetime(1900, 1, 1), dt.datetime(2299, 12, 31, 23, 59, 59, 999999)).map(str)
         | st.sampled_from(BAD_DATETIMES),
         [*BAD_DATETIMES, "1900-01-01 00:00:00", "2299-12-31 23:59:59.999999"]) for fsp in (0, 3, 6)
    ] + [("ts", "TIMESTAMP(6) NULL",
          st.datetimes(dt.datetime(1970, 1, 2), dt.datetime(2038, 1, 18)).map(str),
          ["0000-00-00 00:00:00", "1970-01-01 00:00:01", "2038-01-19 03:14:07.999999"])],
    "years": [("y", "YEAR", st.sampled_from([0, 1901, 2155]) | st.integers(1901, 2155), [0, 1901, 2155, 2000])],
    "times": [(f"t{fsp}", f"TIME({fsp})", _times,
               ["838:59:59.999999", "-838:59:59.999999", "-0:00:00.5", "0:00:00", "-1:02:03"]) for fsp in (0, 3, 6)],
    "bits": [(f"b{n}", f"BIT({n})", st.integers(0, 2 ** n - 1), [0, 2 ** n - 1, 1]) for n in (1, 7, 33, 64)],
    "strings": [
        ("c", "CHAR(8)", st.text(_TEXT, max_size=8), ["a  ", "  ", "", " a", "a\t"]),
        ("v", "VARCHAR(20) CHARACTER SET utf8mb4", st.text(_TEXT, max_size=20), ["🙂ñ", "it's \\ \"q\"", "\x00x"]),
        ("l1", "VARCHAR(20) CHARACTER SET latin1", st.text(_LATIN1, max_size=20), ["Ünïcödé €", "ÿ", "Œ‰"]),
        ("u16", "VARCHAR(20) CHARACTER SET utf16", st.text(_TEXT, max_size=20), ["𝄞 clef", "日本語"]),
        ("u3", "VARCHAR(20) CHARACTER SET utf8mb3", st.text(_BMP, max_size=20), ["日本語 ñ", "\uffff"]),
        ("tx", "TEXT", st.text(_TEXT, max_size=200), ["", "x" * 3000]),
    ],
    "enums_sets": [
        ("e", "ENUM('a', 'b', 'ü', '')", st.sampled_from(["a", "b", "ü", "", "not a label"]), ["not a label", "ü"]),
        ("s", "SET('x', 'y', 'z')", st.sets(st.sampled_from("xyz")).map(lambda v: ",".join(sorted(v, reverse=True))),
         ["", "x,y,z", "z,x"]),
    ],
    "json": [("j", "JSON", _json.map(lambda v: json.dumps(v, ensure_ascii=False)), ["{}", "[]", "null", '{"k": "ü"}'])],
    "binaries": [
        ("bn", "BINARY(6)", st.binary(max_size=6), [b"", b"a", b"\x00" * 6, b"\xff" * 6]),
        ("vb", "VARBINARY(20)", st.binary(max_size=20), [b"", b"\x00", b"a\x00", b"\x80\xff"]),
        ("bl", "BLOB", st.binary(max_size=300), [b"", bytes(range(256))]),
    ],
    # MySQL's own bytes (SRID + WKB): every kind, SRID 0 and 4326, empty collections (tests/spatial.py)
    "spatial": [(name, kind.upper(), spatial.values(kind), spatial.edge_values(kind))
                for name, kind in (("ge", "geometry"), ("pt", "point"), ("ls", "linestring"), ("pg", "polygon"),
                                   ("mpt", "multipoint"), ("mls", "multilinestring"), ("mpg", "multipolygon"),
                                   ("gc", "geometrycollection"))],
}
# a mapped type no family covers would escape the test
assert {ddl.split("(")[0].split()[0].lower() for cols in FAMILIES.values() for _, ddl, _, _ in cols} >= {
    "tinyint", "smallint", "mediumint", "int", "bigint", "boolean", "decimal", "float", "double", "date",
    "datetime", "timestamp", "year", "time", "bit", "char", "varchar", "text", "enum", "set", "json", "binary",
    "varbinary", "blob", "geometry", "point", "linestring", "polygon", "multipoint", "multilinestring", "multipolygon",
    "geometrycollection"}


@pytest.fixture(scope="module")
def conn(mysql_url):
    import pymysql

    connection = pymysql.connect(**MySQLEndpoint.from_url(mysql_url).connect_args(), autocommit=True)
    with connection.cursor() as cur:
        cur.execute(f"CREATE DATABASE IF NOT EXISTS {DB}")
        # the lax mode of the sources that hold zero and invalid dates and ENUM error values
        cur.execute("SET SESSION sql_mode = 'ALLOW_INVALID_DATES', time_zone = '+00:00'")
    yield connection
    connection.close()


def _edge_rows(columns) -> list[tuple]:
    """Each column's edge values, spread over as many rows as the longest list needs."""
    depth = max(len(edges) for *_, edges in columns)
    return [tuple(edges[i] if i < len(edges) else None for *_, edges in columns) for i in range(depth)]


@pytest.fixture(scope="module")
def target(endpoints):
    from airflow_sync_provider.core.clickhouse.client import client

    ch = client(endpoints[1])
    yield ch
    ch.close()


def round_trip(conn, target, endpoints, spark, family: str, rows: list[tuple], reimport: bool = False) -> dict:
    """Write ``rows`` (plus an all-NULL row) into the family's table, load it, compare the target
    with the source row for row, and reconcile with checksums. Returns the reconciliation."""
    columns = FAMILIES[family]
    table = f"{DB}.{family}"
    with conn.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS {table}")
        cur.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, "
                    + ", ".join(f"`{name}` {ddl}" + ("" if "NULL" in ddl else " NULL") for name, ddl, *_ in columns)
                    + ")")
        values = [(i, *row) for i, row in enumerate([*rows, (None,) * len(columns)])]
        cur.executemany(f"INSERT INTO {table} VALUES ({', '.join(['%s'] * (len(columns) + 1))})", values)
    key = f"domain.{family}"
    run_full_load(FullLoadSpec(sources=one_server(endpoints[0]), target=endpoints[1], source_database=DB,
                               source_table=family, target_database=TARGET, target_table=family, load_key=key,
                               channels=2, split_factor=2), spark)
    assert assert_same_rows(conn, target, DB, family, TARGET) == len(values)
    result = run_reconcile(ReconcileSpec(sources=one_server(endpoints[0]), target=endpoints[1], load_key=key,
                                         checksum=True, reimport=reimport), spark)
    assert result["verdict"] == "ok", \
        f"{family}: shards with problems: {[s for s in result['shards'] if s['problems']]}"
    return result


@pytest.mark.parametrize("family", sorted(FAMILIES))
@settings(max_examples=2, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_whole_domain_round_trips_and_reconciles(conn, target, endpoints, spark, family, data):
    columns = FAMILIES[family]
    drawn = data.draw(st.lists(st.tuples(*(st.none() | strategy for _, _, strategy, _ in columns)), max_size=25))
    round_trip(conn, target, endpoints, spark, family, _edge_rows(columns) + drawn)


def test_reported_cases_reconcile_ok_and_are_never_reimported(conn, target, endpoints, spark):
    """YEAR 0000 and nullable zero/invalid DATE/DATETIME: ok, so on_mismatch=reimport does nothing."""
    for family in ("years", "dates", "datetimes"):
        result = round_trip(conn, target, endpoints, spark, family, _edge_rows(FAMILIES[family]), reimport=True)
        assert "reimported" not in result and result["mismatched"] == []


@pytest.mark.parametrize("rule, methods, family", [
    (typemap.YearRule, ["source_sql"], "years"),  # MySQL renders YEAR 0 as '0000', ClickHouse as '0'
    (typemap.DateRule, ["source_sql"], "dates"),  # zero and invalid dates kept as text
    (typemap.FloatRule, ["mysql_text", "ch_text"], "floats"),  # each database's own float notation
])
def test_mutation_of_one_rule_fails_the_round_trip(conn, target, endpoints, spark, monkeypatch, rule, methods,
                                                   family):
    """The round trip is not vacuous: with one rule changed back to the naive one (the value as
    each database prints it), the load refuses the values or the checksums differ."""
    for method in methods:
        monkeypatch.setattr(rule, method, getattr(typemap.Rule, method))
    with pytest.raises((AssertionError, LoadFailed), match="problems|content checksum differs|does not fit"):
        round_trip(conn, target, endpoints, spark, family, _edge_rows(FAMILIES[family]))


def test_internal_column_names_are_refused_before_any_work_and_can_be_excluded(conn, target, endpoints, spark):
    with conn.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS {DB}.clash")
        cur.execute(f"CREATE TABLE {DB}.clash (id INT PRIMARY KEY, `_version` INT, `_deleted` TINYINT, "
                    "g INET6 NULL, v VARCHAR(10))")
        cur.execute(f"INSERT INTO {DB}.clash VALUES (1, 7, 1, NULL, 'a'), (2, 8, 0, '::1', 'b')")
    spec = dict(sources=one_server(endpoints[0]), target=endpoints[1], source_database=DB, source_table="clash",
                target_database=TARGET, target_table="clash", load_key="domain.clash")
    ch = target
    with pytest.raises(ReservedColumn, match=r"table domain\.clash: column\(s\) \['_version', '_deleted'\].*"
                                             r"exclude_columns=\['_version', '_deleted'\]"):
        run_full_load(FullLoadSpec(**spec), spark)
    assert not ch.command(f"EXISTS TABLE {TARGET}.clash")  # refused before anything was written
    with pytest.raises(typemap.UnsupportedType, match=r"column 'g'.*exclude_columns"):
        run_full_load(FullLoadSpec(**spec, exclude_columns=["_version", "_deleted"]), spark)
    run_full_load(FullLoadSpec(**spec, exclude_columns=["_version", "_deleted", "g"]), spark)
    assert ch.query(f"SELECT id, v FROM {TARGET}.clash FINAL ORDER BY id").result_rows == [(1, "a"), (2, "b")]
    verdict = run_reconcile(ReconcileSpec(sources=one_server(endpoints[0]), target=endpoints[1],
                                          load_key="domain.clash", checksum=True), spark)
    assert verdict["verdict"] == "ok"
    with pytest.raises(ValueError, match="primary key column"):
        run_full_load(FullLoadSpec(**spec | {"load_key": "domain.clash2"}, exclude_columns=["id"]), spark)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@settings(max_examples=1, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_cdc_writes_every_value_as_the_full_load_does(conn, target, endpoints, spark, family, data):
    """The same rows reach the target through the binlog (inserts, then updates and deletes of
    them) exactly as a full load of the same table copies them: byte-identical columns."""
    from airflow_sync_provider.core.jobspec import CdcApplySpec
    from airflow_sync_provider.spark.cdc_apply import run_cdc_apply

    columns = FAMILIES[family]
    drawn = data.draw(st.lists(st.tuples(*(st.none() | strategy for _, _, strategy, _ in columns)), min_size=10,
                               max_size=20))
    rows = _edge_rows(columns) + drawn
    table, cdc = f"{DB}.cdc_{family}", f"cdc_{family}"
    with conn.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS {table}")
        cur.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, "
                    + ", ".join(f"`{name}` {ddl}" + ("" if "NULL" in ddl else " NULL") for name, ddl, *_ in columns)
                    + ")")
    key = f"domain.cdc.{family}"
    run_full_load(FullLoadSpec(sources=one_server(endpoints[0]), target=endpoints[1], source_database=DB,
                               source_table=cdc, target_database=TARGET, target_table=cdc, load_key=key,
                               channels=1), spark)
    placeholders = ", ".join(["%s"] * (len(columns) + 1))
    with conn.cursor() as cur:  # every value arrives by insert, half of them again by update
        cur.executemany(f"INSERT INTO {table} VALUES ({placeholders})", [(i, *row) for i, row in enumerate(rows)])
        cur.executemany(f"UPDATE {table} SET " + ", ".join(f"`{name}` = %s" for name, *_ in columns) + " WHERE id = %s",
                        [(*rows[(i + 1) % len(rows)], i) for i in range(0, len(rows), 2)])
        cur.execute(f"DELETE FROM {table} WHERE id = 1")
    run_cdc_apply(CdcApplySpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline=f"domain.{family}",
                               start_from_loads=[key], reset=True, lanes=2), spark)
    assert_same_rows(conn, target, DB, cdc, TARGET)
    # and byte for byte what a full load of the same rows writes
    run_full_load(FullLoadSpec(sources=one_server(endpoints[0]), target=endpoints[1], source_database=DB,
                               source_table=cdc, target_database=TARGET, target_table=f"{cdc}_full",
                               load_key=key + ".full", channels=1), spark)
    names = ", ".join(f"hex(toString(`{name}`))" for name, *_ in columns)
    by_cdc, by_load = (target.query(f"SELECT id, {names} FROM {TARGET}.`{t}` FINAL ORDER BY id").result_rows
                       for t in (cdc, f"{cdc}_full"))
    assert by_cdc == by_load

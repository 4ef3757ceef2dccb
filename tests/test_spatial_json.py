"""Spatial columns copied exactly, and the columns ClickHouse derives for queries (typed geo, JSON).

The copy of a spatial value is MySQL's own bytes (SRID + WKB) in a String (core/typemap.py:
``SpatialRule``); a layout's ``geo`` / ``json`` add MATERIALIZED columns computed by ClickHouse
from the exact ones (core/clickhouse/derived.py), which no check compares. Fast tests: the mapping,
the options, the derived columns' types and expressions, their refusals, and the expressions run
by ClickHouse on every kind's edge values (tests/spatial.py builds and reads the bytes
independently). On the real services (slow): full load with both readers, reconcile --checksum,
a drift written without the binlog found by reconcile and the snapshot diff, CDC bootstrap and
apply through both binlog decoders, the rolling verification; the derived columns against
MySQL's ``ST_AsText`` and ``JSON_VALUE``.
"""

from __future__ import annotations

import json
import math
import random

import pyarrow as pa
import pytest

from airflow_sync_provider.core.clickhouse.derived import GEO_TYPES, derived_columns, geo_expression, json_expression
from airflow_sync_provider.core.clickhouse.layout import Layout, LayoutError, layout_comment, stored
from airflow_sync_provider.core.jobspec import CdcApplySpec, CdcBootstrapSpec, FullLoadSpec, ReconcileSpec
from airflow_sync_provider.core.selection import TableSet
from airflow_sync_provider.core.source.group import one_server
from airflow_sync_provider.core.sql import ch_ident
from airflow_sync_provider.core.typemap import MySQLColumn, SpatialRule, map_column
from tests.spatial import edge_values, geometry, parse, parse_wkt, plain, random_value

DB, TARGET = "geo", "geo_ch"
SPATIAL = ["geometry", "point", "linestring", "polygon", "multipoint", "multilinestring", "multipolygon",
           "geometrycollection"]


def _col(name, data_type, nullable=True, **kw):
    return MySQLColumn(name, data_type, kw.pop("column_type", data_type), nullable, **kw)


# --- the mapping (fast) ------------------------------------------------------------------------

@pytest.mark.parametrize("data_type", [*SPATIAL, "geomcollection"])
def test_every_spatial_type_is_copied_as_mysqls_bytes_and_compared_as_hex(data_type):
    mapping = map_column(_col("c", data_type), "db.t")
    assert isinstance(mapping.rule, SpatialRule)
    assert (mapping.ch_type, mapping.arrow_type) == ("Nullable(String)", pa.binary())
    assert map_column(_col("c", data_type, nullable=False)).ch_type == "String"
    # read as CAST(… AS BINARY): connectorx cannot read a GEOMETRY field; the bytes are the same
    assert mapping.read_sql("`c`") == "CAST(`c` AS BINARY)"
    assert mapping.mysql_text("`c`") == "HEX(CAST(`c` AS BINARY))" and mapping.ch_text("`c`") == "hex(`c`)"
    assert mapping.plain_text  # hex: no ',' and never 'N' in the row text
    value = geometry("point", (1.0, 2.0), 4326)
    assert mapping.from_binlog(value) is value and mapping.from_binlog(None) is None  # the binlog's bytes as they are


def test_the_bytes_are_the_srid_then_little_endian_wkb():
    value = geometry("point", (1.0, 2.0), 4326)
    assert value.hex().upper() == "E61000000101000000000000000000F03F0000000000000040"  # as MariaDB's HEX(col)
    assert parse(value) == (4326, "point", (1.0, 2.0))
    for kind in SPATIAL:
        for value in edge_values(kind):
            srid, found, coords = parse(value)
            assert geometry(found, coords, srid) == value


# --- the options (fast) ------------------------------------------------------------------------

COLUMNS = [_col("id", "int", False), _col("g", "geometry"), _col("p", "point", False), _col("pn", "point"),
           _col("l", "linestring"), _col("po", "polygon"), _col("mp", "multipoint"), _col("ml", "multilinestring"),
           _col("mpo", "multipolygon"), _col("gc", "geometrycollection"), _col("gc8", "geomcollection"),
           _col("doc", "json"), _col("mdoc", "longtext", charset="utf8mb4", collation="utf8mb4_bin", mariadb=True),
           _col("txt", "text", charset="utf8mb4", collation="utf8mb4_general_ci", mariadb=True),
           _col("n", "int")]
MAPPINGS = [map_column(c, "geo.t") for c in COLUMNS]


def test_json_and_geo_options_read_compare_and_round_trip_through_the_comment():
    assert Layout.of({}).json == "string" and Layout.of({"json": "json"}).json == "json"
    listed = Layout.of({"json": ["doc", "mdoc", "doc"], "geo": ["po", "p"]})
    assert (listed.json, listed.geo) == (("doc", "mdoc"), ("p", "po"))
    assert Layout.of({"json": {"doc": "json", "mdoc": "json", "txt": "string"}, "geo": "po"}) == Layout.of(
        {"json": ["mdoc", "doc"], "geo": ["po"]})
    assert Layout.of({"json": {"doc": "string"}}).json == "string"  # no column asks: the default
    assert listed.to_dict() == {"json": ["doc", "mdoc"], "geo": ["p", "po"]}
    assert stored("airflow_sync version=binlog-v2" + layout_comment(listed, ("id",))) == (listed, ["id"])
    assert "JSON derived from doc, mdoc · geo derived from p, po" in listed.summary(["id"])
    with pytest.raises(LayoutError, match=r"layout json \{'doc': 'jsonb'\}"):
        Layout.of({"json": {"doc": "jsonb"}})
    with pytest.raises(LayoutError, match="layout geo: 7 is not a column name"):
        Layout.of({"geo": [7]})


def test_each_kind_gets_its_clickhouse_type_read_by_clickhouse_from_the_exact_column():
    derived = derived_columns(Layout.of({"geo": ["p", "pn", "l", "po", "mp", "ml", "mpo"], "json": ["doc"]}),
                              MAPPINGS, "geo.t")
    assert [(d.name, d.source, d.ch_type) for d in derived] == [
        ("p_geo", "p", "Point"), ("pn_geo", "pn", "Point"), ("l_geo", "l", "LineString"),
        ("po_geo", "po", "Polygon"), ("mp_geo", "mp", "MultiPoint"), ("ml_geo", "ml", "MultiLineString"),
        ("mpo_geo", "mpo", "MultiPolygon"), ("doc_json", "doc", "Nullable(JSON)")]  # in the table's order
    assert derived[-1].ddl() == "`doc_json` Nullable(JSON) MATERIALIZED accurateCastOrNull(`doc`, 'JSON')"
    assert derived[0].ddl() == "`p_geo` Point MATERIALIZED readWKBPoint(substring(`p`, 5))"  # NOT NULL: the WKB
    assert derived[1].expression == ("if(isNull(`pn`), CAST((nan, nan), 'Point'), readWKBPoint(substring(ifNull("
                                     "`pn`, unhex('000000000101000000000000000000F87F000000000000F87F')), 5)))")
    # json="json": every JSON column — MySQL's type, and MariaDB's LONGTEXT utf8mb4_bin (its JSON)
    assert [d.name for d in derived_columns(Layout.of({"json": "json"}), MAPPINGS, "geo.t")] == ["doc_json",
                                                                                                 "mdoc_json"]
    assert derived_columns(Layout(), MAPPINGS, "geo.t") == []


@pytest.mark.parametrize("layout, message", [
    ({"geo": ["g"]}, r"layout geo names column 'g', a GEOMETRY column: its values may be of any kind, "
                     r"GEOMETRYCOLLECTION included, and no ClickHouse type holds every one"),
    ({"geo": ["gc"]}, r"layout geo names column 'gc', a GEOMETRYCOLLECTION column: ClickHouse has no type for a "
                      r"geometry collection"),
    ({"geo": ["gc8"]}, r"layout geo names column 'gc8', a GEOMCOLLECTION column: ClickHouse has no type"),
    ({"geo": ["doc"]}, r"layout geo names column 'doc', a json column; a derived geo column reads a spatial"),
    ({"geo": ["nope"]}, r"layout geo names column 'nope', which the copy does not have"),
    ({"json": ["n"]}, r"layout json names column 'n', a int column; a derived JSON column reads a JSON or text"),
    ({"json": ["p"]}, r"layout json names column 'p', a point column"),
])
def test_a_derived_column_that_cannot_hold_the_values_is_refused_by_name(layout, message):
    with pytest.raises(LayoutError, match=f"table geo.t: {message}"):
        derived_columns(Layout.of(layout), MAPPINGS, "geo.t")


def test_a_derived_column_of_a_transformed_column_or_with_a_taken_name_is_refused():
    import dataclasses

    from airflow_sync_provider.core.content.transforms import Transform

    hashed = [dataclasses.replace(m, transform=Transform.parse("hash"), salt=b"s") if m.name == "p" else m
              for m in MAPPINGS]
    with pytest.raises(LayoutError, match=r"column 'p', whose copy is transformed \(hash\)"):
        derived_columns(Layout.of({"geo": ["p"]}), hashed, "geo.t")
    taken = [*MAPPINGS, map_column(_col("p_geo", "int"))]
    with pytest.raises(LayoutError, match=r"derived from 'p' would be named 'p_geo', which the table has"):
        derived_columns(Layout.of({"geo": ["p"]}), taken, "geo.t")


def test_the_command_line_asks_for_derived_columns():
    from airflow_sync_provider.cli import build_parser
    from airflow_sync_provider.cli.selection import layout_of

    parser = build_parser()
    base = ["load", "--database", "d", "--table", "t"]
    assert layout_of(parser.parse_args(base)) is None
    assert layout_of(parser.parse_args([*base, "--json-as", "json"])) == {"json": "json"}
    args = parser.parse_args([*base, "--json-column", "doc", "--geo-column", "p", "--geo-column", "po"])
    assert Layout.of(layout_of(args)) == Layout.of({"json": ["doc"], "geo": ["p", "po"]})


# --- ClickHouse's side of the derived columns (the stand-in, no Spark) -----------------------------

def _typed(ch, expression: str, ch_type: str, value: bytes | None, nullable: bool):
    """ClickHouse's value of ``expression`` for a column ``c`` holding ``value``."""
    column_type = "Nullable(String)" if nullable else "String"
    literal = "NULL" if value is None else f"unhex('{value.hex()}')"
    return ch.query(f"SELECT {expression} FROM (SELECT CAST({literal}, '{column_type}') AS c)").result_rows[0][0]


def test_clickhouse_reads_each_kinds_edge_values_exactly_and_null_as_the_empty_value(ch):
    for kind, (ch_type, _) in GEO_TYPES.items():
        for value in edge_values(kind):
            for nullable in (False, True):
                got = _typed(ch, geo_expression("c", ch_type, nullable), ch_type, value, nullable)
                assert plain(got) == plain(parse(value)[2]), (kind, value.hex())
        empty = _typed(ch, geo_expression("c", ch_type, True), ch_type, None, True)
        assert (all(math.isnan(x) for x in empty) if kind == "point" else empty == []), (kind, empty)


def test_the_json_column_drops_what_clickhouse_cannot_hold_and_never_fails(ch):
    cases = {'{"a": {"b": 5}, "c": [1, 2]}': {"a": {"b": 5}, "c": [1, 2]},
             '{"z": null, "o": {"p": null}, "k": 1}': {"k": 1},  # nulls (and emptied objects) dropped
             '{"big": 123456789012345678901234567890}': {"big": "123456789012345678901234567890"},
             '{"d": 0.1000000000000000055511151231257827}': {"d": 0.1},
             "[1, 2]": None, '"str"': None, "7": None, '{"a.b": 1, "a": {"b": 2}}': None, None: None}
    for text, expected in cases.items():
        literal = "NULL" if text is None else "'" + text.replace("'", "\\'") + "'"
        got = ch.query(f"SELECT toJSONString(({json_expression('c')}) AS j), isNull(j) FROM "
                       f"(SELECT CAST({literal}, 'Nullable(String)') AS c)").result_rows[0]
        assert (None if got[1] else json.loads(got[0])) == expected, text


# --- on the real services ------------------------------------------------------------------------

GEO = ["p", "pn", "l", "po", "mp", "ml", "mpo"]
LAYOUT = {"geo": GEO, "json": ["doc"]}
ROWS = 600
TYPES = {"g": "GEOMETRY", "p": "POINT NOT NULL", "pn": "POINT", "l": "LINESTRING", "po": "POLYGON",
         "mp": "MULTIPOINT", "ml": "MULTILINESTRING", "mpo": "MULTIPOLYGON", "gc": "GEOMETRYCOLLECTION", "doc": "JSON"}


def _docs(rng, i: int) -> str | None:
    return rng.choice([None, json.dumps({"a": {"b": i, "c": [i, "x", None]}, "n": None, "s": "é😀"}),
                       json.dumps({"a": {"b": str(i)}, "big": 10 ** 25 + i}), "[1, 2]", '"text"',
                       '{"a.b": 1, "a": {"b": 2}}', '{"d": 0.1000000000000000055511151231257827, "a": {"b": -1}}'])


def _row(rng, i: int) -> tuple:
    values = []
    for name, ddl in TYPES.items():
        if name == "doc":
            values.append(_docs(rng, i))
            continue
        kind = ddl.split()[0].lower()
        nullable = "NOT NULL" not in ddl
        edges = edge_values(kind)
        value = edges[i % len(edges)] if i < 2 * len(edges) else random_value(rng, kind)
        values.append(None if nullable and rng.random() < 0.15 else value)
    return (i, *values)


def _create(conn, table: str, rows: int = ROWS, seed: int = 1) -> None:
    rng = random.Random(seed)
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE IF NOT EXISTS {DB}")
        cur.execute(f"DROP TABLE IF EXISTS {DB}.{table}")
        cur.execute(f"CREATE TABLE {DB}.{table} (id INT PRIMARY KEY, "
                    + ", ".join(f"{n} {t}" for n, t in TYPES.items()) + ")")
        cur.executemany(f"INSERT INTO {DB}.{table} VALUES ({', '.join(['%s'] * (len(TYPES) + 1))})",
                        [_row(rng, i) for i in range(1, rows + 1)])


def _derived_equal_the_source(conn, ch, table: str, target_database: str = TARGET) -> int:
    """Each derived geo column holds the source value's coordinates (bit for bit, against an
    independent read of MySQL's bytes, and against MySQL's ST_AsText where it prints the value);
    the JSON column answers by path as MySQL's JSON_VALUE does where ClickHouse holds the document,
    and is NULL where it cannot. Returns how many values were compared with ST_AsText."""
    names = ", ".join(f"{c}, ST_AsText({c})" for c in GEO)
    with conn.cursor() as cur:
        cur.execute(f"SELECT id, {names}, doc, JSON_VALUE(doc, '$.a.b') FROM {DB}.{table}")
        source = {r[0]: r[1:] for r in cur.fetchall()}
    derived = ", ".join(ch_ident(c + "_geo") for c in GEO)
    rows = ch.query(f"SELECT id, {derived}, toString(doc_json.a.b), isNull(doc_json) FROM "
                    f"{ch_ident(target_database)}.{ch_ident(table)} FINAL").result_rows
    assert {r[0] for r in rows} == set(source)
    texts = 0
    for id_, *values, path, no_json in rows:
        mine = source[id_]
        for at, name in enumerate(GEO):
            raw, text = mine[2 * at], mine[2 * at + 1]
            if raw is None:  # NULL: the type's empty value
                assert all(math.isnan(x) for x in values[at]) if name.startswith("p") else values[at] == [], \
                    (id_, name, values[at])
                continue
            assert plain(values[at]) == plain(parse(raw)[2]), (id_, name)  # bit for bit
            if text and "(" in text and "nan" not in text.lower():
                # (MariaDB prints an empty MULTIPOINT / MULTIPOLYGON as 'MULTIPOINT)')
                assert plain(values[at]) == plain(parse_wkt(text)), (id_, name, text)
                texts += 1
        doc, expected = mine[-2], mine[-1]
        holds = doc is not None and doc.lstrip().startswith("{") and '"a.b"' not in doc
        assert no_json == (not holds), (id_, doc)
        if holds:
            assert path == expected, (id_, doc, path, expected)
    return texts


def _load(endpoints, spark, table: str, reader: str = "auto", target_database: str = TARGET, layout=None) -> str:
    from airflow_sync_provider.spark.full_load import run_full_load

    key = f"geo.{target_database}.{table}"
    run_full_load(FullLoadSpec(sources=one_server(endpoints[0]), target=endpoints[1], source_database=DB,
                               source_table=table, target_database=target_database, target_table=table,
                               load_key=key, channels=2, split_factor=2, reader=reader,
                               tableset=TableSet(layout=LAYOUT if layout is None else layout)), spark)
    return key


def _reconcile(endpoints, spark, key: str) -> dict:
    from airflow_sync_provider.spark.reconcile import run_reconcile

    return run_reconcile(ReconcileSpec(sources=one_server(endpoints[0]), target=endpoints[1], load_key=key,
                                       checksum=True), spark)


@pytest.fixture(scope="module")
def conn(mysql_url):
    import pymysql

    from airflow_sync_provider.core.endpoints import MySQLEndpoint

    connection = pymysql.connect(**MySQLEndpoint.from_url(mysql_url).connect_args(), autocommit=True)
    yield connection
    connection.close()


@pytest.mark.slow
@pytest.mark.parametrize("reader, json_as", [("native", ["doc"]), ("mysqlclient", "json")])
def test_a_full_load_copies_every_spatial_type_exactly_and_derives_the_typed_columns(reader, json_as, conn, ch,
                                                                                     endpoints, spark):
    """Both readers; the JSON column named, and found as every JSON column (MariaDB's LONGTEXT
    utf8mb4_bin: ``--json-as json``)."""
    from tests.helpers import assert_same_rows

    table, target = f"shapes_{reader}", f"{TARGET}_{reader}"
    _create(conn, table)
    key = _load(endpoints, spark, table, reader=reader, target_database=target, layout={"geo": GEO, "json": json_as})
    assert assert_same_rows(conn, ch, DB, table, target) == ROWS
    checked = _reconcile(endpoints, spark, key)
    assert checked["verdict"] == "ok", [s for s in checked["shards"] if s["problems"]]
    assert _derived_equal_the_source(conn, ch, table, target) > ROWS  # many values also against ST_AsText
    # the derived columns are ClickHouse's: not in SELECT *, typed for its geo functions
    star = ch.query(f"SELECT * FROM {target}.{table} LIMIT 1").column_names
    assert not ({c + "_geo" for c in GEO} | {"doc_json"}) & set(star)
    inside = ch.command(f"SELECT countIf(p_geo.1 > 0 AND p_geo.1 < 180 AND p_geo.2 > 0 AND p_geo.2 < 90) "
                        f"FROM {target}.{table} FINAL")
    with conn.cursor() as cur:
        cur.execute(f"SELECT COUNT(*) FROM {DB}.{table} WHERE ST_X(p) > 0 AND ST_X(p) < 180 AND ST_Y(p) > 0 AND "
                    "ST_Y(p) < 90")
        assert int(inside) == cur.fetchone()[0] > 0


def _changes(conn, table: str, seed: int, start: int) -> None:
    """Inserts, updates (new values of every kind, the SRID alone, NULL to a value and back, empty
    collections) and deletes of spatial rows, some in one transaction."""
    rng = random.Random(seed)
    t = f"{DB}.{table}"
    columns = list(TYPES)
    with conn.cursor() as cur:
        cur.execute(f"SELECT id FROM {t} ORDER BY id")
        ids = [r[0] for r in cur.fetchall()]
        cur.executemany(f"INSERT INTO {t} VALUES ({', '.join(['%s'] * (len(TYPES) + 1))})",
                        [_row(rng, i) for i in range(start, start + 40)])
        cur.execute("BEGIN")
        for id_ in rng.sample(ids, 60):
            row = _row(rng, id_ + 7)
            cur.execute(f"UPDATE {t} SET " + ", ".join(f"{c} = %s" for c in columns) + " WHERE id = %s",
                        (*row[1:], id_))
        cur.execute("COMMIT")
        cur.execute(f"UPDATE {t} SET p = ST_GeomFromWKB(ST_AsBinary(p), IF(ST_SRID(p) = 0, 4326, 0)) "
                    f"WHERE id % 9 = 0")  # the SRID alone: ST_AsText is the same, the bytes are not
        cur.execute(f"UPDATE {t} SET gc = ST_GeomFromText('GEOMETRYCOLLECTION EMPTY'), mp = %s, pn = NULL "
                    f"WHERE MOD(id, 11) = 0", (geometry("multipoint", [], 4326),))
        cur.execute(f"UPDATE {t} SET pn = %s, g = %s WHERE MOD(id, 13) = 0",
                    (geometry("point", (-0.0, 5e-324)), geometry("geometrycollection", [("point", (1, 2))], 4326)))
        cur.execute(f"DELETE FROM {t} WHERE id % 17 = 0")


def _flip_last_bit(value: bytes) -> bytes:
    """The value with the last double's lowest mantissa bit flipped (a change no text shows)."""
    return value[:-8] + bytes([value[-8] ^ 1]) + value[-7:]


def _drift(conn, table: str, every: int) -> int:
    """Changes the binlog never sees (sql_log_bin=0): the SRID alone, and a polygon's last bit."""
    t = f"{DB}.{table}"
    with conn.cursor() as cur:
        cur.execute(f"SELECT id, po FROM {t} WHERE po IS NOT NULL AND id % {every} = 1")
        polygons = cur.fetchall()
        cur.execute("SET sql_log_bin = 0")
        try:
            cur.execute(f"UPDATE {t} SET p = ST_GeomFromWKB(ST_AsBinary(p), IF(ST_SRID(p) = 0, 4326, 0)) "
                        f"WHERE id % {every} = 0")
            srid = cur.rowcount
            cur.executemany(f"UPDATE {t} SET po = %s WHERE id = %s", [(_flip_last_bit(v), i) for i, v in polygons])
        finally:
            cur.execute("SET sql_log_bin = 1")
    return srid + len(polygons)


@pytest.mark.slow
def test_a_drift_the_binlog_never_saw_is_found_by_reconcile_and_the_diff(conn, ch, endpoints, spark):
    from airflow_sync_provider.core.jobspec import SnapshotDiffSpec
    from airflow_sync_provider.spark.diff import run_snapshot_diff
    from tests.helpers import assert_same_rows

    table = "drifted"
    _create(conn, table, rows=500, seed=2)
    key = _load(endpoints, spark, table)
    drifted = _drift(conn, table, every=25)
    assert drifted > 20
    checked = _reconcile(endpoints, spark, key)
    assert checked["verdict"] != "ok" and checked["mismatched"], checked
    diff = dict(target=endpoints[1], old_table=f"{TARGET}.{table}", sources=one_server(endpoints[0]),
                source_database=DB, source_table=table)
    assert run_snapshot_diff(SnapshotDiffSpec(**diff), spark)["counts"]["changed"] == drifted
    applied = run_snapshot_diff(SnapshotDiffSpec(**diff, on_change="apply"), spark)
    assert applied["counts"]["changed"] == drifted
    assert assert_same_rows(conn, ch, DB, table, TARGET) == 500
    assert _reconcile(endpoints, spark, key)["verdict"] == "ok"
    _derived_equal_the_source(conn, ch, table)  # the applied rows' derived columns, computed by ClickHouse


def _apply(endpoints, spark, pipeline: str, **kwargs) -> dict:
    from airflow_sync_provider.spark.cdc_apply import run_cdc_apply

    return run_cdc_apply(CdcApplySpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline=pipeline,
                                      lanes=3, **kwargs), spark)


@pytest.mark.slow
def test_bootstrap_and_cdc_copy_spatial_rows_exactly_through_both_decoders(conn, ch, endpoints, spark, monkeypatch,
                                                                          caplog):
    from airflow_sync_provider.core.cdc import rowimage
    from airflow_sync_provider.spark.cdc_bootstrap import run_cdc_bootstrap
    from tests.helpers import assert_same_rows

    table, pipeline = "followed", "geo_cdc"
    _create(conn, table, rows=400, seed=3)
    run_cdc_bootstrap(CdcBootstrapSpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline=pipeline,
                                       tableset=TableSet(tables=[{"source_database": DB, "source_table": table,
                                                                  "target_database": TARGET}], layout=LAYOUT),
                                       channels=2, chunk_rows=100), spark)
    assert assert_same_rows(conn, ch, DB, table, TARGET) == 400
    _changes(conn, table, seed=4, start=10_000)
    with caplog.at_level("INFO", logger=rowimage.__name__):
        applied = _apply(endpoints, spark, pipeline, verify_period=0)
    assert applied["events"] > 150
    assert not [r for r in caplog.records if r.name == rowimage.__name__]  # the generated decoder read every row
    rows = assert_same_rows(conn, ch, DB, table, TARGET)
    assert _derived_equal_the_source(conn, ch, table) > rows
    # python-mysql-replication's values (the reference decoder) give the same copy
    monkeypatch.setattr(rowimage.Decoders, "get", lambda self, event, route: None)
    _changes(conn, table, seed=5, start=20_000)
    _apply(endpoints, spark, pipeline, verify_period=0)
    monkeypatch.undo()
    assert_same_rows(conn, ch, DB, table, TARGET)
    _derived_equal_the_source(conn, ch, table)
    # a drift the binlog never saw: the rolling verification finds and repairs it
    assert _drift(conn, table, every=20) > 10
    verified = _apply(endpoints, spark, pipeline, verify=True)
    assert verified["repaired_shards"] >= 1, verified
    assert_same_rows(conn, ch, DB, table, TARGET)
    _derived_equal_the_source(conn, ch, table)


@pytest.mark.slow
def test_a_derived_column_that_cannot_hold_the_values_is_refused_before_any_work(conn, ch, endpoints, spark):
    table = "refused"
    _create(conn, table, rows=20, seed=6)
    for layout, message in [({"geo": ["g"]}, "column 'g', a GEOMETRY column"),
                            ({"geo": ["gc"]}, "column 'gc', a GEOMETRYCOLLECTION column"),
                            ({"geo": ["doc"]}, "column 'doc', a longtext column")]:
        with pytest.raises(LayoutError, match=f"table {TARGET}.{table}: layout geo names {message}"):
            _load(endpoints, spark, table, layout=layout)
        assert not ch.command(f"EXISTS TABLE {TARGET}.{table}")


def test_a_schema_change_under_a_derived_column_drops_it_and_its_layout_entry():
    from airflow_sync_provider.core.clickhouse.derived import after_change
    from airflow_sync_provider.core.clickhouse.layout import relaid_comment

    layout = Layout.of({"geo": ["p", "po", "l"], "json": ["doc"], "order_by": ["n"]})
    after = [c for c in COLUMNS if c.name not in ("po", "doc")]  # dropped (or renamed)
    after = [_col("p", "geometry") if c.name == "p" else c for c in after]  # POINT → GEOMETRY
    relaid, dropped = after_change(layout, MAPPINGS, after)
    assert [d.name for d in dropped] == ["p_geo", "po_geo", "doc_json"]
    assert relaid == Layout.of({"geo": ["l"], "order_by": ["n"]})
    assert after_change(relaid, MAPPINGS, after) == (relaid, [])  # followed again after a crash: nothing to do
    assert after_change(Layout.of({"json": "json"}), MAPPINGS, after)[0].json == "json"  # names no column
    comment = "airflow_sync version=binlog-v2" + layout_comment(layout, ("id",)) + " content={} load=w"
    assert stored(relaid_comment(comment, relaid)) == (relaid, ["id"])
    assert relaid_comment(comment, relaid).endswith(" content={} load=w")


@pytest.mark.slow
def test_cdc_follows_a_schema_change_under_a_derived_column(conn, ch, endpoints, spark):
    """DROP, MODIFY (POINT → GEOMETRY) and RENAME of columns with derived columns: ClickHouse
    refuses to drop or rename a column a MATERIALIZED one reads, and Point cannot hold a polygon;
    the derived columns go first, the copy follows exactly, the others stay."""
    from airflow_sync_provider.core.clickhouse.described import copy_layout
    from airflow_sync_provider.spark.cdc_bootstrap import run_cdc_bootstrap
    from tests.helpers import assert_same_rows

    table, pipeline = "altered", "geo_alter"
    _create(conn, table, rows=120, seed=7)
    run_cdc_bootstrap(CdcBootstrapSpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline=pipeline,
                                       tableset=TableSet(tables=[{"source_database": DB, "source_table": table,
                                                                  "target_database": TARGET}], layout=LAYOUT),
                                       channels=1), spark)
    with conn.cursor() as cur:
        cur.execute(f"ALTER TABLE {DB}.{table} DROP COLUMN po")
        cur.execute(f"ALTER TABLE {DB}.{table} MODIFY p GEOMETRY NOT NULL")
        cur.execute(f"ALTER TABLE {DB}.{table} RENAME COLUMN doc TO doc2")
        cur.execute(f"UPDATE {DB}.{table} SET p = %s, l = %s WHERE id <= 10",
                    (geometry("polygon", [[(0, 0), (1, 0), (1, 1), (0, 0)]], 4326),
                     geometry("linestring", [(1, 2), (3, 4)])))
    _apply(endpoints, spark, pipeline, verify_period=0)
    assert assert_same_rows(conn, ch, DB, table, TARGET) == 120
    derived = [r[0] for r in ch.query(f"SELECT name FROM system.columns WHERE database = '{TARGET}' AND "
                                      f"table = '{table}' AND default_kind = 'MATERIALIZED'").result_rows]
    assert sorted(derived) == ["l_geo", "ml_geo", "mp_geo", "mpo_geo", "pn_geo"]
    assert copy_layout(ch, TARGET, table) == Layout.of({"geo": ["pn", "l", "mp", "ml", "mpo"]})
    with conn.cursor() as cur:
        cur.execute(f"SELECT id, l FROM {DB}.{table} WHERE l IS NOT NULL")
        lines = dict(cur.fetchall())
    copied = dict(ch.query(f"SELECT id, l_geo FROM {TARGET}.{table} FINAL WHERE l IS NOT NULL").result_rows)
    assert {i: plain(v) for i, v in copied.items()} == {i: plain(parse(v)[2]) for i, v in lines.items()}

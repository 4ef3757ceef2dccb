"""Reconciliation against the real services: no false positives over the adversarial matrix,
each injected discrepancy found in its shard, mismatched shards re-imported in place, period loads.

The Spark layer runs on an in-process local[2] session (`spark` fixture); the spark-submit path
of the same job is covered by tests/test_cli.py.
"""

from __future__ import annotations

import dataclasses

import pytest

from airflow_sync_provider.core.clickhouse import repairs
from airflow_sync_provider.core.clickhouse.shards import cut_points, target_predicates, weight_width
from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
from airflow_sync_provider.core.jobspec import FullLoadSpec, ReconcileSpec
from airflow_sync_provider.core.ledger import Ledger
from airflow_sync_provider.core.loads import SHARD_MISMATCH
from airflow_sync_provider.core.source.group import one_server
from airflow_sync_provider.core.source.planning import Plan
from airflow_sync_provider.core.source.schema import read_table_schema
from airflow_sync_provider.core.source.weights import read_weights
from airflow_sync_provider.core.verify.reconcile import count_target
from airflow_sync_provider.spark.full_load import LoadFailed, run_full_load
from airflow_sync_provider.spark.reconcile import run_reconcile
from tests.adversarial import DB, SPLIT, TABLES
from tests.helpers import assert_same_rows

pytestmark = pytest.mark.slow
TARGET = f"{DB}_rc"
FIX = f"{DB}_fix"
# The matrix's own DATETIME/DATE tables hold years 1000 and 9999, which a load rightly refuses
# (tests/test_full_load_job.py); their in-range twins stand in for them here.
IN_RANGE = {"datetime6_same_second": "dt6_in_range", "date_key": "date_in_range"}
MATRIX = sorted(IN_RANGE.get(name, name) for name in TABLES)
SPLIT_ALSO = {"date_in_range": "d"}
NUMERIC_OR_TEMPORAL = ["bigint_signed", "bigint_unsigned", "decimal_65_30", "double_key", "dt6_in_range",
                       "date_in_range", "nullable_key", "time_key", "we`ird tab'le ñ", "boolean_key"]


@pytest.fixture(scope="module")
def endpoints(mysql_url, clickhouse_url):
    return MySQLEndpoint.from_url(mysql_url), ClickHouseEndpoint.from_url(clickhouse_url)


@pytest.fixture(scope="module")
def in_range(matrix):
    with matrix.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS {DB}.dt6_in_range")
        cur.execute(f"CREATE TABLE {DB}.dt6_in_range (k DATETIME(6) PRIMARY KEY)")
        cur.execute(f"INSERT INTO {DB}.dt6_in_range SELECT TIMESTAMP('2024-02-29 23:59:59') + INTERVAL seq MICROSECOND"
                    f" FROM {DB}.seq_1_to_3000")
        cur.execute(f"INSERT INTO {DB}.dt6_in_range VALUES ('1900-01-01 00:00:00'), ('2299-12-31 23:59:59.999999')")
        cur.execute(f"DROP TABLE IF EXISTS {DB}.date_in_range")
        cur.execute(f"CREATE TABLE {DB}.date_in_range (id INT AUTO_INCREMENT PRIMARY KEY, d DATE NULL, KEY ix_d (d))")
        cur.execute(f"INSERT INTO {DB}.date_in_range (d) SELECT DATE('2000-01-01') + INTERVAL (seq % 400) DAY"
                    f" FROM {DB}.seq_1_to_3000")
        cur.execute(f"INSERT INTO {DB}.date_in_range (d) VALUES ('1900-01-01'), ('2299-12-31'), (NULL), (NULL)")
    return matrix


def load(endpoints, spark, name, target_table=None, strategy="balanced", target_database=TARGET, **kwargs) -> str:
    kwargs.setdefault("split_factor", 5)  # many shards of these small tables: a discrepancy is found in its own
    key = f"rc.{target_database}.{target_table or name}.{strategy}"
    spec = FullLoadSpec(sources=one_server(endpoints[0]), target=endpoints[1], source_database=DB, source_table=name,
                        target_database=target_database, target_table=target_table or name, load_key=key,
                        split_column=SPLIT.get(name) or SPLIT_ALSO.get(name), strategy=strategy, channels=2, **kwargs)
    run_full_load(spec, spark)
    return key


def reconcile(endpoints, spark, key, checksum=True, reimport=False) -> dict:
    return run_reconcile(ReconcileSpec(sources=one_server(endpoints[0]), target=endpoints[1], load_key=key,
                                       checksum=checksum, reimport=reimport), spark)


def source_count(conn, name) -> int:
    with conn.cursor() as cur:
        cur.execute(f"SELECT COUNT(*) FROM {DB}.`{name.replace('`', '``')}`")
        return cur.fetchone()[0]


@pytest.mark.parametrize("name,strategy", [(n, "balanced") for n in MATRIX]
                         + [(n, "equal") for n in NUMERIC_OR_TEMPORAL])
def test_exact_copies_of_the_whole_matrix_reconcile_ok(in_range, endpoints, spark, name, strategy):
    key = load(endpoints, spark, name, f"{name} {strategy}", strategy)
    result = reconcile(endpoints, spark, key)
    assert result["verdict"] == "ok" and result["mismatched"] == [], result["shards"]
    for shard in result["shards"]:
        assert shard["source_rows"] == shard["target_rows"] == shard["records_written"]
        assert shard["source_checksum"] == shard["target_checksum"] is not None
    assert sum(s["source_rows"] for s in result["shards"]) == source_count(in_range, name)
    if source_count(in_range, name) > 100 and name not in ("all_equal", "no_index"):
        assert sum(1 for s in result["shards"] if s["source_rows"]) >= 2  # the shards really split the rows


def shard_of(conn, plan: Plan, table: str, row_id) -> int:
    with conn.cursor() as cur:
        hits = []
        for shard in plan.shards:
            cur.execute(f"SELECT COUNT(*) FROM {DB}.{table} WHERE id = %s AND ({shard.where})", (row_id, *shard.params))
            if cur.fetchone()[0]:
                hits.append(shard.id)
    assert len(hits) == 1, (table, row_id, hits)
    return hits[0]


def first_ids(conn, plan: Plan, table: str, count: int) -> list:
    """The smallest id of ``count`` different non-empty range shards (first, middle, last)."""
    found = []
    with conn.cursor() as cur:
        for shard in plan.shards:
            cur.execute(f"SELECT MIN(id) FROM {DB}.{table} WHERE {shard.where}", shard.params)
            row_id = cur.fetchone()[0]
            if row_id is not None and "IS NULL" not in shard.where:
                found.append(row_id)
    assert len(found) >= count
    return [found[0], found[len(found) // 2], found[-1]][:count]


@pytest.mark.parametrize("name", ["varchar_ci_pad", "pad_below_space", "nopad_ci"])
def test_each_discrepancy_is_found_in_its_shard_then_reimported_in_place(in_range, endpoints, spark, ch, name):
    """Collated split columns: a missing row, an extra row and a changed value (same counts) are
    each found in the shard MySQL puts them in; re-import repairs exactly those shards."""
    key = load(endpoints, spark, name, target_database=FIX)
    plan = Plan.from_dict(Ledger(ch).state(key).plan)
    table = f"`{FIX}`.`{name}`"
    missing, extra, changed = first_ids(in_range, plan, name, 3)
    ch.command(f"DELETE FROM {table} WHERE id = {missing}")
    # a copy of a row under a new id, with its weight: the same shard as the original
    ch.command(f"INSERT INTO {table} (id, s, _version, _split_weight) SELECT id + 1000000, s, _version, _split_weight"
               f" FROM {table} WHERE id = {extra}", settings={"insert_allow_materialized_columns": 1})
    ch.command(f"ALTER TABLE {table} UPDATE s = concat(s, 'x') WHERE id = {changed} SETTINGS mutations_sync = 2")
    counted = sorted({shard_of(in_range, plan, name, missing), shard_of(in_range, plan, name, extra)})
    everything = sorted(set(counted) | {shard_of(in_range, plan, name, changed)})
    assert len(everything) == 3

    assert reconcile(endpoints, spark, key, checksum=False)["mismatched"] == counted
    first = reconcile(endpoints, spark, key)
    assert first["verdict"] == "mismatch" and first["mismatched"] == everything
    marked = Ledger(ch).state(key)
    assert sorted(i for i, s in marked.shards.items() if s.status == SHARD_MISMATCH) == everything

    repaired = reconcile(endpoints, spark, key, reimport=True)
    assert repaired["before"]["mismatched"] == everything and repaired["reimported"]["repaired"] == everything
    assert repaired["verdict"] == "ok" and reconcile(endpoints, spark, key)["verdict"] == "ok"
    assert assert_same_rows(in_range, ch, DB, name, target_database=FIX) == source_count(in_range, name)
    state = Ledger(ch).state(key)
    assert state.status == "published" and state.repair == []
    assert sorted(i for i, s in state.shards.items() if s.attempt == 2) == everything  # the others were not re-read


def test_weights_and_padding_are_what_makes_collated_shards_match(in_range, endpoints, spark, ch):
    """Mutation check: weights compared without PAD SPACE padding put rows of pad_below_space
    ('a\t' sorts below 'a') in the wrong shards; the real predicates do not."""
    name = "pad_below_space"
    key = load(endpoints, spark, name, target_database=FIX)
    plan = Plan.from_dict(Ledger(ch).state(key).plan)
    column = read_table_schema(in_range, DB, name).column("s")
    source = [s["source_rows"] for s in reconcile(endpoints, spark, key, checksum=False)["shards"]]
    weights = read_weights(in_range, column, cut_points(plan))
    assert weights.space is not None  # unicode_520_ci pads
    right = target_predicates(plan, column, weights, weight_width=weight_width(ch, FIX, name))
    assert count_target(ch, FIX, name, right) == source
    unpadded = target_predicates(plan, column, dataclasses.replace(weights, space=None))
    assert count_target(ch, FIX, name, unpadded) != source


def test_counts_find_missing_and_extra_rows_but_not_unmerged_versions(in_range, endpoints, spark, ch):
    key = load(endpoints, spark, "bigint_unsigned", target_database=FIX)
    table = f"`{FIX}`.bigint_unsigned"
    # unmerged duplicate versions of a row are not a difference (FINAL)
    ch.command(f"INSERT INTO {table} SELECT * REPLACE (_version + 1 AS _version) FROM {table} WHERE k = 0")
    assert reconcile(endpoints, spark, key)["verdict"] == "ok"
    # a missing row (the max key: the last range shard) and an extra row (the first shard)
    ch.command(f"DELETE FROM {table} WHERE k = 18446744073709551615")
    ch.command(f"INSERT INTO {table} (k, v, _version) VALUES (1, 0, 1)")
    result = reconcile(endpoints, spark, key, checksum=False)
    last_range = len(result["shards"]) - 2
    assert result["mismatched"] == [0, last_range]
    first, last = result["shards"][0], result["shards"][last_range]
    assert first["target_rows"] == first["source_rows"] + 1 and last["target_rows"] == last["source_rows"] - 1
    assert f"source {first['source_rows']} != target {first['target_rows']}" in first["problems"]


def test_checksums_find_each_content_change_in_its_shard(in_range, endpoints, spark, ch):
    with in_range.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS {DB}.content")
        cur.execute(f"CREATE TABLE {DB}.content (id INT PRIMARY KEY, s VARCHAR(10) NULL, d DECIMAL(12, 2) NOT NULL,"
                    f" t DATETIME(3) NOT NULL, f DOUBLE NULL, tm TIME(2) NULL, b VARBINARY(4) NULL)")
        cur.execute(f"INSERT INTO {DB}.content SELECT seq, IF(seq % 5 = 0, NULL, CONCAT('s', seq)), seq / 100,"
                    f" TIMESTAMP('2025-01-01 00:00:00.123') + INTERVAL seq SECOND, seq / 7,"
                    f" IF(seq % 3 = 0, NULL, SEC_TO_TIME(CAST(seq AS SIGNED) * 997 - 400000)"
                    f" + INTERVAL seq % 100 * 10000 MICROSECOND), UNHEX(HEX(seq)) FROM {DB}.seq_1_to_1000")
    key = load(endpoints, spark, "content", target_database=FIX)
    assert reconcile(endpoints, spark, key)["verdict"] == "ok"
    plan = Plan.from_dict(Ledger(ch).state(key).plan)
    changes = {  # id → a change that keeps the row count
        5: "s = ''",  # a NULL became an empty string
        301: "d = 3.0",  # 3.01 lost its second decimal digit
        501: "t = toDateTime64('2025-01-01 00:08:21', 3, 'UTC')",  # a datetime lost its fraction (.123)
        777: "s = 's778'",  # a changed value, same counts
        901: "tm = '-00:01:57.01'",  # a different TIME
    }
    for row_id, assignment in changes.items():
        ch.command(f"ALTER TABLE `{FIX}`.content UPDATE {assignment} WHERE id = {row_id} SETTINGS mutations_sync = 2")
    counts_only = reconcile(endpoints, spark, key, checksum=False)
    assert counts_only["verdict"] == "ok"  # counts alone see nothing
    expected = sorted({shard_of(in_range, plan, "content", i) for i in changes})
    assert len(expected) >= 3 and reconcile(endpoints, spark, key)["mismatched"] == expected


def test_period_loads_reconcile_by_their_partitions_and_reimport_in_place(in_range, endpoints, spark, ch):
    with in_range.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS {DB}.events")
        cur.execute(f"CREATE TABLE {DB}.events (id BIGINT PRIMARY KEY, created DATETIME(3) NOT NULL,"
                    f" v INT NOT NULL, KEY ix_created (created))")
        cur.execute(f"INSERT INTO {DB}.events SELECT seq, TIMESTAMP('2025-03-01') + INTERVAL (seq * 29) SECOND,"
                    f" seq FROM {DB}.seq_1_to_8000")  # about 2.7 days
    keys = {day: _load_day(endpoints, spark, day) for day in (1, 2, 3)}
    for day, key in keys.items():
        result = reconcile(endpoints, spark, key)
        assert result["verdict"] == "ok", (day, result["shards"])
        assert sum(s["source_rows"] for s in result["shards"]) == sum(s["target_rows"] for s in result["shards"]) > 0
    ch.command(f"DELETE FROM `{FIX}`.events WHERE id = 4000")  # day 2
    ch.command(f"ALTER TABLE `{FIX}`.events UPDATE v = -v WHERE id = 4100 SETTINGS mutations_sync = 2")
    assert reconcile(endpoints, spark, keys[1])["verdict"] == "ok"
    assert reconcile(endpoints, spark, keys[3])["verdict"] == "ok"
    day2 = reconcile(endpoints, spark, keys[2], reimport=True)
    assert day2["before"]["verdict"] == "mismatch" and day2["verdict"] == "ok"
    assert assert_same_rows(in_range, ch, DB, "events", target_database=FIX) == 8000


def _load_day(endpoints, spark, day: int) -> str:
    key = f"rc.events.day{day}"
    spec = FullLoadSpec(sources=one_server(endpoints[0]), target=endpoints[1], source_database=DB,
                        source_table="events", target_database=FIX, target_table="events", load_key=key,
                        split_column="created", channels=2, where="`created` >= %s AND `created` < %s",
                        where_params=[f"2025-03-0{day} 00:00:00", f"2025-03-0{day + 1} 00:00:00"],
                        partition_by="toYYYYMMDD(created)", replace_partitions=[f"2025030{day}"])
    run_full_load(spec, spark)
    return key


def test_reimport_of_a_published_load_without_mismatches_is_refused(in_range, endpoints, spark, ch):
    key = load(endpoints, spark, "one_row", target_database=FIX)
    assert reconcile(endpoints, spark, key)["verdict"] == "ok"
    spec = FullLoadSpec(sources=one_server(endpoints[0]), target=endpoints[1], source_database=DB,
                        source_table="one_row", target_database=FIX, target_table="one_row", load_key=key,
                        reimport="failed")
    with pytest.raises(LoadFailed, match="no shard is marked failed or mismatched"):
        run_full_load(spec, spark)


def test_checksums_see_a_change_in_any_column_of_any_mapped_type(in_range, endpoints, spark, ch):
    """Every mapped type (tests/test_full_load_job.py's matrix, float extremes included) checksums
    equal on an exact copy, and a newer version of one row with one column changed is seen."""
    from airflow_sync_provider.core.verify.reconcile import (
        checksum_source,
        checksum_target,
        clickhouse_checksum_sql,
        mysql_checksum_sql,
    )
    from tests.test_full_load_job import ROWS, TYPES_DDL

    with in_range.cursor() as cur:
        cur.execute(f"USE {DB}")
        cur.execute("DROP TABLE IF EXISTS types_matrix")
        cur.execute(TYPES_DDL)
        cur.execute("INSERT INTO types_matrix VALUES " + ", ".join(ROWS))
    key = load(endpoints, spark, "types_matrix", target_database=FIX)
    assert reconcile(endpoints, spark, key)["verdict"] == "ok"
    schema = read_table_schema(in_range, DB, "types_matrix")
    plan = Plan.from_dict(Ledger(ch).state(key).plan)
    source = checksum_source(in_range, mysql_checksum_sql(schema, plan), plan)
    predicates = target_predicates(plan, schema.column(plan.split_column))
    assert checksum_target(ch, clickhouse_checksum_sql(schema, FIX, "types_matrix"), predicates) == source
    table, scratch = f"`{FIX}`.types_matrix", f"`{FIX}`.types_changed"
    for column in schema.columns[1:]:
        name = f"`{column.name}`"
        row = next(i for i in (0, 1) if ch.command(
            f"SELECT {name} != defaultValueOfArgumentType(assumeNotNull({name})) FROM {table} WHERE id = {i}") == 1)
        ch.command(f"DROP TABLE IF EXISTS {scratch}")
        ch.command(f"CREATE TABLE {scratch} AS {table}")
        ch.command(f"INSERT INTO {scratch} SELECT * FROM {table}")
        ch.command(f"ALTER TABLE {scratch} UPDATE {name} = defaultValueOfArgumentType(assumeNotNull({name}))"
                   f" WHERE id = {row} SETTINGS mutations_sync = 2")
        assert checksum_target(ch, clickhouse_checksum_sql(schema, FIX, "types_changed"), predicates) != source, \
            column.name


@pytest.mark.parametrize("mariadb", [True, False], ids=["mariadb-text", "exact-binary-text"])
def test_float_texts_agree_on_random_bit_patterns(in_range, endpoints, spark, ch, mariadb):
    """The float part of the row text (core/typemap.py) is the same in MariaDB and ClickHouse
    for any finite double (random bit patterns, every power of two and its neighbours, both sides
    of each decade where the notations switch, subnormals, ±max, negative zero) and differs for
    different values: MariaDB's own text rewritten by ClickHouse, and the exact-binary text that
    MySQL 8 sources use."""
    import math
    import random
    import struct

    from airflow_sync_provider.core.typemap import MySQLColumn, map_column

    d, f = (map_column(MySQLColumn(name, kind, kind, True, mariadb=mariadb))
            for name, kind in (("d", "double"), ("f", "float")))
    rng = random.Random(20261121)
    values = [0.0, -0.0, 5e-324, -5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, 1e20, 1.5e-7, 0.1]
    for k in range(-1074, 1024, 7):
        values += [math.ldexp(1.0, k), math.nextafter(math.ldexp(1.0, k), 0.0)]
    for e in range(-17, 24):
        for m in (1.0, 1.5, 9.999999999999999):
            v = float(f"{m}e{e}")
            values += [v, -v, math.nextafter(v, 0.0), math.nextafter(v, math.inf)]
    while len(values) < 4000:
        value = struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0]
        if value == value and abs(value) != float("inf"):
            values.append(value)
    with in_range.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS {DB}.doubles")
        cur.execute(f"CREATE TABLE {DB}.doubles (id INT PRIMARY KEY, d DOUBLE NOT NULL, f FLOAT NULL)")
        cur.executemany(f"INSERT INTO {DB}.doubles VALUES (%s, %s, %s)",
                        [(i, v, v if abs(v) < 3e38 else None) for i, v in enumerate(values)])
        cur.execute(f"SELECT id, {d.mysql_text('d')}, {f.mysql_text('f')} FROM {DB}.doubles ORDER BY id")
        source = [tuple(r) for r in cur.fetchall()]
    key = load(endpoints, spark, "doubles", target_database=FIX)
    target = [tuple(r) for r in ch.query(f"SELECT id, {d.ch_text('d')}, {f.ch_text('f')}"
                                         f" FROM `{FIX}`.doubles FINAL ORDER BY id"
                                         # every branch safe when a server evaluates them all
                                         " SETTINGS short_circuit_function_evaluation = 'disable'").result_rows]
    assert source == target
    assert len({r[1] for r in source}) == len({v if v else 0.0 for v in values})  # one text per value
    assert reconcile(endpoints, spark, key)["verdict"] == "ok"


def test_a_repair_that_crashes_after_publishing_resumes_without_duplicates(in_range, endpoints, spark, ch,
                                                                           monkeypatch):
    """A crash between the repair's publish and its ledger update: the resumed run publishes
    again, and the table holds each row once (raw count, not only FINAL)."""

    key = load(endpoints, spark, "bigint_signed", target_database=FIX)
    table = f"`{FIX}`.bigint_signed"
    ch.command(f"ALTER TABLE {table} UPDATE v = -1 WHERE k = 0 SETTINGS mutations_sync = 2")
    assert reconcile(endpoints, spark, key)["verdict"] == "mismatch"
    repair = FullLoadSpec(sources=one_server(endpoints[0]), target=endpoints[1], source_database=DB,
                          source_table="bigint_signed", target_database=FIX, target_table="bigint_signed", load_key=key,
                          reimport="failed")

    publish = repairs.publish_repair

    def publish_then_crash(*args, **kwargs):
        publish(*args, **kwargs)
        raise RuntimeError("driver killed after publishing")

    monkeypatch.setattr(repairs, "publish_repair", publish_then_crash)
    with pytest.raises(RuntimeError, match="killed"):
        run_full_load(repair, spark)
    monkeypatch.undo()
    assert Ledger(ch).state(key).repair  # the repair is still pending in the ledger
    result = run_full_load(repair, spark)  # resumes: nothing left to read, publishes again
    assert result["shards_read"] == 0 and result["repaired"]
    total = source_count(in_range, "bigint_signed")
    assert [int(n) for n in ch.command(f"SELECT count(), uniqExact(k) FROM {table}")] == [total, total]
    assert reconcile(endpoints, spark, key)["verdict"] == "ok"

"""Copies laid out by the user (core/clickhouse/layout.py): the options, the DDL, and — on the real
services — exactness when source updates move rows across sorting keys and partitions."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_sync_provider.core.clickhouse.layout import (
    Layout,
    LayoutError,
    check_same,
    distributed_sql,
    layout_comment,
    shard_of,
    stored,
)
from airflow_sync_provider.core.jobspec import (
    CdcApplySpec,
    CdcBootstrapSpec,
    FullLoadSpec,
    ReconcileSpec,
    SnapshotDiffSpec,
)
from airflow_sync_provider.core.selection import TableSet
from airflow_sync_provider.core.source.group import one_server
from airflow_sync_provider.core.verify.diff import DuplicateKey

DB, TARGET = "lay", "lay_ch"
COLUMNS = ["id", "tenant", "status", "day", "amount", "note"]


# --- the options (fast) ------------------------------------------------------------------------

def test_the_key_is_appended_to_the_sorting_key_and_what_moves_a_row_is_named():
    layout = Layout.of({"order_by": ["tenant", "toDate(day)"], "partition_by": "toYYYYMM(`day`)"})
    assert layout.sorting_key(("id",), COLUMNS) == ["`tenant`", "toDate(day)", "toYYYYMM(`day`)", "`id`"]
    assert Layout.of({"order_by": ["tenant", "id"]}).sorting_key(("id",), COLUMNS) == ["`tenant`", "`id`"]
    assert layout.place_columns(COLUMNS) == ["tenant", "day"]
    # a name inside a string literal reads no column
    assert Layout.of({"partition_by": "if(note = 'status', 1, 2)"}).place_columns(COLUMNS) == ["note"]
    sql = layout.clauses(("id",), COLUMNS)
    assert sql == " PARTITION BY toYYYYMM(`day`) ORDER BY (`tenant`, toDate(day), toYYYYMM(`day`), `id`)"


def test_every_option_is_honoured_or_refused_by_name():
    with pytest.raises(LayoutError, match=r"unknown option\(s\) \['sort_by'\]"):
        Layout.of({"sort_by": ["x"]})
    with pytest.raises(LayoutError, match="CollapsingMergeTree"):
        Layout.of({"engine": "CollapsingMergeTree(sign)"})
    with pytest.raises(LayoutError, match="not a prefix"):
        Layout.of({"order_by": ["tenant"], "primary_key": ["status"]}).check("lay.t", ("id",), COLUMNS)
    with pytest.raises(LayoutError, match="layout json 'jsonb': give 'string', 'json' or the JSON columns"):
        Layout.of({"json": "jsonb"})  # json and geo: tests/test_spatial_json.py
    with pytest.raises(LayoutError, match="cluster='c1': jobs do not write to a cluster yet"):
        Layout.of({"cluster": "c1"}).check("lay.t", ("id",), COLUMNS)
    with pytest.raises(LayoutError, match="without a primary key"):
        Layout.of({"order_by": ["tenant"]}).check("lay.t", (), COLUMNS)
    Layout.of({"partition_by": "toYYYYMM(day)"}).check("lay.t", (), COLUMNS)  # a keyless copy may be partitioned
    full = Layout.of({"order_by": "tenant", "primary_key": "tenant", "ttl": "day + INTERVAL 1 YEAR",
                      "settings": ["index_granularity=4096", "merge_with_ttl_timeout=3600"],
                      "engine": "ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/lay/t', '{replica}')"})
    full.check("lay.t", ("id",), COLUMNS)
    assert full.engine_sql("_version", "_deleted") == ("ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/"
                                                      "lay/t', '{replica}', `_version`, `_deleted`)")
    assert full.clauses(("id",), COLUMNS) == (" ORDER BY (`tenant`, `id`) PRIMARY KEY (`tenant`) TTL day + INTERVAL "
                                              "1 YEAR SETTINGS index_granularity = 4096, merge_with_ttl_timeout = 3600")
    # a nullable column in the sorting key or partition (MySQL's default): ClickHouse must be told
    assert Layout.of({"order_by": ["tenant"]}).clauses(("id",), COLUMNS, ("tenant", "note")).endswith(
        " SETTINGS allow_nullable_key = 1")
    assert "SETTINGS" not in Layout.of({"order_by": ["tenant"]}).clauses(("id",), COLUMNS, ("note",))
    assert Layout.of({"engine": "ReplicatedReplacingMergeTree"}).engine_sql("v", "d").startswith(
        "ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}'")
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['orderby'\]"):
        TableSet(tables=[{"source_database": "a", "source_table": "b", "layout": {"orderby": "x"}}])


def test_the_layout_kept_in_the_comment_reads_back_and_a_different_one_is_refused_naming_both():
    layout = Layout.of({"order_by": ["tenant"], "settings": {"index_granularity": 1024}})
    comment = "airflow_sync version=binlog-v2" + layout_comment(layout, ("id",)) + " load=work_1"
    assert stored(comment) == (layout, ["id"])
    assert stored("airflow_sync version=binlog-v2") == (Layout(), None)
    check_same("lay.t", layout, comment)
    with pytest.raises(LayoutError, match=r'laid out as \{"order_by": \["tenant"\].*asks for '
                                          r'\{"order_by": \["status"\]'):
        check_same("lay.t", Layout.of({"order_by": ["status"]}), comment)
    # a copy made before layouts: only a period load's partitions could have been chosen
    check_same("lay.t", Layout.of({"partition_by": "toYYYYMMDD(day)"}), "airflow_sync version=binlog-v2")


@given(st.lists(st.integers(1, 5), min_size=1, max_size=6), st.integers(0, 2**64 - 1))
def test_a_key_hash_goes_to_one_shard_by_the_weights(weights, key_hash):
    shard = shard_of(key_hash, weights)
    slot = key_hash % sum(weights)
    assert sum(weights[:shard]) <= slot < sum(weights[:shard + 1])


def test_a_cluster_copy_is_a_distributed_table_sharded_by_the_source_key():
    sql = distributed_sql(Layout.of({"cluster": "two"}), "lay", "orders", ("id", "tenant"))
    assert sql == ("CREATE TABLE IF NOT EXISTS `lay`.`orders` ON CLUSTER `two` AS `lay`.`orders_local` ENGINE = "
                   "Distributed(`two`, `lay`, `orders_local`, cityHash64(`id`, `tenant`))")


# --- on the real services ----------------------------------------------------------------------

LAYOUTS = {
    "order_by": {"order_by": ["tenant", "status"]},
    "partition_by": {"partition_by": "toYYYYMM(day)"},
    "both": {"order_by": ["status"], "partition_by": "toYYYYMM(day)", "settings": {"index_granularity": 256}},
}


def _source(mysql_conn, table: str, rows: int = 3000) -> None:
    with mysql_conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE IF NOT EXISTS {DB}")
        cur.execute(f"DROP TABLE IF EXISTS {DB}.{table}")
        cur.execute(f"CREATE TABLE {DB}.{table} (id INT PRIMARY KEY, tenant INT NOT NULL, status VARCHAR(10) NOT NULL, "
                    "day DATE NOT NULL, amount DECIMAL(10, 2), note VARCHAR(20))")
        cur.execute(f"INSERT INTO {DB}.{table} SELECT seq, seq % 4, ELT(1 + seq % 3, 'new', 'paid', 'sent'), "
                    f"'2025-01-01' + INTERVAL (seq % 90) DAY, seq / 8, CONCAT('n', seq) FROM {DB}.seq_1_to_{rows}")


def _load(endpoints, spark, table: str, layout: dict | None, key: str | None = None, reshape: bool = False) -> str:
    from airflow_sync_provider.spark.full_load import run_full_load

    key = key or f"lay.{table}"
    run_full_load(FullLoadSpec(sources=one_server(endpoints[0]), target=endpoints[1], source_database=DB,
                               source_table=table, target_database=TARGET, target_table=table, load_key=key,
                               channels=2, split_factor=2, tableset=TableSet(layout=layout), reshape=reshape), spark)
    return key


def _moves(mysql_conn, table: str) -> None:
    """Updates that move rows across sorting keys and partitions, and back, some several times
    in one transaction; deletes, key changes and updates that move nothing."""
    t = f"{DB}.{table}"
    with mysql_conn.cursor() as cur:
        cur.execute(f"UPDATE {t} SET status = 'held' WHERE id % 7 = 0")
        cur.execute(f"UPDATE {t} SET day = day + INTERVAL 40 DAY WHERE id % 5 = 0")
        cur.execute(f"UPDATE {t} SET tenant = tenant + 1, day = day - INTERVAL 40 DAY WHERE id % 15 = 0")
        cur.execute(f"UPDATE {t} SET status = ELT(1 + id % 3, 'new', 'paid', 'sent') WHERE id % 14 = 0")  # back
        cur.execute("BEGIN")
        for status in ("a", "b", "a", "c"):  # one key through four places in one transaction
            cur.execute(f"UPDATE {t} SET status = %s, tenant = tenant + 1 WHERE id BETWEEN 1 AND 60", (status,))
        cur.execute("COMMIT")
        cur.execute(f"UPDATE {t} SET amount = amount + 1 WHERE id % 2 = 0")
        cur.execute(f"DELETE FROM {t} WHERE id % 11 = 0")
        cur.execute(f"UPDATE {t} SET id = id + 100000, status = 'moved' WHERE id % 13 = 0")
        cur.execute(f"INSERT INTO {t} VALUES (900001, 9, 'late', '2025-06-30', 1.5, NULL)")


def _exact(mysql_conn, ch, table: str) -> int:
    """FINAL == the source row for row, with no key twice: with partitions read apart by FINAL and
    after every part is merged."""
    from tests.helpers import assert_same_rows

    with mysql_conn.cursor() as cur:
        cur.execute(f"SELECT count(*) FROM {DB}.{table}")
        rows = cur.fetchone()[0]
    name = f"`{TARGET}`.`{table}`"
    for settings in ({}, {"do_not_merge_across_partitions_select_final": 1}):
        assert int(ch.command(f"SELECT count() FROM {name} FINAL", settings=settings)) == rows
        assert int(ch.command(f"SELECT uniqExact(id) FROM {name} FINAL", settings=settings)) == rows
    assert assert_same_rows(mysql_conn, ch, DB, table, TARGET) == rows
    ch.command(f"OPTIMIZE TABLE {name} FINAL")
    for settings in ({}, {"do_not_merge_across_partitions_select_final": 1}):
        assert int(ch.command(f"SELECT count() FROM {name} FINAL", settings=settings)) == rows
    return rows


def _apply(endpoints, spark, pipeline: str, **kwargs) -> dict:
    from airflow_sync_provider.spark.cdc_apply import run_cdc_apply

    return run_cdc_apply(CdcApplySpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline=pipeline,
                                      lanes=3, **kwargs), spark)


def _reconcile(endpoints, spark, key: str, reimport: bool = False) -> dict:
    from airflow_sync_provider.spark.reconcile import run_reconcile

    return run_reconcile(ReconcileSpec(sources=one_server(endpoints[0]), target=endpoints[1], load_key=key,
                                       checksum=True, reimport=reimport), spark)


@pytest.mark.slow
@pytest.mark.parametrize("layout,decoder", [("order_by", "native"), ("partition_by", "native"), ("both", "native"),
                                            ("both", "reference")])
def test_cdc_that_moves_rows_across_sort_keys_and_partitions_leaves_no_stale_row(
        layout, decoder, mysql_conn, ch, endpoints, spark, monkeypatch):
    if decoder == "reference":  # python-mysql-replication's values, not the compiled row images
        from airflow_sync_provider.core.cdc import rowimage

        monkeypatch.setattr(rowimage.Decoders, "get", lambda self, event, route: None)
    table = f"moves_{layout}_{decoder}"
    _source(mysql_conn, table)
    key = _load(endpoints, spark, table, LAYOUTS[layout])
    facts = ch.query("SELECT sorting_key, partition_key FROM system.tables WHERE database = {d:String} AND "
                     "name = {t:String}", parameters={"d": TARGET, "t": table}).result_rows[0]
    assert facts == {"order_by": ("tenant, status, id", ""), "partition_by": ("toYYYYMM(day), id", "toYYYYMM(day)"),
                     "both": ("status, toYYYYMM(day), id", "toYYYYMM(day)")}[layout]
    _moves(mysql_conn, table)
    # the rolling verification off: it would repair what the stream got wrong (as the next test shows)
    result = _apply(endpoints, spark, table, start_from_loads=[key], batch_events=700, verify_period=0)
    assert result["events"] > 3000 and result["repaired_shards"] == 0
    _exact(mysql_conn, ch, table)
    checked = _reconcile(endpoints, spark, key)
    assert checked["verdict"] == "ok", [s for s in checked["shards"] if s["problems"]]
    if "partition_by" in LAYOUTS[layout]:  # a dropped partition takes its rows and their tombstones alike
        ch.command(f"ALTER TABLE `{TARGET}`.`{table}` DROP PARTITION 202502")
        with mysql_conn.cursor() as cur:
            cur.execute(f"SELECT id FROM {DB}.{table} WHERE day NOT BETWEEN '2025-02-01' AND '2025-02-28'")
            kept = sorted(r[0] for r in cur.fetchall())
        for settings in ({}, {"do_not_merge_across_partitions_select_final": 1}):
            assert [r[0] for r in ch.query(f"SELECT id FROM `{TARGET}`.`{table}` FINAL ORDER BY id",
                                           settings=settings).result_rows] == kept


@pytest.mark.slow
def test_the_checks_find_a_row_left_under_an_old_place_and_the_repairs_remove_it(mysql_conn, ch, endpoints, spark):
    """A copy that lost an old place's tombstone (the mutation every peer's copy suffers) fails
    reconcile --checksum and the snapshot diff; a reconcile re-import and a diff apply, which
    write without before-images, leave no stale row of their own."""
    from airflow_sync_provider.spark.diff import run_snapshot_diff

    table = "checked"
    _source(mysql_conn, table, rows=2000)
    key = _load(endpoints, spark, table, LAYOUTS["both"])
    name = f"`{TARGET}`.`{table}`"
    # the stale row: key 7's earlier place (another status and month), live, below its version
    ch.command(f"INSERT INTO {name} SELECT id, tenant, 'stale', day - INTERVAL 60 DAY, amount, note, 1, 0 "
               f"FROM {name} FINAL WHERE id = 7")
    assert int(ch.command(f"SELECT count() FROM {name} FINAL WHERE id = 7")) == 2
    checked = _reconcile(endpoints, spark, key)
    assert checked["verdict"] != "ok"
    with pytest.raises(DuplicateKey, match=r"key \(id=7\) appears more than once in the old snapshot; .* laid out "
                                           r"as .*left live under an old place"):
        run_snapshot_diff(SnapshotDiffSpec(target=endpoints[1], old_table=f"{TARGET}.{table}",
                                           sources=one_server(endpoints[0]), source_database=DB,
                                           source_table=table), spark)
    repaired = _reconcile(endpoints, spark, key, reimport=True)
    assert repaired["verdict"] == "ok", repaired
    _exact(mysql_conn, ch, table)
    # the pipeline's rolling verification reads by the source key too: it repairs a stale row
    ch.command(f"INSERT INTO {name} SELECT id, tenant, 'stale', day, amount, note, 1, 0 FROM {name} FINAL "
               "WHERE id IN (8, 9)")
    verified = _apply(endpoints, spark, table, start_from_loads=[key], verify=True)
    assert verified["repaired_shards"] >= 1, verified
    _exact(mysql_conn, ch, table)
    # drift the binlog never saw, moving rows: the diff's apply tombstones their old places
    with mysql_conn.cursor() as cur:
        cur.execute("SET sql_log_bin = 0")
        cur.execute(f"UPDATE {DB}.{table} SET status = 'drift', day = day + INTERVAL 45 DAY WHERE id % 17 = 0")
        cur.execute("SET sql_log_bin = 1")
    applied = run_snapshot_diff(SnapshotDiffSpec(target=endpoints[1], old_table=f"{TARGET}.{table}",
                                                 sources=one_server(endpoints[0]), source_database=DB,
                                                 source_table=table, on_change="apply"), spark)
    assert applied["counts"]["changed"] == 2000 // 17
    _exact(mysql_conn, ch, table)


@pytest.mark.slow
def test_a_bootstrap_under_moving_writes_ends_exact(mysql_url, mysql_conn, ch, endpoints, spark):
    import threading

    import pymysql

    from airflow_sync_provider.core.endpoints import MySQLEndpoint
    from airflow_sync_provider.spark.cdc_bootstrap import run_cdc_bootstrap

    table = "booted"
    _source(mysql_conn, table, rows=6000)
    stop, moved = threading.Event(), [0]

    def writer():
        conn = pymysql.connect(**MySQLEndpoint.from_url(mysql_url).connect_args(), autocommit=True)
        rng = random.Random(5)
        with conn.cursor() as cur:
            while not stop.is_set():
                lo = rng.randint(1, 5900)
                cur.execute(f"UPDATE {DB}.{table} SET status = %s, day = day + INTERVAL %s DAY WHERE id BETWEEN %s "
                            "AND %s", (rng.choice(["new", "paid", "sent", "held"]), rng.choice([-35, 35]), lo, lo + 40))
                moved[0] += cur.rowcount
        conn.close()

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        run_cdc_bootstrap(CdcBootstrapSpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline=table,
                                           tableset=TableSet(tables=[{"source_database": DB, "source_table": table,
                                                                      "target_database": TARGET}],
                                                             layout=LAYOUTS["both"]),
                                           channels=2, chunk_rows=500), spark)
    finally:
        stop.set()
        thread.join()
    assert moved[0] > 500
    _apply(endpoints, spark, table)
    _exact(mysql_conn, ch, table)


@pytest.mark.slow
def test_a_job_asking_for_another_layout_than_the_copys_is_refused(mysql_conn, ch, endpoints, spark):
    table = "refused"
    _source(mysql_conn, table, rows=200)
    _load(endpoints, spark, table, {"order_by": ["tenant"]})
    with pytest.raises(LayoutError, match=r'laid out as \{"order_by": \["tenant"\]\}.*asks for \{"order_by": '
                                          r'\["status"\]\}.*reshape'):
        _load(endpoints, spark, table, {"order_by": ["status"]})
    _load(endpoints, spark, table, None)  # none asked for: the copy keeps its own
    sorting = f"SELECT sorting_key FROM system.tables WHERE database = '{TARGET}' AND name = '{table}'"
    assert ch.command(sorting) == "tenant, id"
    _load(endpoints, spark, table, {"order_by": ["status"]}, reshape=True)  # a load-only copy laid out anew
    assert ch.command(sorting) == "status, id"
    _exact(mysql_conn, ch, table)


def _writer(mysql_url, table: str, stop, counts: list) -> None:
    """Moves rows across statuses and months, inserts and deletes, until ``stop``."""
    import pymysql

    from airflow_sync_provider.core.endpoints import MySQLEndpoint

    conn = pymysql.connect(**MySQLEndpoint.from_url(mysql_url).connect_args(), autocommit=True)
    rng, new_id = random.Random(7), 1_000_000
    with conn.cursor() as cur:
        while not stop.is_set():
            lo = rng.randint(1, 5900)
            cur.execute(f"UPDATE {DB}.{table} SET status = %s, day = day + INTERVAL %s DAY WHERE id BETWEEN %s "
                        "AND %s", (rng.choice(["new", "paid", "sent", "held"]), rng.choice([-35, 35]), lo, lo + 30))
            new_id += 1
            cur.execute(f"INSERT INTO {DB}.{table} VALUES (%s, 1, 'new', '2025-02-02', 1, NULL)", (new_id,))
            cur.execute(f"DELETE FROM {DB}.{table} WHERE id = %s", (rng.randint(1, 6000),))
            counts[0] += 1
    conn.close()


@pytest.mark.slow
def test_a_reshape_under_a_writer_swaps_without_a_gap_or_a_duplicate(mysql_url, mysql_conn, ch, endpoints, spark):
    """A mirror copy followed by CDC is laid out anew (order_by + partition_by) while a writer moves
    rows: the pipeline re-copies it beside the stream and swaps it in; a reader polling the copy
    meanwhile always finds it, each key once; afterwards FINAL == the source."""
    import threading

    table = "reshaped"
    _source(mysql_conn, table, rows=6000)
    key = _load(endpoints, spark, table, None)
    _apply(endpoints, spark, table, start_from_loads=[key], verify_period=0)
    stop, counts, seen = threading.Event(), [0], []

    def reader():
        from airflow_sync_provider.core.clickhouse.client import client

        reading = client(endpoints[1])
        while not stop.is_set():
            rows, keys = reading.query(f"SELECT count(), uniqExact(id) FROM `{TARGET}`.`{table}` FINAL").result_rows[0]
            seen.append((rows, keys))
        reading.close()

    threads = [threading.Thread(target=_writer, args=(mysql_url, table, stop, counts)), threading.Thread(target=reader)]
    for thread in threads:
        thread.start()
    try:
        result = _apply(endpoints, spark, table, reshape=True, verify=True,
                        tableset=TableSet(tables=[{"source_database": DB, "source_table": table,
                                                   "target_database": TARGET}], layout=LAYOUTS["both"]))
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert result["recopied"] == [f"{DB}.{table}"] and counts[0] > 20
    # the pipeline's verification, on beside the reshape, finds the new copy as exact as the old
    assert result["repaired_shards"] == 0 and all(v["mismatched"] == [] for v in result["verified"]), result
    assert len(seen) > 5 and all(rows == keys and rows > 5000 for rows, keys in seen), seen[:5]
    facts = ch.query("SELECT sorting_key, partition_key FROM system.tables WHERE database = {d:String} AND "
                     "name = {t:String}", parameters={"d": TARGET, "t": table}).result_rows[0]
    assert facts == ("status, toYYYYMM(day), id", "toYYYYMM(day)")
    _apply(endpoints, spark, table, verify_period=0)
    _exact(mysql_conn, ch, table)
    again = _apply(endpoints, spark, table, reshape=True, verify_period=0,  # laid out so already: nothing to do
                   tableset=TableSet(tables=[f"{DB}.{table}"], layout=LAYOUTS["both"]))
    assert again["recopied"] == []




@pytest.mark.slow
def test_a_reshape_keeps_the_old_copy_current_until_the_swap(mysql_conn, ch, endpoints, spark):
    """A service re-lays a copy out while rows keep arriving (its re-copy throttled to a few
    seconds): rows inserted after the reshape began reach the copy readers query, still under
    its old layout, before the new one is swapped in; afterwards FINAL == the source."""
    import time

    from airflow_sync_provider.core.cdc.checkpoints import Checkpoints
    from airflow_sync_provider.spark.cdc_apply import run_cdc_apply
    from tests.helpers import in_background, stop_service

    table = "kept_current"
    _source(mysql_conn, table, rows=6000)
    key = _load(endpoints, spark, table, None)
    _apply(endpoints, spark, table, start_from_loads=[key], verify_period=0)
    spec = CdcApplySpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline=table, lanes=2, service=True,
                        max_seconds=30, batch_seconds=0.2, recopy_channels=1, recopy_record_speed=1000,
                        reshape=True, verify_period=0, tableset=TableSet(tables=[{
                            "source_database": DB, "source_table": table, "target_database": TARGET}],
                            layout=LAYOUTS["both"]))
    def sorting_key() -> str:
        return ch.command("SELECT sorting_key FROM system.tables WHERE database = {d:String} AND name = {t:String}",
                          parameters={"d": TARGET, "t": table})

    service, result, errors = in_background(lambda: run_cdc_apply(spec, spark))
    marker, first, shown, laid_out = 2_000_000, None, [], "status, toYYYYMM(day), id"
    try:
        deadline = time.monotonic() + 28
        while time.monotonic() < deadline and sorting_key() != laid_out:
            marker += 1
            with mysql_conn.cursor() as cur:
                cur.execute(f"INSERT INTO {DB}.{table} VALUES (%s, 1, 'new', '2025-02-02', 1, NULL)", (marker,))
            state = Checkpoints(ch).state(table)
            if state and any(t.recopying for t in state.tables):  # the reshape is under way
                first = first or marker
                newest = int(ch.command(f"SELECT max(id) FROM `{TARGET}`.`{table}` FINAL WHERE id > 2000000"))
                if sorting_key() != laid_out:  # still the old copy
                    shown.append(newest)
            time.sleep(0.3)
    finally:
        stop_service(ch, table, service)
    assert not errors, errors
    assert result["recopied"] == [f"{DB}.{table}"] and first is not None
    assert any(newest > first for newest in shown), (first, shown)  # the old copy took rows after the reshape began
    assert sorting_key() == laid_out
    _apply(endpoints, spark, table, verify_period=0)
    _exact(mysql_conn, ch, table)

def test_the_example_dag_lays_out_a_copy_with_valid_options():
    """dags/example_layout.py parses, and its layout is one a copy of the demo orders takes."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "dags" / "example_layout.py"
    module_spec = importlib.util.spec_from_file_location("example_layout", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    layout = Layout.of(module.LAYOUT)
    layout.check("demo.orders", ("id",), ["id", "customer_id", "created_at", "status"])
    assert layout.sorting_key(("id",), ["id", "customer_id", "created_at"]) == [
        "`customer_id`", "`created_at`", "toYYYYMM(created_at)", "`id`"]


@pytest.mark.slow
def test_a_period_load_into_a_copy_made_before_layouts_keeps_its_structure(mysql_conn, ch, endpoints, spark):
    """A partitioned copy from before layouts (sorting key = the key alone, no layout in its
    comment) still takes a period load: its stage is made like it, so REPLACE PARTITION matches."""
    from airflow_sync_provider.core.clickhouse.columns import TABLE_COMMENT
    from airflow_sync_provider.spark.full_load import run_full_load

    table = "legacy_period"
    _source(mysql_conn, table, rows=500)
    ch.command(f"CREATE DATABASE IF NOT EXISTS {TARGET}")
    ch.command(f"DROP TABLE IF EXISTS {TARGET}.{table}")
    ch.command(f"CREATE TABLE {TARGET}.{table} (id Int32, tenant Int32, status String, day Date, amount "
               "Nullable(Decimal(10, 2)), note Nullable(String), _version UInt64 DEFAULT 0, _deleted UInt8 DEFAULT 0) "
               "ENGINE = ReplacingMergeTree(_version, _deleted) PARTITION BY toYYYYMM(day) ORDER BY (id) "
               f"COMMENT '{TABLE_COMMENT}'")
    for month, (start, end) in {"202501": ("2025-01-01", "2025-02-01"), "202502": ("2025-02-01", "2025-03-01")}.items():
        run_full_load(FullLoadSpec(sources=one_server(endpoints[0]), target=endpoints[1], source_database=DB,
                                   source_table=table, target_database=TARGET, target_table=table,
                                   load_key=f"lay.legacy.{month}", where="day >= %s AND day < %s",
                                   where_params=[start, end], partition_by="toYYYYMM(day)",
                                   replace_partitions=[month]), spark)
    sorting = f"SELECT sorting_key FROM system.tables WHERE database = '{TARGET}' AND name = '{table}'"
    assert ch.command(sorting) == "(id)"
    with mysql_conn.cursor() as cur:
        cur.execute(f"SELECT count(*) FROM {DB}.{table} WHERE day < '2025-03-01'")
        assert int(ch.command(f"SELECT count() FROM {TARGET}.{table} FINAL")) == cur.fetchone()[0]

"""A merged copy laid out by the user (core/clickhouse/layout.py, core/source/group.py): two MariaDB
servers whose ``glay.orders`` tables overlap in ids, merged into one ClickHouse table ordered by
status and partitioned by month, its sorting key ending in the merged key (the primary key, then
the source columns). Loaded, followed by CDC while rows move across statuses and months and back,
reconciled, re-imported, diffed and applied, and laid out anew by a group load: after every step
the copy (FINAL) equals the union of the sources row for row — the expected rows read from MySQL
by the test itself — each merged key once, with partitions read apart by FINAL and after every
part is merged. A job asking for another layout than the copy's is refused naming both; the
pipeline refuses to reshape a merged copy, naming the group load that does."""

from __future__ import annotations

import dataclasses

import pymysql
import pytest

from airflow_sync_provider.core.clickhouse.layout import Layout, LayoutError
from airflow_sync_provider.core.content import ContentError
from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
from airflow_sync_provider.core.jobspec import (
    CdcApplySpec,
    CdcBootstrapSpec,
    FullLoadSpec,
    ReconcileSpec,
    SnapshotDiffSpec,
)
from airflow_sync_provider.core.selection import TableSet
from airflow_sync_provider.core.source.group import Member, Merge, Source, one_server
from tests.helpers import run_sql

SOURCES = ("s0", "s1")
DB, TABLE = "glay", "orders"
SELECT = {"databases": [DB], "tables": [TABLE]}
LAYOUT = {"order_by": ["status"], "partition_by": "toYYYYMM(day)"}
LOADED, FOLLOWED = "glay_ch.orders_loaded", "glay_ch.orders_followed"
PIPELINE = "glay"
MERGED_KEY = "id, _source, _source_database, _source_table"
ENDPOINT = MySQLEndpoint.from_url("mysql://u:p@localhost:3306/")
TARGET = ClickHouseEndpoint.from_url("http://localhost:8123/")


# --- the options (fast) --------------------------------------------------------------------------

def test_a_merged_copy_takes_one_layout_and_the_pipeline_refuses_to_reshape_it():
    sources = [Source(n, ENDPOINT) for n in SOURCES]
    spec = FullLoadSpec(target=TARGET, source_database="", source_table="", target_database="", target_table="",
                        sources=sources, merge=Merge.of(LOADED), tableset=TableSet(select=SELECT, layout=LAYOUT))
    member = spec.for_member(Member("s0", DB, TABLE), ENDPOINT, {"columns": None, "exclude_columns": [],
                                                                  "split_column": None})
    assert member.layout == Layout.of(LAYOUT)  # each member's load writes the merged copy's layout
    # the selection's own layout goes over the job's; named tables must agree with it
    both = TableSet(select={**SELECT, "layout": {"order_by": ["day"]}}, layout=LAYOUT).configured()
    assert both.merged_layout() == Layout.of({**LAYOUT, "order_by": ["day"]})
    with pytest.raises(LayoutError, match=r"one table with one layout.*\{\"order_by\": \[\"status\"\].* and "
                                          r".*\{\"order_by\": \[\"day\"\]"):
        FullLoadSpec(target=TARGET, source_database="", source_table="", target_database="", target_table="",
                     sources=sources, merge=Merge.of(LOADED),
                     tableset=TableSet(tables=[{"source_database": DB, "source_table": "a", "layout": LAYOUT},
                                               {"source_database": DB, "source_table": "b",
                                                "layout": {"order_by": ["day"]}}]))
    # appended to the sorting key: the merged key
    assert Layout.of(LAYOUT).sorting_key(("id", "_source", "_source_database", "_source_table"),
                                         ["id", "status", "day", "_source", "_source_database", "_source_table"]) == [
        "`status`", "toYYYYMM(day)", "`id`", "`_source`", "`_source_database`", "`_source_table`"]
    # the pipeline re-copies one source table at a time: a merged copy is laid out anew by a group load
    with pytest.raises(LayoutError, match=rf"merged copy {FOLLOWED} cannot be reshaped by its pipeline.*"
                                          rf"--merge-into {FOLLOWED} --reshape"):
        CdcApplySpec(target=TARGET, pipeline=PIPELINE, sources=sources, merge=Merge.of(FOLLOWED), reshape=True,
                     tableset=TableSet(tables=[f"{DB}.{TABLE}"], layout={"order_by": ["day"]}))
    # content settings stay refused for merged copies
    with pytest.raises(ContentError, match="not supported for merged copies"):
        FullLoadSpec(target=TARGET, source_database="", source_table="", target_database="", target_table="",
                     sources=sources, merge=Merge.of(LOADED), tableset=TableSet(select=SELECT,
                                                                                content={"row_filter": "id > 1"}))


def test_the_command_line_reloads_a_merged_copy_under_a_new_layout(monkeypatch):
    """`airflow-sync load --source … --merge-into … --reshape --order-by …` asks for a group load
    that replaces the merged copy under the new layout."""
    from airflow_sync_provider.cli import load, main

    submitted = []
    monkeypatch.setattr(load, "submit", lambda spec, *args, **kwargs: submitted.append(spec) or 0)
    for name in SOURCES:
        monkeypatch.setenv(f"MYSQL_URL_{name.upper()}", "mysql://u:p@localhost:3306/")
    assert main(["load", "--source", "s0", "--source", "s1", "--database", DB, "--select-table", TABLE,
                 "--merge-into", LOADED, "--reshape", "--order-by", "day", "--clickhouse-url",
                 "http://localhost:8123/"]) == 0
    spec = submitted[0]
    assert spec.reshape and spec.merge.into == LOADED and spec.tableset.merged_layout() == Layout.of(
        {"order_by": ["day"]})


# --- on the real services --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """Two MariaDB servers (each its own binlog and server_id), s0 and s1, with glay.orders from id 1."""
    from devenv.mariadb import group_servers

    with group_servers(tmp_path_factory.mktemp("group-layouts"), SOURCES) as urls:
        for i, url in enumerate(urls.values()):
            with _connect(url) as conn:
                run_sql(conn, f"CREATE DATABASE {DB}",
                        f"CREATE TABLE {DB}.{TABLE} (id INT PRIMARY KEY, status VARCHAR(10) NOT NULL, "
                        "day DATE NOT NULL, amount DECIMAL(10, 2), note VARCHAR(20))",
                        f"INSERT INTO {DB}.{TABLE} SELECT seq, ELT(1 + (seq + {i}) % 3, 'new', 'paid', 'sent'), "
                        f"'2025-01-01' + INTERVAL ((seq * {3 + i}) % 90) DAY, seq / 8, "
                        f"IF(seq % 5 = 0, NULL, CONCAT('s{i}-', seq)) FROM {DB}.seq_1_to_{300 + 50 * i}")
        yield urls


def _connect(url: str):
    return pymysql.connect(**MySQLEndpoint.from_url(url).connect_args(), autocommit=True)


def _sources(pair: dict) -> list[Source]:
    return [Source(name, MySQLEndpoint.from_url(url)) for name, url in pair.items()]


def _expected(pair: dict) -> list[tuple]:
    """The union of the sources' rows, read from MySQL: (source, database, table, id, status, day,
    amount, note), sorted."""
    rows = []
    for name, url in pair.items():
        with _connect(url) as conn, conn.cursor() as cur:
            cur.execute(f"SELECT id, status, day, amount, note FROM {DB}.{TABLE}")
            rows += [(name, DB, TABLE, *row) for row in cur.fetchall()]
    return sorted(rows)


def _exact(pair: dict, ch, merged: str) -> int:
    """FINAL == the sources row for row, each merged key once: as FINAL reads it, with partitions
    read apart by FINAL, and after every part is merged."""
    expected = _expected(pair)
    select = (f"SELECT _source, _source_database, _source_table, id, status, day, amount, note FROM {merged} FINAL "
              "ORDER BY _source, _source_database, _source_table, id")
    for optimized in (False, True):
        if optimized:
            ch.command(f"OPTIMIZE TABLE {merged} FINAL")
        for settings in ({}, {"do_not_merge_across_partitions_select_final": 1}):
            actual = [tuple(r) for r in ch.query(select, settings=settings).result_rows]
            assert len(actual) == len(set(r[:4] for r in actual)), f"{merged}: a merged key twice ({settings})"
            missing, extra = set(expected) - set(actual), set(actual) - set(expected)
            assert not missing and not extra, (f"{merged} {settings} optimized={optimized}: missing "
                                               f"{sorted(missing)[:3]}, extra {sorted(extra)[:3]}")
            assert actual == expected
    return len(expected)


def _keys(ch, merged: str) -> tuple[str, str]:
    database, table = merged.split(".")
    return tuple(ch.query("SELECT sorting_key, partition_key FROM system.tables WHERE database = {d:String} AND "
                          "name = {t:String}", parameters={"d": database, "t": table}).result_rows[0])


def _load(pair, endpoints, key: str, layout: dict | None, into: str = LOADED, reshape: bool = False) -> dict:
    from airflow_sync_provider.spark.group_load import run_group_load

    spec = FullLoadSpec(target=endpoints[1], source_database="", source_table="", target_database="", target_table="",
                        sources=_sources(pair), merge=Merge.of(into), load_key=key, channels=2, split_factor=2,
                        tableset=TableSet(select=SELECT, layout=layout), reshape=reshape)
    return run_group_load(spec, None)  # no Spark: a few hundred rows are copied by the driver


def _apply(pair, endpoints) -> dict:
    from airflow_sync_provider.spark.cdc_group import run_group_apply

    # no verification: the stream alone must keep the copy exact (a look would repair it)
    return run_group_apply(CdcApplySpec(target=endpoints[1], pipeline=PIPELINE, sources=_sources(pair),
                                        merge=Merge.of(FOLLOWED), lanes=3, batch_events=100, verify_period=0,
                                        verify_after_ddl=False), None)


def _bootstrap(pair, endpoints, layout: dict, restart: bool = False) -> dict:
    from airflow_sync_provider.spark.cdc_group import run_group_bootstrap

    return run_group_bootstrap(CdcBootstrapSpec(target=endpoints[1], pipeline=PIPELINE, sources=_sources(pair),
                                                merge=Merge.of(FOLLOWED), tableset=TableSet(select=SELECT,
                                                                                            layout=layout),
                                                chunk_rows=120, restart=restart), None)


def _moves(conn, offset: int, round_: int = 0) -> None:
    """Updates that move rows across statuses and months and back, a key through four places in
    one transaction, deletes, a key change and inserts; updates that move nothing."""
    t = f"{DB}.{TABLE}"
    run_sql(conn, f"UPDATE {t} SET status = 'held' WHERE id % 7 = {offset}",
            f"UPDATE {t} SET day = day + INTERVAL 40 DAY WHERE id % 5 = {offset}",
            f"UPDATE {t} SET status = 'late', day = day - INTERVAL 40 DAY WHERE id % 15 = {offset}",
            f"UPDATE {t} SET status = ELT(1 + id % 3, 'new', 'paid', 'sent') WHERE id % 14 = {offset}",  # back
            "BEGIN",
            *[f"UPDATE {t} SET status = '{s}', day = day + INTERVAL {d} DAY WHERE id BETWEEN 1 AND 40"
              for s, d in (("a", 31), ("b", -31), ("a", 62), ("c", -62))],
            "COMMIT",
            f"UPDATE {t} SET amount = amount + 1 WHERE id % 2 = 0",
            f"DELETE FROM {t} WHERE id % 11 = {offset}",
            f"UPDATE {t} SET id = id + 100000, status = 'moved' WHERE id % 13 = {offset}",
            f"INSERT INTO {t} VALUES (900001 + {round_}, 'new', '2025-06-30', 1.5, NULL), "
            f"(1000 + {10 * round_ + offset}, 'x', '2024-12-31', NULL, 'ünï 🚀')")


@pytest.mark.slow
def test_a_merged_copy_under_a_layout_stays_exact_through_load_cdc_reconcile_diff_and_reshape(pair, endpoints, ch):
    from airflow_sync_provider.spark.cdc_apply import run_cdc_apply
    from airflow_sync_provider.spark.diff import run_group_diff
    from airflow_sync_provider.spark.reconcile import run_group_reconcile

    sorted_as = (f"status, toYYYYMM(day), {MERGED_KEY}", "toYYYYMM(day)")
    ch.command(f"DROP TABLE IF EXISTS {LOADED}")
    ch.command(f"DROP TABLE IF EXISTS {FOLLOWED}")

    # the group's full load: its working table and publish under the layout
    loaded = _load(pair, endpoints, "glay-load", LAYOUT)
    assert loaded["rows"] == 650 and _keys(ch, LOADED) == sorted_as
    assert int(ch.command(f"SELECT count() FROM {LOADED} FINAL WHERE id = 1")) == 2  # ids overlap: two merged keys
    _exact(pair, ch, LOADED)
    with pytest.raises(LayoutError, match=r'laid out as \{"order_by": \["status"\], "partition_by": '
                                          r'"toYYYYMM\(day\)"\}.*asks for \{"order_by": \["day"\]\}'):
        _load(pair, endpoints, "glay-load-other", {"order_by": ["day"]})

    # the pipeline's bootstrap creates its merged copy under the layout; another layout is refused
    assert _bootstrap(pair, endpoints, LAYOUT)["rows"] == 650
    assert _keys(ch, FOLLOWED) == sorted_as
    with pytest.raises(LayoutError, match=r'laid out as \{"order_by": \["status"\].*asks for \{"order_by": '
                                          r'\["day"\]\}'):
        _bootstrap(pair, endpoints, {"order_by": ["day"]})

    # CDC on both sources moves rows across statuses and months and back: no old place stays live
    for offset, url in enumerate(pair.values()):
        with _connect(url) as conn:
            _moves(conn, offset)
    applied = _apply(pair, endpoints)
    assert applied["events"] > 400, applied
    _exact(pair, ch, FOLLOWED)

    # the loaded copy is behind the sources now: reconcile finds it, the group re-import repairs it
    check = ReconcileSpec(target=endpoints[1], load_key="glay-load", checksum=True, sources=_sources(pair),
                          merge=Merge.of(LOADED))
    assert run_group_reconcile(check, None)["verdict"] != "ok"
    repaired = run_group_reconcile(dataclasses.replace(check, reimport=True), None)
    assert repaired["verdict"] == "ok", repaired
    _exact(pair, ch, LOADED)

    # drift the binlog never saw, moving rows: the group diff's apply tombstones their old places
    for url in pair.values():
        with _connect(url) as conn:
            run_sql(conn, "SET sql_log_bin = 0",
                    f"UPDATE {DB}.{TABLE} SET status = 'drift', day = day + INTERVAL 45 DAY WHERE id % 17 = 0",
                    "SET sql_log_bin = 1")
    diff = SnapshotDiffSpec(target=endpoints[1], old_table="", sources=_sources(pair), merge=Merge.of(LOADED),
                            tableset=TableSet(select=SELECT), on_change="apply")
    assert run_group_diff(diff, None)["counts"]["changed"] > 30
    _exact(pair, ch, LOADED)
    with pytest.raises(LayoutError, match=r'laid out as .*asks for \{"order_by": \["day"\]\}'):
        run_group_diff(SnapshotDiffSpec(target=endpoints[1], old_table="", sources=_sources(pair),
                                        merge=Merge.of(LOADED), tableset=TableSet(select=SELECT,
                                                                                  layout={"order_by": ["day"]})), None)

    # the pipeline does not reshape a merged copy (by the group's name or one source's part) ...
    for pipeline in (PIPELINE, f"{PIPELINE}@s0"):
        with pytest.raises(LayoutError, match=rf"merged copy {FOLLOWED} cannot be reshaped.*--reshape"):
            run_cdc_apply(CdcApplySpec(target=endpoints[1], pipeline=pipeline,
                                       sources=one_server(MySQLEndpoint.from_url(pair["s0"])), reshape=True,
                                       tableset=TableSet(tables=[f"{DB}.{TABLE}"], layout={"order_by": ["day"]})),
                          None)
    # ... a group load with reshape=True does: the copy replaced under the new layout, atomically;
    # the pipeline then bootstrapped again follows it under that layout
    relaid = {"order_by": ["day"]}
    _load(pair, endpoints, "glay-reshape", relaid, into=FOLLOWED, reshape=True)
    assert _keys(ch, FOLLOWED) == (f"day, {MERGED_KEY}", "")
    _exact(pair, ch, FOLLOWED)
    _bootstrap(pair, endpoints, relaid, restart=True)
    for offset, url in enumerate(pair.values()):
        with _connect(url) as conn:
            _moves(conn, offset, round_=1)
    _apply(pair, endpoints)
    _exact(pair, ch, FOLLOWED)

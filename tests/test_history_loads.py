"""A copy's history written by the paths without a binlog (issue 61, slice 4 of
docs/design/history-tables.md): full loads (a ``snapshot`` event per key a load changed, or per key
read with ``snapshots="all"``; a delete for a key that vanished), reconcile's re-import (a ``repair``
event only for a row that differed) and the snapshot diff's apply (insert / update / delete as
found, ``_via`` diff), on the real services. Every expectation is the test's own record of the
source (``state``), taken before each write, never the package's."""

from __future__ import annotations

import functools
import os
import subprocess
import uuid

import pytest

from airflow_sync_provider.core.cdc.tables import PipelineTable
from airflow_sync_provider.core.clickhouse.history import conflicts_sql
from airflow_sync_provider.core.content import ContentError
from airflow_sync_provider.core.content.shaping import Content
from airflow_sync_provider.core.jobspec import CdcApplySpec, FullLoadSpec, ReconcileSpec, SnapshotDiffSpec
from airflow_sync_provider.core.ledger import Ledger
from airflow_sync_provider.core.source.group import one_server
from airflow_sync_provider.core.submission import prepare
from airflow_sync_provider.spark import full_load
from airflow_sync_provider.spark.cdc_slices import Snapshot, plan_check, repair
from airflow_sync_provider.spark.diff import run_snapshot_diff
from airflow_sync_provider.spark.full_load import run_full_load
from airflow_sync_provider.spark.reconcile import run_reconcile
from airflow_sync_provider.spark.session import LazySession

pytestmark = pytest.mark.slow
DB, TARGET = "hist_loads", "hist_loads_ch"
RUN = uuid.uuid4().hex[:8]  # this run's load keys (a killed run's load is never resumed by the next)


@pytest.fixture
def session():
    return LazySession("history loads")  # these tables are copied by the driver: no SparkContext


def make(conn, ch, table: str, rows: int = 30) -> None:
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE IF NOT EXISTS {DB}")
        cur.execute(f"USE {DB}")
        cur.execute(f"DROP TABLE IF EXISTS {DB}.{table}")
        cur.execute(f"CREATE TABLE {DB}.{table} (id INT PRIMARY KEY, name VARCHAR(20) NULL, qty INT NOT NULL)")
        cur.execute(f"INSERT INTO {DB}.{table} SELECT seq, CONCAT('n', seq), seq * 10 FROM seq_1_to_{rows}")
    ch.command(f"CREATE DATABASE IF NOT EXISTS {TARGET}")
    for name in ("_asof", "_asof_time", "_scd2", "_history", ""):
        ch.command(f"DROP TABLE IF EXISTS {TARGET}.{table}{name}")


def change(conn, table: str, *statements: str) -> None:
    with conn.cursor() as cur:
        for statement in statements:
            cur.execute(statement.format(t=f"{DB}.{table}"))


def state(conn, table: str) -> dict:
    """The test's record of the source: id -> (name, qty)."""
    with conn.cursor() as cur:
        cur.execute(f"SELECT id, name, qty FROM {DB}.{table}")
        return {r[0]: (r[1], r[2]) for r in cur.fetchall()}


def load_spec(endpoints, table: str, history=True, **kwargs) -> FullLoadSpec:
    kwargs.setdefault("load_key", f"hist.{table}.{RUN}")
    return FullLoadSpec(sources=one_server(endpoints[0]), target=endpoints[1], source_database=DB, source_table=table,
                        target_database=TARGET, target_table=table, split_factor=3,
                        tableset={"content": {"history": history}}, **kwargs)


def history(ch, table: str) -> list[tuple]:
    """(id, name, qty, _version, _deleted, _event, _via) of every version, FINAL (replays collapsed)."""
    return [tuple(r) for r in ch.query(f"SELECT id, name, qty, _version, _deleted, toString(_event), toString(_via) "
                                       f"FROM {TARGET}.{table}_history FINAL ORDER BY id, _version").result_rows]


def copy(ch, table: str) -> dict:
    """The copy: id -> (name, qty, _version) of its live rows."""
    return {r[0]: (r[1], r[2], r[3]) for r in ch.query(
        f"SELECT id, name, qty, _version FROM {TARGET}.{table} FINAL WHERE _deleted = 0").result_rows}


def as_of(ch, table: str, version: int) -> dict:
    return {r[0]: (r[1], r[2]) for r in ch.query(
        f"SELECT id, name, qty FROM {TARGET}.{table}_asof(at_version={int(version)})").result_rows}


def since(rows: list[tuple], version: int) -> list[tuple]:
    return [r for r in rows if r[3] > version]


def check_latest(ch, conn, table: str) -> dict:
    """The history's newest version of each key == the copy == the source; no (key, version) twice.
    Returns the newest versions."""
    latest = {r[0]: (r[1], r[2], r[3]) for r in ch.query(
        f"SELECT id, argMax(tuple(name, qty, _version), _version).1, argMax(tuple(name, qty, _version), _version).2, "
        f"max(_version) FROM {TARGET}.{table}_history FINAL GROUP BY id "
        f"HAVING argMax(_deleted, _version) = 0").result_rows}
    # values: with snapshots="changes" an unchanged key's newest version is the load that last changed it
    assert {k: v[:2] for k, v in latest.items()} == {k: v[:2] for k, v in copy(ch, table).items()} \
        == state(conn, table)
    assert ch.query(conflicts_sql(TARGET, table, ("id",))).result_rows == []
    return {k: v[2] for k, v in latest.items()}


CHANGES = ("UPDATE {t} SET name = NULL WHERE id = 3", "UPDATE {t} SET qty = qty + 1 WHERE id IN (7, 25)",
           "UPDATE {t} SET name = name WHERE id = 11",  # no change: no event
           "DELETE FROM {t} WHERE id IN (5, 20)", "INSERT INTO {t} VALUES (31, 'new', 1), (40, NULL, 2)")
CHANGED, VANISHED = {3, 7, 25, 31, 40}, {5, 20}


@pytest.mark.parametrize("snapshots, shadow", [("changes", False), ("all", False), ("changes", True)])
def test_loads_write_a_snapshot_per_key_they_change_and_a_delete_per_key_that_vanished(
        mysql_conn, ch, endpoints, session, snapshots, shadow, monkeypatch):
    """``shadow``: the load in the parts layout, published through a shadow copy (publish_full), as
    a load whose split column ClickHouse cannot compare is; else a direct working table's swap."""
    table = f"loaded_{snapshots}{'_shadow' if shadow else ''}"
    if shadow:
        monkeypatch.setattr(full_load, "_plan_copy", functools.partial(full_load._plan_copy, direct=False))
    make(mysql_conn, ch, table)
    first = state(mysql_conn, table)
    spec = load_spec(endpoints, table, True if snapshots == "changes" else {"snapshots": "all"})
    run_full_load(spec, session)
    one = history(ch, table)
    assert [(r[0], r[1], r[2], r[4], r[5], r[6]) for r in one] == [
        (k, *v, 0, "snapshot", "load") for k, v in sorted(first.items())]
    assert {r[0]: r[3] for r in one} == {k: v[2] for k, v in copy(ch, table).items()}  # the copy's versions
    top = max(r[3] for r in one)
    assert as_of(ch, table, top) == first and as_of(ch, table, min(r[3] for r in one) - 1) == {}

    change(mysql_conn, table, *CHANGES)
    second = state(mysql_conn, table)
    run_full_load(spec, session)
    now, written = copy(ch, table), since(history(ch, table), top)
    read = set(second) if snapshots == "all" else CHANGED
    assert sorted((r[0], r[1], r[2], r[4], r[5], r[6]) for r in written) == sorted(
        [(k, *second[k], 0, "snapshot", "load") for k in read] + [(k, *first[k], 1, "snapshot", "load")
                                                                  for k in VANISHED])
    assert all(r[3] == now[r[0]][2] for r in written if not r[4])  # each at the copy's own version
    assert [r for r in history(ch, table) if r[3] <= top] == one  # the past kept
    assert as_of(ch, table, top) == first and as_of(ch, table, max(r[3] for r in written)) == second
    newest = check_latest(ch, mysql_conn, table)
    if snapshots == "all":  # every key read again: the history's newest versions are the copy's
        assert newest == {k: v[2] for k, v in now.items()}


def test_a_reimport_writes_a_repair_event_only_for_the_rows_that_differ(mysql_conn, ch, endpoints, session):
    table = "repaired"
    make(mysql_conn, ch, table)
    spec = load_spec(endpoints, table)
    run_full_load(spec, session)
    before, top = history(ch, table), max(r[3] for r in history(ch, table))
    first = state(mysql_conn, table)
    change(mysql_conn, table, "UPDATE {t} SET qty = -1 WHERE id = 4", "DELETE FROM {t} WHERE id = 17",
           "INSERT INTO {t} VALUES (35, 'late', 3)")
    # the copy alone made wrong (its history is right): the repair fixes the copy, and no event
    ch.command(f"ALTER TABLE {TARGET}.{table} UPDATE name = 'wrong' WHERE id = 9 SETTINGS mutations_sync = 2")
    second = state(mysql_conn, table)
    reconcile = ReconcileSpec(sources=one_server(endpoints[0]), target=endpoints[1], load_key=spec.load_key,
                              checksum=True, reimport=True)
    result = run_reconcile(reconcile, session)
    assert result["before"]["verdict"] == "mismatch" and result["verdict"] == "ok", result
    written = since(history(ch, table), top)
    assert sorted((r[0], r[1], r[2], r[4], r[5], r[6]) for r in written) == [
        (4, "n4", -1, 0, "repair", "reconcile"), (17, *first[17], 1, "repair", "reconcile"),
        (35, "late", 3, 0, "repair", "reconcile")]
    assert {r[0]: r[3] for r in written if not r[4]} == {k: copy(ch, table)[k][2] for k in (4, 35)}
    assert [r for r in history(ch, table) if r[3] <= top] == before
    assert as_of(ch, table, top) == first and as_of(ch, table, max(r[3] for r in written)) == second
    check_latest(ch, mysql_conn, table)


def test_a_diff_apply_writes_its_changes_as_found_without_a_binlog(mysql_conn, ch, endpoints, session):
    table = "diffed"
    make(mysql_conn, ch, table)
    run_full_load(load_spec(endpoints, table), session)
    top = max(r[3] for r in history(ch, table))
    first = state(mysql_conn, table)
    change(mysql_conn, table, *CHANGES)
    second = state(mysql_conn, table)
    result = run_snapshot_diff(SnapshotDiffSpec(target=endpoints[1], old_table=f"{TARGET}.{table}",
                                                sources=one_server(endpoints[0]), source_database=DB,
                                                source_table=table, on_change="apply"), session)
    assert result["verdict"] == "applied", result
    written = since(history(ch, table), top)
    assert sorted((r[0], r[1], r[2], r[3], r[4], r[5], r[6]) for r in written) == sorted(
        [(k, *second[k], result["version"], 0, "update", "diff") for k in (3, 7, 25)]
        + [(k, *second[k], result["version"], 0, "insert", "diff") for k in (31, 40)]
        + [(k, *first[k], result["version"], 1, "delete", "diff") for k in VANISHED])
    assert as_of(ch, table, top) == first and as_of(ch, table, result["version"]) == second
    check_latest(ch, mysql_conn, table)


@pytest.mark.parametrize("snapshots", ["changes", "all"])
def test_a_load_killed_between_its_history_and_its_publish_leaves_no_duplicate_or_orphan_version(
        mysql_conn, ch, endpoints, session, tmp_path, snapshots):
    """The job (this checkout's, as a process of its own) is SIGKILLed at ``load.history-written``:
    its history is written, its copy not; the run again publishes and the history holds each of its
    versions once, every one the copy's."""
    table = f"killed_{snapshots}"
    make(mysql_conn, ch, table)
    spec = load_spec(endpoints, table, True if snapshots == "changes" else {"snapshots": "all"})
    run_full_load(spec, session)
    top, first = max(r[3] for r in history(ch, table)), state(mysql_conn, table)
    change(mysql_conn, table, *CHANGES)
    second = state(mysql_conn, table)
    cmd, env = prepare(spec, str(tmp_path))
    job = subprocess.run(cmd, env={**os.environ, **env, "AIRFLOW_SYNC_CRASH_AT": "load.history-written:1"},
                         capture_output=True, text=True, timeout=300)
    assert job.returncode in (-9, 137), job.stdout[-2000:] + job.stderr[-2000:]  # killed there
    crashed = since(history(ch, table), top)
    assert {r[0] for r in crashed} >= CHANGED | VANISHED  # the history was written …
    assert {k: v[:2] for k, v in copy(ch, table).items()} == first  # … and the copy not
    assert Ledger(ch).state(spec.load_key).status == "running"

    run_full_load(spec, session)  # resumes: nothing left to read, publishes
    written = since(history(ch, table), top)
    assert written == crashed  # the same rows again, collapsed
    raw = ch.query(f"SELECT id, _version, count() FROM {TARGET}.{table}_history FINAL GROUP BY id, _version "
                   "HAVING count() > 1").result_rows
    assert raw == []
    now = copy(ch, table)
    assert {(r[0], r[3]) for r in written if not r[4]} <= {(k, v[2]) for k, v in now.items()}  # no orphan version
    assert as_of(ch, table, max(r[3] for r in written)) == second
    check_latest(ch, mysql_conn, table)


def test_a_period_load_writes_the_changes_of_its_partitions_only(mysql_conn, ch, endpoints, session):
    """Loads by partition (replace_partitions): a key vanished from the period reloaded is deleted in
    the history; one vanished from a period not reloaded is not (nor from the copy)."""
    table = "periods"
    make(mysql_conn, ch, table)  # id d: day (id % 3) + 1 of March 2025
    change(mysql_conn, table, "ALTER TABLE {t} ADD COLUMN d DATE NULL",
           "UPDATE {t} SET d = DATE('2025-03-01') + INTERVAL (id % 3) DAY", "ALTER TABLE {t} MODIFY d DATE NOT NULL")

    def day(n: int) -> FullLoadSpec:
        return load_spec(endpoints, table, load_key=f"hist.{table}.{RUN}.{n}", where="`d` = %s",
                         where_params=[f"2025-03-0{n}"], partition_by="toYYYYMMDD(d)",
                         replace_partitions=[f"2025030{n}"])

    for n in (1, 2, 3):
        run_full_load(day(n), session)
    first, top = state(mysql_conn, table), max(r[3] for r in history(ch, table))
    assert sorted(r[0] for r in history(ch, table)) == sorted(first)  # one snapshot a key
    change(mysql_conn, table, "UPDATE {t} SET qty = 0 WHERE id = 4",  # day 2 (4 % 3 = 1)
           "DELETE FROM {t} WHERE id IN (7, 9)",  # day 2, day 1 (not reloaded)
           "INSERT INTO {t} VALUES (100, 'p', 5, '2025-03-02')")
    second = state(mysql_conn, table)
    run_full_load(day(2), session)
    written = since(history(ch, table), top)
    assert sorted((r[0], r[1], r[2], r[4], r[5]) for r in written) == [
        (4, "n4", 0, 0, "snapshot"), (7, *first[7], 1, "snapshot"), (100, "p", 5, 0, "snapshot")]
    latest = as_of(ch, table, max(r[3] for r in written))
    assert latest == {k: v[:2] for k, v in copy(ch, table).items()} == {**second, 9: first[9]}


def test_the_verifications_slice_repair_writes_a_repair_event_only_for_the_rows_that_differ(
        mysql_conn, ch, endpoints, session):
    """spark/cdc_slices.repair (the pipeline's rolling verification) on a copy a load made with a
    history: every slice rewritten from a snapshot of the source, ``repair`` events via verify only
    for the rows the source changed (not for the copy's own wrong row: its history was right)."""
    table = "verified"
    make(mysql_conn, ch, table)
    run_full_load(load_spec(endpoints, table), session)
    before, top = history(ch, table), max(r[3] for r in history(ch, table))
    first = state(mysql_conn, table)
    change(mysql_conn, table, "UPDATE {t} SET name = 'v' WHERE id = 12", "DELETE FROM {t} WHERE id = 2",
           "INSERT INTO {t} VALUES (50, 'w', 9)")
    ch.command(f"ALTER TABLE {TARGET}.{table} UPDATE qty = 0 WHERE id = 21 SETTINGS mutations_sync = 2")
    second = state(mysql_conn, table)
    spec = CdcApplySpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline=f"hist-{RUN}")
    followed = PipelineTable(DB, table, TARGET, table, content=Content.of({"history": True}))
    snapshot = Snapshot(spec)
    try:
        [schema] = snapshot.open([followed])
        check = plan_check(snapshot.pconn, ch, followed, schema)
        version = snapshot.position.snapshot_version(repair=True)
        assert sum(repair(spec, ch, snapshot, check, s) for s in check.slices) == len(second)
    finally:
        snapshot.close()
    written = since(history(ch, table), top)
    assert sorted((r[0], r[1], r[2], r[3], r[4], r[5], r[6]) for r in written) == [
        (2, *first[2], version, 1, "repair", "verify"), (12, "v", 120, version, 0, "repair", "verify"),
        (50, "w", 9, version, 0, "repair", "verify")]
    assert [r for r in history(ch, table) if r[3] <= top] == before
    assert as_of(ch, table, top) == first
    check_latest(ch, mysql_conn, table)


def test_a_keyless_table_asked_for_a_history_is_refused_before_a_row_is_read(mysql_conn, ch, endpoints, session):
    with mysql_conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE IF NOT EXISTS {DB}")
        cur.execute(f"DROP TABLE IF EXISTS {DB}.keyless")
        cur.execute(f"CREATE TABLE {DB}.keyless (a INT, b INT)")
        cur.execute(f"INSERT INTO {DB}.keyless VALUES (1, 2), (1, 2)")
    ch.command(f"DROP TABLE IF EXISTS {TARGET}.keyless")
    spec = load_spec(endpoints, "keyless")
    with pytest.raises(ContentError, match=r"table hist_loads\.keyless: a history of a table without a primary key"):
        run_full_load(spec, session)
    assert not ch.command(f"EXISTS TABLE {TARGET}.keyless") and not ch.command(f"EXISTS TABLE {TARGET}.keyless_history")
    assert Ledger(ch).state(spec.load_key) is None or not any(
        s.records_read for s in Ledger(ch).state(spec.load_key).shards.values())


def test_a_copy_that_keeps_deletes_has_a_delete_in_its_history_for_each_key_it_keeps(
        mysql_conn, ch, endpoints, session):
    """on_delete="keep": the copy keeps a vanished row (marked deleted at the source); its history
    says the key is gone (an absence), and a kept row is never taken for a new snapshot."""
    table = "kept"
    make(mysql_conn, ch, table)
    spec = FullLoadSpec(sources=one_server(endpoints[0]), target=endpoints[1], source_database=DB, source_table=table,
                        target_database=TARGET, target_table=table, load_key=f"hist.{table}.{RUN}", split_factor=3,
                        tableset={"content": {"history": True, "on_delete": "keep"}})
    run_full_load(spec, session)
    top, first = max(r[3] for r in history(ch, table)), state(mysql_conn, table)
    change(mysql_conn, table, *CHANGES)
    second = state(mysql_conn, table)
    for _ in range(2):  # a load again with nothing changed adds nothing (the kept rows included)
        run_full_load(spec, session)
        written = since(history(ch, table), top)
        assert sorted((r[0], r[1], r[2], r[4]) for r in written) == sorted(
            [(k, *second[k], 0) for k in CHANGED] + [(k, *first[k], 1) for k in VANISHED])
    kept = {r[0] for r in ch.query(f"SELECT id FROM {TARGET}.{table} FINAL WHERE _deleted_at_source > 0").result_rows}
    assert kept == VANISHED
    assert as_of(ch, table, max(r[3] for r in written)) == second


def test_a_diff_apply_from_a_clickhouse_table_into_a_copy_with_a_history_is_refused(mysql_conn, ch, endpoints,
                                                                                     session):
    table = "refused_diff"
    make(mysql_conn, ch, table)
    run_full_load(load_spec(endpoints, table), session)
    ch.command(f"DROP TABLE IF EXISTS {TARGET}.{table}_new")
    ch.command(f"CREATE TABLE {TARGET}.{table}_new ENGINE = MergeTree ORDER BY id AS "
               f"SELECT id, name, qty + 1 AS qty FROM {TARGET}.{table} FINAL")
    before = (history(ch, table), copy(ch, table))
    with pytest.raises(Exception, match=rf"table {TARGET}\.{table}: the diff's apply would change its copy, which "
                                        r"keeps a history .*\(issue 61, slice 4: a diff's apply whose new side"):
        run_snapshot_diff(SnapshotDiffSpec(target=endpoints[1], old_table=f"{TARGET}.{table}",
                                           new_table=f"{TARGET}.{table}_new", on_change="apply"), session)
    assert (history(ch, table), copy(ch, table)) == before

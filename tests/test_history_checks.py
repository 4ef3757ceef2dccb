"""The checks of a copy's history and their repair (issue 61, slice 5), on the real services: a
followed copy's history damaged three ways — a version deleted, a different row written at a key's
existing version, a newest version's value changed — is found by reconcile (its verdict names the
history) and by the pipeline's rolling verification, and repaired: a ``repair`` event above (the
past rows left as they were), a range counted short recorded as a hole; then every check passes
and reconcile says ``ok``. A clean history under a CDC workload raises no alarm."""

from __future__ import annotations

import random
import threading
import time

import pymysql
import pytest

from airflow_sync_provider.core.cdc.checkpoints import Checkpoints
from airflow_sync_provider.core.cdc.history_ledger import HistoryLedger
from airflow_sync_provider.core.jobspec import CdcApplySpec, FullLoadSpec, ReconcileSpec
from airflow_sync_provider.core.selection import TableSet
from airflow_sync_provider.core.source.group import one_server
from airflow_sync_provider.spark.cdc_apply import run_cdc_apply
from airflow_sync_provider.spark.full_load import run_full_load
from airflow_sync_provider.spark.reconcile import run_reconcile
from tests.helpers import assert_same_rows, in_background, recreate_tables, stop_service

pytestmark = pytest.mark.slow
DB, TARGET = "hist_chk", "hist_chk_ch"
STAMPS = "_version, _deleted, _event, _via, _commit_time, _server, _source, _gtid_domain, _gtid_seq"


def _sql(conn, *statements) -> None:
    with conn.cursor() as cur:
        for statement in statements:
            cur.execute(statement)


def _spec(endpoints, pipeline: str, **kwargs) -> CdcApplySpec:
    return CdcApplySpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline=pipeline, lanes=2,
                        tableset=TableSet(content={"history": True}), **kwargs)


def _workload(conn, table: str, round_: int) -> None:
    """Updates (keys 1-10 each round, 2 twice in one transaction), a delete, an insert."""
    t = f"{DB}.{table}"
    _sql(conn, "BEGIN", f"UPDATE {t} SET v = v + 1, note = 'r{round_}' WHERE id <= 10",
         f"UPDATE {t} SET v = v * 2 WHERE id = 2", "COMMIT",
         f"DELETE FROM {t} WHERE id = {40 + round_}", f"INSERT INTO {t} VALUES ({100 + round_}, {round_}, NULL)")


def _begin(conn, ch, endpoints, spark, table: str) -> tuple[str, str]:
    """A table loaded, followed by a pipeline that begins its history, and changed twice since."""
    recreate_tables(conn, DB, f"CREATE TABLE {DB}.{table} (id INT PRIMARY KEY, v INT NOT NULL, note VARCHAR(20) NULL)")
    ch.command(f"CREATE DATABASE IF NOT EXISTS {TARGET}")
    for suffix in ("_asof", "_asof_time", "_scd2", "_history", ""):
        ch.command(f"DROP TABLE IF EXISTS {TARGET}.{table}{suffix}")
    _sql(conn, f"INSERT INTO {DB}.{table} SELECT seq, seq, CONCAT('n', seq) FROM {DB}.seq_1_to_60")
    key, pipeline = f"{DB}.{table}", f"hchk.{table}"
    run_full_load(FullLoadSpec(sources=one_server(endpoints[0]), target=endpoints[1], source_database=DB,
                               source_table=table, target_database=TARGET, target_table=table, load_key=key,
                               channels=1, split_factor=3), spark)
    run_cdc_apply(_spec(endpoints, pipeline, start_from_loads=[key], reset=True), spark)
    for round_ in (1, 2):
        _workload(conn, table, round_)
        run_cdc_apply(_spec(endpoints, pipeline), spark)
    return key, pipeline


def _rows(ch, table: str) -> set:
    """Every row of the history (replays collapsed), as stored."""
    return set(ch.query(f"SELECT id, v, note, {STAMPS} FROM {TARGET}.{table}_history FINAL").result_rows)


def _newest(ch, table: str, key: int) -> int:
    return int(ch.command(f"SELECT max(_version) FROM {TARGET}.{table}_history WHERE id = {key} AND _via = 'binlog'"))


def _reconcile(endpoints, spark, key: str, reimport: bool = False) -> dict:
    return run_reconcile(ReconcileSpec(sources=one_server(endpoints[0]), target=endpoints[1], load_key=key,
                                       checksum=True, reimport=reimport), spark)


def _inject(ch, table: str, kind: str, key: int) -> tuple:
    """Damage the history at ``key``: returns the row removed (``missing``), or None."""
    h, top = f"{TARGET}.{table}_history", _newest(ch, table, key)
    if kind == "missing":  # an older version of a key changed every round: only the gap-free check can see it
        gone = ch.query(f"SELECT id, v, note, {STAMPS} FROM {h} FINAL WHERE id = {key} AND _via = 'binlog' "
                        f"AND _version < {top} ORDER BY _version DESC LIMIT 1").result_rows[0]
        ch.command(f"ALTER TABLE {h} DELETE WHERE id = {key} AND _version = {gone[3]} SETTINGS mutations_sync = 2")
        return tuple(gone)
    if kind == "conflict":  # a different row at the key's newest version
        ch.command(f"INSERT INTO {h} (id, v, note, {STAMPS}) SELECT id, v + 1000, 'other', {STAMPS} FROM {h} FINAL "
                   f"WHERE id = {key} AND _version = {top}")
    else:  # the newest version's value changed
        ch.command(f"ALTER TABLE {h} UPDATE note = 'wrong' WHERE id = {key} AND _version = {top} "
                   "SETTINGS mutations_sync = 2")
    return None


def _passes(ch, mysql_conn, table: str, pipeline: str) -> None:
    """Latest == copy == source, as the test sees it (not the package)."""
    latest = {k: (v, n) for k, v, n in ch.query(
        f"SELECT id, v, note FROM {TARGET}.{table}_asof(at_version = 18446744073709551615)").result_rows}
    with mysql_conn.cursor() as cur:
        cur.execute(f"SELECT id, v, note FROM {DB}.{table}")
        assert latest == {k: (v, n) for k, v, n in cur.fetchall()}
    assert assert_same_rows(mysql_conn, ch, DB, table, TARGET) == len(latest)


def _writer(endpoints, table: str, stop: threading.Event, done: list) -> threading.Thread:
    """Updates, inserts and deletes of random keys, each its own transaction, until ``stop``."""
    def write():
        conn = pymysql.connect(**endpoints[0].connect_args(), autocommit=True)
        rng, n = random.Random(61), 0
        try:
            while not stop.is_set():
                k = rng.randint(1, 60)
                _sql(conn, f"UPDATE {DB}.{table} SET v = v + 1, note = 'w{n}' WHERE id = {k}",
                     f"DELETE FROM {DB}.{table} WHERE id = {1000 + n - 5}",
                     f"INSERT INTO {DB}.{table} VALUES ({1000 + n}, {n}, NULL)")
                n += 1
                time.sleep(0.01)
        finally:
            done.append(n)
            conn.close()
    return threading.Thread(target=write, daemon=True)


def test_a_clean_history_passes_every_check_under_a_cdc_workload(mysql_conn, ch, endpoints, spark):
    """Bounded runs with the verification after changes, then a service verifying every second
    while a writer changes the table (keys changed after a look's snapshot set aside in the copy
    and its history alike): no slice repaired, no hole recorded, reconcile ok."""
    key, pipeline = _begin(mysql_conn, ch, endpoints, spark, "clean")
    for round_ in (3, 4):
        _workload(mysql_conn, "clean", round_)
        result = run_cdc_apply(_spec(endpoints, pipeline, verify=True), spark)
        [look] = [v for v in result["verified"] if v["table"] == key]
        assert look["mismatched"] == [] and "history_holes" not in look and result["repaired_shards"] == 0, look
    stop, done = threading.Event(), []
    writer = _writer(endpoints, "clean", stop, done)
    writer.start()
    service, result, errors = in_background(lambda: run_cdc_apply(
        _spec(endpoints, pipeline, service=True, max_seconds=60, verify_period=1.0, verify_budget=1.0,
              batch_seconds=0.3), spark))
    try:
        deadline = time.monotonic() + 40
        while service.is_alive() and time.monotonic() < deadline and (
                (Checkpoints(ch).state(pipeline).table(key).verifications if Checkpoints(ch).state(pipeline) else 0)
                < 4):
            time.sleep(0.5)
    finally:
        stop.set()
        writer.join()
        stop_service(ch, pipeline, service)
    assert not errors, errors
    looks = [v for v in result["verified"] if v["table"] == key]
    assert done[0] > 50 and len(looks) >= 3, (done, looks)
    assert result["repaired_shards"] == 0 and not any(v.get("history_holes") for v in looks), looks
    run_cdc_apply(_spec(endpoints, pipeline), spark)  # the writer's last changes
    before = _rows(ch, "clean")
    checked = _reconcile(endpoints, spark, key)
    assert checked["verdict"] == "ok" and checked["history"]["ok"], checked["history"]
    assert checked["history"]["gaps"][pipeline]["faults"] == 0 and checked["shards"]
    assert _rows(ch, "clean") == before
    _passes(ch, mysql_conn, "clean", pipeline)


@pytest.mark.parametrize("kind", ["missing", "conflict", "wrong"])
def test_a_damaged_history_is_found_by_reconcile_and_the_verification_and_repaired_by_both(
        mysql_conn, ch, endpoints, spark, kind):
    """Damaged at key 1: reconcile finds it (no repair without --reimport), the verification finds
    and repairs it. Damaged again at key 2: reconcile --reimport repairs it. Each repair writes a
    ``repair`` event above (or, for a missing version, records its range as a hole) and leaves
    every row the history held as it was."""
    table = f"dmg_{kind}"
    key, pipeline = _begin(mysql_conn, ch, endpoints, spark, table)
    found = []
    for damaged, repairer in ((1, "verify"), (2, "reconcile")):
        removed = _inject(ch, table, kind, damaged)
        held = _rows(ch, table)
        checked = _reconcile(endpoints, spark, key)
        history = checked["history"]
        assert checked["verdict"] == "mismatch" and not history["ok"], history
        if kind == "missing":
            [gap] = history["gaps"][pipeline]["examples"]
            assert gap["missing"] == 1 and gap["from_version"] <= removed[3] < gap["to_version"], gap
        elif kind == "conflict":
            assert history["conflicts"]["examples"] == [{"key": damaged, "version": _newest(ch, table, damaged),
                                                         "rows": 2}]
        else:
            assert history["latest"]["faults"] == 1 and history["latest"]["examples"][0]["keys"] == [damaged]
        if kind != "missing":  # its shard is marked for the re-import
            assert any("history" in p for s in checked["shards"] for p in s["problems"])
        assert _rows(ch, table) == held  # a check writes nothing
        if repairer == "verify":
            result = run_cdc_apply(_spec(endpoints, pipeline, verify=True), spark)
            [look] = [v for v in result["verified"] if v["table"] == key]
            if kind == "missing":
                assert look["mismatched"] == [] and len(look["history_holes"]) == 1, look
            else:
                assert look["mismatched"] and result["repaired_shards"] >= 1, look
        else:
            result = _reconcile(endpoints, spark, key, reimport=True)
            assert result["before"]["verdict"] == "mismatch" and result["verdict"] == "ok", result
        via = "verify" if repairer == "verify" else "reconcile"
        assert _rows(ch, table) >= held  # the past as it was
        events = ch.query(f"SELECT id, toString(_event), _version FROM {TARGET}.{table}_history FINAL "
                          f"WHERE _via = '{via}' AND id = {damaged}").result_rows
        if kind == "missing":  # the key's newest was right: no event, the range a recorded hole
            assert events == []
            holes = HistoryLedger(ch).ranges(pipeline, key, "hole")
            assert any(h.from_version <= removed[3] < h.to_version and "missing" in h.reason for h in holes), holes
        else:
            [(_, event, version)] = events
            assert event == "repair" and version > _newest(ch, table, damaged)
        found.append(result)
        _passes(ch, mysql_conn, table, pipeline)
        again = _reconcile(endpoints, spark, key)
        assert again["verdict"] == "ok" and again["history"]["ok"], again["history"]
        if kind == "conflict":
            assert again["history"]["conflicts"]["notes"], again["history"]  # resolved, both rows kept


def test_a_copy_that_keeps_deletes_passes_its_history_checks_and_a_kept_row_made_live_in_the_history_fails(
        mysql_conn, ch, endpoints, spark):
    """on_delete="keep" (full loads, no pipeline): the rows the copy keeps after their delete are
    absences in the history and left out of both sides; a kept key written live again into the
    history is found, and the re-import writes its ``repair`` delete (the copy had it right)."""
    table = "kept"
    recreate_tables(mysql_conn, DB, f"CREATE TABLE {DB}.{table} (id INT PRIMARY KEY, v INT NOT NULL, "
                                    "note VARCHAR(20) NULL)")
    for suffix in ("_asof", "_asof_time", "_scd2", "_history", ""):
        ch.command(f"DROP TABLE IF EXISTS {TARGET}.{table}{suffix}")
    _sql(mysql_conn, f"INSERT INTO {DB}.{table} SELECT seq, seq, CONCAT('n', seq) FROM {DB}.seq_1_to_30")
    key = f"{DB}.{table}.kept"
    spec = FullLoadSpec(sources=one_server(endpoints[0]), target=endpoints[1], source_database=DB, source_table=table,
                        target_database=TARGET, target_table=table, load_key=key, channels=1, split_factor=2,
                        tableset=TableSet(content={"history": True, "on_delete": "keep"}))
    run_full_load(spec, spark)
    _sql(mysql_conn, f"DELETE FROM {DB}.{table} WHERE id IN (4, 17)", f"UPDATE {DB}.{table} SET v = -v WHERE id = 5")
    run_full_load(spec, spark)
    assert ch.command(f"SELECT count() FROM {TARGET}.{table} FINAL WHERE _deleted_at_source > 0") == 2
    checked = _reconcile(endpoints, spark, key)
    assert checked["verdict"] == "ok" and checked["history"]["ok"] and checked["history"]["gaps"] == {}, checked
    h = f"{TARGET}.{table}_history"
    ch.command(f"ALTER TABLE {h} UPDATE _deleted = 0 WHERE id = 4 AND _deleted = 1 SETTINGS mutations_sync = 2")
    checked = _reconcile(endpoints, spark, key)
    assert checked["verdict"] == "mismatch" and checked["history"]["latest"]["examples"][0]["keys"] == [4], checked
    result = _reconcile(endpoints, spark, key, reimport=True)
    assert result["verdict"] == "ok" and result["history"]["ok"], result
    assert ch.query(f"SELECT toString(_event), _deleted FROM {h} FINAL WHERE id = 4 AND _via = 'reconcile'"
                    ).result_rows == [("repair", 1)]

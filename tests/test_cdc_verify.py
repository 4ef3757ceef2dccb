"""The pipeline checks itself (spark/cdc_verify.py) against the real services: a copy that went
wrong silently is found and repaired shard by shard, and a copy that is right is never
"repaired", however busy the source is while it is checked."""

from __future__ import annotations

import re
import time

import pytest

from airflow_sync_provider.core.cdc.checkpoints import Checkpoints, check_position
from airflow_sync_provider.core.clickhouse.client import client
from airflow_sync_provider.core.jobspec import CdcApplySpec, CdcBootstrapSpec
from airflow_sync_provider.core.positions import BinlogPosition
from airflow_sync_provider.core.selection import TableSet
from airflow_sync_provider.core.source.group import one_server
from airflow_sync_provider.spark import cdc_ddl, cdc_verify
from airflow_sync_provider.spark.cdc_apply import run_cdc_apply
from airflow_sync_provider.spark.cdc_bootstrap import run_cdc_bootstrap
from tests.cdc_writer import Writer, lines_ddl, mixed_ddl
from tests.helpers import assert_same_rows, in_background, recreate_tables, stop_service
from tests.helpers import run_sql as sql

pytestmark = pytest.mark.slow
DB, TARGET = "vfy", "vfy_ch"


def seeded(conn, table, rows=50_000):
    sql(conn, f"CREATE DATABASE IF NOT EXISTS {DB}", f"DROP TABLE IF EXISTS {DB}.{table}",
        f"CREATE TABLE {DB}.{table} (id INT PRIMARY KEY, note VARCHAR(20) NULL, amount DECIMAL(10, 4) NULL,"
        " n INT NULL)",
        f"INSERT INTO {DB}.{table} (id, note, amount, n) SELECT seq, CONCAT('n', seq), seq / 7, seq % 13"
        f" FROM {DB}.seq_1_to_{rows}")


def bootstrap(endpoints, spark, pipeline, *tables, database=DB, target=TARGET):
    return run_cdc_bootstrap(CdcBootstrapSpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline=pipeline,
                                              channels=2,
                                              tableset=TableSet(tables=[{"source_database": database,
                                                                         "source_table": t,
                                                                         "target_database": target}
                                                                         for t in tables])), spark)


def apply(endpoints, spark, pipeline, **kwargs):
    return run_cdc_apply(CdcApplySpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline=pipeline, lanes=2,
                                      **kwargs), spark)


def looks(result, table):
    return [v for v in result["verified"] if v["table"] == f"{DB}.{table}"]


def test_a_silently_wrong_copy_is_found_and_repaired_shard_by_shard(mysql_conn, ch, endpoints, spark, clickhouse_url,
                                                                    capsys):
    """Changed values, a lost row and a phantom row written into the copy behind the pipeline's
    back: one verification finds exactly the shards they are in and repairs them."""
    seeded(mysql_conn, "silent")
    bootstrap(endpoints, spark, "silent", "silent")
    quiet = apply(endpoints, spark, "silent", verify=True)
    [clean] = looks(quiet, "silent")
    assert clean["mismatched"] == [] and clean["shards"] == 4  # 3 ranges of about 20,000 rows + the NULL shard
    assert 0 < clean["seconds"] < 60 and clean["at"] - clean["seconds"] > time.time() - 600  # the look's duration
    copy = f"{TARGET}.silent"
    ch.command(f"ALTER TABLE {copy} UPDATE note = 'wrong' WHERE id = 5 SETTINGS mutations_sync = 2")
    ch.command(f"DELETE FROM {copy} WHERE id = 7")
    ch.command(f"INSERT INTO {copy} (id, note, _version) VALUES (999999, 'phantom', 1)")
    sql(mysql_conn, f"UPDATE {DB}.silent SET note = 'moved' WHERE id = 8")
    result = apply(endpoints, spark, "silent", verify=True)
    [found] = looks(result, "silent")  # one pass: the slices that differed repaired, and looked at again
    assert found["mismatched"] == [0, 2] and found["repaired_shards"] == 2 and found["shards"] == 4
    assert result["repaired_shards"] == 2
    assert assert_same_rows(mysql_conn, ch, DB, "silent", TARGET) == 50_000
    assert apply(endpoints, spark, "silent")["verified"] == []  # nothing due: no verification
    # cdc status, the ledger's pipeline state and the sensor's message carry the counts
    decision, message, summary = check_position(endpoints[1], "silent", BinlogPosition.from_dict(result["checkpoint"]))
    assert decision == "success" and "2 verification(s), 2 shard(s) repaired" in message, message
    assert summary["verification"]["repaired_shards"] == 2
    [table] = Checkpoints(ch).state("silent").to_dict()["verification"]["tables"]
    assert table["verifications"] == 2 and table["last"]["mismatched"] == [0, 2] and not table["due"]
    from airflow_sync_provider.cli import main

    assert main(["cdc", "status", "--pipeline", "silent", "--clickhouse-url", clickhouse_url]) == 0
    out = capsys.readouterr().out
    assert "verification: 2 verification(s), 2 shard(s) repaired" in out
    assert f"{DB}.silent: last verified at mysql-bin." in out and "2 mismatched, 2 repaired in total" in out


def test_a_ddl_followed_wrongly_is_caught_by_the_verification_after_it(mysql_conn, ch, endpoints, spark, monkeypatch):
    """The issue's first report, with the in-place follow broken on purpose (the DEFAULT not
    materialised for existing rows): the verification the DDL triggers repairs every row."""
    seeded(mysql_conn, "wrong_ddl", rows=30_000)
    bootstrap(endpoints, spark, "wrong_ddl", "wrong_ddl")
    apply(endpoints, spark, "wrong_ddl")
    original = cdc_ddl.follow_alter

    def without_defaults(*args, **kwargs):
        followed = original(*args, **kwargs)
        ch.command(f"ALTER TABLE {TARGET}.wrong_ddl UPDATE c = NULL WHERE 1 SETTINGS mutations_sync = 2")
        return followed

    monkeypatch.setattr(cdc_ddl, "follow_alter", without_defaults)
    sql(mysql_conn, f"ALTER TABLE {DB}.wrong_ddl ADD COLUMN c INT DEFAULT 7")
    result = apply(endpoints, spark, "wrong_ddl")
    first = looks(result, "wrong_ddl")[0]
    assert first["mismatched"] == [0, 1] and result["repaired_shards"] == 2
    assert ch.command(f"SELECT countIf(c = 7) FROM {TARGET}.wrong_ddl FINAL") == 30_000
    assert assert_same_rows(mysql_conn, ch, DB, "wrong_ddl", TARGET) == 30_000


def test_a_copy_missing_a_column_is_recopied(mysql_conn, ch, endpoints, spark):
    seeded(mysql_conn, "shape", rows=5_000)
    bootstrap(endpoints, spark, "shape", "shape")
    apply(endpoints, spark, "shape")
    ch.command(f"ALTER TABLE {TARGET}.shape DROP COLUMN n")
    result = apply(endpoints, spark, "shape", verify=True)
    assert result["recopied"] == [f"{DB}.shape"]
    assert "missing" in looks(result, "shape")[0]["note"]
    assert assert_same_rows(mysql_conn, ch, DB, "shape", TARGET) == 5_000


def test_a_difference_that_survives_repairs_stops_the_pipeline(mysql_conn, ch, endpoints, spark, monkeypatch):
    seeded(mysql_conn, "stubborn", rows=1_000)
    bootstrap(endpoints, spark, "stubborn", "stubborn")
    apply(endpoints, spark, "stubborn")
    monkeypatch.setattr(cdc_verify, "repair", lambda *args: 0)
    ch.command(f"ALTER TABLE {TARGET}.stubborn UPDATE n = -1 WHERE id = 3 SETTINGS mutations_sync = 2")
    stop = r"vfy\.stubborn: its copy still differs .* in slice 0 after 2 repairs.*A retry stops here again"
    with pytest.raises(cdc_verify.VerifyFailed, match=stop):
        apply(endpoints, spark, "stubborn", verify=True)
    # a stop stays a stop: retries as Airflow makes them (the same task, no verify=True) look first
    # and stop again, with the checkpoint where it was and the pipeline stopped
    sql(mysql_conn, f"UPDATE {DB}.stubborn SET note = 'after the stop' WHERE id = 500")
    for _ in range(3):
        with pytest.raises(cdc_verify.VerifyFailed, match=stop):
            apply(endpoints, spark, "stubborn")
        state = Checkpoints(ch).state("stubborn")
        assert state.status == "stopped" and "still differs" in state.error
        verdict, message, _ = check_position(endpoints[1], "stubborn", state.checkpoint)
        assert verdict == "failed" and "is stopped" in message
    assert ch.command(f"SELECT n FROM {TARGET}.stubborn FINAL WHERE id = 3") == -1


def test_a_look_put_off_again_and_again_is_said_in_the_log(mysql_conn, ch, endpoints, spark, monkeypatch, capsys):
    """A slice with more keys changed since its snapshot than a look sets aside is put off, not
    looked at: when that lasts (here every look: the bound lowered below zero) the log says so
    instead of the verification going quiet, and nothing is recorded or repaired meanwhile."""
    seeded(mysql_conn, "hot", rows=1_000)
    bootstrap(endpoints, spark, "hot", "hot")
    apply(endpoints, spark, "hot")
    monkeypatch.setattr(cdc_verify, "MAX_SET_ASIDE", -1)
    service, result, errors = in_background(lambda: apply(endpoints, spark, "hot", service=True, max_seconds=60,
                                                          verify_period=1.0, batch_seconds=0.3))
    said, out = re.compile(r"vfy\.hot: the look at slice \d+ was put off 10 times in a row: more than"), ""
    try:
        deadline = time.monotonic() + 50
        while service.is_alive() and not said.search(out) and time.monotonic() < deadline:
            time.sleep(0.5)
            out += capsys.readouterr().out
    finally:
        stop_service(ch, "hot", service)
    assert not errors, errors
    assert said.search(out + capsys.readouterr().out), out
    assert result["verified"] == [] and result["repaired_shards"] == 0, result["verified"]


def test_verifying_under_a_busy_writer_never_repairs_a_right_copy(mysql_url, mysql_conn, ch, endpoints, spark):
    """Every mapped type, inserts, updates, deletes, key changes and transactions across two
    tables at 500 changes/s while a service verifies both tables every second: each look finds
    them equal (a verification at the wrong moment would "repair" a right copy), and the copies
    end exact."""
    recreate_tables(mysql_conn, DB, mixed_ddl(DB), lines_ddl(DB))
    writer = Writer(mysql_url, rate=500, seed=11, database=DB)
    writer.prefill(30_000)
    bootstrap(endpoints, spark, "busy", "mixed", "lines")
    checkpoints = Checkpoints(ch)
    own = Checkpoints(client(endpoints[1]))  # the writer's thread asks on a client of its own
    applied = lambda: (state := own.state("busy")) and state.events or 0  # noqa: E731
    before_writes = applied()
    # never more than ~1 s of changes ahead of the service: on a machine too loaded to apply 500
    # changes/s, each look would wait longer for the stream and find more keys changed since its
    # snapshot than a look sets aside (cdc_slices.MAX_SET_ASIDE): it would be put off again and again
    writer.behind = lambda: writer.changes - (applied() - before_writes) > 500
    writer.thread.start()

    def passes() -> dict:
        state = checkpoints.state("busy")
        return {t: (entry.verifications if state and (entry := state.table(f"{DB}.{t}")) else 0)
                for t in ("mixed", "lines")}

    before = passes()
    # a pass a second, without the budget's pauses: as many looks as the machine allows (each
    # look waits for the stream), until each table had three. A look at `mixed` takes 3-6 s on a
    # quiet machine and a minute on one running two suites at once: max_seconds is only the bound
    service, result, errors = in_background(lambda: apply(endpoints, spark, "busy", service=True, max_seconds=400,
                                                          verify_period=1.0, verify_budget=1.0, batch_seconds=0.3))
    try:
        while service.is_alive() and min(n - before[t] for t, n in passes().items()) < 3:
            time.sleep(0.5)
    finally:
        stop_service(ch, "busy", service)
        writer.stop.set()
        writer.thread.join()
    assert not errors, errors
    assert writer.error is None, writer.error
    verified, repaired = result["verified"], result["repaired_shards"]
    assert len(looks({"verified": verified}, "mixed")) >= 3 and len(looks({"verified": verified}, "lines")) >= 3
    assert repaired == 0, [v for v in verified if v["mismatched"]]
    time.sleep(0.5)
    final = apply(endpoints, spark, "busy", verify=True)
    assert final["repaired_shards"] == 0
    assert assert_same_rows(mysql_conn, ch, DB, "mixed", TARGET) > 30_000
    assert_same_rows(mysql_conn, ch, DB, "lines", TARGET)


def test_rolling_verification_repairs_any_divergence_within_one_period(mysql_url, mysql_conn, ch, endpoints, spark):
    """A service left at its defaults but for a short verify_period, under a writer: a row
    changed in MySQL without the binlog (sql_log_bin = 0), a row deleted from the copy and a row
    added to it are all repaired within one period, and the stream never waits for a look."""
    import threading

    from tests.helpers import source_rows, target_rows

    seeded(mysql_conn, "rolling", rows=60_000)
    bootstrap(endpoints, spark, "rolling", "rolling")
    apply(endpoints, spark, "rolling")
    period = 8.0
    results = {}
    service = threading.Thread(target=lambda: results.update(apply(
        endpoints, spark, "rolling", service=True, max_seconds=4 * period, batch_seconds=0.3,
        verify_period=period)), daemon=True)
    service.start()
    time.sleep(2)
    with mysql_conn.cursor() as cur:
        cur.execute("SET SESSION sql_log_bin = 0")
        cur.execute(f"UPDATE {DB}.rolling SET note = 'unlogged' WHERE id = 30000")
        cur.execute("SET SESSION sql_log_bin = 1")
    copy = f"{TARGET}.rolling"
    ch.command(f"DELETE FROM {copy} WHERE id = 50000")
    ch.command(f"INSERT INTO {copy} (id, note, _version) VALUES (70000, 'phantom', 1)")
    damaged, damaged_at = time.monotonic(), time.time()
    with mysql_conn.cursor() as cur:  # the writer: changes all along
        for i in range(int(2 * period / 0.05)):
            cur.execute(f"UPDATE {DB}.rolling SET n = n + 1 WHERE id = %s", (1 + (i * 7919) % 60_000,))
            if time.monotonic() - damaged > period + 4:
                break
            time.sleep(0.05)
    from airflow_sync_provider.core.positions import current_position

    stop_service(ch, "rolling", service, past=current_position(mysql_conn))  # the writer's last change applied
    assert results, "the service did not end"
    by_table = {v["table"]: v for v in results["verified"]}
    assert results["repaired_shards"] >= 2 and f"{DB}.rolling" in by_table
    repaired_at = [v for v in results["verified"] if v["repaired_shards"]]
    assert repaired_at and repaired_at[0]["at"] - damaged_at <= period + 4  # within one period (and a look)
    assert assert_same_rows(mysql_conn, ch, DB, "rolling", TARGET) == 60_000
    assert source_rows(mysql_conn, DB, "rolling") == target_rows(ch, mysql_conn, DB, "rolling", TARGET)

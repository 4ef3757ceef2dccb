"""Re-copies beside the stream (spark/cdc_ddl.Recopies) against the real services: the
pipeline's other tables keep flowing while a table is re-copied, and an applier killed in the
middle of a re-copy is followed by one that resumes it after its last finished chunk."""

from __future__ import annotations

import time

import pytest

from airflow_sync_provider.core.cdc.checkpoints import Checkpoints
from airflow_sync_provider.core.jobspec import CdcApplySpec, CdcBootstrapSpec, bootstrap_load_key
from airflow_sync_provider.core.ledger import Ledger
from airflow_sync_provider.core.positions import current_position
from airflow_sync_provider.core.selection import TableSet, table_config
from airflow_sync_provider.core.source.group import one_server
from airflow_sync_provider.spark.cdc_apply import run_cdc_apply
from airflow_sync_provider.spark.cdc_bootstrap import run_cdc_bootstrap
from tests.helpers import assert_same_rows, in_background, stop_service
from tests.helpers import run_sql as sql

pytestmark = pytest.mark.slow
DB, TARGET = "rcp", "rcp_ch"


def seeded(conn, table, rows):
    sql(conn, f"CREATE DATABASE IF NOT EXISTS {DB}", f"DROP TABLE IF EXISTS {DB}.{table}",
        f"CREATE TABLE {DB}.{table} (id INT PRIMARY KEY, note VARCHAR(20) NULL, amount DECIMAL(10, 4) NULL)",
        f"INSERT INTO {DB}.{table} (id, note, amount) SELECT seq, CONCAT('n', seq), seq / 7 FROM {DB}.seq_1_to_{rows}")


def bootstrap(endpoints, spark, pipeline, *tables):
    return run_cdc_bootstrap(CdcBootstrapSpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline=pipeline,
                                              channels=2,
                                              tableset=TableSet(tables=[{"source_database": DB, "source_table": t,
                                                                         "target_database": TARGET}
                                                                         for t in tables])), spark)


def recopying(ch, pipeline) -> list[str]:
    state = Checkpoints(ch).state(pipeline)
    return [t.source_table for t in (state.tables if state else []) if t.recopying]


def test_other_tables_keep_flowing_while_one_is_recopied(mysql_conn, ch, endpoints, spark, clickhouse_url, capsys):
    """A service follows a value-changing MODIFY on a 600,000-row table by re-copying it; rows
    inserted into another table meanwhile reach its copy before the re-copy is done, and both
    copies end exact."""
    seeded(mysql_conn, "big", 600_000)
    seeded(mysql_conn, "small", 100)
    bootstrap(endpoints, spark, "flow", "big", "small")
    spec = CdcApplySpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline="flow", lanes=2, service=True,
                        max_seconds=40, batch_seconds=0.2, recopy_channels=1,
                        recopy_record_speed=100_000)  # a re-copy of about 6 s: the stream's inserts land inside it
    service, result, errors = in_background(lambda: run_cdc_apply(spec, spark))
    try:
        time.sleep(4)
        sql(mysql_conn, f"ALTER TABLE {DB}.big MODIFY amount DECIMAL(10, 2) NULL")  # rounds: a re-copy
        # the copy's 'during' rows, sampled while the re-copy's chunks are being read (its load in
        # the ledger is running): a stream that waited for the re-copy would show them constant
        counts, status = [], ""
        key = bootstrap_load_key("flow", table_config({"source_database": DB, "source_table": "big",
                                                       "target_database": TARGET}))
        deadline = time.monotonic() + 30
        i = 1000
        while time.monotonic() < deadline:
            i += 1
            sql(mysql_conn, f"INSERT INTO {DB}.small (id, note) VALUES ({i}, 'during')")
            if Ledger(ch).state(key).status == "running":
                if not status and "big" in recopying(ch, "flow"):
                    from airflow_sync_provider.cli import main

                    main(["cdc", "status", "--pipeline", "flow", "--clickhouse-url", clickhouse_url])
                    status = capsys.readouterr().out
                count = ch.command(f"SELECT count() FROM {TARGET}.small FINAL WHERE note = 'during'")
                if Ledger(ch).state(key).status == "running":
                    counts.append(count)
            elif counts:
                break
            time.sleep(0.2)
    finally:
        stop_service(ch, "flow", service, past=current_position(mysql_conn))  # the last 'during' row applied
    assert not errors, errors
    assert len(counts) >= 3 and counts[-1] > counts[0], counts  # applied while the big table was being re-copied
    assert f"{DB}.big: re-copy under way for " in status and "(other tables keep flowing)" in status, status
    assert result["recopied"] == [f"{DB}.big"]
    assert assert_same_rows(mysql_conn, ch, DB, "big", TARGET) == 600_000
    assert assert_same_rows(mysql_conn, ch, DB, "small", TARGET) > 100


def test_an_applier_killed_during_a_recopy_is_followed_by_one_that_resumes_it(mysql_conn, ch, endpoints, spark,
                                                                                monkeypatch):
    from airflow_sync_provider.core.submission import spark_submit

    seeded(mysql_conn, "resumed", 40_000)
    bootstrap(endpoints, spark, "resume", "resumed")
    spec = CdcApplySpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline="resume", lanes=2,
                        recopy_channels=1, driver_copy_rows=10 ** 9)
    run_cdc_apply(spec, spark)
    sql(mysql_conn, f"ALTER TABLE {DB}.resumed MODIFY amount DECIMAL(10, 1) NULL",  # rounds: a re-copy
        f"UPDATE {DB}.resumed SET amount = -1 WHERE id % 1000 = 0")
    key = bootstrap_load_key("resume", table_config({"source_database": DB, "source_table": "resumed",
                                                     "target_database": TARGET}))
    monkeypatch.setenv("AIRFLOW_SYNC_CRASH_AT", "bootstrap.chunk-written:2")
    killed = spark_submit(spec, timeout=300)
    monkeypatch.delenv("AIRFLOW_SYNC_CRASH_AT")
    assert killed["status"] == "failed"
    assert recopying(ch, "resume") == ["resumed"]  # the checkpoint knows a re-copy is under way
    before = Ledger(ch).state(key)
    done = {i: s.finished_at for i, s in before.shards.items() if s.status == "success"}
    assert done and len(done) < len(before.plan["shards"])
    sql(mysql_conn, f"UPDATE {DB}.resumed SET note = 'new' WHERE id % 999 = 0")
    began = time.monotonic()
    result = run_cdc_apply(spec, spark)  # takes the lease at once (the killed holder's is gone) and resumes
    assert time.monotonic() - began < 60
    after = Ledger(ch).state(key)
    assert after.generation == before.generation  # the same re-copy, not a new one
    assert {i: after.shards[i].finished_at for i in done} == done  # finished shards were not read again
    assert recopying(ch, "resume") == [] and result["verified"]  # recorded, then verified
    assert assert_same_rows(mysql_conn, ch, DB, "resumed", TARGET) == 40_000

"""Tables without a primary key followed by CDC as exact multisets (issue 59): every row of the
copy a signed occurrence, a delete removes one occurrence, an update replaces one, duplicates
stay duplicates, a replay writes nothing twice. After every apply the copy equals the source as a
multiset (tests/helpers.target_rows expands the signs)."""

from __future__ import annotations

import pytest

from airflow_sync_provider.core.jobspec import CdcApplySpec, CdcBootstrapSpec
from airflow_sync_provider.core.selection import TableSet
from airflow_sync_provider.core.source.group import one_server
from airflow_sync_provider.spark.cdc_apply import run_cdc_apply
from airflow_sync_provider.spark.cdc_bootstrap import run_cdc_bootstrap
from tests.helpers import assert_same_rows
from tests.helpers import run_sql as _sql

pytestmark = pytest.mark.slow
DB = "keyless"


def bootstrap(endpoints, spark, pipeline, tables, **kwargs):
    return run_cdc_bootstrap(CdcBootstrapSpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline=pipeline,
                                              tableset=TableSet(tables=[f"{DB}.{t}" for t in tables]), **kwargs), spark)


def apply(endpoints, spark, pipeline, **kwargs):
    kwargs.setdefault("verify_period", 0)
    kwargs.setdefault("verify_after_ddl", False)
    return run_cdc_apply(CdcApplySpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline=pipeline,
                                      lanes=2, **kwargs), spark)


def test_a_multiset_follows_duplicates_deletes_updates_nulls_and_a_truncate(mysql_conn, ch, endpoints, spark,
                                                                            monkeypatch):
    from airflow_sync_provider.spark import cdc_stream

    monkeypatch.setattr(cdc_stream, "INLINE_MAX_BYTES", 0)  # a reader process (its routes pickled), as a big range
    _sql(mysql_conn, f"DROP DATABASE IF EXISTS {DB}", f"CREATE DATABASE {DB}",
         f"CREATE TABLE {DB}.log (a INT, b VARCHAR(10), c DECIMAL(6, 2), KEY (a)) ENGINE=InnoDB",
         f"INSERT INTO {DB}.log SELECT seq % 7, IF(seq % 3 = 0, NULL, CONCAT('v', seq % 5)), "
         f"IF(seq % 4 = 0, NULL, seq % 3) FROM {DB}.seq_1_to_500",
         f"INSERT INTO {DB}.log VALUES (NULL, NULL, NULL), (NULL, NULL, NULL)")
    result = bootstrap(endpoints, spark, "keyless", ["log"])
    assert result["tables"][0]["rows"] == 502
    apply(endpoints, spark, "keyless")
    assert assert_same_rows(mysql_conn, ch, DB, "log") == 502
    _sql(mysql_conn,
         f"INSERT INTO {DB}.log VALUES (1, 'dup', 1), (1, 'dup', 1), (1, 'dup', 1)",
         f"DELETE FROM {DB}.log WHERE a = 1 AND b = 'dup' LIMIT 1",  # one of three identical rows
         f"UPDATE {DB}.log SET c = 9 WHERE a = 1 AND b = 'dup' LIMIT 1",  # one of the two left
         f"DELETE FROM {DB}.log WHERE a IS NULL LIMIT 1",  # one of two all-NULL rows
         "BEGIN", f"DELETE FROM {DB}.log WHERE a = 2 LIMIT 5", f"INSERT INTO {DB}.log VALUES (2, 'v1', 1)",
         f"UPDATE {DB}.log SET b = NULL WHERE a = 3", "COMMIT")
    apply(endpoints, spark, "keyless")
    assert_same_rows(mysql_conn, ch, DB, "log")
    apply(endpoints, spark, "keyless", reset=False)  # nothing new: nothing written twice
    assert_same_rows(mysql_conn, ch, DB, "log")
    _sql(mysql_conn, f"TRUNCATE TABLE {DB}.log", f"INSERT INTO {DB}.log VALUES (5, 'after', 5), (5, 'after', 5)")
    apply(endpoints, spark, "keyless")
    assert assert_same_rows(mysql_conn, ch, DB, "log") == 2


KILLS = [("cdc.lane-write", 1), ("cdc.written", 1), ("cdc.checkpointed", 1)]


def test_a_replay_after_a_sigkill_writes_no_occurrence_twice(mysql_conn, ch, endpoints, spark, monkeypatch):
    """The applier (its own process) is killed by SIGKILL after a batch's rows are written and
    before or after its checkpoint; every rerun replays from the checkpoint: the multiset stays
    exact (a change written twice would count twice)."""
    from airflow_sync_provider.core.submission import spark_submit

    _sql(mysql_conn, f"DROP TABLE IF EXISTS {DB}.pairs", f"CREATE DATABASE IF NOT EXISTS {DB}",
         f"CREATE TABLE {DB}.pairs (x INT, y INT) ENGINE=InnoDB",
         f"INSERT INTO {DB}.pairs SELECT seq % 10, seq % 3 FROM {DB}.seq_1_to_300")
    bootstrap(endpoints, spark, "pairs", ["pairs"])
    spec = CdcApplySpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline="pairs", lanes=2,
                        batch_events=40, verify_period=0, verify_after_ddl=False)
    for i, (point, count) in enumerate(KILLS):
        _sql(mysql_conn, f"INSERT INTO {DB}.pairs SELECT {i}, seq % 2 FROM {DB}.seq_1_to_50",
             f"DELETE FROM {DB}.pairs WHERE x = {i + 3} LIMIT 7", f"UPDATE {DB}.pairs SET y = y + 10 WHERE x = {i}")
        monkeypatch.setenv("AIRFLOW_SYNC_CRASH_AT", f"{point}:{count}")
        assert spark_submit(spec, timeout=300)["status"] == "failed", point
    monkeypatch.delenv("AIRFLOW_SYNC_CRASH_AT")
    final = spark_submit(spec, timeout=300)
    assert final["status"] == "success", final
    assert_same_rows(mysql_conn, ch, DB, "pairs")


def test_reconcile_the_diff_and_the_verification_catch_an_occurrence_written_behind_the_pipeline(
        mysql_conn, ch, endpoints, spark):
    """A duplicate inserted and a row deleted with sql_log_bin=0 (the binlog never carries them):
    reconcile with checksums says mismatch, the diff names one new and one deleted occurrence and
    its apply repairs them; then the same drift again is found and repaired by the pipeline's own
    verification."""
    from airflow_sync_provider.core.jobspec import ReconcileSpec, SnapshotDiffSpec, bootstrap_load_key
    from airflow_sync_provider.spark.diff import run_snapshot_diff
    from airflow_sync_provider.spark.reconcile import run_reconcile

    _sql(mysql_conn, f"CREATE DATABASE IF NOT EXISTS {DB}", f"DROP TABLE IF EXISTS {DB}.tags",
         f"CREATE TABLE {DB}.tags (item INT, tag VARCHAR(8)) ENGINE=InnoDB",
         f"INSERT INTO {DB}.tags SELECT seq % 40, ELT(1 + seq % 3, 'red', 'green', 'blue') FROM {DB}.seq_1_to_400")
    bootstrap(endpoints, spark, "tags", ["tags"])
    apply(endpoints, spark, "tags")
    key = bootstrap_load_key("tags", {"source_database": DB, "source_table": "tags"})

    def reconcile():
        return run_reconcile(ReconcileSpec(sources=one_server(endpoints[0]), target=endpoints[1], load_key=key,
                                           checksum=True), spark)

    def drift():
        _sql(mysql_conn, "SET sql_log_bin = 0", f"INSERT INTO {DB}.tags VALUES (7, 'red')",
             f"DELETE FROM {DB}.tags WHERE item = 9 AND tag = 'blue' LIMIT 1", "SET sql_log_bin = 1")

    assert reconcile()["verdict"] == "ok"
    drift()
    assert reconcile()["verdict"] == "mismatch"
    diff = SnapshotDiffSpec(sources=one_server(endpoints[0]), target=endpoints[1], diff_key="tags",
                            source_database=DB, source_table="tags", old_table=f"{DB}.tags",
                            changes_table=f"{DB}.tags_changes", on_change="apply")
    found = run_snapshot_diff(diff, spark)
    assert (found["counts"]["new"], found["counts"]["deleted"]) == (1, 1), found["counts"]
    assert found["samples"]["new"][0]["new__tag"] == "'red'"
    assert_same_rows(mysql_conn, ch, DB, "tags")
    assert run_snapshot_diff(diff, spark)["verdict"] == "identical"
    drift()
    looked = apply(endpoints, spark, "tags", verify=True)
    assert looked["repaired_shards"] == 1, looked
    assert_same_rows(mysql_conn, ch, DB, "tags")
    assert reconcile()["verdict"] == "ok"

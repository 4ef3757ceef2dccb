"""No silent divergence: a DDL is never passed by the checkpoint before it is followed, so an
applier killed anywhere around it leaves a copy the next run makes exact (the TRUNCATE race of
issue 34)."""

from __future__ import annotations

import pytest

from airflow_sync_provider.core.cdc.checkpoints import Checkpoints
from airflow_sync_provider.core.cdc.positions import current_position
from airflow_sync_provider.core.jobspec import CdcApplySpec, CdcBootstrapSpec
from airflow_sync_provider.core.submission import spark_submit
from airflow_sync_provider.spark.cdc_bootstrap import run_cdc_bootstrap
from tests.helpers import assert_same_rows
from tests.helpers import run_sql as sql

pytestmark = pytest.mark.slow
DB, TARGET = "dvg", "dvg_ch"


def _tables(conn, *names, rows=300):
    sql(conn, f"CREATE DATABASE IF NOT EXISTS {DB}")
    for name in names:
        sql(conn, f"DROP TABLE IF EXISTS {DB}.{name}",
            f"CREATE TABLE {DB}.{name} (id INT PRIMARY KEY, extra VARCHAR(20) NULL, v INT NOT NULL)",
            f"INSERT INTO {DB}.{name} SELECT seq, CONCAT('e', seq), seq FROM {DB}.seq_1_to_{rows}")


def _bootstrap(endpoints, spark, pipeline, *tables):
    return run_cdc_bootstrap(CdcBootstrapSpec(
        source=endpoints[0], target=endpoints[1], pipeline=pipeline, channels=2,
        tables=[{"source_database": DB, "source_table": t, "target_database": TARGET} for t in tables]), spark)


# every place a kill can land around two DDL statements in one run: after the checkpoint before
# the first (its batch's rows), after following it, after the checkpoint before the second, after
# following that one (the first two with the old code's ordering passed the statement unfollowed)
DDL_KILLS = [("cdc.checkpointed", 1), ("cdc.ddl-followed", 1), ("cdc.checkpointed", 2), ("cdc.ddl-followed", 2)]


@pytest.mark.parametrize("point,count", DDL_KILLS)
def test_an_applier_killed_around_a_ddl_follows_it_on_the_next_run(point, count, mysql_conn, ch, endpoints, spark,
                                                                   monkeypatch):
    """RENAME COLUMN on one table, TRUNCATE of another, FLUSH BINARY LOGS, from a connection with
    no default database, with row changes before, between and after; the applier is killed at
    one of the points around them; the next run ends exact."""
    pipeline = f"dvg_kill_{point.split('.')[-1]}_{count}".replace("-", "_")
    a, b = f"{pipeline}_a", f"{pipeline}_b"
    _tables(mysql_conn, a, b)
    _bootstrap(endpoints, spark, pipeline, a, b)
    spec = CdcApplySpec(source=endpoints[0], target=endpoints[1], pipeline=pipeline, lanes=2)
    assert spark_submit(spec, timeout=300)["status"] == "success"
    sql(mysql_conn, f"UPDATE {DB}.{a} SET v = -v WHERE id <= 20", f"UPDATE {DB}.{b} SET v = -v WHERE id <= 20",
        f"ALTER TABLE {DB}.{a} RENAME COLUMN extra TO extra2",
        f"UPDATE {DB}.{a} SET extra2 = 'renamed' WHERE id <= 30", f"DELETE FROM {DB}.{b} WHERE id <= 5",
        f"TRUNCATE TABLE {DB}.{b}", "FLUSH BINARY LOGS",
        f"INSERT INTO {DB}.{b} VALUES (1001, 'after', 1), (1002, 'after', 2)",
        f"UPDATE {DB}.{a} SET v = 0 WHERE id BETWEEN 100 AND 110")
    written = current_position(mysql_conn)
    monkeypatch.setenv("AIRFLOW_SYNC_CRASH_AT", f"{point}:{count}")
    killed = spark_submit(spec, timeout=300)
    assert killed["status"] == "failed", killed
    monkeypatch.delenv("AIRFLOW_SYNC_CRASH_AT")
    final = spark_submit(spec, timeout=300)
    assert final["status"] == "success", final
    assert assert_same_rows(mysql_conn, ch, DB, a, TARGET) == 300
    assert assert_same_rows(mysql_conn, ch, DB, b, TARGET) == 2
    state = Checkpoints(ch).state(pipeline)
    assert state.status == "idle" and state.checkpoint.key() >= written.key()


# a primary key change re-copies the table into a copy under the new key and swaps it in: killed
# while the chunks are written, right after the swap (before it is recorded), and after a chunk
REKEY_KILLS = [("bootstrap.chunk-written", 1), ("cdc.rekey-swapped", 1), ("cdc.ddl-followed", 1)]


@pytest.mark.parametrize("point,count", REKEY_KILLS)
def test_an_applier_killed_during_a_primary_key_change_ends_exact(point, count, mysql_conn, ch, endpoints, spark,
                                                                  monkeypatch):
    pipeline = f"dvg_rekey_{point.split('.')[-1]}".replace("-", "_")
    sql(mysql_conn, f"CREATE DATABASE IF NOT EXISTS {DB}", f"DROP TABLE IF EXISTS {DB}.{pipeline}",
        f"CREATE TABLE {DB}.{pipeline} (id INT NOT NULL PRIMARY KEY, code VARCHAR(20) NOT NULL, UNIQUE KEY (code))",
        f"INSERT INTO {DB}.{pipeline} SELECT seq, CONCAT('c', seq) FROM {DB}.seq_1_to_3000")
    _tables(mysql_conn, f"{pipeline}_other")
    _bootstrap(endpoints, spark, pipeline, pipeline, f"{pipeline}_other")
    spec = CdcApplySpec(source=endpoints[0], target=endpoints[1], pipeline=pipeline, lanes=2, recopy_channels=1)
    assert spark_submit(spec, timeout=300)["status"] == "success"
    sql(mysql_conn, f"ALTER TABLE {DB}.{pipeline} DROP PRIMARY KEY, ADD PRIMARY KEY (code, id)",
        f"INSERT INTO {DB}.{pipeline} (id, code) VALUES (5, 'dup-5')",
        f"UPDATE {DB}.{pipeline}_other SET v = 0 WHERE id <= 50")
    monkeypatch.setenv("AIRFLOW_SYNC_CRASH_AT", f"{point}:{count}")
    killed = spark_submit(spec, timeout=300)
    assert killed["status"] == "failed", killed
    monkeypatch.delenv("AIRFLOW_SYNC_CRASH_AT")
    sql(mysql_conn, f"UPDATE {DB}.{pipeline} SET id = id + 10000 WHERE id <= 20")
    final = spark_submit(spec, timeout=300)
    assert final["status"] == "success", final
    assert assert_same_rows(mysql_conn, ch, DB, pipeline, TARGET) == 3001
    assert assert_same_rows(mysql_conn, ch, DB, f"{pipeline}_other", TARGET) == 300
    assert ch.command(f"SELECT sorting_key FROM system.tables WHERE database = '{TARGET}' AND name = '{pipeline}'") \
        == "code, id"

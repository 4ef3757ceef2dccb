"""No silent divergence: a DDL is never passed by the checkpoint before it is followed, so an
applier killed anywhere around it leaves a copy the next run makes exact (the TRUNCATE race of
issue 34)."""

from __future__ import annotations

import pytest

from airflow_sync_provider.core.cdc.checkpoints import Checkpoints
from airflow_sync_provider.core.jobspec import CdcApplySpec, CdcBootstrapSpec
from airflow_sync_provider.core.positions import current_position
from airflow_sync_provider.core.selection import TableSet
from airflow_sync_provider.core.source.group import one_server
from airflow_sync_provider.core.submission import spark_submit
from airflow_sync_provider.spark.cdc_apply import run_cdc_apply
from airflow_sync_provider.spark.cdc_bootstrap import run_cdc_bootstrap
from tests.helpers import assert_same_rows, bootstrap_tables
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
    return bootstrap_tables(endpoints, spark, pipeline, DB, TARGET, *tables)


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
    spec = CdcApplySpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline=pipeline, lanes=2)
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
    spec = CdcApplySpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline=pipeline, lanes=2,
                        recopy_channels=1)
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


# --- the race in the shape it was found: several tables under writers, DDL on one table just
# before a TRUNCATE of another and a FLUSH BINARY LOGS, appliers SIGKILLed at random moments, a
# table joining by bootstrap, a source restart. AIRFLOW_SYNC_RACE_SEEDS=20 runs a longer soak.

RACE_TABLES = ("sb1", "sb2", "sb3")


class _RaceWriter:
    """Random single-row changes on the sysbench-shaped tables and the composite-key table, a
    few hundred a second, reconnecting across a source restart."""

    def __init__(self, url: str, seed: int, database: str):
        import random
        import threading

        self.url, self.db, self.rng = url, database, random.Random(seed)
        self.stop, self.error, self.changes = threading.Event(), None, 0
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        import time

        import pymysql

        from airflow_sync_provider.core.endpoints import MySQLEndpoint

        conn = None
        while not self.stop.is_set():
            try:
                if conn is None:
                    conn = pymysql.connect(**MySQLEndpoint.from_url(self.url).connect_args(), autocommit=True)
                with conn.cursor() as cur:
                    table, key = self.rng.choice(RACE_TABLES + ("comp",)), self.rng.randint(1, 400)
                    kind = self.rng.random()
                    if table == "comp":
                        a, b = key % 20, key
                        if kind < 0.5:
                            cur.execute(f"REPLACE INTO {self.db}.comp (a, b, v) VALUES (%s, %s, %s)", (a, b, key))
                        elif kind < 0.8:
                            cur.execute(f"UPDATE {self.db}.comp SET v = v + 1 WHERE a = %s AND b = %s", (a, b))
                        else:
                            cur.execute(f"DELETE FROM {self.db}.comp WHERE a = %s AND b = %s", (a, b))
                    elif kind < 0.4:
                        cur.execute(f"REPLACE INTO {self.db}.{table} (id, k, c) VALUES (%s, %s, %s)",
                                    (key, self.rng.randint(0, 10 ** 6), f"c{self.rng.random()}"))
                    elif kind < 0.85:
                        cur.execute(f"UPDATE {self.db}.{table} SET k = k + 1, c = %s WHERE id = %s",
                                    (f"u{self.rng.random()}", key))
                    else:
                        cur.execute(f"DELETE FROM {self.db}.{table} WHERE id = %s", (key,))
                self.changes += 1
                time.sleep(0.002)
            except pymysql.err.OperationalError:  # the source restarting
                conn = None
                time.sleep(0.3)
            except Exception as exc:  # noqa: BLE001 - reported by the test
                self.error = exc
                return


def _race_seeds():
    import os

    return list(range(int(os.environ.get("AIRFLOW_SYNC_RACE_SEEDS", "3"))))


@pytest.mark.parametrize("seed", _race_seeds())
def test_truncate_and_ddl_under_load_with_random_kills_end_exact(seed, tmp_path, ch, clickhouse_url, spark):
    import os
    import random
    import signal
    import subprocess
    import time

    import pymysql

    from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
    from airflow_sync_provider.core.submission import prepare
    from devenv.mariadb import MariaDB

    rng = random.Random(seed)
    server = MariaDB(tmp_path / "race").start()
    database, pipeline = f"race{seed}", f"race_{seed}"
    writer = None
    try:
        endpoints = (MySQLEndpoint.from_url(server.url), ClickHouseEndpoint.from_url(clickhouse_url))

        def connect():  # no default database, as in the report
            return pymysql.connect(**{**endpoints[0].connect_args(), "database": None}, autocommit=True)

        conn = connect()
        sql(conn, f"CREATE DATABASE {database}",
            f"CREATE TABLE {database}.comp (a INT NOT NULL, b INT NOT NULL, v INT, extra VARCHAR(20) DEFAULT 'x',"
            " PRIMARY KEY (a, b))",
            f"INSERT INTO {database}.comp (a, b, v) SELECT seq % 20, seq, seq FROM {database}.seq_1_to_400")
        for table in RACE_TABLES:
            sql(conn, f"CREATE TABLE {database}.{table} (id INT PRIMARY KEY, k INT NOT NULL, c CHAR(60) NOT NULL,"
                      " pad CHAR(30) NOT NULL DEFAULT 'p')",
                f"INSERT INTO {database}.{table} (id, k, c) SELECT seq, seq, CONCAT('c', seq) "
                f"FROM {database}.seq_1_to_400")

        def boot(*tables):
            return run_cdc_bootstrap(CdcBootstrapSpec(sources=one_server(endpoints[0]), target=endpoints[1],
                                                      pipeline=pipeline, channels=2,
                                                      tableset=TableSet(tables=[{"source_database": database,
                                                                                 "source_table": t,
                                                                                 "target_database": f"{database}_ch"}
                        for t in tables])), spark)

        boot("comp", "sb1", "sb2")
        writer = _RaceWriter(server.url, seed, database)
        writer.thread.start()
        spec = CdcApplySpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline=pipeline, lanes=2,
                            batch_seconds=0.3)
        service = CdcApplySpec(**{**spec.__dict__, "service": True})
        service.job = "cdc_apply"

        def start_service(round_):
            workdir = tmp_path / f"service{round_}"
            os.makedirs(workdir, exist_ok=True)
            env_crash = {}
            if rng.random() < 0.5:  # a crash point around the DDL, else a kill at a random moment
                env_crash = {"AIRFLOW_SYNC_CRASH_AT": rng.choice(["cdc.ddl-followed:1", "cdc.checkpointed:"
                                                                  + str(rng.randint(1, 6))])}
            cmd, env = prepare(service, str(workdir))
            with open(workdir / "job.log", "wb") as log:
                return subprocess.Popen(cmd, env={**os.environ, **env, **env_crash}, stdout=log,
                                        stderr=subprocess.STDOUT, start_new_session=True)

        def kill(job):
            try:
                os.killpg(job.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            job.wait()

        def bounded():
            from airflow_sync_provider.core.submission import spark_submit

            return spark_submit(spec, timeout=300)

        truncated = rng.choice(RACE_TABLES[1:])
        column = ["extra", "extra2"]
        for round_ in range(4):
            job = start_service(round_)
            time.sleep(rng.uniform(0.5, 3.0))
            if round_ == 0:  # a table joins by a bootstrap while the service runs
                boot("sb3")
            if round_ in (1, 3):  # the statements of the report, from a connection without a database
                sql(conn, f"ALTER TABLE {database}.comp RENAME COLUMN {column[0]} TO {column[1]}",
                    f"TRUNCATE TABLE {database}.{truncated}", "FLUSH BINARY LOGS")
                column.reverse()
                truncated = rng.choice(RACE_TABLES)
            time.sleep(rng.uniform(0.1, 2.0))
            kill(job)
            if round_ == 2:  # the source restarts; the writers go on after it
                conn.close()
                server.stop()
                server.start()
                conn = connect()
            result = bounded()
            assert result["status"] in ("success", "failed"), result
        writer.stop.set()
        writer.thread.join()
        assert writer.error is None, writer.error
        final = bounded()
        assert final["status"] == "success", final
        for table in ("comp", *RACE_TABLES):
            assert_same_rows(conn, ch, database, table, f"{database}_ch")
        assert writer.changes > 300
    finally:
        if writer is not None:
            writer.stop.set()
        server.stop()


def test_a_catch_up_across_a_source_restart_keeps_each_tables_rows_apart(tmp_path, ch, clickhouse_url, spark):
    """A restarted server numbers its tables anew: here the ids the tables had before the restart
    go to the other table after it. A catch-up reading across the restart applies every row to
    its own table (with python-mysql-replication's frozen table maps it applied b's rows to a)."""
    import pymysql

    from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
    from devenv.mariadb import MariaDB

    server = MariaDB(tmp_path / "ids").start()
    try:
        endpoints = (MySQLEndpoint.from_url(server.url), ClickHouseEndpoint.from_url(clickhouse_url))

        def connect():
            return pymysql.connect(**{**endpoints[0].connect_args(), "database": None}, autocommit=True)

        conn = connect()
        sql(conn, "CREATE DATABASE ids")
        for name in ("a", "b"):
            sql(conn, f"CREATE TABLE ids.{name} (id INT PRIMARY KEY, v INT NOT NULL)",
                f"INSERT INTO ids.{name} SELECT seq, seq FROM ids.seq_1_to_100")
        run_cdc_bootstrap(CdcBootstrapSpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline="ids",
                                           channels=1, tableset=TableSet(tables=["ids.a", "ids.b"])), spark)
        spec = CdcApplySpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline="ids", lanes=2)
        run_cdc_apply(spec, spark)
        sql(conn, "UPDATE ids.a SET v = -1 WHERE id = 1", "UPDATE ids.b SET v = -2 WHERE id = 2")  # a, then b
        conn.close()
        server.stop()
        server.start()
        conn = connect()
        sql(conn, "UPDATE ids.b SET v = -3 WHERE id = 3", "UPDATE ids.a SET v = -4 WHERE id = 4",  # b first now
            "INSERT INTO ids.b VALUES (500, 5)", "DELETE FROM ids.a WHERE id = 6")
        run_cdc_apply(spec, spark)
        assert assert_same_rows(conn, ch, "ids", "a", "ids") == 99
        assert assert_same_rows(conn, ch, "ids", "b", "ids") == 101
    finally:
        server.stop()

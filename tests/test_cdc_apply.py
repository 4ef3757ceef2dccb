"""CDC catch-up against the real services: binlog → ClickHouse, compared with the source."""

from __future__ import annotations

import pytest

from airflow_sync_provider.core.cdc.checkpoints import Checkpoints
from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
from airflow_sync_provider.core.jobspec import CdcApplySpec, FullLoadSpec
from airflow_sync_provider.core.selection import TableSet
from airflow_sync_provider.core.source.group import one_server
from airflow_sync_provider.spark.cdc_apply import run_cdc_apply
from airflow_sync_provider.spark.full_load import run_full_load
from tests.cdc_writer import Writer, lines_ddl, mixed_ddl
from tests.helpers import assert_same_rows, recreate_tables

pytestmark = pytest.mark.slow
DB, TARGET = "cdc", "cdc_ch"


def full_load(endpoints, spark, table, key=None):
    key = key or f"cdc.{table}"
    run_full_load(FullLoadSpec(sources=one_server(endpoints[0]), target=endpoints[1], source_database=DB,
                               source_table=table, target_database=TARGET, target_table=table, load_key=key, channels=2,
                               split_factor=2), spark)
    return key


def apply(endpoints, spark, pipeline, **kwargs):
    return run_cdc_apply(CdcApplySpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline=pipeline, lanes=3,
                                      **kwargs), spark)


def test_inserts_updates_deletes_and_key_changes_reach_the_target(mysql_conn, ch, endpoints, spark):
    with mysql_conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE IF NOT EXISTS {DB}")
        cur.execute(f"DROP TABLE IF EXISTS {DB}.basic")
        cur.execute(f"CREATE TABLE {DB}.basic (id INT PRIMARY KEY, name VARCHAR(20), amount DECIMAL(12, 2) NULL)")
        cur.execute(f"INSERT INTO {DB}.basic SELECT seq, CONCAT('n', seq), seq / 4 FROM {DB}.seq_1_to_1000")
    key = full_load(endpoints, spark, "basic")
    with mysql_conn.cursor() as cur:
        cur.execute(f"INSERT INTO {DB}.basic VALUES (2001, 'new', 1.25), (2002, 'newer', NULL)")
        cur.execute(f"UPDATE {DB}.basic SET name = 'changed', amount = NULL WHERE id <= 10")
        cur.execute(f"DELETE FROM {DB}.basic WHERE id BETWEEN 11 AND 20")
        cur.execute(f"UPDATE {DB}.basic SET id = id + 5000 WHERE id BETWEEN 21 AND 25")  # key changes
        cur.execute(f"UPDATE {DB}.basic SET amount = 7 WHERE id = 2001")
        cur.execute(f"DELETE FROM {DB}.basic WHERE id = 2002")
    result = apply(endpoints, spark, "basic", start_from_loads=[key])
    assert result["events"] >= 2 + 10 + 10 + 5 + 1 + 1
    assert assert_same_rows(mysql_conn, ch, DB, "basic", TARGET) == 1000 + 1 - 10
    state = Checkpoints(ch).state("basic")
    assert state.status == "idle" and state.checkpoint.to_dict() == result["checkpoint"]
    # a second bounded run with nothing new applies nothing and keeps the copy exact
    again = apply(endpoints, spark, "basic")
    assert again["events"] == 0 and again["start"] == result["checkpoint"]
    assert assert_same_rows(mysql_conn, ch, DB, "basic", TARGET) == 991


MIXED_DDL, LINES_DDL = mixed_ddl(DB), lines_ddl(DB)


def _create(mysql_conn, *ddls):
    recreate_tables(mysql_conn, DB, *ddls)


def _same_as_a_fresh_full_load(endpoints, spark, ch, table: str, suffix: str):
    """The CDC copy equals, value for value, a fresh full load of the table now."""
    fresh = f"{table}_{suffix}"
    run_full_load(FullLoadSpec(sources=one_server(endpoints[0]), target=endpoints[1], source_database=DB,
                               source_table=table, target_database=TARGET, target_table=fresh, load_key=f"cdc.{fresh}",
                               channels=2), spark)
    columns = [r[0] for r in ch.query(f"SELECT name FROM system.columns WHERE database = '{TARGET}' AND "
                                      f"table = '{fresh}' AND name NOT IN ('_version', '_deleted') "
                                      "ORDER BY position").result_rows]
    text = ", ".join(f"hex(toString(`{c}`))" for c in columns)
    cdc, loaded = (ch.query(f"SELECT {text} FROM {TARGET}.`{t}` FINAL ORDER BY {text}").result_rows
                   for t in (table, fresh))
    assert cdc == loaded and cdc


def test_live_writes_caught_up_by_bounded_runs_match_the_source_row_for_row(mysql_url, mysql_conn, ch, endpoints,
                                                                           spark, monkeypatch, capsys):
    """A writer at ~500 row changes/s for 20 s; the tables are fully loaded while it writes, and
    catch-up runs as several bounded runs meanwhile, each range split between two reader
    processes (at any size here). Afterwards FINAL equals the source and a fresh full load."""
    import time

    from airflow_sync_provider.spark import cdc_stream

    monkeypatch.setattr(cdc_stream, "SPLIT_MIN_BYTES", 0)

    _create(mysql_conn, MIXED_DDL, LINES_DDL)
    with Writer(mysql_url) as writer:
        time.sleep(2)
        keys = [full_load(endpoints, spark, "mixed", "cdc.live.mixed"),
                full_load(endpoints, spark, "lines", "cdc.live.lines")]
        runs = [apply(endpoints, spark, "live", start_from_loads=keys, reset=True, batch_events=500)]
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            runs.append(apply(endpoints, spark, "live", batch_events=500))
        written = writer.changes
    assert writer.error is None, writer.error
    runs.append(apply(endpoints, spark, "live"))
    assert capsys.readouterr().out.count("read by 2 processes") >= 3
    assert len(runs) >= 4 and written >= 5000 and sum(r["events"] for r in runs) >= written * 0.8
    for first, second in zip(runs, runs[1:]):  # each run resumes exactly where the previous one stopped
        assert second["start"] == first["checkpoint"]
    assert assert_same_rows(mysql_conn, ch, DB, "mixed", TARGET) > 100
    assert assert_same_rows(mysql_conn, ch, DB, "lines", TARGET) > 10
    _same_as_a_fresh_full_load(endpoints, spark, ch, "mixed", "fresh")
    _same_as_a_fresh_full_load(endpoints, spark, ch, "lines", "fresh")


# every phase of the first and the second batch of a run — decoded, a lane mid-write, written
# but not checkpointed, checkpointed — with the lanes as threads of the driver; then with the
# lanes as Spark tasks (each such run starts a JVM: ~10 s): a lane's Python worker killed
# mid-write in either batch, and the driver killed beside its JVM between a write and its checkpoint
KILLS = [("cdc.batch-read", 1), ("cdc.lane-write", 1), ("cdc.written", 1), ("cdc.checkpointed", 1),
         ("cdc.batch-read", 2), ("cdc.written", 2), ("cdc.checkpointed", 2)]
SPARK_LANE_KILLS = [("cdc.lane-write", 2), ("cdc.lane-write", 1), ("cdc.written", 1)]


def test_killed_at_ten_points_the_checkpoint_is_never_ahead_and_a_rerun_is_exact(mysql_url, mysql_conn, ch,
                                                                                endpoints, monkeypatch):
    """SIGKILL of the apply job (spark-submit) mid-read, mid-write (a lane's Python worker),
    between the write and the checkpoint, and right after it. After each kill every
    transaction the checkpoint covers is in the target; the next run resumes; in the end the
    copy is exact."""
    import time

    from airflow_sync_provider.core.positions import BinlogPosition, current_position
    from airflow_sync_provider.core.submission import spark_submit

    _create(mysql_conn, f"CREATE TABLE {DB}.kills (id INT PRIMARY KEY, v INT NOT NULL, note VARCHAR(10) NULL)")
    with mysql_conn.cursor() as cur:
        cur.execute(f"INSERT INTO {DB}.kills SELECT seq, seq, 'init' FROM {DB}.seq_1_to_500")
    key = full_load_submitted(endpoints, "kills")
    committed = []  # (binlog position after the commit, ids inserted by the transaction)
    deleted = set()  # ids a later transaction deletes again (the final comparison covers them)
    next_id = [1000]

    def write(transactions):
        with mysql_conn.cursor() as cur:
            for i in range(transactions):
                ids = list(range(next_id[0], next_id[0] + 60))
                next_id[0] += 60
                cur.execute("BEGIN")
                cur.executemany(f"INSERT INTO {DB}.kills VALUES (%s, %s, NULL)", [(n, n) for n in ids])
                cur.execute(f"UPDATE {DB}.kills SET v = v + 1, note = 'upd' WHERE id %% 7 = %s AND id < %s",
                            (i % 7, ids[0]))
                cur.execute(f"DELETE FROM {DB}.kills WHERE id = %s", (ids[0] - 61,))
                cur.execute("COMMIT")
                deleted.add(ids[0] - 61)
                committed.append((current_position(mysql_conn), ids))

    spec = CdcApplySpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline="kills", start_from_loads=[key],
                        lanes=2, batch_events=60)  # about a transaction per batch
    orphans_before = set(_orphan_readers())  # e.g. of other runs on this machine
    for i, (point, count) in enumerate(KILLS + SPARK_LANE_KILLS):
        spec.driver_write_rows = CdcApplySpec.driver_write_rows if i < len(KILLS) else 0
        write(6)
        monkeypatch.setenv("AIRFLOW_SYNC_CRASH_AT", f"{point}:{count}")
        began = time.monotonic()
        result = spark_submit(spec, timeout=300)
        print(f"kill at {point}:{count}: {time.monotonic() - began:.1f} s", flush=True)
        assert result["status"] == "failed", (point, count, result)
        state = Checkpoints(ch).state("kills")
        assert state is not None and state.checkpoint is not None
        present = {r[0] for r in ch.query(f"SELECT id FROM {TARGET}.kills FINAL").result_rows}
        covered = [ids for position, ids in committed if position.key() <= state.checkpoint.key()]
        lost = [i for ids in covered for i in ids if i not in present and i not in deleted]
        assert not lost, (f"after a kill at {point}:{count} the checkpoint {state.checkpoint} is ahead of the data: "
                          f"{lost[:5]}")
        # the binlog reader process does not outlive a killed driver (it would hold its connection)
        deadline = time.monotonic() + 10
        while set(_orphan_readers()) - orphans_before and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not set(_orphan_readers()) - orphans_before, f"binlog readers left behind by a kill at {point}:{count}"
        spec.start_from_loads = []  # later runs resume from the checkpoint
    monkeypatch.delenv("AIRFLOW_SYNC_CRASH_AT")
    # the rerun takes the backlog the kills left (~55 transactions) in batches of the default size:
    # at 60 events a batch it was ~130 pieces, each a Spark job (30 s); the lanes stay Spark tasks
    spec.batch_events = CdcApplySpec.batch_events
    final = spark_submit(spec, timeout=300)
    assert final["status"] == "success", final
    assert BinlogPosition.from_dict(final["checkpoint"]).key() >= committed[-1][0].key()
    inserted = {i for _, ids in committed for i in ids}
    assert assert_same_rows(mysql_conn, ch, DB, "kills", TARGET) == 500 + len(inserted - deleted)


def full_load_submitted(endpoints, table):
    from airflow_sync_provider.core.submission import spark_submit

    key = f"cdc.{table}"
    result = spark_submit(FullLoadSpec(sources=one_server(endpoints[0]), target=endpoints[1], source_database=DB,
                                       source_table=table, target_database=TARGET, target_table=table, load_key=key,
                                       channels=1), timeout=300)
    assert result["status"] == "success", result
    return key


def _orphan_readers() -> list[int]:
    """multiprocessing's Python processes (a fork server and its forks) whose parent died: a reader
    left behind."""
    import os

    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read()
            with open(f"/proc/{pid}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if (b"spawn_main" in cmd or b"multiprocessing.forkserver" in cmd) and ppid == 1:
            found.append(int(pid))
    return found


def _seed(mysql_conn, table, rows=200):
    _create(mysql_conn, f"CREATE TABLE {DB}.{table} (id INT PRIMARY KEY, v INT NULL, s VARCHAR(20) NULL)")
    with mysql_conn.cursor() as cur:
        cur.execute(f"INSERT INTO {DB}.{table} SELECT seq, seq, CONCAT('s', seq) FROM {DB}.seq_1_to_{rows}")


def test_column_changes_and_a_key_change_reach_the_target(mysql_conn, ch, endpoints, spark):
    _seed(mysql_conn, "ddl")
    key = full_load(endpoints, spark, "ddl")
    with mysql_conn.cursor() as cur:
        cur.execute(f"UPDATE {DB}.ddl SET v = -v WHERE id <= 5")
        cur.execute(f"ALTER TABLE {DB}.ddl ADD COLUMN price DECIMAL(30, 10) NULL, ADD COLUMN at DATETIME(3) NULL")
        cur.execute(f"INSERT INTO {DB}.ddl VALUES (1001, 1, 'new', 12345678901234567890.0123456789, "
                    "'2024-02-29 23:59:59.999')")
        cur.execute(f"UPDATE {DB}.ddl SET price = id / 3 WHERE id <= 20")
        cur.execute(f"ALTER TABLE {DB}.ddl MODIFY v BIGINT NULL")  # widening
        cur.execute(f"UPDATE {DB}.ddl SET v = 9223372036854775807 WHERE id = 7")
        cur.execute(f"ALTER TABLE {DB}.ddl DROP COLUMN s")
        cur.execute(f"INSERT INTO {DB}.ddl (id, v, price) VALUES (1002, 2, 0.5)")
    result = apply(endpoints, spark, "ddl", start_from_loads=[key], reset=True)
    assert result["events"] >= 5 + 1 + 20 + 1 + 1
    assert assert_same_rows(mysql_conn, ch, DB, "ddl", TARGET) == 202
    assert "s" not in {r[0] for r in ch.query(f"SELECT name FROM system.columns WHERE database = '{TARGET}' "
                                               "AND table = 'ddl'").result_rows}
    with mysql_conn.cursor() as cur:  # a new primary key: the table is copied again under it
        cur.execute(f"ALTER TABLE {DB}.ddl DROP PRIMARY KEY, ADD PRIMARY KEY (id, v)")
        cur.execute(f"INSERT INTO {DB}.ddl (id, v, price) VALUES (1002, 3, 0.5)")
    result = apply(endpoints, spark, "ddl")
    assert result["recopied"] == [f"{DB}.ddl"]
    assert assert_same_rows(mysql_conn, ch, DB, "ddl", TARGET) == 203
    assert ch.command(f"SELECT count() FROM {TARGET}.ddl FINAL WHERE id = 1002") == 2


def test_rotation_and_a_source_restart_keep_versions_increasing_and_the_copy_exact(tmp_path, ch, clickhouse_url,
                                                                                   spark, monkeypatch):
    """A private MariaDB: FLUSH BINARY LOGS and a restart between and during runs (one run read
    by two processes split across the files), then a purge of the checkpoint's file."""
    import threading
    import time

    import pymysql

    from airflow_sync_provider.core.positions import BinlogError, BinlogPosition, current_position
    from airflow_sync_provider.spark import cdc_stream
    from devenv.mariadb import MariaDB

    server = MariaDB(tmp_path / "restart").start()
    try:
        endpoints = (MySQLEndpoint.from_url(server.url), ClickHouseEndpoint.from_url(clickhouse_url))

        def connect():
            conn = pymysql.connect(**endpoints[0].connect_args(), autocommit=True)
            conn.cursor().execute(f"CREATE DATABASE IF NOT EXISTS {DB}")
            return conn

        conn = connect()
        with conn.cursor() as cur:
            cur.execute(f"DROP TABLE IF EXISTS {DB}.rot")
            cur.execute(f"CREATE TABLE {DB}.rot (id INT PRIMARY KEY, v INT NOT NULL)")
            cur.execute(f"INSERT INTO {DB}.rot SELECT seq, 0 FROM {DB}.seq_1_to_300")
        key = full_load(endpoints, spark, "rot", "cdc.rot")
        first = apply(endpoints, spark, "rot", start_from_loads=[key], reset=True)

        def changes(round_):
            with conn.cursor() as cur:
                cur.execute(f"UPDATE {DB}.rot SET v = {round_} WHERE id % 3 = {round_ % 3}")
                cur.execute(f"INSERT INTO {DB}.rot VALUES ({1000 + round_}, {round_})")
                cur.execute(f"DELETE FROM {DB}.rot WHERE id = {round_ + 1}")

        changes(1)
        conn.cursor().execute("FLUSH BINARY LOGS")
        changes(2)
        top = ch.command(f"SELECT max(_version) FROM {TARGET}.rot")
        conn.close()
        server.stop()
        server.start()  # a restart opens a new binlog file
        conn = connect()
        changes(3)
        with monkeypatch.context() as split:
            split.setattr(cdc_stream, "SPLIT_MIN_BYTES", 0)
            second = apply(endpoints, spark, "rot")
        assert second["start"] == first["checkpoint"]
        files = [BinlogPosition.from_dict(r[k]).seq for r, k in ((first, "checkpoint"), (second, "checkpoint"))]
        assert files[1] >= files[0] + 2  # the run crossed the rotation and the restart
        # a restart while a service run reads: the run may fail; its checkpoint stays good
        stopper = threading.Timer(3, lambda: (server.stop(), server.start()))
        stopper.start()
        changes(4)
        try:
            apply(endpoints, spark, "rot", service=True, max_seconds=8, batch_seconds=0.5)
        except Exception as exc:  # the connection was lost mid-run
            print(f"service run ended by the restart: {type(exc).__name__}: {exc}")
        stopper.join()
        conn = connect()
        changes(5)
        apply(endpoints, spark, "rot")
        assert ch.command(f"SELECT min(_version) FROM {TARGET}.rot FINAL WHERE v = 5") > top  # newer file, higher
        with pymysql.connect(**endpoints[0].connect_args(), autocommit=True) as check:
            assert assert_same_rows(check, ch, DB, "rot", TARGET) == 300 + 5 - 5
        # the checkpoint's file purged: refused with what to do, until a re-bootstrap
        with conn.cursor() as cur:
            cur.execute("FLUSH BINARY LOGS")
            changes(6)
            cur.execute("FLUSH BINARY LOGS")
            newest = current_position(conn).file
            deadline = time.monotonic() + 20
            while True:  # MariaDB keeps a file a binlog dump thread still reads (a reader just closed)
                cur.execute(f"PURGE BINARY LOGS TO '{newest}'")
                cur.execute("SHOW BINARY LOGS")
                if cur.fetchall()[0][0] == newest or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
        for _ in range(2):  # asked to stop: a clear stop, at every retry
            with pytest.raises(BinlogError, match=r"binlog file mysql-bin\.\d+ holding the checkpoint .* was purged"
                                                  r".*A retry stops here again"):
                apply(endpoints, spark, "rot", on_binlog_lost="stop")
            assert Checkpoints(ch).state("rot").status == "stopped"
        healed = apply(endpoints, spark, "rot")  # by default: re-copied beside a stream restarted now
        assert healed["binlog_lost"] and healed["recopied"] == [f"{DB}.rot"]
        with pymysql.connect(**endpoints[0].connect_args(), autocommit=True) as check:
            assert assert_same_rows(check, ch, DB, "rot", TARGET) == 300 + 6 - 6
    finally:
        server.stop()


def test_reconciliation_and_repair_keep_working_on_a_table_cdc_writes(mysql_conn, ch, endpoints, spark):
    """A table split on a collated key (its rows carry their collation weight): CDC inserts,
    updates, deletes and key changes; reconciliation with checksums says ok (deleted rows are
    not counted), finds a damaged shard, and the repair leaves an exact copy."""
    from airflow_sync_provider.core.jobspec import ReconcileSpec
    from airflow_sync_provider.spark.reconcile import run_reconcile

    _create(mysql_conn, f"CREATE TABLE {DB}.people (email VARCHAR(40) COLLATE utf8mb4_unicode_ci PRIMARY KEY, "
                        "n INT NOT NULL)")
    with mysql_conn.cursor() as cur:
        cur.execute(f"INSERT INTO {DB}.people SELECT CONCAT(IF(seq % 2, 'Ä', 'a'), seq, '@x'), seq "
                    f"FROM {DB}.seq_1_to_3000")
    key = full_load(endpoints, spark, "people")
    with mysql_conn.cursor() as cur:
        cur.execute(f"INSERT INTO {DB}.people VALUES ('zz@x', 1), ('ÄÄ@x', 2), ('b @x', 3)")
        cur.execute(f"UPDATE {DB}.people SET n = -n WHERE n % 10 = 0")
        cur.execute(f"DELETE FROM {DB}.people WHERE n % 7 = 0")
        cur.execute(f"UPDATE {DB}.people SET email = CONCAT('moved-', email) WHERE n % 11 = 0")
    apply(endpoints, spark, "people", start_from_loads=[key], reset=True)
    assert assert_same_rows(mysql_conn, ch, DB, "people", TARGET) == 3003 - 3000 // 7
    assert ch.command(f"SELECT countIf(_deleted = 1) FROM {TARGET}.people") > 0
    check = ReconcileSpec(sources=one_server(endpoints[0]), target=endpoints[1], load_key=key, checksum=True)
    result = run_reconcile(check, spark)
    assert result["verdict"] == "ok", [s for s in result["shards"] if s["problems"]]
    ch.command(f"INSERT INTO {TARGET}.people (email, n, _version) SELECT email, n + 1, _version + 1 "
               f"FROM {TARGET}.people FINAL WHERE n = 5")  # damage one row
    check.reimport = True
    repaired = run_reconcile(check, spark)
    assert repaired["before"]["verdict"] == "mismatch" and repaired["verdict"] == "ok"
    assert assert_same_rows(mysql_conn, ch, DB, "people", TARGET) == 3003 - 3000 // 7


def test_preflight_refuses_with_what_to_do(mysql_url, mysql_conn, ch, endpoints, spark):
    """Missing row metadata, no binlog privileges, a table without a key (a purged checkpoint:
    in the rotation test, on its private server, as a purge would hit other tests' positions)."""
    from airflow_sync_provider.core.positions import BinlogError, current_position

    _seed(mysql_conn, "pre")
    key = full_load(endpoints, spark, "pre")
    with mysql_conn.cursor() as cur:
        cur.execute("SET GLOBAL binlog_row_metadata = 'MINIMAL'")
    try:
        with pytest.raises(BinlogError, match=r"binlog_row_metadata=MINIMAL.*binlog_row_metadata=FULL"):
            apply(endpoints, spark, "pre", start_from_loads=[key], reset=True)
    finally:
        with mysql_conn.cursor() as cur:
            cur.execute("SET GLOBAL binlog_row_metadata = 'FULL'")
    with mysql_conn.cursor() as cur:
        cur.execute("CREATE USER IF NOT EXISTS 'no_repl'@'127.0.0.1' IDENTIFIED BY 'pw'")
        cur.execute(f"GRANT SELECT ON {DB}.* TO 'no_repl'@'127.0.0.1'")
    weak = MySQLEndpoint(endpoints[0].host, endpoints[0].port, "no_repl", "pw")
    with pytest.raises(BinlogError, match=r"user 'no_repl' may not read the binlog.*REPLICATION SLAVE"):
        run_cdc_apply(CdcApplySpec(sources=one_server(weak), target=endpoints[1], pipeline="pre.weak",
                                   start_from_loads=[key]),
                      spark)
    _create(mysql_conn, f"CREATE TABLE {DB}.nokey (a INT, b INT)")
    full_load(endpoints, spark, "nokey")
    with pytest.raises(BinlogError, match=r"table cdc\.nokey has no primary key"):
        nokey = {"source_database": DB, "source_table": "nokey", "target_database": TARGET}
        apply(endpoints, spark, "pre.nokey", tableset=TableSet(tables=[nokey]),
              start_position=current_position(mysql_conn).to_dict())

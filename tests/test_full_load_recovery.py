"""Full load under crashes, target outages, speed limits and concurrent readers (real services)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import pytest

from airflow_sync_provider.core.clickhouse.client import client
from airflow_sync_provider.core.clickhouse.described import table_exists
from airflow_sync_provider.core.crash_points import arrived_file, hold_file
from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
from airflow_sync_provider.core.jobspec import FullLoadSpec
from airflow_sync_provider.core.ledger import Ledger, check_counters
from airflow_sync_provider.core.source.group import one_server
from airflow_sync_provider.core.submission import prepare, spark_submit
from devenv.clickhouse_http import ChdbEndpoint
from tests.helpers import assert_same_rows

pytestmark = pytest.mark.slow
DB = "recovery"


def make_table(conn, name: str, rows: int) -> None:
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE IF NOT EXISTS {DB}")
        cur.execute(f"USE {DB}")
        cur.execute(f"DROP TABLE IF EXISTS {name}")
        cur.execute(f"CREATE TABLE {name} (id BIGINT PRIMARY KEY, amount DECIMAL(12, 2) NOT NULL,"
                    f" note VARCHAR(40) NULL, created DATETIME(3) NOT NULL)")
        cur.execute(f"INSERT INTO {name} SELECT seq, seq / 100, IF(seq % 7 = 0, NULL, CONCAT('n', seq)),"
                    f" TIMESTAMP('2025-01-01') + INTERVAL seq SECOND FROM seq_1_to_{rows}")


def spec_for(mysql_url, clickhouse_url, table, **kwargs) -> FullLoadSpec:
    return FullLoadSpec(sources=one_server(MySQLEndpoint.from_url(mysql_url)),
                        target=ClickHouseEndpoint.from_url(clickhouse_url), source_database=DB, source_table=table,
                        target_database=f"{DB}_ch", target_table=table, **kwargs)


def start_job(spec, workdir) -> subprocess.Popen:
    """spark-submit in its own process group, so SIGKILL reaches the JVM and the Python workers."""
    os.makedirs(workdir, exist_ok=True)
    cmd, env = prepare(spec, str(workdir))
    with open(os.path.join(workdir, "job.log"), "wb") as log:  # kept for a failing test's reader
        return subprocess.Popen(cmd, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)


def wait_for(predicate, timeout=120, interval=0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError("condition not reached")


def ledger_state(ch, key):
    return (Ledger(ch, "airflow_sync").state(key) if table_exists(ch, "airflow_sync", "loads")
            else None)


def test_sigkill_mid_load_then_resume_reads_only_unfinished_shards(mysql_conn, mysql_url, clickhouse_url, ch, tmp_path):
    make_table(mysql_conn, "killed", 40_000)
    key = "test.sigkill"
    slow = spec_for(mysql_url, clickhouse_url, "killed", load_key=key, channels=2, split_factor=5,
                    channel_record_speed=1500)  # 10 shards of 4000 rows, ~2.7 s each per channel
    job = start_job(slow, tmp_path)
    live = []

    def progressed():
        state = ledger_state(ch, key)
        if state is None:
            return False
        live.extend(s.records_read for s in state.shards.values() if s.status == "running")
        done = [s for s in state.shards.values() if s.status == "success"]
        return len(done) >= 3 and state

    try:
        wait_for(progressed)
        # a second job of the same key is refused while the first runs (its lock on the source) …
        busy = spark_submit(spec_for(mysql_url, clickhouse_url, "killed", load_key=key, channels=2), timeout=600)
        assert busy["status"] == "failed" and "is running elsewhere: source connection" in busy["error"], busy
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
    before = ledger_state(ch, key)
    succeeded = {i for i, s in before.shards.items() if s.status == "success"}
    assert 3 <= len(succeeded) < 10
    assert any(0 < n < 4000 for n in live), f"counters were not written while shards ran: {live}"

    # … and once it is killed, the key is free at once: the next job resumes it (no stale-heartbeat wait)
    result = spark_submit(spec_for(mysql_url, clickhouse_url, "killed", load_key=key, channels=2), timeout=600)
    assert result["status"] == "success", result
    reread = {s["shard_id"] for s in result["per_shard"]}
    assert reread == set(range(11)) - succeeded  # only the unfinished shards (and the NULL shard) again
    after = ledger_state(ch, key)
    assert all(after.shards[i].attempt == 1 for i in succeeded)
    assert after.status == "published" and after.generation == 1
    assert assert_same_rows(mysql_conn, ch, DB, "killed", target_database=f"{DB}_ch") == 40_000
    raw, distinct = ch.query(f"SELECT count(), uniqExact(id) FROM {DB}_ch.killed").result_rows[0]
    assert raw == distinct == 40_000  # no duplicate keys, not even unmerged ones
    assert not ch.command(f"EXISTS TABLE airflow_sync.{after.parts_table}")


def test_failed_inserts_mark_their_shards_failed_and_reimport_completes(mysql_conn, mysql_url, tmp_path):
    """Two of a load's inserts are refused for good (ACCESS_DENIED, injected by the stand-in's
    test hook): the shards whose rows they carried fail with the error (a channel's shards share
    its inserts), the load fails at once without publishing, the counters verdict fails fast
    naming them, and reimport='failed' reads only those again. (A passing cause, the endpoint
    restarting, is ridden through: tests/test_faults.py.)"""
    make_table(mysql_conn, "outage", 60_000)
    endpoint = ChdbEndpoint(tmp_path / "outage-ch").start()
    url = endpoint.url
    key = "test.outage"
    ch = client(ClickHouseEndpoint.from_url(url))
    try:
        endpoint.inject(r"INSERT INTO `airflow_sync`\.`parts_", 497, times=1,
                        message="default: Not enough privileges")
        result = spark_submit(spec_for(mysql_url, url, "outage", load_key=key, channels=2,
                                       split_factor=5), timeout=300)
        assert result["status"] == "failed" and result["retry_helps"] is False, result
        assert "A retry will not help: grant the target user" in result["error"], result
        state = ledger_state(ch, key)
        failed = state.failed()
        assert state.status == "failed" and failed and len(failed) < 11
        assert all("ACCESS_DENIED" in state.shards[i].error for i in failed), [vars(state.shards[i]) for i in failed]
        assert not ch.command(f"EXISTS TABLE {DB}_ch.outage")
        verdict, message, _ = check_counters(ClickHouseEndpoint.from_url(url), key)
        assert verdict == "failed" and str(failed) in message and "reimport" in message

        result = spark_submit(spec_for(mysql_url, url, "outage", load_key=key, reimport="failed", channels=2),
                              timeout=600)
        assert result["status"] == "success", result
        assert {s["shard_id"] for s in result["per_shard"]} == set(failed)
        assert assert_same_rows(mysql_conn, ch, DB, "outage", target_database=f"{DB}_ch") == 60_000
        assert check_counters(ClickHouseEndpoint.from_url(url), key)[0] == "success"
    finally:
        endpoint.stop()


def test_record_speed_limit_holds_channels_times_limit(mysql_conn, mysql_url, clickhouse_url, ch):
    make_table(mysql_conn, "throttled", 36_000)
    channels, limit = 2, 3000
    key = "test.speed"
    result = spark_submit(spec_for(mysql_url, clickhouse_url, "throttled", load_key=key, channels=channels,
                                   channel_record_speed=limit), timeout=600)
    assert result["status"] == "success", result
    shards = ledger_state(ch, key).shards.values()
    span = max(s.finished_at for s in shards) - min(s.started_at for s in shards)
    rate = 36_000 / span
    print(f"speed limit: {channels} channels × {limit} rows/s = {channels * limit} expected, "
          f"measured {rate:.0f} rows/s over {span:.2f} s ({rate / (channels * limit):.3f}×)")
    assert abs(rate - channels * limit) <= 0.15 * channels * limit


def test_readers_only_ever_see_complete_tables_during_a_reload(mysql_conn, mysql_url, clickhouse_url, ch):
    make_table(mysql_conn, "swapped", 20_000)
    assert spark_submit(spec_for(mysql_url, clickhouse_url, "swapped", load_key="test.swap.1"))["status"] == "success"
    with mysql_conn.cursor() as cur:
        cur.execute(f"DELETE FROM {DB}.swapped WHERE id > 15000")  # the new copy has fewer rows
    seen, stop = [], threading.Event()
    reader = client(ClickHouseEndpoint.from_url(clickhouse_url))

    def watch():
        while not stop.is_set():
            seen.append(int(reader.command(f"SELECT count() FROM {DB}_ch.swapped")))

    thread = threading.Thread(target=watch)
    thread.start()
    try:
        result = spark_submit(spec_for(mysql_url, clickhouse_url, "swapped", load_key="test.swap.2",
                                       channels=2, channel_record_speed=5000))
    finally:
        stop.set()
        thread.join()
    assert result["status"] == "success", result
    assert len(seen) > 20 and set(seen) <= {20_000, 15_000} and seen[-1] == 15_000, sorted(set(seen))
    assert assert_same_rows(mysql_conn, ch, DB, "swapped", target_database=f"{DB}_ch") == 15_000


def test_period_load_replaces_exactly_its_partition_and_backfills_idempotently(mysql_conn, mysql_url,
                                                                               clickhouse_url, ch):
    with mysql_conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE IF NOT EXISTS {DB}")
        cur.execute(f"DROP TABLE IF EXISTS {DB}.events")
        cur.execute(f"CREATE TABLE {DB}.events (id BIGINT PRIMARY KEY, created DATETIME(3) NOT NULL,"
                    f" v INT NOT NULL, KEY ix_created (created))")
        cur.execute(f"INSERT INTO {DB}.events SELECT seq, TIMESTAMP('2025-03-01') + INTERVAL (seq * 29) SECOND,"
                    f" seq FROM {DB}.seq_1_to_8000")  # about 2.7 days

    def load_day(day: str, key: str, partitions=None):
        start = f"2025-03-0{day} 00:00:00"
        end = f"2025-03-0{int(day) + 1} 00:00:00"
        return spark_submit(spec_for(mysql_url, clickhouse_url, "events", load_key=key, split_column="created",
                                     where="`created` >= %s AND `created` < %s", where_params=[start, end],
                                     partition_by="toYYYYMMDD(created)",
                                     replace_partitions=partitions or [f"2025030{day}"]), timeout=600)

    def target_days():
        return dict(ch.query(f"SELECT toYYYYMMDD(created), count() FROM {DB}_ch.events FINAL GROUP BY 1").result_rows)

    def source_days():
        with mysql_conn.cursor() as cur:
            cur.execute(f"SELECT DATE_FORMAT(created, '%Y%m%d') + 0, COUNT(*) FROM {DB}.events GROUP BY 1")
            return {int(d): n for d, n in cur.fetchall()}

    for day in ("1", "2", "3"):
        assert load_day(day, f"events.{day}")["status"] == "success"
    assert target_days() == source_days()
    with mysql_conn.cursor() as cur:  # day 2 changes in the source; days 1 and 3 must not move
        cur.execute(f"DELETE FROM {DB}.events WHERE created >= '2025-03-02' AND created < '2025-03-02 12:00' ")
        cur.execute(f"UPDATE {DB}.events SET v = -v WHERE created >= '2025-03-02 12:00' AND created < '2025-03-03'")
    for _ in range(2):  # backfill day 2 twice: same result
        result = load_day("2", "events.2")
        assert result["status"] == "success" and result["generation"] >= 2
        assert target_days() == source_days()
    assert assert_same_rows(mysql_conn, ch, DB, "events", target_database=f"{DB}_ch") == sum(source_days().values())

    wrong = load_day("2", "events.wrong", partitions=["20250301"])  # filter and partitions disagree
    assert wrong["status"] == "failed" and "outside replace_partitions" in wrong["error"]
    assert target_days() == source_days()


def test_bad_configuration_fails_before_anything_runs(mysql_url, clickhouse_url):
    with pytest.raises(ValueError, match="needs a per-channel record limit"):
        spec_for(mysql_url, clickhouse_url, "x", record_speed=1000)
    with pytest.raises(ValueError, match="period load needs where, partition_by and replace_partitions"):
        spec_for(mysql_url, clickhouse_url, "x", partition_by="toYYYYMMDD(created)")
    with pytest.raises(ValueError, match="2 placeholders but 1 parameters"):
        spec_for(mysql_url, clickhouse_url, "x", where="a >= %s AND a < %s", where_params=[1])


def test_reimport_without_an_unfinished_load_is_refused(mysql_conn, mysql_url, clickhouse_url):
    make_table(mysql_conn, "nothing_to_do", 10)
    result = spark_submit(spec_for(mysql_url, clickhouse_url, "nothing_to_do", load_key="test.none", reimport="failed"))
    assert result["status"] == "failed" and "nothing to re-import" in result["error"]


def test_source_password_stays_out_of_the_ledger(mysql_conn, mysql_url, clickhouse_url, ch):
    make_table(mysql_conn, "secretive", 10)
    assert spark_submit(spec_for(mysql_url, clickhouse_url, "secretive", load_key="test.secret"))["status"] == "success"
    password = MySQLEndpoint.from_url(mysql_url).password
    specs = [r[0] for r in ch.query("SELECT spec FROM airflow_sync.loads").result_rows]
    assert any("test.secret" in s for s in specs)
    assert password and not any(password in s for s in specs)


def test_working_tables_left_behind_are_dropped_and_a_running_load_is_left_alone(mysql_conn, mysql_url,
                                                                                   clickhouse_url, ch, tmp_path,
                                                                                   monkeypatch):
    """A load killed and never run again leaves its parts table: a later load of another key
    (here with abandon_after_seconds=0) drops it and marks the load abandoned, so the next run
    of that key starts a fresh generation and ends exact. A load running at the same time
    (its lock held on the source) keeps its table and completes."""
    make_table(mysql_conn, "leftover", 20_000)
    make_table(mysql_conn, "busy", 20_000)
    make_table(mysql_conn, "other", 1_000)
    left = spec_for(mysql_url, clickhouse_url, "leftover", load_key="test.left", channels=2, split_factor=5,
                    channel_record_speed=1500)
    job = start_job(left, tmp_path / "left")
    try:
        wait_for(lambda: (s := ledger_state(ch, "test.left")) and any(x.status == "success" for x in s.shards.values()))
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
    parts = ledger_state(ch, "test.left").parts_table
    assert ch.command(f"EXISTS TABLE airflow_sync.{parts}")
    # held once it is running (its lock on the source held, its table made) until the other load
    # has cleaned up: left to run, it could finish first and drop its own table on a slow day
    holds = tmp_path / "holds"
    holds.mkdir()
    hold = hold_file(str(holds), "full_load.started", "test.busy")
    open(hold, "w").close()
    monkeypatch.setenv("AIRFLOW_SYNC_HOLD_DIR", str(holds))
    busy = start_job(spec_for(mysql_url, clickhouse_url, "busy", load_key="test.busy", channels=1, split_factor=4),
                     tmp_path / "busy")
    try:
        wait_for(lambda: os.path.exists(arrived_file(hold)))
        busy_parts = ledger_state(ch, "test.busy").parts_table
        other = spark_submit(spec_for(mysql_url, clickhouse_url, "other", load_key="test.other",
                                      abandon_after_seconds=0), timeout=600)
        assert other["status"] == "success", other
        assert not ch.command(f"EXISTS TABLE airflow_sync.{parts}")  # the killed load's table is gone …
        assert ledger_state(ch, "test.left").status == "abandoned"
        assert ch.command(f"EXISTS TABLE airflow_sync.{busy_parts}")  # … the held one's is not
        assert ledger_state(ch, "test.busy").status == "running"
    finally:
        os.unlink(hold)
        assert busy.wait(300) == 0
    assert assert_same_rows(mysql_conn, ch, DB, "busy", target_database=f"{DB}_ch") == 20_000
    again = spark_submit(spec_for(mysql_url, clickhouse_url, "leftover", load_key="test.left"), timeout=600)
    assert again["status"] == "success" and again["generation"] == 2, again
    assert assert_same_rows(mysql_conn, ch, DB, "leftover", target_database=f"{DB}_ch") == 20_000

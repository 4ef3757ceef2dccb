"""A pipeline's lease (core/cdc/lease.py): one applier at a time, fenced by generation, and a
killed applier's successor writing within seconds."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pymysql
import pytest

from airflow_sync_provider.core.cdc.checkpoints import Checkpoints, PipelineState
from airflow_sync_provider.core.cdc.lease import Lease, LeaseHeld, LeaseLost
from airflow_sync_provider.core.jobspec import CdcApplySpec, FullLoadSpec
from airflow_sync_provider.core.positions import BinlogPosition
from airflow_sync_provider.core.source.group import one_server
from airflow_sync_provider.core.source.locks import LOCK_WAIT_TIMEOUT, PING_SECONDS, PING_TIMEOUT

DB, TARGET = "lease", "lease_ch"


@pytest.fixture
def checkpoints(ch):
    ledger = Checkpoints(ch)
    ledger.ensure()
    return ledger


def at(file_pos: int) -> BinlogPosition:
    return BinlogPosition("mysql-bin.000001", file_pos)


def test_a_second_applier_is_refused_naming_the_holder_and_each_holder_gets_a_higher_generation(endpoints, checkpoints):
    pipeline = f"lease.unit.{time.time_ns()}"
    first = Lease.acquire(endpoints[0], checkpoints, pipeline)
    try:
        assert first.generation == 1 and f"pid {os.getpid()}, source connection " in first.holder
        checkpoints.write(PipelineState(pipeline, "running", at(100), generation=first.generation,
                                        holder=first.holder))
        with pytest.raises(LeaseHeld, match=rf"pipeline '{pipeline}' is held by another applier: .* pid {os.getpid()}, "
                                            r"source connection \d+ \(generation 1\), which holds lock "
                                            rf"'airflow_sync:{pipeline}' on the source\. Two appliers must not run "
                                            r"one pipeline.*killed process.*run this again then"):
            Lease.acquire(endpoints[0], checkpoints, pipeline)
    finally:
        first.release()
    second = Lease.acquire(endpoints[0], checkpoints, pipeline)  # released: free at once
    try:
        assert second.generation == 2
    finally:
        second.release()


def test_a_stale_generation_cannot_move_the_checkpoint_back_or_forward(endpoints, ch, checkpoints):
    """A zombie (generation 1, its lease lost unnoticed) keeps writing after its successor
    (generation 2) wrote once: readers keep the successor's rows, also after merges."""
    pipeline = f"lease.fence.{time.time_ns()}"
    checkpoints.write(PipelineState(pipeline, "running", at(100), generation=1, holder="old"))
    checkpoints.write(PipelineState(pipeline, "running", at(200), generation=2, holder="new"))
    checkpoints.write(PipelineState(pipeline, "running", at(150), generation=1, holder="old"))  # back
    assert checkpoints.state(pipeline).checkpoint == at(200)
    checkpoints.write(PipelineState(pipeline, "idle", at(900), generation=1, holder="old"))  # forward
    ch.command(f"OPTIMIZE TABLE {checkpoints.table('cdc_state')} FINAL")
    state = checkpoints.state(pipeline)
    assert (state.checkpoint, state.status, state.generation, state.holder) == (at(200), "running", 2, "new")
    assert checkpoints.generation(pipeline) == 2


def test_a_holder_whose_connection_drops_stops_writing_and_the_lock_is_free(endpoints, mysql_conn, checkpoints):
    pipeline = f"lease.lost.{time.time_ns()}"
    lease = Lease.acquire(endpoints[0], checkpoints, pipeline)
    checkpoints.lease = lease
    try:
        checkpoints.write(PipelineState(pipeline, "running", at(100), generation=lease.generation, holder=lease.holder))
        with mysql_conn.cursor() as cur:  # what the server does to a silent holder after wait_timeout
            cur.execute(f"KILL {int(lease.holder.rsplit(' ', 1)[1])}")
        # KILL returns before the killed thread has ended and let go of its lock (seen once
        # on a loaded machine): the lock is free within moments, not necessarily at once
        freed_by = time.monotonic() + 5
        while True:
            try:
                successor = Lease.acquire(endpoints[0], checkpoints, pipeline)
                break
            except LeaseHeld:
                assert time.monotonic() < freed_by, "the killed holder's lock was not freed"
                time.sleep(0.05)
        successor.release()
        deadline = time.monotonic() + PING_SECONDS + PING_TIMEOUT + 1
        while not lease.lost and time.monotonic() < deadline:
            time.sleep(0.1)
        with pytest.raises(LeaseLost, match=rf"pipeline '{pipeline}': this applier \(generation 1\) lost its lease.*"
                                            "stops without writing again"):
            checkpoints.write(PipelineState(pipeline, "running", at(200), generation=lease.generation))
        with pytest.raises(LeaseLost):
            checkpoints.count(pipeline, {"a.b": (1, 1, 0)})
    finally:
        lease.release()
    assert checkpoints.state(pipeline).checkpoint == at(100)


def test_a_silent_holder_loses_its_lock_after_the_wait_timeout(endpoints, checkpoints):
    """A lost host: its checks stop arriving (here: its watch thread stops without a word), and
    the source drops its connection, and the lock, after LOCK_WAIT_TIMEOUT seconds."""
    pipeline = f"lease.silent.{time.time_ns()}"
    silent = Lease.acquire(endpoints[0], checkpoints, pipeline)
    silent.lock._stop.set()
    silent.lock._thread.join()
    went_quiet = time.monotonic()
    while True:
        try:
            successor = Lease.acquire(endpoints[0], checkpoints, pipeline)
            break
        except LeaseHeld:
            assert time.monotonic() - went_quiet < LOCK_WAIT_TIMEOUT + 2, "the silent holder kept its lock"
            time.sleep(0.2)
    freed = time.monotonic() - went_quiet
    successor.release()
    silent.lock._conn.close()
    assert LOCK_WAIT_TIMEOUT - 1 <= freed, f"freed after {freed:.1f} s: the holder's checks are what keep it"


def test_state_rows_of_an_earlier_release_are_carried_over_as_generation_0(ch):
    database = f"lease_migration_{time.time_ns()}"
    ch.command(f"CREATE DATABASE {database}")
    try:
        ch.command(f"CREATE TABLE {database}.cdc_pipelines (pipeline String, status LowCardinality(String), "
                   "checkpoint String, tables String, error String, source_position String, source_time Float64, "
                   "events UInt64, updated_at DateTime64(6, 'UTC')) ENGINE = ReplacingMergeTree(updated_at) "
                   "ORDER BY pipeline")
        ch.command(f"INSERT INTO {database}.cdc_pipelines VALUES ('old', 'idle', "
                   "'{\"file\": \"mysql-bin.000007\", \"pos\": 4242}', '[]', '', '', 1.5, 77, now64(6))")
        ledger = Checkpoints(ch, database)
        ledger.ensure()
        ledger.ensure()  # the table exists now: nothing is copied twice
        state = ledger.state("old")
        assert (state.checkpoint, state.events, state.generation, state.status) == (
            BinlogPosition("mysql-bin.000007", 4242), 77, 0, "idle")
        assert ch.command(f"SELECT count() FROM {database}.cdc_state") == 1
        assert ledger.generation("old") == 0
    finally:
        ch.command(f"DROP DATABASE {database}")


def _service(spec: CdcApplySpec, workdir) -> subprocess.Popen:
    """A service-mode applier as `airflow-sync cdc run` starts it: spark-submit, its own process
    group (SIGKILL reaches the JVM and the Python driver)."""
    from airflow_sync_provider.core.submission import prepare

    os.makedirs(workdir, exist_ok=True)
    cmd, env = prepare(spec, str(workdir))
    with open(os.path.join(workdir, "job.log"), "wb") as log:
        return subprocess.Popen(cmd, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _kill(job: subprocess.Popen) -> None:
    os.killpg(job.pid, signal.SIGKILL)
    job.wait()


@pytest.mark.slow
def test_a_killed_service_is_taken_over_within_seconds_a_second_applier_is_refused_and_the_copy_ends_exact(
        mysql_url, clickhouse_url, mysql_conn, ch, endpoints, spark, tmp_path, capsys):
    """Under a steady writer, a service-mode applier (spark-submit) is SIGKILLed. A new one,
    started at once as a supervisor would, is writing (its checkpoint past the dead one's)
    within 10 s; appliers started while either runs are refused naming the holder; after the
    writer stops, a bounded run leaves the copy exact."""
    from airflow_sync_provider import cli
    from airflow_sync_provider.spark.cdc_apply import run_cdc_apply
    from airflow_sync_provider.spark.full_load import run_full_load
    from tests.cdc_writer import Writer, lines_ddl, mixed_ddl
    from tests.helpers import assert_same_rows, recreate_tables

    pipeline = "lease.takeover"
    recreate_tables(mysql_conn, DB, mixed_ddl(DB), lines_ddl(DB))
    keys = []
    for table in ("mixed", "lines"):
        keys.append(f"lease.{table}")
        run_full_load(FullLoadSpec(sources=one_server(endpoints[0]), target=endpoints[1], source_database=DB,
                                   source_table=table, target_database=TARGET, target_table=table, load_key=keys[-1],
                                   channels=1), spark)
    spec = CdcApplySpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline=pipeline, lanes=2)
    run_cdc_apply(CdcApplySpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline=pipeline,
                               start_from_loads=keys, reset=True), spark)
    service = CdcApplySpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline=pipeline, lanes=2,
                           service=True, batch_seconds=0.5, max_seconds=600)
    checkpoints = Checkpoints(ch)

    def status() -> str:
        capsys.readouterr()
        assert cli.main(["cdc", "status", "--pipeline", pipeline, "--mysql-url", mysql_url,
                         "--clickhouse-url", clickhouse_url]) == 0
        return capsys.readouterr().out

    def writing(generation: int, beyond: BinlogPosition | None = None):
        state = checkpoints.state(pipeline)
        return (state.status == "running" and state.generation == generation and state.checkpoint is not None
                and (beyond is None or state.checkpoint.key() > beyond.key()) and state)

    def wait_for(predicate, timeout, what):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if value := predicate():
                return value
            time.sleep(0.1)
        raise AssertionError(f"{what}: not within {timeout} s")

    with Writer(mysql_url, rate=300, database=DB) as writer:
        first = _service(service, tmp_path / "first")
        try:
            generation = checkpoints.generation(pipeline) + 1
            running = wait_for(lambda: writing(generation), 120, "the first service writing")
            wait_for(lambda: writing(generation, running.checkpoint), 30, "the first service advancing")
            with pytest.raises(LeaseHeld, match=rf"pipeline '{pipeline}' is held by another applier: .* pid \d+, "
                                                rf"source connection \d+ \(generation {generation}\)"):
                run_cdc_apply(spec, spark)
        finally:
            _kill(first)
        killed = time.monotonic()
        at_kill = checkpoints.state(pipeline).checkpoint
        second = _service(service, tmp_path / "second")
        try:
            assert f"'{pipeline}': running (its applier is gone: the lease is free" in status(), status()
            wait_for(lambda: writing(generation + 1, at_kill), 60, "the second service taking over")
            takeover = time.monotonic() - killed
            with capsys.disabled():
                print(f"takeover: the new applier's checkpoint moved {takeover:.1f} s after the kill", flush=True)
            assert f"lease generation {generation + 1}, held by " in status()
            with pytest.raises(LeaseHeld, match=rf"held by another applier: .* \(generation {generation + 1}\)"):
                run_cdc_apply(spec, spark)
            time.sleep(3)  # the writer keeps going under the new holder
            # `cdc stop`: the service ends at its next batch boundary, its state idle, exit 0
            capsys.readouterr()
            assert cli.main(["cdc", "stop", "--pipeline", pipeline, "--clickhouse-url", clickhouse_url,
                             "--reason", "maintenance", "--wait", "60"]) == 0
            assert f"{pipeline}: stopped as asked" in capsys.readouterr().out
            assert second.wait(timeout=30) == 0
            assert checkpoints.state(pipeline).status == "idle"
            assert "stopping at the next batch boundary, as asked (maintenance)" in (
                tmp_path / "second" / "job.log").read_text(errors="replace")
            assert cli.main(["cdc", "stop", "--pipeline", pipeline, "--clickhouse-url", clickhouse_url]) == 0
            assert f"{pipeline}: no applier running" in capsys.readouterr().out
        finally:
            writer.stop.set()
            if second.poll() is None:
                _kill(second)
    assert writer.error is None, writer.error
    assert takeover <= 10, f"takeover took {takeover:.1f} s"
    final = run_cdc_apply(spec, spark)  # a later run is not stopped by a request to an earlier one
    assert final["generation"] == generation + 2 and writer.changes > 1000 and not final["stopped_as_asked"]
    assert assert_same_rows(mysql_conn, ch, DB, "mixed", TARGET) > 100
    assert assert_same_rows(mysql_conn, ch, DB, "lines", TARGET) > 10
    with pymysql.connect(**endpoints[0].connect_args()) as conn:  # every lease was given back
        with conn.cursor() as cur:
            cur.execute("SELECT IS_USED_LOCK(%s)", (f"airflow_sync:{pipeline}",))
            assert cur.fetchone()[0] is None


def test_a_service_waiting_for_its_first_table_stops_when_asked(ch, endpoints, spark):
    """`cdc stop` reaches a service that no table has joined yet (it waits, heartbeat on): it ends
    within a poll, its state idle and its lease given back; a later request finds no applier."""
    from airflow_sync_provider.spark.cdc_apply import run_cdc_apply
    from tests.helpers import in_background, stop_service

    pipeline = "lease.early_stop"
    spec = CdcApplySpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline=pipeline, service=True,
                        max_seconds=120, reset=True)
    service, result, errors = in_background(lambda: run_cdc_apply(spec, spark))
    began = time.monotonic()
    stop_service(ch, pipeline, service)
    assert not errors, errors
    assert result["stopped_as_asked"] and result["tables"] == [] and time.monotonic() - began < 60, result
    checkpoints = Checkpoints(ch)
    assert checkpoints.state(pipeline).status == "idle"
    assert checkpoints.request_stop(pipeline) is None  # nothing runs: nothing to ask

"""The fault tier: the real MariaDB and ClickHouse endpoint (both this module's own, so they can
be killed, frozen and restarted), faults at several points of a full load, a CDC bootstrap, a CDC
apply, a diff apply and a reconcile repair. Each case ends failed within the job's bound or
succeeded; the retry is exact row for row; no process of the job is left (issue 48).

Every job here runs as its own driver process (``prepare`` + Popen, as the command line and
the operator run it), with ``failure_wait_seconds=BOUND``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pymysql
import pytest

from airflow_sync_provider.core.clickhouse.client import client
from airflow_sync_provider.core.clickhouse.described import table_exists
from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
from airflow_sync_provider.core.failures import GRACE_SECONDS
from airflow_sync_provider.core.jobspec import (
    CdcApplySpec,
    CdcBootstrapSpec,
    FullLoadSpec,
    ReconcileSpec,
    SnapshotDiffSpec,
)
from airflow_sync_provider.core.ledger import Ledger
from airflow_sync_provider.core.selection import TableSet
from airflow_sync_provider.core.source.group import one_server
from airflow_sync_provider.core.submission import prepare, read_result
from devenv.clickhouse_http import ChdbEndpoint
from devenv.mariadb import MariaDB
from tests.helpers import assert_same_rows

pytestmark = pytest.mark.slow
DB, TARGET = "faults", "faults_ch"
BOUND = 6.0  # the jobs' failure_wait_seconds here (the default is 45)
ROWS = 60_000


class Servers:
    """This module's MariaDB and endpoint, with the faults a test injects."""

    def __init__(self, base):
        self.mariadb = MariaDB(base / "mariadb").start()
        self.endpoint = ChdbEndpoint(base / "ch").start()
        self.source = MySQLEndpoint.from_url(self.mariadb.url)
        self.target = ClickHouseEndpoint.from_url(self.endpoint.url)
        self.stopped = False

    def ch(self):
        return client(self.target)

    def mysql(self):
        return pymysql.connect(**self.source.connect_args(), autocommit=True)

    def kill_target(self) -> None:
        self.endpoint.proc.kill()
        self.endpoint.proc.wait()

    def restart_target(self) -> None:
        port = self.endpoint.port
        self.endpoint = ChdbEndpoint(self.endpoint.data_dir)
        self.endpoint.port = port
        self.endpoint.start()

    def freeze_target(self) -> None:
        os.kill(self.endpoint.proc.pid, signal.SIGSTOP)
        self.stopped = True

    def thaw_target(self) -> None:
        os.kill(self.endpoint.proc.pid, signal.SIGCONT)
        self.stopped = False

    def pause_target(self, seconds: float) -> None:
        self.freeze_target()
        time.sleep(seconds)
        self.thaw_target()

    def restart_source(self) -> None:
        self.mariadb.kill()
        self.mariadb.start()

    def close(self) -> None:
        if self.stopped:
            self.thaw_target()
        self.endpoint.stop()
        self.mariadb.stop()


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    found = Servers(tmp_path_factory.mktemp("faults"))
    yield found
    found.close()


@pytest.fixture(autouse=True)
def up(servers):
    """Every test starts with both servers up and no fault rule left."""
    if servers.stopped:
        servers.thaw_target()
    if servers.endpoint.proc is None or servers.endpoint.proc.poll() is not None:
        servers.restart_target()
    if servers.mariadb.proc is None or servers.mariadb.proc.poll() is not None:
        servers.mariadb.start()
    servers.endpoint.clear_faults()
    yield


def make_table(servers, name: str, rows: int = ROWS) -> None:
    with servers.mysql() as conn, conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE IF NOT EXISTS {DB}")
        cur.execute(f"DROP TABLE IF EXISTS {DB}.{name}")
        cur.execute(f"CREATE TABLE {DB}.{name} (id BIGINT PRIMARY KEY, v DECIMAL(12, 2) NOT NULL, "
                    f"note VARCHAR(40) NULL)")
        cur.execute(f"INSERT INTO {DB}.{name} SELECT seq, seq / 100, IF(seq % 7 = 0, NULL, CONCAT('n', seq)) "
                    f"FROM {DB}.seq_1_to_{rows}")


def load_spec(servers, table: str, key: str, **kwargs) -> FullLoadSpec:
    options = {"channels": 2, "split_factor": 5, "channel_record_speed": 6000, "failure_wait_seconds": BOUND} | kwargs
    return FullLoadSpec(sources=one_server(servers.source), target=servers.target, source_database=DB,
                        source_table=table, target_database=TARGET, target_table=table, load_key=key, **options)


class Job:
    """A job's driver as its own process (the command line's and the operator's way), its
    process tree watched while it runs."""

    def __init__(self, spec, workdir):
        os.makedirs(workdir, exist_ok=True)
        self.spec = spec
        cmd, env = prepare(spec, str(workdir))
        self.log = os.path.join(workdir, "job.log")
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(cmd, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT)
        self.tree: dict[int, psutil.Process] = {}

    def watch(self) -> None:
        try:
            for proc in [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(recursive=True)]:
                self.tree.setdefault(proc.pid, proc)
        except psutil.Error:
            pass

    def wait(self, timeout: float) -> tuple[int, dict, float]:
        """(exit code, result, seconds waited); every process of the job gone."""
        began = time.monotonic()
        while self.proc.poll() is None:
            self.watch()
            if time.monotonic() - began > timeout:
                self.proc.kill()
                raise AssertionError(f"the job ran on {timeout:.0f} s: {self.output()[-3000:]}")
            time.sleep(0.1)
        seconds = time.monotonic() - began
        assert_gone(self.tree.values())
        return self.proc.returncode, read_result(self.spec.result_path), seconds

    def fails_after(self, fault) -> tuple[dict, float]:
        """``fault()`` (mid-job), then the job's failure: its result, and the seconds from the fault."""
        fault()
        at = time.monotonic()
        code, result, _ = self.wait(BOUND + GRACE_SECONDS + 60)
        assert code != 0 and result.get("status") == "failed", (code, result, self.output()[-3000:])
        return result, time.monotonic() - at

    def succeeded(self, timeout: float = 120) -> dict:
        code, result, _ = self.wait(timeout)
        assert code == 0 and result.get("status") == "success", self.output()[-3000:]
        return result

    def output(self) -> str:
        with open(self.log, errors="replace") as fh:
            return fh.read()


def assert_gone(procs, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    alive = []
    while time.monotonic() < deadline:
        alive = [p for p in procs if _alive(p)]
        if not alive:
            return
        time.sleep(0.1)
    raise AssertionError(f"processes of the job left behind: {[(p.pid, p.cmdline()[:3]) for p in alive]}")


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def wait_for(predicate, timeout: float = 60, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except Exception:  # noqa: BLE001 - a server being restarted
            value = None
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError("condition not reached")


def shards_done(servers, key: str, at_least: int = 1):
    """The load's shards once ``at_least`` succeeded (its ledger, read on a fresh client)."""
    ch = servers.ch()
    try:
        state = Ledger(ch, "airflow_sync").state(key) if table_exists(ch, "airflow_sync", "loads") \
            else None
    finally:
        ch.close()
    return state if state and sum(s.status == "success" for s in state.shards.values()) >= at_least else None


def exact(servers, table: str) -> int:
    with servers.mysql() as conn:
        ch = servers.ch()
        try:
            n = assert_same_rows(conn, ch, DB, table, target_database=TARGET)
            raw, distinct = ch.query(f"SELECT count(), uniqExact(id) FROM {TARGET}.{table} FINAL").result_rows[0]
            assert raw == distinct == n
            return n
        finally:
            ch.close()


def run(spec, workdir, timeout: float = 120) -> dict:
    return Job(spec, workdir).succeeded(timeout)


def reconciled(servers, key: str, tmp_path) -> None:
    result = run(ReconcileSpec(sources=one_server(servers.source), target=servers.target, load_key=key, checksum=True),
                 tmp_path / f"reconcile-{key}")
    assert result["verdict"] == "ok", result


# --- full load ------------------------------------------------------------------------------------


def test_target_killed_mid_load_fails_within_the_bound_and_the_retry_is_exact(servers, tmp_path):
    """The issue's scenario: the endpoint SIGKILLed with rows in flight and not back: the load
    fails within the bound (not one wait per shard), naming the server and that a retry resumes;
    no process of it is left. Once the endpoint is back, the retry finishes exact."""
    make_table(servers, "killed")
    job = Job(load_spec(servers, "killed", "f.killed"), tmp_path / "job")
    wait_for(lambda: shards_done(servers, "f.killed"))
    result, took = job.fails_after(servers.kill_target)
    print(f"dead target -> failed load: {took:.1f} s (bound {BOUND:g} s)")
    assert took < BOUND + GRACE_SECONDS, took
    assert f"ClickHouse 127.0.0.1:{servers.endpoint.port}" in result["error"], result
    assert "A retry resumes" in result["error"] and result["retry_helps"] is True
    servers.restart_target()
    again = run(load_spec(servers, "killed", "f.killed", channel_record_speed=None), tmp_path / "retry")
    assert again["generation"] == 1 and exact(servers, "killed") == ROWS
    reconciled(servers, "f.killed", tmp_path)


def test_target_restarted_inside_the_bound_the_load_rides_through(servers, tmp_path):
    """The endpoint killed and back 2 s later: the shards whose rows were lost are read again
    (attempt 2) and the load finishes exact in the same run."""
    make_table(servers, "restarted")
    job = Job(load_spec(servers, "restarted", "f.restarted", failure_wait_seconds=30), tmp_path / "job")
    wait_for(lambda: shards_done(servers, "f.restarted"))
    servers.kill_target()
    time.sleep(2)
    servers.restart_target()
    result = job.succeeded()
    assert "answers again" in job.output()
    assert max(s["attempt"] for s in result["per_shard"]) >= 2, result["per_shard"]
    assert exact(servers, "restarted") == ROWS
    reconciled(servers, "f.restarted", tmp_path)


def test_target_frozen_briefly_is_waited_out(servers, tmp_path):
    """SIGSTOP for 4 s, then SIGCONT: the load goes on and ends exact."""
    make_table(servers, "paused")
    job = Job(load_spec(servers, "paused", "f.paused"), tmp_path / "job")
    wait_for(lambda: shards_done(servers, "f.paused"))
    servers.pause_target(4)
    job.succeeded()
    assert exact(servers, "paused") == ROWS


def test_target_frozen_for_good_the_guard_ends_the_job(servers, tmp_path):
    """SIGSTOP and no SIGCONT: no call of the job ever returns, so its guard ends it once the
    endpoint has not answered a ping for the bound and its grace; the whole process tree goes."""
    make_table(servers, "frozen")
    job = Job(load_spec(servers, "frozen", "f.frozen"), tmp_path / "job")
    wait_for(lambda: shards_done(servers, "f.frozen"))
    job.watch()
    servers.freeze_target()
    frozen = time.monotonic()
    code, result, _ = job.wait(BOUND + GRACE_SECONDS + 30)
    took = time.monotonic() - frozen
    print(f"frozen target -> ended job: {took:.1f} s (bound {BOUND:g} s + grace {GRACE_SECONDS:g} s)")
    assert code == 75 and result["status"] == "failed" and "JobEnded" in result["error"], (code, result)
    assert took < BOUND + GRACE_SECONDS + 2 * 3 + 2  # pings every 2 s time out after 3 s
    servers.thaw_target()
    run(load_spec(servers, "frozen", "f.frozen", channel_record_speed=None), tmp_path / "retry")
    assert exact(servers, "frozen") == ROWS


def test_killed_submitter_ends_the_job_and_its_retry_is_the_only_writer(servers, tmp_path):
    """The command line that submitted a load is SIGKILLed while its driver waits for an
    unreachable endpoint (the case that escaped before): the driver ends within a second. A
    retry started at once takes the lock only once the old driver is gone, and every shard
    record it writes starts after that (two writers of one load never exist)."""
    make_table(servers, "orphan")
    env = {**os.environ, "MYSQL_URL": servers.mariadb.url + DB, "CLICKHOUSE_URL": servers.endpoint.url}
    cli = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "airflow-sync"), "load", "--table", "orphan",
                            "--target-database", TARGET, "--load-key", "f.orphan", "--channels", "2",
                            "--split-factor", "5", "--channel-record-speed", "3000",
                            "--log-file", str(tmp_path / "cli.log")],
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: shards_done(servers, "f.orphan"))
    drivers = psutil.Process(cli.pid).children(recursive=True)
    assert drivers, "the command line started no driver"
    servers.freeze_target()  # the driver now waits on the endpoint, printing nothing
    time.sleep(1)
    servers.thaw_target()
    cli.kill()
    killed = time.monotonic()
    cli.wait()
    assert shards_done(servers, "f.orphan").status == "running"  # killed mid-load
    retry = Job(load_spec(servers, "orphan", "f.orphan", channel_record_speed=None), tmp_path / "retry")
    assert_gone(drivers, within=10)
    gone = time.monotonic()
    print(f"dead submitter -> ended job: {gone - killed:.1f} s")
    assert gone - killed < 10
    retry.succeeded()
    with servers.ch() as ch:
        state = Ledger(ch, "airflow_sync").state("f.orphan")
    began = time.time() - (time.monotonic() - gone)  # the old driver's end, by the wall clock
    retried = [s for s in state.shards.values() if s.attempt > 1]
    assert retried and state.generation == 1, (state.generation, [vars(s) for s in state.shards.values()])
    assert all(s.started_at >= began - 0.2 for s in retried), [vars(s) for s in retried]
    assert exact(servers, "orphan") == ROWS


def test_source_restarted_mid_load_fails_within_the_bound_and_the_retry_is_exact(servers, tmp_path):
    """MariaDB killed and restarted on the same data while shards are read: the job's lock on
    the source is gone with the old server, so another run may own the load: this one stops
    writing and fails (a reconnection is not safe here); the retry is exact."""
    make_table(servers, "sourcedown")
    job = Job(load_spec(servers, "sourcedown", "f.sourcedown"), tmp_path / "job")
    wait_for(lambda: shards_done(servers, "f.sourcedown"))
    result, took = job.fails_after(servers.restart_source)
    print(f"restarted source -> failed load: {took:.1f} s")
    assert result["retry_helps"] is True and took < BOUND + GRACE_SECONDS, result
    run(load_spec(servers, "sourcedown", "f.sourcedown", channel_record_speed=None), tmp_path / "retry")
    assert exact(servers, "sourcedown") == ROWS
    reconciled(servers, "f.sourcedown", tmp_path)


def test_each_clickhouse_error_class_takes_its_path(servers, tmp_path):
    """Injected by the stand-in's test hook: TOO_MANY_PARTS and MEMORY_LIMIT_EXCEEDED on the
    working table's inserts, a bare HTTP 503 and a reset connection on ledger writes are
    passing: the load rides through, exact. ACCESS_DENIED on an insert is not: the load fails
    at once (not after the bound), saying a retry will not help and what to do."""
    make_table(servers, "classes", 20_000)
    endpoint = servers.endpoint
    endpoint.inject(r"INSERT INTO `airflow_sync`\.`parts_", 252, times=2)
    endpoint.inject(r"INSERT INTO `airflow_sync`\.`parts_", 241, times=1)
    endpoint.inject(r"INSERT INTO `airflow_sync`\.`shards`", None, times=1, status=503)
    endpoint.inject(r"INSERT INTO `airflow_sync`\.`shards`", None, times=1, reset=True)
    result = run(load_spec(servers, "classes", "f.classes", channel_record_speed=None, failure_wait_seconds=30),
                 tmp_path / "passing")
    assert max(s["attempt"] for s in result["per_shard"]) >= 2
    assert exact(servers, "classes") == 20_000

    endpoint.inject(r"INSERT INTO `airflow_sync`\.`parts_", 497, times=100, message="default: Not enough privileges")
    job = Job(load_spec(servers, "classes", "f.classes.denied", channel_record_speed=None, failure_wait_seconds=30),
              tmp_path / "denied")
    code, result, seconds = job.wait(60)
    assert code != 0 and result["retry_helps"] is False, result
    assert seconds < 30 and "A retry will not help: grant the target user" in result["error"], result


# --- CDC bootstrap and apply ----------------------------------------------------------------------


def bootstrap_spec(servers, pipeline: str, table: str, **kwargs) -> CdcBootstrapSpec:
    options = {"channels": 2, "chunk_rows": 4000, "channel_record_speed": 8000, "failure_wait_seconds": BOUND} | kwargs
    return CdcBootstrapSpec(sources=one_server(servers.source), target=servers.target, pipeline=pipeline,
                            tableset=TableSet(tables=[{"source_database": DB, "source_table": table,
                                                       "target_database": TARGET,
                                     "target_table": table}]), **options)


def apply_spec(servers, pipeline: str, **kwargs) -> CdcApplySpec:
    return CdcApplySpec(sources=one_server(servers.source), target=servers.target, pipeline=pipeline,
                        **({"failure_wait_seconds": BOUND, "lanes": 2} | kwargs))


def chunks_done(servers, pipeline: str, table: str):
    from airflow_sync_provider.core.jobspec import bootstrap_load_key

    key = bootstrap_load_key(pipeline, {"source_database": DB, "source_table": table, "target_database": TARGET,
                                        "target_table": table})
    ch = servers.ch()
    try:
        state = Ledger(ch, "airflow_sync").state(key)
    finally:
        ch.close()
    return state if state and sum(s.chunks for s in state.shards.values()) >= 2 else None


def change(servers, table: str, rounds: int, rows: int = ROWS) -> None:
    """``rounds`` updates of every row, 20 transactions each, plus a few deletes and inserts."""
    with servers.mysql() as conn, conn.cursor() as cur:
        for r in range(rounds):
            step = rows // 20
            for lo in range(0, rows, step):
                cur.execute(f"UPDATE {DB}.{table} SET v = v + 1, note = %s WHERE id > %s AND id <= %s",
                            (f"r{r}", lo, lo + step))
        cur.execute(f"DELETE FROM {DB}.{table} WHERE id % 97 = 0")
        cur.execute(f"INSERT INTO {DB}.{table} SELECT {rows} + seq, seq, 'new' FROM {DB}.seq_1_to_500 "
                    "ON DUPLICATE KEY UPDATE v = v + 1")


def test_bootstrap_rides_through_a_target_restart_and_resumes_after_a_source_restart(servers, tmp_path):
    """A bootstrap whose endpoint dies and is back 2 s later reads the lost chunks again and
    finishes; one whose MariaDB is restarted fails within the bound (its lock went with the
    server) and its retry resumes after the last finished chunk. Changes made meanwhile are
    caught up by an apply: both copies exact."""
    make_table(servers, "boot")
    job = Job(bootstrap_spec(servers, "fb", "boot", failure_wait_seconds=30), tmp_path / "boot")
    wait_for(lambda: chunks_done(servers, "fb", "boot"))
    servers.kill_target()
    time.sleep(2)
    servers.restart_target()
    job.succeeded()
    change(servers, "boot", 1)
    run(apply_spec(servers, "fb"), tmp_path / "apply")
    assert exact(servers, "boot") == ROWS - ROWS // 97 + 500

    make_table(servers, "boot2")
    job = Job(bootstrap_spec(servers, "fb2", "boot2"), tmp_path / "boot2")
    wait_for(lambda: chunks_done(servers, "fb2", "boot2"))
    result, took = job.fails_after(servers.restart_source)
    assert result["retry_helps"] is True and took < BOUND + GRACE_SECONDS, result
    change(servers, "boot2", 1)
    run(bootstrap_spec(servers, "fb2", "boot2", channel_record_speed=None), tmp_path / "boot2-retry")
    run(apply_spec(servers, "fb2"), tmp_path / "apply2")
    assert exact(servers, "boot2") == ROWS - ROWS // 97 + 500


def test_apply_fails_at_once_on_a_dead_target_or_source_waits_out_a_pause_and_the_next_apply_is_exact(
        servers, tmp_path):
    """A bounded apply of 60,000 changes: the endpoint killed at its tenth insert (the stand-in
    kills itself there) fails it at once, never past the bound; the next apply after the restart
    is exact. The endpoint frozen for 3 s mid-apply is waited out. MariaDB restarted mid-apply:
    the apply fails (its lease went with the server), the next one is exact."""
    make_table(servers, "cdc", 20_000)
    run(load_spec(servers, "cdc", "f.cdc", channel_record_speed=None), tmp_path / "load")
    change(servers, "cdc", 3, rows=20_000)
    expected = 20_000 - 20_000 // 97 + 500
    servers.endpoint.inject(rf"INSERT INTO `{TARGET}`\.`cdc`", kill=True, times=1, after=9)
    job = Job(apply_spec(servers, "fc", start_from_loads=["f.cdc"], batch_events=2000), tmp_path / "killed")
    code, result, seconds = job.wait(BOUND + GRACE_SECONDS + 30)
    print(f"dead target -> failed apply: {seconds:.1f} s of the run")
    assert code != 0 and result["retry_helps"] is True, result
    servers.restart_target()
    run(apply_spec(servers, "fc", batch_events=2000), tmp_path / "after-kill")
    assert exact(servers, "cdc") == expected

    change(servers, "cdc", 3, rows=20_000)
    job = Job(apply_spec(servers, "fc", batch_events=2000), tmp_path / "paused")
    wait_for(lambda: _applied(servers, "fc"))
    servers.pause_target(3)
    job.succeeded()
    assert exact(servers, "cdc") == expected

    change(servers, "cdc", 3, rows=20_000)
    job = Job(apply_spec(servers, "fc", batch_events=2000), tmp_path / "source")
    wait_for(lambda: _applied(servers, "fc"))
    servers.restart_source()
    code, result, _ = job.wait(BOUND + GRACE_SECONDS + 60)
    assert code != 0, job.output()[-3000:]
    run(apply_spec(servers, "fc", batch_events=2000), tmp_path / "after-source")
    assert exact(servers, "cdc") == expected


def _applied(servers, pipeline: str) -> bool:
    """The pipeline's run has moved its checkpoint at least once."""
    from airflow_sync_provider.core.cdc.checkpoints import Checkpoints

    ch = servers.ch()
    try:
        state = Checkpoints(ch).state(pipeline)
        return state is not None and state.status == "running" and state.events > 0
    finally:
        ch.close()


# --- diff apply and reconcile repair ---------------------------------------------------------------


def test_diff_apply_and_reconcile_repair_killed_mid_write_then_retried_exact(servers, tmp_path):
    """The endpoint dies at a chosen statement of a diff's apply, and of a reconciliation's repair
    (the stand-in kills itself there): each job fails within the bound, and its retry after the
    restart leaves the copy exact (the diff then finds nothing to change; the reconciliation ok)."""
    make_table(servers, "dif")
    run(load_spec(servers, "dif", "f.dif", channel_record_speed=None), tmp_path / "load")
    with servers.mysql() as conn, conn.cursor() as cur:
        cur.execute(f"UPDATE {DB}.dif SET v = -v WHERE id % 5 = 0")
        cur.execute(f"DELETE FROM {DB}.dif WHERE id % 11 = 0")
    diff = SnapshotDiffSpec(target=servers.target, old_table=f"{TARGET}.dif", sources=one_server(servers.source),
                            source_database=DB, source_table="dif", on_change="apply", failure_wait_seconds=BOUND)
    servers.endpoint.inject(rf"INSERT INTO `{TARGET}`\.`dif`", kill=True, times=1)
    code, result, seconds = Job(diff, tmp_path / "diff-killed").wait(BOUND + GRACE_SECONDS + 30)
    assert code != 0 and result["retry_helps"] is True, result
    assert seconds < BOUND + GRACE_SECONDS + 10
    servers.restart_target()
    run(diff, tmp_path / "diff-retry")
    assert exact(servers, "dif") == ROWS - ROWS // 11
    again = run(diff, tmp_path / "diff-again")
    assert again["counts"].get("changed", 0) == again["counts"].get("new", 0) == 0, again["counts"]

    with servers.mysql() as conn, conn.cursor() as cur:  # the copy is behind: a repair re-reads its shards
        cur.execute(f"UPDATE {DB}.dif SET note = 'repaired' WHERE id % 13 = 0")
    repair = ReconcileSpec(sources=one_server(servers.source), target=servers.target, load_key="f.dif", checksum=True,
                           reimport=True, failure_wait_seconds=BOUND)
    servers.endpoint.inject(rf"INSERT INTO `{TARGET}`\.`dif`", kill=True, times=1)
    code, result, seconds = Job(repair, tmp_path / "repair-killed").wait(BOUND + GRACE_SECONDS + 30)
    assert code != 0 and result["retry_helps"] is True, result
    servers.restart_target()
    fixed = run(repair, tmp_path / "repair-retry")
    assert fixed["verdict"] == "ok", fixed
    assert exact(servers, "dif") == ROWS - ROWS // 11

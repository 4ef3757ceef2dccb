"""CDC catch-up bench: row changes/s of our CDC job (``spark_submit(CdcApplySpec)``) vs
mysql-ch-replicator's realtime replication (binlog_replicator + db_replicator), applying the same
binlog range to copies of one ``orders``-like table on the same data and machine in one run; then
our job's lag in service mode under a steady write load.

    .venv/bin/python -m bench.cdc_apply [--changes 1000000] [--quick] [--keep]
    .venv/bin/python -m bench.cdc_apply --tls [--quick] [--repeat 2]   (plain text vs TLS only)
    .venv/bin/python -m bench.cdc_apply --history [--changes 100000] [--repeat 2]   (history on vs off only)

Scenario: a 10-column table (BIGINT PK, INT, DECIMAL(12,2), nullable DECIMAL(5,2), VARCHAR(16),
nullable VARCHAR(255), DATETIME(6), nullable DATETIME(6), nullable DOUBLE, TINYINT) with 100k rows,
full-loaded by our full load (its binlog start position P0 is where both appliers start); then
N row changes (≈60 % inserts, 30 % updates, 10 % deletes, set-based multi-row statements in
transactions of 10–100 rows) are written to the binlog BEFORE either applier starts, ending at P1.

1. ours: one bounded catch-up run P0 → P1 through spark-submit (JVM start-up included in wall).
2. mysql-ch-replicator: its own copy (its initial copy of the 100k rows, made before the changes,
   not timed), then realtime replication from P0 (binlog_replicator's state file set to P0,
   db_replicator with skip_initial_replication); timed until its target's count, Σ amount and
   Σ id (FINAL) equal the source's.
3. lag: our job with service=True, max_seconds=60 (quick: 20) while a writer applies ≈2,000 row
   changes/s in small transactions; every 0.5 s lag = now − newest ``changed_at`` (= NOW(6) of
   the writer's statement) visible in the target.

Services: private MariaDB + chDB endpoint under $BENCH_STATE (default /tmp/airflow-sync-bench-cdc),
or MYSQL_URL / CLICKHOUSE_URL.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path

from airflow_sync_provider.core.cdc.checkpoints import Checkpoints
from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
from airflow_sync_provider.core.jobspec import CdcApplySpec
from airflow_sync_provider.core.ledger import DEFAULT_LEDGER_DATABASE
from airflow_sync_provider.core.positions import current_position
from airflow_sync_provider.core.source.group import one_server
from airflow_sync_provider.core.sql import ch_table
from airflow_sync_provider.core.submission import spark_submit
from bench.harness.clients import ch_client, drop_bench_data, mysql, target_databases
from bench.harness.env import machine, services, tail, tls_services, write_result
from bench.harness.jobs import JOB_TIMEOUT, fingerprint, full_load, unique_key
from bench.harness.measure import (
    fmt_change,
    fmt_load,
    fmt_rate,
    fmt_ratio,
    fmt_rounds,
    interleaved,
    percentile,
    rate,
    timer,
)
from bench.harness.peers import initial_copy, peer_env, replicator_config, stop_group, write_config
from bench.harness.processes import ProcessSampler
from devenv.peers import peer_venv

SOURCE_DB = "bench_cdc_src"
TARGET_DB = "bench_cdc"  # ours
PEER_DB = "bench_cdc_mcr"  # mysql-ch-replicator's (its own database: its initial copy RENAMEs <db>_tmp over it)
TABLE = "orders"
INITIAL_ROWS = 100_000
POLL = 0.5  # seconds between catch-up / lag polls
MIX = {"insert": 0.6, "update": 0.3, "delete": 0.1}

DDL = f"""CREATE TABLE `{TABLE}` (
  id BIGINT NOT NULL,
  customer_id INT NOT NULL,
  amount DECIMAL(12, 2) NOT NULL,
  discount DECIMAL(5, 2) NULL,
  status VARCHAR(16) NOT NULL,
  note VARCHAR(255) NULL,
  created_at DATETIME(6) NOT NULL,
  changed_at DATETIME(6) NULL,
  weight DOUBLE NULL,
  priority TINYINT NOT NULL,
  PRIMARY KEY (id)
) DEFAULT CHARSET = utf8mb4"""

# the values of a new row with key ``id`` (``changed_at`` given separately)
ROW_VALUES = ("id, id % 50000 + 1, (id * 37 % 1000000) / 100, IF(id % 5 = 0, NULL, (id % 4000) / 100), "
              "ELT(1 + id % 4, 'new', 'paid', 'shipped', 'done'), "
              "IF(id % 3 = 0, NULL, CONCAT('nöte ', id, ' ', REPEAT('x', id % 30))), "
              "TIMESTAMP('2024-01-01') + INTERVAL id SECOND + INTERVAL (id * 7919 % 1000000) MICROSECOND, "
              "{changed_at}, IF(id % 7 = 0, NULL, id / 3e0), id % 120 - 60")

# Order-independent content fingerprint, per column, by value as normalised text (a peer's column
# types may differ: DECIMAL → Float64, DATETIME(6) → DateTime64 without a zone).
COLUMNS = {
    "id": "toString(id)",
    "customer_id": "toString(customer_id)",
    "amount": "toString(toDecimal128(toString(amount), 2))",
    "discount": "toString(toDecimal128(toString(discount), 2))",
    "status": "status",
    "note": "note",
    "created_at": "toString(toDateTime64(created_at, 6, 'UTC'))",
    "changed_at": "toString(toDateTime64(changed_at, 6, 'UTC'))",
    "weight": "toString(weight)",
    "priority": "toString(priority)",
}
# what "caught up" is judged by: count, Σ amount in cents, Σ id (FINAL on the ClickHouse side)
SUMMARY_CH = "count(), sum(toInt64(round(toFloat64(amount) * 100))), sum(toInt64(id))"
SUMMARY_MY = "COUNT(*), CAST(SUM(ROUND(amount * 100)) AS SIGNED), CAST(SUM(id) AS SIGNED)"


def source_summary(mysql_url: str) -> tuple[int, int, int]:
    with mysql(mysql_url, SOURCE_DB) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT {SUMMARY_MY} FROM `{TABLE}`")
        return tuple(int(v or 0) for v in cur.fetchone())


def target_summary(ch, database: str) -> tuple[int, int, int]:
    return tuple(int(v or 0) for v in ch.query(f"SELECT {SUMMARY_CH} FROM {ch_table(database, TABLE)} FINAL")
                 .result_rows[0])


def position(mysql_url: str):
    with mysql(mysql_url) as conn:
        return current_position(conn)


def cdc_role(cmd: list[str], parent: list[str]) -> str | None:
    """A process's role in a CDC path (harness ProcessSampler): our job's Python driver, the fork
    server it forks its binlog reader processes from and those readers (spark/cdc_stream.py), its
    JVM if one starts; mysql-ch-replicator's two processes."""
    text, name = " ".join(cmd), os.path.basename(cmd[0]) if cmd else ""
    if "mysql_ch_replicator" in text:
        return "binlog_replicator" if "binlog_replicator" in cmd else "db_replicator"
    if "multiprocessing.forkserver" in text:  # the fork server, and the readers forked from it
        return "reader processes" if "multiprocessing.forkserver" in " ".join(parent) else "fork server"
    if "spawn_main" in text:  # readers spawned (before the fork server)
        return "reader processes"
    if "spark_jobs" in text and "python" in name:
        return "driver"
    if name == "java":
        return "Spark JVM"
    return None


def cpu_per_100k(seconds: float | None, changes: int) -> str:
    return f"{seconds / changes * 100_000:.2f}" if seconds is not None and changes else "—"


# ---------------------------------------------------------------------------------------------
# Source data and change generation
# ---------------------------------------------------------------------------------------------

def create_source(mysql_url: str, rows: int) -> float:
    with mysql(mysql_url) as conn, conn.cursor() as cur, timer() as t:
        cur.execute(f"DROP DATABASE IF EXISTS `{SOURCE_DB}`")
        cur.execute(f"CREATE DATABASE `{SOURCE_DB}`")
        cur.execute(f"USE `{SOURCE_DB}`")
        cur.execute(DDL)
        cur.execute(f"INSERT INTO `{TABLE}` SELECT {ROW_VALUES.format(changed_at='NULL')} "
                    f"FROM (SELECT CAST(seq AS SIGNED) AS id FROM seq_1_to_{rows}) s")
        assert cur.rowcount == rows, cur.rowcount
    return t["seconds"]


class Changes:
    """Set-based row changes in the mix ``MIX``, counted by the statements' affected rows (with
    pymysql's default flags an UPDATE's count is the rows it changed: exactly the rows the binlog
    logs; every UPDATE here changes ``amount``, so every matched row)."""

    def __init__(self, cur, next_id: int, rng: random.Random):
        self.cur, self.next_id, self.rng = cur, next_id, rng
        self.counts = {kind: 0 for kind in MIX}
        self.statements = {kind: 0 for kind in MIX}

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def kind(self, size: int) -> str:
        """The kind furthest below its share once ``size`` more changes are made."""
        total = self.total + size
        return max(MIX, key=lambda k: MIX[k] * total - self.counts[k])

    def statement(self, size: int) -> int:
        kind = self.kind(size)
        if kind == "insert":
            base, self.next_id = self.next_id, self.next_id + size
            self.cur.execute(f"INSERT INTO `{TABLE}` SELECT {ROW_VALUES.format(changed_at='NOW(6)')} "
                             f"FROM (SELECT CAST({base} + seq AS SIGNED) AS id FROM seq_1_to_{size}) s")
        else:
            low = self.rng.randint(1, max(1, self.next_id - size))
            if kind == "update":
                r = self.rng.randint(0, 1_000_000)
                self.cur.execute(
                    f"UPDATE `{TABLE}` SET amount = amount + 0.01, "
                    f"status = ELT(1 + (id + {r}) % 4, 'new', 'paid', 'shipped', 'done'), "
                    f"note = IF((id + {r}) % 5 = 0, NULL, CONCAT('upd ', {r}, ' ü')), "
                    f"weight = IF((id + {r}) % 11 = 0, NULL, id / {r % 97 + 3}e0), "
                    f"priority = (priority + 1) % 100, changed_at = NOW(6) "
                    f"WHERE id BETWEEN {low} AND {low + size - 1}")
            else:
                self.cur.execute(f"DELETE FROM `{TABLE}` WHERE id BETWEEN {low} AND {low + size - 1}")
        affected = max(0, self.cur.rowcount)
        self.counts[kind] += affected
        self.statements[kind] += 1
        return affected


def generate_changes(mysql_url: str, n: int, next_id: int, seed: int) -> dict:
    """≈n row changes in transactions of 10–100 rows (1–3 statements each), before any applier runs."""
    rng = random.Random(seed)
    conn = mysql(mysql_url, SOURCE_DB, autocommit=False)
    transactions = 0
    with conn, conn.cursor() as cur, timer() as t:
        changes = Changes(cur, next_id, rng)
        for _ in range(n):  # bounded: every transaction makes ≥ 1 change unless its ranges hit only deleted rows
            if changes.total >= n:
                break
            size = min(rng.randint(10, 100), max(1, n - changes.total))
            parts = rng.randint(1, 3) if size >= 30 else 1
            conn.begin()
            for i in range(parts):
                changes.statement(size // parts + (1 if i < size % parts else 0))
            conn.commit()
            transactions += 1
    assert changes.total >= n * 0.99, f"only {changes.total} changes generated"
    return {"changes": changes.total, "counts": changes.counts, "statements": changes.statements,
            "transactions": transactions, "seconds": t["seconds"], "next_id": changes.next_id}


class Writer(threading.Thread):
    """A steady ``rate`` row changes/s in small autocommit transactions (one statement of 5–30 rows),
    ``changed_at = NOW(6)`` (UTC) on every inserted or updated row, until ``until`` (time.time())."""

    changes_class = Changes  # what makes the statements (bench/cdc_ddl.py names its inserts' columns)

    def __init__(self, mysql_url: str, rate: float, until: float, next_id: int, seed: int):
        super().__init__(daemon=True)
        self.mysql_url, self.rate, self.until, self.next_id, self.seed = mysql_url, rate, until, next_id, seed
        self.started = self.stopped = self.first_commit = None
        self.transactions, self.changes, self.error = 0, None, None
        self.stop_event = threading.Event()

    def run(self):
        try:
            with mysql(self.mysql_url, SOURCE_DB) as conn, conn.cursor() as cur:
                cur.execute("SET time_zone = '+00:00'")  # NOW(6) as UTC wall clock = the target's DateTime64(6, 'UTC')
                rng = random.Random(self.seed)
                self.changes = self.changes_class(cur, self.next_id, rng)
                self.started = time.time()
                while not self.stop_event.is_set():
                    now = time.time()
                    if now >= self.until:
                        break
                    if self.changes.total >= self.rate * (now - self.started):
                        time.sleep(0.002)
                        continue
                    self.changes.statement(rng.randint(5, 30))
                    self.transactions += 1
                    if self.first_commit is None:
                        self.first_commit = time.time()
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.stopped = time.time()

    @property
    def achieved(self) -> float:
        if not self.changes or not self.started:
            return 0.0
        return self.changes.total / max(1e-9, self.stopped - self.started)


# ---------------------------------------------------------------------------------------------
# Ours
# ---------------------------------------------------------------------------------------------

def run_full_load(mysql_url, ch_url, target_db: str = TARGET_DB) -> dict:
    """The table's full load, where a pipeline starts (its binlog start position P0: ``start``)."""
    load = full_load(mysql_url, ch_url, SOURCE_DB, TABLE, target_db, TABLE, channels=2,
                     load_key=unique_key("bench-cdc"))
    assert load["start"], f"full load recorded no binlog start position: {load['result']}"
    return load


def cdc_spec(mysql_url, ch_url, pipeline, args, **kwargs) -> CdcApplySpec:
    return CdcApplySpec(sources=one_server(MySQLEndpoint.from_url(mysql_url)),
                        target=ClickHouseEndpoint.from_url(ch_url), pipeline=pipeline, lanes=args.lanes,
                        batch_events=args.batch_events, **kwargs)


def verify_rows(mysql_url, ch_url, target_db: str = TARGET_DB) -> dict:
    """Row-for-row: source vs our target FINAL (tests/helpers.py, independent of the job's code)."""
    from tests.helpers import assert_same_rows

    conn = mysql(mysql_url, SOURCE_DB)
    ch = ch_client(ch_url)
    try:
        with timer() as t:
            rows = assert_same_rows(conn, ch, SOURCE_DB, TABLE, target_db)
        return {"ok": True, "rows": rows, "seconds": t["seconds"]}
    except AssertionError as exc:
        return {"ok": False, "error": str(exc)[:2000]}
    finally:
        conn.close()
        ch.close()


def batches(ch, pipeline: str) -> int:
    """Batches a pipeline has written: one counters row per table and batch (a plain MergeTree)."""
    return int(ch.command(f"SELECT count() FROM {ch_table(DEFAULT_LEDGER_DATABASE, 'cdc_counters')} "
                          "WHERE pipeline = {p:String}", parameters={"p": pipeline}))


def run_ours(mysql_url, ch_url, args, pipeline, load_key, stop, expect_summary, target_db: str = TARGET_DB) -> dict:
    spec = cdc_spec(mysql_url, ch_url, pipeline, args, start_from_loads=[load_key], stop_position=stop,
                    batch_seconds=args.batch_seconds)
    with ProcessSampler(roles=cdc_role) as sampler, timer() as wall:
        result = spark_submit(spec, timeout=JOB_TIMEOUT)
    out = {"wall": wall["seconds"], "result": result, "sampler": sampler, "ok": result.get("status") == "success"}
    if not out["ok"]:
        out["error"] = str(result.get("error"))[:4000]
        return out
    out["inner"] = float(result["seconds"])
    ch = ch_client(ch_url)
    out["batches"] = batches(ch, pipeline)
    out["summary"] = target_summary(ch, target_db)
    out["fingerprint"] = fingerprint(ch, target_db, TABLE, COLUMNS, final=True)
    ch.close()
    out["summary_ok"] = out["summary"] == expect_summary
    out["rows_check"] = verify_rows(mysql_url, ch_url, target_db)
    return out


# ---------------------------------------------------------------------------------------------
# mysql-ch-replicator
# ---------------------------------------------------------------------------------------------

def peer_initial_copy(mysql_url, ch_url, timeout: float) -> dict:
    """Its own copy of the table as it is before the changes (its target table, types and _version)."""
    target_databases(ch_url, drop=(PEER_DB, f"{PEER_DB}_tmp"))
    copy = initial_copy(mysql_url, ch_url, SOURCE_DB, [TABLE], PEER_DB, timeout)
    assert copy["code"] == 0 and "initial replication - done" in copy["output"], \
        f"mysql-ch-replicator initial copy exited {copy['code']}:\n{copy['output'][-3000:]}"
    ch = ch_client(ch_url)
    count = int(ch.command(f"SELECT count() FROM {ch_table(PEER_DB, TABLE)} FINAL"))
    max_version = int(ch.command(f"SELECT max(_version) FROM {ch_table(PEER_DB, TABLE)}"))
    ch.close()
    return {"seconds": copy["wall"], "rows": count, "max_version": max_version}


def run_peer(mysql_url, ch_url, venv: Path, start: dict, max_version: int, expect_summary, cap: float) -> dict:
    """Realtime replication from ``start``; timed until the target's summary equals ``expect_summary``.
    Its CPU: both processes' from db_replicator's start to their end (they are waited for)."""
    out = {"ok": False}
    ch = ch_client(ch_url)
    with tempfile.TemporaryDirectory(prefix="bench-cdc-mcr-") as tmp, ProcessSampler(roles=cdc_role) as cpu:
        data = os.path.join(tmp, "data")
        os.makedirs(os.path.join(data, SOURCE_DB))
        # binlog_replicator resumes at its state's prev_last_seen_transaction: the same start as ours
        Path(data, "state.json").write_text(json.dumps({"last_seen_transaction": [start["file"], start["pos"]],
                                                        "prev_last_seen_transaction": [start["file"], start["pos"]],
                                                        "pid": None}))
        # skip_initial_replication: realtime into the existing target (its initial copy above);
        # version_initial_value: its new rows must out-rank the initial copy's _version values
        config = write_config(tmp, replicator_config(mysql_url, ch_url, data, SOURCE_DB, [TABLE], PEER_DB,
                                                     skip_initial_replication=True, version_initial_value=max_version))
        binary = str(venv / "bin" / "mysql_ch_replicator")
        db_log, bin_log = os.path.join(tmp, "db_replicator.out"), os.path.join(tmp, "binlog_replicator.out")
        procs = []
        try:
            with open(db_log, "w") as log:
                db_proc = subprocess.Popen([binary, "db_replicator", "--config", config, "--db", SOURCE_DB], cwd=tmp,
                                           env=peer_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            procs.append(db_proc)
            # db_replicator first: with skip_initial_replication it starts after the last transaction
            # already in its data files, so it must be waiting before binlog_replicator writes any.
            with timer() as ready:
                deadline = time.monotonic() + 120
                while "running realtime replication" not in tail(db_log, 100_000):
                    if db_proc.poll() is not None or time.monotonic() > deadline:
                        out["error"] = f"db_replicator did not start realtime replication:\n{tail(db_log)}"
                        return out
                    time.sleep(0.1)
            out["db_ready"] = ready["seconds"]
            with ProcessSampler(interval=1.0) as sampler:
                t0 = time.perf_counter()
                with open(bin_log, "w") as log:
                    bin_proc = subprocess.Popen([binary, "binlog_replicator", "--config", config], cwd=tmp,
                                                env=peer_env(), stdout=log, stderr=subprocess.STDOUT,
                                                start_new_session=True)
                procs.append(bin_proc)
                progress = []
                while True:
                    time.sleep(POLL)
                    elapsed = time.perf_counter() - t0
                    try:
                        summary = target_summary(ch, PEER_DB)
                    except Exception as exc:  # e.g. the endpoint busy: count it as not there yet
                        summary = (None, None, None)
                        out["poll_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                    if not progress or progress[-1][0] + 10 <= elapsed:
                        progress.append((elapsed, summary[0]))
                    if summary == expect_summary:
                        out |= {"ok": True, "wall": time.perf_counter() - t0}
                        break
                    dead = [p for p in procs if p.poll() is not None]
                    if dead or elapsed > cap:
                        out["error"] = (f"{'a process exited' if dead else f'not caught up after {cap:.0f} s'}; "
                                        f"target (count, Σ cents, Σ id) {summary} vs source {expect_summary}\n"
                                        f"db_replicator: {tail(db_log, 1500)}\n"
                                        f"binlog_replicator: {tail(bin_log, 1500)}")
                        out["wall"] = None
                        out["elapsed"] = elapsed
                        break
            out["sampler"] = sampler
            out["progress"] = progress
        finally:
            for proc in reversed(procs):
                stop_group(proc)
            out["cpu"] = cpu
            out["db_log"] = tail(db_log, 4000)
            out["bin_log"] = tail(bin_log, 2000)
    if out["ok"]:
        out["fingerprint"] = fingerprint(ch, PEER_DB, TABLE, COLUMNS, final=True)
    ch.close()
    return out


# ---------------------------------------------------------------------------------------------
# Lag in service mode
# ---------------------------------------------------------------------------------------------

class ServiceRun:
    """A service-mode run (``spec``: ``service=True``) through spark_submit in a thread of its own
    (its driver's output to ``log``, a path, if given)."""

    def __init__(self, spec: CdcApplySpec, timeout: float, log: str | None = None):
        self.spec, self.timeout, self.log = spec, timeout, log
        self.result, self.wall = None, None
        self.thread = threading.Thread(target=self._submit, daemon=True)

    def _submit(self):
        with open(self.log or os.devnull, "w") as log, timer() as wall:
            try:
                self.result = spark_submit(self.spec, timeout=self.timeout, log=log if self.log else None)
            except Exception as exc:
                self.result = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}
        self.wall = wall["seconds"]

    def start(self, checkpoints: Checkpoints) -> float:
        """Start it and wait until it is running (it marked its pipeline running: after its JVM's
        start-up; at most 300 s); the seconds that took."""
        self.launched = time.time()
        self.thread.start()
        deadline = time.monotonic() + 300
        while self.thread.is_alive() and time.monotonic() < deadline:
            state = checkpoints.state(self.spec.pipeline)
            if state and state.status == "running" and state.heartbeat > self.launched:
                break
            time.sleep(POLL)
        self.running_at = time.time()
        return self.running_at - self.launched

    def alive(self) -> bool:
        return self.thread.is_alive()

    def finish(self, timeout: float) -> dict:
        self.thread.join(timeout)
        return self.result or {"status": "failed", "error": "no result (timeout)"}


class Lags:
    """The lag of a writer's changes in the target, polled: now − the newest ``changed_at`` there
    (the writer's NOW(6) on every row it inserts or updates). A sample: (s since the writer's first
    commit, lag s, lower bound? (none of the writer's changes visible yet: now − its first commit),
    the poll's round trip s)."""

    def __init__(self, writer: Writer, ch, table: str):
        self.writer, self.ch, self.table = writer, ch, table
        self.samples: list[tuple[float, float, bool, float]] = []
        self.first_visible = None

    def polls(self, job_alive):
        """Poll every POLL s while the writer writes (and 2 s after), as long as ``job_alive()``;
        yields each poll's sample (None: not a sample, the writer not yet or no longer writing)."""
        writer = self.writer
        while writer.is_alive() or time.time() < writer.stopped + 2:
            if not job_alive():
                return
            sent = time.time()
            # max over every stored row version: a superseded version or a tombstone never carries a
            # newer changed_at than the row that replaced it, so this is the newest change applied
            newest = self.ch.query(f"SELECT toUnixTimestamp64Micro(max(changed_at)) FROM {self.table}"
                                   ).result_rows[0][0]
            got, newest = time.time(), (newest or 0) / 1e6
            sample = None
            if writer.first_commit is not None and sent > writer.first_commit and writer.is_alive():
                at = sent - writer.first_commit
                if newest >= writer.started:
                    self.first_visible = self.first_visible or sent
                    sample = (at, sent - newest, False, got - sent)
                else:
                    sample = (at, at, True, got - sent)
                self.samples.append(sample)
            yield sample
            time.sleep(max(0.0, POLL - (time.time() - sent)))

    def summary(self) -> dict:
        """Percentiles of every sample and of those after the writer's first 5 s (steady)."""
        lags = [lag for _, lag, *_ in self.samples]
        steady = [lag for at, lag, *_ in self.samples if at >= 5.0]
        first = self.writer.first_commit
        return {"samples": self.samples, "lower_bounds": sum(1 for s in self.samples if s[2]),
                "p50": percentile(lags, 0.5), "p99": percentile(lags, 0.99), "max": max(lags) if lags else None,
                "steady_p50": percentile(steady, 0.5), "steady_p99": percentile(steady, 0.99),
                "steady_samples": len(steady), "rtt_max": max((s[3] for s in self.samples), default=None),
                "first_visible": (self.first_visible - first) if self.first_visible and first else None}


def run_lag(mysql_url, ch_url, args, pipeline, next_id: int, extra: dict | None = None) -> dict:
    """``extra``: more of the service's spec (bench/cdc_verify.py: its verification settings)."""
    seconds = args.lag_seconds
    # batch_seconds 0.5 in service mode, as `airflow-sync cdc run` sets it
    spec = cdc_spec(mysql_url, ch_url, pipeline, args, service=True, max_seconds=seconds, batch_seconds=0.5,
                    **(extra or {}))
    ch = ch_client(ch_url)
    batches_before = batches(ch, pipeline)
    job = ServiceRun(spec, seconds + 900)
    out = {"seconds": seconds, "rate": args.write_rate, "startup": job.start(Checkpoints(ch))}
    if not job.alive():
        out |= {"ok": False, "error": f"the service job ended before it was running: {job.finish(0)}"}
        ch.close()
        return out
    # the job stops max_seconds after its own start (≈ when it marked itself running): the writer
    # stops a few seconds before, so the job can apply the last changes before it exits
    writer = Writer(mysql_url, args.write_rate, job.running_at + seconds - max(3.0, seconds * 0.1), next_id, seed=7)
    writer.start()
    lags = Lags(writer, ch, ch_table(TARGET_DB, TABLE))
    for _ in lags.polls(job.alive):
        pass
    writer.stop_event.set()
    writer.join()
    result = job.finish(seconds + 900)
    out |= {"ok": result.get("status") == "success", "result": result, "wall": job.wall, "writer": writer,
            **lags.summary(), "written": writer.changes.total if writer.changes else 0, "achieved": writer.achieved,
            "writer_seconds": (writer.stopped - writer.started) if writer.started else 0,
            "batches": batches(ch, pipeline) - batches_before}
    if not out["ok"]:
        out["error"] = str(result.get("error"))[:4000]
    ch.close()
    return out


# ---------------------------------------------------------------------------------------------
# Main and report
# ---------------------------------------------------------------------------------------------

def level_after(mysql_url, ch_url, args, pipeline: str, run: dict) -> None:
    """After a service run: target = source? (``run["summary_ok"]``: count, Σ amount, Σ id). If it
    stopped behind the source, one bounded run must bring the copy level (``run["tail_run"]``)."""
    expect = source_summary(mysql_url)
    ch = ch_client(ch_url)
    run["summary_ok"] = target_summary(ch, TARGET_DB) == expect
    ch.close()
    if not run["summary_ok"] and run.get("ok"):
        with timer() as wall:
            tail_run = spark_submit(cdc_spec(mysql_url, ch_url, pipeline, args), timeout=JOB_TIMEOUT)
        ch = ch_client(ch_url)
        run["tail_run"] = {"result": tail_run, "wall": wall["seconds"],
                           "summary_ok": target_summary(ch, TARGET_DB) == expect}
        ch.close()


# the TLS comparison's variants: (name, source over TLS, target over HTTPS, target database)
TLS_VARIANTS = (("plain text", False, False, "bench_cdc_plain"),
                ("TLS source (VERIFY_IDENTITY): the binlog stream and every connection", True, False, "bench_cdc_tls"),
                ("TLS source + HTTPS target (mutual TLS)", True, True, "bench_cdc_tls_https"))


def tls_comparison(args) -> None:
    """``--tls``: one bounded catch-up of the same binlog range (P0 → P1, ``--changes`` row changes)
    over plain text and over TLS, side by side on one server that takes both
    (bench/harness tls_services); ``--repeat`` rounds interleaved (each a new pipeline from its
    variant's full load), the best of each reported. Writes bench/results/cdc_apply_tls.md."""
    load_start, started = os.getloadavg(), time.monotonic()
    runs = {name: [] for name, *_ in TLS_VARIANTS}
    with tls_services("cdc-tls") as (plain, tls, http, https):
        urls = {name: (tls if source_tls else plain, https if target_tls else http, db)
                for name, source_tls, target_tls, db in TLS_VARIANTS}
        for _, ch_url, db in urls.values():
            target_databases(ch_url, create=[db], drop=[db])
        create_source(plain, INITIAL_ROWS)
        loads = {name: run_full_load(*urls[name]) for name in urls}  # each variant's P0, before the changes
        gen = generate_changes(plain, args.changes, INITIAL_ROWS + 1, args.seed)
        stop, expect = position(plain), source_summary(plain)
        print(f"generated {gen['changes']:,} row changes in {gen['transactions']:,} transactions", flush=True)
        for round_, (name, (mysql_url, ch_url, db)) in interleaved(urls.items(), args.repeat):
            run = run_ours(mysql_url, ch_url, args, f"bench-cdc-tls-{uuid.uuid4().hex[:8]}",
                           loads[name]["load_key"], stop.to_dict(), expect, db)
            assert run["ok"] and run["summary_ok"] and run["rows_check"]["ok"], (name, run.get("error"), run)
            runs[name].append(run)
            print(f"round {round_ + 1}, {name}: {run['result']['events']:,} events in {run['inner']:.2f} s job",
                  flush=True)
    load_end = os.getloadavg()
    best = {name: min(r["inner"] for r in rs) for name, rs in runs.items()}
    events = runs[TLS_VARIANTS[0][0]][0]["result"]["events"]
    plain_best = best[TLS_VARIANTS[0][0]]
    lines = [f"# CDC catch-up over TLS vs plain text — {dt.date.today()}", "", f"Machine: {machine()}", "",
             f"`python -m bench.cdc_apply --tls --changes {args.changes} --repeat {args.repeat}`: one bounded "
             f"catch-up (`spark_submit(CdcApplySpec)`, {args.lanes} lanes) of the same binlog range, "
             f"{events:,} row changes of the 10-column table of bench/cdc_apply.py (a {INITIAL_ROWS:,}-row full "
             "load first, per variant), from one MariaDB that takes TLS and plain connections alike "
             "(TLS 1.3, the server's default cipher) into the chDB stand-in over HTTP, or a second one over HTTPS "
             "with mutual TLS. Variants interleaved (every other round in reverse order), "
             f"{args.repeat} round(s); changes/s from the job's own seconds, best round; every run's copy checked "
             "row for row against the source.", "",
             f"Load average (1/5/15 min) at start {fmt_load(load_start)}, at end {fmt_load(load_end)}; "
             f"{(time.monotonic() - started) / 60:.1f} min in all (the machine is shared with other jobs).", "",
             "| variant | job s (each round) | changes/s (best) | vs plain text |", "|---|---|---|---|"]
    for name, *_ in TLS_VARIANTS:
        lines.append(f"| {name} | {fmt_rounds((r['inner'] for r in runs[name]), sep=' / ')} | "
                     f"{fmt_rate(rate(events, best[name]))} | {fmt_change(plain_best, best[name])} |")
    write_result("cdc_apply_tls", "\n".join(lines) + "\n")


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--changes", type=int, default=None,
                        help="row changes generated before the appliers run (default 1,000,000; quick 100,000)")
    parser.add_argument("--quick", action="store_true", help="≈100k changes and a 20 s lag phase")
    parser.add_argument("--lanes", type=int, default=CdcApplySpec.__dataclass_fields__["lanes"].default)
    parser.add_argument("--batch-events", type=int, default=CdcApplySpec.__dataclass_fields__["batch_events"].default)
    parser.add_argument("--batch-seconds", type=float,
                        default=CdcApplySpec.__dataclass_fields__["batch_seconds"].default,
                        help="batch_seconds of the bounded run (the service run uses 0.5, as `airflow-sync cdc run`)")
    parser.add_argument("--lag-seconds", type=float, default=None, help="max_seconds of the service run (60; quick 20)")
    parser.add_argument("--write-rate", type=float, default=2000.0, help="row changes/s during the lag phase")
    parser.add_argument("--replicator-cap", type=float, default=None,
                        help="seconds to wait for mysql-ch-replicator to catch up (default: 1800, quick 600)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the bench databases afterwards")
    parser.add_argument("--tls", action="store_true",
                        help="only the TLS comparison: one catch-up over plain text and over TLS, side by side")
    parser.add_argument("--repeat", type=int, default=2, help="rounds of the TLS or history comparison's variants")
    parser.add_argument("--history", action="store_true",
                        help="only the history comparison: one catch-up with a copy's history off and on, side by "
                             "side (bench/cdc_history.py)")
    args = parser.parse_args(argv)
    args.changes = args.changes or (100_000 if args.quick else 1_000_000)
    if args.tls:
        tls_comparison(args)
        return
    if args.history:
        from bench.cdc_history import history_comparison  # it builds on this module's scenario

        history_comparison(args)
        return
    args.lag_seconds = args.lag_seconds or (20.0 if args.quick else 60.0)
    args.replicator_cap = args.replicator_cap or (600.0 if args.quick else 1800.0)
    load_start = os.getloadavg()
    started = time.monotonic()
    venv = peer_venv("mysql-ch-replicator")

    with services("cdc") as (mysql_url, ch_url):
        target_databases(ch_url, create=[TARGET_DB], drop=(TARGET_DB, PEER_DB, f"{PEER_DB}_tmp"))
        create_seconds = create_source(mysql_url, INITIAL_ROWS)
        print(f"source: {INITIAL_ROWS:,} rows in {create_seconds:.1f} s", flush=True)
        load = run_full_load(mysql_url, ch_url)
        print(f"full load: {load['rows']:,} rows in {load['wall']:.1f} s, binlog start {load['start']}", flush=True)
        peer_init = peer_initial_copy(mysql_url, ch_url, timeout=1800)
        print(f"mysql-ch-replicator initial copy: {peer_init['rows']:,} rows in {peer_init['seconds']:.1f} s",
              flush=True)
        assert peer_init["rows"] == INITIAL_ROWS, peer_init

        before = position(mysql_url)
        gen = generate_changes(mysql_url, args.changes, INITIAL_ROWS + 1, args.seed)
        stop = position(mysql_url)
        expect = source_summary(mysql_url)
        print(f"generated {gen['changes']:,} row changes {gen['counts']} in {gen['transactions']:,} transactions, "
              f"{gen['seconds']:.1f} s; binlog {before} → {stop}; source (count, Σ cents, Σ id) {expect}", flush=True)

        pipeline = f"bench-cdc-{uuid.uuid4().hex[:8]}"
        ours = run_ours(mysql_url, ch_url, args, pipeline, load["load_key"], stop.to_dict(), expect)
        if ours["ok"]:
            print(f"ours: {ours['result']['events']:,} events in {ours['wall']:.1f} s wall, {ours['inner']:.1f} s job; "
                  f"summary {'=' if ours['summary_ok'] else '≠'} source; rows {ours['rows_check']}", flush=True)
        else:
            print(f"ours FAILED: {ours['error'][:2000]}", flush=True)

        peer = run_peer(mysql_url, ch_url, venv, load["start"], peer_init["max_version"], expect, args.replicator_cap)
        print("mysql-ch-replicator: "
              f"{'caught up in %.1f s' % peer['wall'] if peer['ok'] else peer.get('error', '')[:2000]}",
              flush=True)

        lag = None
        if ours["ok"]:
            lag = run_lag(mysql_url, ch_url, args, pipeline, gen["next_id"])
            level_after(mysql_url, ch_url, args, pipeline, lag)
            caught = lag["summary_ok"] or lag.get("tail_run", {}).get("summary_ok")
            lag["rows_check"] = verify_rows(mysql_url, ch_url) if caught else None
            print(f"lag: p50 {lag.get('p50')} p99 {lag.get('p99')} over {len(lag.get('samples', []))} samples; writer "
                  f"{lag.get('achieved', 0):,.0f} changes/s; job {lag.get('result', {}).get('status')}; "
                  f"target = source after: {lag['summary_ok']}", flush=True)

        if not args.keep:
            drop_bench_data(mysql_url, ch_url, source_dbs=[SOURCE_DB],
                            target_dbs=(TARGET_DB, PEER_DB, f"{PEER_DB}_tmp"))

    load_end = os.getloadavg()
    total = time.monotonic() - started
    lines = report(args, gen, load, peer_init, ours, peer, lag, before, stop, load_start, load_end, total)
    write_result("cdc_apply", "\n".join(lines) + "\n")


def cpu_lines(n: int, ours: dict, peer: dict) -> list[str]:
    """CPU-seconds per 100,000 row changes of each path's processes (harness ProcessSampler)."""
    lines = ["", "### CPU per 100,000 row changes", "",
             "| path | by process: CPU-s per 100,000 row changes | in all | CPU-s in all | wall s |",
             "|---|---|---|---|---|"]
    cpu = ours["sampler"]
    roles, everything = cpu.cpu_by_role(), cpu.cpu()
    jvm = roles.get("Spark JVM")
    forks = (f", fork server {cpu_per_100k(roles['fork server'], n)}" if "fork server" in roles else "")
    lines.append(f"| **ours** | **reader processes {cpu_per_100k(roles.get('reader processes', 0.0), n)}** "
                 f"({cpu.processes('reader processes')} processes){forks}, driver "
                 f"{cpu_per_100k(roles.get('driver', 0.0), n)}, Spark JVM "
                 f"{cpu_per_100k(jvm, n) if jvm else '— (not started)'} | "
                 f"**{cpu_per_100k(everything, n)}** | {everything:.1f} | {ours['wall']:.1f} |")
    if peer.get("cpu") is not None:
        pc = peer["cpu"]
        roles, everything = pc.cpu_by_role(), pc.cpu()
        lines.append(f"| mysql-ch-replicator | binlog_replicator "
                     f"{cpu_per_100k(roles.get('binlog_replicator', 0.0), n)}, db_replicator "
                     f"{cpu_per_100k(roles.get('db_replicator', 0.0), n)} | **{cpu_per_100k(everything, n)}** | "
                     f"{everything:.1f} | {peer['wall'] or peer.get('elapsed') or 0:.1f} |")
    lines += ["", "CPU of each path's own processes (not MariaDB's or the ClickHouse endpoint's): every process the "
                  "path started, sampled from /proc every 0.2 s by pid and start time, also once it has left the "
                  "bench's process tree (our binlog readers are forked by a fork server that the driver starts and "
                  "that outlives it), each up to its end: its last sample, and what its parent reaped of it beyond "
                  "that (the bench's own `RUSAGE_CHILDREN` for the processes it waits for). A process that exits "
                  "between two samples after its parent is gone loses at most its last 0.2 s "
                  "(bench/harness/processes.py). The replicator's: its two processes from db_replicator's start "
                  "(its wait for the binlog included) until both are stopped."]
    return lines


def report(args, gen, load, peer_init, ours, peer, lag, before, stop, load_start, load_end, total) -> list[str]:
    n = gen["changes"]
    c = gen["counts"]
    lines = [f"# CDC catch-up bench — {dt.date.today()}", "", f"Machine: {machine()}", "",
             f"Source: a 10-column `orders` table in a local MariaDB (BIGINT PK, INT, DECIMAL(12,2), nullable "
             f"DECIMAL(5,2), VARCHAR(16), nullable VARCHAR(255), DATETIME(6), nullable DATETIME(6), nullable DOUBLE, "
             f"TINYINT), {INITIAL_ROWS:,} rows, full-loaded by our full load ({load['wall']:.1f} s); then "
             f"**{n:,} row changes** written to the binlog before either applier started: {c['insert']:,} inserted, "
             f"{c['update']:,} updated, {c['delete']:,} deleted rows ({100 * c['insert'] / n:.0f}/"
             f"{100 * c['update'] / n:.0f}/{100 * c['delete'] / n:.0f} %), counted from the statements' affected rows; "
             f"set-based multi-row statements ({sum(gen['statements'].values()):,}) in {gen['transactions']:,} "
             f"transactions of 10–100 rows (1–3 statements each), generated in {gen['seconds']:.1f} s. Both appliers "
             f"start at the full load's binlog position {load['start']['file']}:{load['start']['pos']}; the changes "
             f"end at {stop}. "
             "Target: the local ClickHouse-HTTP endpoint (devenv/clickhouse_http.py: chDB in one process, **statements "
             "one at a time** — a stand-in, not a ClickHouse server; every writer's inserts and every poll queue "
             "there, so absolute numbers are those of this stand-in; relative numbers compare two appliers "
             "through the same bottleneck).", "",
             f"Load average (1/5/15 min) at start: {fmt_load(load_start)}, at end: {fmt_load(load_end)}; whole bench "
             f"{total / 60:.1f} min. "
             "The last column: 1-min load average before→after and the CPU that processes other than this bench's "
             "used meanwhile (cores, average; 2 cores in all).", "",
             f"## Catch-up: {n:,} row changes", "",
             "| path | row changes | wall s | changes/s (wall) | in-job s | changes/s (in-job) | ours ÷ this (wall) "
             "| target = source after | load avg / other CPU |",
             "|---|---|---|---|---|---|---|---|---|"]
    ours_rate = rate(n, ours.get("wall")) if ours["ok"] else None
    ours_inner = rate(n, ours.get("inner")) if ours["ok"] else None
    peer_rate = rate(n, peer.get("wall")) if peer["ok"] else None
    if ours["ok"]:
        res = ours["result"]
        rc = ours["rows_check"]
        check = ("count, Σ amount, Σ id equal; " if ours["summary_ok"]
                 else f"**summary differs**: {ours['summary']}; ") + \
            (f"row-for-row equal ({rc['rows']:,} rows)" if rc["ok"]
             else f"**row-for-row differs**: {rc['error'][:300]}")
        lines.append(f"| **ours**: `spark_submit(CdcApplySpec(lanes={args.lanes}, batch_events={args.batch_events:,}, "
                     f"batch_seconds={args.batch_seconds:g}))`, "
                     f"bounded | {res['events']:,} read | {ours['wall']:.1f} | {fmt_rate(ours_rate)} | "
                     f"{ours['inner']:.1f} | {fmt_rate(ours_inner)} | 1.00× | {check} | "
                     f"{ours['sampler'].contention()} |")
    else:
        lines.append(f"| **ours** | — | {ours['wall']:.1f} (failed) | — | — | — | — | job failed (below) | "
                     f"{ours['sampler'].contention()} |")
    if peer["ok"]:
        fp, ref = peer.get("fingerprint", {}), (ours.get("fingerprint") or {}) if ours["ok"] else {}
        content = "count, Σ amount, Σ id equal"
        if "columns" in fp and "columns" in ref and ours.get("rows_check", {}).get("ok"):
            differ = [col for col in COLUMNS if fp["columns"][col] != ref["columns"][col]]
            content += "; per-column fingerprint " + ("= ours (= source)" if not differ else
                                                      "differs from ours in " + ", ".join(f"`{d}`" for d in differ))
        elif "error" in fp:
            content += f"; fingerprint n/a ({fp['error'][:100]})"
        lines.append(f"| mysql-ch-replicator 0.1.16 realtime (binlog_replicator + db_replicator) | {n:,} | "
                     f"{peer['wall']:.1f} | {fmt_rate(peer_rate)} | — | — | {fmt_ratio(ours_rate, peer_rate)} | "
                     f"{content} | {peer['sampler'].contention()} |")
    else:
        elapsed = peer.get("elapsed")
        lines.append(f"| mysql-ch-replicator 0.1.16 realtime | {n:,} | "
                     f"{'> %.0f (stopped)' % elapsed if elapsed else '—'} | "
                     f"{'< ' + fmt_rate(rate(n, elapsed)) if elapsed else '—'} | — | — | — | not caught up (below) | "
                     f"{peer['sampler'].contention() if peer.get('sampler') else '—'} |")
    lines += ["", f"Ratio of row changes/s, ours ÷ mysql-ch-replicator (> 1 = ours faster), wall vs wall: "
                  f"**{fmt_ratio(ours_rate, peer_rate)}**; on our in-job time (spark-submit/JVM start-up excluded): "
                  f"{fmt_ratio(ours_inner, peer_rate)}."]
    lines += cpu_lines(n, ours, peer)
    if ours["ok"]:
        res = ours["result"]
        lines += ["", f"Ours in detail: {res['events']:,} row changes read (generated: {n:,}), "
                      f"{res['rows_written']:,} rows written (the last change per key in each batch), "
                      f"{res['lanes']} lanes, "
                      f"{ours['batches']:,} batches (≈{res['events'] / max(1, ours['batches']):,.0f} changes each; "
                      f"batch_events={args.batch_events:,}, batch_seconds={args.batch_seconds:g}); "
                      f"≈{ours['wall'] - ours['inner']:.1f} s spark-submit/JVM start-up and shutdown (wall − in-job); "
                      f"checkpoint {res['checkpoint']['file']}:{res['checkpoint']['pos']}. Row-for-row check "
                      f"(tests/helpers.assert_same_rows: every source row vs the target FINAL) took "
                      f"{ours['rows_check'].get('seconds', 0):.1f} s, not timed."]
        if res["events"] != n:
            lines.append(f"\n**Event count mismatch:** the job read {res['events']:,} row changes, the statements "
                         f"reported {n:,}.")
    else:
        lines += ["", "**Our job failed** (not fixed here; the error as reported):", "", "```",
                  ours["error"][:4000], "```"]
    if peer["ok"]:
        lines += ["", f"mysql-ch-replicator in detail: db_replicator started first and was waiting after "
                      f"{peer['db_ready']:.1f} s (not in its wall time); wall = from starting binlog_replicator until "
                      f"a poll (every {POLL} s, `count(), Σ amount, Σ id … FINAL` on its target) first saw the "
                      f"source's values. Its initial copy of the {INITIAL_ROWS:,} rows ({peer_init['seconds']:.1f} s, "
                      "before the changes) is not timed."]
    else:
        lines += ["", "**mysql-ch-replicator did not catch up** (as reported):", "", "```",
                  str(peer.get("error"))[:4000], "```"]
        if peer.get("progress"):
            lines += ["", "Its target's row count over time (s, rows): " +
                      ", ".join(f"{t:.0f}: {r}" for t, r in peer["progress"])]

    lines += ["", f"## Lag in service mode ({args.lag_seconds:.0f} s run, "
                  f"writer ≈{args.write_rate:,.0f} changes/s)", ""]
    if lag is None:
        lines.append("Not measured: our bounded run failed.")
    elif not lag.get("writer"):
        lines.append(f"Not measured: {lag.get('error')}")
    else:
        w = lag["writer"]

        def f2(v):
            return f"{v:.2f}" if v is not None else "—"

        res = lag["result"]
        applied = res.get("events", 0) or 0
        lines += ["| service run | writer: row changes, s, achieved changes/s | lag samples | lag p50 s | lag p99 s "
                  "| lag max s | after the first 5 s: p50 / p99 s (samples) | first change visible after s |",
                  "|---|---|---|---|---|---|---|---|",
                  f"| `spark_submit(CdcApplySpec(service=True, max_seconds={args.lag_seconds:.0f}, batch_seconds=0.5, "
                  f"lanes={args.lanes}))`: {res.get('status')}, {applied:,} changes applied in "
                  f"{res.get('seconds') or 0:.1f} s in-job ({fmt_rate(rate(applied, res.get('seconds')))}/s) in "
                  f"{lag.get('batches', 0):,} batches, "
                  f"wall {lag['wall'] or 0:.1f} s | {lag['written']:,}, {lag['writer_seconds']:.1f} s, "
                  f"**{lag['achieved']:,.0f}/s** ({w.transactions:,} transactions) | {len(lag['samples'])} | "
                  f"**{f2(lag['p50'])}** | **{f2(lag['p99'])}** | {f2(lag['max'])} | {f2(lag['steady_p50'])} / "
                  f"{f2(lag['steady_p99'])} ({lag['steady_samples']}) | {f2(lag['first_visible'])} |"]
        lines += ["", f"The job marked the pipeline running {lag['startup']:.1f} s after spark-submit started (JVM "
                      "start-up); the writer started then and stopped a few seconds before the job's max_seconds. "
                      "Lag = time the poll was sent − newest `changed_at` (the writer's `NOW(6)`, UTC, on every "
                      f"inserted/updated row) in the target, polled every {POLL} s from the writer's first commit "
                      f"until it stopped; {lag['lower_bounds']} of the samples were taken before any of the writer's "
                      "changes was visible and count as now − the writer's first commit (a lower bound). 'First "
                      "change visible' = from the writer's first commit to the first poll that saw one of its changes "
                      "(includes the first Spark task of the run)."]
        if w.error:
            lines.append(f"\n**Writer error:** {w.error}")
        rows_text = ""
        if lag.get("rows_check"):
            rc = lag["rows_check"]
            rows_text = f"; row-for-row {'equal' if rc['ok'] else '**DIFFERS**: ' + rc['error'][:300]}"
        if lag["summary_ok"]:
            lines.append(f"\nAfter the service run: target = source (count, Σ amount, Σ id{rows_text}).")
        else:
            text = (f"\nAfter the service run: **target ≠ source** — the run stopped (max_seconds) with "
                    f"{lag['written'] - applied:,} of the writer's {lag['written']:,} changes not applied: it did not "
                    "keep up with the writer.")
            tr = lag.get("tail_run")
            if tr:
                r = tr["result"]
                text += (f" A bounded run afterwards ({r.get('status')}, {r.get('events', 0) or 0:,} changes, "
                         f"{tr['wall']:.1f} s wall) brought the target to "
                         + (f"= source (count, Σ amount, Σ id{rows_text})." if tr["summary_ok"] else
                            f"**≠ source** ({str(r.get('error', ''))[:500]})."))
            lines.append(text)
        if not lag["ok"]:
            lines += ["", "**The service run failed** (as reported):", "", "```", lag.get("error", "")[:4000], "```"]
        series = lag["samples"]
        if series:
            step = max(1, len(series) // 25)
            lines += ["", "Lag over time (s since the writer's first commit: lag s; ≥ = lower bound): " +
                      ", ".join(f"{t:.1f}: {'≥' if lower else ''}{v:.2f}" for t, v, lower, _ in series[::step])]

    lines += ["", "## What each path includes", "",
              f"* **ours** — `spark_submit(CdcApplySpec(start_from_loads=[full-load key], stop_position=<binlog end "
              f"after the changes>, lanes={args.lanes}, batch_events={args.batch_events:,}))`, `local[2]`: one bounded "
              "catch-up run. *Wall*: the spark-submit process from start to exit (JVM start-up, the package zip, "
              "reading the ledger and schema, the binlog range split after commits between two reader processes "
              "(`readers`: one per core) that read the stream with python-mysql-replication and the row images "
              "with code generated per table map (core/cdc/rowimage.py), per-batch Arrow payloads written by the "
              "lanes with clickhouse-connect `insert_arrow` — as driver threads: batches are below "
              "`driver_write_rows`, so no SparkContext starts — a checkpoint and counters per batch, JVM "
              "shutdown). *In-job*: the job's own `seconds`. Correctness: `count()`, "
              "Σ amount, Σ id of the target `FINAL` vs the source, and a row-for-row comparison "
              "(tests/helpers.assert_same_rows).",
              "* **mysql-ch-replicator 0.1.16** (own venv, devenv/peers.py) — realtime replication as its two "
              "processes: `binlog_replicator` (reads the binlog with its vendored python-mysql-replication, pickles "
              "the events of the configured database to files) starting at the same binlog position (written into "
              "its `state.json`), and `db_replicator --db <source>` with `skip_initial_replication: true` into its "
              f"own database `{PEER_DB}` (its ReplacingMergeTree(_version) table from its own initial copy made before "
              f"the changes; `version_initial_value` = that copy's max `_version`, so its new rows out-rank it). It "
              "buffers the newest row per key and flushes every second (or 100,000 rows): inserts with "
              "clickhouse-connect, deletes as `DELETE FROM … WHERE (id) IN (…)` (lightweight deletes). Caught up = "
              f"a poll every {POLL} s of `count(), Σ amount, Σ id` of its target `FINAL` equals the source's; "
              "afterwards its per-column fingerprint (`sum(cityHash64(value as normalised text))` FINAL) is compared "
              "with ours, which was checked row for row against the source.",
              "* Both ran one after the other (never at the same time) against the same MariaDB and the same chDB "
              "endpoint; the polls of the replicator's target share the endpoint with its writes.",
              "* 2-core machine shared by the source (MariaDB), the target (chDB endpoint) and the applier; numbers "
              "come from a machine that may be shared with other work — see the last column; each path ran once."]
    return lines


if __name__ == "__main__":
    main()

"""How long a job takes to end when its target dies or freezes, or its submitter dies (issue 48),
with the default bound (``failure_wait_seconds`` 40 s), for each job: full load, CDC bootstrap,
CDC apply, snapshot diff with apply, reconciliation with repair.

    .venv/bin/python -m bench.fault_times [--rows 300000] [--only full_load,cdc_apply]

Each job runs as its own driver process under a *submitter* (a Python process that runs it with
``spark_submit``, as the command line does). Three faults, each in a fresh run of the job:

* **dead target**: the chDB endpoint SIGKILLed mid-job and left down; measured from the kill to
  the submitter's exit (a failed task);
* **frozen target**: the endpoint SIGSTOPped mid-job and left stopped; same measure (the guard);
* **dead submitter**: the submitter SIGKILLed mid-job; measured until no process of the job is left.

"Mid-job" is the moment the job's first rows reached the target (its first acknowledged
insert into the copy or working table: the stand-in's statement log). Services: a private
MariaDB + chDB endpoint under $BENCH_STATE (default /tmp/airflow-sync-bench-faults); the chDB
stand-in runs one statement at a time.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
from airflow_sync_provider.core.failures import GRACE_SECONDS, WAIT_SECONDS
from airflow_sync_provider.core.jobspec import (
    CdcApplySpec,
    CdcBootstrapSpec,
    FullLoadSpec,
    ReconcileSpec,
    SnapshotDiffSpec,
)
from airflow_sync_provider.core.selection import TableSet
from airflow_sync_provider.core.source.group import one_server
from airflow_sync_provider.core.specfile import spec_to_dict
from bench.harness.clients import mysql
from bench.harness.env import machine, state_dir, write_result
from bench.harness.jobs import full_load
from devenv.clickhouse_http import ChdbEndpoint
from devenv.mariadb import MariaDB

DB, TARGET = "faultbench", "faultbench_ch"
SUBMITTER = """
import json, sys
from airflow_sync_provider.core.jobspec import spec_from_dict
from airflow_sync_provider.core.submission import spark_submit
result = spark_submit(spec_from_dict(json.load(open(sys.argv[1]))), log=open(sys.argv[2], "w"))
sys.exit(0 if result.get("status") == "success" else 1)
"""


class Bench:
    def __init__(self, state: Path, rows: int):
        self.state, self.rows = state, rows
        self.mariadb = MariaDB(state / "mariadb").start()
        self.endpoint = ChdbEndpoint(state / "ch").start()
        self.source = MySQLEndpoint.from_url(self.mariadb.url)
        self.target = ClickHouseEndpoint.from_url(self.endpoint.url)
        self.timing = state / "statements.log"

    def restart_target(self) -> None:
        if self.endpoint.proc is not None and self.endpoint.proc.poll() is None:
            self.endpoint.proc.send_signal(signal.SIGCONT)
            self.endpoint.stop()
        port = self.endpoint.port
        self.endpoint = ChdbEndpoint(self.endpoint.data_dir)
        self.endpoint.port = port
        os.environ["CHDB_HTTP_TIMING"] = str(self.timing)  # the stand-in logs each statement's end
        self.endpoint.start()

    def table(self, name: str) -> None:
        with mysql(self.source) as conn, conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE IF NOT EXISTS {DB}")
            cur.execute(f"DROP TABLE IF EXISTS {DB}.{name}")
            cur.execute(f"CREATE TABLE {DB}.{name} (id BIGINT PRIMARY KEY, v DECIMAL(12,2) NOT NULL, note VARCHAR(40))")
            cur.execute(f"INSERT INTO {DB}.{name} SELECT seq, seq / 100, CONCAT('n', seq) "
                        f"FROM {DB}.seq_1_to_{self.rows}")

    def load(self, name: str, key: str, **kwargs) -> None:
        full_load(self.source, self.target, DB, name, TARGET, name, load_key=key, **kwargs)

    def load_spec(self, name: str, key: str, **kwargs) -> FullLoadSpec:
        return FullLoadSpec(sources=one_server(self.source), target=self.target, source_database=DB, source_table=name,
                            target_database=TARGET, target_table=name, load_key=key, **kwargs)

    def change(self, name: str) -> None:
        with mysql(self.source) as conn, conn.cursor() as cur:
            step = self.rows // 50
            for lo in range(0, self.rows, step):
                cur.execute(f"UPDATE {DB}.{name} SET v = v + 1 WHERE id > %s AND id <= %s", (lo, lo + step))


def jobs(bench: Bench, fault: str, round_: int) -> dict:
    """Each job's spec for one fault's run (its table and state made fresh), and the statement
    that marks "mid-job" (its rows reaching the target)."""
    t = f"t_{fault}_{round_}"
    out = {}
    bench.table(f"{t}_load")
    out["full_load"] = (bench.load_spec(f"{t}_load", f"{t}.load", channels=2, channel_record_speed=40_000),
                        "INSERT INTO `airflow_sync`.`parts_")
    bench.table(f"{t}_boot")
    out["cdc_bootstrap"] = (CdcBootstrapSpec(sources=one_server(bench.source), target=bench.target,
                                             pipeline=f"{t}_boot",
                                             tableset=TableSet(tables=[{"source_database": DB,
                                                                        "source_table": f"{t}_boot",
                                                      "target_database": TARGET, "target_table": f"{t}_boot"}]),
                                             chunk_rows=20_000, channel_record_speed=40_000),
                            f"INSERT INTO `{TARGET}`.`{t}_boot`")
    bench.table(f"{t}_cdc")
    bench.load(f"{t}_cdc", f"{t}.cdc")
    for _ in range(4):
        bench.change(f"{t}_cdc")
    out["cdc_apply"] = (CdcApplySpec(sources=one_server(bench.source), target=bench.target, pipeline=f"{t}_cdc",
                                     start_from_loads=[f"{t}.cdc"], batch_events=5_000, lanes=2),
                        f"INSERT INTO `{TARGET}`.`{t}_cdc`")
    bench.table(f"{t}_diff")
    bench.load(f"{t}_diff", f"{t}.diff")
    bench.change(f"{t}_diff")
    out["diff_apply"] = (SnapshotDiffSpec(target=bench.target, old_table=f"{TARGET}.{t}_diff",
                                          sources=one_server(bench.source), source_database=DB,
                                          source_table=f"{t}_diff", on_change="apply"),
                         f"INSERT INTO `{TARGET}`.`{t}_diff`")
    bench.table(f"{t}_rep")
    bench.load(f"{t}_rep", f"{t}.rep", channels=2, split_factor=10)
    bench.change(f"{t}_rep")
    out["reconcile_repair"] = (ReconcileSpec(sources=one_server(bench.source), target=bench.target, load_key=f"{t}.rep",
                                             checksum=True, reimport=True),
                               "INSERT INTO `airflow_sync`.`parts_")
    return out


def mid_job(bench: Bench, marker: str, since: float, proc: subprocess.Popen, timeout: float = 300) -> bool:
    """Wait until a statement starting with ``marker`` ended after ``since`` (False: the job
    ended first)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            lines = bench.timing.read_text(errors="replace").splitlines()
        except OSError:
            lines = []
        if any(float(line.split("\t")[0]) > since and line.split("\t")[3].startswith(marker)
               for line in lines if line.count("\t") >= 3):
            return True
        time.sleep(0.02)
    return False


def tree_gone(procs, timeout: float = 300) -> float:
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        if not [p for p in procs if _alive(p)]:
            return time.monotonic() - began
        time.sleep(0.05)
    return float("inf")


def _alive(proc) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def run_one(bench: Bench, spec, marker: str, fault: str, workdir: Path) -> str:
    workdir.mkdir(parents=True, exist_ok=True)
    spec_file = workdir / "spec.json"
    spec_file.write_text(__import__("json").dumps(spec_to_dict(spec)))
    os.chmod(spec_file, 0o600)
    since = time.time()
    submitter = subprocess.Popen([sys.executable, "-c", SUBMITTER, str(spec_file), str(workdir / "job.log")])
    if not mid_job(bench, marker, since, submitter):
        submitter.wait()
        return "ended before the fault"
    tree = [psutil.Process(submitter.pid), *psutil.Process(submitter.pid).children(recursive=True)]
    at = time.monotonic()
    if fault == "dead target":
        bench.endpoint.proc.kill()
    elif fault == "frozen target":
        bench.endpoint.proc.send_signal(signal.SIGSTOP)
    else:
        submitter.kill()
    try:
        submitter.wait(WAIT_SECONDS + GRACE_SECONDS + 120)
    except subprocess.TimeoutExpired:
        return "still running"
    ended = time.monotonic() - at
    gone = tree_gone(tree)
    if fault == "dead submitter":
        return f"{ended + gone:.1f} s until its last process ended"
    return f"{ended:.1f} s (exit {submitter.returncode}; every process of it gone {gone:.1f} s later)"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--only", default="", help="comma-separated jobs")
    args = parser.parse_args(argv)
    state = state_dir("faults")
    os.environ["CHDB_HTTP_TIMING"] = str(state / "statements.log")
    bench = Bench(state, args.rows)
    faults = ("dead target", "frozen target", "dead submitter")
    table: dict[str, dict[str, str]] = {}
    try:
        for round_, fault in enumerate(faults):
            bench.restart_target()
            for name, (spec, marker) in jobs(bench, fault.split()[0], round_).items():
                if args.only and name not in args.only.split(","):
                    continue
                bench.restart_target()
                result = run_one(bench, spec, marker, fault, state / "runs" / f"{name}-{round_}")
                table.setdefault(name, {})[fault] = result
                print(f"{name:18} {fault:15} {result}", flush=True)
    finally:
        bench.endpoint.proc.send_signal(signal.SIGCONT) if bench.endpoint.proc else None
        bench.endpoint.stop()
        bench.mariadb.stop()
    lines = ["# Time from a fault to the end of the job (bench/fault_times.py)\n",
             f"Machine: {machine()}. {args.rows:,} rows per table; failure_wait_seconds {WAIT_SECONDS:g} s "
             f"(the default), the guard's grace {GRACE_SECONDS:g} s. The chDB stand-in runs one statement at a "
             "time. Each cell: from the fault to the submitter's exit (dead submitter: its own kill, so the "
             "time is until the job's last process is gone).\n",
             "| job | " + " | ".join(faults) + " |", "|---|" + "---|" * len(faults)]
    for name, row in table.items():
        lines.append(f"| {name} | " + " | ".join(row.get(f, "—") for f in faults) + " |")
    write_result("fault_times", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

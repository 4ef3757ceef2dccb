"""Large transactions and a run's fixed cost (issue 43).

    .venv/bin/python -m bench.cdc_big_txn [--sizes 1000000,5000000,20000000] [--before REV] [--kills 8]
                                          [--skip-big] [--skip-fixed]

1. **One transaction of N row changes** (N = each of ``--sizes``): a 6-column table of N / 1.1
   rows (BIGINT key, INT, DECIMAL(12,2), VARCHAR(16), nullable VARCHAR(64), DATETIME(6)) made
   with MariaDB's sequence engine and bootstrapped into a pipeline, then one transaction that
   updates every row and deletes a tenth (the issue's shape: 1.1 changes per row). One bounded
   `cdc apply` (spark_submit, the defaults) applies it while the whole process tree of the job
   is sampled every 0.2 s (devenv/rss.py, as bench/full_load.py samples): peak RSS, in-job s,
   row changes/s. Beside it, the same number of row changes in small transactions (UPDATEs of
   100 consecutive keys, autocommit) on the same table, applied the same way. Correctness: the
   target's count, Σ id and Σ amount (FINAL) equal the source's after each.
2. **A run's fixed cost**: a pipeline of three 20,000-row tables; bounded runs with nothing to
   apply (in-job `seconds` and wall, 6 runs each); then a takeover under load: a writer at about
   1,000 row changes/s in small transactions, a service applier SIGKILLed after 1–7 s, and the
   time from the kill to the end of the next successful bounded run (``--kills`` times). With
   ``--before REV`` the same with the package as of git revision REV (``git archive`` into a
   temporary directory, put first on PYTHONPATH), on its own pipeline over the same tables.

Services: private MariaDB + chDB endpoint under $BENCH_STATE (default /tmp/airflow-sync-bench-bigtxn),
or MYSQL_URL / CLICKHOUSE_URL. Results: bench/results/cdc_big_txn.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import uuid

from pymysql.constants import CLIENT

from airflow_sync_provider.core.jobspec import CdcApplySpec, CdcBootstrapSpec
from airflow_sync_provider.core.selection import TableSet
from airflow_sync_provider.core.source.group import one_server
from airflow_sync_provider.core.submission import spark_submit
from bench.harness.clients import ch_client, mysql, source, target, target_databases
from bench.harness.env import REPO, machine, services, write_json, write_result
from bench.harness.measure import fmt_median, fmt_range
from devenv.rss import PeakRss

DB, TARGET = "bench_bigtxn", "bench_bigtxn_ch"
FIXED_DB = "bench_fixed"
# Pipelines of this run only: a pipeline of an earlier run would resume at a checkpoint that, after
# the binlog was reset (each size starts afresh), points into unrelated events
RUN = uuid.uuid4().hex[:6]
DDL = """CREATE TABLE t (id BIGINT NOT NULL PRIMARY KEY, customer INT NOT NULL, amount DECIMAL(12, 2) NOT NULL,
  status VARCHAR(16) NOT NULL, note VARCHAR(64) NULL, changed_at DATETIME(6) NOT NULL)"""
SUMMARY_MY = "COUNT(*), CAST(SUM(id) AS SIGNED), CAST(SUM(ROUND(amount * 100)) AS SIGNED)"
SUMMARY_CH = "count(), sum(toInt64(id)), sum(toInt64(round(toFloat64(amount) * 100)))"


def summaries(mysql_url: str, ch, database: str, table: str, target_db: str) -> tuple[tuple, tuple]:
    with mysql(mysql_url, database) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT {SUMMARY_MY} FROM `{table}`")
        sums = tuple(int(v or 0) for v in cur.fetchone())
    row = ch.query(f"SELECT {SUMMARY_CH} FROM `{target_db}`.`{table}` FINAL").result_rows[0]
    ch.close()
    copy = tuple(int(v or 0) for v in row)
    return sums, copy


def apply_measured(spec: CdcApplySpec) -> dict:
    """One bounded run through spark_submit, its process tree sampled."""
    began = time.perf_counter()
    with PeakRss() as peak:
        result = spark_submit(spec, timeout=14400)
    if result.get("status") != "success":
        raise RuntimeError(f"apply failed: {result.get('error', result)}"[:3000])
    return {"wall": time.perf_counter() - began, "seconds": result["seconds"], "events": result["events"],
            "pieces": result.get("pieces", 0), "peak_mib": peak.mib, "processes": len(peak.processes)}


# --- 1. one large transaction vs the same changes in small ones -----------------------------------


def big_transaction(mysql_url: str, ch_url: str, changes: int, small_too: bool = True) -> dict:
    rows = round(changes / 1.1)
    endpoints = source(mysql_url), target(ch_url)
    target_databases(ch_url, drop=[TARGET])  # a fresh copy: versions are positions in a reset binlog
    with mysql(mysql_url) as conn, conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {DB}")
        cur.execute("RESET MASTER")  # the bench's own server: the sizes before it need their binlog no more
        cur.execute(f"CREATE DATABASE {DB}")
        cur.execute(f"USE {DB}")
        cur.execute(DDL)
        began = time.perf_counter()
        cur.execute(f"INSERT INTO t SELECT seq, seq % 9973, seq / 100, 'new', IF(seq % 3, CONCAT('note ', seq), NULL), "
                    f"'2025-01-01 00:00:00' FROM seq_1_to_{rows}")
        made = time.perf_counter() - began
    pipeline = f"bigtxn-{changes}-{RUN}"
    began = time.perf_counter()
    result = spark_submit(CdcBootstrapSpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline=pipeline,
                                           restart=True,
                                           tableset=TableSet(tables=[{"source_database": DB, "source_table": "t",
                                                    "target_database": TARGET}])), timeout=14400)
    assert result["status"] == "success", result
    copied = time.perf_counter() - began
    spec = CdcApplySpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline=pipeline, verify_period=0,
                        verify_after_ddl=False)
    assert spark_submit(spec, timeout=3600)["status"] == "success"  # the pipeline begins
    with mysql(mysql_url, DB) as conn, conn.cursor() as cur:
        began = time.perf_counter()
        cur.execute("BEGIN")
        cur.execute("UPDATE t SET amount = amount + 1, status = 'updated', changed_at = NOW(6)")
        updated = cur.rowcount
        cur.execute("DELETE FROM t WHERE id % 10 = 3")
        deleted = cur.rowcount
        cur.execute("COMMIT")
        written = time.perf_counter() - began
    print(f"{changes:,}: {rows:,} rows made in {made:.0f} s, bootstrapped in {copied:.0f} s; one transaction of "
          f"{updated + deleted:,} row changes written in {written:.0f} s", flush=True)
    big = apply_measured(spec)
    source_sums, copy = summaries(mysql_url, ch_client(endpoints[1]), DB, "t", TARGET)
    big |= {"changes": updated + deleted, "exact": source_sums == copy, "source": source_sums, "copy": copy}
    print(f"  one transaction: {big}", flush=True)
    if not small_too:  # compared with the largest size's small transactions (the rate does not grow with N)
        return {"changes": changes, "rows": rows, "big": big, "small": None, "txn_write_s": written}

    # the same number of row changes in small transactions (100 keys each), then applied the same way
    began = time.perf_counter()
    done, transactions, low = 0, 0, 1
    with mysql(mysql_url, DB, client_flag=CLIENT.MULTI_STATEMENTS) as conn, conn.cursor() as cur:
        while done < updated + deleted:
            statements = []
            for _ in range(50):
                statements.append(f"UPDATE t SET amount = amount + 1, changed_at = NOW(6) WHERE id BETWEEN {low} "
                                  f"AND {low + 99}")
                low = low + 100 if low + 100 <= rows else 1
            cur.execute(";".join(statements))
            while True:
                done += max(cur.rowcount, 0)
                transactions += 1
                if not cur.nextset():
                    break
    generated = time.perf_counter() - began
    small = apply_measured(spec)
    source_sums, copy = summaries(mysql_url, ch_client(endpoints[1]), DB, "t", TARGET)
    small |= {"changes": done, "transactions": transactions, "generated_s": generated, "exact": source_sums == copy,
              "source": source_sums, "copy": copy}
    print(f"  small transactions: {small}", flush=True)
    return {"changes": changes, "rows": rows, "big": big, "small": small, "txn_write_s": written}


# --- 2. a run's fixed cost: nothing to apply, and a takeover under load ------------------------------

# Run by a child Python with the package under test first on its path (this revision's or --before's).
CHILD = r"""
import json, os, random, signal, sys, threading, time
from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
from airflow_sync_provider.core.jobspec import CdcApplySpec
from airflow_sync_provider.core.submission import spark_submit
mysql_url, ch_url, pipeline, runs, kills, seed = sys.argv[1:7]
source, target = MySQLEndpoint.from_url(mysql_url), ClickHouseEndpoint.from_url(ch_url)
server = ({"sources": [{"name": "", "endpoint": source}]} if "sources" in CdcApplySpec.__dataclass_fields__
          else {"source": source})  # a --before revision's specs took one source
bounded = CdcApplySpec(target=target, pipeline=pipeline, **server)
service = CdcApplySpec(target=target, pipeline=pipeline, service=True, max_seconds=120, **server)
out = {"idle": [], "takeover": []}
for _ in range(int(runs)):
    began = time.perf_counter()
    result = spark_submit(bounded, timeout=600)
    assert result["status"] == "success", result
    out["idle"].append({"seconds": result["seconds"], "wall": time.perf_counter() - began, "events": result["events"]})
def drivers():  # the apply job's driver among this process's descendants (never another process's)
    parents, found = {}, []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            parents[int(pid)] = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    mine, todo = set(), [os.getpid()]
    while todo:
        here = todo.pop()
        for pid, parent in parents.items():
            if parent == here and pid not in mine:
                mine.add(pid)
                todo.append(pid)
    for pid in mine:
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if len(argv) > 1 and argv[1].endswith(b"spark_jobs/cdc_apply.py"):
            found.append(pid)
    return found
rng = random.Random(int(seed))
for _ in range(int(kills)):
    thread = threading.Thread(target=lambda: spark_submit(service, timeout=600), daemon=True)
    thread.start()
    time.sleep(rng.uniform(1, 7))
    for pid in drivers():
        os.kill(pid, signal.SIGKILL)
    killed = time.perf_counter()
    thread.join()
    result = spark_submit(bounded, timeout=600)
    out["takeover"].append({"seconds": time.perf_counter() - killed, "in_job": result.get("seconds"),
                            "events": result.get("events"), "status": result["status"],
                            "verified": len(result.get("verified") or [])})
print("RESULT " + json.dumps(out))
"""


BOOT = r"""
import sys
from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
from airflow_sync_provider.core.jobspec import CdcApplySpec, CdcBootstrapSpec
from airflow_sync_provider.core.submission import spark_submit
mysql_url, ch_url, pipeline, database, copies = sys.argv[1:6]
source, target = MySQLEndpoint.from_url(mysql_url), ClickHouseEndpoint.from_url(ch_url)
tables = [{"source_database": database, "source_table": f"t{i}", "target_database": copies} for i in range(3)]
if "tableset" in CdcBootstrapSpec.__dataclass_fields__:  # specs since one Source type (issue 49)
    server, named = {"sources": [{"name": "", "endpoint": source}]}, {"tableset": {"tables": tables}}
else:  # a --before revision's specs took one source and their tables beside it
    server, named = {"source": source}, {"tables": tables}
result = spark_submit(CdcBootstrapSpec(target=target, pipeline=pipeline, restart=True, **server, **named), timeout=600)
assert result["status"] == "success", result
result = spark_submit(CdcApplySpec(target=target, pipeline=pipeline, **server), timeout=600)
assert result["status"] == "success", result  # begins, and its first verification pass
"""


class Writer(threading.Thread):
    """About ``rate`` row changes/s in small transactions (20-row UPDATEs) over the fixed-cost tables."""

    def __init__(self, mysql_url: str, rate: float = 1000.0):
        super().__init__(daemon=True)
        self.url, self.rate, self.stop, self.changes = mysql_url, rate, threading.Event(), 0

    def run(self):
        with mysql(self.url, FIXED_DB) as conn, conn.cursor() as cur:
            began, i = time.monotonic(), 0
            while not self.stop.is_set():
                low = (i * 20) % 19_980 + 1
                cur.execute(f"UPDATE t{i % 3} SET v = v + 1 WHERE id BETWEEN {low} AND {low + 19}")
                self.changes += cur.rowcount
                i += 1
                ahead = self.changes / self.rate - (time.monotonic() - began)
                if ahead > 0:
                    time.sleep(ahead)


def fixed_cost(mysql_url: str, ch_url: str, label: str, path: str, runs: int, kills: int) -> dict:
    pipeline = f"fixed-{label}-{RUN}"
    copies = f"{FIXED_DB}_{RUN}_{'before' if label.startswith('before') else 'after'}"
    target_databases(ch_url, drop=[copies])
    env = dict(os.environ, PYTHONPATH=path)  # and run from there: a script's own directory comes first
    # bootstrapped and begun by the code measured (the state it keeps is that code's)
    subprocess.run([sys.executable, "-c", BOOT, mysql_url, ch_url, pipeline, FIXED_DB, copies], env=env, cwd=path,
                   check=True)
    # nothing to apply first (no writer), then the takeovers under the writer
    child = subprocess.Popen([sys.executable, "-c", CHILD, mysql_url, ch_url, pipeline, str(runs), "0", "1"],
                             env=env, cwd=path, stdout=subprocess.PIPE, text=True)
    idle = json.loads(child.communicate()[0].split("RESULT ", 1)[1])["idle"]
    writer = Writer(mysql_url)
    writer.start()
    try:
        child = subprocess.Popen([sys.executable, "-c", CHILD, mysql_url, ch_url, pipeline, "0", str(kills), "7"],
                                 env=env, cwd=path, stdout=subprocess.PIPE, text=True)
        takeover = json.loads(child.communicate()[0].split("RESULT ", 1)[1])["takeover"]
    finally:
        writer.stop.set()
        writer.join()
    out = {"label": label, "idle": idle, "takeover": takeover}
    print(f"fixed cost ({label}): {json.dumps(out)}", flush=True)
    return out


def make_fixed_tables(mysql_url: str) -> None:
    with mysql(mysql_url) as conn, conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {FIXED_DB}")
        cur.execute(f"CREATE DATABASE {FIXED_DB}")
        for i in range(3):
            cur.execute(f"CREATE TABLE {FIXED_DB}.t{i} (id INT PRIMARY KEY, v INT NOT NULL, s VARCHAR(20) NULL)")
            cur.execute(f"INSERT INTO {FIXED_DB}.t{i} SELECT seq, seq, 'x' FROM {FIXED_DB}.seq_1_to_20000")


def checkout(rev: str, into: str) -> str:
    """The package as of git revision ``rev`` (or a directory holding one already) in ``into``."""
    if os.path.isdir(os.path.join(rev, "airflow_sync_provider")):
        return rev
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "airflow_sync_provider", "spark_jobs"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    # installed, spark_jobs/ is the package's subpackage (pyproject's package-dir): so here too, or
    # the editable install's finder hands this revision's entry scripts to the old package
    os.rename(os.path.join(into, "spark_jobs"), os.path.join(into, "airflow_sync_provider", "spark_jobs"))
    return into


# --- report ---------------------------------------------------------------------------------------


def args_small_max(args: list[str]) -> int:
    """--small-max as given on the command line the report quotes (its default otherwise)."""
    return int(args[args.index("--small-max") + 1]) if "--small-max" in args else 5_000_000


def report(args, sizes: list[dict], fixed: list[dict], load: tuple, seconds: float) -> str:
    lines = [f"# Large transactions and a run's fixed cost — {time.strftime('%Y-%m-%d')}", "",
             f"Machine: {machine()}", "",
             f"Load average (1 min) at start {load[0]:.2f}, at end {os.getloadavg()[0]:.2f}; the bench took "
             f"{seconds / 60:.0f} min. `python -m bench.cdc_big_txn {' '.join(args)}`.", ""]
    if sizes:
        lines += ["## One transaction of N row changes vs the same N in small transactions", "",
                  "Each a bounded `cdc apply` through spark_submit with the defaults (batch_events=50,000, "
                  "batch_bytes=16 MiB, readers=2, lanes=4); peak RSS = the largest sum over the job's process "
                  "tree (driver and reader processes), sampled every 0.2 s.", "",
                  "| row changes | shape | pieces | in-job s | changes/s (in-job) | wall s | peak RSS MiB | "
                  "processes | copy = source | big ÷ small rate |", "|---|---|---|---|---|---|---|---|---|---|"]
        smalls = [s["small"] for s in sizes if s["small"]]
        for s in sizes:
            big, small = s["big"], s["small"] or max(smalls, key=lambda x: x["changes"])
            rate_big, rate_small = big["changes"] / big["seconds"], small["changes"] / small["seconds"]
            lines.append(f"| {big['changes']:,} | one transaction | {big['pieces']} | {big['seconds']:.1f} | "
                         f"{rate_big:,.0f} | {big['wall']:.1f} | **{big['peak_mib']:,.0f}** | {big['processes']} | "
                         f"{'yes' if big['exact'] else 'NO'} | **{rate_big / rate_small:.2f}** |")
            if s["small"] is None:
                continue  # its ratio: against the largest small-transaction run above
            lines.append(f"| {small['changes']:,} | {small['transactions']:,} transactions | {small['pieces']} | "
                         f"{small['seconds']:.1f} | {rate_small:,.0f} | {small['wall']:.1f} | "
                         f"{small['peak_mib']:,.0f} | {small['processes']} | {'yes' if small['exact'] else 'NO'} | |")
        if any(s["small"] is None for s in sizes):
            lines += ["", f"Sizes above {args_small_max(args):,} changes: no small-transaction run of their own; "
                      "their ratio is against the largest small-transaction run above."]
        lines.append("")
    if fixed:
        lines += ["## A run's fixed cost", "",
                  "A pipeline of three 20,000-row tables. *Nothing to apply*: bounded runs right after one another "
                  "(in-job = the result's `seconds`, from the run object's start; wall = spark_submit, the "
                  "driver's start and imports included). *Takeover*: a writer at ≈1,000 row changes/s in small "
                  "transactions, a service applier SIGKILLed after 1–7 s, then a bounded run at once; time from the "
                  "kill to its end (it takes the lease, applies the backlog and, after a takeover, looks at every "
                  "table before it ends).", "",
                  "| code | nothing to apply: in-job s median (range) | wall s median (range) | takeover s median "
                  "(range) | takeover in-job s median | kills |", "|---|---|---|---|---|---|"]
        for f in fixed:
            idle, take = f["idle"], [t for t in f["takeover"] if t["status"] == "success"]
            lines.append(f"| {f['label']} | {fmt_median(r['seconds'] for r in idle)} "
                         f"({fmt_range(r['seconds'] for r in idle)}) | {fmt_median(r['wall'] for r in idle)} "
                         f"({fmt_range(r['wall'] for r in idle)}) | **{fmt_median(t['seconds'] for t in take)}** "
                         f"({fmt_range(t['seconds'] for t in take)}) | {fmt_median(t['in_job'] for t in take)} | "
                         f"{len(take)}/{len(f['takeover'])} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1000000,5000000,20000000", help="row changes per transaction")
    parser.add_argument("--before", default="", help="a git revision (or a directory holding the package as of "
                        "one) to measure the fixed cost of as well")
    parser.add_argument("--runs", type=int, default=6, help="bounded runs with nothing to apply")
    parser.add_argument("--kills", type=int, default=8, help="takeovers under load")
    parser.add_argument("--small-max", type=int, default=5_000_000,
                        help="the same changes in small transactions only for sizes up to this")
    parser.add_argument("--skip-big", action="store_true")
    parser.add_argument("--skip-fixed", action="store_true")
    parser.add_argument("--name", default="cdc_big_txn", help="result file bench/results/<name>.md")
    args = parser.parse_args(argv)
    load, started = os.getloadavg(), time.monotonic()
    random.seed(1)
    sizes, fixed = [], []
    with services("bigtxn") as (mysql_url, ch_url):
        if not args.skip_fixed:
            make_fixed_tables(mysql_url)
            with tempfile.TemporaryDirectory(prefix="bench-before-") as tmp:
                if args.before:
                    label = f"before ({os.path.basename(args.before.rstrip('/'))})"
                    fixed.append(fixed_cost(mysql_url, ch_url, label, checkout(args.before, tmp),
                                            args.runs, args.kills))
                fixed.append(fixed_cost(mysql_url, ch_url, "this branch", str(REPO), args.runs, args.kills))
        if not args.skip_big:
            for size in (int(s) for s in args.sizes.split(",") if s):
                sizes.append(big_transaction(mysql_url, ch_url, size, size <= args.small_max))
                write_result(args.name, report(sys.argv[1:], sizes, fixed, load, time.monotonic() - started))
    text = report(sys.argv[1:], sizes, fixed, load, time.monotonic() - started)
    write_result(args.name, text)
    write_json(args.name, {"sizes": sizes, "fixed": fixed})


if __name__ == "__main__":
    main()

"""The README's first command: the main job end to end on the local stand-ins.

Starts MariaDB and the chDB ClickHouse endpoint (or uses MYSQL_URL / CLICKHOUSE_URL),
generates the demo data, runs the example DAGs with ``airflow dags test`` — the full loads,
the whole ``demo`` database by pattern in one job (load + reconciliation), then CDC (bootstrap
of orders and order_items while a writer changes them, catch-up, the binlog position sensor,
reconciliation with checksums) — printing a line per task while Airflow's full log goes to a
file, and ends with source vs target row counts per copy.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pymysql

from airflow_sync_provider.core.clickhouse.client import client
from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
from airflow_sync_provider.core.sql import ch_table, mysql_table
from devenv import demo_data
from devenv.airflow_env import REPO, airflow_env
from devenv.demo_writer import DemoWriter
from devenv.services import clickhouse_service, mysql_service

FULL_LOAD_DAG, DATABASE_DAG, CDC_DAG = "sync_demo_full_load", "sync_demo_database", "sync_demo_cdc"
WRITE_INTO_BOOTSTRAP = 2  # bootstrap chunks copied before the writer stops (see main)


def _chunks_copied(ch) -> int:
    """Chunks the demo pipeline's bootstrap has recorded in the ledger so far."""
    try:
        return int(ch.command("SELECT sum(chunks) FROM airflow_sync.shards WHERE startsWith(load_key, 'cdc:demo_cdc:')")
                   or 0)
    except Exception:  # no ledger table yet
        return 0


def _position(value) -> str:
    return f"{value['file']}:{value['pos']}" if isinstance(value, dict) and "file" in value else str(value)


def _summary(task: str, value) -> str:
    """One line from a task's XCom result (rows, verdicts, positions)."""
    if not isinstance(value, dict):
        return ""
    tables = value.get("tables")
    if "selected" in value:  # a job of many tables
        what = (f"verdict {value['verdict']}" if "verdict" in value
                else f"{sum(t.get('rows') or 0 for t in tables):,} rows")
        return f"{len(tables)} tables ({', '.join(value['selected'])}): {what}"
    if isinstance(tables, list) and tables and isinstance(tables[0], dict):  # a bootstrap
        return "; ".join(f"{t['table']}: {t['rows']:,} rows" + (" (bootstrapped earlier)" if t.get("skipped") else
                                                                f" in {t['chunks']} chunks") for t in tables) + (
            f"; binlog {_position(value['start_position'])} … {_position(value['end_position'])}")
    if "verdict" in value:
        return f"verdict {value['verdict']}" + (f", mismatched shards {value['mismatched']}" if value.get("mismatched")
                                                else "")
    if "target_position" in value:  # the binlog position sensor
        return f"pipeline at {_position(value.get('checkpoint'))}"
    if "events" in value:
        return f"{value['events']:,} row changes applied, checkpoint {_position(value.get('checkpoint'))}"
    if "rows" in value:
        return f"{value['rows']:,} rows"
    return ""


class _TaskWatcher(threading.Thread):
    """Prints a line when a task of the DAG run starts or finishes (Airflow's metadata DB),
    while Airflow's own log goes to a file."""

    def __init__(self, db: Path, dag_id: str):
        super().__init__(daemon=True)
        self.db, self.dag_id = db, dag_id
        self.after = self._newest_run()  # only the run this demo starts: an earlier demo's states are not news
        self.stop = threading.Event()
        self.seen: dict[str, str] = {}

    def _newest_run(self) -> int:
        try:
            with sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=1) as db:
                return db.execute("SELECT COALESCE(MAX(id), 0) FROM dag_run WHERE dag_id = ?",
                                  (self.dag_id,)).fetchone()[0]
        except sqlite3.Error:
            return 0

    def poll(self) -> None:
        try:
            with sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=1) as db:
                rows = db.execute(
                    "SELECT ti.task_id, ti.state, ti.start_date, ti.end_date FROM task_instance ti JOIN dag_run r"
                    " ON ti.dag_id = r.dag_id AND ti.run_id = r.run_id WHERE ti.dag_id = ? AND r.id ="
                    " (SELECT MAX(id) FROM dag_run WHERE dag_id = ?) AND r.id > ? ORDER BY ti.start_date",
                    (self.dag_id, self.dag_id, self.after)).fetchall()
                values = dict(db.execute("SELECT task_id, value FROM xcom WHERE dag_id = ? AND key = 'return_value'"
                                         " AND run_id = (SELECT run_id FROM dag_run WHERE dag_id = ? ORDER BY id DESC"
                                         " LIMIT 1)", (self.dag_id, self.dag_id)).fetchall())
        except sqlite3.Error:
            return  # the DB is busy or not created yet: next time
        for task, state, start, end in rows:
            if state in (None, "scheduled", "queued", "none") or self.seen.get(task) == state:
                continue
            self.seen[task] = state
            if state in ("running", "deferred", "up_for_reschedule"):
                print(f"[demo]   {task}: {state}", flush=True)
                continue
            seconds = ""
            try:
                took = dt.datetime.fromisoformat(end) - dt.datetime.fromisoformat(start)
                seconds = f" in {took.total_seconds():.1f} s"
            except (TypeError, ValueError):
                pass
            detail = _summary(task, json.loads(values[task])) if task in values else ""
            print(f"[demo]   {task}: {state}{seconds}" + (f" — {detail}" if detail else ""), flush=True)

    def run(self):
        while not self.stop.wait(1.0):
            self.poll()
        self.poll()


def run_dag(env: dict, home: Path, dag_id: str, log_path: Path, on_task=None) -> int:
    """``airflow dags test`` with its full log in ``log_path`` and a progress line per task."""
    print(f"[demo] DAG {dag_id}: running (full Airflow log: {log_path})", flush=True)
    started = time.monotonic()
    watcher = _TaskWatcher(home / "airflow.db", dag_id)
    watcher.start()
    with open(log_path, "a") as log:
        process = subprocess.Popen([sys.executable, "-m", "airflow", "dags", "test", dag_id], env=env, stdout=log,
                                   stderr=subprocess.STDOUT)
        while process.poll() is None:
            time.sleep(0.5)
            if on_task:
                on_task(watcher.seen)
    watcher.stop.set()
    watcher.join()
    print(f"[demo] DAG {dag_id}: {'succeeded' if process.returncode == 0 else 'FAILED'} in "
          f"{time.monotonic() - started:.1f} s", flush=True)
    return process.returncode


# (table, copy's database, LIKE pattern of its load keys)
FULL_LOAD_COPIES = [(table, "demo", f"{FULL_LOAD_DAG}.load_{table}.%") for table in demo_data.DDL]
DATABASE_COPIES = [(table, "demo_all", f"{DATABASE_DAG}.load_database.%:demo.{table}") for table in demo_data.DDL]
CDC_COPIES = [(table, "demo_cdc", f"cdc:demo_cdc:demo.{table}%") for table in ("orders", "order_items")]


def counts(mysql_url: str, clickhouse_url: str, copies) -> list[tuple[str, str, int, int, str]]:
    """Per copy: source rows now, target rows (FINAL), and its last reconciliation verdict."""
    ch = client(ClickHouseEndpoint.from_url(clickhouse_url))
    conn = pymysql.connect(**MySQLEndpoint.from_url(mysql_url).connect_args(database="demo"))
    out = []
    with conn, conn.cursor() as cur:
        for table, database, key in copies:
            cur.execute(f"SELECT COUNT(*) FROM {mysql_table('demo', table)}")
            source = cur.fetchone()[0]
            try:
                target = int(ch.command(f"SELECT count() FROM {ch_table(database, table)} FINAL"))
            except Exception:
                target = -1
            verdict = ch.query(
                "SELECT verdict, checksum FROM airflow_sync.reconciliations WHERE load_key LIKE {p:String}"
                " ORDER BY at DESC LIMIT 1", parameters={"p": key}).result_rows
            checked = f"{verdict[0][0]}{' (checksums)' if verdict[0][1] else ''}" if verdict else "-"
            out.append((table, database, source, target, checked))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", type=int, default=1_000_000)
    parser.add_argument("--writer-rate", type=float, default=500, help="row changes/s during the CDC bootstrap")
    parser.add_argument("--state-dir", default=str(REPO / ".devenv-state"))
    args = parser.parse_args(argv)
    state = Path(args.state_dir)
    started = time.monotonic()
    with mysql_service(state) as mysql_url, clickhouse_service(state) as clickhouse_url:
        print(f"[demo] services up in {time.monotonic() - started:.1f} s", flush=True)
        t = time.monotonic()
        print(f"[demo] demo data: {demo_data.generate(mysql_url, orders=args.orders)} "
              f"in {time.monotonic() - t:.1f} s", flush=True)
        home = state / "airflow"
        env = airflow_env(home, mysql_url, clickhouse_url)
        log_path = state / "demo-airflow.log"
        log_path.write_text("")
        with open(log_path, "a") as log:
            subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env, check=True, stdout=log,
                           stderr=subprocess.STDOUT)
        _reset_cdc(clickhouse_url)
        codes = [run_dag(env, home, FULL_LOAD_DAG, log_path), run_dag(env, home, DATABASE_DAG, log_path)]
        # before the writer changes the source
        rows = counts(mysql_url, clickhouse_url, FULL_LOAD_COPIES + DATABASE_COPIES)
        # CDC: a writer changes orders and order_items while they are bootstrapped. It stops (its
        # held transactions committed) once the bootstrap has copied its first chunks, so the
        # bounded catch-up after the bootstrap reads a quiet source to its end and the
        # reconciliation can say ok. (Stopping at the bootstrap's end raced the catch-up's start:
        # a transaction committed after its end position was in the source but not yet the copy.)
        writer = DemoWriter(mysql_url, rate=args.writer_rate)
        writer.start()
        print(f"[demo] writer: ~{args.writer_rate:.0f} row changes/s on demo.orders and demo.order_items "
              "(inserts, updates, deletes, key changes, transactions held open)", flush=True)
        ch = client(ClickHouseEndpoint.from_url(clickhouse_url))

        def stop_writer(seen: dict) -> None:
            if not writer.is_alive():
                return
            ended = seen.get("bootstrap") in ("success", "failed")
            if not ended and _chunks_copied(ch) < WRITE_INTO_BOOTSTRAP:
                return
            writer.stop()
            print(f"[demo] writer stopped: {writer.changes:,} row changes in {writer.transactions:,} transactions "
                  f"(+{writer.held} held open for {writer.hold_seconds:.1f} s) from the DAG's start "
                  + ("to the bootstrap's end (it was quicker than the writer could stop: the reconciliation may see "
                     "its last commits)" if ended else f"into the bootstrap ({WRITE_INTO_BOOTSTRAP} chunks copied)")
                  + "; catch-up applies those after the bootstrap's start position", flush=True)

        codes.append(run_dag(env, home, CDC_DAG, log_path, stop_writer))
        if writer.is_alive():
            writer.stop()
        ch.close()
        rows += counts(mysql_url, clickhouse_url, CDC_COPIES)
    print(f"\n{'table':<12} {'copy':<22} {'source':>10} {'target':>10}  match  reconciliation")
    for table, database, source, target, verdict in rows:
        print(f"{table:<12} {database + '.' + table:<22} {source:>10} {target:>10}  "
              f"{'yes' if source == target else 'NO ':<5}  {verdict}")
    print(f"[demo] full Airflow log: {log_path}")
    print(f"[demo] total {time.monotonic() - started:.1f} s")
    ok = all(c == 0 for c in codes) and all(s == t and v.startswith("ok") for _, _, s, t, v in rows)
    return 0 if ok else 1


def _reset_cdc(clickhouse_url: str) -> None:
    """A fresh demo: the CDC pipeline and its copies start over (the demo data was regenerated)."""
    ch = client(ClickHouseEndpoint.from_url(clickhouse_url))
    try:
        ch.command("DROP DATABASE IF EXISTS demo_cdc")
        for table, column in (("cdc_state", "pipeline"), ("cdc_tables", "pipeline"), ("loads", "load_key"),
                              ("shards", "load_key")):
            if int(ch.command(f"EXISTS TABLE airflow_sync.{table}")):
                ch.command(f"DELETE FROM airflow_sync.{table} WHERE {column} = 'demo_cdc' OR startsWith({column}, "
                           "'cdc:demo_cdc:')")
    finally:
        ch.close()


if __name__ == "__main__":
    os.chdir(REPO)
    sys.exit(main())

"""The README's first command: the main job end to end on the local stand-ins.

Starts MariaDB and the chDB ClickHouse endpoint (or uses MYSQL_URL / CLICKHOUSE_URL),
generates the demo data, runs the example DAG with ``airflow dags test`` and prints source
vs target row counts per table.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import pymysql

from airflow_sync_provider.core import clickhouse_target
from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
from airflow_sync_provider.core.sql import ch_table, mysql_table
from devenv import demo_data
from devenv.airflow_env import REPO, airflow_env
from devenv.services import clickhouse_service, mysql_service

DAG_ID = "sync_demo_full_load"


def counts(mysql_url: str, clickhouse_url: str, database: str) -> list[tuple[str, int, int, str]]:
    """Per demo table: source rows, target rows (FINAL), and the DAG's last reconciliation verdict."""
    ch = clickhouse_target.client(ClickHouseEndpoint.from_url(clickhouse_url))
    conn = pymysql.connect(**MySQLEndpoint.from_url(mysql_url).connect_args(database=database))
    out = []
    with conn, conn.cursor() as cur:
        for table in demo_data.DDL:
            cur.execute(f"SELECT COUNT(*) FROM {mysql_table(database, table)}")
            target = ch.command(f"SELECT count() FROM {ch_table(database, table)} FINAL")
            verdict = ch.query(
                "SELECT verdict, checksum FROM airflow_sync.reconciliations WHERE startsWith(load_key, {p:String})"
                " ORDER BY at DESC LIMIT 1", parameters={"p": f"{DAG_ID}.load_{table}."}).result_rows
            checked = f"{verdict[0][0]}{' (checksums)' if verdict[0][1] else ''}" if verdict else "-"
            out.append((table, cur.fetchone()[0], int(target), checked))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", type=int, default=1_000_000)
    parser.add_argument("--state-dir", default=str(REPO / ".devenv-state"))
    args = parser.parse_args(argv)
    state = Path(args.state_dir)
    started = time.monotonic()
    with mysql_service(state) as mysql_url, clickhouse_service(state) as clickhouse_url:
        print(f"[demo] services up in {time.monotonic() - started:.1f} s", flush=True)
        t = time.monotonic()
        print(f"[demo] demo data: {demo_data.generate(mysql_url, orders=args.orders)} "
              f"in {time.monotonic() - t:.1f} s", flush=True)
        env = airflow_env(state / "airflow", mysql_url, clickhouse_url)
        airflow = [sys.executable, "-m", "airflow"]
        subprocess.run([*airflow, "db", "migrate"], env=env, check=True, stdout=subprocess.DEVNULL)
        t = time.monotonic()
        run = subprocess.run([*airflow, "dags", "test", DAG_ID], env=env)
        print(f"[demo] airflow dags test {DAG_ID}: exit {run.returncode} in {time.monotonic() - t:.1f} s")
        rows = counts(mysql_url, clickhouse_url, "demo")
    print(f"\n{'table':<12} {'source':>10} {'target':>10}  match  reconciliation")
    for table, source, target, verdict in rows:
        print(f"{table:<12} {source:>10} {target:>10}  {'yes' if source == target else 'NO ':<5}  {verdict}")
    print(f"[demo] total {time.monotonic() - started:.1f} s")
    ok = run.returncode == 0 and all(s == t and v.startswith("ok") for _, s, t, v in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    os.chdir(REPO)
    sys.exit(main())

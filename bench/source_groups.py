"""Source-group bench (issue 42): a sharded estate merged into one copy vs the same rows from one
source into one table, in one run; then (unless ``--skip-cdc``) CDC lag of the group under a
steady write load spread over every source.

* Estate: ``--sources`` private MariaDB servers (devenv/mariadb.group_servers), each with database
  ``bench_group`` holding ``--tables`` tables ``orders_0 …`` (ids from 1 on every shard:
  they overlap), ``--rows`` rows in all, spread evenly; the single source: ``bench_single.orders``
  on the first server with the same ``--rows`` rows and columns.
* Load: ``spark_submit(FullLoadSpec(sources=…, merge_into=…, select=…, channels=C))`` (one job, the
  channels shared across the sources) vs ``spark_submit(FullLoadSpec(<one table>, channels=C))``,
  ``local[2]``, each checked by count and Σ amount against the sources (FINAL).
* CDC: a group pipeline bootstrapped over every source, then a service run while writers apply
  ``--changes-per-second`` row changes spread over the sources; lag = now − the newest
  ``changed_at`` visible in the merged copy, polled every 0.5 s.

    .venv/bin/python -m bench.source_groups [--sources 8] [--tables 8] [--rows 10000000] [--skip-cdc]

Services under $BENCH_STATE (default /tmp/airflow-sync-bench-source_groups): the servers and a
chDB endpoint (one statement at a time: a stand-in, not a ClickHouse server).
"""

from __future__ import annotations

import argparse
import os
import time
from decimal import Decimal
from pathlib import Path

import pymysql

from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
from airflow_sync_provider.core.jobspec import FullLoadSpec
from airflow_sync_provider.core.source.group import Source
from airflow_sync_provider.core.submission import spark_submit
from bench.common import fmt_rate, machine, timer, write_result
from bench.full_load import ch_client
from devenv.clickhouse_http import ChdbEndpoint
from devenv.mariadb import group_servers

SOURCE_DB, SINGLE_DB, TARGET_DB = "bench_group", "bench_single", "bench_group_ch"
COLUMNS = ("id BIGINT NOT NULL PRIMARY KEY, customer_id INT NOT NULL, amount DECIMAL(12,2) NOT NULL, "
           "status VARCHAR(16) NOT NULL, note VARCHAR(255) NULL, created_at DATETIME(6) NOT NULL, "
           "changed_at DATETIME(6) NULL, weight DOUBLE NULL, priority TINYINT NOT NULL")
VALUES = ("seq, seq % 50000, (seq * 7919) % 10000000 / 100, ELT(1 + seq % 4, 'new', 'paid', 'sent', 'done'), "
          "IF(seq % 5 = 0, NULL, CONCAT('note ', seq)), TIMESTAMP('2025-01-01') + INTERVAL seq SECOND, NULL, "
          "IF(seq % 7 = 0, NULL, seq / 3), seq % 100")
JOB_TIMEOUT = 7200.0


def connect(url: str):
    return pymysql.connect(**MySQLEndpoint.from_url(url).connect_args(), autocommit=True)


def generate(urls: dict, tables: int, rows: int) -> None:
    per_table = rows // (len(urls) * tables)
    for i, url in enumerate(urls.values()):
        with connect(url) as conn, conn.cursor() as cur:
            cur.execute("SET SESSION sql_log_bin = 0")  # the generated rows need no binlog
            for db in (SOURCE_DB, SINGLE_DB):
                cur.execute(f"DROP DATABASE IF EXISTS {db}")
            cur.execute(f"CREATE DATABASE {SOURCE_DB}")
            cur.execute(f"USE {SOURCE_DB}")
            for t in range(tables):
                cur.execute(f"CREATE TABLE orders_{t} ({COLUMNS})")
                cur.execute(f"INSERT INTO orders_{t} SELECT {VALUES} FROM seq_1_to_{per_table}")
            if i == 0:
                cur.execute(f"CREATE DATABASE {SINGLE_DB}")
                cur.execute(f"USE {SINGLE_DB}")
                cur.execute(f"CREATE TABLE orders ({COLUMNS})")
                cur.execute(f"INSERT INTO orders SELECT {VALUES} FROM seq_1_to_{per_table * tables * len(urls)}")


def source_totals(urls: dict, tables: int) -> tuple[int, str]:
    count, amount = 0, 0
    for url in urls.values():
        with connect(url) as conn, conn.cursor() as cur:
            for t in range(tables):
                cur.execute(f"SELECT COUNT(*), SUM(amount) FROM {SOURCE_DB}.orders_{t}")
                n, s = cur.fetchone()
                count, amount = count + n, amount + s
    return count, str(amount)


def run(spec, what: str) -> dict:
    with timer() as wall:
        result = spark_submit(spec, master="local[2]", timeout=JOB_TIMEOUT, line=lambda text: None)
    if result.get("status") != "success":
        raise SystemExit(f"{what} failed: {result.get('error')}")
    return {"wall": wall["seconds"], "in_job": result["seconds"], "result": result}


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--sources", type=int, default=8)
    parser.add_argument("--tables", type=int, default=8, help="tables per source")
    parser.add_argument("--rows", type=int, default=10_000_000, help="rows in all (and in the single table)")
    parser.add_argument("--channels", type=int, default=4)
    parser.add_argument("--skip-cdc", action="store_true")
    args = parser.parse_args(argv)
    state = Path(os.environ.get("BENCH_STATE", "/tmp/airflow-sync-bench-source_groups"))
    names = [f"s{i}" for i in range(args.sources)]
    load_start, started = os.getloadavg(), time.monotonic()
    with group_servers(state / "servers", names) as urls, ChdbEndpoint(state / "clickhouse") as endpoint:
        with timer() as gen:
            generate(urls, args.tables, args.rows)
        rows = args.rows // (args.sources * args.tables) * args.sources * args.tables
        print(f"generated {rows:,} rows on {args.sources} servers in {gen['seconds']:.0f} s", flush=True)
        target = ClickHouseEndpoint.from_url(endpoint.url)
        ch = ch_client(endpoint.url)
        ch.command(f"DROP DATABASE IF EXISTS {TARGET_DB}")
        single = run(FullLoadSpec(MySQLEndpoint.from_url(urls["s0"]), target, SINGLE_DB, "orders", TARGET_DB,
                                  "single", channels=args.channels, load_key=f"bench-single-{time.time()}"),
                     "single-source load")
        print(f"single source: {single['wall']:.1f} s", flush=True)
        group = run(FullLoadSpec(None, target, "", "", "", "", sources=[Source(n, MySQLEndpoint.from_url(u))
                                                                         for n, u in urls.items()],
                                 merge_into=f"{TARGET_DB}.merged", select={"databases": [SOURCE_DB],
                                                                            "tables": ["orders_*"]},
                                 channels=args.channels, load_key=f"bench-group-{time.time()}"), "group load")
        print(f"group: {group['wall']:.1f} s", flush=True)
        expected = source_totals(urls, args.tables)
        got = tuple(ch.query(f"SELECT count(), toString(sum(amount)) FROM {TARGET_DB}.merged FINAL").result_rows[0])
        got_single = tuple(ch.query(f"SELECT count(), toString(sum(amount)) FROM {TARGET_DB}.single FINAL"
                                    ).result_rows[0])
        ch.close()
    lines = report(args, rows, gen["seconds"], single, group, expected, got, got_single, load_start,
                   time.monotonic() - started)
    write_result("source_groups", "\n".join(lines) + "\n")


def report(args, rows, gen_seconds, single, group, expected, got, got_single, load_start, total) -> list[str]:
    members = args.sources * args.tables
    s_rate, g_rate = rows / single["wall"], rows / group["wall"]
    s_job, g_job = rows / single["in_job"], rows / group["in_job"]
    exact = got[0] == expected[0] and Decimal(str(got[1])) == Decimal(str(expected[1]))
    return [
        f"# Source-group bench — {time.strftime('%Y-%m-%d')}", "",
        f"Machine: {machine()}", "",
        f"Estate: {args.sources} MariaDB servers × {args.tables} tables = {members} source tables, {rows:,} rows in "
        f"all (ids overlapping across shards), 9 mixed columns; the single source: one table of the same {rows:,} "
        f"rows on the first server; generated in {gen_seconds:.0f} s. Target: the chDB stand-in (one statement at a "
        "time). Load average before: " + "/".join(f"{x:.2f}" for x in load_start) + f"; whole bench {total / 60:.1f} "
        "min.", "",
        "## Full load: merged vs one source", "",
        "| path | rows | wall s | rows/s (wall) | in-job s | rows/s (in-job) | ÷ single (wall / in-job) | check |",
        "|---|---|---|---|---|---|---|---|",
        f"| one source, one table (`FullLoadSpec`, channels={args.channels}) | {rows:,} | {single['wall']:.1f} | "
        f"{fmt_rate(s_rate)} | {single['in_job']:.1f} | {fmt_rate(s_job)} | 1.00× | "
        f"count {got_single[0]:,} |",
        f"| group: {members} tables on {args.sources} servers merged (`sources=…, merge_into=…`, "
        f"channels={args.channels} shared) | {rows:,} | {group['wall']:.1f} | {fmt_rate(g_rate)} | "
        f"{group['in_job']:.1f} | {fmt_rate(g_job)} | **{g_rate / s_rate:.2f}×** / {g_job / s_job:.2f}× | "
        f"count {got[0]:,}, Σ amount {'= sources' if exact else f'{got[1]} vs {expected[1]}'} |",
        "",
        f"Goal: group rows/s ≥ 0.9× the single source's: **{'met' if g_rate / s_rate >= 0.9 else 'missed'}** "
        f"({g_rate / s_rate:.2f}× wall).",
    ]


if __name__ == "__main__":
    main()

"""Shard planner bench: balance (max/mean rows per shard) and full-load time, equal vs balanced,
on a skewed and a sparse key; planning time on a 10M-row table.

    .venv/bin/python -m bench.planner [--rows 1000000] [--big-rows 10000000]
"""

from __future__ import annotations

import argparse
import datetime as dt

from airflow_sync_provider.core.source.planning import (
    MySQLKeyIndex,
    Sharding,
    SpeedLimits,
    index_ordered_cuts,
    plan_table,
)
from airflow_sync_provider.core.source.reader import connect
from airflow_sync_provider.core.source.schema import read_table_schema
from bench.harness.clients import mysql, source
from bench.harness.env import machine, services, write_result
from bench.harness.jobs import full_load
from bench.harness.measure import timer
from devenv import demo_data

DB = "bench_planner"
COLUMNS = ("(id BIGINT PRIMARY KEY, customer VARCHAR(32) NOT NULL, amount DECIMAL(12,2) NOT NULL,"
           " created DATETIME(3) NOT NULL, status VARCHAR(16) NOT NULL, note VARCHAR(64) NULL,"
           " qty INT UNSIGNED NOT NULL, weight DOUBLE NULL, flag TINYINT NOT NULL, ref BIGINT NULL)")
VALUES = ("CONCAT('c', seq % 5000), (seq * 7919 % 1000000) / 100, TIMESTAMP('2025-01-01') + INTERVAL seq SECOND,"
          " ELT(1 + seq % 4, 'new', 'paid', 'shipped', 'cancelled'), IF(seq % 10 = 0, NULL, CONCAT('note ', seq)),"
          " seq % 100, IF(seq % 11 = 0, NULL, seq / 3), seq % 2, IF(seq % 3 = 0, NULL, seq * 13)")


def key_sql(kind: str, rows: int) -> str:
    if kind == "skewed":  # 95% of the rows in the lowest ~0.1% of the key range
        dense = rows * 95 // 100
        return f"IF(seq <= {dense}, seq, {dense} + (seq - {dense}) * 20000000)"
    # sparse: 100 bands of consecutive-ish ids, band starts growing cubically (irregular gaps)
    band = max(1, rows // 100)
    return f"POW(seq DIV {band}, 3) * 1000000 + (seq % {band}) * 7"


def balance(conn, plan) -> tuple[float, list[int]]:
    counts = []
    with conn.cursor() as cur:
        for shard in plan.shards:
            cur.execute(f"SELECT COUNT(*) {plan.from_clause()} WHERE {shard.where}", shard.params)
            counts.append(cur.fetchone()[0])
    ranges = [c for c, s in zip(counts, plan.shards) if "IS NULL" not in s.where]
    mean = sum(ranges) / len(ranges)
    return max(ranges) / mean, counts


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--big-rows", type=int, default=10_000_000)
    parser.add_argument("--channels", type=int, default=2)
    args = parser.parse_args(argv)
    lines = [f"# Planner bench — {dt.date.today()}", "", f"Machine: {machine()}", "",
             f"Tables of {args.rows:,} rows × 10 columns; channels = {args.channels}, split_factor = 5 "
             f"(→ {args.channels * 5} range shards + NULL shard); load = the full-load Spark job (local[2]) into "
             "the chDB endpoint, including ≈6 s spark-submit start-up.", "",
             "| table | strategy | plan s | max/mean rows per shard | shard rows | load s | rows/s |",
             "|---|---|---|---|---|---|---|"]
    with services("planner") as (mysql_url, clickhouse_url):
        root = source(mysql_url)
        with mysql(root) as conn, conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE IF NOT EXISTS {DB}")
            cur.execute(f"USE {DB}")
            for kind in ("skewed", "sparse"):
                cur.execute(f"DROP TABLE IF EXISTS {kind}")
                cur.execute(f"CREATE TABLE {kind} {COLUMNS}")
                cur.execute(f"INSERT INTO {kind} SELECT {key_sql(kind, args.rows)}, {VALUES} FROM seq_1_to_{args.rows}")
        for kind in ("skewed", "sparse"):
            for strategy in ("equal", "balanced"):
                with connect(root) as pconn:
                    schema = read_table_schema(pconn, DB, kind)
                    with timer() as t:
                        plan = plan_table(pconn, schema,
                                          Sharding(speed=SpeedLimits(channels=args.channels), strategy=strategy))
                    ratio, counts = balance(pconn, plan)
                load = full_load(root, clickhouse_url, DB, kind, DB, f"{kind}_{strategy}", channels=args.channels,
                                 strategy=strategy, expect_rows=args.rows)
                lines.append(f"| {kind} | {strategy} | {t['seconds']:.2f} | {ratio:.2f} | {counts[:-1]} | "
                             f"{load['wall']:.1f} | {args.rows / load['wall']:,.0f} |")
                print(lines[-1], flush=True)

        lines += ["", f"## Planning time on a {args.big_rows:,}-row table (demo `orders`, BIGINT PK)", "",
                  "| what | seconds |", "|---|---|"]
        with timer() as gen:
            demo_data.generate(mysql_url, "bench_big", orders=args.big_rows, customers=10_000, item_orders=10)
        lines.append(f"| generate the table (reference) | {gen['seconds']:.1f} |")
        with connect(root) as pconn:
            with pconn.cursor() as cur, timer() as count:
                cur.execute("SELECT COUNT(*) FROM bench_big.orders")
                cur.fetchone()
            lines.append(f"| `SELECT COUNT(*)` (reference) | {count['seconds']:.2f} |")
            schema = read_table_schema(pconn, "bench_big", "orders")
            for strategy in ("equal", "balanced"):
                for channels in (2, 8):
                    with timer() as t:
                        plan = plan_table(pconn, schema,
                                          Sharding(speed=SpeedLimits(channels=channels), strategy=strategy))
                    lines.append(f"| plan {strategy}, {channels} channels ({len(plan.shards)} shards) | "
                                 f"{t['seconds']:.2f} |")
                    print(lines[-1], flush=True)
            # the index walk itself (what balanced costs when equal widths are not already even)
            column = schema.column("id")
            with timer() as t:
                cuts = index_ordered_cuts(MySQLKeyIndex(pconn, schema, column, "PRIMARY"), 8 * 5)
            lines.append(f"| index walk alone (balanced on uneven keys), {len(cuts) + 1} ranges | {t['seconds']:.2f} |")
            with timer() as t:
                plan = plan_table(pconn, read_table_schema(pconn, "bench_big", "customers"),
                                  Sharding(speed=SpeedLimits(channels=8), strategy="balanced"))
            lines.append("| plan balanced, VARCHAR utf8mb4_unicode_ci key, 10k rows, 8 channels | "
                         f"{t['seconds']:.3f} |")
    write_result("planner", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

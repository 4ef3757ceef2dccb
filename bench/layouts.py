"""Layout bench: full-load rows/s and CDC changes/s of a copy laid out with ``order_by`` +
``partition_by`` (core/clickhouse/layout.py) against the default mirror, side by side in one run.

    .venv/bin/python -m bench.layouts [--rows 1000000] [--changes 200000] [--rounds 2]

Four copies of one source table: the mirror, ``order_by=["status"]``, ``partition_by=
"toYYYYMM(day)"`` and both. Per round, in alternating order, a full load into each (its own spark
job in this process, ``local[2]``). Then per round two change workloads in MySQL, one after the
other: updates of ``amount`` only (no row moves; each transaction's rows spread over every month,
or of one month), and one where a third of the changes move their row (a new ``status`` and a
day 40 days on: another sorting key and month); after each,
every copy's pipeline applies the same binlog range, first and last in turn (changes/s = the
workload's row changes / the apply's seconds). A moved row costs a laid-out copy two rows (a
tombstone of its old place and its new row): the rows written say so. Every copy is then
compared with the source (FINAL, row count and a checksum).

Services: private MariaDB + chDB endpoint under $BENCH_STATE (default /tmp/airflow-sync-bench-layouts);
the chDB endpoint runs one statement at a time.
"""

from __future__ import annotations

import argparse
import time

from airflow_sync_provider.core.jobspec import CdcApplySpec, FullLoadSpec
from airflow_sync_provider.core.selection import TableSet
from airflow_sync_provider.core.source.group import one_server
from bench.harness.clients import ch_client, drop_bench_data, mysql, source, target
from bench.harness.env import machine, services, write_result
from bench.harness.measure import fmt_rate, fmt_ratio, interleaved, median, rate, timer

DB, TARGET_DB = "bench_lay", "bench_lay_ch"
LAYOUTS = {"mirror": None, "order_by": {"order_by": ["status"]}, "partition_by": {"partition_by": "toYYYYMM(day)"},
           "both": {"order_by": ["status"], "partition_by": "toYYYYMM(day)"}}


def _source(mysql_url, rows: int) -> None:
    with mysql(mysql_url) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE IF NOT EXISTS {DB}")
        cur.execute(f"DROP TABLE IF EXISTS {DB}.orders")
        cur.execute(f"CREATE TABLE {DB}.orders (id INT PRIMARY KEY, tenant INT NOT NULL, status VARCHAR(10) NOT NULL, "
                    "day DATE NOT NULL, amount DECIMAL(12, 2), note VARCHAR(40))")
        cur.execute(f"INSERT INTO {DB}.orders SELECT seq, seq % 50, ELT(1 + seq % 4, 'new', 'paid', 'sent', 'done'), "
                    f"'2024-01-01' + INTERVAL (seq % 700) DAY, seq / 8, CONCAT('note ', seq) FROM {DB}.seq_1_to_{rows}")
        conn.commit()


def _changes(mysql_url, count: int, rows: int, moving: int) -> int:
    """``count`` row changes in transactions of 1,000; every ``moving``-th transaction (0: none)
    moves its rows (a new status and a day 40 days on), the others change ``amount`` only
    (``moving`` -1: each transaction changes rows of one month, month after month)."""
    done, step = 0, 1000
    with mysql(mysql_url) as conn, conn.cursor() as cur:
        for start in range(1, rows + 1, step):
            if done >= count:
                break
            if moving < 0:
                month = (start // step) % 23
                cur.execute(f"UPDATE {DB}.orders SET amount = amount + 1 WHERE day >= '2024-01-01' + INTERVAL %s "
                            "MONTH AND day < '2024-01-01' + INTERVAL %s MONTH ORDER BY id LIMIT 1000",
                            (month, month + 1))
            elif moving and (start // step) % moving == 0:
                cur.execute(f"UPDATE {DB}.orders SET status = IF(status = 'held', 'new', 'held'), day = day + INTERVAL "
                            "40 DAY WHERE id BETWEEN %s AND %s", (start, start + step - 1))
            else:
                cur.execute(f"UPDATE {DB}.orders SET amount = amount + 1 WHERE id BETWEEN %s AND %s",
                            (start, start + step - 1))
            done += cur.rowcount
            conn.commit()
    return done


WORKLOADS = {"no row moves": 0, "no row moves, a month per transaction": -1, "a third of the rows move": 3}


def _table(variant: str) -> str:
    return f"orders_{variant}"


def _check(ch, mysql_url, variant: str) -> str:
    with mysql(mysql_url) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT count(*), sum(amount), sum(CRC32(CONCAT(id, status, day))) FROM {DB}.orders")
        want = tuple(int(v) for v in cur.fetchone())
    got = tuple(int(v) for v in ch.query(f"SELECT count(), sum(amount), sum(CRC32(concat(toString(id), status, "
                                         f"toString(day)))) FROM {TARGET_DB}.{_table(variant)} FINAL").result_rows[0])
    return "exact" if got == want else f"DIFFERS {got} != {want}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--changes", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--lanes", type=int, default=4, help="the pipelines' apply lanes (CdcApplySpec.lanes)")
    parser.add_argument("--batch-events", type=int, default=CdcApplySpec.batch_events,
                        help="the pipelines' batch_events (a partitioned copy's: PARTITIONED_BATCHES times it)")
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help="which copies, comma-separated (mirror first)")
    args = parser.parse_args()
    for name in set(LAYOUTS) - set(args.layouts.split(",")):
        del LAYOUTS[name]
    from pyspark.sql import SparkSession

    from airflow_sync_provider.spark.cdc_apply import run_cdc_apply
    from airflow_sync_provider.spark.full_load import run_full_load

    spark = SparkSession.builder.master("local[2]").appName("bench-layouts").getOrCreate()
    with services("layouts") as (mysql_url, ch_url):
        drop_bench_data(mysql_url, ch_url, source_dbs=[DB], target_dbs=[TARGET_DB])
        _source(mysql_url, args.rows)
        ch = ch_client(ch_url)
        load_seconds: dict = {v: [] for v in LAYOUTS}
        keys: dict = {}
        for round_, variant in interleaved(LAYOUTS, args.rounds):
            ch.command(f"DROP TABLE IF EXISTS {TARGET_DB}.{_table(variant)}")
            keys[variant] = f"bench.layouts.{variant}.{time.time_ns()}"
            with timer() as took:
                run_full_load(FullLoadSpec(sources=one_server(source(mysql_url)), target=target(ch_url),
                                           source_database=DB, source_table="orders", target_database=TARGET_DB,
                                           target_table=_table(variant), load_key=keys[variant], channels=2,
                                           tableset=TableSet(layout=LAYOUTS[variant])), spark)
            load_seconds[variant].append(took["seconds"])
            print(f"round {round_ + 1} load {variant}: {took['seconds']:.1f} s", flush=True)
        # every copy's pipeline from its last load; then each workload, applied by each
        pipelines = {}
        for variant in LAYOUTS:
            pipelines[variant] = f"bench_lay_{_table(variant)}_{time.time_ns()}"
            run_cdc_apply(CdcApplySpec(sources=one_server(source(mysql_url)), target=target(ch_url),
                                       pipeline=pipelines[variant], start_from_loads=[keys[variant]],
                                       verify_period=0), spark)
        applied: dict = {}
        for round_ in range(args.rounds):
            for workload, moving in WORKLOADS.items():
                changes = _changes(mysql_url, args.changes, args.rows, moving)
                for variant in list(LAYOUTS)[::1 if round_ % 2 == 0 else -1]:  # first and last in turn
                    with timer() as took:
                        result = run_cdc_apply(CdcApplySpec(sources=one_server(source(mysql_url)),
                                                            target=target(ch_url), pipeline=pipelines[variant],
                                                            lanes=args.lanes, batch_events=args.batch_events,
                                                            verify_period=0), spark)
                    one = applied.setdefault((workload, variant), {"seconds": [], "changes": changes,
                                                                    "events": 0, "written": 0})
                    one["seconds"].append(took["seconds"])
                    one["events"] += result["events"]
                    one["written"] += result["rows_written"]
                    print(f"round {round_ + 1} {workload}: apply {variant}: {result['events']} changes in "
                          f"{took['seconds']:.1f} s", flush=True)
        checks = {v: _check(ch, mysql_url, v) for v in LAYOUTS}
    spark.stop()
    load_rate = {v: rate(args.rows, median(s)) for v, s in load_seconds.items()}
    cdc_rate = {k: rate(a["changes"], median(a["seconds"])) for k, a in applied.items()}
    lines = [
        "# Laid-out copies vs the mirror (bench/layouts.py)", "",
        f"Machine: {machine()}. Services: local MariaDB and the chDB endpoint (one statement at a time). "
        f"{args.rows:,} rows; per CDC workload {args.changes:,} row changes in transactions of 1,000 (applied by every "
        f"copy's pipeline, taking turns at going first; {args.lanes} apply lane(s), batch_events "
        f"{args.batch_events:,}). Spark local[2] in the bench's process. Ratios: against the mirror of the same "
        "run.", "",
        "| copy | layout | full load rows/s (median of " + str(args.rounds) + ") | × | "
        + " | ".join(f"CDC {w}: changes/s (median of {args.rounds}) | × | rows written in all" for w in WORKLOADS)
        + " | copy vs source |",
        "|---|---|---|---|" + "---|---|---|" * len(WORKLOADS) + "---|",
    ]
    for variant, layout in LAYOUTS.items():
        row = [variant, f"`{layout}`" if layout else "ORDER BY the key", fmt_rate(load_rate[variant]),
               fmt_ratio(load_rate[variant], load_rate["mirror"])]
        for workload in WORKLOADS:
            row += [fmt_rate(cdc_rate[workload, variant]), fmt_ratio(cdc_rate[workload, variant],
                                                                       cdc_rate[workload, "mirror"]),
                    f"{applied[workload, variant]['written']:,}"]
        lines.append("| " + " | ".join(row + [checks[variant]]) + " |")
    lines += ["", "Load rounds (s): " + "; ".join(f"{v}: " + ", ".join(f"{s:.1f}" for s in load_seconds[v])
                                                  for v in LAYOUTS)]
    print(write_result("layouts", "\n".join(lines) + "\n"))


if __name__ == "__main__":
    main()

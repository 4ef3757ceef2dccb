"""Content bench: full-load rows/s and CDC changes/s of a copy with three transforms and a row
filter (core/content/) against the plain copy, side by side in one run.

    .venv/bin/python -m bench.content [--rows 1000000] [--changes 200000] [--rounds 2]

Two copies of one source table: ``plain`` (every row and value) and ``shaped``: ``email`` hashed
(salted SHA-256), ``phone`` masked but its last 4 characters, ``note`` truncated to 8 characters,
and the rows of ``status <> 'test'`` only (a quarter of the rows are 'test' or 'Test', which the
table's utf8mb4_general_ci makes equal). Per round, in alternating order, a full load into each.
Then per round one change workload in MySQL (updates of ``email`` and ``amount`` in transactions
of 1,000, a tenth of them moving rows in or out of the filter), applied by each copy's pipeline,
first and last in turn (changes/s = the workload's row changes / the apply's seconds). Rows/s
count the source's rows read, whatever the filter keeps; the rows written say what each copy
took. Every copy is then reconciled with checksums.

Services: private MariaDB + chDB endpoint under $BENCH_STATE (default /tmp/airflow-sync-bench-content);
the chDB endpoint runs one statement at a time.
"""

from __future__ import annotations

import argparse
import time

from airflow_sync_provider.core.jobspec import CdcApplySpec, FullLoadSpec, ReconcileSpec
from airflow_sync_provider.core.selection import TableSet
from airflow_sync_provider.core.source.group import one_server
from bench.harness.clients import ch_client, drop_bench_data, mysql, source, target
from bench.harness.env import machine, services, write_result
from bench.harness.measure import fmt_rate, fmt_ratio, interleaved, median, rate, timer

DB, TARGET_DB = "bench_content", "bench_content_ch"
SALT = "bench-salt"
CONTENTS = {"plain": None,
            "shaped": {"transform": {"email": "hash", "phone": "mask(0, 4)", "note": "truncate(8)"},
                       "row_filter": "status <> 'test'"}}


def _source(mysql_url, rows: int) -> None:
    with mysql(mysql_url) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE IF NOT EXISTS {DB}")
        cur.execute(f"DROP TABLE IF EXISTS {DB}.people")
        cur.execute(f"CREATE TABLE {DB}.people (id INT PRIMARY KEY, tenant INT NOT NULL, status VARCHAR(10) NOT NULL,"
                    " email VARCHAR(100), phone VARCHAR(20), note VARCHAR(60), amount DECIMAL(12, 2))"
                    " DEFAULT CHARSET utf8mb4")
        cur.execute(f"INSERT INTO {DB}.people SELECT seq, seq % 50, ELT(1 + seq % 8, 'new', 'paid', 'test', 'sent', "
                    "'done', 'Test', 'held', 'new'), CONCAT('user', seq, '@example.com'), CONCAT('+49 30 ', seq * 7),"
                    f" CONCAT('a note about customer ', seq), seq / 8 FROM {DB}.seq_1_to_{rows}")
        conn.commit()


def _changes(mysql_url, count: int, rows: int) -> int:
    done, step = 0, 1000
    with mysql(mysql_url) as conn, conn.cursor() as cur:
        for start in range(1, rows + 1, step):
            if done >= count:
                break
            if (start // step) % 10 == 0:  # rows move in or out of the filter
                cur.execute(f"UPDATE {DB}.people SET status = IF(status = 'test', 'new', 'test') WHERE id BETWEEN %s "
                            "AND %s", (start, start + step - 1))
            else:
                cur.execute(f"UPDATE {DB}.people SET email = CONCAT('x', email), amount = amount + 1 WHERE id BETWEEN "
                            "%s AND %s", (start, start + step - 1))
            done += cur.rowcount
            conn.commit()
    return done


def _table(variant: str) -> str:
    return f"people_{variant}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--changes", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    from pyspark.sql import SparkSession

    from airflow_sync_provider.spark.cdc_apply import run_cdc_apply
    from airflow_sync_provider.spark.full_load import run_full_load
    from airflow_sync_provider.spark.reconcile import run_reconcile

    spark = SparkSession.builder.master("local[2]").appName("bench-content").getOrCreate()
    with services("content") as (mysql_url, ch_url):
        drop_bench_data(mysql_url, ch_url, source_dbs=[DB], target_dbs=[TARGET_DB])
        _source(mysql_url, args.rows)
        ch = ch_client(ch_url)
        load_seconds: dict = {v: [] for v in CONTENTS}
        keys: dict = {}
        for round_, variant in interleaved(CONTENTS, args.rounds):
            ch.command(f"DROP TABLE IF EXISTS {TARGET_DB}.{_table(variant)}")
            keys[variant] = f"bench.content.{variant}.{time.time_ns()}"
            with timer() as took:
                run_full_load(FullLoadSpec(sources=one_server(source(mysql_url)), target=target(ch_url),
                                           source_database=DB, source_table="people", target_database=TARGET_DB,
                                           target_table=_table(variant), load_key=keys[variant], channels=2,
                                           tableset=TableSet(content=CONTENTS[variant]), hash_salt=SALT), spark)
            load_seconds[variant].append(took["seconds"])
            print(f"round {round_ + 1} load {variant}: {took['seconds']:.1f} s", flush=True)
        pipelines = {}
        for variant in CONTENTS:
            pipelines[variant] = f"bench_content_{variant}_{time.time_ns()}"
            run_cdc_apply(CdcApplySpec(sources=one_server(source(mysql_url)), target=target(ch_url),
                                       pipeline=pipelines[variant], start_from_loads=[keys[variant]],
                                       verify_period=0, hash_salt=SALT), spark)
        applied: dict = {}
        for round_ in range(args.rounds):
            changes = _changes(mysql_url, args.changes, args.rows)
            for variant in list(CONTENTS)[::1 if round_ % 2 == 0 else -1]:  # first and last in turn
                with timer() as took:
                    result = run_cdc_apply(CdcApplySpec(sources=one_server(source(mysql_url)), target=target(ch_url),
                                                        pipeline=pipelines[variant], verify_period=0,
                                                        hash_salt=SALT), spark)
                one = applied.setdefault(variant, {"seconds": [], "changes": 0, "written": 0})
                one["seconds"].append(took["seconds"])
                one["changes"] = changes
                one["written"] += result["rows_written"]
                print(f"round {round_ + 1}: apply {variant}: {result['events']} changes in {took['seconds']:.1f} s",
                      flush=True)
        checks = {}
        for variant in CONTENTS:
            verdict = run_reconcile(ReconcileSpec(sources=one_server(source(mysql_url)), target=target(ch_url),
                                                  load_key=keys[variant], checksum=True, hash_salt=SALT), spark)
            checks[variant] = verdict["verdict"]
        held = {v: int(ch.command(f"SELECT count() FROM {TARGET_DB}.{_table(v)} FINAL")) for v in CONTENTS}
    spark.stop()
    load_rate = {v: rate(args.rows, median(s)) for v, s in load_seconds.items()}
    cdc_rate = {v: rate(a["changes"], median(a["seconds"])) for v, a in applied.items()}
    lines = [
        "# Shaped copies vs the plain copy (bench/content.py)", "",
        f"Machine: {machine()}. Services: local MariaDB and the chDB endpoint (one statement at a time). "
        f"{args.rows:,} source rows; per round {args.changes:,} row changes in transactions of 1,000, a tenth of "
        "them moving rows in or out of the filter (applied by both pipelines, taking turns at going first). Spark "
        "local[2] in the bench's process. Ratios: against the plain copy of the same run.", "",
        f"| copy | content | full load source rows/s (median of {args.rounds}) | × | CDC changes/s (median of "
        f"{args.rounds}) | × | rows written by CDC | rows held | reconcile --checksum |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for variant, content in CONTENTS.items():
        lines.append("| " + " | ".join([
            variant, f"`{content}`" if content else "every row and value", fmt_rate(load_rate[variant]),
            fmt_ratio(load_rate[variant], load_rate["plain"]), fmt_rate(cdc_rate[variant]),
            fmt_ratio(cdc_rate[variant], cdc_rate["plain"]), f"{applied[variant]['written']:,}",
            f"{held[variant]:,}", checks[variant]]) + " |")
    lines += ["", "Load rounds (s): " + "; ".join(f"{v}: " + ", ".join(f"{s:.1f}" for s in load_seconds[v])
                                                  for v in CONTENTS),
              "CDC rounds (s): " + "; ".join(f"{v}: " + ", ".join(f"{s:.1f}" for s in applied[v]["seconds"])
                                             for v in CONTENTS)]
    print(write_result("content", "\n".join(lines) + "\n"))


if __name__ == "__main__":
    main()

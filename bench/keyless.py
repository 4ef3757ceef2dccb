"""Tables without a key bench: CDC changes/s of a keyless table (a multiset copy,
docs/keyless-tables.md) against the same table with a primary key, side by side in one run.

    .venv/bin/python -m bench.keyless [--rows 200000] [--changes 200000] [--rounds 3]

Two source tables of one shape, ``keyed`` (id PRIMARY KEY) and ``keyless`` (no key, an index on
id), each bootstrapped into its own pipeline. Per round the same workload on both (in transactions
of 1,000 rows: a third inserts, a third updates of ``amount``, a third deletes), then each
pipeline applies it, taking turns at going first. Changes/s = the round's row changes / the
apply's seconds; the rows each copy holds (an update of a keyless row writes two) beside it.
Every copy is compared with its source (count and checksum; the multiset by its signs).
Services: private MariaDB + chDB endpoint under $BENCH_STATE; the chDB endpoint runs one statement
at a time.
"""

from __future__ import annotations

import argparse
import time

from airflow_sync_provider.core.jobspec import CdcApplySpec, CdcBootstrapSpec
from airflow_sync_provider.core.selection import TableSet
from airflow_sync_provider.core.source.group import one_server
from bench.harness.clients import ch_client, drop_bench_data, mysql, source, target
from bench.harness.env import machine, services, write_result
from bench.harness.measure import fmt_rate, fmt_ratio, median, rate, timer

DB, TARGET_DB = "bench_keyless", "bench_keyless_ch"
TABLES = {"keyed": "PRIMARY KEY (id)", "keyless": "KEY (id)"}


def _source(mysql_url, rows: int) -> None:
    with mysql(mysql_url) as conn, conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {DB}")
        cur.execute(f"CREATE DATABASE {DB}")
        for table, key in TABLES.items():
            cur.execute(f"CREATE TABLE {DB}.{table} (id INT NOT NULL, tenant INT NOT NULL, status VARCHAR(10), "
                        f"amount DECIMAL(12, 2), note VARCHAR(40), {key}) ENGINE=InnoDB")
            cur.execute(f"INSERT INTO {DB}.{table} SELECT seq, seq % 50, ELT(1 + seq % 3, 'new', 'paid', 'sent'), "
                        f"seq / 8, CONCAT('note ', seq) FROM {DB}.seq_1_to_{rows}")
        conn.commit()


def _workload(mysql_url, changes: int, start: int) -> int:
    done, i = 0, 0
    with mysql(mysql_url) as conn, conn.cursor() as cur:
        while done < changes:
            low = start + (i // 3) * 1000
            for table in TABLES:
                if i % 3 == 0:
                    cur.execute(f"INSERT INTO {DB}.{table} SELECT {low} + seq, 7, 'new', 1, 'added' "
                                f"FROM {DB}.seq_1_to_1000")
                elif i % 3 == 1:
                    cur.execute(f"UPDATE {DB}.{table} SET amount = amount + 1 WHERE id BETWEEN %s AND %s",
                                (low - 1000 + 1, low))
                else:
                    cur.execute(f"DELETE FROM {DB}.{table} WHERE id BETWEEN %s AND %s", (low - 1000 + 1, low - 500))
                rows = cur.rowcount
                conn.commit()
            done += rows
            i += 1
    return done


def _check(ch, mysql_url, table: str) -> str:
    with mysql(mysql_url) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT count(*), sum(CRC32(CONCAT(id, '/', CAST(amount * 100 AS SIGNED)))) FROM {DB}.{table}")
        want = tuple(int(v or 0) for v in cur.fetchone())
    weight = "_sign" if table == "keyless" else "1"
    got = tuple(int(v or 0) for v in ch.query(
        f"SELECT sum({weight}), sum({weight} * CRC32(concat(toString(id), '/', toString(toInt64(amount * 100))))) "
        f"FROM {TARGET_DB}.{table} FINAL WHERE _deleted = 0").result_rows[0])
    return "exact" if got == want else f"DIFFERS {got} != {want}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--changes", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from pyspark.sql import SparkSession

    from airflow_sync_provider.spark.cdc_apply import run_cdc_apply
    from airflow_sync_provider.spark.cdc_bootstrap import run_cdc_bootstrap

    spark = SparkSession.builder.master("local[2]").appName("bench-keyless").getOrCreate()
    with services("keyless") as (mysql_url, ch_url):
        drop_bench_data(mysql_url, ch_url, source_dbs=[DB], target_dbs=[TARGET_DB])
        _source(mysql_url, args.rows)
        ch = ch_client(ch_url)
        src, tgt = one_server(source(mysql_url)), target(ch_url)
        pipelines = {t: f"bench_keyless_{t}_{time.time_ns()}" for t in TABLES}
        for table, pipeline in pipelines.items():
            tables = TableSet(tables=[{"source_database": DB, "source_table": table, "target_database": TARGET_DB}])
            run_cdc_bootstrap(CdcBootstrapSpec(sources=src, target=tgt, pipeline=pipeline, channels=2, tableset=tables),
                              spark)
            run_cdc_apply(CdcApplySpec(sources=src, target=tgt, pipeline=pipeline, verify_period=0), spark)
        seconds: dict = {t: [] for t in TABLES}
        changes = 0
        for round_ in range(args.rounds):
            changes = _workload(mysql_url, args.changes, args.rows + 1 + round_ * 10 * args.changes)
            for table in list(TABLES)[::1 if round_ % 2 == 0 else -1]:
                with timer() as took:
                    result = run_cdc_apply(CdcApplySpec(sources=src, target=tgt, pipeline=pipelines[table],
                                                        verify_period=0), spark)
                seconds[table].append(took["seconds"])
                print(f"round {round_ + 1} {table}: {result['events']:,} changes, {result['rows_written']:,} rows in "
                      f"{took['seconds']:.2f} s", flush=True)
        stored = {t: int(ch.command(f"SELECT count() FROM {TARGET_DB}.{t} FINAL")) for t in TABLES}
        checks = {t: _check(ch, mysql_url, t) for t in TABLES}
    spark.stop()
    rates = {t: rate(changes, median(s)) for t, s in seconds.items()}
    lines = [
        "# Tables without a key: CDC apply rate (bench/keyless.py)", "",
        f"Machine: {machine()}. Services: local MariaDB and the chDB endpoint (one statement at a time). Spark "
        f"local[2] in the bench's process; bounded applies, rolling verification off. {args.rows:,} rows a table; "
        f"per round {changes:,} row changes on each (a third inserts, updates, deletes; 1,000 a transaction).", "",
        "| table | changes/s (median of " + str(args.rounds) + ") | × keyed | rows its copy stores | copy vs source |",
        "|---|---|---|---|---|",
    ]
    for table in TABLES:
        lines.append(f"| {table} | {fmt_rate(rates[table])} | {fmt_ratio(rates[table], rates['keyed'])} | "
                     f"{stored[table]:,} | {checks[table]} |")
    lines += ["", "Rounds (s): " + "; ".join(f"{t}: " + ", ".join(f"{s:.2f}" for s in seconds[t]) for t in TABLES)]
    print(write_result("keyless", "\n".join(lines) + "\n"))


if __name__ == "__main__":
    main()

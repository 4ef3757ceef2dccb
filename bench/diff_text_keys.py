"""Snapshot diff with text keys (CRC32 positions, no index to range over): what a second level
costs against reading the differing first-level buckets whole, side by side in one run.

    .venv/bin/python -m bench.diff_text_keys [--rows 1000000]

A UUID-keyed table, copied once by the full load; per scenario (0.1 % and 1 % of the rows
changed at random) the diff runs in this process three ways: ``SCAN_SHARE`` 0 (every bucket above
LEAF_ROWS is cut: the behaviour before), 0.05 (the default) and 1.0 (differing buckets are
always read, never cut), three times each in rotating order.
"""

from __future__ import annotations

import argparse
import datetime as dt

from airflow_sync_provider.core.jobspec import SnapshotDiffSpec
from airflow_sync_provider.core.source.group import one_server
from airflow_sync_provider.core.verify import pruning
from airflow_sync_provider.spark import diff as diff_job
from bench.harness.clients import mysql, source, target
from bench.harness.env import machine, services, write_result
from bench.harness.jobs import full_load
from bench.harness.measure import fmt_rounds, median, timer

DB, TARGET = "bench_text_keys", "bench_text_keys_ch"
SHARES = (0.0, pruning.SCAN_SHARE, 1.0)
REPEATS = 3


def _diff(source, target, share: float, label: str) -> dict:
    diff_job.SCAN_SHARE = share  # read by _descend when the diff starts
    spec = SnapshotDiffSpec(target=target, old_table=f"{TARGET}.t", sources=one_server(source), source_database=DB,
                            source_table="t", diff_key=f"bench-text-keys-{label}-{share}")
    with timer() as wall:
        result = diff_job.run_snapshot_diff(spec, None)
    return {"wall": wall["seconds"], "levels": result["levels"], "read": result["rows_read_new"],
            "counts": result["counts"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    args = parser.parse_args()
    rows = args.rows
    lines = []
    with services("diff_text_keys") as (mysql_url, clickhouse_url):
        endpoints = source(mysql_url), target(clickhouse_url)
        conn = mysql(endpoints[0])
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {DB}")
            cur.execute(f"CREATE DATABASE {DB}")
            cur.execute(f"CREATE TABLE {DB}.t (id VARCHAR(36) PRIMARY KEY, v INT NOT NULL, s VARCHAR(40) NULL)")
            cur.execute(f"INSERT INTO {DB}.t SELECT UUID(), seq, CONCAT('some text ', seq) FROM {DB}.seq_1_to_{rows}")
        load = full_load(*endpoints, DB, "t", TARGET, "t", load_key=f"{DB}.t", channels=2, in_process=True)
        lines += [f"Copy: {rows:,} rows by the full load in {load['wall']:.1f} s.", "",
                  "| changed at random | SCAN_SHARE | wall s, median (each run) | levels "
                  "| rows read row by row (% of the table) | changed found |", "|---|---|---|---|---|---|"]
        for percent in (0.1, 1.0):
            with conn.cursor() as cur:
                cur.execute(f"UPDATE {DB}.t SET v = -v WHERE v < 0")  # the previous scenario undone
                cur.execute(f"UPDATE {DB}.t SET v = -v WHERE v % {int(100 / percent)} = 7")
                expected = cur.rowcount
            runs: dict = {share: [] for share in SHARES}
            for rep in range(REPEATS):  # in rotating order: the first diff after a change pays for a cold start
                for share in SHARES[rep % len(SHARES):] + SHARES[:rep % len(SHARES)]:
                    runs[share].append(_diff(*endpoints, share, f"{percent}"))
            for share, results in runs.items():
                r = results[0]
                ok = all(x["counts"]["changed"] == expected and not (x["counts"]["new"] or x["counts"]["deleted"])
                         for x in results)
                walls = sorted(x["wall"] for x in results)
                lines.append(f"| {percent} % ({expected:,} rows) | {share} | **{median(walls):.2f}** "
                             f"({fmt_rounds(walls)}) | {r['levels']} | "
                             f"{r['read']:,} ({100 * r['read'] / rows:.2f} %) | "
                             f"{r['counts']['changed']:,}{'' if ok else ' **WRONG**'} |")
                print(lines[-1], flush=True)
        conn.close()
    head = [f"# Snapshot diff with text keys — {dt.date.today()}", "", f"Machine: {machine()}", "",
            f"Reproduce: `.venv/bin/python -m bench.diff_text_keys --rows {rows}`", "",
            "A table `(id VARCHAR(36) PRIMARY KEY, v INT, s VARCHAR(40))` with UUID keys in a private MariaDB "
            "10.11, its copy in the chDB stand-in (**one statement at a time**); each diff runs in this process, "
            "2 channels, after the previous one; each setting 3 times, in rotating order. CRC32 positions: no "
            "index orders them, so a second level scans each shard again on both sides. `SCAN_SHARE` 0 cuts every "
            "differing bucket above 32 rows (before); "
            f"{pruning.SCAN_SHARE} (the default) reads the buckets to cut when they hold at most that share of "
            "the shard's rows; 1.0 always reads them.", ""]
    write_result("diff_text_keys", "\n".join(head + lines) + "\n")


if __name__ == "__main__":
    main()

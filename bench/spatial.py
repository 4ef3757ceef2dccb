"""Spatial bench: full-load rows/s of a table with spatial columns against the same table without
them, and with typed geo columns derived by ClickHouse (core/clickhouse/derived.py), side by side in
one run.

    .venv/bin/python -m bench.spatial [--rows 1000000] [--rounds 3] [--reader auto]

Three copies of one source's rows: ``plain`` (id, tenant, amount, note: the table without spatial
columns), ``spatial`` (the same rows with a POINT and a 5-vertex POLYGON, SRID 4326, copied as
MySQL's SRID + WKB bytes) and ``spatial+geo`` (the same, with ``layout={"geo": ["pos", "area"]}``:
ClickHouse also computes a ``Point`` and a ``Polygon`` from the bytes on every insert). Per round, in
alternating order, a full load of each (its own Spark job in this process, ``local[2]``). rows/s and
source MB/s (InnoDB's average row length × rows); every copy is then compared with its source
(row count and a checksum of the hex of the spatial bytes), and the derived columns with MySQL's
ST_X / ST_Y.

Services: private MariaDB + chDB endpoint under $BENCH_STATE (default /tmp/airflow-sync-bench-spatial);
the chDB endpoint runs one statement at a time.
"""

from __future__ import annotations

import argparse
import time

from airflow_sync_provider.core.jobspec import FullLoadSpec
from airflow_sync_provider.core.selection import TableSet
from airflow_sync_provider.core.source.group import one_server
from bench.harness.clients import ch_client, drop_bench_data, mysql, source, target
from bench.harness.env import machine, services, write_result
from bench.harness.measure import fmt_rate, fmt_ratio, interleaved, median, rate, timer

DB, TARGET_DB = "bench_geo", "bench_geo_ch"
# copy → (source table, layout)
COPIES = {"plain": ("plain", None), "spatial": ("places", None), "spatial+geo": ("places", {"geo": ["pos", "area"]})}
_COLUMNS = ("id INT PRIMARY KEY, tenant INT NOT NULL, amount DECIMAL(12, 2), note VARCHAR(40)")
_VALUES = "seq, seq % 50, seq / 8, CONCAT('note ', seq)"


def _source(mysql_url, rows: int) -> None:
    """``plain`` and ``places``: the same rows, ``places`` with a point and a square around it."""
    x, y = "(seq % 36000) / 100 - 180", "(seq % 17000) / 100 - 85"
    ring = ", ',', ".join(f"{x} + {dx}, ' ', {y} + {dy}" for dx, dy in ((0, 0), (0.01, 0), (0.01, 0.01), (0, 0.01),
                                                                        (0, 0)))
    with mysql(mysql_url) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE IF NOT EXISTS {DB}")
        for table in ("plain", "places"):
            cur.execute(f"DROP TABLE IF EXISTS {DB}.{table}")
        cur.execute(f"CREATE TABLE {DB}.plain ({_COLUMNS})")
        cur.execute(f"INSERT INTO {DB}.plain SELECT {_VALUES} FROM {DB}.seq_1_to_{rows}")
        cur.execute(f"CREATE TABLE {DB}.places ({_COLUMNS}, pos POINT NOT NULL, area POLYGON)")
        cur.execute(f"INSERT INTO {DB}.places SELECT {_VALUES}, ST_GeomFromText(CONCAT('POINT(', {x}, ' ', {y}, ')'), "
                    f"4326), ST_GeomFromText(CONCAT('POLYGON((', {ring}, '))'), 4326) FROM {DB}.seq_1_to_{rows}")
        cur.execute(f"ANALYZE TABLE {DB}.plain, {DB}.places")
        cur.fetchall()
        conn.commit()


def _row_bytes(mysql_url, table: str) -> int:
    with mysql(mysql_url) as conn, conn.cursor() as cur:
        cur.execute("SELECT AVG_ROW_LENGTH FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
                    (DB, table))
        return int(cur.fetchone()[0] or 0)


def _check(ch, mysql_url, copy: str) -> str:
    table, layout = COPIES[copy]
    spatial = table == "places"
    sums = ", SUM(CRC32(HEX(pos))), SUM(CRC32(IFNULL(HEX(area), 'N')))" if spatial else ""
    with mysql(mysql_url) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT COUNT(*), SUM(amount){sums} FROM {DB}.{table}")
        want = tuple(int(v) for v in cur.fetchone())
        if layout:
            cur.execute(f"SELECT SUM(ST_X(pos) * 100 + ST_Y(pos)) FROM {DB}.{table}")
            want += (round(float(cur.fetchone()[0]), 3),)
    ch_sums = ", sum(CRC32(hex(pos))), sum(CRC32(ifNull(hex(area), 'N')))" if spatial else ""
    ch_geo = ", round(sum(pos_geo.1 * 100 + pos_geo.2), 3)" if layout else ""
    got = ch.query(f"SELECT count(), sum(amount){ch_sums}{ch_geo} FROM {TARGET_DB}.{copy.replace('+', '_')} FINAL"
                   ).result_rows[0]
    got = tuple(round(float(v), 3) if isinstance(v, float) else int(v) for v in got)
    return "exact" if got == want else f"DIFFERS {got} != {want}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--channels", type=int, default=2)
    parser.add_argument("--reader", default="auto", choices=("auto", "native", "mysqlclient"))
    args = parser.parse_args()
    from pyspark.sql import SparkSession

    from airflow_sync_provider.spark.full_load import run_full_load

    spark = SparkSession.builder.master("local[2]").appName("bench-spatial").getOrCreate()
    with services("spatial") as (mysql_url, ch_url):
        drop_bench_data(mysql_url, ch_url, source_dbs=[DB], target_dbs=[TARGET_DB])
        _source(mysql_url, args.rows)
        row_bytes = {t: _row_bytes(mysql_url, t) for t in ("plain", "places")}
        ch = ch_client(ch_url)
        seconds: dict = {c: [] for c in COPIES}
        readers: dict = {}
        for round_, copy in interleaved(COPIES, args.rounds):
            table, layout = COPIES[copy]
            name = copy.replace("+", "_")
            ch.command(f"DROP TABLE IF EXISTS {TARGET_DB}.{name}")
            with timer() as took:
                result = run_full_load(FullLoadSpec(sources=one_server(source(mysql_url)), target=target(ch_url),
                                           source_database=DB, source_table=table, target_database=TARGET_DB,
                                           target_table=name, load_key=f"bench.spatial.{name}.{time.time_ns()}",
                                           channels=args.channels, reader=args.reader,
                                           tableset=TableSet(layout=layout)), spark)
            seconds[copy].append(took["seconds"])
            readers[copy] = str(result.get("reader", "")).split(";")[0]
            print(f"round {round_ + 1} load {copy}: {took['seconds']:.1f} s", flush=True)
        checks = {c: _check(ch, mysql_url, c) for c in COPIES}
    spark.stop()
    rows_rate = {c: rate(args.rows, median(s)) for c, s in seconds.items()}
    lines = [
        "# Spatial columns in a full load (bench/spatial.py)", "",
        f"Machine: {machine()}. Services: local MariaDB and the chDB endpoint (one statement at a time). "
        f"{args.rows:,} rows, {args.channels} channel(s), reader {args.reader}; Spark local[2] in the bench's "
        "process. `spatial` adds a POINT and a 5-vertex POLYGON (SRID 4326) to the same rows, copied as MySQL's "
        "SRID + WKB bytes; `spatial+geo` also has ClickHouse derive a `Point` and a `Polygon` from them "
        "(`layout={'geo': ['pos', 'area']}`). Ratios: against `plain` of the same run. Source MB/s: InnoDB's "
        "average row length × rows / seconds.", "",
        f"| copy | source bytes/row | full load rows/s (median of {args.rounds}) | × | source MB/s | copy vs source |",
        "|---|---|---|---|---|---|",
    ]
    for copy, (table, _) in COPIES.items():
        mb = rows_rate[copy] * row_bytes[table] / 1e6 if rows_rate[copy] else None
        lines.append(f"| {copy} | {row_bytes[table]} | {fmt_rate(rows_rate[copy])} | "
                     f"{fmt_ratio(rows_rate[copy], rows_rate['plain'])} | {mb:.1f} | {checks[copy]} |")
    lines += ["", "Readers: " + "; ".join(f"{c}: {r}" for c, r in readers.items())]
    lines += ["", "Load rounds (s): " + "; ".join(f"{c}: " + ", ".join(f"{s:.1f}" for s in seconds[c]) for c in COPIES)]
    print(write_result("spatial", "\n".join(lines) + "\n"))


if __name__ == "__main__":
    main()

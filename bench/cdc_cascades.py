"""Foreign-key cascades bench (spark/cdc_cascades.py), side by side in one run.

    .venv/bin/python -m bench.cdc_cascades [--children 100000] [--changes 200000] [--rounds 3]

1. **A parent key renumbered under N children** (``ON UPDATE CASCADE``): one UPDATE of the
   parent's key; InnoDB rewrites N child rows without a binlog event; the pipeline derives them
   from the copy and writes them. Child rows/s = N / the bounded apply's seconds (the whole run:
   its start, the parent's event, the cascade's query of the copy, the rewrite and the insert),
   and the cascade alone (its share of that run). Renumbered back and forth, ``--rounds`` times.
2. **CDC on tables with foreign keys, no cascade firing**: inserts and updates of children,
   non-key updates of parents (the triggers' derivation looks at every parent event); two
   pipelines over the same binlog range, one following cascades, one not (``follow_cascades=
   False``: today's path), taking turns at going first. Ratio of changes/s.

Every copy is compared with the source (FINAL: count and checksum). Services: private MariaDB +
chDB endpoint under $BENCH_STATE; the chDB endpoint runs one statement at a time.
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

DB = "bench_fk"
COPIES = {"following": "bench_fk_on", "not following": "bench_fk_off"}


def _source(mysql_url, children: int) -> None:
    with mysql(mysql_url) as conn, conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {DB}")
        cur.execute(f"CREATE DATABASE {DB}")
        cur.execute(f"CREATE TABLE {DB}.parent (id INT PRIMARY KEY, name VARCHAR(40)) ENGINE=InnoDB")
        cur.execute(f"CREATE TABLE {DB}.child (id INT PRIMARY KEY, parent_id INT NOT NULL, amount DECIMAL(12, 2), "
                    f"note VARCHAR(40), KEY (parent_id), CONSTRAINT child_parent FOREIGN KEY (parent_id) "
                    f"REFERENCES {DB}.parent (id) ON UPDATE CASCADE ON DELETE CASCADE) ENGINE=InnoDB")
        cur.execute(f"INSERT INTO {DB}.parent SELECT seq, CONCAT('p', seq) FROM {DB}.seq_1_to_1000")
        # the first N children under parent 1 (the renumbered one), the rest spread
        cur.execute(f"INSERT INTO {DB}.child SELECT seq, IF(seq <= {children}, 1, 2 + seq % 999), seq / 8, "
                    f"CONCAT('note ', seq) FROM {DB}.seq_1_to_{children * 2}")
        conn.commit()


def _no_cascades(mysql_url, count: int, start: int) -> int:
    """``count`` row changes in transactions of 1,000: a third child inserts, a third child
    updates, a third non-key parent updates."""
    done, i = 0, 0
    with mysql(mysql_url) as conn, conn.cursor() as cur:
        while done < count:
            kind = i % 3
            if kind == 0:
                cur.execute(f"INSERT INTO {DB}.child SELECT {start} + seq, 2 + seq % 999, 1, 'new' "
                            f"FROM {DB}.seq_1_to_1000")
                start += 1000
            elif kind == 1:
                cur.execute(f"UPDATE {DB}.child SET amount = amount + 1 WHERE id BETWEEN %s AND %s",
                            (1 + (i * 1000) % 100_000, (i * 1000) % 100_000 + 1000))
            else:
                cur.execute(f"UPDATE {DB}.parent SET name = IF(name LIKE '%.', LEFT(name, LENGTH(name) - 1), "
                            "CONCAT(name, '.')) WHERE id <= 1000")
            done += cur.rowcount
            conn.commit()
            i += 1
    return done


def _check(ch, mysql_url, database: str) -> str:
    out = []
    for table, expr in (("parent", "CRC32(CONCAT(id, name))"), ("child", "CRC32(CONCAT(id, '/', parent_id))")):
        with mysql(mysql_url) as conn, conn.cursor() as cur:
            cur.execute(f"SELECT count(*), sum({expr}) FROM {DB}.{table}")
            want = tuple(int(v or 0) for v in cur.fetchone())
        ch_expr = expr.replace("CRC32(CONCAT(", "CRC32(concat(").replace("id, ", "toString(id), ").replace(
            "'/', parent_id", "'/', toString(parent_id)")
        got = tuple(int(v or 0) for v in ch.query(f"SELECT count(), sum({ch_expr}) FROM {database}.{table} FINAL "
                                                  "WHERE _deleted = 0").result_rows[0])
        out.append("exact" if got == want else f"{table} DIFFERS {got} != {want}")
    return "exact" if out == ["exact", "exact"] else "; ".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--children", type=int, default=100_000)
    parser.add_argument("--changes", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from pyspark.sql import SparkSession

    from airflow_sync_provider.spark.cdc_apply import run_cdc_apply
    from airflow_sync_provider.spark.cdc_bootstrap import run_cdc_bootstrap

    spark = SparkSession.builder.master("local[2]").appName("bench-cascades").getOrCreate()
    with services("cascades") as (mysql_url, ch_url):
        drop_bench_data(mysql_url, ch_url, source_dbs=[DB], target_dbs=list(COPIES.values()))
        _source(mysql_url, args.children)
        ch = ch_client(ch_url)
        src, tgt = one_server(source(mysql_url)), target(ch_url)
        pipelines = {}
        for name, database in COPIES.items():
            pipelines[name] = f"bench_fk_{database}_{time.time_ns()}"
            run_cdc_bootstrap(CdcBootstrapSpec(
                sources=src, target=tgt, pipeline=pipelines[name], channels=2,
                tableset=TableSet(tables=[{"source_database": DB, "source_table": t, "target_database": database}
                                          for t in ("parent", "child")])), spark)

        def apply(name: str, **kwargs) -> tuple[dict, float]:
            with timer() as took:
                result = run_cdc_apply(CdcApplySpec(sources=src, target=tgt, pipeline=pipelines[name], verify_period=0,
                                                    follow_cascades=name == "following", **kwargs), spark)
            return result, took["seconds"]

        for name in COPIES:
            apply(name)
        # 1. the renumbered parent
        renumber, cascade_share = [], []
        with mysql(mysql_url) as conn, conn.cursor() as cur:
            for round_ in range(args.rounds):
                old, new = (1, 1_000_000) if round_ % 2 == 0 else (1_000_000, 1)
                cur.execute(f"UPDATE {DB}.parent SET id = %s WHERE id = %s", (new, old))
                conn.commit()
                result, seconds = apply("following")
                assert result["cascaded_rows"] == args.children, result
                renumber.append(seconds)
                cascade_share.append(result["cascade_seconds"])
                apply("not following")
                print(f"round {round_ + 1} renumber: {args.children:,} children in {seconds:.2f} s "
                      f"(cascade {result['cascade_seconds']:.2f} s)", flush=True)
        # 2. no cascade firing
        seconds: dict = {name: [] for name in COPIES}
        changes = 0
        for round_ in range(args.rounds):
            changes = _no_cascades(mysql_url, args.changes, 10_000_000 + round_ * 1_000_000)
            for name in list(COPIES)[::1 if round_ % 2 == 0 else -1]:
                result, took = apply(name)
                seconds[name].append(took)
                print(f"round {round_ + 1} no cascades: {name}: {result['events']:,} changes in {took:.2f} s",
                      flush=True)
        checks = {name: _check(ch, mysql_url, database) for name, database in COPIES.items()}
    spark.stop()
    renumber_rate = rate(args.children, median(renumber))
    cascade_rate = rate(args.children, median(cascade_share))
    cdc = {name: rate(changes, median(s)) for name, s in seconds.items()}
    lines = [
        "# Foreign-key cascades (bench/cdc_cascades.py)", "",
        f"Machine: {machine()}. Services: local MariaDB and the chDB endpoint (one statement at a time). Spark "
        "local[2] in the bench's process; bounded applies, rolling verification off.", "",
        f"## A parent key renumbered under {args.children:,} children (ON UPDATE CASCADE)", "",
        "| what | seconds (median of " + str(args.rounds) + ") | child rows/s |", "|---|---|---|",
        f"| the bounded apply, whole (start, read, cascade, checkpoint) | {median(renumber):.2f} | "
        f"{fmt_rate(renumber_rate)} |",
        f"| the cascade alone (query the copy, derive, insert) | {median(cascade_share):.2f} | "
        f"{fmt_rate(cascade_rate)} |",
        "", "Rounds (s): " + ", ".join(f"{s:.2f}" for s in renumber), "",
        f"## CDC on tables with foreign keys, no cascade firing ({changes:,} changes a round)", "",
        "| pipeline | changes/s (median of " + str(args.rounds) + ") | × | copy vs source |", "|---|---|---|---|",
    ]
    for name in COPIES:
        lines.append(f"| {name} cascades | {fmt_rate(cdc[name])} | {fmt_ratio(cdc[name], cdc['not following'])} | "
                     f"{checks[name]}{' (expected: it missed the renumbers)' if name == 'not following' else ''} |")
    lines += ["", "Rounds (s): " + "; ".join(f"{n}: " + ", ".join(f"{s:.2f}" for s in seconds[n]) for n in COPIES)]
    print(write_result("cdc_cascades", "\n".join(lines) + "\n"))


if __name__ == "__main__":
    main()

"""Full-load bench: end-to-end rows/s of copying the demo ``orders`` table (MariaDB → ClickHouse
endpoint) by our Spark job vs (a) ClickHouse's own ``mysql()`` table function, (b) a do-it-yourself
Spark JDBC job (bench/diy_spark_jdbc.py) and (c) mysql-ch-replicator's initial copy, on the same
data and machine in one run; plus the peak RSS of our job's Python workers at several table sizes.

    .venv/bin/python -m bench.full_load [--rows 10000000] [--rss-rows 1000000,10000000]
    .venv/bin/python -m bench.full_load --tls [--rows 1000000] [--repeat 2]   (plain text vs TLS only)
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import tempfile
import time

from airflow_sync_provider.core.jobspec import FullLoadSpec
from airflow_sync_provider.core.source.group import one_server
from airflow_sync_provider.core.sql import ch_ident, ch_table
from airflow_sync_provider.core.submission import prepare
from bench.harness.clients import ch_client, drop_bench_data, mysql, source, source_stats, target, target_databases
from bench.harness.env import REPO, machine, services, tls_services, write_result
from bench.harness.jobs import fingerprint, full_load, unique_key
from bench.harness.measure import fmt_change, fmt_load, fmt_rate, fmt_ratio, fmt_rounds, interleaved, rate, timer
from bench.harness.peers import MARIADB_JAR, diy_available, diy_submit, initial_copy
from bench.harness.processes import GROUPS, ProcessSampler, target_settle_cpu
from devenv import demo_data

TARGET_DB = "bench_full_load"
TABLE = "orders"
DIY_SCRIPT = REPO / "bench" / "diy_spark_jdbc.py"

# Order-independent content fingerprint of a copy, per column and by value (normalised text), so
# targets whose column types differ (a peer's DECIMAL -> Float64, DATETIME -> DateTime64(3)) still compare.
COLUMNS = {
    "id": "toString(id)",
    "customer_id": "customer_id",
    "amount": "toString(toDecimal128(toString(amount), 2))",
    "discount": "toString(toDecimal128(toString(discount), 2))",
    "created_at": "toString(toDateTime64(created_at, 3, 'UTC'))",
    "shipped_at": "toString(toDateTime64(shipped_at, 3, 'UTC'))",
    "status": "status",
    "note": "note",
    "quantity": "toString(quantity)",
    "weight": "toString(weight)",
}


def cpu_per_million(sampler: ProcessSampler, rows: int) -> dict[str, float]:
    """CPU seconds per million rows by process group (harness GROUPS: the services, Spark's JVM and
    Python workers, the Python driver with every process it started)."""
    by_group = sampler.cpu_by_role()
    return {g: by_group.get(g, 0.0) / rows * 1e6 for g in GROUPS}


# ---------------------------------------------------------------------------------------------
# The paths
# ---------------------------------------------------------------------------------------------

def run_ours(mysql_url, ch_url, db, rows, channels, table=TABLE, reader="auto") -> dict:
    sampler = ProcessSampler()
    run = full_load(mysql_url, ch_url, db, table, TARGET_DB, f"ours_{table}_{rows}", channels=channels, reader=reader,
                    load_key=unique_key(f"bench-full-load-{db}"), during=sampler, expect_rows=rows, count="")
    sampler.settle = target_settle_cpu()
    ch = ch_client(ch_url)
    fp = fingerprint(ch, TARGET_DB, run["table"], COLUMNS) if table == TABLE else None
    ch.close()
    return run | {"name": "ours", "sampler": sampler, "fingerprint": fp}


def empty_like_ours(ch, ours_table: str, table: str) -> None:
    """A plain MergeTree with exactly the column types our load created (minus its _version)."""
    ch.command(f"DROP TABLE IF EXISTS {ch_table(TARGET_DB, table)}")
    ch.command(f"CREATE TABLE {ch_table(TARGET_DB, table)} ENGINE = MergeTree ORDER BY id "
               f"AS SELECT * EXCEPT ({ch_ident('_version')}, {ch_ident('_deleted')})"
               f" FROM {ch_table(TARGET_DB, ours_table)} LIMIT 0")


def checked_copy(ch, table: str, rows: int, fingerprinted: bool, extra: int | None = None) -> dict | None:
    """A peer's copy in TARGET_DB: its count asserted (= ``rows``, and = ``extra`` if given), its
    fingerprint (the orders table's), then dropped."""
    copied = int(ch.command(f"SELECT count() FROM {ch_table(TARGET_DB, table)}"))
    assert copied == rows and extra in (None, rows), (copied, rows, extra)
    fp = fingerprint(ch, TARGET_DB, table, COLUMNS) if fingerprinted else None
    ch.command(f"DROP TABLE {ch_table(TARGET_DB, table)}")
    ch.close()
    return fp


def run_mysql_function(mysql_url, ch_url, db, rows, ours_table, table=TABLE) -> dict:
    my = source(mysql_url)
    ch = ch_client(ch_url)
    copy = f"mysqlfn_{table}_{rows}"
    empty_like_ours(ch, ours_table, copy)
    # The source password is spelled out in this SQL (mysql() takes no other form without a named
    # collection): acceptable for this throwaway local MariaDB only, never for a real source.
    pull = (f"mysql('{my.host}:{my.port}', '{db}', '{table}', '{my.user}', '{my.password}')")
    with ProcessSampler() as sampler, timer() as t:
        ch.command(f"INSERT INTO {ch_table(TARGET_DB, copy)} SELECT * FROM {pull}")
    sampler.settle = target_settle_cpu()
    fp = checked_copy(ch, copy, rows, table == TABLE)
    return {"name": "mysql", "rows": rows, "wall": t["seconds"], "inner": t["seconds"], "sampler": sampler,
            "fingerprint": fp}


def run_diy(mysql_url, ch_url, db, rows, ours_table, lo, hi, table=TABLE) -> dict:
    ch = ch_client(ch_url)
    copy = f"diy_{table}_{rows}"
    empty_like_ours(ch, ours_table, copy)
    with tempfile.TemporaryDirectory(prefix="bench-diy-") as tmp:
        result_path = os.path.join(tmp, "result.json")
        cmd, env = diy_submit(DIY_SCRIPT, mysql_url, ch_url, [
            "--database", db, "--table", table, "--lower", str(lo), "--upper", str(hi), "--partitions", "8",
            "--target-database", TARGET_DB, "--target-table", copy, "--result", result_path])
        with ProcessSampler() as sampler, timer() as wall:
            proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        sampler.settle = target_settle_cpu()
        assert proc.returncode == 0, f"DIY spark-submit exited {proc.returncode}:\n{proc.stdout[-5000:]}"
        with open(result_path) as fh:
            result = json.load(fh)
    fp = checked_copy(ch, copy, rows, table == TABLE, extra=result["rows"])
    return {"name": "diy", "rows": rows, "wall": wall["seconds"], "inner": float(result["seconds"]),
            "sampler": sampler, "fingerprint": fp}


def run_replicator(mysql_url, ch_url, db, rows, threads: int, timeout: float) -> dict:
    target_db = f"bench_mcr_{db}"  # its own database: the replicator RENAMEs <target>_tmp over it
    peer_dbs = (target_db, f"{target_db}_tmp", f"{target_db}_old")
    target_databases(ch_url, drop=peer_dbs)
    with ProcessSampler() as sampler:
        copy = initial_copy(mysql_url, ch_url, db, [TABLE], target_db, timeout, threads=threads)
    if copy["code"] is None:
        target_databases(ch_url, drop=peer_dbs)
        return {"name": "replicator", "rows": rows, "timeout": timeout, "wall": None}
    assert copy["code"] == 0 and "initial replication - done" in copy["output"], \
        f"replicator exited {copy['code']}:\n{copy['output'][-5000:]}"
    ch = ch_client(ch_url)
    copied = int(ch.command(f"SELECT count() FROM {ch_table(target_db, TABLE)} FINAL"))
    assert copied == rows, (copied, rows)
    fp = fingerprint(ch, target_db, TABLE, COLUMNS, final=True)
    ch.close()
    target_databases(ch_url, drop=peer_dbs)
    return {"name": "replicator", "rows": rows, "wall": copy["wall"], "inner": None, "sampler": sampler,
            "fingerprint": fp}


def profile_ours(mysql_url, ch_url, db, rows, channels) -> list[str]:
    """Our job once more under ``perf record`` (every process and thread it starts): where its
    CPU goes, by process/library and by function."""
    perf = shutil.which("perf")
    if perf is None:
        return ["`perf` is not installed (Debian: `apt-get install linux-perf`), so no profile was taken."]
    spec = FullLoadSpec(sources=one_server(source(mysql_url)), target=target(ch_url), source_database=db,
                        source_table=TABLE, target_database=TARGET_DB, target_table=f"profile_{TABLE}_{rows}",
                        channels=channels, load_key=unique_key("bench-profile"))
    with tempfile.TemporaryDirectory(prefix="bench-perf-") as tmp:
        data = os.path.join(tmp, "perf.data")
        cmd, env = prepare(spec, tmp)
        run = subprocess.run([perf, "record", "-F", "499", "-g", "-o", data, "--", *cmd], env={**os.environ, **env},
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if run.returncode != 0:
            return [f"`perf record` failed (exit {run.returncode}): {run.stdout[-300:]}"]

        def report(*sort):
            out = subprocess.run([perf, "report", "-i", data, "--no-children", "--stdio", "-g", "none",
                                  "--percent-limit", "0.7", "--sort", ",".join(sort)],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True).stdout
            return [line.strip() for line in out.splitlines() if line.strip() and not line.startswith("#")]

        lines = ["Our job on the same table under `perf record -F 499 -g` (spark-submit, the JVM, the Python "
                 "driver and every thread they start; samples of CPU time). By process and library:", "", "```"]
        lines += report("comm", "dso")[:14] + ["```", "", "Top functions:", "", "```"]
        lines += [line[:150] for line in report("dso", "sym")[:22]] + ["```"]
    return lines


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------

# ---------------------------------------------------------------------------------------------
# Other table shapes: wide (60 mixed columns) and narrow (3 columns)
# ---------------------------------------------------------------------------------------------

def _wide_columns() -> list[tuple[str, str, str]]:
    """(name, MySQL type, value expression over ``seq``) × 59, plus the id: every family the
    full load maps, about 10% NULLs in the nullable ones."""
    kinds = [
        ("TINYINT", "seq % 127"), ("SMALLINT UNSIGNED", "seq % 65535"), ("MEDIUMINT", "seq % 8000000 - 4000000"),
        ("INT", "seq * 7 % 2000000000"), ("BIGINT UNSIGNED", "seq * 2654435761"), ("DECIMAL(12,2)", "seq / 100"),
        ("DECIMAL(20,6)", "seq * 3.14159"), ("DOUBLE", "seq / 7"), ("FLOAT", "seq / 3"),
        ("DATE", "DATE('2020-01-01') + INTERVAL seq % 3000 DAY"),
        ("DATETIME(3)", "TIMESTAMP('2024-01-01') + INTERVAL seq SECOND + INTERVAL seq % 1000 * 1000 MICROSECOND"),
        ("TIMESTAMP", "TIMESTAMP('2024-01-01') + INTERVAL seq SECOND"), ("VARCHAR(16)", "CONCAT('v', seq % 9999)"),
        ("VARCHAR(64)", "CONCAT('a somewhat longer text value ', seq)"), ("TEXT", "REPEAT(CHAR(97 + seq % 26), 40)"),
        ("ENUM('new','paid','shipped')", "ELT(1 + seq % 3, 'new', 'paid', 'shipped')"), ("TINYINT(1)", "seq % 2"),
    ]
    columns = []
    for i in range(59):
        kind, expr = kinds[i % len(kinds)]
        nullable = i % 3 == 1
        columns.append((f"c{i:02d}", kind + (" NULL" if nullable else " NOT NULL"),
                        f"IF((seq + {i}) % 10 = 0, NULL, {expr})" if nullable else expr))
    return columns


def generate_shape(mysql_url: str, db: str, shape: str, rows: int) -> None:
    """``{db}.{shape}``: the wide or the narrow table, ``rows`` rows, BIGINT primary key ``id``."""
    if shape == "wide":
        columns = _wide_columns()
    else:
        columns = [("n", "INT NOT NULL", "seq * 7 % 1000003"),
                   ("label", "VARCHAR(20) NULL", "IF(seq % 10 = 0, NULL, CONCAT('label-', seq % 100000))")]
    with mysql(mysql_url) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE IF NOT EXISTS `{db}`")
        cur.execute(f"DROP TABLE IF EXISTS `{db}`.`{shape}`")
        cur.execute(f"CREATE TABLE `{db}`.`{shape}` (id BIGINT PRIMARY KEY, "
                    + ", ".join(f"{name} {kind}" for name, kind, _ in columns) + ")")
        for start in range(0, rows, 1_000_000):  # one transaction per million rows
            n = min(1_000_000, rows - start)
            cur.execute(f"INSERT INTO `{db}`.`{shape}` SELECT seq + {start}, "
                        + ", ".join(expr.replace("seq", f"CAST(seq + {start} AS SIGNED)") for _, _, expr in columns)
                        + f" FROM `{db}`.seq_1_to_{n}")


def run_shape(mysql_url, ch_url, db, shape, rows, channels) -> dict:
    """Ours, mysql() and DIY on one table shape."""
    count, lo, hi = source_stats(mysql_url, db, shape)
    assert count == rows, (shape, count, rows)
    ours = run_ours(mysql_url, ch_url, db, rows, channels, table=shape)
    print(f"{shape}: ours {ours['wall']:.1f} s wall, {ours['inner']:.1f} s job", flush=True)
    mysqlfn = run_mysql_function(mysql_url, ch_url, db, rows, ours["table"], table=shape)
    print(f"{shape}: mysql() {mysqlfn['wall']:.1f} s", flush=True)
    diy = run_diy(mysql_url, ch_url, db, rows, ours["table"], lo, hi, table=shape)
    print(f"{shape}: DIY {diy['wall']:.1f} s wall, {diy['inner']:.1f} s in-script", flush=True)
    return {"shape": shape, "rows": rows, "ours": ours, "mysql": mysqlfn, "diy": diy}


# the TLS comparison's variants: (name, source over TLS, target over HTTPS, reader)
TLS_VARIANTS = (("plain text, Arrow-native reader (connectorx; the default)", False, False, "auto"),
                ("plain text, mysqlclient reader", False, False, "mysqlclient"),
                ("TLS source (VERIFY_IDENTITY), mysqlclient (what auto picks)", True, False, "auto"),
                ("TLS source + HTTPS target (mutual TLS)", True, True, "auto"))


def tls_comparison(args) -> None:
    """``--tls``: our full load over plain text and over TLS side by side in one run, on one server
    that takes both (bench/harness tls_services), ``--repeat`` rounds of every variant interleaved;
    the best of each is reported (the machine is shared). Writes bench/results/full_load_tls.md."""
    load_start, started = os.getloadavg(), time.monotonic()
    runs = {name: [] for name, *_ in TLS_VARIANTS}
    with tls_services("fullload-tls") as (plain, tls, http, https):
        db = f"bench_fl_tls_{args.rows}"
        with timer() as gen:
            counts = demo_data.generate(plain, db, orders=args.rows, customers=10_000, item_orders=10)
        assert counts["orders"] == args.rows, counts
        print(f"generated {db}.orders: {args.rows:,} rows in {gen['seconds']:.1f} s", flush=True)
        for url in (http, https):
            target_databases(url, create=[TARGET_DB])
        for round_, (name, source_tls, target_tls, reader) in interleaved(TLS_VARIANTS, args.repeat):
            run = run_ours(tls if source_tls else plain, https if target_tls else http, db, args.rows,
                           args.channels, reader=reader)
            runs[name].append(run)
            print(f"round {round_ + 1}, {name}: {run['inner']:.2f} s job ({run['reader'][:60]})", flush=True)
    load_end = os.getloadavg()
    best = {name: min(r["inner"] for r in rs) for name, rs in runs.items()}
    (native, text, tls_text, tls_both) = (best[name] for name, *_ in TLS_VARIANTS)
    lines = [f"# Full load over TLS vs plain text — {dt.date.today()}", "", f"Machine: {machine()}", "",
             f"`python -m bench.full_load --tls --rows {args.rows} --repeat {args.repeat}`: the demo `orders` table "
             f"({args.rows:,} rows), our full load (`spark_submit(FullLoadSpec)`, {args.channels} channels, local "
             "driver) from one MariaDB that takes TLS and plain connections alike (its certificate signed by "
             "devenv/certs.py's CA; TLS 1.3, the server's default cipher) into the chDB stand-in over HTTP, or a "
             "second one over HTTPS with mutual TLS. Variants interleaved (every other round in reverse order), "
             f"{args.repeat} round(s); rows/s from the job's own seconds (no spark-submit start-up), best round.",
             "", f"Load average (1/5/15 min) at start {fmt_load(load_start)}, at end {fmt_load(load_end)}; "
             f"{(time.monotonic() - started) / 60:.1f} min in all (the machine is shared with other jobs).", "",
             "| variant | reader | job s (each round) | rows/s (best) | vs plain, same reader | vs the plain default |",
             "|---|---|---|---|---|---|"]
    for name, source_tls, _, reader in TLS_VARIANTS:
        same = text if source_tls or reader == "mysqlclient" else native
        rounds = fmt_rounds((r["inner"] for r in runs[name]), sep=" / ")
        lines.append(f"| {name} | {runs[name][0]['reader'].split(';')[0][:40]} | {rounds} | "
                     f"{fmt_rate(rate(args.rows, best[name]))} | {fmt_change(same, best[name])} | "
                     f"{fmt_change(native, best[name])} |")
    lines += ["", f"TLS's own cost on rows/s (the text reader, plain → TLS source): {fmt_change(text, tls_text)}; "
              f"with the HTTPS target too: {fmt_change(text, tls_both)}. What a TLS source costs against the plain "
              f"default, which reads with connectorx (it has no TLS, core/tls.py): {fmt_change(native, tls_text)}."]
    write_result("full_load_tls", "\n".join(lines) + "\n")


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--tls", action="store_true",
                        help="only the TLS comparison: ours over plain text and over TLS, side by side")
    parser.add_argument("--repeat", type=int, default=2, help="rounds of the TLS comparison's variants")
    parser.add_argument("--rss-rows", default="1000000,10000000",
                        help="comma-separated sizes at which to report our workers' peak RSS")
    parser.add_argument("--channels", type=int, default=2)
    parser.add_argument("--replicator-threads", type=int, default=2)
    parser.add_argument("--replicator-cap", type=float, default=900.0,
                        help="seconds: if mysql-ch-replicator would take longer at --rows, report it at a smaller size")
    parser.add_argument("--keep", action="store_true", help="keep the bench databases afterwards")
    parser.add_argument("--skip-replicator", action="store_true", help="leave mysql-ch-replicator out")
    parser.add_argument("--shapes", default="wide,narrow", help="other table shapes to run ('' for none)")
    parser.add_argument("--wide-rows", type=int, default=1_000_000)
    parser.add_argument("--narrow-rows", type=int, default=10_000_000)
    parser.add_argument("--small-rows", type=int, default=10_000, help="the fixed-cost table's size")
    parser.add_argument("--no-profile", dest="profile", action="store_false",
                        help="skip the perf profile of our job (taken when `perf` is installed)")
    args = parser.parse_args(argv)
    if args.tls:
        tls_comparison(args)
        return
    if not diy_available():
        raise SystemExit(f"the DIY Spark JDBC path needs {MARIADB_JAR} (Debian: apt-get install libmariadb-java)")
    rss_rows = sorted({int(x) for x in args.rss_rows.split(",") if x.strip()})
    sizes = sorted(set(rss_rows) | {args.rows})
    load_start = os.getloadavg()
    started = time.monotonic()

    with services("fullload") as (mysql_url, ch_url):
        gen_seconds, dbs = {}, {}
        for size in sizes:
            db = dbs[size] = f"bench_fl_{size}"
            with timer() as gen:
                counts = demo_data.generate(mysql_url, db, orders=size, customers=10_000, item_orders=10)
            assert counts["orders"] == size, counts
            gen_seconds[size] = gen["seconds"]
            print(f"generated {db}.orders: {size:,} rows in {gen['seconds']:.1f} s", flush=True)
        target_databases(ch_url, create=[TARGET_DB])

        rows, db = args.rows, dbs[args.rows]
        count, lo, hi = source_stats(mysql_url, db, TABLE)
        assert count == rows, (count, rows)
        ours_by_size = {}
        ours = ours_by_size[rows] = run_ours(mysql_url, ch_url, db, rows, args.channels)
        print(f"ours: {ours['wall']:.1f} s wall, {ours['inner']:.1f} s job", flush=True)
        mysqlfn = run_mysql_function(mysql_url, ch_url, db, rows, ours["table"])
        print(f"mysql(): {mysqlfn['wall']:.1f} s", flush=True)
        diy = run_diy(mysql_url, ch_url, db, rows, ours["table"], lo, hi)
        print(f"DIY Spark JDBC: {diy['wall']:.1f} s wall, {diy['inner']:.1f} s in-script", flush=True)
        for size in rss_rows:
            if size not in ours_by_size:
                ours_by_size[size] = run_ours(mysql_url, ch_url, dbs[size], size, args.channels)
                print(f"ours at {size:,}: {ours_by_size[size]['wall']:.1f} s wall", flush=True)

        # mysql-ch-replicator: probe at the smallest size first when --rows is larger, and run at
        # --rows only if that projects under the cap.
        # fixed cost: a small copy of orders
        with mysql(mysql_url) as conn, conn.cursor() as cur:
            cur.execute(f"CREATE OR REPLACE TABLE `{db}`.orders_small LIKE `{db}`.orders")
            cur.execute(f"INSERT INTO `{db}`.orders_small SELECT * FROM `{db}`.orders WHERE id <= {args.small_rows}")
            cur.execute(f"ANALYZE TABLE `{db}`.orders_small")
        small_run = run_ours(mysql_url, ch_url, db, args.small_rows, args.channels, table="orders_small")
        print(f"ours at {args.small_rows:,} rows: {small_run['inner']:.2f} s job", flush=True)
        shapes = []
        for shape in [x for x in args.shapes.split(",") if x.strip()]:
            shape_rows = args.wide_rows if shape == "wide" else args.narrow_rows
            with timer() as gen:
                generate_shape(mysql_url, "bench_fl_shapes", shape, shape_rows)
            print(f"generated {shape}: {shape_rows:,} rows in {gen['seconds']:.1f} s", flush=True)
            shapes.append(run_shape(mysql_url, ch_url, "bench_fl_shapes", shape, shape_rows, args.channels))
        dbs["shapes"] = "bench_fl_shapes"

        profile = profile_ours(mysql_url, ch_url, db, rows, args.channels) if args.profile else []

        replicator_runs = []
        small = sizes[0]
        if args.skip_replicator:
            projected = None
        elif small < rows:
            probe = run_replicator(mysql_url, ch_url, dbs[small], small, args.replicator_threads, args.replicator_cap)
            replicator_runs.append(probe)
            print(f"replicator at {small:,}: {probe['wall']} s", flush=True)
            projected = probe["wall"] * rows / small if probe.get("wall") else float("inf")
            if projected <= args.replicator_cap:
                replicator_runs.append(run_replicator(mysql_url, ch_url, db, rows, args.replicator_threads,
                                                      args.replicator_cap * 1.5))
            else:
                print(f"replicator projected {projected:.0f} s at {rows:,} rows > cap {args.replicator_cap:.0f} s: "
                      f"reporting it at {small:,} rows", flush=True)
        else:
            projected = None
            replicator_runs.append(run_replicator(mysql_url, ch_url, db, rows, args.replicator_threads,
                                                  args.replicator_cap))
        replicator = next((r for r in reversed(replicator_runs) if r.get("wall")), None)

        if not args.keep:
            drop_bench_data(mysql_url, ch_url, source_dbs=dbs.values(), target_dbs=[TARGET_DB])

    load_end = os.getloadavg()
    total = time.monotonic() - started
    lines = report(args, rows, ours, mysqlfn, diy, replicator, replicator_runs, projected, ours_by_size,
                   rss_rows, gen_seconds, load_start, load_end, total)
    lines[3:3] = report_goals(rows, ours, mysqlfn, diy, ours_by_size, small_run, shapes)
    if profile:
        lines += ["", f"## Profile: our job at {rows:,} rows", "", *profile]
    write_result("full_load", "\n".join(lines) + "\n")


def report_goals(rows, ours, mysqlfn, diy, ours_by_size, small_run, shapes) -> list[str]:
    """Issue 14's numbers first: ratios per shape, CPU per process group, the fixed cost."""
    out = ["## Against the goals (issue 14)", "",
           "Rates are rows/s; *in-job* is the job's own time (spark-submit and JVM start-up excluded; for "
           "ours also the wait for the SparkContext that did not overlap planning, shown as `spark_start`). "
           "`mysql()` has no start-up: its wall is its in-job.", "",
           "| table | rows | ours wall s | ours in-job s | mysql() s | DIY wall s | DIY in-script s | ours ÷ mysql() "
           "(in-job) | ours ÷ DIY (wall / in-job) | our phases s | reader |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]

    def job(run):  # in-job without the non-overlapped SparkContext start
        return run["inner"] - run.get("phases", {}).get("spark_start", 0.0)

    runs = [("orders", rows, ours, mysqlfn, diy)] + [(x["shape"], x["rows"], x["ours"], x["mysql"], x["diy"])
                                                   for x in shapes]
    if 1_000_000 in ours_by_size and rows != 1_000_000:
        runs.insert(1, ("orders", 1_000_000, ours_by_size[1_000_000], None, None))
    for name, n, o, m, d in runs:
        phases = ", ".join(f"{k} {v:.1f}" for k, v in o.get("phases", {}).items())
        out.append(f"| {name} | {n:,} | {o['wall']:.1f} | {job(o):.1f} | {m['wall']:.1f} | " if m else
                   f"| {name} | {n:,} | {o['wall']:.1f} | {job(o):.1f} | — | ")
        out[-1] += (f"{d['wall']:.1f} | {d['inner']:.1f} | " if d else "— | — | ")
        out[-1] += (f"{fmt_ratio(m['wall'], job(o)) if m else '—'} | "
                    f"{fmt_ratio(d['wall'], o['wall']) + ' / ' + fmt_ratio(d['inner'], job(o)) if d else '—'} | "
                    f"{phases} | {o.get('reader', '').split(';')[0]} |")
    out += ["", f"Fixed cost: {small_run['rows']:,}-row copy of orders: in-job {small_run['inner']:.2f} s "
            f"({', '.join(f'{k} {v:.2f}' for k, v in small_run.get('phases', {}).items())}), wall "
            f"{small_run['wall']:.1f} s; in-job ÷ the 1,000,000-row load's: "
            + (fmt_ratio(small_run["inner"], ours_by_size[1_000_000]["inner"]) if 1_000_000 in ours_by_size else "—")
            + " (goal ≤ 0.1×).", ""]
    out += ["### CPU seconds per million rows, by process group", "",
            "Sampled from /proc every 0.2 s during each path (bench/harness/processes.py: a process's CPU counts "
            "from its first sample, one started meanwhile whole, up to its end — what its parent reaped of it "
            "included; MariaDB and the ClickHouse endpoint: this bench's own). *Afterwards*: the ClickHouse "
            "endpoint's CPU from the path's end "
            "until it is idle (background merges of what the path wrote), counted in the second total.", "",
            "| table | path | " + " | ".join(GROUPS)
            + " | total | ÷ mysql() | afterwards | total with it | ÷ mysql() |",
            "|---|---|" + "---|" * (len(GROUPS) + 5)]

    def after(run, n):
        settle = run["sampler"].settle
        return settle / n * 1e6 if settle is not None else 0.0

    for name, n, o, m, d in runs:
        if m is None:
            continue
        base = sum(cpu_per_million(m["sampler"], n).values())
        base_after = base + after(m, n)
        for label, run in (("ours", o), ("mysql()", m), ("DIY", d)):
            if run is None:
                continue
            cpu = cpu_per_million(run["sampler"], n)
            total = sum(cpu.values())
            later = after(run, n)
            out.append(f"| {name} | {label} | " + " | ".join(f"{cpu[g]:.2f}" for g in GROUPS)
                       + f" | {total:.2f} | {fmt_ratio(total, base)} | {later:.2f} | {total + later:.2f} | "
                       f"{fmt_ratio(total + later, base_after)} |")
    return out + [""]


def report(args, rows, ours, mysqlfn, diy, replicator, replicator_runs, projected, ours_by_size, rss_rows,
           gen_seconds, load_start, load_end, total) -> list[str]:
    ours_wall, ours_job = rate(rows, ours["wall"]), rate(rows, ours["inner"])

    def fp_mark(run):
        fp = run.get("fingerprint")
        if not fp:
            return "—"
        if "error" in fp:
            return f"n/a ({fp['error'][:80]})"
        ref = ours_by_size.get(run["rows"], {}).get("fingerprint")
        if not ref or "error" in ref:
            return "—"
        differ = [c for c in COLUMNS if fp["columns"][c] != ref["columns"][c]]
        types = [f"{c} {ref['types'].get(c)}→{fp['types'].get(c)}" for c in COLUMNS
                 if fp["types"].get(c) != ref["types"].get(c)]
        text = "= ours" if not differ else "values differ in " + ", ".join(f"`{c}`" for c in differ)
        return text + (f"; types differ: {', '.join(types)}" if types else "")

    lines = [f"# Full-load bench — {dt.date.today()}", "", f"Machine: {machine()}", "",
             f"Source: the demo `orders` table (devenv/demo_data.py: BIGINT PK + VARCHAR, DECIMAL(12,2), nullable "
             f"DECIMAL(5,2), DATETIME(3), nullable DATETIME, VARCHAR(16), nullable VARCHAR(255), INT UNSIGNED, "
             f"nullable DOUBLE) in a local MariaDB; generated in {gen_seconds[rows]:.0f} s at {rows:,} rows. "
             "Target: the local ClickHouse-HTTP endpoint (devenv/clickhouse_http.py: chDB "
             "in one process, statements one at a time — a stand-in, not a ClickHouse server). "
             "Every path ran once, in the order listed, on the same table in the same run; every target was "
             "counted and asserted equal to the source's row count.", "",
             f"Load average (1/5/15 min) at start: {fmt_load(load_start)}, at end: {fmt_load(load_end)}; whole bench "
             f"{total / 60:.1f} min. "
             "The last column shows, per path, the 1-min load average before→after and the CPU that processes "
             "other than this bench's used meanwhile (cores, average; 2 cores in all).", "",
             f"## {rows:,} rows", "",
             "| path | rows | wall s | rows/s (wall) | in-job s | rows/s (in-job) | ours ÷ this (wall / in-job) "
             "| content | load avg / other CPU |",
             "|---|---|---|---|---|---|---|---|---|"]

    def row(label, run, ratio_wall, ratio_inner, compare=True):
        s = run.get("sampler")
        lines.append(
            f"| {label} | {run['rows']:,} | {run['wall']:.1f} | {fmt_rate(rate(run['rows'], run['wall']))} | "
            + (f"{run['inner']:.1f} | {fmt_rate(rate(run['rows'], run['inner']))}" if run.get("inner") else "— | —")
            + f" | {ratio_wall} / {ratio_inner} | {fp_mark(run) if compare else 'reference'} | "
            + (s.contention() if s else "—") + " |")

    row("**ours**: `spark_submit(FullLoadSpec(channels=2))`", ours, "1.00×", "1.00×", compare=False)
    m_rate = rate(rows, mysqlfn["wall"])
    row("(a) ClickHouse `INSERT … SELECT FROM mysql()`", mysqlfn, fmt_ratio(ours_wall, m_rate),
        fmt_ratio(ours_job, m_rate))
    row("(b) DIY Spark: `spark.read.jdbc` + clickhouse-connect `insert_arrow`", diy,
        fmt_ratio(ours_wall, rate(rows, diy["wall"])), fmt_ratio(ours_job, rate(rows, diy["inner"])))
    rep_note = ""
    for run in replicator_runs:
        if not run.get("wall"):
            lines.append(f"| (c) mysql-ch-replicator initial copy | {run['rows']:,} | > {run['timeout']:.0f} "
                         "(stopped) | — | — | — | — | — | — |")
            continue
        base = ours_by_size.get(run["rows"])
        if base is None:
            ratio_w = "—"
        else:
            ratio_w = fmt_ratio(rate(base["rows"], base["wall"]), rate(run["rows"], run["wall"]))
            if run["rows"] != rows:
                ratio_w += f" (vs ours at {run['rows']:,})"
        row(f"(c) mysql-ch-replicator initial copy, {args.replicator_threads} workers", run, ratio_w, "—")
    if replicator and replicator["rows"] != rows:
        rep_note = (f" mysql-ch-replicator was probed at {replicator['rows']:,} rows: {replicator['wall']:.0f} s → "
                    f"≈{projected / 60:.0f} min projected at {rows:,} rows, over the "
                    f"{args.replicator_cap / 60:.0f}-min cap, so it is reported at {replicator['rows']:,} rows and "
                    "compared with ours at that size.")

    rep_ratio = "—"
    if replicator:
        base = ours_by_size.get(replicator["rows"])
        rep_ratio = fmt_ratio(rate(base["rows"], base["wall"]), rate(replicator["rows"], replicator["wall"]))
        if replicator["rows"] != rows:
            rep_ratio += f" (at {replicator['rows']:,} rows)"
    lines += ["", f"Ratios of rows/s, ours ÷ other (> 1 = ours faster), wall vs wall: "
                  f"**÷ (a) {fmt_ratio(ours_wall, m_rate)}**, "
                  f"**÷ (b) {fmt_ratio(ours_wall, rate(rows, diy['wall']))}**, "
                  f"**÷ (c) {rep_ratio}**; on in-job time (start-up excluded): ÷ (a) {fmt_ratio(ours_job, m_rate)}, "
                  f"÷ (b) {fmt_ratio(ours_job, rate(rows, diy['inner']))}."]
    samplers = [r["sampler"] for r in [ours, mysqlfn, diy, *replicator_runs, *ours_by_size.values()]
                if r.get("sampler")]
    timed = [x.foreign_cores for x in samplers if x.seconds >= 2] or [x.foreign_cores for x in samplers]
    if max(timed) > 0.25:
        lines += ["", f"**Contention:** other processes on this 2-core machine (other work running alongside the "
                      f"bench) used {min(timed):.2f}–{max(timed):.2f} cores on average during the individual paths "
                      "(last column), so paths ran with less than the machine's 2 cores to themselves; absolute "
                      "numbers are pessimistic and noisy (each path ran once), and ratios between paths that ran "
                      "under different contention are approximate."]
    shard_seconds = sum(float(x.get("seconds") or 0) for x in ours.get("per_shard", []))
    if shard_seconds:
        busy = shard_seconds / ours["channels"]
        lines += ["", f"Where our {ours['wall']:.1f} s went: ≈{ours['wall'] - ours['inner']:.1f} s spark-submit/JVM "
                      f"start-up and shutdown (wall − in-job); ≈{busy:.1f} s reading and writing shards (Σ per-shard "
                      f"seconds {shard_seconds:.1f} ÷ {ours['channels']} channels: {rows / busy:,.0f} rows/s while "
                      f"copying); ≈{ours['inner'] - busy:.1f} s the rest of the job (ledger, planning, the reader "
                      "probe, the SparkContext start not hidden behind planning, count check, swap)."]
    goal_a = ours_wall / m_rate if m_rate else 0
    goal_a_job = ours_job / m_rate if m_rate else 0
    diy_wall_ratio = ours_wall / rate(rows, diy["wall"])
    diy_job_ratio = ours_job / rate(rows, diy["inner"])
    lines += ["", "### Against the goals", "",
              f"* ours ≥ 0.5× (a) `mysql()`: **{goal_a:.2f}×** end-to-end wall (spark-submit start-up included, "
              f"mysql() has none) — {'met' if goal_a >= 0.5 else 'NOT met'}; {goal_a_job:.2f}× on the job's own "
              f"time — {'met' if goal_a_job >= 0.5 else 'NOT met'}.",
              f"* ours ≥ 1.2× (b) DIY Spark JDBC: **{diy_wall_ratio:.2f}×** wall vs wall (both include spark-submit "
              f"start-up) — {'met' if diy_wall_ratio >= 1.2 else 'NOT met'}; {diy_job_ratio:.2f}× in-job vs in-script "
              f"— {'met' if diy_job_ratio >= 1.2 else 'NOT met'}."]
    if replicator:
        base = ours_by_size.get(replicator["rows"])
        lines.append("* vs (c) mysql-ch-replicator: "
                     f"{rate(base['rows'], base['wall']) / rate(replicator['rows'], replicator['wall']):.2f}× "
                     f"(wall vs wall at {replicator['rows']:,} rows; no goal set).{rep_note}")

    lines += ["", "## Peak RSS of our job's Python workers", "",
              "Sampled every 0.2 s from /proc/PID/status VmRSS over every process below this bench that runs "
              "`python -m pyspark.daemon`: the daemon itself and the workers it forks (one per running task; "
              "a forked worker's RSS includes pages it still shares with the daemon). Also the Spark JVM "
              "(local[2]: driver and executors in one JVM) and the job's Python driver. On local[2] our "
              "channels run as threads of the Python driver (no pyspark workers: 0 below), so the driver's "
              "column is where a channel's memory shows.", "",
              "| rows | wall s | rows/s (wall) | max RSS per worker MiB | workers seen | max Σ live workers MiB "
              "| daemon MiB | JVM MiB | Python driver MiB |", "|---|---|---|---|---|---|---|---|---|"]
    for size in rss_rows:
        run = ours_by_size[size]
        s = run["sampler"]
        lines.append(f"| {size:,} | {run['wall']:.1f} | {fmt_rate(rate(size, run['wall']))} | "
                     f"{s.worker_peak_mib:.0f} | {len(s.worker_max)} | {s.workers_sum_max / 1024:.0f} | "
                     f"{s.daemon_max / 1024:.0f} | "
                     f"{s.jvm_max / 1024:.0f} | {s.driver_max / 1024:.0f} |")
    if len(rss_rows) > 1:
        a, b = ours_by_size[rss_rows[0]]["sampler"], ours_by_size[rss_rows[-1]]["sampler"]
        lines += ["", f"Per-worker peak at {rss_rows[-1]:,} rows ÷ at {rss_rows[0]:,} rows: "
                      f"**{b.worker_peak_mib / a.worker_peak_mib:.2f}×** "
                      f"({rss_rows[-1] // rss_rows[0]}× the rows)." if a.worker_peak_mib else ""]
    mysql_fp = mysqlfn.get("fingerprint", {})
    ref_fp = ours.get("fingerprint", {})
    if "columns" in mysql_fp and "columns" in ref_fp and mysql_fp["columns"]["weight"] != ref_fp["columns"]["weight"]:
        lines += ["", "**`mysql()` and DOUBLE:** the `weight` (DOUBLE) values that ClickHouse's `mysql()` wrote differ "
                      "from ours in the last bit for some rows (e.g. id 1: ours 0.333333333, mysql() "
                      "0.33333333300000006). Checked while writing this bench: MariaDB says the stored value is the "
                      "double nearest 0.333333333 (`weight = 0.333333333e0` is true for id 1), so ours (and the DIY "
                      "JDBC copy) are exact and mysql() is 1 ulp off; `SETTINGS precise_float_parsing = 1` does not "
                      "change that."]
    s = diy["sampler"]
    lines += ["", f"For reference, the DIY Spark job's Python workers (mapInArrow, {rows:,} rows) peaked at "
                  f"{s.worker_peak_mib:.0f} MiB per worker, JVM {s.jvm_max / 1024:.0f} MiB."]

    lines += ["", "## What each path includes", "",
              f"* **ours** — `spark_submit(FullLoadSpec(channels={args.channels}, load_key=<unique>))`, "
              f"`local[2]`, strategy {ours['strategy']}, {ours['shards']} shards. *Wall*: from the call to its "
              "return: spark-submit and JVM start-up, the package zip, the ledger, planning (balanced: sampling the "
              "key; the SparkContext starts meanwhile), the reader probe, reading each shard's pieces (about 4 MiB "
              "each) with connectorx (binary protocol) into Arrow batches with value checks, streaming them into a "
              "few large inserts (up to 1M rows each, `FORMAT ArrowStream`, LZ4) straight into a working table of "
              "the final layout, the count check and the atomic swap, and JVM shutdown. *In-job*: the job's own "
              "`seconds` (from the job function's start to its return: everything above except spark-submit/JVM "
              "start-up and shutdown). "
              "Not included: the bench's own `count()` on the target.",
              "* **(a) `mysql()`** — one `INSERT INTO t SELECT * FROM mysql('host:port', db, 'orders', user, "
              "password)` through clickhouse-connect into a plain MergeTree with our load's column types "
              "(created empty beforehand, not timed). Timed: that one statement; ClickHouse reads over one MySQL "
              "connection in C++, inside the endpoint's process, and writes in large blocks. No start-up, no shards, "
              "no ledger, no atomic swap, no value checks.",
              "* **(b) DIY Spark** — bench/diy_spark_jdbc.py via `spark-submit --master local[2] --jars "
              "mariadb-java-client.jar`: `spark.read.jdbc(column='id', lowerBound=min, upperBound=max, "
              "numPartitions=8, fetchsize=10000)` with MariaDB Connector/J, then `mapInArrow` sending each Arrow "
              "batch (≤65,536 rows) with `client.insert_arrow` into a pre-created plain MergeTree (our column types; "
              "not timed). *Wall*: the spark-submit process, start-up and shutdown included. *In-script*: after the "
              "SparkSession is up until the last write returned. No ledger, retries, atomic publish or value checks.",
              "* **(c) mysql-ch-replicator 0.1.16** (own venv) — "
              "`mysql_ch_replicator db_replicator --initial_only=True` "
              f"with `initial_replication_threads: {args.replicator_threads}` (worker processes, each reading the "
              "table in PK order with a CRC32 filter, batches of 50,000 rows with pymysql) into its own "
              "ReplacingMergeTree in a separate database, then its RENAME swap. *Wall*: the whole process "
              "(Python start-up included). Its row count is checked with `FINAL`.",
              "* **content**: per column, an order-independent fingerprint (`sum(cityHash64(value as normalised "
              "text))`: DECIMALs as Decimal128 text, datetimes as DateTime64(3, 'UTC') text) and `count()` of each "
              "target, compared with our load's target of the same size; columns whose values or types differ are "
              "named. Reported, not asserted (the row count is asserted).",
              "* The ClickHouse side is the chDB stand-in in one process that runs one statement at a time: every "
              "path's inserts were serialised there in the same way, so relative numbers are meaningful; absolute "
              "numbers against a real ClickHouse server would differ.",
              "* 2-core machine: the source (MariaDB), the target (chDB endpoint) and the copier all share it; "
              "numbers come from a machine that may be shared with other work — see the load average / other-CPU "
              "column."]
    return lines


if __name__ == "__main__":
    main()

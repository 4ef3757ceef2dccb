"""Whole-database bench (issue 25): a 200-table MariaDB database copied into ClickHouse by one job
of ours (full load, then reconciliation with checksums, both by pattern) vs mysql-ch-replicator's
initial copy of the same database, in one run; then the fixed cost of a small table.

* The database: ``--small-tables`` tables of 1,000-50,000 rows (geometric sizes) and
  ``--big-tables`` of ``--big-rows`` rows, in three shapes taken in turn: INT key + VARCHAR,
  DECIMAL, DATETIME; VARCHAR key (nullable columns, DATETIME(3)); composite key (INT, SMALLINT).
* Ours: ``spark_submit(FullLoadSpec(tableset=TableSet(select={"databases": [db], …}, parallel=2)))`` and
  ``spark_submit(ReconcileSpec(…, checksum=True, tableset=same))`` on ``local[2]`` (a Python
  driver). Every table's verdict must be ``ok`` and its row count that of the source.
* mysql-ch-replicator 0.1.16 (own venv, devenv/peers.py): ``db_replicator --initial_only=True``
  with ``tables: '*'`` and ``initial_replication_threads: 2``, stopped at ``--replicator-cap``;
  every table counted with FINAL.
* Fixed cost: the same one-job load + reconcile over databases of only ``--fixed-tables`` (10 and
  50) tables of 10,000 rows, ``--repeats`` times each: the difference of the medians ÷ the tables
  added is what one more such table costs a whole-database job. Then one table's reconciliation
  as a job of its own, ``--repeats`` times.

    .venv/bin/python -m bench.whole_database [--big-rows 1000000] [--small-tables 190] [--big-tables 10]

Services: private MariaDB + chDB endpoint under $BENCH_STATE (default
/tmp/airflow-sync-bench-whole_database), or MYSQL_URL / CLICKHOUSE_URL.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import time

from airflow_sync_provider.core.jobspec import ReconcileSpec
from airflow_sync_provider.core.selection import TableSet
from airflow_sync_provider.core.source.group import one_server
from airflow_sync_provider.core.sql import ch_table
from airflow_sync_provider.core.submission import spark_submit
from bench.harness.clients import ch_client, drop_bench_data, mysql, source, target, target_databases
from bench.harness.env import machine, services, write_result
from bench.harness.jobs import full_load
from bench.harness.measure import fmt_load, fmt_rate, fmt_rounds, median, timer
from bench.harness.peers import initial_copy
from bench.harness.processes import ProcessSampler

DB = "bench_whole"
JOB_TIMEOUT = 3600.0
SMALL_MIN, SMALL_MAX = 1_000, 50_000
# shape -> (columns, values over ``seq``)
SHAPES = {
    "int": ("id INT NOT NULL PRIMARY KEY, name VARCHAR(64) NOT NULL, amount DECIMAL(12,2) NOT NULL, "
            "created_at DATETIME NOT NULL",
            "seq, CONCAT('name-', seq), seq * 7 % 100000 / 100, TIMESTAMP('2024-01-01') + INTERVAL seq MINUTE"),
    "varchar": ("code VARCHAR(32) NOT NULL PRIMARY KEY, qty INT NOT NULL, price DECIMAL(10,2) NULL, "
                "note VARCHAR(255) NULL, updated_at DATETIME(3) NOT NULL",
                "CONCAT('k', LPAD(seq, 10, '0')), seq % 1000, IF(seq % 10 = 0, NULL, seq % 99999 / 100), "
                "IF(seq % 4 = 0, NULL, REPEAT(CHAR(97 + seq % 26), 10 + seq % 50)), "
                "TIMESTAMP('2024-01-01') + INTERVAL seq SECOND + INTERVAL seq % 1000 * 1000 MICROSECOND"),
    "composite": ("account_id INT NOT NULL, line_no SMALLINT UNSIGNED NOT NULL, sku VARCHAR(32) NOT NULL, "
                  "amount DECIMAL(14,4) NOT NULL, booked_at DATETIME NOT NULL, PRIMARY KEY (account_id, line_no)",
                  "seq DIV 10, seq % 10, CONCAT('sku-', seq % 5000), seq * 3 / 7, "
                  "TIMESTAMP('2024-01-01') + INTERVAL seq DIV 10 HOUR"),
}


def layout(small: int, big: int, big_rows: int) -> dict[str, int]:
    """table name -> rows: ``small`` tables of SMALL_MIN..SMALL_MAX rows (geometric), ``big`` of ``big_rows``."""
    shapes = list(SHAPES)
    tables = {f"s{i:03d}_{shapes[i % 3]}": round(SMALL_MIN * (SMALL_MAX / SMALL_MIN) ** (i / max(1, small - 1)))
              for i in range(small)}
    return tables | {f"b{i:02d}_{shapes[i % 3]}": big_rows for i in range(big)}


def generate(mysql_url: str, db: str, tables: dict[str, int]) -> None:
    with mysql(mysql_url) as conn, conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS `{db}`")
        cur.execute(f"CREATE DATABASE `{db}` DEFAULT CHARSET utf8mb4")
        for name, rows in tables.items():
            columns, values = SHAPES[name.split("_", 1)[1]]
            cur.execute(f"CREATE TABLE `{db}`.`{name}` ({columns})")
            for start in range(0, rows, 1_000_000):  # one transaction per million rows
                cur.execute(f"INSERT INTO `{db}`.`{name}` SELECT {values} FROM "
                            f"(SELECT seq + {start} AS seq FROM `{db}`.seq_1_to_{min(1_000_000, rows - start)}) s")
            cur.execute(f"ANALYZE TABLE `{db}`.`{name}`")
            cur.fetchall()
            cur.execute(f"SELECT COUNT(*) FROM `{db}`.`{name}`")
            assert cur.fetchone()[0] == rows, name


def measured(run) -> dict:
    """``run()`` with its wall seconds, the CPU (user+sys) of every process it started (the copier:
    harness ProcessSampler), that of the bench's MariaDB + ClickHouse endpoint, and the other work
    on the machine."""
    with ProcessSampler() as sampler, timer() as wall:
        result = run()
    return {"result": result, "wall": wall["seconds"], "sampler": sampler, "services": sampler.services_cpu(),
            "cpu": sampler.cpu()}


def target_counts(ch_url: str, database: str, tables, final: bool = False) -> dict[str, int]:
    ch = ch_client(ch_url)
    try:
        return {t: int(ch.command(f"SELECT count() FROM {ch_table(database, t)}{' FINAL' if final else ''}"))
                for t in tables}
    finally:
        ch.close()


def run_ours(mysql_url: str, ch_url: str, db: str, key: str, tables: dict[str, int]) -> dict:
    """One job loads every table of ``db``, one job reconciles them; asserted correct."""
    endpoints = source(mysql_url), target(ch_url)
    select = {"databases": [db], "target_database": f"{db}_ch"}
    load = measured(lambda: full_load(*endpoints, "", "", "", "", load_key=key,
                                      tableset=TableSet(select=select, parallel=2),
                                      timeout=JOB_TIMEOUT)["result"])
    check = measured(lambda: spark_submit(ReconcileSpec(sources=one_server(endpoints[0]), target=endpoints[1],
                                                        load_key=key, checksum=True,
                                                        tableset=TableSet(select=select, parallel=2)),
                                          master="local[2]", timeout=JOB_TIMEOUT))
    assert check["result"].get("status") == "success", str(check["result"])[:3000]
    loaded, checked = ({t["table"].split(".", 1)[1]: t for t in run["result"]["tables"]} for run in (load, check))
    verdicts = {t: c.get("verdict") for t, c in checked.items()}
    assert verdicts == dict.fromkeys(tables, "ok"), {t: v for t, v in verdicts.items() if v != "ok"}
    assert {t: loaded[t]["rows"] for t in tables} == tables, "rows loaded differ from the source"
    assert target_counts(ch_url, f"{db}_ch", tables) == tables, "target counts differ from the source"
    return {"load": load, "check": check, "loaded": loaded, "checked": checked}


def run_replicator(mysql_url: str, ch_url: str, db: str, tables: dict[str, int], timeout: float) -> dict:
    """mysql-ch-replicator's initial copy of every table of ``db`` (as bench/full_load.py runs it)."""
    target_db = f"bench_mcr_{db}"  # its own database: it RENAMEs <target>_tmp over it
    out = measured(lambda: initial_copy(mysql_url, ch_url, db, "*", target_db, timeout, threads=2))
    out["wall"] = out["result"]["wall"]  # its process's (the venv check and its config file not)
    code, output = out["result"]["code"], out["result"]["output"]
    if code is None:
        return out | {"timeout": True}
    assert code == 0 and "initial replication - done" in output, f"replicator exited {code}:\n{output[-5000:]}"
    out["counts"] = target_counts(ch_url, target_db, tables, final=True)
    target_databases(ch_url, drop=[target_db])
    return out | {"timeout": False}


def run_fixed(mysql_url: str, ch_url: str, sizes: list[int], rows: int, repeats: int) -> dict:
    """Load + reconcile of databases of only ``rows``-row tables, ``repeats`` times each size in
    turn; then one table's reconciliation as a job of its own, ``repeats`` times."""
    runs = {n: [] for n in sizes}
    for r in range(repeats):
        for n in sizes:
            tables = dict.fromkeys(fixed_tables(n), rows)
            runs[n].append(run_ours(mysql_url, ch_url, f"bench_fixed_{n}", f"fixed{r}", tables))
            print(f"fixed {n} x {rows:,}: load {runs[n][-1]['load']['wall']:.2f} s, "
                  f"reconcile {runs[n][-1]['check']['wall']:.2f} s", flush=True)
    key = runs[sizes[0]][-1]["loaded"][fixed_tables(1)[0]]["load_key"]
    endpoints = source(mysql_url), target(ch_url)
    single = []
    for _ in range(repeats):
        single.append(measured(lambda: spark_submit(ReconcileSpec(
            sources=one_server(endpoints[0]), target=endpoints[1], load_key=key, checksum=True),
                                                    master="local[2]", timeout=JOB_TIMEOUT)))
        assert single[-1]["result"].get("verdict") == "ok", str(single[-1]["result"])[:3000]
        print(f"single-table reconcile: {single[-1]['wall']:.2f} s", flush=True)
    return {"runs": runs, "single": single, "key": key}


def fixed_tables(n: int) -> list[str]:
    return [f"f{i:02d}_{list(SHAPES)[i % 3]}" for i in range(n)]


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--big-rows", type=int, default=1_000_000)
    parser.add_argument("--small-tables", type=int, default=190)
    parser.add_argument("--big-tables", type=int, default=10)
    parser.add_argument("--replicator-cap", type=float, default=1800.0, help="seconds before it is stopped")
    parser.add_argument("--fixed-tables", default="10,50", help="table counts of the fixed-cost databases")
    parser.add_argument("--fixed-rows", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="keep the bench databases afterwards")
    args = parser.parse_args(argv)
    tables = layout(args.small_tables, args.big_tables, args.big_rows)
    sizes = sorted(int(x) for x in args.fixed_tables.split(","))
    dbs = [DB] + [f"bench_fixed_{n}" for n in sizes]
    load_start, started = os.getloadavg(), time.monotonic()
    with services("whole_database") as (mysql_url, ch_url):
        with timer() as gen:
            generate(mysql_url, DB, tables)
            for n in sizes:
                generate(mysql_url, f"bench_fixed_{n}", dict.fromkeys(fixed_tables(n), args.fixed_rows))
        print(f"generated {len(tables)} tables, {sum(tables.values()):,} rows in {gen['seconds']:.0f} s", flush=True)
        target_databases(ch_url, drop=[db + "_ch" for db in dbs])
        ours = run_ours(mysql_url, ch_url, DB, "bench", tables)
        print(f"ours: load {ours['load']['wall']:.1f} s, reconcile {ours['check']['wall']:.1f} s", flush=True)
        replicator = run_replicator(mysql_url, ch_url, DB, tables, args.replicator_cap)
        print(f"mysql-ch-replicator: {'stopped' if replicator['timeout'] else 'done'} at {replicator['wall']:.1f} s",
              flush=True)
        fixed = run_fixed(mysql_url, ch_url, sizes, args.fixed_rows, args.repeats)
        if not args.keep:
            drop_bench_data(mysql_url, ch_url, source_dbs=dbs, target_dbs=[db + "_ch" for db in dbs])
    lines = report(args, tables, gen["seconds"], ours, replicator, fixed, load_start, os.getloadavg(),
                   time.monotonic() - started)
    write_result("whole_database", "\n".join(lines) + "\n")


def med(values) -> float:
    return median(values) or 0.0


def verdict(met: bool) -> str:
    return "**met**" if met else "**missed**"


def report(args, tables, gen_seconds, ours, rep, fixed, load_start, load_end, total) -> list[str]:
    rows = sum(tables.values())
    load, check = ours["load"], ours["check"]
    both_runs = {k: load[k] + check[k] for k in ("wall", "cpu", "services")}

    def row(label, run, inner=None):
        s = run.get("sampler")
        return (f"| {label} | {run['wall']:.1f} | {fmt_rate(rows / run['wall'])} | {run['cpu']:.1f} | "
                f"{run['services']:.1f} | {f'{inner:.1f}' if inner else '—'} | {s.contention() if s else '—'} |")

    lines = [f"# Whole-database bench (issue 25) — {dt.date.today()}", "",
             f"Machine: {machine()}. ClickHouse: the chDB endpoint (devenv/clickhouse_http.py, one process that "
             "runs **one statement at a time** — a stand-in, not a ClickHouse server). Source, target and copier "
             f"share the machine's 2 cores. Load average (1/5/15 min) at start {fmt_load(load_start)}, "
             f"at end {fmt_load(load_end)}; whole bench {total / 60:.1f} min "
             "(other work may share this machine: see the last column).", "",
             f"Database `{DB}`: {len(tables)} tables, {rows:,} rows — {args.small_tables} tables of "
             f"{SMALL_MIN:,}–{SMALL_MAX:,} rows (geometric sizes) and {args.big_tables} of {args.big_rows:,}; shapes "
             "in turn: `int` (INT key, VARCHAR(64), DECIMAL(12,2), DATETIME), `varchar` (VARCHAR(32) key, INT, "
             "nullable DECIMAL(10,2) and VARCHAR(255), DATETIME(3)), `composite` (key INT + SMALLINT UNSIGNED, "
             f"VARCHAR(32), DECIMAL(14,4), DATETIME). Generated with INSERT … SELECT from `seq_1_to_N` in "
             f"{gen_seconds:.0f} s (with the fixed-cost databases).", "",
             "## The whole database", "",
             "| path | wall s | rows/s (wall) | copier CPU s | MariaDB + endpoint CPU s | in-job s "
             "| load avg before→after / other CPU (cores) |", "|---|---|---|---|---|---|---|",
             row("**ours**: full load, one job, `parallel_tables=2`", load, load["result"]["seconds"]),
             row("**ours**: reconcile `checksum=True`, one job", check, check["result"]["seconds"]),
             row("**ours**: load + reconcile", both_runs, load["result"]["seconds"] + check["result"]["seconds"])]
    if rep["timeout"]:
        lines.append(f"| mysql-ch-replicator initial copy | > {rep['wall']:.0f} (stopped at the cap) | — | — | — | — "
                     f"| {rep['sampler'].contention()} |")
    else:
        lines.append(row("mysql-ch-replicator 0.1.16 initial copy, 2 workers", rep))
    ratio, both = rep["wall"] / load["wall"], rep["wall"] / both_runs["wall"]
    ratio_text = f"≥ {ratio:.2f}× (lower bound: it was stopped)" if rep["timeout"] else f"{ratio:.2f}×"
    wrong = {t: (c, tables[t]) for t, c in rep.get("counts", {}).items() if c != tables[t]}
    lines += ["", f"Ours ÷ mysql-ch-replicator, rows/s on wall time: full load **{ratio_text}**; load + reconciliation "
                  f"{'≥ ' if rep['timeout'] else ''}{both:.2f}×.", "",
              "* *copier CPU*: user + sys of every process the path started (ours: the Python driver; the "
              "replicator: its process and the 2 worker processes it starts per table), sampled from /proc "
              "every 0.2 s and completed with what their parents reaped of them (bench/harness/processes.py). "
              "*MariaDB + endpoint CPU*: this bench's own MariaDB and chDB endpoint over the same time, from /proc. "
              "*other CPU*: processes that are not this bench's (other work on the machine), cores on average.",
              f"* Correct: every table's reconciliation verdict **ok** ({len(ours['checked'])}/{len(tables)}, "
              "asserted), and every table's row count — as the load reported it and as `count()` on the target — equal "
              "to the source's `COUNT(*)` (asserted).",
              "* mysql-ch-replicator: " + ("stopped at the cap, not counted." if rep["timeout"] else
                                           f"`count() … FINAL` equal to the source for {len(tables) - len(wrong)}/"
                                           f"{len(tables)} tables" + (f"; differ: {wrong}" if wrong else "") + ".")]
    lines += per_table_summary(tables, ours, args)
    lines += fixed_cost(fixed, args)
    marginal = per_table(fixed["runs"], "load") + per_table(fixed["runs"], "check")
    single = med([r["wall"] for r in fixed["single"]])
    lines += ["", "## Against the goals (issue 25)", "",
              f"* ≥ 3× mysql-ch-replicator's rows/s for the whole database: full load {ratio_text} — "
              f"{verdict(ratio >= 3)} (with our reconciliation added, which the replicator does not do: {both:.2f}×).",
              f"* a {args.fixed_rows:,}-row table's full load + reconcile adds ≤ 0.5 s to a whole-database job: "
              f"**{marginal:.2f} s** — {verdict(marginal <= 0.5)}.",
              f"* reconciliation of a {args.fixed_rows:,}-row table as its own task ≤ 3 s wall: **{single:.2f} s** "
              f"(median of {len(fixed['single'])}) — {verdict(single <= 3)}."]
    lines += ["", "## Every table (ours, the whole-database job)", "",
              "Per-table seconds from the jobs' results (`tables[].seconds`: from the table's start to its end in "
              "the driver, two tables at a time).", "",
              "| table | rows | load s | reconcile s |", "|---|---|---|---|"]
    lines += [f"| {t} | {n:,} | {ours['loaded'][t]['seconds']:.2f} | {ours['checked'][t]['seconds']:.2f} |"
              for t, n in tables.items()]
    return lines


def per_table_summary(tables, ours, args) -> list[str]:
    buckets = [(SMALL_MIN, 5_000), (5_000, 20_000), (20_000, SMALL_MAX + 1), (SMALL_MAX + 1, None)]
    lines = ["", "## Per-table seconds by size (the whole-database job)", "",
             "| rows | tables | Σ rows | load s per table: median / max / Σ | load phases, median s (prepare / copy "
             "/ publish) | reconcile s per table: median / max / Σ |", "|---|---|---|---|---|---|"]
    for lo, hi in buckets:
        names = [t for t, n in tables.items() if n >= lo and (hi is None or n < hi)]
        if not names:
            continue
        ls = [ours["loaded"][t]["seconds"] for t in names]
        cs = [ours["checked"][t]["seconds"] for t in names]
        phases = "/".join(f"{med([ours['loaded'][t]['phases'].get(p, 0) for t in names]):.2f}"
                          for p in ("prepare", "copy", "publish"))
        label = f"{lo:,}–{hi - 1:,}" if hi else f"{args.big_rows:,}"
        lines.append(f"| {label} | {len(names)} | {sum(tables[t] for t in names):,} | {med(ls):.2f} / {max(ls):.2f} / "
                     f"{sum(ls):.1f} | {phases} | {med(cs):.2f} / {max(cs):.2f} / {sum(cs):.1f} |")
    load, check = ours["load"], ours["check"]
    load_sum, check_sum = (sum(t["seconds"] for t in ours[k].values()) for k in ("loaded", "checked"))
    lines += ["", f"Σ per-table seconds ÷ 2 tables at a time: load {load_sum / 2:.1f} s of the job's "
                  f"{load['result']['seconds']:.1f} s in-job; reconcile {check_sum / 2:.1f} s of "
                  f"{check['result']['seconds']:.1f} s. Wall − in-job (the driver's start-up and exit): load "
                  f"{startup(load):.2f} s, reconcile {startup(check):.2f} s."]
    return lines


def startup(run) -> float:
    """A job's wall − its in-job seconds: the driver's start-up and exit."""
    return run["wall"] - run["result"]["seconds"]


def per_table(runs, part: str, what: str = "wall") -> float:
    """What one more table adds to ``part``'s ``what``: the difference of the medians at the most
    and the fewest tables ÷ the tables added."""
    a, b = min(runs), max(runs)
    return (med([r[part][what] for r in runs[b]]) - med([r[part][what] for r in runs[a]])) / (b - a)


def fixed_cost(fixed, args) -> list[str]:
    runs, single = fixed["runs"], fixed["single"]
    a, b = min(runs), max(runs)
    lines = ["", f"## Fixed cost of a {args.fixed_rows:,}-row table", "",
             f"**Method.** Databases of only {args.fixed_rows:,}-row tables (the three shapes in turn), {a} and {b} "
             f"tables; each loaded and reconciled (checksums) by the same one-job pair as above, {args.repeats} times, "
             "the two sizes alternating (each run's verdicts and counts asserted). The marginal cost of one more table "
             f"= (median wall at {b} tables − median wall at {a}) ÷ {b - a}, for the load and the reconciliation: "
             "what adding such a table to a whole-database job adds to its wall time (two tables run at a time, so "
             "it is less than the table's own per-table seconds when the two overlap well).", "",
             "| tables | load wall s (runs) | load in-job s (median) | reconcile wall s (runs) | reconcile in-job s "
             "(median) | copier CPU s, load + reconcile (median) |", "|---|---|---|---|---|---|"]
    for n in sorted(runs):
        lines.append(f"| {n} | {fmt_rounds(r['load']['wall'] for r in runs[n])} | "
                     f"{med([r['load']['result']['seconds'] for r in runs[n]]):.2f} | "
                     f"{fmt_rounds(r['check']['wall'] for r in runs[n])} | "
                     f"{med([r['check']['result']['seconds'] for r in runs[n]]):.2f} | "
                     f"{med([r['load']['cpu'] + r['check']['cpu'] for r in runs[n]]):.2f} |")
    tabs = [t for r in runs[b] for t in r["loaded"].values()]
    checks = [t for r in runs[b] for t in r["checked"].values()]
    load, check = per_table(runs, "load"), per_table(runs, "check")
    lines += ["", f"Marginal wall per table: load {load:.3f} s + reconcile {check:.3f} s = **{load + check:.3f} s**; "
                  f"copier CPU per table: load {per_table(runs, 'load', 'cpu'):.3f} s + reconcile "
                  f"{per_table(runs, 'check', 'cpu'):.3f} s.", "",
              f"Where a {args.fixed_rows:,}-row table's seconds go, in the {b}-table job (median over its tables and "
              f"runs): load {med([t['seconds'] for t in tabs]):.3f} s per table — prepare (ledger, schema, planning) "
              f"{med([t['phases'].get('prepare', 0) for t in tabs]):.3f}, copy "
              f"{med([t['phases'].get('copy', 0) for t in tabs]):.3f}, publish (count check, swap, ledger) "
              f"{med([t['phases'].get('publish', 0) for t in tabs]):.3f}; reconcile "
              f"{med([t['seconds'] for t in checks]):.3f} s per table. Once per job, not per table: the driver's "
              f"start-up and exit (wall − in-job) {med([startup(r['load']) for r in runs[b]]):.2f} s (load), "
              f"{med([startup(r['check']) for r in runs[b]]):.2f} s (reconcile).", "",
              f"**One table's reconciliation as its own job** (`spark_submit(ReconcileSpec(load_key="
              f"'{fixed['key']}', checksum=True))`, local[2]): wall {fmt_rounds(r['wall'] for r in single)} s, median "
              f"**{med([r['wall'] for r in single]):.2f} s**; in-job "
              f"{med([r['result']['seconds'] for r in single]):.2f} s (the rest: the driver's start-up and exit); "
              f"copier CPU {med([r['cpu'] for r in single]):.2f} s."]
    return lines


if __name__ == "__main__":
    main()

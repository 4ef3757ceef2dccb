"""Source-group bench (issue 42): a sharded estate merged into one copy vs the same rows from one
source into one table, in one run; then (unless ``--skip-cdc``) CDC lag of the group under a
steady write load spread over every source.

* Estate: ``--sources`` private MariaDB servers (devenv/mariadb.group_servers), each with database
  ``bench_group`` holding ``--tables`` tables ``orders_0 …`` (ids from 1 on every shard:
  they overlap), ``--rows`` rows in all, spread evenly; the single source: ``bench_single.orders``
  on the first server with the same ``--rows`` rows and columns.
* Load: ``spark_submit(FullLoadSpec(sources=…, merge=Merge(…), tableset=TableSet(select=…), channels=C))`` (one job, the
  channels shared across the sources) vs ``spark_submit(FullLoadSpec(<one table>, channels=C))``,
  ``local[2]``, interleaved for ``--rounds`` rounds (the goal is judged on the rounds' median
  ratio), each with the CPU the target's merge threads used, checked by count and Σ amount
  against the sources (FINAL).
* CDC: a group pipeline bootstrapped over every source, then a service run while writers apply
  ``--changes-per-second`` row changes spread over the sources; lag = now − the newest
  ``changed_at`` visible in the merged copy, polled every 0.5 s.

    .venv/bin/python -m bench.source_groups [--sources 8] [--tables 8] [--rows 10000000] [--rounds 3] [--skip-cdc]

Services under $BENCH_STATE (default /tmp/airflow-sync-bench-source_groups): the servers and a
chDB endpoint (one statement at a time: a stand-in, not a ClickHouse server).
"""

from __future__ import annotations

import argparse
import os
import random
import threading
import time
from decimal import Decimal
from pathlib import Path

from airflow_sync_provider.core.cdc.checkpoints import Checkpoints
from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
from airflow_sync_provider.core.jobspec import CdcApplySpec, CdcBootstrapSpec, FullLoadSpec
from airflow_sync_provider.core.selection import TableSet
from airflow_sync_provider.core.source.group import Merge, Source, one_server, part_pipeline
from airflow_sync_provider.core.submission import spark_submit
from bench.harness.clients import ch_client, mysql
from bench.harness.env import machine, state_dir, write_result
from bench.harness.jobs import JOB_TIMEOUT
from bench.harness.measure import fmt_rate, percentile, timer
from bench.harness.processes import TICKS
from devenv.clickhouse_http import ChdbEndpoint
from devenv.mariadb import group_servers

SOURCE_DB, SINGLE_DB, TARGET_DB = "bench_group", "bench_single", "bench_group_ch"
COLUMNS = ("id BIGINT NOT NULL PRIMARY KEY, customer_id INT NOT NULL, amount DECIMAL(12,2) NOT NULL, "
           "status VARCHAR(16) NOT NULL, note VARCHAR(255) NULL, created_at DATETIME(6) NOT NULL, "
           "changed_at DATETIME(6) NULL, weight DOUBLE NULL, priority TINYINT NOT NULL")
# a row of key ``seq``; ``{changed}``: its changed_at (NULL generated, NOW(6) by the CDC bench's writers)
ROW = ("seq, seq % 50000, (seq * 7919) % 10000000 / 100, ELT(1 + seq % 4, 'new', 'paid', 'sent', 'done'), "
       "IF(seq % 5 = 0, NULL, CONCAT('note ', seq)), TIMESTAMP('2025-01-01') + INTERVAL seq SECOND, {changed}, "
       "IF(seq % 7 = 0, NULL, seq / 3), seq % 100")
VALUES, LIVE_VALUES = ROW.format(changed="NULL"), ROW.format(changed="NOW(6)")
POLL = 0.5


def generate(urls: dict, tables: int, rows: int) -> None:
    per_table = rows // (len(urls) * tables)
    for i, url in enumerate(urls.values()):
        with mysql(url) as conn, conn.cursor() as cur:
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
        with mysql(url) as conn, conn.cursor() as cur:
            for t in range(tables):
                cur.execute(f"SELECT COUNT(*), SUM(amount) FROM {SOURCE_DB}.orders_{t}")
                n, s = cur.fetchone()
                count, amount = count + n, amount + s
    return count, str(amount)


def run(spec, what: str, target_pid: int | None = None, ch=None) -> dict:
    """The job via ``spark_submit``; with ``ch``, then the target's merges settled (a full reload's
    working table defers them until it is published: core/clickhouse/clickhouse.DEFER_MERGES), so
    the next load does not pay for them and the merge CPU after the load is its own."""
    merges = merge_cpu(target_pid)
    with timer() as wall:
        result = spark_submit(spec, master="local[2]", timeout=JOB_TIMEOUT, line=lambda text: None)
    if result.get("status") != "success":
        raise SystemExit(f"{what} failed: {result.get('error')}")
    during = merge_cpu(target_pid) - merges
    settled = settle_merges(ch) if ch is not None else 0.0
    return {"wall": wall["seconds"], "in_job": result["seconds"], "result": result, "merge_cpu": during,
            "merge_cpu_after": merge_cpu(target_pid) - merges - during, "settled": settled}


def merge_cpu(pid: int | None) -> float:
    """CPU-seconds the target process's merge threads (chDB's ``MergeMutate`` pool) have used."""
    if pid is None:
        return 0.0
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            if (task / "comm").read_text().startswith("MergeMutate"):
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])
        except OSError:
            continue  # the thread ended
    return total / TICKS


class ShardWriter(threading.Thread):
    """``rate`` row changes/s on one shard server in small autocommit statements (updates of 5–20
    rows by id range, inserts of 5–20 rows), ``changed_at = NOW(6)`` (UTC) on every row written."""

    def __init__(self, url: str, tables: int, rows_per_table: int, rate: float, until: float, seed: int):
        super().__init__(daemon=True)
        self.url, self.tables, self.rows, self.rate, self.until = url, tables, rows_per_table, rate, until
        self.rng, self.changes, self.started, self.stopped, self.error = random.Random(seed), 0, None, None, None
        self.next_id = rows_per_table + 1

    def run(self):
        try:
            with mysql(self.url) as conn, conn.cursor() as cur:
                cur.execute("SET time_zone = '+00:00'")
                self.started = time.time()
                while time.time() < self.until:
                    if self.changes >= self.rate * (time.time() - self.started):
                        time.sleep(0.002)
                        continue
                    table, n = f"{SOURCE_DB}.orders_{self.rng.randrange(self.tables)}", self.rng.randint(5, 20)
                    if self.rng.random() < 0.7:
                        low = self.rng.randint(1, max(1, self.rows - n))
                        self.changes += cur.execute(f"UPDATE {table} SET changed_at = NOW(6), status = 'moved' "
                                                    "WHERE id BETWEEN %s AND %s", (low, low + n - 1))
                    else:
                        first, self.next_id = self.next_id, self.next_id + n
                        self.changes += cur.execute(f"INSERT IGNORE INTO {table} SELECT {LIVE_VALUES} "
                                                    f"FROM {SOURCE_DB}.seq_{first}_to_{first + n - 1}")
        except Exception as exc:  # reported with the results
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.stopped = time.time()


def cdc_lag(urls: dict, target, ch, args, rows_per_table: int) -> dict:
    """A group pipeline bootstrapped over every source, then a service run while a writer per
    source applies its share of ``args.changes_per_second``; every 0.5 s each source's lag (now −
    the newest ``changed_at`` of its rows in the merged copy), the group's the worst of them."""
    sources = [Source(n, MySQLEndpoint.from_url(u)) for n, u in urls.items()]
    merged, pipeline = f"{TARGET_DB}.live", f"bench_group_{int(time.time())}"
    select = {"databases": [SOURCE_DB], "tables": ["orders_*"]}
    for table in ("single", "merged", "live"):  # the loads' copies: not the stream's business
        ch.command(f"DROP TABLE IF EXISTS {TARGET_DB}.{table}")
    with timer() as boot:
        run(CdcBootstrapSpec(target=target, pipeline=pipeline, sources=sources, tableset=TableSet(select=select),
                             merge=Merge.of(merged)), "bootstrap")
    settled = settle_merges(ch)
    seconds = args.cdc_seconds
    spec = CdcApplySpec(target=target, pipeline=pipeline, sources=sources, merge=Merge.of(merged), service=True,
                        max_seconds=seconds, batch_seconds=0.5, verify_period=0)
    box, launched = {}, time.time()
    job = threading.Thread(target=lambda: box.update(run(spec, "service")), daemon=True)
    job.start()
    checkpoints = Checkpoints(ch)
    while time.time() - launched < 300:  # every source's pipeline running
        states = [checkpoints.state(part_pipeline(pipeline, n)) for n in urls]
        if all(s is not None and s.status == "running" and s.heartbeat > launched for s in states):
            break
        time.sleep(POLL)
    running_at = time.time()
    until = running_at + seconds - max(3.0, seconds * 0.1)
    writers = [ShardWriter(u, args.tables, rows_per_table, args.changes_per_second / len(urls), until, seed=i)
               for i, u in enumerate(urls.values())]
    for writer in writers:
        writer.start()
    samples, warm, seen = [], [], {}  # warm: samples once every source's changes are visible
    while any(w.is_alive() for w in writers):
        sent = time.time()
        # only the writers' rows have a changed_at: PREWHERE reads the column's null map first, so a
        # poll does not scan the estate's rows (the stand-in runs one statement at a time)
        newest = dict(ch.query(f"SELECT _source, toUnixTimestamp64Micro(max(changed_at)) FROM {merged} "
                               "PREWHERE changed_at IS NOT NULL GROUP BY _source").result_rows)
        lags = [sent - (newest.get(name) or 0) / 1e6 if (newest.get(name) or 0) / 1e6 >= w.started else
                sent - w.started for name, w in zip(urls, writers) if w.started and w.changes]
        for name, w in zip(urls, writers):
            if name not in seen and w.started and (newest.get(name) or 0) / 1e6 >= w.started:
                seen[name] = sent - w.started  # its first change visible: its pipeline is streaming
        if lags and sent - running_at >= 5:
            samples.append(max(lags))
            if len(seen) == len(urls):
                warm.append(max(lags))
            if os.environ.get("BENCH_TRACE"):
                print(f"{sent - running_at:6.1f} s  lag {' '.join(f'{x:5.2f}' for x in lags)}", flush=True)
        time.sleep(max(0.0, POLL - (time.time() - sent)))
    job.join(seconds + 600)
    written = sum(w.changes for w in writers)
    writing = max(w.stopped for w in writers) - min(w.started for w in writers)
    return {"bootstrap": boot["seconds"], "settled": settled, "samples": len(samples),
            "p50": percentile(samples, 0.5, nearest=True), "p99": percentile(samples, 0.99, nearest=True),
            "max": max(samples) if samples else None, "warm": len(warm),
            "warm_p50": percentile(warm, 0.5, nearest=True), "warm_p99": percentile(warm, 0.99, nearest=True),
            "warm_max": max(warm) if warm else None, "first_visible": max(seen.values()) if seen else None,
            "written": written,
            "rate": written / writing if writing else 0, "errors": [w.error for w in writers if w.error],
            "job": box}


def settle_merges(ch, limit: float = 180.0, quiet: float = 3.0) -> float:
    """Wait until the target has merged nothing for ``quiet`` s (a published copy's merges start a
    moment after its swap; a bootstrap's keep its merge threads busy for a while; on these 2 cores
    either would be measured as the next phase's time). Returns the seconds waited."""
    started = last = time.monotonic()
    while time.monotonic() - started < limit and time.monotonic() - last < quiet:
        if int(ch.command("SELECT count() FROM system.merges")):
            last = time.monotonic()
        time.sleep(0.5)
    return time.monotonic() - started


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--sources", type=int, default=8)
    parser.add_argument("--tables", type=int, default=8, help="tables per source")
    parser.add_argument("--rows", type=int, default=10_000_000, help="rows in all (and in the single table)")
    parser.add_argument("--channels", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3, help="load rounds, single and group interleaved")
    parser.add_argument("--skip-cdc", action="store_true")
    parser.add_argument("--changes-per-second", type=float, default=2000.0, help="CDC: spread over the sources")
    parser.add_argument("--cdc-seconds", type=float, default=60.0)
    args = parser.parse_args(argv)
    state = state_dir("source_groups")
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
        rounds = []
        for i in range(args.rounds):  # interleaved: the machine's load varies from minute to minute
            single = run(FullLoadSpec(sources=one_server(MySQLEndpoint.from_url(urls["s0"])), target=target,
                                      source_database=SINGLE_DB, source_table="orders", target_database=TARGET_DB,
                                      target_table="single", channels=args.channels,
                                      load_key=f"bench-single-{time.time()}"),
                         "single-source load", endpoint.proc.pid, ch)
            group = run(FullLoadSpec(target=target, source_database="", source_table="", target_database="",
                                     target_table="",
                                     sources=[Source(n, MySQLEndpoint.from_url(u)) for n, u in urls.items()],
                                     merge=Merge.of(f"{TARGET_DB}.merged"),
                                     tableset=TableSet(select={"databases": [SOURCE_DB],
                                                                                "tables": ["orders_*"]}),
                                     channels=args.channels, load_key=f"bench-group-{time.time()}"),
                        "group load", endpoint.proc.pid, ch)
            rounds.append((single, group))
            print(f"round {i + 1}: single source {single['wall']:.1f} s (in the job {single['in_job']:.1f} s), group "
                  f"{group['wall']:.1f} s (in the job {group['in_job']:.1f} s): {single['wall'] / group['wall']:.2f}×",
                  flush=True)
        expected = source_totals(urls, args.tables)
        got = tuple(ch.query(f"SELECT count(), toString(sum(amount)) FROM {TARGET_DB}.merged FINAL").result_rows[0])
        got_single = tuple(ch.query(f"SELECT count(), toString(sum(amount)) FROM {TARGET_DB}.single FINAL"
                                    ).result_rows[0])
        lag = None if args.skip_cdc else cdc_lag(urls, target, ch, args, args.rows // (args.sources * args.tables))
        ch.close()
    lines = report(args, rows, gen["seconds"], rounds, expected, got, got_single, load_start,
                   time.monotonic() - started)
    if lag is not None:
        lines += lag_report(args, lag)
    write_result("source_groups", "\n".join(lines) + "\n")


def report(args, rows, gen_seconds, rounds, expected, got, got_single, load_start, total) -> list[str]:
    members = args.sources * args.tables
    exact = got[0] == expected[0] and Decimal(str(got[1])) == Decimal(str(expected[1]))
    ratios = sorted(single["wall"] / group["wall"] for single, group in rounds)
    median = ratios[len(ratios) // 2]
    lines = [
        f"# Source-group bench — {time.strftime('%Y-%m-%d')}", "",
        f"Machine: {machine()}", "",
        f"Estate: {args.sources} MariaDB servers × {args.tables} tables = {members} source tables, {rows:,} rows in "
        f"all (ids overlapping across shards), 9 mixed columns; the single source: one table of the same {rows:,} "
        f"rows on the first server; generated in {gen_seconds:.0f} s. Target: the chDB stand-in (one statement at a "
        "time). Load average before: " + "/".join(f"{x:.2f}" for x in load_start) + f"; whole bench {total / 60:.1f} "
        "min.", "",
        "## Full load: merged vs one source", "",
        f"{len(rounds)} rounds, the two loads interleaved (`spark_submit`, `local[2]`, channels={args.channels}; the "
        f"group's channels shared by its {members} tables). Merge CPU: what the target's merge threads used during "
        "the load / after it, until the target merged nothing for 3 s (chDB's `MergeMutate` pool; a load's working "
        "table defers its merges until it is published, so the next round waits for them and does not pay).", "",
        "| round | single: wall s | rows/s | merge CPU-s | group: wall s | rows/s | merge CPU-s | group ÷ single |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for i, (single, group) in enumerate(rounds, 1):
        lines.append(f"| {i} | {single['wall']:.1f} | {fmt_rate(rows / single['wall'])} | {single['merge_cpu']:.1f} / "
                     f"{single['merge_cpu_after']:.1f} | {group['wall']:.1f} | {fmt_rate(rows / group['wall'])} | "
                     f"{group['merge_cpu']:.1f} / {group['merge_cpu_after']:.1f} | "
                     f"{single['wall'] / group['wall']:.2f}× |")
    return lines + [
        "",
        f"Checks (last round, FINAL): single count {got_single[0]:,}; merged count {got[0]:,}, Σ amount "
        f"{'= the sources' if exact else f'{got[1]} vs {expected[1]}'}.", "",
        f"Goal: group rows/s ≥ 0.9× the single source's: **{'met' if median >= 0.9 else 'missed'}** (median of "
        f"the rounds {median:.2f}×; rounds {', '.join(f'{r:.2f}×' for r in ratios)}).",
    ]


def lag_report(args, lag: dict) -> list[str]:
    met = lag["warm_p99"] is not None and lag["warm_p99"] <= 1.0
    return ["", f"## CDC lag: {args.sources} sources, {args.changes_per_second:,.0f} changes/s spread over them", "",
            f"A group pipeline (a pipeline per source, `placement='driver'`: a thread each in one driver, each with "
            f"its binlog reader process) bootstrapped over every source ({lag['bootstrap']:.0f} s; then "
            f"{lag['settled']:.0f} s until the target merged nothing more: the lag measured is the steady state's, "
            "not the bootstrap's merges competing for the 2 cores), then a service "
            f"run of {args.cdc_seconds:.0f} s (`batch_seconds=0.5`) while a writer per source applied its share: "
            f"{lag['written']:,} changes at {lag['rate']:,.0f}/s in all. Every 0.5 s after the first 5 s, each "
            "source's lag = now − the newest `changed_at` of its rows in the merged copy; the group's lag is its worst "
            "source's." + (f" Writer errors: {lag['errors']}" if lag["errors"] else ""), "",
            "| samples | group lag p50 s | p99 s | max s | job |", "|---|---|---|---|---|",
            f"| all after the first 5 s: {lag['samples']} | {lag['p50']:.2f} | {lag['p99']:.2f} | {lag['max']:.2f} | "
            f"{'success' if lag['job'] else 'failed'} |" if lag["samples"] else "| 0 | – | – | – | – |",
            f"| streaming (every source's first change visible): {lag['warm']} | {lag['warm_p50']:.2f} | "
            f"**{lag['warm_p99']:.2f}** | {lag['warm_max']:.2f} | |" if lag["warm"] else "| 0 | – | – | – | |", "",
            f"Every source's first change was visible {lag['first_visible'] or float('nan'):.1f} s after its writer "
            "began (the pipelines' reader processes starting, forks of one warm fork server; spawned afresh they "
            "took 9.5 s: spark/cdc_stream.reader_processes); the lag of a streaming group is the second row.", "",
            f"Goal: p99 ≤ 1 s (streaming): **{'met' if met else 'missed'}**."]


if __name__ == "__main__":
    main()

"""CDC across a failover (issue 35): how long after the new primary's first write that write is
in the copy, under ≈2,000 row changes/s, beside the steady-state lag before the failover.

A MariaDB primary A and its GTID replica B (devenv/mariadb.ReplicatedPair: B's binlog offsets
differ from A's) behind a switchable address; bench/cdc_apply.py's ``orders`` table (100k rows,
full-loaded); our service-mode applier kept running by a supervisor loop (as ``airflow-sync cdc
run`` under systemd or an Airflow retry would be: restarted at once when it ends); a writer at the
rate through the address, reconnecting when it breaks. After ``--before`` seconds A is killed, B
promoted and the address moved to B; the writer's first commit on B is timed to its visibility
in the copy (the newest ``changed_at`` there). At the end the copy is compared with B row for row.

    .venv/bin/python -m bench.cdc_failover [--before 20] [--after 30] [--rate 2000]
"""

from __future__ import annotations

import argparse
import random
import threading
import time

import pymysql

from airflow_sync_provider.core.sql import ch_table
from airflow_sync_provider.core.submission import spark_submit
from bench import cdc_apply as base
from bench.harness.clients import ch_client, mysql
from bench.harness.env import machine, services, write_result
from bench.harness.measure import percentile
from devenv.mariadb import ReplicatedPair


class ReconnectingWriter(threading.Thread):
    """bench/cdc_apply.Writer's statements at ``rate`` changes/s, reconnecting (and noting when)
    after the address breaks; ``first_commit_after(t)``: the first commit that began after t."""

    def __init__(self, url: str, rate: float, next_id: int):
        super().__init__(daemon=True)
        self.url, self.rate, self.next_id = url, rate, next_id
        self.stop_event, self.error, self.commits = threading.Event(), None, []
        self.total, self.reconnects = 0, 0

    def run(self):
        rng, started, changes, conn = random.Random(11), time.time(), None, None
        while not self.stop_event.is_set():
            try:
                if conn is None:
                    conn = mysql(self.url, base.SOURCE_DB)
                    cur = conn.cursor()
                    cur.execute("SET time_zone = '+00:00'")
                    cur.execute(f"USE `{base.SOURCE_DB}`")
                    next_id = changes.next_id if changes else self.next_id
                    changes = base.Changes(cur, next_id, rng) if changes is None else changes
                    changes.cur = cur
                if self.total >= self.rate * (time.time() - started):
                    time.sleep(0.002)
                    continue
                began = time.time()
                self.total += changes.statement(rng.randint(5, 30))
                self.commits.append((began, time.time()))
            except pymysql.err.MySQLError:
                conn, self.reconnects = None, self.reconnects + 1
                time.sleep(0.05)
            except Exception as exc:  # noqa: BLE001 - reported
                self.error = f"{type(exc).__name__}: {exc}"
                return

    def first_commit_after(self, t: float) -> float | None:
        return next((done for began, done in self.commits if began >= t), None)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--rate", type=float, default=2000.0)
    parser.add_argument("--before", type=float, default=20.0, help="seconds of steady state before the failover")
    parser.add_argument("--after", type=float, default=30.0, help="seconds after it")
    args = parser.parse_args(argv)
    args.lanes, args.batch_events = 4, 50_000
    started = time.time()
    with services("cdc-failover") as (_, ch_url), ReplicatedPair() as pair:
        url = pair.url
        base.create_source(url, args.rows)
        pair.wait_caught_up()
        load = base.run_full_load(url, ch_url)
        pipeline = f"bench-failover-{int(started)}"
        spec = base.cdc_spec(url, ch_url, pipeline, args, service=True, batch_seconds=0.5,
                             max_seconds=args.before + args.after + 30, start_from_loads=[load["load_key"]])
        runs, stop = [], threading.Event()

        def supervisor():
            first = True
            while not stop.is_set():
                began = time.time()
                result = spark_submit(spec, timeout=3600)
                runs.append((began, time.time(), result.get("status"), str(result.get("error", ""))[:300],
                             result.get("failover")))
                if first:
                    spec.start_from_loads, first = [], False
                if result.get("status") == "success":
                    return
                time.sleep(0.2)

        service = threading.Thread(target=supervisor, daemon=True)
        service.start()
        ch = ch_client(ch_url)
        table = ch_table(base.TARGET_DB, base.TABLE)

        def newest() -> float:
            value = ch.query(f"SELECT toUnixTimestamp64Micro(max(changed_at)) FROM {table}").result_rows[0][0]
            return (value or 0) / 1e6

        time.sleep(8)  # the service up and caught up with the load
        # two connections: one alone does not reach the rate through the address's proxy process
        writers = [ReconnectingWriter(url, args.rate / 2, args.rows + 1 + i * 5_000_000) for i in range(2)]
        for w in writers:
            w.start()
        samples = []
        failed_over = None
        visible = None
        t0 = time.time()
        while time.time() - t0 < args.before + args.after:
            now = time.time()
            lag = now - newest()
            samples.append((now, lag))
            if failed_over is None and now - t0 >= args.before:
                pair.fail_over()
                failed_over = time.time()
            if failed_over and visible is None:
                first_on_b = min((t for w in writers if (t := w.first_commit_after(failed_over))), default=None)
                if first_on_b and newest() >= first_on_b - 0.001:
                    visible = time.time() - first_on_b
            time.sleep(0.25)
        for w in writers:
            w.stop_event.set()
            w.join()
        wrote = time.time() - t0
        stop.set()
        time.sleep(5)
        with pair.connect(pair.replica) as conn:
            from tests.helpers import assert_same_rows

            exact = assert_same_rows(conn, ch, base.SOURCE_DB, base.TABLE, base.TARGET_DB)
        service.join(120)
        first_on_b = min((t for w in writers if (t := w.first_commit_after(failed_over))), default=None)
        steady = [lag for at, lag in samples if t0 + 5 <= at < failed_over]
        lines = ["# CDC across a failover (bench/cdc_failover.py)", "",
                 f"Machine: {machine()}. Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
                 f"{(time.time() - started) / 60:.1f} min. chDB stand-in (one statement at a time).", "",
                 f"A MariaDB primary and its GTID replica (offsets differ), {args.rows:,}-row `orders`, a writer at "
                 f"≈{args.rate:,.0f} changes/s through the primary's address (achieved "
                 f"{sum(w.total for w in writers) / wrote:,.0f}/s over two connections, "
                 f"{sum(w.reconnects for w in writers)} reconnect attempts); "
                 f"our service restarted at once whenever it ended (a supervisor).", "",
                 "| measure | seconds |", "|---|---|",
                 f"| steady-state lag before the failover, p50 | {percentile(steady, 0.5):.2f} |",
                 f"| steady-state lag before the failover, p99 | {percentile(steady, 0.99):.2f} |",
                 f"| the new primary's first write → visible in the copy | "
                 f"{visible if visible is not None else float('nan'):.2f} |",
                 f"| the failover (A killed, B promoted, address moved) → B's first write committed | "
                 f"{(first_on_b - failed_over) if first_on_b else float('nan'):.2f} |", "",
                 f"The copy equals B row for row at the end ({exact:,} rows). Service runs: "
                 + "; ".join(f"{r[2]} after {r[1] - r[0]:.1f} s" + (f" (failover: resumed at "
                             f"{r[4].get('resumed_at')})" if r[4] else "") + (f" [{r[3][:120]}]" if r[3] else "")
                             for r in runs)]
        ch.close()
    write_result("cdc_failover", "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

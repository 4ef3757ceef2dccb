"""CDC bootstrap bench: rows/s of our bootstrap of the demo ``orders`` while a writer changes it,
vs our full load of the same table and mysql-ch-replicator's initial copy, in one run; and the
catch-up lag once the bootstrap ends.

    .venv/bin/python -m bench.cdc_bootstrap [--rows 10000000] [--quick] [--keep]

1. ours, full load: ``spark_submit(FullLoadSpec(channels=2))`` of a quiet source, and again while
   the writer below runs (no catch-up: the copy path's cost under the same writes).
2. ours, bootstrap of the quiet source (the copy path alone), then again while
   ``devenv.demo_writer`` makes ~500 row changes/s on ``orders`` and ``order_items`` (inserts,
   updates, deletes, key changes, a transaction held open 1.5 s every 3 s) and the pipeline's
   catch-up runs as a service (``airflow-sync cdc run`` equivalent, its own spark-submit, started
   before the bootstrap and waiting for the table to join) on the same two cores. *Lag after the bootstrap*: from the
   bootstrap's end until the pipeline's position has reached the bootstrap's end position. Then
   the writer stops, the service catches up to the source, and reconciliation with checksums
   (``ReconcileSpec(checksum=True)`` on the bootstrap's load key) must say ok.
3. mysql-ch-replicator 0.1.16 initial copy (``db_replicator --initial_only``, 2 workers) of the
   quiet source (bench/full_load.py's runner).

Services: private MariaDB + chDB endpoint under $BENCH_STATE (default
/tmp/airflow-sync-bench-bootstrap); the chDB endpoint runs one statement at a time.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import tempfile
import time

from airflow_sync_provider.core.cdc.checkpoints import Checkpoints
from airflow_sync_provider.core.jobspec import DEFAULT_CHUNK_ROWS, CdcApplySpec, CdcBootstrapSpec, ReconcileSpec
from airflow_sync_provider.core.positions import BinlogPosition, current_position
from airflow_sync_provider.core.selection import TableSet
from airflow_sync_provider.core.source.group import one_server
from airflow_sync_provider.core.submission import prepare, spark_submit
from bench.full_load import run_ours, run_replicator
from bench.harness.clients import ch_client, drop_bench_data, mysql, source, target, target_databases
from bench.harness.env import machine, services, write_result
from bench.harness.jobs import full_load
from bench.harness.measure import fmt_rate, fmt_ratio, timer
from bench.harness.processes import GROUPS, ProcessSampler
from devenv import demo_data
from devenv.demo_writer import DemoWriter

DB = "bench_boot"
TARGET_DB = "bench_boot_cdc"
PIPELINE = f"bench_boot_{time.strftime('%Y%m%d%H%M%S')}"  # a fresh pipeline (and load keys) per run


def _position(mysql_url) -> BinlogPosition:
    with mysql(mysql_url) as conn:
        return current_position(conn)


class _Service:
    """The pipeline's catch-up as a service: its own spark-submit, stopped with SIGTERM at the end."""

    def __init__(self, spec: CdcApplySpec):
        self.tmp = tempfile.TemporaryDirectory(prefix="bench-boot-service-")
        cmd, env = prepare(spec, self.tmp.name)
        self.log = open(os.path.join(self.tmp.name, "service.log"), "w")
        self.proc = subprocess.Popen(cmd, env={**os.environ, **env}, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self) -> str:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()
        with open(self.log.name) as fh:
            text = fh.read()
        self.tmp.cleanup()
        return text


def _wait_position(ch_url, target: BinlogPosition, timeout: float, service: "_Service") -> float | None:
    """Seconds until the pipeline's position reaches ``target`` (None: not within ``timeout``
    or the service ended)."""
    ch = ch_client(ch_url)
    checkpoints = Checkpoints(ch)
    started = time.monotonic()
    try:
        while time.monotonic() - started < timeout and service.proc.poll() is None:
            reached = checkpoints.position(PIPELINE)
            if reached is not None and reached.key() >= target.key():
                return time.monotonic() - started
            time.sleep(0.1)
    finally:
        ch.close()
    return None


def run_quiet_bootstrap(mysql_url, ch_url, args) -> dict:
    """The bootstrap alone on a quiet source (no writer, no catch-up): the copy path itself."""
    table = {"source_database": DB, "source_table": "orders", "target_database": TARGET_DB + "_quiet"}
    spec = CdcBootstrapSpec(sources=one_server(source(mysql_url)), target=target(ch_url), pipeline=PIPELINE + "_quiet",
                            tableset=TableSet(tables=[table]), channels=args.channels, chunk_rows=args.chunk_rows)
    with ProcessSampler() as sampler, timer() as wall:
        result = spark_submit(spec)
    assert result.get("status") == "success", result
    return {"wall": wall["seconds"], "inner": float(result["seconds"]), "rows": result["rows"],
            "chunks": result["tables"][0]["chunks"], "sampler": sampler}


def run_full_load_under_writes(mysql_url, ch_url, args) -> dict:
    """Our full load of the same table while the writer runs: what the writes cost the copy path
    alone (its copy is not kept current: that is what the bootstrap adds)."""
    writer = DemoWriter(mysql_url, database=DB, rate=args.writer_rate)
    writer.start()
    sampler = ProcessSampler()
    try:
        run = full_load(mysql_url, ch_url, DB, "orders", "bench_full_load", "orders_under_writes",
                        channels=args.channels, during=sampler)
    finally:
        writer.stop()
    return run | {"sampler": sampler}


def run_bootstrap(mysql_url, ch_url, args) -> dict:
    """The bootstrap under a writer, with the pipeline's catch-up service already running (it
    waits for the table to join, then replays its changes from the bootstrap's start)."""
    endpoints = source(mysql_url), target(ch_url)
    table = {"source_database": DB, "source_table": "orders", "target_database": TARGET_DB}
    spec = CdcBootstrapSpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline=PIPELINE,
                            tableset=TableSet(tables=[table]), channels=args.channels, chunk_rows=args.chunk_rows)
    service = _Service(CdcApplySpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline=PIPELINE,
                                    service=True, lanes=2, batch_seconds=0.5))
    ch = ch_client(ch_url)
    checkpoints = Checkpoints(ch)
    checkpoints.ensure()
    waited = time.monotonic()
    while (checkpoints.state(PIPELINE) is None or checkpoints.state(PIPELINE).status != "running"):
        assert service.proc.poll() is None and time.monotonic() - waited < 300, service.stop()[-3000:]
        time.sleep(0.5)
    ch.close()
    writer = DemoWriter(mysql_url, database=DB, rate=args.writer_rate)
    writer.start()
    writer_started, box = time.monotonic(), {}
    with ProcessSampler() as sampler, timer() as wall:
        result = spark_submit(spec)
        box["ended"] = time.monotonic()
    assert result.get("status") == "success", (result, service.stop()[-3000:])
    lag = _wait_position(ch_url, BinlogPosition.from_dict(result["end_position"]), 600, service)
    lag_after_end = None if lag is None else time.monotonic() - box["ended"]
    writer.stop()
    writer_seconds = time.monotonic() - writer_started
    final = _position(mysql_url)
    drain = _wait_position(ch_url, final, 600, service)
    log = service.stop()
    assert drain is not None, f"the catch-up service did not reach {final}:\n{log[-3000:]}"
    checked = spark_submit(ReconcileSpec(sources=one_server(endpoints[0]), target=endpoints[1],
                                         load_key=result["tables"][0]["load_key"], checksum=True))
    assert checked.get("status") == "success", checked
    boot = result["tables"][0]
    return {"wall": wall["seconds"], "inner": float(result["seconds"]), "rows": boot["rows"], "chunks": boot["chunks"],
            "shards": boot["shards"], "sampler": sampler, "lag": lag_after_end, "drain": drain,
            "writer_changes": writer.changes, "writer_rate": writer.changes / writer_seconds,
            "held": writer.held, "verdict": checked["verdict"], "mismatched": checked["mismatched"]}


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--quick", action="store_true", help="1M rows")
    parser.add_argument("--channels", type=int, default=2)
    parser.add_argument("--chunk-rows", type=int, default=DEFAULT_CHUNK_ROWS)
    parser.add_argument("--writer-rate", type=float, default=500)
    parser.add_argument("--replicator-cap", type=float, default=1200.0)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args(argv)
    rows = 1_000_000 if args.quick else args.rows
    started, load_start = time.monotonic(), os.getloadavg()
    with services("bootstrap") as (mysql_url, ch_url):
        with timer() as gen:
            counts = demo_data.generate(mysql_url, DB, orders=rows, customers=10_000, item_orders=100_000)
        assert counts["orders"] == rows, counts
        print(f"generated {DB}.orders: {rows:,} rows in {gen['seconds']:.1f} s", flush=True)
        target_databases(ch_url, create=["bench_full_load"],
                         drop=("bench_full_load", TARGET_DB, TARGET_DB + "_quiet"))
        full = run_ours(mysql_url, ch_url, DB, rows, args.channels)
        print(f"full load: {full['wall']:.1f} s wall, {full['inner']:.1f} s job", flush=True)
        replicator = run_replicator(mysql_url, ch_url, DB, rows, 2, args.replicator_cap)
        print(f"mysql-ch-replicator initial copy: {replicator.get('wall')} s", flush=True)
        quiet = run_quiet_bootstrap(mysql_url, ch_url, args)
        print(f"bootstrap, quiet source: {quiet['wall']:.1f} s wall, {quiet['inner']:.1f} s job", flush=True)
        busy = run_full_load_under_writes(mysql_url, ch_url, args)
        print(f"full load under writes: {busy['wall']:.1f} s wall, {busy['inner']:.1f} s job", flush=True)
        boot = run_bootstrap(mysql_url, ch_url, args)
        print(f"bootstrap: {boot['wall']:.1f} s wall, {boot['inner']:.1f} s job, lag after it {boot['lag']} s, "
              f"verdict {boot['verdict']}", flush=True)
        if not args.keep:
            drop_bench_data(mysql_url, source_dbs=[DB])
    total = time.monotonic() - started
    write_result("cdc_bootstrap" + ("_quick" if args.quick else ""),
                 "\n".join(report(args, rows, full, busy, replicator, boot, quiet, load_start, os.getloadavg(), total))
                 + "\n")


def report(args, rows, full, busy, replicator, boot, quiet, load_start, load_end, total) -> list[str]:
    def rate(seconds):
        return rows / seconds if seconds else None

    cpu = {name: run["sampler"].cpu_by_role() for name, run in (("quiet", quiet), ("boot", boot), ("busy", busy))}

    lines = [f"# CDC bootstrap bench ({rows:,} rows)", "",
             f"Machine: {machine()}. ClickHouse: the chDB endpoint (one statement at a time). One run, "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average {load_start[0]:.2f} → "
             f"{load_end[0]:.2f}; total {total:.0f} s.", "",
             "| path | source | wall s | rows/s (wall) | in-job s | rows/s (in-job) "
             "| bootstrap ÷ this (wall / in-job) |",
             "|---|---|---|---|---|---|---|",
             f"| **ours: bootstrap**, {args.channels} channels, chunks of {args.chunk_rows:,} | writer at "
             f"{boot['writer_rate']:,.0f} changes/s + catch-up service running | {boot['wall']:.1f} | "
             f"{fmt_rate(rate(boot['wall']))} | {boot['inner']:.1f} | {fmt_rate(rate(boot['inner']))} | "
             "1.00× / 1.00× |",
             f"| ours: full load, {args.channels} channels | quiet | {full['wall']:.1f} | "
             f"{fmt_rate(rate(full['wall']))} | {full['inner']:.1f} | {fmt_rate(rate(full['inner']))} | "
             f"{fmt_ratio(full['wall'], boot['wall'])} / {fmt_ratio(full['inner'], boot['inner'])} |",
             f"| ours: full load, {args.channels} channels | the same writer (no catch-up) | {busy['wall']:.1f} | "
             f"{fmt_rate(rate(busy['wall']))} | {busy['inner']:.1f} | {fmt_rate(rate(busy['inner']))} | "
             f"{fmt_ratio(busy['wall'], boot['wall'])} / {fmt_ratio(busy['inner'], boot['inner'])} |",
             f"| ours: bootstrap, same settings | quiet (no writer, no catch-up) | {quiet['wall']:.1f} | "
             f"{fmt_rate(rate(quiet['wall']))} | {quiet['inner']:.1f} | {fmt_rate(rate(quiet['inner']))} | "
             f"{fmt_ratio(quiet['wall'], boot['wall'])} / {fmt_ratio(quiet['inner'], boot['inner'])} |"]
    if replicator.get("wall"):
        lines.append(f"| mysql-ch-replicator initial copy, 2 workers | quiet | {replicator['wall']:.1f} | "
                     f"{fmt_rate(rate(replicator['wall']))} | — | — | "
                     f"{fmt_ratio(replicator['wall'], boot['wall'])} / — |")
    else:
        lines.append(f"| mysql-ch-replicator initial copy | quiet | > {args.replicator_cap:.0f} (stopped) | | | | |")
    lag = f"{boot['lag']:.1f} s" if boot["lag"] is not None else "not reached"
    lines += ["",
              f"* Bootstrap: {boot['rows']:,} rows in {boot['chunks']} chunks over {boot['shards']} shards; the writer "
              f"made {boot['writer_changes']:,} row changes meanwhile ({boot['held']} transactions held open 1.5 s). "
              f"Reconciliation with checksums after catch-up: **{boot['verdict']}**"
              + (f" (mismatched shards {boot['mismatched']})" if boot["mismatched"] else "") + ".",
              f"* Catch-up lag after the bootstrap ended (until the pipeline passed the bootstrap's end position): "
              f"**{lag}**; after the writer stopped the pipeline reached the source's position in "
              f"{boot['drain']:.1f} s.",
              f"* Goals: ≥ 0.9× our full load — under writes {fmt_ratio(full['wall'], boot['wall'])} wall, "
              f"{fmt_ratio(full['inner'], boot['inner'])} in-job (against the full load under the same writes: "
              f"{fmt_ratio(busy['wall'], boot['wall'])} wall, {fmt_ratio(busy['inner'], boot['inner'])} in-job); "
              f"quiet {fmt_ratio(full['wall'], quiet['wall'])} wall, "
              f"{fmt_ratio(full['inner'], quiet['inner'])} in-job; ≥ 3× mysql-ch-replicator — "
              f"{fmt_ratio(replicator.get('wall'), boot['wall'])} wall; lag < 5 s — {lag}.",
              "* Load average during the bootstrap under writes / CPU of processes not in the bench: "
              f"{boot['sampler'].contention()}",
              "* CPU seconds per process group while each ran, bootstrap quiet → bootstrap under writes (full load "
              "under the same writes); under writes includes the catch-up service's JVM and Python driver; the writer "
              "runs in the bench's own process and is not counted: " + "; ".join(
                  f"{group} {cpu['quiet'].get(group, 0):.1f} → {cpu['boot'].get(group, 0):.1f} "
                  f"({cpu['busy'].get(group, 0):.1f})" for group in GROUPS) + ".",
              "* The full load and mysql-ch-replicator copy a quiet source; the bootstrap shares the two cores with "
              "the writer's MariaDB work and the catch-up service (a second spark-submit applying the changes).", ""]
    return lines


if __name__ == "__main__":
    main()

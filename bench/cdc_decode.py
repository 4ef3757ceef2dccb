"""A reader process's CPU per row change: the binlog reader (spark/cdc_stream.py's ``_read_batches``
without the hand-over) over one captured backlog, decoding row images with the generated code
(core/cdc/rowimage.py) and with the reference (python-mysql-replication and ``TableRoute.row``),
in this process, one after the other, each ``--repeat`` times (the least CPU counts: the machine
is shared).

    .venv/bin/python -m bench.cdc_decode [--changes 200000] [--repeat 3] [--profile]

The backlog is bench/cdc_apply.py's: its 10-column ``orders`` table with 100k rows, then
``--changes`` row changes (60/30/10 % inserts/updates/deletes, set-based statements in
transactions of 10–100 rows). A pass reads it in batches of 50,000 changes into 4 lanes and
builds the lanes' Arrow IPC payloads, as a reader process does; "decode" is the same without the
payloads. ``--profile`` adds each path's cProfile summary (its 12 costliest functions).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import time

from airflow_sync_provider.core.cdc.binlog.reader import BinlogReader, batches
from airflow_sync_provider.core.cdc.binlog.routes import TableRoute
from airflow_sync_provider.core.cdc.ring import HashRing
from airflow_sync_provider.core.positions import current_position
from airflow_sync_provider.core.source.schema import read_table_schema
from airflow_sync_provider.spark.cdc_stream import Weigher, _lane_payloads
from bench.cdc_apply import INITIAL_ROWS, SOURCE_DB, TABLE, create_source, generate_changes
from bench.harness.clients import mysql, source
from bench.harness.env import machine, state_dir, write_result
from bench.harness.measure import fmt_load
from bench.harness.processes import ProcessSampler
from devenv.services import mysql_service

LANES, BATCH = 4, 50_000


class _Reference:
    """A reader's decoders with none available: every rows event goes to the reference."""

    def __init__(self, decoders):
        self.lane_of = decoders.lane_of

    def get(self, event, route):
        return None


def one_pass(endpoint, start, stop, routes, reference: bool, payloads: bool) -> tuple[int, float]:
    """(row changes, CPU seconds) of reading ``start``…``stop`` once."""
    reader = BinlogReader(endpoint, start, routes, HashRing(LANES, 256), 4400)
    if reference:
        reader._decoders = _Reference(reader._decoders)
    changes = 0
    with ProcessSampler(self_cpu=True) as cpu:  # this process's CPU (the sampler's own excepted)
        try:
            for batch in batches(reader, stop, BATCH, 30.0):
                if payloads:
                    with Weigher(endpoint) as weigh:
                        _lane_payloads(batch, routes, LANES, weigh)
                changes += batch.events
        finally:
            reader.close()
    return changes, cpu.cpu()


def profile(endpoint, start, stop, routes, reference: bool) -> str:
    profiler = cProfile.Profile()
    profiler.enable()
    one_pass(endpoint, start, stop, routes, reference, True)
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(12)
    lines = [line for line in out.getvalue().splitlines() if line.strip()]
    start_at = next(i for i, line in enumerate(lines) if line.lstrip().startswith("ncalls"))
    return "\n".join([lines[0].strip(), *lines[start_at:]]).replace(os.getcwd() + "/", "")


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--changes", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args(argv)
    load = os.getloadavg()
    with mysql_service(state_dir("cdc-decode")) as mysql_url:
        endpoint = source(mysql_url)
        create_source(mysql_url, INITIAL_ROWS)
        conn = mysql(endpoint)
        start = current_position(conn)
        generated = generate_changes(mysql_url, args.changes, INITIAL_ROWS + 1, seed=1)
        stop = current_position(conn)
        route = TableRoute(read_table_schema(conn, SOURCE_DB, TABLE), "bench", TABLE)
        conn.close()
        routes = {route.source: route}
        best = {}
        for _ in range(args.repeat):  # interleaved, so both see the same machine
            for reference in (True, False):
                for payloads in (False, True):
                    changes, cpu = one_pass(endpoint, start, stop, routes, reference, payloads)
                    assert changes == generated["changes"], (changes, generated)
                    key = (reference, payloads)
                    best[key] = min(best.get(key, cpu), cpu)
        profiles = {reference: profile(endpoint, start, stop, routes, reference)
                    for reference in (True, False)} if args.profile else {}
    n = generated["changes"]
    per = {key: cpu / n * 100_000 for key, cpu in best.items()}
    lines = [f"# Reader CPU per row change (bench/cdc_decode.py) — {time.strftime('%Y-%m-%d')}", "",
             f"Machine: {machine()}; load average at start {fmt_load(load)}, at end {fmt_load(os.getloadavg())}.", "",
             f"One reader in this process over bench/cdc_apply.py's backlog: {n:,} row changes "
             f"({generated['counts']}) in {generated['transactions']:,} transactions; batches of {BATCH:,}, "
             f"{LANES} lanes; the least CPU of {args.repeat} interleaved passes each.", "",
             "| row images decoded by | CPU-s per 100,000 row changes: decode | + lane payloads (a reader "
             "process's work) | µs per row change |",
             "|---|---|---|---|"]
    for reference, name in ((True, "python-mysql-replication + `TableRoute.row` (the reference)"),
                            (False, "code generated per table map (core/cdc/rowimage.py)")):
        lines.append(f"| {name} | {per[(reference, False)]:.2f} | {per[(reference, True)]:.2f} | "
                     f"{per[(reference, True)] * 10:.1f} |")
    lines += ["", f"Reference ÷ generated: decode **{per[(True, False)] / per[(False, False)]:.1f}×**, a reader "
                  f"process's work **{per[(True, True)] / per[(False, True)]:.1f}×**."]
    for reference, text in profiles.items():
        lines += ["", f"cProfile, {'reference' if reference else 'generated code'} (one pass with payloads; "
                      "the profiler's own cost inflates many small calls):", "", "```", text, "```"]
    write_result("cdc_decode", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

"""CDC catch-up with a copy's history on against off, side by side in one run (issue 61, slice 2):
``python -m bench.cdc_apply --history [--changes 100000] [--repeat 2]``.

The scenario of bench/cdc_apply.py (a 100k-row ``orders`` table full-loaded, then N row changes
written before the appliers start): each variant has its own full load (its P0); the "on" variant's
history is begun before the changes (a bounded run to P0: the baseline of the 100k loaded rows is
not timed). Then rounds, interleaved, each a new pipeline over P0 → P1 through ``spark_submit``
(a round after the first replays onto the same copy and history: same versions, same rows, which
collapse); changes/s from the job's own seconds, best round; every run's copy checked row for row.
The history's size: its parts on disk after ``OPTIMIZE … FINAL``, per million history rows the
stream wrote, beside the copy's.
"""

from __future__ import annotations

import datetime as dt
import os
import time
import uuid

from airflow_sync_provider.core.selection import TableSet
from airflow_sync_provider.core.submission import spark_submit
from bench.cdc_apply import (
    INITIAL_ROWS,
    SOURCE_DB,
    TABLE,
    cdc_role,
    cdc_spec,
    create_source,
    generate_changes,
    position,
    run_full_load,
    source_summary,
    target_summary,
    verify_rows,
)
from bench.harness.clients import ch_client, drop_bench_data, target_databases
from bench.harness.env import machine, services, write_result
from bench.harness.jobs import JOB_TIMEOUT
from bench.harness.measure import fmt_load, fmt_rate, fmt_rounds, interleaved, rate, timer
from bench.harness.processes import ProcessSampler, process_group

VARIANTS = (("history off", False, "bench_cdc_hoff"), ("history on", True, "bench_cdc_hon"))


def _spec(mysql_url, ch_url, args, history: bool, **kwargs):
    return cdc_spec(mysql_url, ch_url, f"bench-cdc-history-{uuid.uuid4().hex[:8]}", args,
                    tableset=TableSet(content={"history": True} if history else {}), **kwargs)


def _run(mysql_url, ch_url, args, history: bool, load_key: str, stop: dict, expect, db: str) -> dict:
    spec = _spec(mysql_url, ch_url, args, history, start_from_loads=[load_key], stop_position=stop,
                 batch_seconds=args.batch_seconds)
    with ProcessSampler(roles=_role) as sampler, timer() as wall:
        result = spark_submit(spec, timeout=JOB_TIMEOUT)
    assert result.get("status") == "success", result
    ch = ch_client(ch_url)
    try:
        summary = target_summary(ch, db)
    finally:
        ch.close()
    rows = verify_rows(mysql_url, ch_url, db)
    assert summary == expect and rows["ok"], (db, summary, expect, rows)
    return {"wall": wall["seconds"], "inner": float(result["seconds"]), "events": result["events"],
            "cpu": sampler.cpu_by_role()}


def _role(cmd: list[str], parent: list[str]) -> str | None:
    """The job's processes as bench/cdc_apply.py names them, and the services (the ClickHouse endpoint's
    CPU: where a history's inserts and merges go)."""
    return cdc_role(cmd, parent) or process_group(cmd, parent)


def _sizes(ch_url, db: str) -> dict:
    """The copy's and the history's bytes on disk (merged), the history's rows by how they came."""
    ch = ch_client(ch_url)
    try:
        for table in (TABLE, f"{TABLE}_history"):
            ch.command(f"OPTIMIZE TABLE `{db}`.`{table}` FINAL")
        size = dict(ch.query("SELECT table, sum(bytes_on_disk) FROM system.parts WHERE database = {d:String} AND "
                             "active GROUP BY table", parameters={"d": db}).result_rows)
        rows = dict(ch.query(f"SELECT _via, count() FROM `{db}`.`{TABLE}_history` FINAL GROUP BY _via").result_rows)
        copy_rows = int(ch.command(f"SELECT count() FROM `{db}`.`{TABLE}`"))
    finally:
        ch.close()
    return {"copy_bytes": int(size.get(TABLE, 0)), "history_bytes": int(size.get(f"{TABLE}_history", 0)),
            "rows": {str(k): int(v) for k, v in rows.items()}, "copy_rows": copy_rows}


def history_comparison(args) -> None:
    load_start, started = os.getloadavg(), time.monotonic()
    runs = {name: [] for name, *_ in VARIANTS}
    with services("cdc-history") as (mysql_url, ch_url):
        dbs = [db for *_, db in VARIANTS]
        target_databases(ch_url, create=dbs, drop=dbs)
        create_source(mysql_url, INITIAL_ROWS)
        loads = {name: run_full_load(mysql_url, ch_url, db) for name, _, db in VARIANTS}
        for name, history, _ in VARIANTS:  # the history begun before the changes (its baseline untimed)
            if history:
                begun = spark_submit(_spec(mysql_url, ch_url, args, True, start_from_loads=[loads[name]["load_key"]],
                                           stop_position=loads[name]["start"]), timeout=JOB_TIMEOUT)
                assert begun.get("status") == "success", begun
        gen = generate_changes(mysql_url, args.changes, INITIAL_ROWS + 1, args.seed)
        stop, expect = position(mysql_url), source_summary(mysql_url)
        print(f"generated {gen['changes']:,} row changes in {gen['transactions']:,} transactions", flush=True)
        for round_, (name, history, db) in interleaved(VARIANTS, args.repeat):
            run = _run(mysql_url, ch_url, args, history, loads[name]["load_key"], stop.to_dict(), expect, db)
            runs[name].append(run)
            print(f"round {round_ + 1}, {name}: {run['events']:,} events in {run['inner']:.2f} s job", flush=True)
        sizes = _sizes(ch_url, VARIANTS[1][2])
        if not args.keep:
            drop_bench_data(mysql_url, ch_url, source_dbs=[SOURCE_DB], target_dbs=dbs)
    load_end = os.getloadavg()
    best = {name: min(r["inner"] for r in rs) for name, rs in runs.items()}
    events = runs[VARIANTS[0][0]][0]["events"]
    off, on = (rate(events, best[name]) for name, *_ in VARIANTS)
    streamed = sizes["rows"].get("binlog", 0)
    per_million = sizes["history_bytes"] / max(1, sum(sizes["rows"].values())) * 1e6
    lines = [f"# CDC catch-up with a history on vs off — {dt.date.today()}", "", f"Machine: {machine()}", "",
             f"`python -m bench.cdc_apply --history --changes {args.changes} --repeat {args.repeat}`: one bounded "
             f"catch-up (`spark_submit(CdcApplySpec)`, {args.lanes} lanes) of the same binlog range, {events:,} row "
             f"changes of the 10-column table of bench/cdc_apply.py (a {INITIAL_ROWS:,}-row full load first, per "
             "variant; the history's baseline of the loaded rows written before the changes, not timed), into the "
             "chDB stand-in. Variants interleaved, best round by the job's own seconds; every run's copy checked "
             "row for row against the source (rounds after the first replay onto the same copy and history).", "",
             f"Load average (1/5/15 min) at start {fmt_load(load_start)}, at end {fmt_load(load_end)}; "
             f"{(time.monotonic() - started) / 60:.1f} min in all (the machine is shared with other jobs).", "",
             "| variant | job s (each round) | changes/s (best) | vs off |", "|---|---|---|---|"]
    for name, *_ in VARIANTS:
        lines.append(f"| {name} | {fmt_rounds((r['inner'] for r in runs[name]), sep=' / ')} | "
                     f"{fmt_rate(rate(events, best[name]))} | {rate(events, best[name]) / off:.2f}× |")
    roles = sorted({r for rs in runs.values() for run in rs for r in run["cpu"]})
    lines += ["", "CPU-seconds by process in each variant's best round (bench/harness ProcessSampler; the services' "
              "included: the ClickHouse endpoint takes the inserts and merges):", "",
              "| variant | " + " | ".join(roles) + " |", "|---|" + "---|" * len(roles)]
    for name, *_ in VARIANTS:
        fastest = min(runs[name], key=lambda r: r["inner"])["cpu"]
        lines.append(f"| {name} | " + " | ".join(f"{fastest.get(r, 0.0):.1f}" for r in roles) + " |")
    lines += ["", f"History size after `OPTIMIZE … FINAL`: {sizes['history_bytes'] / 2**20:.1f} MiB for "
              f"{sum(sizes['rows'].values()):,} rows ({streamed:,} from the binlog, "
              f"{sizes['rows'].get('enable', 0):,} the baseline): **{per_million / 2**20:.1f} MiB per million "
              f"history rows** (one per row change), beside the copy's {sizes['copy_bytes'] / 2**20:.1f} MiB for "
              f"{sizes['copy_rows']:,} rows. On/off: {on / off:.2f}× (the issue's goal: ≥ 0.8×)."]
    write_result("cdc_history", "\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)

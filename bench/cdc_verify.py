"""CDC lag with the rolling verification beside the stream (issue 34): our service-mode applier
under a steady ≈2,000 row changes/s on bench/cdc_apply.py's ``orders`` table of 1M and 10M rows,
in one run per size, three phases on the same data:

  (a) ``verify_period=0``: no verification (the stream alone);
  (b) the defaults (``verify_period=900``, ``verify_budget=0.1``): every table's pass spread over
      a quarter of an hour;
  (c) ``verify=True``: every table due at once, as after a takeover or a DDL — a whole pass at the
      budget's pace, the heaviest load the defaults ever put on the source.

Lag = now − the newest ``changed_at`` visible in the target, every 0.5 s (bench/cdc_apply.run_lag).
Source CPU = the MariaDB server's CPU time during the phase (/proc), per second of the phase.
The chDB stand-in runs one statement at a time: a look's ClickHouse query waits for the lanes'
inserts and they for it (a real server runs them side by side).

    .venv/bin/python -m bench.cdc_verify [--rows 1000000 10000000] [--seconds 60] [--quick]
"""

from __future__ import annotations

import argparse
import time
import uuid

from airflow_sync_provider.core.submission import spark_submit
from bench import cdc_apply as base
from bench.harness.env import machine, services, write_result
from bench.harness.jobs import JOB_TIMEOUT
from bench.harness.processes import ProcessSampler


def phase(mysql_url, ch_url, args, rows: int, name: str, extra: dict, next_id: int) -> dict:
    pipeline = f"bench-verify-{rows}-{name}-{uuid.uuid4().hex[:6]}"
    # a new pipeline from the table's full load: each phase starts at the same place
    spec = base.cdc_spec(mysql_url, ch_url, pipeline, args, start_from_loads=[args.load_key], reset=True,
                         verify_period=0)
    result = spark_submit(spec, timeout=JOB_TIMEOUT)
    assert result.get("status") == "success", result
    with ProcessSampler() as sampler:  # the bench's own MariaDB: its CPU during the phase
        out = base.run_lag(mysql_url, ch_url, args, pipeline, next_id, extra=extra)
    out["source_cpu"] = sampler.cpu_by_role().get("MariaDB", float("nan")) / max(1e-9, sampler.seconds)
    verified = (out.get("result") or {}).get("verified") or []
    out["passes"] = len(verified)
    out["repaired"] = (out.get("result") or {}).get("repaired_shards")
    out["pass_seconds"] = [v.get("seconds") for v in verified]
    out["pass_slices"] = [v.get("shards") for v in verified]
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, nargs="+", default=None, help="table sizes (1M 10M; quick: 100k 1M)")
    parser.add_argument("--seconds", type=float, default=None, help="each phase's service run (60; quick 30)")
    parser.add_argument("--write-rate", type=float, default=2000.0)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--lanes", type=int, default=base.CdcApplySpec.__dataclass_fields__["lanes"].default)
    parser.add_argument("--batch-events", type=int,
                        default=base.CdcApplySpec.__dataclass_fields__["batch_events"].default)
    args = parser.parse_args(argv)
    sizes = args.rows or ([100_000, 1_000_000] if args.quick else [1_000_000, 10_000_000])
    args.lag_seconds = args.seconds or (30.0 if args.quick else 60.0)
    phases = [("a", "no verification (verify_period=0)", {"verify_period": 0}),
              ("b", "defaults (verify_period=900, verify_budget=0.1)", {}),
              ("c", "every table due (verify=True: a whole pass at the budget's pace)", {"verify": True})]
    started = time.time()
    results = {}
    with services("cdc-verify") as (mysql_url, ch_url):
        for rows in sizes:
            base.create_source(mysql_url, rows)
            load = base.run_full_load(mysql_url, ch_url)
            args.load_key = load["load_key"]
            next_id = rows + 1
            for key, _, extra in phases:
                print(f"[bench] {rows:,} rows, phase ({key})", flush=True)
                results[(rows, key)] = phase(mysql_url, ch_url, args, rows, key, extra, next_id)
                next_id += int(args.write_rate * args.lag_seconds * 2) + 1000
    lines = report(args, sizes, phases, results, time.time() - started)
    write_result("cdc_verify", "\n".join(lines) + "\n")
    return 0


def _f(value, digits=2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def report(args, sizes, phases, results, total) -> list[str]:
    lines = ["# CDC lag with the rolling verification (bench/cdc_verify.py)", "",
             f"Machine: {machine()}. Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {total / 60:.1f} min.",
             f"Writer: ≈{args.write_rate:,.0f} row changes/s (bench/cdc_apply.py's mix), each phase "
             f"{args.lag_seconds:g} s of service mode. ClickHouse is the single-statement chDB stand-in.", "",
             "| rows | phase | lag p50 s | lag p99 s | lag max s | source CPU (cores) | passes done | slices a pass | "
             "a pass's seconds | repaired |", "|---|---|---|---|---|---|---|---|---|---|"]
    for rows in sizes:
        for key, text, _ in phases:
            r = results[(rows, key)]
            lines.append(f"| {rows:,} | ({key}) {text} | {_f(r.get('steady_p50'))} | {_f(r.get('steady_p99'))} | "
                         f"{_f(r.get('max'))} | {_f(r.get('source_cpu'), 3)} | {r.get('passes')} | "
                         f"{', '.join(str(s) for s in r.get('pass_slices') or []) or '—'} | "
                         f"{', '.join(_f(s, 1) for s in r.get('pass_seconds') or []) or '—'} | "
                         f"{r.get('repaired')} |" + ("" if r.get("ok") else f" FAILED: {r.get('error', '')[:200]}"))
    lines += ["", "Lag percentiles are of the samples after the writer's first 5 s. Source CPU is the MariaDB "
              "server's CPU over the phase (the writer's statements included): (b) − (a) and (c) − (a) are what "
              "the verification costs while it runs. Averaged over the period, the defaults cost a pass's "
              "hashing ÷ 900 s: ≈1.3 µs a row on MariaDB, 1.3 s (1M rows) or 13 s (10M) a pass — 0.14 % and "
              "1.4 % of a core."]
    for rows in sizes:
        a, b, c = (results[(rows, k)] for k in ("a", "b", "c"))
        lines.append(f"- {rows:,} rows: p99 {_f(a.get('steady_p99'))} s without, {_f(b.get('steady_p99'))} s with "
                     f"the defaults, {_f(c.get('steady_p99'))} s during a whole due pass; source CPU +"
                     f"{_f((b.get('source_cpu') or 0) - (a.get('source_cpu') or 0), 3)} / +"
                     f"{_f((c.get('source_cpu') or 0) - (a.get('source_cpu') or 0), 3)} cores.")
    return lines


if __name__ == "__main__":
    raise SystemExit(main())

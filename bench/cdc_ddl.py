"""CDC lag through schema changes and self-verification: our service-mode applier under a
steady writer on a 1M-row table (a) without DDL, (b) with an ``ALTER TABLE … ADD COLUMN cN INT
DEFAULT N`` every 30 s (followed in place: ClickHouse ADD COLUMN with the default), (c) through
one DDL that forces a re-copy of the table (``ADD COLUMN added_at DATETIME DEFAULT
CURRENT_TIMESTAMP``: a time-dependent default, spark/cdc_ddl.py re-copies the table with the
bootstrap's chunks, beside the stream), and (d) without DDL but with ``verify_every=30`` (the
table checked against the source every 30 s, spark/cdc_verify.py).

    .venv/bin/python -m bench.cdc_ddl [--quick] [--rows 1000000] [--phase-seconds 90] [--verify-every 30] [--keep]

Built on bench/cdc_apply.py (its table, row values, change mix, writer, full load and
service-mode lag measurement): 1M rows (quick: 100k) full-loaded by our full load, one bounded
catch-up run that starts the pipeline from the load, then four service runs of
``--phase-seconds`` each (90; quick 30) one after the other on the same pipeline, each with a
writer at ``--write-rate`` (2,000) row changes/s; every 0.5 s lag = now − newest ``changed_at``
in the target (as bench/cdc_apply.py), and the checkpoint's lag = now − the source timestamp of
the last checkpointed transaction (1 s resolution; it does not move while a DDL is followed).

* (a) no DDL;
* (b) ``ALTER TABLE orders ADD COLUMN cN INT DEFAULT N`` at 15, 45, 75 s after the writer's
  first commit (quick: every 10 s from 5 s);
* (c) one re-copying DDL at 20 s (quick 8 s): the re-copy's seconds from the applier's own
  line ("re-copied from … N rows in X s") and the pipeline's checkpoint (``last_recopy`` in its
  tables JSON), and the lag around it;
* (d) no DDL, ``verify_every`` 30 s (quick 10): every verification's duration, shards, mismatched
  and repaired shards (the job's result ``verified``: spark/cdc_verify.record's outcome with its
  ``seconds``) and the lag during it. A right copy must never be "repaired": any repaired shard
  is reported as such.

Phases (b) and (c) run with the default ``verify_after_ddl=True``: the verification after each
DDL (after the re-copy in (c)) is timed the same way.

After each phase: target = source (count, Σ amount, Σ id, FINAL), every ``cN`` equal to N in
every row of the copy; at the end a row-for-row comparison (tests/helpers.assert_same_rows).

Services: private MariaDB + chDB endpoint under $BENCH_STATE (default /tmp/airflow-sync-bench-cdc-ddl),
or MYSQL_URL / CLICKHOUSE_URL.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import subprocess
import tempfile
import threading
import time
import uuid

from airflow_sync_provider.core.cdc.checkpoints import Checkpoints
from airflow_sync_provider.core.jobspec import CdcApplySpec
from airflow_sync_provider.core.sql import ch_ident, ch_table
from airflow_sync_provider.core.submission import spark_submit
from bench.cdc_apply import (
    POLL,
    ROW_VALUES,
    SOURCE_DB,
    TABLE,
    TARGET_DB,
    Changes,
    Lags,
    ServiceRun,
    Writer,
    batches,
    cdc_spec,
    create_source,
    level_after,
    position,
    run_full_load,
    verify_rows,
)
from bench.harness.clients import ch_client, drop_bench_data, mysql, target_databases
from bench.harness.env import REPO, machine, services, write_result
from bench.harness.jobs import JOB_TIMEOUT
from bench.harness.measure import fmt_load, fmt_num, fmt_ratio, percentile, timer
from bench.harness.processes import ProcessSampler

BASE_COLUMNS = ("id, customer_id, amount, discount, status, note, created_at, changed_at, weight, priority")
RECOPY_DDL = "ADD COLUMN added_at DATETIME DEFAULT CURRENT_TIMESTAMP"
f2 = fmt_num  # the report's seconds: 2 decimals, "—" for none
# phase (c) in the results before re-copies ran beside the stream (bench/results/cdc_ddl.md of
# 2026-11-25 02:42 UTC, code 4136cb7: the stream waited for the re-copy; no verification yet)
PREVIOUS_C = {"code": "4136cb7", "at": "20.0", "source": "0.02", "began": "0.55", "rows": "1,188,707",
              "seconds": "7.10", "last_recopy": "1,188,707 rows in 7.15", "recopied_after": "7.66", "lag_max": "5.88",
              "checkpoint_max": "10.63", "recovered": "14.08"}


class NamedChanges(Changes):
    """bench/cdc_apply.py's change mix, with inserts that name their columns (the table gains
    columns during the run; the new ones take their defaults)."""

    def statement(self, size: int) -> int:
        if self.kind(size) != "insert":
            return super().statement(size)
        base, self.next_id = self.next_id, self.next_id + size
        self.cur.execute(f"INSERT INTO `{TABLE}` ({BASE_COLUMNS}) SELECT {ROW_VALUES.format(changed_at='NOW(6)')} "
                         f"FROM (SELECT CAST({base} + seq AS SIGNED) AS id FROM seq_1_to_{size}) s")
        affected = max(0, self.cur.rowcount)
        self.counts["insert"] += affected
        self.statements["insert"] += 1
        return affected


class DdlWriter(Writer):
    """bench/cdc_apply.Writer (same pacing, same statements) with :class:`NamedChanges`."""

    changes_class = NamedChanges


class DdlRunner(threading.Thread):
    """Runs each ``(offset, statement)`` on its own connection ``offset`` s after the writer's
    first commit (skipped if the writer has stopped by then)."""

    def __init__(self, mysql_url: str, writer: DdlWriter, schedule: list[tuple[float, str]]):
        super().__init__(daemon=True)
        self.mysql_url, self.writer, self.schedule = mysql_url, writer, schedule
        self.done: list[dict] = []
        self.stop_event = threading.Event()

    def run(self):
        while self.writer.first_commit is None and self.writer.is_alive() and not self.stop_event.is_set():
            time.sleep(0.01)
        if self.writer.first_commit is None:
            return
        with mysql(self.mysql_url, SOURCE_DB) as conn, conn.cursor() as cur:
            for offset, statement in self.schedule:
                at = self.writer.first_commit + offset
                while time.time() < at and not self.stop_event.is_set():
                    time.sleep(0.01)
                if self.stop_event.is_set() or not self.writer.is_alive():
                    break
                entry = {"statement": statement, "offset": offset, "start": time.time()}
                try:
                    cur.execute(f"ALTER TABLE `{TABLE}` {statement}")
                except Exception as exc:
                    entry["error"] = f"{type(exc).__name__}: {exc}"
                entry["end"] = time.time()
                self.done.append(entry)
                print(f"  DDL at {entry['start'] - self.writer.first_commit:.1f} s: {statement} "
                      f"({entry['end'] - entry['start']:.2f} s on the source){' ' + entry.get('error', '')}",
                      flush=True)


class LogTail(threading.Thread):
    """The job's own lines (``[airflow-sync] …``) with the time this process first saw each."""

    def __init__(self, path: str):
        super().__init__(daemon=True)
        self.path, self.lines = path, []
        self.stop_event = threading.Event()

    def run(self):
        offset, partial = 0, ""
        while True:
            stopping = self.stop_event.is_set()
            try:
                with open(self.path, errors="replace") as f:
                    f.seek(offset)
                    chunk = f.read()
                    offset = f.tell()
            except OSError:
                chunk = ""
            now = time.time()
            partial += chunk
            *complete, partial = partial.split("\n")
            self.lines += [(now, line) for line in complete if "[airflow-sync]" in line]
            if stopping:
                return
            self.stop_event.wait(0.1)


def ch_columns(ch) -> dict:
    return dict(ch.query("SELECT name, type FROM system.columns WHERE database = {d:String} AND table = {t:String}",
                         parameters={"d": TARGET_DB, "t": TABLE}).result_rows)


def run_phase(mysql_url, ch_url, args, pipeline: str, name: str, next_id: int, schedule: list, seed: int,
              logdir: str, options: dict | None = None) -> dict:
    """One service run of ``args.phase_seconds`` under the writer, ``schedule``'s DDL issued
    meanwhile; the lag sampled as bench/cdc_apply.run_lag does, plus the checkpoint's lag."""
    seconds = args.phase_seconds
    spec = cdc_spec(mysql_url, ch_url, pipeline, args, service=True, max_seconds=seconds, batch_seconds=0.5,
                    **(options or {}))
    ch = ch_client(ch_url)
    checkpoints = Checkpoints(ch)
    log_path = os.path.join(logdir, f"{name}.log")
    tailer = LogTail(log_path)
    batches_before = batches(ch, pipeline)
    job = ServiceRun(spec, seconds + 900, log=log_path)
    tailer.start()
    out = {"name": name, "seconds": seconds, "log": log_path, "startup": job.start(checkpoints)}
    if not job.alive():
        result = job.finish(0)
        tailer.stop_event.set()
        tailer.join()
        out |= {"ok": False, "error": f"the service job ended before it was running: {result}", "lines": tailer.lines}
        ch.close()
        return out
    writer = DdlWriter(mysql_url, args.write_rate, job.running_at + seconds - max(3.0, seconds * 0.1), next_id,
                       seed=seed)
    ddl = DdlRunner(mysql_url, writer, schedule)
    lags = Lags(writer, ch, ch_table(TARGET_DB, TABLE))
    checkpoint_lags = []  # (s since the writer's first commit, now − checkpoint's source time)
    with ProcessSampler(interval=1.0) as sampler:
        writer.start()
        ddl.start()
        for polls, sample in enumerate(s for s in lags.polls(job.alive) if s is not None):
            if polls % 2 == 0:  # every other poll: the checkpoint's own lag, once it is at this phase's changes
                state = checkpoints.state(pipeline)
                if state and state.source_time >= int(writer.started):
                    checkpoint_lags.append((sample[0], time.time() - state.source_time))
        writer.stop_event.set()
        ddl.stop_event.set()
        writer.join()
        ddl.join()
        result = job.finish(seconds + 900)
    tailer.stop_event.set()
    tailer.join()
    first = writer.first_commit or 0
    out |= {"ok": result.get("status") == "success", "result": result, "wall": job.wall, "writer": writer,
            **lags.summary(), "checkpoint_lags": checkpoint_lags,
            "checkpoint_max": max((v for _, v in checkpoint_lags), default=None),
            "written": writer.changes.total if writer.changes else 0, "achieved": writer.achieved,
            "writer_seconds": (writer.stopped - writer.started) if writer.started else 0,
            "ddl": ddl.done, "first_commit": first, "lines": tailer.lines, "sampler": sampler,
            "batches": batches(ch, pipeline) - batches_before}
    samples = lags.samples
    # each DDL: when the applier logged it followed (or re-copied), the lag around it
    for entry in ddl.done:
        entry["at"] = entry["start"] - first
    for i, entry in enumerate(ddl.done):
        until = ddl.done[i + 1]["at"] if i + 1 < len(ddl.done) else float("inf")  # up to the next DDL
        column = entry["statement"].split()[2]
        after = [(t, line) for t, line in tailer.lines if t >= entry["start"]]
        follows = next((t for t, line in after if " follows " in line and column in line), None)
        changed = next((t for t, line in after if " changed at " in line and column in line), None)
        recopying = next((t for t, line in after if " re-copying " in line), None)
        recopied = next(((t, line) for t, line in after if " re-copied from " in line), None)
        entry["follows_after"] = follows - entry["end"] if follows else None
        entry["changed_after"] = changed - entry["end"] if changed else None
        entry["recopy_started_after"] = recopying - entry["end"] if recopying else None
        if recopied:
            entry["recopied_after"] = recopied[0] - entry["end"]
            m = re.search(r"re-copied from (.+?): ([\d,]+) rows in ([\d.]+) s", recopied[1])
            if m:
                entry["recopy_line"] = {"position": m.group(1), "rows": int(m.group(2).replace(",", "")),
                                        "seconds": float(m.group(3))}
        window = [lag for at, lag, *_ in samples if entry["at"] <= at <= entry["at"] + args.window]
        entry["window_max"] = max(window) if window else None
        entry["window_p50"] = percentile(window, 0.5)
        entry["max_after"] = max((lag for at, lag, *_ in samples if entry["at"] <= at < until), default=None)
        cp = [v for at, v in checkpoint_lags if entry["at"] <= at < until]
        entry["checkpoint_max_after"] = max(cp) if cp else None
        # recovered: the first sample after the lag's peak that is back at the phase's usual lag
        peak_at = max(((at, lag) for at, lag, *_ in samples if entry["at"] <= at < until), key=lambda s: s[1],
                      default=(None, None))[0]
        # the phase's usual lag: its median after the first 5 s and before its first DDL (a verification
        # after a DDL raises the whole phase's median)
        before = [lag for at, lag, lower, _ in samples if 5.0 <= at < ddl.done[0]["at"] and not lower]
        threshold = max(1.0, 2 * (percentile(before, 0.5) or out["steady_p50"] or 0))
        back = next((at for at, lag, *_ in samples if peak_at is not None and peak_at <= at < until
                     and lag <= threshold), None)
        entry["recovered_after"] = back - entry["at"] if back is not None else None
        entry["recovered_threshold"] = threshold
    out["verifications"] = verifications(result, samples, checkpoint_lags, first, args.window)
    state = checkpoints.state(pipeline)
    out["tables"] = [t.to_dict() for t in state.tables] if state else []
    out["columns"] = ch_columns(ch)
    if not out["ok"]:
        out["error"] = str(result.get("error"))[:4000]
    ch.close()
    return out


def verifications(result: dict, samples: list, checkpoint_lags: list, first: float, window: float) -> list[dict]:
    """Each look of the job's verifications (its result's ``verified``: spark/cdc_verify.record's
    outcome, ``at`` = when it ended, ``seconds`` = how long the look took, catch-up included),
    placed on the writer's clock, with the lag during it and ``window`` s after."""
    out = []
    for v in result.get("verified") or []:
        seconds = v.get("seconds")
        ended = v["at"] - first
        began = ended - (seconds or 0.0)
        during = [lag for at, lag, *_ in samples if began <= at <= ended + window]
        cp = [lag for at, lag in checkpoint_lags if began <= at <= ended + window]
        out.append(v | {"began": began, "ended": ended, "lag_max": max(during) if during else None,
                        "checkpoint_max": max(cp) if cp else None, "samples_during": len(during)})
    return out


def check_after(mysql_url, ch_url, args, pipeline: str, phase: dict, added: list[tuple[str, int]]) -> None:
    """Target = source after the phase (a bounded run first if the service stopped behind), and
    every added ``cN`` = N in every row of the copy."""
    level_after(mysql_url, ch_url, args, pipeline, phase)
    ch = ch_client(ch_url)
    columns = ch_columns(ch)
    phase["added_check"] = {}
    for column, value in added:
        if column not in columns:
            phase["added_check"][column] = "missing in the copy"
            continue
        total, wrong = ch.query(f"SELECT count(), countIf(isNull({ch_ident(column)}) OR {ch_ident(column)} != {value}) "
                                f"FROM {ch_table(TARGET_DB, TABLE)} FINAL").result_rows[0]
        phase["added_check"][column] = f"{columns[column]}, {int(wrong):,} of {int(total):,} rows ≠ {value}"
    ch.close()


def git_state() -> str:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "airflow_sync_provider"], cwd=REPO,
                           capture_output=True, text=True).stdout.split("\n")
    dirty = [line[3:] for line in dirty if line.strip()]
    return head.strip() + (f" with uncommitted changes in {', '.join(dirty)}" if dirty else " (package clean)")


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true",
                        help="100k rows, 30 s phases, a DDL every 10 s, verify_every 10 s in (d)")
    parser.add_argument("--rows", type=int, default=None,
                        help="rows in the table (1,000,000; quick 100,000)")
    parser.add_argument("--phase-seconds", type=float, default=None,
                        help="max_seconds of each service run (90; quick 30)")
    parser.add_argument("--ddl-every", type=float, default=None,
                        help="seconds between ADD COLUMNs in (b) (30; quick 10)")
    parser.add_argument("--recopy-at", type=float, default=None,
                        help="the re-copying DDL's second in (c) (20; quick 8)")
    parser.add_argument("--recopy-ddl", default=RECOPY_DDL, help="the ALTER TABLE clause of (c)")
    parser.add_argument("--verify-every", type=float, default=None,
                        help="verify_every of phase (d), seconds (30; quick 10)")
    parser.add_argument("--window", type=float, default=10.0, help="seconds after a DDL its lag window covers")
    parser.add_argument("--write-rate", type=float, default=2000.0)
    parser.add_argument("--lanes", type=int, default=CdcApplySpec.__dataclass_fields__["lanes"].default)
    parser.add_argument("--batch-events", type=int, default=CdcApplySpec.__dataclass_fields__["batch_events"].default)
    parser.add_argument("--keep", action="store_true", help="keep the bench databases afterwards")
    parser.add_argument("--code", default="", help="what code this is, for the results file (default: git HEAD)")
    args = parser.parse_args(argv)
    args.rows = args.rows or (100_000 if args.quick else 1_000_000)
    args.phase_seconds = args.phase_seconds or (30.0 if args.quick else 90.0)
    args.ddl_every = args.ddl_every or (10.0 if args.quick else 30.0)
    args.recopy_at = args.recopy_at or (8.0 if args.quick else 20.0)
    args.verify_every = args.verify_every or (10.0 if args.quick else 30.0)
    load_start = os.getloadavg()
    started = time.monotonic()
    when = dt.datetime.now(dt.timezone.utc)
    code = args.code or git_state()
    args.code_text = code
    phases, load, bounded, rows_check = {}, None, None, None
    logdir = tempfile.mkdtemp(prefix="bench-cdc-ddl-")

    with services("cdc-ddl") as (mysql_url, ch_url):
        target_databases(ch_url, create=[TARGET_DB], drop=[TARGET_DB])
        create_seconds = create_source(mysql_url, args.rows)
        print(f"source: {args.rows:,} rows in {create_seconds:.1f} s", flush=True)
        load = run_full_load(mysql_url, ch_url)
        print(f"full load: {load['rows']:,} rows in {load['wall']:.1f} s", flush=True)
        pipeline = f"bench-cdc-ddl-{uuid.uuid4().hex[:8]}"
        with timer() as t:
            bounded = spark_submit(cdc_spec(mysql_url, ch_url, pipeline, args, start_from_loads=[load["load_key"]],
                                            stop_position=position(mysql_url).to_dict()), timeout=JOB_TIMEOUT)
        bounded["wall"] = t["seconds"]
        assert bounded.get("status") == "success", f"the starting bounded run failed: {bounded}"
        print(f"pipeline {pipeline} started from the full load ({bounded['wall']:.1f} s)", flush=True)

        next_id = args.rows + 1
        offsets = []
        at = args.ddl_every / 2
        while at < args.phase_seconds - max(3.0, args.phase_seconds * 0.1) - 5:
            offsets.append(at)
            at += args.ddl_every
        added = [(f"c{i}", i) for i in range(1, len(offsets) + 1)]
        plan = [("a", "no DDL", []),
                ("b", f"ADD COLUMN cN INT DEFAULT N every {args.ddl_every:g} s",
                 [(o, f"ADD COLUMN {c} INT DEFAULT {v}") for o, (c, v) in zip(offsets, added)]),
                ("c", f"one re-copying DDL at {args.recopy_at:g} s", [(args.recopy_at, args.recopy_ddl)], {}),
                ("d", f"no DDL, verify_every={args.verify_every:g} s", [], {"verify_every": args.verify_every})]
        plan[:2] = [p + ({},) for p in plan[:2]]
        for seed, (name, title, schedule, options) in enumerate(plan, start=11):
            print(f"phase ({name}) {title}: {args.phase_seconds:.0f} s service run", flush=True)
            phase = run_phase(mysql_url, ch_url, args, pipeline, name, next_id, schedule, seed, logdir, options)
            phase["title"] = title
            phases[name] = phase
            if phase.get("writer") is not None and phase["writer"].changes:
                next_id = phase["writer"].changes.next_id
            check_after(mysql_url, ch_url, args, pipeline, phase, added if name != "a" else [])
            print(f"  lag p50 {phase.get('p50')} p99 {phase.get('p99')} max {phase.get('max')}; writer "
                  f"{phase.get('achieved', 0):,.0f}/s; job {phase.get('result', {}).get('status')}; target = source: "
                  f"{phase['summary_ok']}; {phase['added_check']}", flush=True)
            for entry in phase.get("ddl", []):
                print(f"  {entry}", flush=True)
            for v in phase.get("verifications", []):
                print(f"  verified: {v}", flush=True)
            if not phase.get("ok"):
                print(f"  FAILED: {phase.get('error', '')[:2000]}", flush=True)
                break
        rows_check = verify_rows(mysql_url, ch_url)
        print(f"row-for-row: {rows_check}", flush=True)

        if not args.keep:
            drop_bench_data(mysql_url, ch_url, source_dbs=[SOURCE_DB], target_dbs=[TARGET_DB])

    load_end = os.getloadavg()
    total = time.monotonic() - started
    lines = report(args, when, code, load, bounded, phases, rows_check, load_start, load_end, total, logdir)
    write_result("cdc_ddl", "\n".join(lines) + "\n")


def code_short(args) -> str:
    return (args.code_text or "").split(" ")[0] or "this code"


def report(args, when, code, load, bounded, phases, rows_check, load_start, load_end, total, logdir) -> list[str]:
    quick = " (--quick)" if args.quick else ""
    lines = [f"# CDC lag through schema changes{quick} — {when:%Y-%m-%d %H:%M} UTC", "",
             f"Machine: {machine()}", "",
             f"Code: {code}. Command: `.venv/bin/python -m bench.cdc_ddl{' --quick' if args.quick else ''}`; "
             f"whole bench {total / 60:.1f} min. Load average (1/5/15 min) at start {fmt_load(load_start)}, at end "
             f"{fmt_load(load_end)}.",
             "",
             f"Source: bench/cdc_apply.py's 10-column `orders` table in a local MariaDB, **{args.rows:,} rows**, "
             f"full-loaded by our full load ({load['wall']:.1f} s); the pipeline started from that load with one "
             f"bounded run ({bounded['wall']:.1f} s), then four service runs one after the other on it "
             f"(`spark_submit(CdcApplySpec(service=True, max_seconds={args.phase_seconds:.0f}, batch_seconds=0.5, "
             f"lanes={args.lanes}))`, each its own spark-submit), each under a writer at ≈{args.write_rate:,.0f} row "
             "changes/s (bench/cdc_apply.py's mix: 60/30/10 % inserts/updates/deletes, one statement of 5–30 rows "
             "per autocommit transaction; its inserts name their columns, so added columns take their defaults). "
             "Target: the local ClickHouse-HTTP endpoint (devenv/clickhouse_http.py: chDB in one process that runs "
             "**one statement at a time** — a stand-in, not a ClickHouse server: the applier's inserts, its "
             "ALTERs, a re-copy's chunks, the checkpoints and the bench's lag polls all queue there).", ""]
    names = [n for n in ("a", "b", "c", "d") if n in phases]
    head = ("| | (a) no DDL | (b) ADD COLUMN … DEFAULT every "
            f"{args.ddl_every:g} s | (b) ÷ (a) | (c) one re-copying DDL | (d) no DDL, verify_every "
            f"{args.verify_every:g} s | (d) ÷ (a) |")
    lines += [f"## Lag, {args.phase_seconds:.0f} s per phase", "", head, "|---|---|---|---|---|---|---|"]

    def row(label, fn, with_ratio=True):
        values = {n: fn(phases[n]) if n in phases else None for n in ("a", "b", "c", "d")}
        text = {n: (v if isinstance(v, str) else f2(v)) for n, v in values.items()}
        rb = fmt_ratio(values["b"], values["a"]) if with_ratio and not isinstance(values["a"], str) else ""
        rd = fmt_ratio(values["d"], values["a"]) if with_ratio and not isinstance(values["a"], str) else ""
        return f"| {label} | {text['a']} | {text['b']} | {rb} | {text['c']} | {text['d']} | {rd} |"

    def looks(p):
        vs = p.get("verifications", [])
        if not vs:
            return "0"
        secs = [v.get("seconds") for v in vs if v.get("seconds") is not None]
        return (f"{len(vs)}: " + ", ".join(f2(x) for x in secs) + " s; shards "
                + "/".join(str(v.get("shards")) for v in vs))

    def repaired(p):
        vs = p.get("verifications", [])
        bad = [v for v in vs if v.get("mismatched") or v.get("repaired_shards")]
        if not vs:
            return "—"
        return "none" if not bad else ("**" + "; ".join(f"{v['repaired_shards']} shard(s) {v['mismatched']}, "
                                                        f"{v.get('rows_repaired', 0):,} rows" for v in bad) + "**")

    lines += [
        row("**lag p50 s**", lambda p: p.get("p50")),
        row("**lag p99 s**", lambda p: p.get("p99")),
        row("**lag max s**", lambda p: p.get("max")),
        row("after the first 5 s: p50 / p99 s", lambda p: f"{f2(p.get('steady_p50'))} / {f2(p.get('steady_p99'))}",
            with_ratio=False),
        row("checkpoint's lag max s (1 s resolution)", lambda p: p.get("checkpoint_max")),
        row("lag samples (lower bounds)", lambda p: f"{len(p.get('samples', []))} ({p.get('lower_bounds', 0)})",
            with_ratio=False),
        row("slowest lag poll s", lambda p: p.get("rtt_max"), with_ratio=False),
        row("writer: row changes, achieved/s", lambda p: f"{p.get('written', 0):,}, {p.get('achieved', 0):,.0f}/s",
            with_ratio=False),
        row("job: status, changes applied, batches",
            lambda p: f"{p.get('result', {}).get('status')}, {p.get('result', {}).get('events', 0) or 0:,}, "
                      f"{p.get('batches', 0):,}", with_ratio=False),
        row("verifications (look seconds; shards)", looks, with_ratio=False),
        row("shards repaired by a verification", repaired, with_ratio=False),
        row("DDL statements (followed by the job)",
            lambda p: f"{len(p.get('ddl', []))} ({p.get('result', {}).get('ddl', 0)})", with_ratio=False),
        row("added columns = their default in every row of the copy after",
            lambda p: "—" if not p.get("added_check") else
            ("yes" if all(" 0 of " in v for v in p["added_check"].values()) else
             "**no**: " + "; ".join(f"`{k}` {v}" for k, v in p["added_check"].items() if " 0 of " not in v)),
            with_ratio=False),
        row("target = source after (count, Σ amount, Σ id)",
            lambda p: "yes" if p.get("summary_ok") else
            ("after a bounded run" if p.get("tail_run", {}).get("summary_ok") else "**no**"), with_ratio=False),
        row("load avg / other processes' CPU (cores)", lambda p: p["sampler"].contention() if p.get("sampler") else "—",
            with_ratio=False),
    ]
    lines += ["", "Lag = time the poll was sent − newest `changed_at` (the writer's `NOW(6)`) in the target, every "
                  f"{POLL} s from the writer's first commit until it stopped (bench/cdc_apply.py's measure). The "
                  "checkpoint's lag = now − the source timestamp of the last transaction in the pipeline's checkpoint "
                  "(binlog timestamps: whole seconds), sampled every second; it stands still while a DDL is "
                  "followed or a verification holds the stream. 'Other processes' CPU' = CPU of processes not "
                  "started by this bench (other engineers' tests), cores on average during the phase. A "
                  "verification's seconds: spark/cdc_verify.record's `seconds`, from the look's start (catch-up to "
                  "the source's current position, snapshot S with the source's per-shard checksums, applying up to "
                  "S, the copy's checksums, repairs) to its verdict; the stream stands still from S until the "
                  "copy's checksums are computed, and goes on while MySQL's finish (docs/cdc.md, Verification)."]

    if "b" in phases:
        b = phases["b"]
        lines += ["", "## (b) each ADD COLUMN, followed in place", "",
                  "| DDL | at s | on the source s | job logged it followed after s | lag max in the next "
                  f"{args.window:g} s | lag p50 in the next {args.window:g} s | re-copy? | the verification after it: "
                  "began at s, seconds, shards, repaired | the copy after the phase |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for i, e in enumerate(b.get("ddl", [])):
            column = e["statement"].split()[2]
            until = b["ddl"][i + 1]["at"] if i + 1 < len(b["ddl"]) else float("inf")
            v = next((v for v in b.get("verifications", []) if e["at"] <= v["began"] < until), None)
            vtext = (f"{v['began']:.1f}, **{f2(v.get('seconds'))}**, {v.get('shards')}, {v.get('repaired_shards')}"
                     if v else "none")
            lines.append(f"| `{e['statement']}` | {e['at']:.1f} | {e['end'] - e['start']:.2f} | "
                         f"{f2(e.get('follows_after'))} | {f2(e.get('window_max'))} | {f2(e.get('window_p50'))} | "
                         f"{'**yes**' if e.get('recopy_started_after') is not None else 'no'} | {vtext} | "
                         f"{b.get('added_check', {}).get(column, '—')}"
                         + (f" **error: {e['error']}**" if e.get("error") else "") + " |")
        follows = [line for _, line in b.get("lines", []) if " follows " in line]
        if follows:
            lines += ["", "The job's lines: " + "; ".join(f"`{line.split(': ', 1)[-1][:200]}`" for line in follows[:6])]

    if "c" in phases:
        c = phases["c"]
        lines += ["", "## (c) the cost of a table re-copy (beside the stream)", ""]
        prev = PREVIOUS_C if not args.quick and args.rows == 1_000_000 and args.recopy_ddl == RECOPY_DDL else {}
        for e in c.get("ddl", []):
            cfg = next((t for t in c.get("tables", []) if t.get("source_table") == TABLE), {})
            last = cfg.get("last_recopy") or {}
            rl = e.get("recopy_line") or {}
            samples, cps = c.get("samples", []), c.get("checkpoint_lags", [])
            done_at = (e["end"] - c["first_commit"] + e["recopied_after"] if e.get("recopied_after") is not None
                       else None)
            during = [lag for at, lag, *_ in samples if done_at is not None and e["at"] <= at <= done_at]
            cp_during = [v for at, v in cps if done_at is not None and e["at"] <= at <= done_at]
            after_v = [v for v in c.get("verifications", []) if v["began"] >= e["at"]]
            vtext = "; ".join(f"{f2(v.get('seconds'))} s, {v.get('shards')} shards, "
                              f"{v.get('repaired_shards')} repaired, lag max {f2(v.get('lag_max'))} s"
                              for v in after_v) or "none"

            def pv(key):
                return prev.get(key, "—")
            lines += [f"| | this run ({code_short(args)}: re-copy beside the stream, verification after it) | "
                      f"previous results ({PREVIOUS_C['code']}: the stream waited for the re-copy, no verification) |",
                      "|---|---|---|",
                      f"| DDL | `ALTER TABLE {TABLE} {e['statement']}` at {e['at']:.1f} s"
                      + (f" — **error: {e['error']}**" if e.get("error") else "") + f" | at {pv('at')} s |",
                      f"| on the source (MariaDB ALTER) | {e['end'] - e['start']:.2f} s | {pv('source')} s |",
                      f"| re-copy began (job's 're-copying' line) after | {f2(e.get('recopy_started_after'))} s | "
                      f"{pv('began')} s |",
                      f"| **re-copy, the applier's line** | {rl.get('rows', 0):,} rows in "
                      f"**{f2(rl.get('seconds'))} s** (from {rl.get('position', '—')}) | "
                      f"{pv('rows')} rows in **{pv('seconds')} s** |",
                      f"| re-copy, checkpoint `last_recopy` | {last.get('rows', 0):,} rows in "
                      f"{f2(last.get('seconds'))} s; reason: {last.get('reason', '—')}; "
                      f"recopies: {cfg.get('recopies', 0)} | {pv('last_recopy')} s |",
                      f"| from the source's ALTER to the 're-copied' line | {f2(e.get('recopied_after'))} s | "
                      f"{pv('recopied_after')} s |",
                      "| lag max while the re-copy ran (DDL → 're-copied' line) | "
                      f"{f2(max(during) if during else None)} s | — |",
                      "| checkpoint's lag max while the re-copy ran | "
                      f"{f2(max(cp_during) if cp_during else None)} s | — |",
                      "| **lag max from the DDL on** (to the phase's end) | "
                      f"**{f2(e.get('max_after'))} s** (phase (a): "
                      f"{f2(phases['a'].get('max')) if 'a' in phases else '—'} s) | **{pv('lag_max')} s** |",
                      f"| **checkpoint's lag max from the DDL on** | **{f2(e.get('checkpoint_max_after'))} s** | "
                      f"**{pv('checkpoint_max')} s** |",
                      f"| lag back to ≤ {e.get('recovered_threshold', 1):.2f} s after (from the peak on) | "
                      f"{f2(e.get('recovered_after'))} s after the DDL | {pv('recovered')} s |",
                      f"| verification after the re-copy (`verify_after_ddl`) | {vtext} | — (did not exist) |"]
        lines += ["", "The re-copy runs beside the stream (spark/cdc_ddl.Recopies: a thread reads the bootstrap's "
                      "chunks at the source's position P while the stream applies the changes after P); the re-copy's "
                      "chunks carry the rows' `changed_at` as the source had them when each chunk was read. The "
                      "checkpoint's lag shows the stream's own delay. The previous column is copied from "
                      "bench/results/cdc_ddl.md as committed before this run (same bench, same machine, other "
                      "contention)."]
        recopy_lines = [line for _, line in c.get("lines", []) if "re-cop" in line or " follows " in line]
        if recopy_lines:
            lines += ["", "The job's lines: "
                      + "; ".join(f"`{line.split(': ', 1)[-1][:220]}`" for line in recopy_lines[:6])]

    every = [(n, v) for n in names for v in phases[n].get("verifications", [])]
    if every:
        lines += ["", "## Verifications (the job's result `verified`, one row per look)", "",
                  "| phase | table | look | began at s | **seconds** | shards | mismatched | repaired shards (rows) | "
                  f"lag max during it and {args.window:g} s after | checkpoint's lag max then | position S |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for n, v in every:
            pos = v.get("position") or {}
            where = f"{pos.get('file', '')}:{pos.get('pos', '')}" if pos.get("file") else str(pos)[:60]
            bad = v.get("mismatched") or v.get("repaired_shards")
            lines.append(f"| ({n}) | {v['table']} | {v.get('look')} | {v['began']:.1f} | **{f2(v.get('seconds'))}** | "
                         f"{v.get('shards')} | {v.get('mismatched')} | "
                         + (f"**{v.get('repaired_shards')} ({v.get('rows_repaired', 0):,})**" if bad else
                            f"{v.get('repaired_shards')} ({v.get('rows_repaired', 0):,})")
                         + f" | {f2(v.get('lag_max'))} | {f2(v.get('checkpoint_max'))} | {where} |")
        lines += ["", "'began at' = seconds after the writer's first commit (the look's `at` − `seconds`; the job "
                      "and the bench share the machine's clock). (a) runs with `verify_every=0` and no DDL: no "
                      "verification. In (b) and (c) each DDL sets `verify_due` (after an in-place follow at once, "
                      "after a re-copy when it is recorded), so `verify_after_ddl=True` (the default) verifies the "
                      "table then; (d) verifies every "
                      f"{args.verify_every:g} s (the first at the run's start: the last verification was in (c))."]
        differed = [line for n in names for _, line in phases[n].get("lines", [])
                    if " differed from the source " in line]
        if differed:
            lines += ["", "**The job logged repairs:** " + "; ".join(f"`{line[:300]}`" for line in differed[:10])]

    lines += ["", "## Lag over time", ""]
    for n in names:
        p = phases[n]
        series = p.get("samples", [])
        if not series:
            continue
        step = max(1, len(series) // 30)
        ddl_at = ", ".join(f"{e['at']:.1f}" for e in p.get("ddl", []))
        checked = ", ".join(f"{v['began']:.1f}–{v['ended']:.1f}" for v in p.get("verifications", []))
        peaks = sorted(series, key=lambda s: -s[1])[:1]
        shown = sorted(set(series[::step]) | set(peaks))
        lines.append(f"* ({n}) {p['title']}{' — DDL at ' + ddl_at + ' s' if ddl_at else ''}"
                     f"{' — verifications ' + checked + ' s' if checked else ''}: "
                     + ", ".join(f"{at:.1f}: {'≥' if lower else ''}{lag:.2f}" for at, lag, lower, _ in shown))

    lines += ["", "## Checks and notes", ""]
    for n in names:
        p = phases[n]
        if p.get("writer") is not None and p["writer"].error:
            lines.append(f"* ({n}) **writer error:** {p['writer'].error}")
        if not p.get("ok"):
            lines.append(f"* ({n}) **the service run failed:** `{p.get('error', '')[:1500]}`")
        if p.get("tail_run"):
            tr = p["tail_run"]
            lines.append(f"* ({n}) the service run stopped behind the source; a bounded run "
                         f"({tr['result'].get('status')}, {tr['result'].get('events', 0) or 0:,} changes, "
                         f"{tr['wall']:.1f} s) brought the target to "
                         f"{'= source' if tr['summary_ok'] else '**≠ source**'}.")
    if rows_check is not None:
        lines.append("* At the end, row for row (tests/helpers.assert_same_rows: every source row and column, "
                     "the added ones included, vs the target FINAL): "
                     + (f"**equal** ({rows_check['rows']:,} rows, {rows_check['seconds']:.0f} s)" if rows_check["ok"]
                        else f"**differs**: {rows_check['error'][:500]}"))
    foreign = [phases[n]["sampler"].foreign_cores for n in names if phases[n].get("sampler")]
    busy = any(f > 0.1 for f in foreign) or load_start[0] > 1.0
    lines.append("* The machine has 2 cores for MariaDB, the chDB endpoint, the applier's JVM and Python driver and "
                 "the bench's writer and polls. "
                 + ("**Other work ran concurrently** (another engineer's tests): other processes used "
                    + " / ".join(f"({n}) {f:.2f}" for n, f in zip(names, foreign))
                    + " cores on average during the phases, so absolute numbers are pessimistic and the phases did "
                      "not all see the same contention." if busy else
                    "Other processes used " + " / ".join(f"({n}) {f:.2f}" for n, f in zip(names, foreign))
                    + " cores on average during the phases (quiet)."))
    lines.append("* The chDB stand-in runs one statement at a time: the applier's ClickHouse ALTERs (ADD COLUMN with "
                 "its default: a metadata change), a re-copy's chunk inserts (now concurrent with the stream's "
                 "batches), a verification's per-shard checksum queries of the copy (FINAL) and the lag polls queue "
                 "behind each other there; a ClickHouse server runs them concurrently.")
    lines.append(f"* Each phase ran once; the jobs' logs: {logdir} (a temporary directory).")
    return lines


if __name__ == "__main__":
    main()

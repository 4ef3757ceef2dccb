"""Many tables in one job: a whole database by pattern (``select``) or a list (``tables``), each
table loaded, reconciled or diffed as its own job would do it, ``parallel_tables`` at a time, in
one driver that shares its clients, its ledger and (if ever needed) its SparkSession.

A table that fails does not stop the others; the job fails at the end naming every failed table
and its cause (each one's ledger records stay, so it can be resumed or re-imported on its own).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from airflow_sync_provider.core.clickhouse.client import shared_client
from airflow_sync_provider.core.ledger import Ledger
from airflow_sync_provider.core.selection import largest_first, selected_tables
from airflow_sync_provider.core.source import reader as mysql_reader
from airflow_sync_provider.core.verify.reconcile import FAILED, overall_verdict
from airflow_sync_provider.spark.session import lazy

log = logging.getLogger(__name__)


class TablesFailed(RuntimeError):
    """Some tables of a job of many failed; ``result`` is the job's summary (every table's result,
    the failed ones with their error), which the job's failure report carries (spark/entry.py)."""

    def __init__(self, message: str, result: dict):
        super().__init__(message)
        self.result = result


def each_table(run_one: Callable[[object, object], dict]) -> Callable[[object, object], dict]:
    """``run_one(spec, spark)`` for a one-table spec; for a spec of many tables, :func:`run_tables`."""
    def run(spec, spark) -> dict:
        return run_tables(spec, spark, run_one) if spec.tableset else run_one(spec, spark)
    run.__name__ = run_one.__name__
    return run


def run_tables(spec, spark, run_one: Callable[[object, object], dict]) -> dict:
    started = time.time()
    session = lazy(spark)
    with mysql_reader.connect(spec.source) as conn:
        configs = selected_tables(conn, spec.tableset.select, spec.tableset.tables)
        order = largest_first(conn, configs)
    names = [f"{c['source_database']}.{c['source_table']}" for c in configs]
    keys, baseline, done = {}, {}, set()  # a full load's table keys under its key, and where its run stands
    if spec.job == "full_load" and spec.load_key:
        keys = {f"{c['source_database']}.{c['source_table']}": spec.for_table(c).load_key for c in configs}
        ledger = Ledger(shared_client(spec.target), spec.ledger_database)
        ledger.ensure()
        # a run of the key after an unfinished one goes on with it (Ledger.resume_point): the tables
        # that run published are not copied again, whoever runs it (an Airflow retry, the command line)
        baseline, done = ledger.resume_point(spec.load_key, list(keys.values()))
        done = set() if spec.reimport else done  # a re-import reads what is marked, in published tables too
        ledger.write_load_set(spec.load_key, list(keys.values()), baseline=baseline)  # the counters sensor waits on it
        if done:
            log.info("%s: load %r goes on with its unfinished run: %d table(s) it published are skipped", spec.job,
                     spec.load_key, len(done))
    log.info(f"{spec.job}: {len(names)} table(s) selected: {', '.join(names) or '(none)'}")

    def one(config: dict) -> dict:
        name = f"{config['source_database']}.{config['source_table']}"
        began = time.time()
        table_spec = spec.for_table(config)
        if keys and keys[name] in done:
            table_spec = dataclasses.replace(table_spec, skip_published=True)
        try:
            result = run_one(table_spec, session)
        except Exception as exc:  # the others go on; the job fails at the end naming this one
            # one line where the progress goes; the traceback after it, for the log (a command
            # line shows the line, and keeps the traceback in its log file)
            log.error("%s: FAILED: %s", name, _one_line(exc), exc_info=True)
            return {"table": name, "status": "failed", "error": _one_line(exc)[:2000],
                    "seconds": round(time.time() - began, 3)}
        return {**result, "table": name, "config": config, "status": "success",
                "seconds": round(time.time() - began, 3)}

    with ThreadPoolExecutor(max(1, min(spec.tableset.parallel, len(configs))), thread_name_prefix="table") as pool:
        done_results = dict(zip((id(c) for c in order), pool.map(one, order)))
    results = [done_results[id(c)] for c in configs]  # reported in the selection's order
    for r in results:
        what = ((f"{r['rows']:,} rows" + (" (skipped: published by this load's earlier run)" if r.get("skipped")
                                          else "") if "rows" in r else r.get("verdict", ""))
                if r["status"] == "success" else r["error"])
        log.info(f"  {r['table']:<40} {r['status']:<8} {r['seconds']:>7.2f} s  {what}"[:300])
    failed = [r for r in results if r["status"] != "success"]
    if keys and failed:
        ledger.write_load_set(spec.load_key, list(keys.values()), {keys[r["table"]]: r["error"] for r in failed},
                              baseline)
    key = {"diff_key": spec.diff_key} if spec.job == "snapshot_diff" else {"load_key": spec.load_key}
    summary = {**key, "tables": results, "selected": names, "failed": [r["table"] for r in failed],
               "seconds": round(time.time() - started, 3), "spark_started": session.started}
    if spec.job == "reconcile":  # one verdict for them all (core/verify/reconcile.py: PRECEDENCE)
        summary["verdict"] = overall_verdict(r["verdict"] if r["status"] == "success" else FAILED for r in results)
    if failed:
        raise TablesFailed(f"{len(failed)} of {len(results)} table(s) failed (the others succeeded): "
                           + "; ".join(f"{r['table']}: {r['error']}" for r in failed), summary)
    return summary


def _one_line(exc: Exception) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())

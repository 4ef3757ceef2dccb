"""Reconciliation: every shard of a published load, source vs target (vs the hook counters).

Channels count (and optionally checksum) their shards on both sides, inside the databases, as
threads of the driver on a local master or for a small table (no SparkContext is started:
the work is the databases'), as Spark tasks on a cluster otherwise; the driver compares, marks mismatched shards in the ledger and records the verdict. With
``reimport`` the mismatched shards are then re-imported into the published table (a repair
run of the full load, same Spark session) and every shard is compared again.
"""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor

from airflow_sync_provider.core.jobspec import ReconcileSpec, copied_schema, reimport_spec
from airflow_sync_provider.core.ledger import LOAD_PUBLISHED, SHARD_MISMATCH, Ledger, LoadState
from airflow_sync_provider.core.source import reader as mysql_reader
from airflow_sync_provider.core.source.planning import Plan
from airflow_sync_provider.core.target import clickhouse as target
from airflow_sync_provider.core.target.shards import shard_predicates
from airflow_sync_provider.core.verify.reconcile import (
    checksum_source, checksum_target, clickhouse_checksum_sql, count_source, count_target, mysql_checksum_sql,
    shard_problems,
)
from airflow_sync_provider.spark.channels import driver_copy_limit, run_channels
from airflow_sync_provider.spark.full_load import run_full_load
from airflow_sync_provider.spark.session import lazy


def _check_shards(spec: ReconcileSpec, state: LoadState, plan: Plan, queries: dict, predicates: dict,
                  shard_ids: list[int]):
    """One channel (a Spark task or a thread of the driver): one source and one target connection for a queue of shards;
    ``predicates`` are the shards on the target, by shard id, and ``queries`` the counting or
    checksum statements (both built once by the driver)."""
    database, table = state.target_table.split(".", 1)
    wanted = set(shard_ids)
    sub = dataclasses.replace(plan, shards=tuple(s for s in plan.shards if s.id in wanted))
    mine = [predicates[s.id] for s in sub.shards]
    ch = target.client(spec.target)
    # the two databases work at the same time (each query runs inside its database)
    with mysql_reader.connect(spec.source) as conn, ThreadPoolExecutor(2) as pool:
        if spec.checksum:
            source = pool.submit(checksum_source, conn, queries["mysql"], sub)
            dest = pool.submit(checksum_target, ch, queries["clickhouse"], mine)
            source, dest = source.result(), dest.result()
        else:
            source = pool.submit(count_source, conn, sub)
            dest = pool.submit(count_target, ch, database, table, mine, queries["final"])
            source, dest = [(n, None) for n in source.result()], [(n, None) for n in dest.result()]
    ch.close()
    for shard, (s_rows, s_sum), (t_rows, t_sum) in zip(sub.shards, source, dest):
        yield {"shard_id": shard.id, "source_rows": s_rows, "target_rows": t_rows,
               "source_checksum": None if s_sum is None else str(s_sum),
               "target_checksum": None if t_sum is None else str(t_sum)}


def _published(ledger: Ledger, load_key: str) -> LoadState:
    state = ledger.state(load_key)
    if state is None or state.status != LOAD_PUBLISHED:
        raise ValueError(f"load {load_key!r} is not published ({state.status if state else 'unknown'}); "
                         "reconcile a finished load")
    return state


def _compare(spec: ReconcileSpec, session, ledger: Ledger) -> dict:
    """One pass over every shard; marks mismatched shards and records the verdict."""
    state = _published(ledger, spec.load_key)
    plan = Plan.from_dict(state.plan)
    database, table = state.target_table.split(".", 1)
    with mysql_reader.connect(spec.source) as conn:
        schema = copied_schema(conn, state.spec)
        predicates = dict(zip((s.id for s in plan.shards),
                              shard_predicates(conn, ledger.ch, plan, schema, state.spec, database, table)))
    final = bool(schema.primary_key)  # ReplacingMergeTree: newest version of each key only
    queries = {"final": final}
    if spec.checksum:
        queries |= {"mysql": mysql_checksum_sql(schema, plan),
                    "clickhouse": clickhouse_checksum_sql(schema, database, table, final)}
    ids = [s.id for s in plan.shards]
    channels = max(1, min(plan.channels, len(ids)))
    queues = [ids[i::channels] for i in range(channels)]
    in_driver = sum(s.estimated_rows or 0 for s in plan.shards) <= driver_copy_limit(None, session)
    rows = run_channels(session, queues, lambda q, _: _check_shards(spec, state, plan, queries, predicates, q),
                        in_driver)
    report = []
    for row in sorted(rows, key=lambda r: r["shard_id"]):
        counters = state.shards.get(row["shard_id"])
        row |= {"records_read": counters.records_read if counters else None,
                "records_written": counters.records_written if counters else None,
                "records_failed": counters.records_failed if counters else None}
        row["problems"] = shard_problems(row, counters)
        report.append(row)
    mismatched = [r["shard_id"] for r in report if r["problems"]]
    for row in report:  # mismatched shards are marked so that a re-import takes them
        if row["problems"]:
            shard = state.shards[row["shard_id"]]
            shard.status, shard.error = SHARD_MISMATCH, "; ".join(row["problems"])
            ledger.write_shard(state.load_key, state.generation, shard)
    verdict = "mismatch" if mismatched else "ok"
    ledger.write_reconciliation(state.load_key, state.generation, verdict, mismatched, spec.checksum, report)
    return {"load_key": state.load_key, "generation": state.generation, "table": state.source_table,
            "target": state.target_table, "verdict": verdict, "mismatched": mismatched, "checksum": spec.checksum,
            "shards": report, "stored_spec": state.spec, "in_driver": in_driver}


def run_reconcile(spec: ReconcileSpec, spark) -> dict:
    """``spark``: a SparkSession or a :class:`LazySession` (spark_jobs/reconcile.py), built only
    if the shards go to executors (or a re-import needs them)."""
    started = time.time()
    session = lazy(spark)
    ch = target.shared_client(spec.target)  # one for every table of a job of many
    ledger = Ledger(ch, spec.ledger_database)
    result = _compare(spec, session, ledger)
    stored = result.pop("stored_spec")
    if result["verdict"] != "ok" and spec.reimport:
        print(f"[airflow-sync] reconcile: shards {result['mismatched']} mismatched; re-importing them", flush=True)
        repair = run_full_load(reimport_spec(stored, spec.source, spec.target), session)
        before = {k: result[k] for k in ("verdict", "mismatched", "shards")}
        result = _compare(spec, session, ledger)
        result.pop("stored_spec")
        result |= {"before": before, "reimported": {k: repair[k] for k in ("repaired", "rows", "seconds")}}
    return result | {"spark_started": session.started, "seconds": round(time.time() - started, 3)}

"""Reconciliation: every shard of a published load, source vs target (vs the hook counters).

Channels count (and optionally checksum) their shards on both sides, inside the databases, as
threads of the driver on a local master or for a small table (no SparkContext is started:
the work is the databases'), as Spark tasks on a cluster otherwise; the driver compares, marks
mismatched shards in the ledger and records the verdict. With ``reimport`` the mismatched shards
are then re-imported into the published table (a repair run of the full load, same Spark
session) and every shard is compared again.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from concurrent.futures import ThreadPoolExecutor

from airflow_sync_provider.core.cdc.checkpoints import Checkpoints
from airflow_sync_provider.core.cdc.followers import following
from airflow_sync_provider.core.cdc.history_checks import Review, review
from airflow_sync_provider.core.cdc.history_ledger import HistoryLedger
from airflow_sync_provider.core.clickhouse.client import client, shared_client
from airflow_sync_provider.core.clickhouse.described import copy_content, kept_rows
from airflow_sync_provider.core.clickhouse.history import HistoryTable
from airflow_sync_provider.core.clickhouse.layout import stored
from airflow_sync_provider.core.clickhouse.shards import shard_predicates
from airflow_sync_provider.core.clickhouse.ttl import Window
from airflow_sync_provider.core.content.shaping import DELETED_AT_SOURCE
from airflow_sync_provider.core.content.shaping import stored as stored_content
from airflow_sync_provider.core.jobspec import ReconcileSpec, copied_schema
from airflow_sync_provider.core.ledger import Ledger
from airflow_sync_provider.core.loads import LOAD_ABANDONED, LOAD_PUBLISHED, SHARD_MISMATCH, LoadState
from airflow_sync_provider.core.source import reader as mysql_reader
from airflow_sync_provider.core.source.group import Member, member_view, merged_schema, one_server
from airflow_sync_provider.core.source.planning import Plan
from airflow_sync_provider.core.source.schema import TableSchema
from airflow_sync_provider.core.specfile import reimport_group_spec, reimport_spec
from airflow_sync_provider.core.sql import ch_ident
from airflow_sync_provider.core.typemap import MySQLColumn
from airflow_sync_provider.core.verify.reconcile import (
    MISMATCH,
    OK,
    SHAPE_MISMATCH,
    checksum_source,
    checksum_target,
    clickhouse_checksum_sql,
    count_source,
    count_target,
    mysql_checksum_sql,
    overall_verdict,
    shard_problems,
)
from airflow_sync_provider.core.verify.shape import ShapeCheck, check_copy, read_copy_shape, reload_remedy
from airflow_sync_provider.spark.channels import driver_copy_limit, run_channels
from airflow_sync_provider.spark.full_load import run_full_load
from airflow_sync_provider.spark.group_load import run_group_load
from airflow_sync_provider.spark.session import lazy

log = logging.getLogger(__name__)


def _check_shards(spec: ReconcileSpec, state: LoadState, plan: Plan, queries: dict, predicates: dict,
                  shard_ids: list[int]):
    """One channel (a Spark task or a thread of the driver): one source and one target connection for a queue of shards;
    ``predicates`` are the shards on the target, by shard id, and ``queries`` the counting or
    checksum statements (both built once by the driver)."""
    database, table = state.target_table.split(".", 1)
    wanted = set(shard_ids)
    sub = dataclasses.replace(plan, shards=tuple(s for s in plan.shards if s.id in wanted))
    mine = [predicates[s.id] for s in sub.shards]
    ch = client(spec.target)
    # the two databases work at the same time (each query runs inside its database)
    with mysql_reader.connect(spec.source, spec.salt) as conn, ThreadPoolExecutor(2) as pool:
        if spec.checksum:
            source = pool.submit(checksum_source, conn, queries["mysql"], sub)
            dest = pool.submit(checksum_target, ch, queries["clickhouse"], mine)
            source, dest = source.result(), dest.result()
        else:
            source = pool.submit(count_source, conn, sub)
            dest = pool.submit(count_target, ch, database, table, mine, queries["final"], queries["multiset"])
            source, dest = [(n, None) for n in source.result()], [(n, None) for n in dest.result()]
    ch.close()
    for shard, (s_rows, s_sum), (t_rows, t_sum) in zip(sub.shards, source, dest):
        yield {"shard_id": shard.id, "source_rows": s_rows, "target_rows": t_rows,
               "source_checksum": None if s_sum is None else str(s_sum),
               "target_checksum": None if t_sum is None else str(t_sum)}


def _unfinished_repair(state: LoadState | None) -> bool:
    """A re-import of mismatched shards whose job stopped before it published (a retry of a
    reconciliation with ``reimport`` finishes it first, then compares)."""
    return state is not None and bool(state.repair) and state.status not in (LOAD_PUBLISHED, LOAD_ABANDONED)


def _published(ledger: Ledger, load_key: str) -> LoadState:
    state = ledger.state(load_key)
    if state is None or state.status != LOAD_PUBLISHED:
        raise ValueError(f"load {load_key!r} is not published ({state.status if state else 'unknown'}); "
                         "reconcile a finished load")
    return state


def _copy_shape(spec: ReconcileSpec, conn, ch, state: LoadState, plan: Plan, merged: TableSchema | None = None):
    """The source as the load copies it now, the plan to evaluate, and the copy's shape check
    (core/verify/shape.py). The schema is None when the load's own column choice no longer fits
    the source (a column it names is gone): the check then says so. ``merged``: a merged copy's
    shape (core/source/group.py), which the member's table is seen through."""
    database, table = state.target_table.split(".", 1)
    copy = read_copy_shape(ch, database, table)
    if copy is None:
        raise ValueError(f"load {state.load_key!r}: its copy {state.target_table} does not exist on ClickHouse "
                         f"(dropped?); {reload_remedy(state.load_key, state.source_table, state.target_table)}")
    try:
        schema = copied_schema(conn, state.spec, spec.salt, writer="reconcile")
        if merged is not None:
            schema = member_view(merged, Member.of(state.spec["member"]), schema)
    except (KeyError, ValueError) as exc:  # the load named a column the source no longer has
        check = ShapeCheck(copy, state.source_table, ())
        check.problems.append(f"the load's column choice no longer fits the source: {exc.args[0] if exc.args else exc}")
        return None, plan, check
    loaded = {c["name"]: c for c in (state.spec.get("source_shape") or {}).get("shape", [])}
    split = loaded.get(plan.split_column)
    check = check_copy(ch, schema, copy, plan.split_column, MySQLColumn(**split) if split else None)
    if check.comparable and plan.index and plan.index not in {i.name for i in schema.indexes}:
        check.notes.append(f"the plan's index {plan.index!r} no longer exists in the source: its shards are counted "
                           "there without it (full scans)")
        plan = dataclasses.replace(plan, index=None)
    return schema, plan, check


def _shape_result(state: LoadState, spec: ReconcileSpec, check: ShapeCheck, ledger: Ledger) -> dict:
    """A copy whose shape no longer matches its source: no shard is compared or marked (a re-import
    of shards cannot fix it); the verdict names what differs and the remedy."""
    remedy = reload_remedy(state.load_key, state.source_table, state.target_table)
    log.warning("reconcile %s → %s: %s: %s. %s", state.source_table, state.target_table, SHAPE_MISMATCH,
                "; ".join(check.problems), remedy)
    ledger.write_reconciliation(state.load_key, state.generation, SHAPE_MISMATCH, [], spec.checksum, [])
    return {"load_key": state.load_key, "generation": state.generation, "table": state.source_table,
            "target": state.target_table, "verdict": SHAPE_MISMATCH, "mismatched": [], "checksum": spec.checksum,
            "shards": [], "shape": check.to_dict(), "remedy": remedy, "stored_spec": state.spec, "in_driver": True}


def _compare(spec: ReconcileSpec, session, ledger: Ledger, merged: TableSchema | None = None) -> dict:
    """One pass over every shard; marks mismatched shards and records the verdict."""
    state = _published(ledger, spec.load_key)
    plan = Plan.from_dict(state.plan)
    database, table = state.target_table.split(".", 1)
    with mysql_reader.connect(spec.source) as conn:
        schema, plan, shape = _copy_shape(spec, conn, ledger.ch, state, plan, merged)
        if not shape.comparable:
            return _shape_result(state, spec, shape, ledger)
        predicates = dict(zip((s.id for s in plan.shards),
                              shard_predicates(conn, ledger.ch, plan, schema, (database, table), state.spec)))
    # the copy's comment, read with its shape, says whether it keeps a history (no query when not)
    history = HistoryTable.of(ledger.ch, schema, database, table) if stored_content(shape.copy.comment)[0].history \
        else None
    plain = predicates  # the history's shards: a kept delete is an absence there already
    kept = 0
    if schema.content.keep_deletes:  # rows the copy keeps after the source deleted them: counted apart
        live = f"{ch_ident(DELETED_AT_SOURCE)} = 0"
        predicates = {i: (f"({where}) AND {live}", params) for i, (where, params) in predicates.items()}
        kept = kept_rows(ledger.ch, database, table)
        log.info("reconcile %s → %s: kept: %s rows deleted at the source (not compared)", state.source_table,
                 state.target_table, f"{kept:,}")
    # its layout as the comment read with its shape records it
    window = Window.of(stored(shape.copy.comment)[0].ttl, schema.mappings(), state.target_table)
    if window:  # a TTL'd copy (core/clickhouse/ttl.py): only the rows no merge can have expired are compared
        plan = window.narrowed(plan, schema.mappings())
        predicates = {i: (f"({where}) AND {window.ch_sql()}", params) for i, (where, params) in predicates.items()}
        plain = {i: (f"({where}) AND {window.ch_sql()}", params) for i, (where, params) in plain.items()}
        log.info("reconcile %s → %s: TTL: compared the rows with %s (those nearer their expiry are not)",
                 state.source_table, state.target_table, window.describe())
    for note in shape.notes:
        log.info("reconcile %s → %s: %s", state.source_table, state.target_table, note)
    final = shape.final  # ReplacingMergeTree: newest version of each key only; a plain MergeTree has no FINAL
    queries = {"final": final, "multiset": shape.multiset}
    if spec.checksum:
        queries |= {"mysql": mysql_checksum_sql(schema, plan),
                    "clickhouse": clickhouse_checksum_sql(schema, database, table, final, shape.multiset)}
    ids = [s.id for s in plan.shards]
    channels = max(1, min(plan.channels, len(ids)))
    queues = [ids[i::channels] for i in range(channels)]
    in_driver = sum(s.estimated_rows or 0 for s in plan.shards) <= driver_copy_limit(None, session)
    rows = run_channels(session, queues, lambda q, _: _check_shards(spec, state, plan, queries, predicates, q),
                        in_driver)
    review = _review(ledger, history, plain, state) if history is not None else None
    report = []
    for row in sorted(rows, key=lambda r: r["shard_id"]):
        counters = state.shards.get(row["shard_id"])
        row |= {"records_read": counters.records_read if counters else None,
                "records_written": counters.records_written if counters else None,
                "records_failed": counters.records_failed if counters else None}
        row["problems"] = shard_problems(row, counters) + (review.shards.get(row["shard_id"], []) if review else [])
        report.append(row)
    mismatched = [r["shard_id"] for r in report if r["problems"]]
    for row in report:  # mismatched shards are marked so that a re-import takes them
        if row["problems"]:
            shard = state.shards[row["shard_id"]]
            shard.status, shard.error = SHARD_MISMATCH, "; ".join(row["problems"])
            ledger.write_shard(state.load_key, state.generation, shard)
    verdict = MISMATCH if mismatched or (review is not None and not review.ok) else OK
    ledger.write_reconciliation(state.load_key, state.generation, verdict, mismatched, spec.checksum, report)
    return {"load_key": state.load_key, "generation": state.generation, "table": state.source_table,
            "target": state.target_table, "verdict": verdict, "mismatched": mismatched, "checksum": spec.checksum,
            "shards": report, "shape": shape.to_dict(), "stored_spec": state.spec, "in_driver": in_driver,
            **({"kept": kept} if schema.content.keep_deletes else {}),
            **({"history": review.to_dict(), "history_review": review} if review is not None else {}),
            **({"ttl_window": window.describe()} if window else {})}


def _review(ledger: Ledger, history: HistoryTable, predicates: dict, state: LoadState) -> Review:
    """The copy's history checked (core/cdc/history_checks.review) over the load's shards, and gap-free for
    each pipeline following the copy. A period load's shards name the copy's partitions, not the
    history's: its history is checked for conflicts and gaps only."""
    pipelines = following(Checkpoints(ledger.ch, ledger.database), state.target_table)
    if state.spec.get("partition_by"):
        predicates = {}
        log.info("reconcile %s: a period load: its history's newest versions are not compared (its shards are "
                 "the copy's partitions)", state.target_table)
    kept = HistoryLedger(ledger.ch, ledger.database)
    if pipelines:
        kept.ensure()
    found = review(ledger.ch, history, predicates, kept, pipelines, state.source_table)
    for problem in found.problems():
        log.warning("reconcile %s → %s: %s", state.source_table, state.target_table, problem)
    return found


def _repair_spec(ch, stored: dict, spec: ReconcileSpec):
    """The full load that re-imports the load's shards (core/specfile.reimport_spec). A repair
    writes into the copy as it is: a history the copy keeps though the load did not ask for one
    (a pipeline began it later: spark/cdc_history.py) is written by the repair too."""
    load = reimport_spec(stored, spec.source, spec.target, spec.hash_salt)
    kept = copy_content(ch, load.target_database, load.target_table).history if load.target_table else None
    if kept and not load.tableset.content.history:
        load.tableset.content = dataclasses.replace(load.tableset.content, history=kept)
    return load


def run_reconcile(spec: ReconcileSpec, spark) -> dict:
    """``spark``: a SparkSession or a :class:`LazySession` (spark_jobs/reconcile.py), built only
    if the shards go to executors (or a re-import needs them)."""
    started = time.time()
    session = lazy(spark)
    ch = shared_client(spec.target)  # one for every table of a job of many
    ledger = Ledger(ch, spec.ledger_database)
    if spec.reimport and _unfinished_repair(ledger.state(spec.load_key)):
        log.info(f"reconcile: load {spec.load_key!r} has a repair its job left unfinished; finishing it first")
        run_full_load(_repair_spec(ch, ledger.state(spec.load_key).spec, spec), session)
    result = _compare(spec, session, ledger)
    stored, review = result.pop("stored_spec"), result.pop("history_review", None)
    if result["verdict"] == MISMATCH and spec.reimport:  # a shape mismatch is not repaired by shards
        before = {k: result[k] for k in ("verdict", "mismatched", "shards", "history") if k in result}
        more = {"reimported": {"repaired": [], "rows": 0, "seconds": 0.0, "warnings": []}}
        if review is not None:  # a range counted wrong: recorded as a hole (the binlog is not read again)
            review.record_holes(HistoryLedger(ch, ledger.database), result["table"],
                                f"reconcile of load {spec.load_key!r}")
            more["history_holes"] = review.holes
        if result["mismatched"]:
            log.info(f"reconcile: shards {result['mismatched']} mismatched; re-importing them")
            repair = run_full_load(_repair_spec(ch, stored, spec), session)
            more["reimported"] = {k: repair[k] for k in ("repaired", "rows", "seconds", "warnings")}
        result = _compare(spec, session, ledger)
        result.pop("stored_spec")
        result.pop("history_review", None)
        result |= {"before": before, **more}
    return result | {"spark_started": session.started, "seconds": round(time.time() - started, 3)}


def run_group_reconcile(spec: ReconcileSpec, spark) -> dict:
    """A merged copy's reconciliation (core/source/group.py): every member load of the group's key
    (its load set) against its own source, each seen through the merged copy's shape as the
    members' tables are now; ``reimport`` re-imports the mismatched shards of every member in one
    group re-import (spark/group_load.py), then compares again."""
    started = time.time()
    session = lazy(spark)
    ledger = Ledger(shared_client(spec.target), spec.ledger_database)
    found = ledger.load_set(spec.load_key)
    if found is None:
        raise ValueError(f"no group load {spec.load_key!r} in the ledger: reconcile the key a group load ran under")
    unfinished = [state for key in found[0] if _unfinished_repair(state := ledger.state(key))]
    if spec.reimport and unfinished:
        log.info(f"reconcile {spec.load_key}: a repair its job left unfinished; finishing it first")
        run_group_load(reimport_group_spec(unfinished[0].spec, spec.sources, spec.target, spec.load_key,
                                           [s.source_table for s in unfinished]), session)
    states = {key: _published(ledger, key) for key in found[0]}
    sources = {s.name: s for s in spec.sources}
    members = []
    for key, state in states.items():
        member = Member.of(state.spec["member"])
        if member.source not in sources:
            raise ValueError(f"group load {spec.load_key!r} copied {member.name}, but no source named "
                             f"{member.source!r} is given (sources: {sorted(sources)})")
        with mysql_reader.connect(sources[member.source].endpoint) as conn:
            members.append((key, member, copied_schema(conn, state.spec)))
    merged = merged_schema([(m, schema) for _, m, schema in members], next(iter(states.values())).target_table)

    def compare() -> list[dict]:
        def one(item) -> dict:
            key, member, _ = item
            single = dataclasses.replace(spec, sources=one_server(sources[member.source].endpoint), merge=None,
                                         load_key=key, reimport=False)
            result = _compare(single, session, ledger, merged)
            result.pop("stored_spec")
            return result | {"member": member.name}

        with ThreadPoolExecutor(max(1, min(spec.tableset.parallel, len(members)))) as pool:
            return list(pool.map(one, members))

    results = compare()
    summary = {"load_key": spec.load_key, "merge_into": merged.qualified, "tables": results,
               "selected": [m.name for _, m, _ in members], "verdict": overall_verdict(r["verdict"] for r in results)}
    if summary["verdict"] == MISMATCH and spec.reimport:
        log.info("reconcile %s: shards mismatched in %s; re-importing them", spec.load_key,
                 ", ".join(r["member"] for r in results if r["mismatched"]))
        stored = next(iter(states.values())).spec
        repair = run_group_load(reimport_group_spec(stored, spec.sources, spec.target, spec.load_key,
                                                    [f"{m.database}.{m.table}" for _, m, _ in members]), session)
        before = {k: summary[k] for k in ("verdict", "tables")}
        results = compare()
        summary |= {"tables": results, "verdict": overall_verdict(r["verdict"] for r in results), "before": before,
                    "reimported": {"rows": repair["rows"], "seconds": repair["seconds"]}}
    return summary | {"spark_started": session.started, "seconds": round(time.time() - started, 3)}

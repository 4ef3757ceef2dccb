"""A source group's CDC (core/source/group.py): one pipeline over every source's binlog.

A group's pipeline ``P`` is a pipeline per source, ``P@<source>``, each exactly a pipeline of
its own (spark/cdc_apply.py): its own lease on its server, checkpoint, server identity and epoch,
failover and lost-binlog handling, verification and lag. Its tables are that source's members of
the merged copy (``PipelineTable.member``: they write their source columns and read through their
view). What is the group's:

* **the bootstrap** (:func:`run_group_bootstrap`): every source's selected tables, their columns
  merged (the merged copy created, or given the columns it lacks, before anything is copied),
  each member bootstrapped into it in its source's pipeline; the selection is kept by every
  source's pipeline, so a table created later on any source joins by bootstrap;
* **a run** (:func:`run_group_apply`): every source's pipeline run at once — in the driver, a
  thread each (each with its reader processes), or with ``placement="executors"`` as long-running
  tasks on the cluster's executors, a source per task, so a group of many servers does not put
  every binlog reader in one process. A source that fails or stops does not stop the others; the
  run fails at its end naming it;
* **its record** in the ledger (sources, merged copy): ``cdc status``, the binlog position sensor
  and the Sync view show the group as one copy with a row per source; its lag is its worst
  source's;
* **DDL across shards** (core/cdc/alter.py): each source's run reads the others' recorded
  tables when one of its members changes shape.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from concurrent.futures import ThreadPoolExecutor

from airflow_sync_provider.core.cdc.alter import base_type, nullable_type
from airflow_sync_provider.core.cdc.checkpoints import Checkpoints, GroupRecord
from airflow_sync_provider.core.clickhouse.client import shared_client
from airflow_sync_provider.core.clickhouse.ddl import create_table_sql
from airflow_sync_provider.core.clickhouse.described import check_layout, column_types, resolve_layout, table_exists
from airflow_sync_provider.core.clickhouse.layout import MIRROR, Layout
from airflow_sync_provider.core.jobspec import CdcApplySpec, CdcBootstrapSpec
from airflow_sync_provider.core.loads import executor_address
from airflow_sync_provider.core.selection import TableSet
from airflow_sync_provider.core.source.group import (
    SOURCE_COLUMNS,
    IncompatibleShards,
    member_config,
    member_view,
    merged_schema,
    part_pipeline,
)
from airflow_sync_provider.core.sql import ch_ident, ch_table
from airflow_sync_provider.core.typemap import map_column
from airflow_sync_provider.spark.cdc_apply import run_cdc_apply
from airflow_sync_provider.spark.cdc_bootstrap import run_cdc_bootstrap
from airflow_sync_provider.spark.groups import group_members
from airflow_sync_provider.spark.session import lazy
from airflow_sync_provider.spark.tables import TablesFailed

log = logging.getLogger(__name__)


class GroupFailed(TablesFailed):
    """Some sources of a group's run failed or stopped (the others ran); ``result`` names each."""


def in_group(run_one, run_group):
    """A CDC job's entry: ``run_group`` for a source group's spec, else ``run_one`` (its one server)."""
    def run(spec, spark) -> dict:
        return run_group(spec, spark) if spec.grouped else run_one(spec, spark)

    run.__name__ = run_one.__name__
    return run


def _record(spec, ch) -> tuple[Checkpoints, list[str]]:
    """The group in the ledger (its sources now); returns the sources it had that it has no more."""
    checkpoints = Checkpoints(ch, spec.ledger_database)
    checkpoints.ensure()
    before = checkpoints.group(spec.pipeline)
    checkpoints.write_group(spec.pipeline, GroupRecord(tuple(s.name for s in spec.sources),
                                                       spec.merge.into if spec.merge else ""))
    return checkpoints, [name for name in (before.sources if before else ()) if name not in
                         {s.name for s in spec.sources}]


def _sources_removed(spec: CdcApplySpec, ch, removed: list[str]) -> None:
    """Sources the group no longer has leave it: their pipelines are not run any more; their rows
    in the merged copy stay, or with ``on_shard_removed="delete"`` are deleted (a lightweight
    DELETE, not tombstones: bootstrapped again later, a source's rows are not out-ranked)."""
    for name in removed:
        log.info("pipeline %r: source %s left the group (its pipeline %s is not run any more); its rows in %s are %s",
                 spec.pipeline, name, part_pipeline(spec.pipeline, name),
                 spec.merge.into if spec.merge else "its copies",
                 "deleted" if spec.merge and spec.merge.on_shard_removed == "delete" else "kept")
    if removed and spec.merge and spec.merge.on_shard_removed == "delete":
        database, table = spec.merge.database, spec.merge.table
        ch.command(f"DELETE FROM {ch_table(database, table)} WHERE {ch_ident(SOURCE_COLUMNS[0])} IN "
                   "{removed:Array(String)}", parameters={"removed": removed})


def prepare_merged(ch, merged, view, layout: Layout = MIRROR) -> list[str]:
    """The merged copy as the members need it: created from a member's ``view`` when missing,
    under ``layout`` (its key appended to the sorting key: the merged key, the primary key and the
    source columns), else given the columns it lacks (Nullable: shards that lack them read NULL);
    a column it has in another ClickHouse type is refused, naming it, and so is a ``layout`` other
    than the copy's (naming both). Returns the clauses run."""
    database, table = merged.database, merged.table
    ch.command(f"CREATE DATABASE IF NOT EXISTS {ch_ident(database)}")
    layout = resolve_layout(ch, database, table, layout)  # an existing copy's own, or refused
    if not table_exists(ch, database, table):
        ch.command(create_table_sql(view, database, table, layout))
        return ["CREATE TABLE"]
    check_layout(ch, database, table)
    present, done = column_types(ch, database, table), []
    for column in merged.columns:
        ch_type = map_column(column, merged.qualified).ch_type
        if column.name not in present:
            clause = f"ADD COLUMN IF NOT EXISTS {ch_ident(column.name)} {nullable_type(ch_type)}"
            ch.command(f"ALTER TABLE {ch_table(database, table)} {clause}")
            done.append(clause)
        elif base_type(present[column.name]) != base_type(ch_type):
            raise IncompatibleShards(f"column {column.name!r} is {present[column.name]} in the merged copy "
                                     f"{merged.qualified} but the shards have it as {ch_type}; give the shards the "
                                     "copy's type, or load the group again")
    return done


def run_group_bootstrap(spec: CdcBootstrapSpec, spark) -> dict:
    """Every source's selected tables bootstrapped into the merged copy, each in its source's
    pipeline; without a ``merge`` each source's tables side by side in their own targets."""
    started = time.time()
    session = lazy(spark)
    ch = shared_client(spec.target)
    checkpoints, _ = _record(spec, ch)
    members = group_members(spec)
    by_source: dict[str, list[dict]] = {}
    layout = spec.tableset.merged_layout(spec.merge.into) if spec.merge else None
    if spec.merge:
        merged = merged_schema([(m, schema) for m, _, _, schema in members], spec.merge.into)
        views = {m.name: member_view(merged, m, schema) for m, _, _, schema in members}
        if members:
            prepare_merged(ch, merged, views[members[0][0].name], layout)
        for member, source, config, _ in members:
            entry = member_config(spec.merge.into, member, config)
            entry["view"] = views[member.name].shape()
            by_source.setdefault(source.name, []).append(entry)
    else:
        for _, source, config, _ in members:
            by_source.setdefault(source.name, []).append(
                config | {"target_database": config["target_database"].replace("{source}", source.name)})
    results = {}
    for source in spec.sources:  # each source's pipeline keeps the patterns: later tables join by bootstrap
        part = spec.for_source(source)
        if spec.tableset.select:
            checkpoints.write_selection(part.pipeline, spec.tableset.select)
        tables = by_source.get(source.name, [])
        if not tables:
            results[source.name] = {"pipeline": part.pipeline, "tables": [], "rows": 0}
            continue
        # a merged copy's members under its one layout
        tableset = TableSet(tables=tables, layout=layout)
        results[source.name] = run_cdc_bootstrap(dataclasses.replace(part, tableset=tableset), session)
    return {"pipeline": spec.pipeline, "merge_into": spec.merge.into if spec.merge else "", "sources": results,
            "tables": [t | {"source": name} for name, r in results.items() for t in r["tables"]],
            "rows": sum(r["rows"] for r in results.values()), "seconds": round(time.time() - started, 3)}


def _part_in_task(part: CdcApplySpec) -> dict:
    """One source's pipeline as a Spark task (on an executor): no SparkSession there, so its
    batches are written by the task's own threads. Says where it ran."""
    return _run_part(part, lazy(None)) | {"executor": executor_address(part.source.host, part.source.port)}


def _run_part(part: CdcApplySpec, session) -> dict:
    try:
        return {"status": "success", **run_cdc_apply(part, session)}
    except Exception as exc:  # the others go on; the group's run fails at its end naming this one
        log.error("pipeline %r: FAILED: %s: %s", part.pipeline, type(exc).__name__, exc, exc_info=True)
        return {"status": "failed", "pipeline": part.pipeline, "error": f"{type(exc).__name__}: {exc}"[:4000],
                "stopped": not getattr(exc, "retry_helps", True)}


def run_group_apply(spec: CdcApplySpec, spark) -> dict:
    """Every source's pipeline of the group run at once (bounded, or as services)."""
    started = time.time()
    session = lazy(spark)
    ch = shared_client(spec.target)
    _, removed = _record(spec, ch)
    _sources_removed(spec, ch, removed)
    parts = [spec.for_source(source) for source in spec.sources]
    if spec.merge and spec.merge.placement == "executors":
        # a source per task: its binlog reader and writers on an executor, for as long as it runs
        context = session.get().sparkContext
        done = context.parallelize(parts, len(parts)).map(_part_in_task).collect()
    else:
        with ThreadPoolExecutor(len(parts), thread_name_prefix="source") as pool:
            done = list(pool.map(lambda part: _run_part(part, session), parts))
    results = {source.name: result for source, result in zip(spec.sources, done)}
    ok = [r for r in results.values() if r["status"] == "success"]
    summary = {"pipeline": spec.pipeline, "merge_into": spec.merge.into if spec.merge else "",
               "placement": spec.merge.placement if spec.merge else "driver",
               "sources": results, "sources_removed": removed, "events": sum(r["events"] for r in ok),
               "rows_written": sum(r["rows_written"] for r in ok), "seconds": round(time.time() - started, 3)}
    failed = {name: r for name, r in results.items() if r["status"] != "success"}
    if failed:
        raise GroupFailed(f"{len(failed)} of {len(results)} source(s) of pipeline {spec.pipeline!r} failed (the "
                          "others ran): " + "; ".join(f"{part_pipeline(spec.pipeline, n)}: {r['error']}"
                                                      for n, r in failed.items()), summary)
    return summary

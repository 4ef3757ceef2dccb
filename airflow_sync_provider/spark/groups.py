"""Jobs of a source group (core/source/group.py): which tables each source has, and the two ways
a group is copied — merged into one copy (each job's own ``run_merged``: spark/group_load.py for
the full load) or side by side, each source's tables as a job of many tables of its own.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from airflow_sync_provider.core.jobspec import copied_schema
from airflow_sync_provider.core.selection import selected_tables
from airflow_sync_provider.core.source import reader as mysql_reader
from airflow_sync_provider.core.source.group import Member, Source, one_server
from airflow_sync_provider.core.specfile import spec_to_dict
from airflow_sync_provider.spark.tables import TablesFailed, each_table, run_tables

log = logging.getLogger(__name__)

CONNECT_AT_ONCE = 8  # sources whose tables are looked up at the same time


def each_group(run_one: Callable, run_merged: Callable) -> Callable:
    """A job's entry: ``run_one`` for one table or many (spark/tables.each_table) of its one
    server; for a source group ``run_merged`` with a ``merge``, else every source side by side."""
    per_table = each_table(run_one)

    def run(spec, spark) -> dict:
        if not spec.grouped:
            return per_table(spec, spark)
        return run_merged(spec, spark) if spec.merge else side_by_side(spec, spark, run_one)

    run.__name__ = run_one.__name__
    return run


def for_source(spec, source: Source):
    """One source's part of a group copied side by side: its tables under ``<key>:<source>``, in
    target databases named by the selection (``{source}`` replaced)."""
    key = "diff_key" if spec.job == "snapshot_diff" else "load_key"
    return dataclasses.replace(spec, sources=one_server(source.endpoint),
                               tableset=spec.tableset.for_source(source.name),
                               **{key: f"{getattr(spec, key)}:{source.name}" if getattr(spec, key) else ""})


def side_by_side(spec, spark, run_one) -> dict:
    """Every source's tables, each source as a job of many tables (spark/tables.py), one after
    another; a source that fails does not stop the others."""
    started, results, failed = time.time(), [], []
    for source in spec.sources:
        try:
            part = run_tables(for_source(spec, source), spark, run_one)
        except TablesFailed as exc:
            part, failed = exc.result, failed + [f"{source.name}: {exc}"]
        except Exception as exc:  # e.g. the source cannot be reached: the others go on
            log.error("source %s: FAILED: %s", source.name, exc, exc_info=True)
            part, failed = {"tables": []}, failed + [f"{source.name}: {type(exc).__name__}: {exc}"]
        results += [t | {"source": source.name} for t in part["tables"]]
    summary = {"load_key": spec.load_key, "tables": results, "sources": [s.name for s in spec.sources],
               "failed": [t["table"] for t in results if t["status"] != "success"],
               "seconds": round(time.time() - started, 3)}
    if failed:
        raise TablesFailed(f"{len(failed)} of {len(spec.sources)} source(s) failed: " + "; ".join(failed), summary)
    return summary


def group_members(spec) -> list[tuple[Member, Source, dict, object]]:
    """Every selected table of every source, as (member, its source, its table config, its
    schema as copied), sorted by member name; sources looked up a few at a time."""
    def of(source: Source):
        with mysql_reader.connect(source.endpoint) as conn:
            found = []
            for config in selected_tables(conn, spec.tableset.select, spec.tableset.tables):
                member = Member(source.name, config["source_database"], config["source_table"])
                # a load's columns are its table's or the job's (FullLoadSpec.for_member)
                one = spec_to_dict(spec.for_member(member, source.endpoint, config)) if hasattr(spec, "for_member") \
                    else config
                found.append((member, source, config, copied_schema(conn, one)))
            return found

    with ThreadPoolExecutor(min(CONNECT_AT_ONCE, len(spec.sources))) as pool:
        members = [m for found in pool.map(of, spec.sources) for m in found]
    return sorted(members, key=lambda m: m[0].name)



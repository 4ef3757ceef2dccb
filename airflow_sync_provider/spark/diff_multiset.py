"""The snapshot diff of a table without a key against its multiset copy (docs/keyless-tables.md).

Rows without a key pair with nothing but their equals, so the diff compares occurrences: for each
distinct row, how often the source holds it and how often the copy does (its signs added,
``FINAL``). More in the source: that many ``new`` occurrences; more in the copy: that many
``deleted``; the rest ``identical``; ``changed`` does not exist. The source's rows (as the copy
holds them: transforms computed in the SELECT, the row filter in the plan) stream into a table
beside the copy and ClickHouse computes the difference, so no Python holds the rows. The change
set has no key columns: each occurrence's values are its ``old__``/``new__`` columns. ``apply``
writes the difference into the copy: +1 / -1 occurrences at the diff's version (below every change
after its read began), so running the diff again finds nothing.
"""

from __future__ import annotations

import logging
import time
import uuid

from airflow_sync_provider.core.cdc.servers import source_epoch
from airflow_sync_provider.core.clickhouse import multisets
from airflow_sync_provider.core.clickhouse.described import version_above
from airflow_sync_provider.core.jobspec import SnapshotDiffSpec
from airflow_sync_provider.core.ledger import Ledger
from airflow_sync_provider.core.positions import position_if_readable
from airflow_sync_provider.core.source import reader as mysql_reader
from airflow_sync_provider.core.source.planning import whole_table
from airflow_sync_provider.core.source.schema import read_table_schema
from airflow_sync_provider.core.sql import ch_ident, ch_table
from airflow_sync_provider.core.verify.diff import (
    DELETED,
    NEW,
    DiffColumns,
    DiffError,
    change_samples,
    new_name,
    old_name,
)
from airflow_sync_provider.core.verify.shape import CopyShape, column_problems

log = logging.getLogger(__name__)


def run_multiset_diff(spec: SnapshotDiffSpec, ch, copy: CopyShape, shaped, prepare_changes) -> dict:
    """``shaped(schema)``: the source as the copy holds it; ``prepare_changes(columns, types)``:
    the change-set table made ready (spark/diff.py's)."""
    started = time.time()
    if spec.new_table or spec.source is None:
        raise DiffError(f"{spec.old_table} is a multiset (a table without a key): it is diffed against its MySQL "
                        "source only")
    if spec.key_columns:
        raise DiffError(f"{spec.old_table} is a multiset (a table without a key): its rows pair by their values, "
                        "not by key_columns")
    database, table = spec.old_table.split(".", 1)
    with mysql_reader.connect(spec.source) as conn:
        schema = shaped(read_table_schema(conn, spec.source_database, spec.source_table))
        problems = column_problems(ch, schema, copy.user_columns())
        missing = [c.name for c in schema.columns if c.name not in copy.columns]
        if problems or missing:
            raise DiffError(f"table {schema.qualified}: its copy {spec.old_table} no longer has the source's shape: "
                            f"{'; '.join(problems + [f'column {m!r} is not in the copy' for m in missing])}; "
                            "bootstrap it again")
        position = position_if_readable(conn, schema.qualified, source_epoch(conn, ch, spec.ledger_database))
    mappings = schema.mappings()
    names = [m.name for m in mappings]
    ch_types = {m.name: m.ch_type for m in mappings}
    columns = DiffColumns((), tuple(names), tuple(names))
    prepare_changes(columns, ch_types)
    run_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
    plan = whole_table(None, schema)
    shard = plan.shards[0]
    read = mysql_reader.ShardRead(plan, mappings, mysql_reader.select_list(mappings), 65536, False)
    with multisets.Beside(ch, spec.target, database, table, names, spec.diff_key) as beside:
        conn = mysql_reader.stream_connect(spec.source, spec.salt)
        try:
            beside.fill(mysql_reader.read_shard(conn, read, shard))
        finally:
            conn.close()
        old_rows, new_rows, identical = (int(v or 0) for v in ch.query(
            f"SELECT sum(n_old), sum(n_new), sum(least(n_old, n_new)) FROM ({beside.counts()})").result_rows[0])
        differences = beside.differences()
        old_cols = ", ".join(ch_ident(old_name(n)) for n in names)
        new_cols = ", ".join(ch_ident(new_name(n)) for n in names)
        ch.command(f"INSERT INTO {ch_table(*spec.changes_table.split('.', 1))} (diff_key, run_id, flag, changed, "
                   f"{old_cols}, {new_cols}) SELECT {{k:String}}, {{r:String}}, if(d > 0, '{NEW}', '{DELETED}'), [], "
                   + ", ".join(f"if(d < 0, {ch_ident(n)}, NULL)" for n in names) + ", "
                   + ", ".join(f"if(d > 0, {ch_ident(n)}, NULL)" for n in names) + f" FROM ({differences})",
                   parameters={"k": spec.diff_key, "r": run_id})
        found = dict(ch.query(f"SELECT flag, count() FROM {ch_table(*spec.changes_table.split('.', 1))} WHERE "
                              "diff_key = {k:String} AND run_id = {r:String} GROUP BY flag",
                              parameters={"k": spec.diff_key, "r": run_id}).result_rows)
        version = None
        if spec.on_change == "apply" and found:
            # below every change after the read began (its position, as a repair's), or above all
            version = (position.snapshot_version(repair=True) if position is not None
                       else version_above(ch, database, table))
            beside.write_differences(differences, version)
    counts = {"identical": identical, "changed": 0, NEW: int(found.get(NEW, 0)), DELETED: int(found.get(DELETED, 0))}
    differ = counts[NEW] + counts[DELETED]
    verdict = "identical" if not differ else ("applied" if spec.on_change == "apply" else "changed")
    shard_result = {"shard_id": 0, "old_rows": old_rows, "new_rows": new_rows, "buckets": 0, "buckets_read": 0,
                    "rows_read_old": old_rows, "rows_read_new": new_rows, **counts, "seconds": time.time() - started}
    result = {"diff_key": spec.diff_key, "run_id": run_id, "old": spec.old_table, "new": spec.new_name,
              "verdict": verdict, "on_change": spec.on_change, "counts": counts, "rows_old": old_rows,
              "rows_new": new_rows, "rows_read_old": old_rows, "rows_read_new": new_rows, "shards": 1,
              "shards_read": 1, "buckets_read": 0, "version": version, "changes_table": spec.changes_table,
              "keys": [], "compared": names, "levels": 0, "positions": "values", "in_driver": True,
              "spark_started": False,
              "notes": [f"{spec.old_table} is a multiset (a table without a key): occurrences compared by value"]}
    Ledger(ch, spec.ledger_database).write_diff(result, [shard_result])
    samples = change_samples(ch, spec.changes_table, spec.diff_key, run_id, spec.sample_rows)
    log.info("diff %s: %s occurrences identical, %s new, %s deleted", spec.diff_key, f"{identical:,}",
             f"{counts[NEW]:,}", f"{counts[DELETED]:,}")
    return result | {"shard_results": [shard_result], "samples": samples, "seconds": round(time.time() - started, 3)}

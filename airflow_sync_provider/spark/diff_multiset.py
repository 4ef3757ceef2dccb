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
from airflow_sync_provider.core.jobspec import SnapshotDiffSpec
from airflow_sync_provider.core.ledger import Ledger
from airflow_sync_provider.core.positions import position_if_readable
from airflow_sync_provider.core.source import reader as mysql_reader
from airflow_sync_provider.core.source.planning import Filter, Plan, Shard
from airflow_sync_provider.core.source.schema import read_table_schema
from airflow_sync_provider.core.sql import ch_ident, ch_table
from airflow_sync_provider.core.target import clickhouse as target
from airflow_sync_provider.core.target.inserts import ArrowInserts
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
    listed = ", ".join(map(ch_ident, names))
    beside = ch_table(database, target.private_name(table, "diff", spec.diff_key))
    copy_sql, sign = ch_table(database, table), ch_ident(target.SIGN_COLUMN)
    ch.command(f"DROP TABLE IF EXISTS {beside}")
    ch.command(f"CREATE TABLE {beside} ENGINE = MergeTree ORDER BY tuple() AS SELECT {listed} FROM {copy_sql} WHERE 0")
    try:
        shard = Filter().also(schema.row_filter.sql()).apply(Shard(0, "1=1")) if schema.row_filter \
            else Shard(0, "1=1")
        plan = Plan(schema.database, schema.table, None, None, "balanced", 1, 1, (shard,))
        read = mysql_reader.ShardRead(plan, mappings, mysql_reader.select_list(mappings), 65536, False)
        conn = mysql_reader.stream_connect(spec.source, spec.salt)
        inserts = ArrowInserts(target.shared_client(spec.target), beside)
        try:
            for batch in mysql_reader.read_shard(conn, read, shard):
                inserts.write(batch)
            inserts.finish()
        finally:
            inserts.close()
            conn.close()
        counts_sql = (f"SELECT {listed}, sum(s) AS n_new, sum(c) AS n_old FROM ("
                      f"SELECT {listed}, toInt64(1) AS s, toInt64(0) AS c FROM {beside} UNION ALL "
                      f"SELECT {listed}, toInt64(0) AS s, toInt64({sign}) AS c FROM {copy_sql} FINAL) "
                      f"GROUP BY {listed}")
        old_rows, new_rows, identical = (int(v or 0) for v in ch.query(
            f"SELECT sum(n_old), sum(n_new), sum(least(n_old, n_new)) FROM ({counts_sql})").result_rows[0])
        occurrences = (f"SELECT {listed}, d, j FROM (SELECT {listed}, n_new - n_old AS d FROM ({counts_sql}) "
                       "WHERE d != 0) ARRAY JOIN range(toUInt64(abs(d))) AS j")
        changes = ch_table(*spec.changes_table.split(".", 1))
        old_cols = ", ".join(ch_ident(old_name(n)) for n in names)
        new_cols = ", ".join(ch_ident(new_name(n)) for n in names)
        ch.command(f"INSERT INTO {changes} (diff_key, run_id, flag, changed, {old_cols}, {new_cols}) "
                   f"SELECT {{k:String}}, {{r:String}}, if(d > 0, '{NEW}', '{DELETED}'), [], "
                   + ", ".join(f"if(d < 0, {ch_ident(n)}, NULL)" for n in names) + ", "
                   + ", ".join(f"if(d > 0, {ch_ident(n)}, NULL)" for n in names) + f" FROM ({occurrences})",
                   parameters={"k": spec.diff_key, "r": run_id})
        found = dict(ch.query(f"SELECT flag, count() FROM {changes} WHERE diff_key = {{k:String}} AND run_id = "
                              "{r:String} GROUP BY flag", parameters={"k": spec.diff_key, "r": run_id}).result_rows)
        version = None
        if spec.on_change == "apply" and found:
            # below every change after the read began (its position, as a repair's), or above all
            version = position.snapshot_version(repair=True) if position is not None else int(
                ch.command(f"SELECT max({ch_ident(target.VERSION_COLUMN)}) FROM {copy_sql}") or 0) + 1
            base = time.time_ns() % (1 << 40) << 20  # an apply is not replayed: its ordinals differ from another's
            ch.command(f"INSERT INTO {copy_sql} ({listed}, {ch_ident(target.VERSION_COLUMN)}, "
                       f"{ch_ident(target.ORDINAL_COLUMN)}, {sign}) SELECT {listed}, {version}, "
                       f"{base} + row_number() OVER (ORDER BY {listed}, j), if(d > 0, 1, -1) FROM ({occurrences})")
    finally:
        ch.command(f"DROP TABLE IF EXISTS {beside}")
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

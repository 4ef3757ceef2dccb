"""Snapshot diff: old (a ClickHouse table) vs new (the MySQL source or another ClickHouse table):
the driver; one shard is compared in a channel (spark/diff_shard.py).

The driver resolves the columns and the canonical schema, plans shards on the source (the
planner; evaluated on ClickHouse as reconciliation does), fixes the apply's version and clears
the previous change set of this diff. Channels (threads of the driver on a local master or for a
small table, Spark tasks otherwise) compare the shards; each batch's changes go to the change
set, and with ``on_change="apply"`` into the old table: ``new``/``changed`` rows upserted,
``deleted`` rows as tombstones, all with one version of the shared scheme (below the binlog
position read at the diff's start, so any later change outranks them).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import uuid

from airflow_sync_provider.core.cdc.servers import source_epoch
from airflow_sync_provider.core.clickhouse.client import client
from airflow_sync_provider.core.clickhouse.columns import (
    DELETED_COLUMN,
    INTERNAL_COLUMNS,
    VERSION_COLUMN,
    check_columns,
)
from airflow_sync_provider.core.clickhouse.ddl import create_table_sql
from airflow_sync_provider.core.clickhouse.described import (
    check_layout,
    column_types,
    copy_key,
    copy_layout,
    resolve_layout,
    table_exists,
    version_above,
)
from airflow_sync_provider.core.clickhouse.history import HistoryTable, Stamp, history_name, refuse_unwritten
from airflow_sync_provider.core.clickhouse.layout import stored
from airflow_sync_provider.core.clickhouse.shards import shard_predicates
from airflow_sync_provider.core.clickhouse.ttl import Window
from airflow_sync_provider.core.content import shaping
from airflow_sync_provider.core.jobspec import SnapshotDiffSpec
from airflow_sync_provider.core.ledger import Ledger
from airflow_sync_provider.core.positions import position_if_readable
from airflow_sync_provider.core.source import reader as mysql_reader
from airflow_sync_provider.core.source.group import SOURCE_COLUMNS, Member, member_view, merged_schema
from airflow_sync_provider.core.source.locks import LockHeld, NamedLock, lock_name
from airflow_sync_provider.core.source.planning import (
    Filter,
    Plan,
    Shard,
    Sharding,
    SpeedLimits,
    plan_table,
    whole_table,
)
from airflow_sync_provider.core.source.schema import TableSchema, read_table_schema
from airflow_sync_provider.core.source.weights import SPLIT_WEIGHT_COLUMN, mysql_weight_sql, needs_weight
from airflow_sync_provider.core.sql import ch_ident, ch_string, ch_table, mysql_ident, mysql_table
from airflow_sync_provider.core.verify.diff import (
    CHANGED,
    DELETED,
    FLAGS,
    NEW,
    DiffColumns,
    DiffError,
    change_samples,
    new_name,
    nullable,
    old_name,
)
from airflow_sync_provider.core.verify.pruning import (
    Positions,
    first_rows,
)
from airflow_sync_provider.core.verify.shape import CopyShape, column_problems, read_copy_shape
from airflow_sync_provider.spark.channels import driver_copy_limit, run_channels
from airflow_sync_provider.spark.diff_multiset import run_multiset_diff
from airflow_sync_provider.spark.diff_shard import (
    INTEGER_TYPES,
    ChColumn,
    ChTable,
    DiffContext,
    diff_channel,
    forget_run,
    split_name,
)
from airflow_sync_provider.spark.groups import group_members
from airflow_sync_provider.spark.session import lazy

log = logging.getLogger(__name__)


# --- the driver --------------------------------------------------------------------------------

def _user_columns(types: dict) -> list[str]:
    return [c for c in types if c not in INTERNAL_COLUMNS]


def _copy_split_column(ledger: Ledger, old_table: str) -> str | None:
    """The column whose collation weight the copy's ``_split_weight`` holds: the split column of
    the newest load (full load or bootstrap) that wrote the table."""
    rows = ledger.ch.query(f"SELECT plan FROM {ledger.table('loads')} FINAL WHERE target_table = {{t:String}}"
                           " AND status = 'published' ORDER BY updated_at DESC LIMIT 1",
                           parameters={"t": old_table}).result_rows
    return json.loads(rows[0][0]).get("split_column") if rows else None


def _create_copy(spec: SnapshotDiffSpec, ch) -> dict:
    with mysql_reader.connect(spec.source) as conn:
        schema = read_table_schema(conn, spec.source_database, spec.source_table)
    schema = schema.shaped(spec.tableset.content_of(), spec.salt, writer="diff")  # what the copy is to hold
    check_columns(schema)
    database, table = split_name(spec.old_table)
    log.info(f"diff {spec.diff_key}: creating {spec.old_table} (it did not exist)")
    ch.command(f"CREATE DATABASE IF NOT EXISTS {ch_ident(database)}")
    ch.command(create_table_sql(schema, database, table, spec.tableset.layout_of()))
    return column_types(ch, database, table)


def _resolve_mysql(spec: SnapshotDiffSpec, ch, ledger: Ledger, old_types: dict, copy: CopyShape,
                   merged: TableSchema | None = None) -> dict:
    """Columns, canonical schema, shards and version when the new snapshot is the MySQL table
    (``merged``: a merged copy's shape, which a member's table is seen through)."""
    with mysql_reader.connect(spec.source) as conn:
        schema = read_table_schema(conn, spec.source_database, spec.source_table)
        if merged is not None:
            schema = member_view(merged, Member.of(spec.member), schema)
        schema = _shaped(spec, schema, copy)
        table = schema.qualified
        skipped = [c.name for c in schema.columns if c.name not in old_types]
        if spec.compare_columns and set(spec.compare_columns) & set(skipped):
            raise DiffError(f"table {table}: compare_columns {sorted(set(spec.compare_columns) & set(skipped))} "
                            f"are not in the old snapshot {spec.old_table}")
        keys = spec.key_columns or list(schema.target_key)
        _check_copy_shape(spec, ch, copy, schema, old_types, keys)
        if skipped:
            log.info(f"diff {spec.diff_key}: column(s) {skipped} of {table} are not in {spec.old_table}; "
                  "not compared")
        schema = dataclasses.replace(schema, primary_key=tuple(k for k in schema.primary_key if k in old_types))
        schema = schema.select([c.name for c in schema.columns if c.name in old_types])
        mappings = {m.name: m for m in schema.mappings()}
        floats = [m.name for m in mappings.values() if m.source.data_type in ("float", "double", "real")]
        columns = DiffColumns.resolve(table, list(mappings), keys, spec.compare_columns, spec.ignore_columns,
                                      spec.tolerances, floats)
        weight_col = _copy_split_column(ledger, spec.old_table) if SPLIT_WEIGHT_COLUMN in old_types else None
        # a TTL'd copy (core/clickhouse/ttl.py): only the rows no merge can have expired are compared
        window = Window.of(stored(copy.comment)[0].ttl if copy else "", schema.mappings(), spec.old_table)
        if window:
            log.info(f"diff {spec.diff_key}: TTL: compared the rows with {window.describe()} (those nearer their "
                     "expiry are not)")
        where = Filter(*window.mysql_sql(schema.mappings())) if window else Filter()
        plan = plan_table(conn, schema, Sharding(speed=SpeedLimits(channels=spec.channels),
                          split_column=spec.split_column or weight_col or keys[0], split_factor=spec.split_factor,
                          where=where))
        column = schema.column(plan.split_column) if plan.split_column else None
        database, name = split_name(spec.old_table)
        if needs_weight(column) and column.name != weight_col:
            log.info(f"diff {spec.diff_key}: {spec.old_table} holds no collation weights of "
                  f"{column.name!r}; one shard, pruned by buckets only")
            # (its estimate sets the first bucket width)
            plan = whole_table(conn, schema, where, estimate=True, strategy=plan.strategy, warnings=plan.warnings)
        predicates = dict(zip((s.id for s in plan.shards), shard_predicates(
            conn, ch, plan, schema, (database, name), also=window.ch_sql() if window else "")))
        position = position_if_readable(conn, table, source_epoch(conn, ch, spec.ledger_database))
        first = mappings[keys[0]].source
        key_position = first.data_type in INTEGER_TYPES and not first.nullable
        if key_position:
            with conn.cursor() as cur:
                cur.execute(f"SELECT MIN({mysql_ident(first.name)}), MAX({mysql_ident(first.name)}) "
                            f"FROM {mysql_table(spec.source_database, spec.source_table)}")
                low, high = cur.fetchone()
            ch_low, ch_high = _ch_key_range(ch, spec.old_table, first.name)
            positions = Positions.of_keys([low, ch_low], [high, ch_high])
    weight_column = schema.column(weight_col) if weight_col is not None else None
    columns_sql = mysql_reader.select_list(list(mappings.values())) + ("" if key_position else ", {position}")
    if weight_column is not None:
        columns_sql += f", COALESCE({mysql_weight_sql(weight_column)}, '')"
    return {"columns": columns, "schema": mysql_reader.arrow_schema(list(mappings.values())), "texts": mappings,
            "plan": plan, "old_predicates": predicates, "weight": weight_column is not None, "position": position,
            "mysql_columns_sql": columns_sql, "key_position": key_position,
            "positions": positions if key_position else Positions.of_hash(),
            "ch_types": {m.name: m.ch_type for m in mappings.values()}, "table_schema": schema}


def _history(spec: SnapshotDiffSpec, ch, copy: CopyShape, found: dict | None, started: float):
    """The copy's history an apply writes, and its stamp: the changes as found, without a binlog
    (``_via`` diff), at the apply's version; None when the copy keeps none. Refused, before any
    write, where the apply cannot write it yet (a keyless copy; a ClickHouse table as the new side)."""
    if spec.on_change != "apply" or not shaping.stored(copy.comment)[0].history:
        return None
    if copy.multiset or found is None or "table_schema" not in found:
        refuse_unwritten(True, spec.old_table, "the diff's apply", "slice 6" if copy.multiset else "slice 4",
                         DiffError)
    history = HistoryTable.of(ch, found["table_schema"], *split_name(spec.old_table))
    history.create(ch)
    return history, Stamp("update", "diff", int(started * 1_000_000))


def _moves(ch, spec: SnapshotDiffSpec) -> bool:
    """Can an upsert move a key out of its place in the copy (its layout sorts or partitions by
    columns beyond the key: core/clickhouse/layout.py)? Then the apply tombstones the old place."""
    if spec.on_change != "apply":
        return False
    database, table = split_name(spec.old_table)
    layout = copy_layout(ch, database, table)
    return bool(layout.place_columns(list(column_types(ch, database, table))))


def _reload_remedy(spec: SnapshotDiffSpec) -> str:
    return (f"a retry does not help: reload {spec.source_database}.{spec.source_table} in full into {spec.old_table} "
            "(its full load; a CDC copy: re-bootstrap it), then diff again")


def _shaped(spec: SnapshotDiffSpec, schema: TableSchema, copy: CopyShape) -> TableSchema:
    """The source as the copy holds it (core/content/): the settings the copy was made with; a
    diff that names others is refused, naming both."""
    requested, held = spec.tableset.content_of(), shaping.stored(copy.comment)[0]
    if requested:
        shaping.check_same(spec.old_table, requested, spec.salt, copy.comment)
    return schema.shaped(requested or held, spec.salt, writer="diff")


def _check_copy_shape(spec: SnapshotDiffSpec, ch, copy: CopyShape, schema, old_types: dict, keys: list[str]) -> None:
    """The copy's columns and key against the MySQL table now (core/verify/shape.py): a key the copy
    lacks, or a column the copy holds in another type than a load would now give it, cannot be
    compared (nor applied) value for value: a clear error naming them and the remedy, not a
    ClickHouse exception or flags of values read in the wrong type."""
    table = schema.qualified
    if not keys:
        hint = (f"; its copy {spec.old_table} is keyed by ({', '.join(copy.key)}): pass key_columns={list(copy.key)!r} "
                f"(--key) to pair the rows by it, or reload the table in full" if copy is not None and copy.replacing
                and copy.key else "")
        raise DiffError(f"table {table} has no primary key: a diff needs key_columns to pair the rows{hint}")
    missing = [k for k in keys if k not in old_types]
    if missing:
        raise DiffError(f"table {table}: key column(s) {missing} are not in the old snapshot {spec.old_table} (its "
                        f"columns: {_user_columns(old_types)}); {_reload_remedy(spec)}")
    both = [c for c in schema.columns if c.name in old_types]
    problems = column_problems(ch, dataclasses.replace(schema, columns=tuple(both), primary_key=()), old_types)
    if problems:
        raise DiffError(f"table {table}: its copy {spec.old_table} no longer has the source's shape: "
                        f"{'; '.join(problems)}; {_reload_remedy(spec)}")


def _shape_notes(spec: SnapshotDiffSpec, copy: CopyShape, keys: tuple[str, ...]) -> tuple[list[str], dict]:
    """What a person should know about the old table's engine and key against the diff's key, and
    what to say about a key found twice in it."""
    key = f"({', '.join(keys)})"
    if not copy.replacing:
        return ([f"{spec.old_table} is a {copy.engine}, not a ReplacingMergeTree (as a copy loaded while the table had "
                 f"no primary key is): read without FINAL, every stored row counts; the diff pairs rows by {key}"],
                {"old": f"{spec.old_table} is a {copy.engine}, which merges no rows by key (e.g. a copy loaded while "
                        f"the table had no primary key): reload it in full to get a copy keyed by {key}"})
    if set(copy.key) != set(keys):
        return ([f"{spec.old_table} is keyed by ({', '.join(copy.key)}) but the diff pairs rows by {key}: the flags "
                 "describe the copy as its readers see it (FINAL keeps one row per copy key)"],
                {"old": f"{spec.old_table} is keyed by ({', '.join(copy.key)}), not by the diff's key {key}"})
    layout = stored(copy.comment)[0]
    if layout.place_columns(list(copy.columns)):  # core/clickhouse/layout.py: FINAL keeps a row per place
        return [], {"old": f"{spec.old_table} is laid out as {layout.describe()}, so FINAL keeps a row per sorting "
                           "key and partition: this key's row was left live under an old place, where nothing "
                           "replaced it. reconcile with reimport (or the pipeline's verification) repairs it"}
    return [], {}


def _check_apply(spec: SnapshotDiffSpec, copy: CopyShape, keys: tuple[str, ...]) -> None:
    """An apply upserts rows and tombstones keys with versions: only a ReplacingMergeTree keyed by
    exactly the diff's key makes a newer version replace the old row of its key. Anything else
    would keep both rows (a plain MergeTree) or merge rows of different keys (another key)."""
    key = f"({', '.join(keys)})"
    if not copy.replacing:
        raise DiffError(f"cannot apply to {spec.old_table}: it is a {copy.engine}, not a ReplacingMergeTree (e.g. a "
                        f"copy loaded while the table had no primary key): an upserted row would stand beside the row "
                        f"it replaces. "
                        f"A retry does not help: reload it in full (a keyed source gets a ReplacingMergeTree copy "
                        f"keyed by {key}), or diff without apply")
    if set(copy.key) != set(keys):
        raise DiffError(f"cannot apply to {spec.old_table}: it is keyed by ({', '.join(copy.key)}), but the diff pairs "
                        f"rows by {key}; its ReplacingMergeTree would merge rows by the wrong key. A retry does not "
                        "help: reload it in full (its key becomes the source's primary key), or diff without apply")


def _ch_key_range(ch, name: str, column: str) -> tuple:
    """The smallest and largest value of an integer key column (every stored version: a bound
    is all positions need), or (None, None) for an empty table."""
    count, low, high = ch.query(f"SELECT count(), min({ch_ident(column)}), max({ch_ident(column)}) FROM "
                                f"{ch_table(*split_name(name))}").result_rows[0]
    return (int(low), int(high)) if count else (None, None)


def _resolve_clickhouse(spec: SnapshotDiffSpec, ch, old_types: dict) -> dict:
    """The same when the new snapshot is another ClickHouse table: one shard, pruned by buckets."""
    new_types = column_types(ch, *split_name(spec.new_table))
    if not new_types:
        raise DiffError(f"the new snapshot {spec.new_table} does not exist on ClickHouse")
    names = [c for c in _user_columns(old_types) if c in new_types]
    keys = spec.key_columns or copy_key(ch, *split_name(spec.old_table))
    floats = [c for c in names if "Float" in old_types[c]]
    columns = DiffColumns.resolve(spec.old_table, names, keys, spec.compare_columns, spec.ignore_columns,
                                  spec.tolerances, floats)
    schema = ch.query_arrow(f"SELECT {', '.join(ch_ident(n) for n in names)} FROM "
                            f"{ch_table(*split_name(spec.old_table))} LIMIT 0").schema
    new_ch = ChTable.of(ch, spec.new_table)
    rows = int(ch.command(f"SELECT count() FROM {new_ch.from_sql}"))
    plan = Plan(*split_name(spec.new_table), None, None, "balanced", 1, 1, (Shard(0, "1", (), rows),))
    return {"columns": columns, "schema": schema, "texts": {n: ChColumn(n) for n in names}, "plan": plan,
            "old_predicates": {0: ("1", {})}, "weight": False, "position": None, "mysql_columns_sql": "",
            "key_position": False, "positions": Positions.of_hash(), "ch_types": {n: old_types[n] for n in names},
            "new_ch": new_ch}


def _changes_ddl(columns: DiffColumns, ch_types: dict) -> tuple[str, list[str]]:
    """The change-set table's DDL with ``{table}`` for its name, and its column names. One partition
    per diff key: a diff clears its previous change set by dropping its partition, where a DELETE
    re-read every row the table had ever held (lightweight deletes only mask rows): 1.3-1.8 s per
    diff, whatever it found, once a 10M-row change set had been written there."""
    cols = ["diff_key String", "run_id String", "flag LowCardinality(String)", "changed Array(String)"]
    cols += [f"{ch_ident(k)} {ch_types[k]}" for k in columns.keys]
    for c in columns.compared:
        cols += [f"{ch_ident(old_name(c))} {nullable(ch_types[c])}", f"{ch_ident(new_name(c))} {nullable(ch_types[c])}"]
    order = ", ".join(["diff_key", "flag", *(ch_ident(k) for k in columns.keys)])  # a multiset's has no keys
    sql = ("CREATE TABLE {table} (\n  " + ",\n  ".join(cols) + "\n) ENGINE = MergeTree PARTITION BY diff_key "
           f"ORDER BY ({order})")
    return sql, [c.split(" ", 1)[0].strip("`") for c in cols]


def _prepare_changes(ch, spec: SnapshotDiffSpec, columns: DiffColumns, ch_types: dict) -> None:
    """The change-set table, recreated when this diff's columns changed; this diff's rows cleared
    (a rerun writes the same change set, not a second one)."""
    database, table = split_name(spec.changes_table)
    name = ch_table(database, table)
    sql, names = _changes_ddl(columns, ch_types)
    ch.command(f"CREATE DATABASE IF NOT EXISTS {ch_ident(database)}")
    existing = column_types(ch, database, table)
    if existing and list(existing) != names:
        ch.command(f"DROP TABLE {name}")
        existing = {}
    if not existing:
        ch.command(sql.format(table=name))
        return
    partition_key = ch.command("SELECT partition_key FROM system.tables"
                               " WHERE database = {d:String} AND name = {t:String}",
                               parameters={"d": database, "t": table})
    if str(partition_key).strip() != "diff_key":  # written by an earlier release: one partition for all keys
        staging = ch_table(database, f"{table}__repartition")
        ch.command(f"DROP TABLE IF EXISTS {staging}")
        ch.command(sql.format(table=staging))
        ch.command(f"INSERT INTO {staging} SELECT * FROM {name} WHERE diff_key != {{k:String}}",
                   parameters={"k": spec.diff_key})  # the other diff keys' change sets carry over
        ch.command(f"EXCHANGE TABLES {name} AND {staging}")
        ch.command(f"DROP TABLE {staging}")
        return
    ch.command(f"ALTER TABLE {name} DROP PARTITION {ch_string(spec.diff_key)}")


def _apply_version(spec: SnapshotDiffSpec, ch, old_types: dict, position) -> int:
    """Rows an apply writes rank below every change after the diff started reading (the binlog
    position then, as a repair's read) or, without a binlog, above everything the table holds."""
    missing = [c for c in (VERSION_COLUMN, DELETED_COLUMN) if c not in old_types]
    if missing:
        raise DiffError(f"cannot apply to {spec.old_table}: it has no {missing} column(s); apply writes versioned "
                        "rows and tombstones into a copy made by a full load, a bootstrap or CDC")
    check_layout(ch, *split_name(spec.old_table))
    if position is not None:
        return position.snapshot_version(repair=True)
    database, table = split_name(spec.old_table)  # above its history's too (an earlier attempt's rows)
    return max(version_above(ch, database, table), version_above(ch, database, history_name(table)))


CHANGES_WAIT_SECONDS = 3600  # a diff waits this long for another one writing its change set


def run_snapshot_diff(spec: SnapshotDiffSpec, spark, merged: TableSchema | None = None) -> dict:
    """One diff; diffs that write one change-set table (e.g. a backfill's runs) take turns: each
    clears its rows there and may recreate the table (a lock on the source, when there is one).
    ``merged``: a member's diff of a merged copy (:func:`run_group_diff`)."""
    if spec.source is None:  # ClickHouse against ClickHouse: no source to hold a lock on
        return _diff(spec, spark)
    name = lock_name(spec.ledger_database, f"changes:{spec.changes_table}")
    try:
        lock = NamedLock.take(spec.source, name, wait_seconds=CHANGES_WAIT_SECONDS)
    except LockHeld as held:
        raise DiffError(f"diff {spec.diff_key!r}: another diff has written the change set {spec.changes_table} for "
                        f"over {CHANGES_WAIT_SECONDS} s ({held.where} holds lock {held.name!r}); run it again later, "
                        "or give this diff a changes_table of its own") from None
    try:
        return _diff(spec, spark, merged)
    finally:
        lock.release()


def _diff(spec: SnapshotDiffSpec, spark, merged: TableSchema | None = None) -> dict:
    started = time.time()
    ch = client(spec.target)
    ledger = Ledger(ch, spec.ledger_database)
    ledger.ensure()
    old_types = column_types(ch, *split_name(spec.old_table))
    if not old_types and spec.on_change == "apply" and spec.source_table:
        old_types = _create_copy(spec, ch)  # a first run seeds the copy: every row is new
    if not old_types:
        raise DiffError(f"the old snapshot {spec.old_table} does not exist on ClickHouse")
    copy = read_copy_shape(ch, *split_name(spec.old_table))
    if copy.multiset:  # a table without a key: occurrences compared by value (spark/diff_multiset.py)
        _history(spec, ch, copy, None, started)  # refused: a keyless copy's history is not built yet
        try:
            return run_multiset_diff(spec, ch, copy, lambda schema: _shaped(spec, schema, copy),
                                     lambda columns, types: _prepare_changes(ch, spec, columns, types))
        finally:
            ch.close()
    found = (_resolve_clickhouse(spec, ch, old_types) if spec.new_table
             else _resolve_mysql(spec, ch, ledger, old_types, copy, merged))
    if spec.on_change == "apply":
        _check_apply(spec, copy, found["columns"].keys)
    notes, advice = _shape_notes(spec, copy, found["columns"].keys)
    for note in notes:
        log.info("diff %s: %s", spec.diff_key, note)
    version = _apply_version(spec, ch, old_types, found["position"]) if spec.on_change == "apply" else None
    history = _history(spec, ch, copy, found, started)
    run_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
    _prepare_changes(ch, spec, found["columns"], found["ch_types"])
    plan = found["plan"]
    rows = sum(s.estimated_rows or 0 for s in plan.shards)
    # hash positions spread each shard's rows over the whole range; key positions, the table's
    spread = rows if found["key_position"] else rows / max(1, len(plan.shards))
    width = found["positions"].first_width(int(spread), first_rows(max(s.estimated_rows or 0 for s in plan.shards)))
    ctx = DiffContext(spec, run_id, found["columns"], found["schema"], found["texts"], plan,
                   found["old_predicates"], ChTable.of(ch, spec.old_table),
                   found["weight"], version, found["mysql_columns_sql"], found["key_position"], found["positions"],
                   width, found.get("new_ch"), advice, _moves(ch, spec), history)
    ids = [s.id for s in plan.shards]
    channels = max(1, min(spec.channels, len(ids)))
    queues = [ids[i::channels] for i in range(channels)]
    # the comparisons run inside the databases: a local master or a small table needs no SparkContext
    session = lazy(spark)
    in_driver = rows <= driver_copy_limit(None, session)
    shards = sorted(run_channels(session, queues, lambda q, _: diff_channel(ctx, q), in_driver),
                    key=lambda r: r["shard_id"])
    counts = {flag: sum(s[flag] for s in shards) for flag in FLAGS}
    changed = counts[CHANGED] + counts[NEW] + counts[DELETED]
    verdict = "identical" if not changed else ("applied" if spec.on_change == "apply" else "changed")
    result = {
        "diff_key": spec.diff_key, "run_id": run_id, "old": spec.old_table, "new": spec.new_name,
        "verdict": verdict, "on_change": spec.on_change, "counts": counts,
        "rows_old": sum(s["old_rows"] for s in shards), "rows_new": sum(s["new_rows"] for s in shards),
        "rows_read_old": sum(s["rows_read_old"] for s in shards),
        "rows_read_new": sum(s["rows_read_new"] for s in shards),
        "shards": len(shards), "shards_read": sum(1 for s in shards if s["buckets_read"]),
        "buckets_read": sum(s["buckets_read"] for s in shards), "version": version,
        "changes_table": spec.changes_table, "keys": list(ctx.columns.keys), "compared": list(ctx.columns.compared),
        "levels": max((s["levels"] for s in shards), default=0),
        "positions": "key" if ctx.key_position else "hash", "in_driver": in_driver, "spark_started": session.started,
        "notes": notes,
    }
    ledger.write_diff(result, shards)
    forget_run(run_id)
    samples = change_samples(ch, spec.changes_table, spec.diff_key, run_id, spec.sample_rows)
    ch.close()
    return result | {"shard_results": shards, "samples": samples, "seconds": round(time.time() - started, 3)}


def run_group_diff(spec: SnapshotDiffSpec, spark) -> dict:
    """A merged copy (core/source/group.py) against its sources: every member's table against the
    copy's rows of it (its source columns in the key), each a diff of its own
    (``<diff key>:<source>:<db>.<table>``) into one change set; rows of the copy from a source
    table no longer selected are counted as ``orphans`` (a re-load removes them)."""
    started = time.time()
    session = lazy(spark)
    members = group_members(spec)
    merged = merged_schema([(m, schema) for m, _, _, schema in members], spec.merge.into)
    ch = client(spec.target)
    try:
        database, table = spec.merge.database, spec.merge.table
        # one layout, keyed by the merged key: an existing copy's own, or refused naming both
        layout = resolve_layout(ch, database, table, spec.tableset.merged_layout(spec.merge.into))
        if not table_exists(ch, database, table):
            if spec.on_change != "apply":
                raise DiffError(f"the merged copy {spec.merge.into} does not exist on ClickHouse")
            ch.command(f"CREATE DATABASE IF NOT EXISTS {ch_ident(database)}")
            ch.command(create_table_sql(member_view(merged, members[0][0], members[0][3]), database, table,
                                               layout))
        tags = ", ".join(ch_ident(c) for c in SOURCE_COLUMNS)
        present = {tuple(r) for r in ch.query(f"SELECT DISTINCT {tags} FROM {ch_table(database, table)} FINAL"
                                              ).result_rows}
    finally:
        ch.close()
    orphans = sorted(":".join((s, f"{d}.{t}")) for s, d, t in present - {m.tags for m, *_ in members})
    results = []
    for member, source, _, _ in members:  # one at a time: they share the change set's table
        one = run_snapshot_diff(spec.for_member(member, source.endpoint), session, merged)
        results.append(one | {"member": member.name, "table": f"{member.database}.{member.table}"})
    counts = {flag: sum(r["counts"][flag] for r in results) for flag in FLAGS}
    if orphans:
        log.warning("diff %s: %s holds rows of source tables no longer selected: %s", spec.diff_key, spec.merge.into,
                    ", ".join(orphans))
    changed = any(r["verdict"] != "identical" for r in results)
    return {"diff_key": spec.diff_key, "merge_into": spec.merge.into, "tables": results, "counts": counts,
            "orphans": orphans, "verdict": ("applied" if spec.on_change == "apply" else "changed") if changed
            else "identical", "selected": [m.name for m, *_ in members], "seconds": round(time.time() - started, 3)}

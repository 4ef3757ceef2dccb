"""Snapshot diff: old (a ClickHouse table) vs new (the MySQL source or another ClickHouse table).

Driver: resolve the columns and the canonical schema, plan shards on the source (the planner;
evaluated on ClickHouse as reconciliation does), fix the apply's version and clear the
previous change set of this diff. Executors, per shard: count and checksum both sides by
``CRC32(key) % B`` bucket inside the databases (core/verify/diff.py); a shard whose buckets all agree
is identical without a row being read. The rows of the differing buckets are read once per
side, spilled to one Arrow file per bucket, and compared bucket by bucket, so memory holds one
bucket (``bucket_rows``) whatever the table's size. Each bucket's changes go to the change set,
and with ``on_change="apply"`` into the old table: ``new``/``changed`` rows upserted,
``deleted`` rows as tombstones, all with one version of the shared scheme (below the binlog
position read at the diff's start, so any later change outranks them).
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import tempfile
import time
import uuid
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from airflow_sync_provider.core.cdc.positions import position_if_readable
from airflow_sync_provider.core.jobspec import SnapshotDiffSpec
from airflow_sync_provider.core.ledger import Ledger
from airflow_sync_provider.core.source import reader as mysql_reader
from airflow_sync_provider.core.source.planning import Plan, Shard, SpeedLimits, explain, plan_table
from airflow_sync_provider.core.source.schema import read_table_schema
from airflow_sync_provider.core.sql import ch_ident, ch_table, mysql_ident
from airflow_sync_provider.core.target import clickhouse as target
from airflow_sync_provider.core.target.shards import (
    SPLIT_WEIGHT_COLUMN, cut_points, needs_weight, read_weights, target_predicates, weight_width,
)
from airflow_sync_provider.core.typemap import MySQLColumn, map_column
from airflow_sync_provider.core.verify.diff import (
    CHANGED, DELETED, FLAGS, IDENTICAL, MAX_BUCKETS, NEW, DiffColumns, DiffError, bucket_count, compare,
    differing_buckets, new_name, nullable, old_name,
)
from airflow_sync_provider.core.verify.reconcile import ch_row_hash, mysql_row_hash, row_text

BUCKET = "_diff_bucket"  # an alias no table column should shadow
_BUCKET_MAPPING = map_column(MySQLColumn(BUCKET, "int", "int unsigned", False))


@dataclass(frozen=True)
class _ChColumn:
    """A column of a ClickHouse-vs-ClickHouse diff: its text is ClickHouse's own."""

    name: str
    plain_text = False  # any type's text: escaped in the row text

    def ch_text(self, col_sql: str) -> str:
        return f"toString({col_sql})"


@dataclass
class _Context:
    """Everything an executor needs, built once by the driver (no secrets beyond the spec's)."""

    spec: SnapshotDiffSpec
    run_id: str
    columns: DiffColumns
    schema: pa.Schema  # canonical: the carried columns
    texts: dict  # column → mapping (MySQL mode) or _ChColumn (ClickHouse mode)
    plan: Plan
    old_predicates: dict  # shard id → (where, params) on the old table
    old_from: str  # "db.t FINAL"
    old_filter: str  # " AND _deleted = 0" or ""
    weight: bool  # rows carry the copy's _split_weight (read from MySQL, written back)
    version: int | None  # the apply's version
    mysql_columns_sql: str = ""


# --- the two sides -----------------------------------------------------------------------------

def _bucket_sql(ctx: _Context, side: str, buckets: int) -> str:
    text = row_text([ctx.texts[k] for k in ctx.columns.keys], side)
    if side == "mysql":
        return f"MOD(CRC32({text}), {int(buckets)})"  # not %: pymysql formats it
    return f"toUInt32(modulo(CRC32({text}), {int(buckets)}))"


def _hashed(ctx: _Context) -> list:
    return [ctx.texts[c] for c in (*ctx.columns.keys, *ctx.columns.compared)]


def _old_buckets(ctx: _Context, ch, shard_id: int, buckets: int) -> dict:
    where, params = ctx.old_predicates[shard_id]
    rows = ch.query(f"SELECT {_bucket_sql(ctx, 'clickhouse', buckets)} AS {BUCKET}, count(), "
                    f"sum(toUInt128({ch_row_hash(_hashed(ctx))})) FROM {ctx.old_from} WHERE ({where}){ctx.old_filter}"
                    f" GROUP BY {BUCKET}", parameters=params).result_rows
    return {int(b): (int(n), int(s)) for b, n, s in rows}


def _new_buckets(ctx: _Context, ch, conn, shard: Shard, buckets: int) -> dict:
    if ctx.spec.new_table:
        return _old_buckets(dataclasses.replace(ctx, old_from=_ch_from(ch, ctx.spec.new_table),
                                                old_filter=_deleted_filter(ch, ctx.spec.new_table)),
                            ch, shard.id, buckets)
    with conn.cursor() as cur:
        cur.execute(f"SELECT {_bucket_sql(ctx, 'mysql', buckets)}, COUNT(*), SUM({mysql_row_hash(_hashed(ctx))})"
                    f" {ctx.plan.from_clause()} WHERE {shard.where} GROUP BY 1", shard.params)  # 1: not a column
        return {int(b): (int(n), int(s)) for b, n, s in cur.fetchall()}


def _cast(batch: pa.RecordBatch, schema: pa.Schema, where: str) -> pa.Table:
    table = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch
    try:
        return table.select(schema.names).cast(schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise DiffError(f"{where}: a value does not fit the canonical type: {exc}") from exc


def _read_ch(ctx: _Context, ch, table_from: str, table_filter: str, shard_id: int, buckets: int, wanted: list[int],
             weight: bool, where: str):
    """The differing buckets' rows of one shard of a ClickHouse table, batch by batch."""
    pred, params = ctx.old_predicates[shard_id]
    names = list(ctx.schema.names) + ([SPLIT_WEIGHT_COLUMN] if weight else [])
    schema = ctx.schema.append(pa.field(SPLIT_WEIGHT_COLUMN, pa.binary())) if weight else ctx.schema
    schema = schema.append(pa.field(BUCKET, pa.uint32()))
    sql = (f"SELECT {', '.join(ch_ident(n) for n in names)}, {_bucket_sql(ctx, 'clickhouse', buckets)} AS {BUCKET}"
           f" FROM {table_from} WHERE ({pred}){table_filter} AND {BUCKET} IN {{wanted:Array(UInt32)}}")
    with ch.query_arrow_stream(sql, parameters=params | {"wanted": wanted}) as stream:
        for block in stream:
            yield _cast(block, schema, where)


def _read_mysql(ctx: _Context, shard: Shard, buckets: int, wanted: list[int], where: str):
    bucket = _bucket_sql(ctx, "mysql", buckets)
    shard = dataclasses.replace(shard, where=f"({shard.where}) AND {bucket} IN ({', '.join(map(str, wanted))})")
    columns_sql = ctx.mysql_columns_sql.replace("{bucket}", bucket)
    mappings = [ctx.texts[c] for c in ctx.schema.names] + [_BUCKET_MAPPING]
    conn = mysql_reader.stream_connect(ctx.spec.source)
    try:
        for batch in mysql_reader.read_shard(conn, ctx.plan, mappings, shard, ctx.spec.fetch_rows, columns_sql,
                                             ctx.weight):
            # read_shard puts the weight last; the spill wants the bucket last
            table = pa.Table.from_batches([batch])
            if ctx.weight:
                table = table.select([*ctx.schema.names, SPLIT_WEIGHT_COLUMN, BUCKET])
            yield table
    finally:
        conn.close()


def _spill(tables, directory: str, side: str) -> int:
    """Write each bucket's rows to its own Arrow file; returns the rows read. One open file per
    differing bucket (up to MAX_BUCKETS): the soft limit on open files is raised to allow it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = MAX_BUCKETS + 256
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted if hard == resource.RLIM_INFINITY else min(wanted, hard),
                                                    hard))
    writers, rows = {}, 0
    try:
        for table in tables:
            rows += table.num_rows
            bucket = table.column(BUCKET)
            for b in pc.unique(bucket).to_pylist():
                part = table.filter(pc.equal(bucket, b)).drop_columns([BUCKET])
                if b not in writers:
                    writers[b] = pa.ipc.new_file(os.path.join(directory, f"{side}-{b}.arrow"), part.schema)
                writers[b].write_table(part)
    finally:
        for writer in writers.values():
            writer.close()
    return rows


def _load(directory: str, side: str, bucket: int, schema: pa.Schema) -> pa.Table:
    path = os.path.join(directory, f"{side}-{bucket}.arrow")
    if not os.path.exists(path):
        return schema.empty_table()
    with pa.memory_map(path) as source:
        return pa.ipc.open_file(source).read_all()


# --- one shard ---------------------------------------------------------------------------------

def _write(ch, ctx: _Context, result, shard_id: int, bucket: int) -> None:
    spec = ctx.spec
    changes = result.changes
    changes = changes.add_column(0, "diff_key", pa.array([spec.diff_key] * changes.num_rows, pa.string()))
    changes = changes.add_column(1, "run_id", pa.array([ctx.run_id] * changes.num_rows, pa.string()))
    database, table = spec.changes_table.split(".", 1)
    ch.insert_arrow(table, changes, database=database)
    if spec.on_change != "apply":
        return
    database, table = spec.old_table.split(".", 1)
    for rows, deleted in ((result.upserts, 0), (result.tombstones, 1)):
        if rows is None:
            continue
        n = rows.num_rows
        rows = rows.append_column(target.VERSION_COLUMN, pa.array([ctx.version] * n, pa.uint64()))
        rows = rows.append_column(target.DELETED_COLUMN, pa.array([deleted] * n, pa.uint8()))
        ch.insert_arrow(table, rows, database=database, settings=target.WEIGHT_SETTINGS if ctx.weight else None)


def _diff_shard(ctx: _Context, ch, conn, shard: Shard) -> dict:
    started = time.time()
    spec = ctx.spec
    where = f"diff {spec.diff_key!r}, shard {shard.id}"
    buckets = bucket_count(shard.estimated_rows or 0, spec.bucket_rows)
    while True:  # the planner's estimate sets the bucket count; too few for the true count: again
        old = _old_buckets(ctx, ch, shard.id, buckets)
        new = _new_buckets(ctx, ch, conn, shard, buckets)
        rows = max(sum(n for n, _ in old.values()), sum(n for n, _ in new.values()))
        if bucket_count(rows, spec.bucket_rows) <= 2 * buckets:
            break
        buckets = bucket_count(rows, spec.bucket_rows)
    wanted = differing_buckets(old, new)
    record = {"shard_id": shard.id, "old_rows": sum(n for n, _ in old.values()),
              "new_rows": sum(n for n, _ in new.values()), "buckets": buckets, "buckets_read": len(wanted),
              "rows_read_old": 0, "rows_read_new": 0, **dict.fromkeys(FLAGS, 0)}
    record[IDENTICAL] = sum(new[b][0] for b in new if b not in wanted)
    if wanted:
        with tempfile.TemporaryDirectory(prefix="airflow-sync-diff-") as spill:
            old_table, old_filter = ctx.old_from, ctx.old_filter
            record["rows_read_old"] = _spill(_read_ch(ctx, ch, old_table, old_filter, shard.id, buckets, wanted,
                                                      ctx.weight, where), spill, "old")
            if spec.new_table:
                reader = _read_ch(ctx, ch, _ch_from(ch, spec.new_table), _deleted_filter(ch, spec.new_table),
                                  shard.id, buckets, wanted, False, where)
            else:
                reader = _read_mysql(ctx, shard, buckets, wanted, where)
            record["rows_read_new"] = _spill(reader, spill, "new")
            old_schema = ctx.schema.append(pa.field(SPLIT_WEIGHT_COLUMN, pa.binary())) if ctx.weight else ctx.schema
            new_schema = old_schema if not spec.new_table else ctx.schema
            for b in wanted:
                result = compare(_load(spill, "old", b, old_schema), _load(spill, "new", b, new_schema), ctx.columns,
                                 f"{where}, bucket {b}")
                for flag in FLAGS:
                    record[flag] += result.counts[flag]
                if result.changes is not None:
                    _write(ch, ctx, result, shard.id, b)
    record["seconds"] = round(time.time() - started, 3)
    return record


def _diff_channel(ctx: _Context, shard_ids: list[int]):
    """Runs on an executor: one ClickHouse client and one MySQL connection for a queue of shards."""
    ch = target.client(ctx.spec.target)
    conn = mysql_reader.connect(ctx.spec.source) if ctx.spec.source_table else None
    shards = {s.id: s for s in ctx.plan.shards}
    try:
        for shard_id in shard_ids:
            yield _diff_shard(ctx, ch, conn, shards[shard_id])
    finally:
        if conn is not None:
            conn.close()
        ch.close()


# --- the driver --------------------------------------------------------------------------------

def _split(name: str) -> tuple[str, str]:
    database, _, table = name.partition(".")
    return database, table


def _ch_from(ch, name: str) -> str:
    """``db.t FINAL`` for ReplacingMergeTree tables (each key's newest version only)."""
    database, table = _split(name)
    engine = ch.command("SELECT engine FROM system.tables WHERE database = {d:String} AND name = {t:String}",
                        parameters={"d": database, "t": table})
    return ch_table(database, table) + (" FINAL" if "Replacing" in str(engine) else "")


def _deleted_filter(ch, name: str) -> str:
    """Tombstones are not rows of the snapshot (FINAL already hides them on our copies)."""
    return f" AND {ch_ident(target.DELETED_COLUMN)} = 0" if target.DELETED_COLUMN in target.column_types(ch, *_split(name)) else ""


def _user_columns(types: dict) -> list[str]:
    return [c for c in types if c not in target.INTERNAL_COLUMNS]


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
    target.check_columns(schema)
    database, table = _split(spec.old_table)
    print(f"[airflow-sync] diff {spec.diff_key}: creating {spec.old_table} (it did not exist)", flush=True)
    ch.command(f"CREATE DATABASE IF NOT EXISTS {ch_ident(database)}")
    ch.command(target.create_table_sql(schema, database, table))
    return target.column_types(ch, database, table)


def _resolve_mysql(spec: SnapshotDiffSpec, ch, ledger: Ledger, old_types: dict) -> dict:
    """Columns, canonical schema, shards and version when the new snapshot is the MySQL table."""
    with mysql_reader.connect(spec.source) as conn:
        schema = read_table_schema(conn, spec.source_database, spec.source_table)
        table = schema.qualified
        skipped = [c.name for c in schema.columns if c.name not in old_types]
        if spec.compare_columns and set(spec.compare_columns) & set(skipped):
            raise DiffError(f"table {table}: compare_columns {sorted(set(spec.compare_columns) & set(skipped))} "
                            f"are not in the old snapshot {spec.old_table}")
        if skipped:
            print(f"[airflow-sync] diff {spec.diff_key}: column(s) {skipped} of {table} are not in {spec.old_table}; "
                  "not compared", flush=True)
        schema = schema.select([c.name for c in schema.columns if c.name in old_types])
        keys = spec.key_columns or list(schema.primary_key)
        mappings = {m.name: m for m in schema.mappings()}
        floats = [m.name for m in mappings.values() if m.source.data_type in ("float", "double", "real")]
        columns = DiffColumns.resolve(table, list(mappings), keys, spec.compare_columns, spec.ignore_columns,
                                      spec.tolerances, floats)
        weight_col = _copy_split_column(ledger, spec.old_table) if SPLIT_WEIGHT_COLUMN in old_types else None
        plan = plan_table(conn, schema, speed=SpeedLimits(channels=spec.channels),
                          split_column=spec.split_column or weight_col or keys[0], split_factor=spec.split_factor)
        column = schema.column(plan.split_column) if plan.split_column else None
        database, name = _split(spec.old_table)
        if needs_weight(column) and column.name != weight_col:
            print(f"[airflow-sync] diff {spec.diff_key}: {spec.old_table} holds no collation weights of "
                  f"{column.name!r}; one shard, pruned by buckets only", flush=True)
            plan = _one_shard(plan, conn)
            column = None
        weights = width = None
        if needs_weight(column):
            weights = read_weights(conn, column, cut_points(plan))
            width = weight_width(ch, database, name) if weights.space is not None else 0
        predicates = dict(zip((s.id for s in plan.shards), target_predicates(plan, column, weights, None, width or 0)))
        position = position_if_readable(conn, table)
    weight = weight_col is not None
    columns_sql = mysql_reader.select_list(list(mappings.values())) + ", {bucket}"
    if weight:
        columns_sql += f", COALESCE(WEIGHT_STRING({mysql_ident(weight_col)}), '')"
    return {"columns": columns, "schema": mysql_reader.arrow_schema(list(mappings.values())), "texts": mappings,
            "plan": plan, "old_predicates": predicates, "weight": weight, "position": position,
            "mysql_columns_sql": columns_sql,
            "ch_types": {m.name: m.ch_type for m in mappings.values()}}


def _one_shard(plan: Plan, conn) -> Plan:
    one = Plan(plan.database, plan.table, None, None, plan.strategy, 1, 1, (Shard(0, "1=1"),), plan.warnings)
    rows = explain(conn, one, one.shards[0]).get("rows")  # sets the bucket count; corrected by the true count
    return dataclasses.replace(one, shards=(Shard(0, "1=1", (), int(rows or 0)),))


def _resolve_clickhouse(spec: SnapshotDiffSpec, ch, old_types: dict) -> dict:
    """The same when the new snapshot is another ClickHouse table: one shard, pruned by buckets."""
    new_types = target.column_types(ch, *_split(spec.new_table))
    if not new_types:
        raise DiffError(f"the new snapshot {spec.new_table} does not exist on ClickHouse")
    names = [c for c in _user_columns(old_types) if c in new_types]
    keys = spec.key_columns or target.sorting_key(ch, *_split(spec.old_table))
    floats = [c for c in names if "Float" in old_types[c]]
    columns = DiffColumns.resolve(spec.old_table, names, keys, spec.compare_columns, spec.ignore_columns,
                                  spec.tolerances, floats)
    schema = ch.query_arrow(f"SELECT {', '.join(ch_ident(n) for n in names)} FROM "
                            f"{ch_table(*_split(spec.old_table))} LIMIT 0").schema
    rows = int(ch.command(f"SELECT count() FROM {_ch_from(ch, spec.new_table)}"))
    plan = Plan(*_split(spec.new_table), None, None, "balanced", 1, 1, (Shard(0, "1", (), rows),))
    return {"columns": columns, "schema": schema, "texts": {n: _ChColumn(n) for n in names}, "plan": plan,
            "old_predicates": {0: ("1", {})}, "weight": False, "position": None, "mysql_columns_sql": "",
            "ch_types": {n: old_types[n] for n in names}}


def _changes_ddl(spec: SnapshotDiffSpec, columns: DiffColumns, ch_types: dict) -> tuple[str, list[str]]:
    cols = ["diff_key String", "run_id String", "flag LowCardinality(String)", "changed Array(String)"]
    cols += [f"{ch_ident(k)} {ch_types[k]}" for k in columns.keys]
    for c in columns.compared:
        cols += [f"{ch_ident(old_name(c))} {nullable(ch_types[c])}", f"{ch_ident(new_name(c))} {nullable(ch_types[c])}"]
    database, table = _split(spec.changes_table)
    sql = (f"CREATE TABLE {ch_table(database, table)} (\n  " + ",\n  ".join(cols)
           + f"\n) ENGINE = MergeTree ORDER BY (diff_key, flag, {', '.join(ch_ident(k) for k in columns.keys)})")
    return sql, [c.split(" ", 1)[0].strip("`") for c in cols]


def _prepare_changes(ch, spec: SnapshotDiffSpec, columns: DiffColumns, ch_types: dict) -> None:
    """The change-set table, recreated when this diff's columns changed; this diff's rows cleared
    (a rerun writes the same change set, not a second one)."""
    database, table = _split(spec.changes_table)
    sql, names = _changes_ddl(spec, columns, ch_types)
    ch.command(f"CREATE DATABASE IF NOT EXISTS {ch_ident(database)}")
    existing = target.column_types(ch, database, table)
    if existing and list(existing) != names:
        ch.command(f"DROP TABLE {ch_table(database, table)}")
        existing = {}
    if not existing:
        ch.command(sql)
    else:
        ch.command(f"DELETE FROM {ch_table(database, table)} WHERE diff_key = {{k:String}}",
                   parameters={"k": spec.diff_key})


def _apply_version(spec: SnapshotDiffSpec, ch, old_types: dict, position) -> int:
    """Rows an apply writes rank below every change after the diff started reading (the binlog
    position then, as a repair's read) or, without a binlog, above everything the table holds."""
    missing = [c for c in (target.VERSION_COLUMN, target.DELETED_COLUMN) if c not in old_types]
    if missing:
        raise DiffError(f"cannot apply to {spec.old_table}: it has no {missing} column(s); apply writes versioned "
                        "rows and tombstones into a copy made by a full load, a bootstrap or CDC")
    target.check_layout(ch, *_split(spec.old_table))
    if position is not None:
        return position.snapshot_version(repair=True)
    top = ch.command(f"SELECT max({ch_ident(target.VERSION_COLUMN)}) FROM {ch_table(*_split(spec.old_table))}")
    return int(top or 0) + 1


def _samples(ch, spec: SnapshotDiffSpec, run_id: str) -> dict:
    table = ch_table(*_split(spec.changes_table))
    out = {}
    for flag in (CHANGED, NEW, DELETED):
        result = ch.query(f"SELECT * EXCEPT (diff_key, run_id) FROM {table} WHERE diff_key = {{k:String}} AND "
                          f"run_id = {{r:String}} AND flag = {{f:String}} LIMIT {int(spec.sample_rows)}",
                          parameters={"k": spec.diff_key, "r": run_id, "f": flag})
        # JSON-safe for the result file; the report shows them as text
        out[flag] = [{k: (v if k == "changed" or v is None else repr(v) if isinstance(v, (bytes, str)) else str(v))
                      for k, v in zip(result.column_names, row)} for row in result.result_rows]
    return out


def run_snapshot_diff(spec: SnapshotDiffSpec, spark) -> dict:
    started = time.time()
    ch = target.client(spec.target)
    ledger = Ledger(ch, spec.ledger_database)
    ledger.ensure()
    old_types = target.column_types(ch, *_split(spec.old_table))
    if not old_types and spec.on_change == "apply" and spec.source_table:
        old_types = _create_copy(spec, ch)  # a first run seeds the copy: every row is new
    if not old_types:
        raise DiffError(f"the old snapshot {spec.old_table} does not exist on ClickHouse")
    found = _resolve_clickhouse(spec, ch, old_types) if spec.new_table else _resolve_mysql(spec, ch, ledger, old_types)
    version = _apply_version(spec, ch, old_types, found["position"]) if spec.on_change == "apply" else None
    run_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
    _prepare_changes(ch, spec, found["columns"], found["ch_types"])
    final = _ch_from(ch, spec.old_table)
    ctx = _Context(spec, run_id, found["columns"], found["schema"], found["texts"], found["plan"],
                   found["old_predicates"], final, _deleted_filter(ch, spec.old_table), found["weight"], version,
                   found["mysql_columns_sql"])
    ids = [s.id for s in ctx.plan.shards]
    channels = max(1, min(spec.channels, len(ids)))
    queues = [ids[i::channels] for i in range(channels)]
    shards = sorted(spark.sparkContext.parallelize(queues, channels)
                    .mapPartitions(lambda qs: (r for q in qs for r in _diff_channel(ctx, q))).collect(),
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
    }
    ledger.write_diff(result, shards)
    samples = _samples(ch, spec, run_id)
    ch.close()
    return result | {"shard_results": shards, "samples": samples, "seconds": round(time.time() - started, 3)}

"""Target-side DDL and publishing on ClickHouse (clickhouse-connect client)."""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from dataclasses import dataclass

import clickhouse_connect
from clickhouse_connect.driver.exceptions import DatabaseError

from airflow_sync_provider.core.content import shaping
from airflow_sync_provider.core.content.shaping import DELETED_AT_SOURCE, Content
from airflow_sync_provider.core.endpoints import ClickHouseEndpoint
from airflow_sync_provider.core.positions import SCHEME
from airflow_sync_provider.core.source.schema import TableSchema
from airflow_sync_provider.core.sql import ch_ident, ch_string, ch_table
from airflow_sync_provider.core.target import layout as layouts
from airflow_sync_provider.core.target import ttl
from airflow_sync_provider.core.target.derived import derived_columns
from airflow_sync_provider.core.target.layout import MIRROR, Layout, LayoutError, check_same, layout_comment, stored
from airflow_sync_provider.core.target.shards import SPLIT_WEIGHT_COLUMN

VERSION_COLUMN = "_version"
SHARD_COLUMN = "_shard"
DELETED_COLUMN = "_deleted"
# A table without a primary key followed by CDC is a multiset: every row of its copy is a signed
# occurrence (+1 a row that came, -1 one that went), told apart by (_version, _ordinal), so a
# replayed change is the same row again and FINAL counts it once; the table is
# SELECT cols, sum(_sign) … GROUP BY cols (docs/keyless-tables.md)
SIGN_COLUMN, ORDINAL_COLUMN = "_sign", "_ordinal"
# Columns the target tables use for themselves (and ClickHouse's _partition_id, which period
# reconciliation reads): a source column of the same name would collide with them.
INTERNAL_COLUMNS = (VERSION_COLUMN, DELETED_COLUMN, SPLIT_WEIGHT_COLUMN, SHARD_COLUMN, DELETED_AT_SOURCE,
                    SIGN_COLUMN, ORDINAL_COLUMN, "_partition_id")


TABLE_COMMENT = f"airflow_sync version={SCHEME}"  # what a table's _version means (core/positions.py)


class ReservedColumn(ValueError):
    retry_helps = False  # core/failures.py: the message says what to change


class OldLayout(RuntimeError):
    """A target table written by an earlier release (wall-clock versions, no _deleted)."""

    retry_helps = False


def check_layout(ch, database: str, table: str, comment: str | None = None) -> None:
    """Refuse to add rows to a table whose ``_version`` is not in binlog order: an earlier
    release stamped rows with wall-clock nanoseconds, which would out-rank every change.
    ``comment``: the table's, when the caller has read it (:func:`table_facts`)."""
    if comment is None:
        comment = _comment(ch, database, table) if table_exists(ch, database, table) else TABLE_COMMENT
    if TABLE_COMMENT not in comment:
        raise OldLayout(f"table {database}.{table} was written by an earlier airflow-sync release: its _version "
                        "values are wall-clock times that would out-rank every binlog-ordered change, and it has "
                        "no _deleted column. Reload it in full (a full load replaces the table) before repairing, "
                        "period-loading or applying changes to it")


def check_columns(schema: TableSchema) -> None:
    """Refuse source columns named like the target's internal columns, before any work is done."""
    clash = [c.name for c in schema.columns if c.name in INTERNAL_COLUMNS]
    if clash:
        keyed = [c for c in clash if c in schema.primary_key]
        remedy = ("load through a view that renames them (key columns cannot be left out)" if keyed else
                  f"leave them out (exclude_columns={clash!r} / --exclude-column) or load through a view that "
                  "renames them")
        raise ReservedColumn(f"table {schema.qualified}: column(s) {clash} have the names of the target's internal "
                             f"columns {list(INTERNAL_COLUMNS)}; {remedy}")
# Writing the hidden weight column (MATERIALIZED: not in SELECT *, '' when a writer omits it).
WEIGHT_SETTINGS = {"insert_allow_materialized_columns": 1}
# The columns writers write, of system.columns: not those ClickHouse derives itself
# (MATERIALIZED: core/target/derived.py), but the hidden weight column, which writers carry.
WRITTEN = f"(default_kind != 'MATERIALIZED' OR name = {ch_string(SPLIT_WEIGHT_COLUMN)})"


def client(endpoint: ClickHouseEndpoint, **kwargs):
    return clickhouse_connect.get_client(**{**endpoint.client_args(), **kwargs})


_SHARED: dict = {}
_SHARED_LOCK = threading.Lock()


def shared_client(endpoint: ClickHouseEndpoint):
    """This process's client for ``endpoint``, shared by its threads and by later Spark tasks in
    the same Python worker: opening a client costs three queries (version, time zone, every
    setting), ~0.1 s on the chDB stand-in. Without a session, so threads may share it."""
    with _SHARED_LOCK:
        ch = _SHARED.get(endpoint)
        if ch is None:
            ch = _SHARED[endpoint] = client(endpoint, autogenerate_session_id=False)
        return ch


def _columns(schema: TableSchema) -> list[str]:
    return [f"{ch_ident(m.name)} {m.ch_type}" for m in schema.mappings()]


def _weight(weight: bool, hidden: bool) -> list[str]:
    """The split column's collation weight (core/target/shards.py), for tables split on a collated string."""
    if not weight:
        return []
    return [f"{ch_ident(SPLIT_WEIGHT_COLUMN)} String" + (" MATERIALIZED ''" if hidden else "")]


def _order_by(schema: TableSchema) -> str:
    return "(" + ", ".join(ch_ident(c) for c in schema.target_key) + ")" if schema.primary_key else "tuple()"


def create_table_sql(schema: TableSchema, database: str, table: str, layout: Layout = MIRROR,
                     weight: bool = False, if_not_exists: bool = False, marker: str = "") -> str:
    """ReplacingMergeTree keyed by the primary key, versioned in binlog order
    (core/positions.py), with ``_deleted`` tombstones: ``FINAL`` shows each key's newest
    version and hides deleted keys; an older row arriving late never resurrects one. ``layout``
    (core/target/layout.py): the sorting key, partitions, TTL, settings and engine the user chose
    (a period load's partitions too); the comment records it with the source key, and the
    schema's content settings (core/content/) with a fingerprint of its salt. A copy that keeps
    deletes has ``_deleted_at_source``: when the source deleted the row (0 while it lives).

    A table without a primary key gets a plain MergeTree: ReplacingMergeTree with an empty
    sorting key would collapse every row into one. ``weight``: the table is loaded split on a
    collated string and keeps each row's weight, hidden. The layout's derived columns (JSON, typed
    geo: core/target/derived.py) follow the copy's columns, computed by ClickHouse.
    """
    names = [m.name for m in schema.mappings()]
    cols = _table_columns(schema, layout, f"{database}.{table}") + _weight(weight, hidden=True)
    if schema.primary_key:
        nullable = tuple(m.name for m in schema.mappings() if m.ch_type.startswith("Nullable("))
        engine = layout.engine_sql(VERSION_COLUMN, DELETED_COLUMN) + layout.clauses(schema.target_key, names, nullable)
    else:
        engine = "MergeTree" + (f" PARTITION BY {layout.partition_by}" if layout.partition_by else "") + \
            " ORDER BY tuple()"
    return _create(schema, ch_table(database, table), cols, engine, layout, marker, if_not_exists)


def create_multiset_sql(schema: TableSchema, database: str, table: str, layout: Layout = MIRROR,
                        marker: str = "") -> str:
    """A table without a primary key followed by CDC: a ReplacingMergeTree of signed occurrences
    (:data:`SIGN_COLUMN`), one row per change told apart by (_version, _ordinal), so a replayed
    change is the same row again (docs/keyless-tables.md). ``marker``: a working table's."""
    cols = _table_columns(schema, layout, f"{database}.{table}") + [
        f"{ch_ident(ORDINAL_COLUMN)} UInt64 DEFAULT 0", f"{ch_ident(SIGN_COLUMN)} Int8 DEFAULT 1"]
    engine = (f"ReplacingMergeTree({ch_ident(VERSION_COLUMN)})"
              + (f" PARTITION BY {layout.partition_by}" if layout.partition_by else "")
              + f" ORDER BY ({ch_ident(VERSION_COLUMN)}, {ch_ident(ORDINAL_COLUMN)})")
    return _create(schema, ch_table(database, table), cols, engine, layout, marker, bool(marker))


def _table_columns(schema: TableSchema, layout: Layout, where: str) -> list[str]:
    """A copy's columns (the layout checked against them): the source's as copied, the derived
    ones, the version and tombstone, and when the source's deletes are kept when each was."""
    layout.check(where, schema.target_key, [m.name for m in schema.mappings()])
    ttl.check_columns(ttl.expiries(layout.ttl, where.split(".", 1)[1]), schema.mappings(), where)
    return (_columns(schema) + [d.ddl() for d in derived_columns(layout, schema.mappings(), where)]
            + [f"{ch_ident(VERSION_COLUMN)} UInt64 DEFAULT 0", f"{ch_ident(DELETED_COLUMN)} UInt8 DEFAULT 0"]
            + ([f"{ch_ident(DELETED_AT_SOURCE)} DateTime('UTC') DEFAULT 0"] if schema.content.keep_deletes else []))


def _create(schema: TableSchema, name: str, cols: list[str], engine: str, layout: Layout, marker: str,
            if_not_exists: bool) -> str:
    """The CREATE TABLE of ``name`` (quoted); its comment records what the copy is (its version
    scheme, layout, content settings) and, for a working table, ``marker``."""
    comment = (TABLE_COMMENT + layout_comment(layout, schema.target_key)
               + shaping.content_comment(schema.content, schema.salt) + marker)
    return (f"CREATE TABLE {'IF NOT EXISTS ' if if_not_exists else ''}{name} (\n  "
            + ",\n  ".join(cols) + f"\n) ENGINE = {engine} COMMENT {ch_string(comment)}")


# A direct working table is not merged while it is filled: merging while rows still arrive
# rewrites the same rows level after level (a source group's members' overlapping keys make each
# of those merges a true k-way merge), and a stand-in target merges on the readers' cores. Its
# merges wait until this many parts are waiting (far below parts_to_delay_insert, 150 before
# ClickHouse 23.6), and the setting is reset when it is published, so the copy then merges as usual.
DEFER_MERGES = {"min_parts_to_merge_at_once": 64}
UNKNOWN_SETTING, ACCESS_DENIED = 115, 497  # ClickHouse error codes


def create_working_sql(schema: TableSchema, database: str, table: str, weight: bool, direct: bool,
                       layout: Layout = MIRROR) -> str:
    """A load's working table. ``direct`` (a full reload): already the final table's layout, so
    publishing is a swap and no copy; a re-read shard first deletes what its earlier attempts
    wrote (by the shard's target predicate, core/target/shards.py). Otherwise (period loads,
    repairs, split columns ClickHouse cannot compare) the parts layout."""
    if direct:  # the comment names the load's working table: publish_working sees a swap that happened
        return create_table_sql(schema, database, table, layout.holding_ttl(), weight=weight, if_not_exists=True,
                                marker=working_marker(table))
    return create_parts_sql(schema, database, table, weight)


def create_working(ch, schema: TableSchema, database: str, table: str, weight: bool, direct: bool,
                   layout: Layout = MIRROR) -> None:
    """:func:`create_working_sql`; a direct one's merges deferred (DEFER_MERGES) by the same
    privilege that resets them at publish (ALTER MODIFY SETTING): a server that does not know the
    setting (an older ClickHouse) or a user without the privilege gets the table as it is."""
    ch.command(create_working_sql(schema, database, table, weight, direct, layout))
    if not direct:
        return
    try:
        ch.command(f"ALTER TABLE {ch_table(database, table)} MODIFY SETTING "
                   + ", ".join(f"{name} = {int(value)}" for name, value in DEFER_MERGES.items()))
    except DatabaseError as exc:
        if getattr(exc, "code", None) not in (UNKNOWN_SETTING, ACCESS_DENIED):
            raise


def _merges_resumed(ch, database: str, table: str) -> None:
    """A working table's deferred merges back to the server's default (before it is swapped in)."""
    engine = ch.query("SELECT engine_full FROM system.tables WHERE database = {d:String} AND name = {t:String}",
                      parameters={"d": database, "t": table}).result_rows
    for name in DEFER_MERGES:
        if engine and name in engine[0][0]:
            ch.command(f"ALTER TABLE {ch_table(database, table)} RESET SETTING {name}")


def _ttl_applied(ch, database: str, table: str) -> None:
    """A counted working table's TTL (Layout.holding_ttl) into its DDL, before it is swapped in:
    a change of metadata only; merges delete the expired rows from then on."""
    ttl = stored(_comment(ch, database, table))[0].ttl
    if ttl:
        ch.command(f"ALTER TABLE {ch_table(database, table)} MODIFY TTL {ttl}",
                   settings={"materialize_ttl_after_modify": 0})


def is_parts_layout(ch, database: str, table: str) -> bool:
    return SHARD_COLUMN in column_types(ch, database, table)


def create_parts_sql(schema: TableSchema, database: str, table: str, weight: bool = False) -> str:
    """A load's parts table: one partition per shard, so re-reading a shard first drops
    exactly what its earlier attempts wrote (no duplicates, no mutations)."""
    cols = (_columns(schema) + _weight(weight, hidden=False)
            + [f"{ch_ident(VERSION_COLUMN)} UInt64", f"{ch_ident(SHARD_COLUMN)} UInt32"])
    return (f"CREATE TABLE IF NOT EXISTS {ch_table(database, table)} (\n  " + ",\n  ".join(cols)
            + f"\n) ENGINE = MergeTree PARTITION BY {ch_ident(SHARD_COLUMN)} ORDER BY {_order_by(schema)}")


def parts_table_name(load_key: str, generation: int) -> str:
    return "parts_" + hashlib.sha1(f"{load_key}\0{generation}".encode()).hexdigest()[:16]


# ClickHouse keeps a table's metadata in a file named after it (bytes outside [A-Za-z0-9_]
# escaped as %XX), and refuses names whose file would pass the file system's 255 bytes.
_NAME_FILE_BYTES = 64


def _file_bytes(name: str) -> int:
    return sum(1 if (c.isascii() and (c.isalnum() or c == "_")) else 3 * len(c.encode()) for c in name)


def drop_working_tables(ch, parts_db: str, parts: str, target_table: str) -> None:
    """A load's working tables: its parts table and its private stage and shadow tables."""
    database, table = target_table.split(".", 1)
    ch.command(f"DROP TABLE IF EXISTS {ch_table(parts_db, parts)}")
    for role in ("stage", "shadow"):
        ch.command(f"DROP TABLE IF EXISTS {ch_table(database, private_name(table, role, parts))}")


def private_name(table: str, role: str, owner: str) -> str:
    """A working table of ``table`` (``role``: stage, shadow) that only ``owner`` uses: its load's
    parts table, so one per load key and generation. Overlapping loads into one table (backfill
    runs, retries) then never drop or fill each other's, and a resumed load finds, and first
    drops, the one it left behind when it crashed. The name starts with ``table`` (cut short
    when long) so a person sees whose it is."""
    prefix = table
    while _file_bytes(prefix) > _NAME_FILE_BYTES:
        prefix = prefix[:-1]
    return f"{prefix}__{role}_{hashlib.sha1(owner.encode()).hexdigest()[:12]}"


def drop_shard(ch, database: str, parts: str, shard_id: int) -> None:
    ch.command(f"ALTER TABLE {ch_table(database, parts)} DROP PARTITION ID {ch_string(str(shard_id))}")


def table_exists(ch, database: str, table: str) -> bool:
    return bool(ch.command("EXISTS TABLE " + ch_table(database, table)))


def column_types(ch, database: str, table: str) -> dict[str, str]:
    """The table's columns and their ClickHouse types, in order: those writers write (:data:`WRITTEN`),
    not those ClickHouse derives from them."""
    return dict(ch.query("SELECT name, type FROM system.columns WHERE database = {d:String} AND table = {t:String}"
                         f" AND {WRITTEN} ORDER BY position", parameters={"d": database, "t": table}).result_rows)


def sorting_key(ch, database: str, table: str) -> list[str]:
    """The ORDER BY columns (the copy's key: the MySQL primary key when it was loaded)."""
    key = ch.command("SELECT sorting_key FROM system.tables WHERE database = {d:String} AND name = {t:String}",
                     parameters={"d": database, "t": table})
    return _key_columns(key)


def _source_key(comment: str, sorting: list) -> list:
    """The source key a copy collapses rows by: recorded in its comment when it has a layout of its
    own (core/target/layout.py), else its sorting key (the key, as a mirror is ordered)."""
    key = stored(comment)[1]
    if key is None and sorting[:1] == [VERSION_COLUMN]:  # a multiset's occurrences: no source key
        return []
    return key if key is not None else sorting


def copy_key(ch, database: str, table: str) -> list[str]:
    """:func:`_source_key` of the table."""
    return _source_key(_comment(ch, database, table), sorting_key(ch, database, table))


def copy_layout(ch, database: str, table: str) -> Layout:
    return stored(_comment(ch, database, table))[0]


def resolve_layout(ch, database: str, table: str, requested: Layout) -> Layout:
    """The layout a job writes ``table`` under: the one it asks for, which an existing copy must
    have (else refused, naming both); none asked for: the copy's own."""
    if not table_exists(ch, database, table):
        return requested
    comment = _comment(ch, database, table)
    if not requested:
        return stored(comment)[0]
    check_same(f"{database}.{table}", requested, comment)
    return requested


def copy_content(ch, database: str, table: str) -> Content:
    """What an existing copy holds (core/content/shaping.py; the mirror's for a copy without settings)."""
    return shaping.stored(_comment(ch, database, table))[0]


def kept_rows(ch, database: str, table: str) -> int:
    """The rows a copy keeps after the source deleted them (core/content/, on_delete="keep")."""
    return int(ch.command(f"SELECT count() FROM {ch_table(database, table)} FINAL WHERE {ch_ident(DELETED_COLUMN)} = 0 "
                          f"AND {ch_ident(DELETED_AT_SOURCE)} > 0"))


def relay_comment(ch, database: str, table: str, layout: Layout) -> None:
    """Record ``layout`` in the copy's comment instead of the one it records (a derived column
    dropped under a schema change: spark/cdc_ddl.py)."""
    comment = layouts.relaid_comment(_comment(ch, database, table), layout)
    ch.command(f"ALTER TABLE {ch_table(database, table)} MODIFY COMMENT {ch_string(comment)}")


def check_content(ch, schema: TableSchema, database: str, table: str, comment: str | None = None) -> None:
    """Refuse writing ``schema``'s rows into an existing copy that holds other content (other
    transforms, filter, delete rule or salt): rows of two shapes never compare equal."""
    if comment is None:
        if not table_exists(ch, database, table):
            return
        comment = _comment(ch, database, table)
    shaping.check_same(f"{database}.{table}", schema.content, schema.salt, comment)


def _key_columns(key) -> list[str]:
    return [k.strip().strip("()`") for k in str(key or "").split(",") if k.strip().strip("()")]


@dataclass(frozen=True)
class TableFacts:
    comment: str
    sorting_key: list
    columns: dict  # name → type, in order

    @property
    def key(self) -> list:
        """The source key the copy collapses rows by (:func:`_source_key`)."""
        return _source_key(self.comment, self.sorting_key)

    @property
    def layout(self) -> Layout:
        return stored(self.comment)[0]

    @property
    def content(self) -> Content:
        return shaping.stored(self.comment)[0]


def table_facts(ch, tables: list[tuple[str, str]]) -> dict[tuple[str, str], TableFacts]:
    """Comment, sorting key and columns of each of ``tables`` (database, table) that exists, in
    two queries however many there are (a run of a pipeline of many tables looks at all)."""
    wanted = set(tables)
    if not wanted:
        return {}
    params = {"d": sorted({d for d, _ in wanted}), "t": sorted({t for _, t in wanted})}
    found = {(d, t): (comment, key) for d, t, comment, key in ch.query(
        "SELECT database, name, comment, sorting_key FROM system.tables WHERE has({d:Array(String)}, database) "
        "AND has({t:Array(String)}, name)", parameters=params).result_rows if (d, t) in wanted}
    columns: dict = {}
    for d, t, name, kind in ch.query(
            "SELECT database, table, name, type FROM system.columns WHERE has({d:Array(String)}, database) "
            f"AND has({{t:Array(String)}}, table) AND {WRITTEN} ORDER BY database, table, position",
            parameters=params).result_rows:
        if (d, t) in found:
            columns.setdefault((d, t), {})[name] = kind
    return {pair: TableFacts(comment or "", _key_columns(key), columns.get(pair, {}))
            for pair, (comment, key) in found.items()}


def copy_parts(ch, schema: TableSchema, parts: str, parts_db: str, database: str, table: str,
               weight: bool = False) -> None:
    """Server-side copy of the loaded rows (without the shard column) into ``table``."""
    names = [m.name for m in schema.mappings()] + [VERSION_COLUMN] + ([SPLIT_WEIGHT_COLUMN] if weight else [])
    names = ", ".join(ch_ident(n) for n in names)
    ch.command(f"INSERT INTO {ch_table(database, table)} ({names}) SELECT {names} FROM {ch_table(parts_db, parts)}",
               settings=WEIGHT_SETTINGS if weight else None)


@dataclass(frozen=True)
class Loaded:
    """A load's rows in its parts-layout working table ``parts_db.parts``, to publish into
    ``database.table``: their schema (as copied), and whether they carry the split column's weight."""

    schema: TableSchema
    parts_db: str
    parts: str
    database: str
    table: str
    weight: bool = False
    layout: Layout = MIRROR  # the copy's (core/target/layout.py)

    def copy_into(self, ch, table: str) -> None:
        """Every loaded row into ``database.table`` (the copy or one of its own shadow tables)."""
        copy_parts(ch, self.schema, self.parts, self.parts_db, self.database, table, self.weight)


def publish_full(ch, loaded: Loaded) -> int:
    """Copy into a shadow table (this load's own) and swap it in: readers see the old or the new
    table, never half."""
    database, table = loaded.database, loaded.table
    shadow = private_name(table, "shadow", loaded.parts)
    ch.command(f"CREATE DATABASE IF NOT EXISTS {ch_ident(database)}")
    ch.command(f"DROP TABLE IF EXISTS {ch_table(database, shadow)}")
    ch.command(create_table_sql(loaded.schema, database, shadow, loaded.layout.holding_ttl(), weight=loaded.weight))
    loaded.copy_into(ch, shadow)
    return _swap_in(ch, database, shadow, database, table)


def _loaded_rows(ch, database: str, table: str, kept: bool | None = None) -> int:
    """A fresh copy's rows as its load wrote them: not the kept rows carried over (:func:`_carry_kept`).
    ``kept``: does the copy keep deletes (None: look)."""
    if kept is None:
        kept = DELETED_AT_SOURCE in column_types(ch, database, table)
    return int(ch.command(f"SELECT count() FROM {ch_table(database, table)}"
                          + (f" WHERE {ch_ident(DELETED_AT_SOURCE)} = 0" if kept else "")))


def _swap_in(ch, source_db: str, source: str, database: str, table: str) -> int:
    """``source`` becomes ``table`` atomically (the old table is dropped); returns its rows."""
    names = list(column_types(ch, source_db, source))
    kept = DELETED_AT_SOURCE in names
    if kept:  # a copy that keeps deletes: nothing it kept is lost to the swap
        _carry_kept(ch, names, source_db, source, database, table)
    rows = _loaded_rows(ch, source_db, source, kept)
    _ttl_applied(ch, source_db, source)
    if table_exists(ch, database, table):
        ch.command(f"EXCHANGE TABLES {ch_table(source_db, source)} AND {ch_table(database, table)}")
        ch.command(f"DROP TABLE {ch_table(source_db, source)}")
    else:
        ch.command(f"RENAME TABLE {ch_table(source_db, source)} TO {ch_table(database, table)}")
    return rows


def working_marker(working: str) -> str:
    return f" load={working}"


def _comment(ch, database: str, table: str) -> str:
    rows = ch.query("SELECT comment FROM system.tables WHERE database = {d:String} AND name = {t:String}",
                    parameters={"d": database, "t": table}).result_rows
    return rows[0][0] or "" if rows else ""


def swapped_in(ch, working_db: str, working: str, database: str, table: str) -> bool:
    """Has :func:`publish_working` swapped ``working`` in as ``table`` already?"""
    return _comment(ch, database, table).endswith(working_marker(working))


def publish_working(ch, working_db: str, working: str, database: str, table: str) -> int:
    """Swap a direct working table (final layout) in as ``table``: readers see the old or the new
    table, never half; nothing is copied. Idempotent: after a crash between the swap and the
    drop, the working table holds the *old* copy, and is dropped rather than swapped back."""
    ch.command(f"CREATE DATABASE IF NOT EXISTS {ch_ident(database)}")
    if swapped_in(ch, working_db, working, database, table):
        ch.command(f"DROP TABLE IF EXISTS {ch_table(working_db, working)}")
        return _loaded_rows(ch, database, table)
    _merges_resumed(ch, working_db, working)
    return _swap_in(ch, working_db, working, database, table)


def publish_partitions(ch, loaded: Loaded, partition_by: str, partitions: list[str]) -> int:
    """Replace exactly ``partitions`` of ``table`` with the loaded rows (each partition atomically).

    Loaded rows outside those partitions mean the period filter and the partitions disagree:
    nothing is published then. A partition with no loaded rows is dropped (the period is empty).
    The stage table is this load's own, so period loads into one table may publish at once.
    """
    schema, database, table, weight = loaded.schema, loaded.database, loaded.table, loaded.weight
    if loaded.layout.partition_by and loaded.layout.partition_by != partition_by:
        raise LayoutError(f"table {database}.{table}: the period load's partition_by {partition_by!r} is not the "
                          f"layout's {loaded.layout.partition_by!r}: give one")
    layout = dataclasses.replace(loaded.layout, partition_by=partition_by)
    stage = private_name(table, "stage", loaded.parts)
    ch.command(f"CREATE DATABASE IF NOT EXISTS {ch_ident(database)}")
    # IF NOT EXISTS: the first loads of a new table may be publishing side by side
    ch.command(create_table_sql(schema, database, table, layout, weight, if_not_exists=True))
    comment = _comment(ch, database, table)
    check_layout(ch, database, table, comment)
    check_same(f"{database}.{table}", layout, comment)  # an existing copy laid out otherwise is refused
    if weight:  # REPLACE PARTITION needs the same columns on both sides
        ch.command(f"ALTER TABLE {ch_table(database, table)} ADD COLUMN IF NOT EXISTS {_weight(True, True)[0]}")
    ch.command(f"DROP TABLE IF EXISTS {ch_table(database, stage)}")
    if stored(comment)[1] is None:  # made before layouts: its sorting key is the key alone
        ch.command(f"CREATE TABLE {ch_table(database, stage)} AS {ch_table(database, table)}")
    else:
        ch.command(create_table_sql(schema, database, stage, layout.holding_ttl(), weight))  # counted as loaded
    loaded.copy_into(ch, stage)
    present = {r[0]: r[1] for r in ch.query(
        f"SELECT _partition_id, count() FROM {ch_table(database, stage)} GROUP BY _partition_id").result_rows}
    outside = sorted(set(present) - set(partitions))
    if outside:
        ch.command(f"DROP TABLE {ch_table(database, stage)}")
        raise ValueError(f"table {database}.{table}: the loaded rows fall in partitions {outside} (by {partition_by}) "
                         f"outside replace_partitions {partitions}; the where filter and the partitions disagree")
    for partition in partitions:
        pid = ch_string(partition)
        if partition in present:
            ch.command(f"ALTER TABLE {ch_table(database, table)} REPLACE PARTITION ID {pid}"
                       f" FROM {ch_table(database, stage)}")
        else:
            ch.command(f"ALTER TABLE {ch_table(database, table)} DROP PARTITION ID {pid}")
    ch.command(f"DROP TABLE {ch_table(database, stage)}")
    return sum(present.values())


def mark_kept(ch, database: str, table: str, names: list[str], where: str, params: dict,
               source: tuple[str, str] | None = None) -> None:
    """Mark the live rows of ``source`` (default: the table itself; ``FINAL``) that ``where``
    selects as deleted at the source now, into ``table``: at their own version, inserted after
    the row they mark (of two equal versions ReplacingMergeTree keeps the last inserted)."""
    columns = [c for c in names if c not in (VERSION_COLUMN, DELETED_COLUMN, DELETED_AT_SOURCE)]
    listed = ", ".join(ch_ident(c) for c in columns)
    mark = ch_ident(DELETED_AT_SOURCE)
    ch.command(f"INSERT INTO {ch_table(database, table)} ({listed}, {ch_ident(VERSION_COLUMN)}, "
               f"{ch_ident(DELETED_COLUMN)}, {mark}) SELECT {listed}, {ch_ident(VERSION_COLUMN)}, 0, "
               f"if({mark} = 0, now(), {mark}) FROM {ch_table(*(source or (database, table)))} FINAL "
               f"WHERE {where} AND {ch_ident(DELETED_COLUMN)} = 0"
               + ("" if source else f" AND {mark} = 0"), parameters=params, settings=WEIGHT_SETTINGS)


def _carry_kept(ch, names: list[str], new_db: str, new: str, database: str, table: str) -> None:
    """Before a fresh table of a copy that keeps deletes replaces it: the rows of the old copy
    whose key the new one lacks — kept ones as they are, live ones marked deleted at the source
    now (the source no longer has them). A key the new table holds in any form is newer there.
    Run again after a crash, it finds those keys in the new table and copies nothing twice.
    ``names``: the new table's columns."""
    key = copy_key(ch, new_db, new)
    if not key or not table_exists(ch, database, table):
        return
    old = set(column_types(ch, database, table))
    if DELETED_AT_SOURCE not in old or not set(names) <= old | {SPLIT_WEIGHT_COLUMN}:
        return  # not a copy that kept deletes (it had none to keep), or of another shape: reloaded afresh
    keys = "(" + ", ".join(ch_ident(k) for k in key) + ")"
    mark_kept(ch, new_db, new, [n for n in names if n != SPLIT_WEIGHT_COLUMN],
               f"{keys} NOT IN (SELECT {keys} FROM {ch_table(new_db, new)})", {}, source=(database, table))

"""A table's slices as the pipeline's verification compares them (spark/cdc_verify.py schedules
the looks): the slices planned on the table (:func:`plan_check`), a consistent snapshot of the
source at S reused from look to look (:class:`Snapshot`), the copy's count and checksum of a
slice at S with the keys changed since set aside (:func:`copy_at`), and a slice's repair from the
snapshot (:func:`repair`; a multiset's by its difference, core/clickhouse/multisets.py).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

import pyarrow as pa

from airflow_sync_provider.core.cdc.tables import PipelineTable
from airflow_sync_provider.core.clickhouse import multisets, repairs
from airflow_sync_provider.core.clickhouse.client import shared_client
from airflow_sync_provider.core.clickhouse.columns import DELETED_COLUMN, SIGN_COLUMN, VERSION_COLUMN, WEIGHT_SETTINGS
from airflow_sync_provider.core.clickhouse.ddl import create_working, private_name
from airflow_sync_provider.core.clickhouse.described import column_types, copy_layout
from airflow_sync_provider.core.clickhouse.history import HistoryTable, Stamp
from airflow_sync_provider.core.clickhouse.history_snapshots import Scope, write_published
from airflow_sync_provider.core.clickhouse.inserts import ArrowInserts
from airflow_sync_provider.core.clickhouse.publishing import copy_parts
from airflow_sync_provider.core.clickhouse.shards import shard_predicates
from airflow_sync_provider.core.clickhouse.ttl import Window
from airflow_sync_provider.core.content.shaping import DELETED_AT_SOURCE
from airflow_sync_provider.core.jobspec import CdcApplySpec, copied_schema
from airflow_sync_provider.core.positions import BinlogPosition, TransientBinlogError, snapshot_position
from airflow_sync_provider.core.source import reader as mysql_reader
from airflow_sync_provider.core.source.planning import (
    Plan,
    Sharding,
    SpeedLimits,
    choose_split_column,
    plan_table,
    whole_table,
)
from airflow_sync_provider.core.source.schema import TableNotFound, TableSchema, table_rows
from airflow_sync_provider.core.source.weights import SPLIT_WEIGHT_COLUMN, NotComparable, needs_weight
from airflow_sync_provider.core.sql import ch_ident, ch_table, mysql_ident
from airflow_sync_provider.core.verify.history import latest_at
from airflow_sync_provider.core.verify.reconcile import mysql_checksum_sql
from airflow_sync_provider.core.verify.rowhash import ch_row_hash

SHARD_ROWS = 20_000  # rows per slice: what a mismatch costs to re-read
MAX_SHARDS = 256
MAX_SET_ASIDE = 2_000  # a slice with more keys changed since S is looked at again later


def copy_columns(schema: TableSchema) -> dict:
    """What the copy's columns must be: name → ClickHouse type."""
    return {m.name: m.ch_type for m in schema.mappings()}


@dataclass
class TableCheck:
    """A table's slices for one pass (its plan and the copy's predicates of each slice)."""

    name: str
    table: PipelineTable
    schema: TableSchema
    plan: Plan
    predicates: list
    weight: object  # the copy's collated split column (rows carry its weight), or None
    place: tuple = ()  # the columns beyond the key the copy's layout places rows by (core/clickhouse/layout.py)
    ttl: str = ""  # the copy's TTL (core/clickhouse/ttl.py)
    # the table's re-copies when planned: one since (a reshape) may have laid the copy out anew
    recopies: int = 0
    window: Window = Window()  # the rows a look compares: those no TTL merge can have expired at its snapshot
    # a table without a key, its copy a multiset of signed occurrences: looked at whole, as of S
    # (every row below S's version, signs added), and repaired by the difference
    multiset: bool = False

    @property
    def slices(self) -> list[int]:
        return [s.id for s in self.plan.shards]

    def predicate(self, slice_id: int) -> tuple[str, dict]:
        return self.predicates[self.slices.index(slice_id)]


def plan_check(pconn, ch, table: PipelineTable, schema: TableSchema) -> TableCheck:
    """Slices of about SHARD_ROWS on the split column the copy can compare (a collated one only
    when the copy carries its weights); one slice when there is none."""
    database, name = table.target_database, table.writes_to
    columns = column_types(ch, database, name)
    multiset = SIGN_COLUMN in columns
    weighted = SPLIT_WEIGHT_COLUMN in columns and table.split_column
    split = None if multiset else table.split_column if weighted else choose_split_column(schema)[0]
    if split and needs_weight(schema.column(split)) and not weighted:
        split = None
    rows = table_rows(pconn, table.source_database, table.source_table)
    plan = None
    if split:
        try:
            plan = plan_table(pconn, schema, Sharding(speed=SpeedLimits(channels=1), split_column=split,
                              split_factor=max(1, min(MAX_SHARDS, math.ceil(rows / SHARD_ROWS))), estimate=False))
            predicates = shard_predicates(pconn, ch, plan, schema, (database, name))
        except NotComparable:
            plan = None
    if plan is None:  # one slice (a merged copy's member: its rows alone; a filtered copy's: the filter's)
        plan = whole_table(pconn, schema)
        predicates = shard_predicates(pconn, ch, plan, schema, (database, name))
    weight = schema.column(table.split_column) if weighted else None
    layout = copy_layout(ch, database, name)
    place = layout.place_columns([c.name for c in schema.columns])
    return TableCheck(table.name, table, schema, plan, predicates, weight,
                      tuple(c for c in place if c not in schema.primary_key), layout.ttl, table.recopies,
                      multiset=multiset)


class Snapshot:
    """A consistent snapshot of the source at S on a connection of its own (``sconn``), with a
    second connection for definitions (``pconn``). Reused from look to look: :meth:`open` starts
    a new one."""

    def __init__(self, spec: CdcApplySpec, epoch: int = 0):
        self.spec, self.position, self.began, self.epoch = spec, None, 0.0, epoch
        self.pconn = mysql_reader.connect(spec.source, spec.salt)
        self.sconn = mysql_reader.stream_connect(spec.source, spec.salt)

    def open(self, tables: list[PipelineTable]) -> list[TableSchema | None]:
        """Start a snapshot at S; the tables' definitions there (None: gone)."""
        for _ in range(10):  # the definitions read on both sides of S are those at S
            before = [self._schema(t) for t in tables]
            self.sconn.rollback()
            self.began = time.time()
            self.position = snapshot_position(self.sconn, epoch=self.epoch)
            if [self._schema(t) for t in tables] == before:
                return before
        raise TransientBinlogError(f"pipeline {self.spec.pipeline!r}: table definitions kept changing while a "
                                   "verification began; a retry may find them settled")

    def _schema(self, table: PipelineTable) -> TableSchema | None:
        try:
            # it reads a copy with a history (its repair writes it)
            return copied_schema(self.pconn, table.copy_spec(), self.spec.salt, writer="cdc")
        except TableNotFound:
            return None

    def checksum(self, check: TableCheck, slice_id: int, set_aside: list[tuple]) -> tuple[int, int]:
        """The slice's count and checksum in the snapshot, without the keys ``set_aside``."""
        shard = next(s for s in check.plan.shards if s.id == slice_id)
        where, params = shard.where, list(shard.params)
        if check.window:
            window, more = check.window.mysql_sql(check.schema.mappings())
            where, params = f"({where}) AND {window}", params + list(more)
        if set_aside:
            key = check.schema.primary_key
            one = "(" + ", ".join(["%s"] * len(key)) + ")"
            where = (f"({where}) AND ({', '.join(mysql_ident(k) for k in key)}) NOT IN "
                     f"({', '.join([one] * len(set_aside))})")
            params += [v for k in set_aside for v in k]
        with self.sconn.cursor() as cur:
            cur.execute(mysql_checksum_sql(check.schema, check.plan) + where, params)
            count, total = cur.fetchone()
        return int(count), int(total)

    def rows(self, check: TableCheck, slice_id: int):
        """The slice's rows in the snapshot, as Arrow batches (with the weight the copy keeps)."""
        plan = dataclasses.replace(check.plan, shards=tuple(s for s in check.plan.shards if s.id == slice_id))
        mappings = check.schema.mappings()
        columns_sql = mysql_reader.select_list(mappings, check.weight)
        return mysql_reader.read_shard(self.sconn, mysql_reader.ShardRead(plan, mappings, columns_sql, 65536,
                                                                          check.weight is not None), plan.shards[0])

    def close(self):
        for conn in (self.pconn, self.sconn):
            try:
                conn.close()
            except Exception:
                pass


def copy_at(ch, check: TableCheck, slice_id: int, position: BinlogPosition) -> tuple[tuple[int, int], list[tuple]]:
    """The copy's count and checksum of the slice at ``position`` (the copy must have applied
    everything before it), and the keys set aside: those changed at or after it. One read, of
    every version (``FINAL`` would hide a key deleted after ``position``: it was live there)."""
    where, params = check.predicate(slice_id)
    version, deleted = ch_ident(VERSION_COLUMN), ch_ident(DELETED_COLUMN)
    if check.multiset:  # the multiset as of S: every occurrence below it, signs added (nothing set aside)
        sign, at = ch_ident(SIGN_COLUMN), int(position.version())
        row = ch.query(f"SELECT sum({sign}), sum(toInt128({sign}) * toInt128({ch_row_hash(check.schema.mappings())})) "
                       f"FROM {ch_table(check.table.target_database, check.table.writes_to)} FINAL "
                       f"WHERE {version} < {at} AND {where}", parameters=params).result_rows[0]
        return (int(row[0] or 0), int(row[1] or 0)), []
    if check.schema.content.keep_deletes:  # a row kept after its delete (core/content/) is not the source's
        deleted = f"if({ch_ident(DELETED_AT_SOURCE)} > 0, toUInt8(1), {deleted})"
    if check.window:  # a key whose newest version is outside the TTL window is not compared
        deleted = f"if({check.window.ch_sql()}, {deleted}, toUInt8(1))"
    key = ", ".join(ch_ident(k) for k in check.schema.primary_key)
    at = int(position.version())
    k, v, d, h = (f"airflow_sync_{n}" for n in ("key", "version", "deleted", "hash"))  # no column's name
    # each place of a key on its own (its layout's columns beyond the key: TableCheck.place), then
    # per key: live where exactly one place is, so a row left live under an old place is a mismatch
    place, inner = "".join(f", {ch_ident(c)}" for c in check.place), ("_p" if check.place else "")
    places = (f"SELECT tuple({key}) AS {k}, max({version}) AS {v}{inner}, argMax({deleted}, {version}) AS {d}{inner}, "
              f"argMax(toUInt128({ch_row_hash(check.schema.mappings())}), {version}) AS {h}{inner} "
              f"FROM {ch_table(check.table.target_database, check.table.writes_to)} WHERE {where} "
              f"GROUP BY {k}{place}")
    if check.place:
        places = (f"SELECT {k}, max({v}_p) AS {v}, toUInt8(sum(1 - {d}_p) != 1) AS {d}, "
                  f"sumIf({h}_p, {d}_p = 0) AS {h} FROM ({places}) GROUP BY {k}")
    row = ch.query(f"SELECT countIf({d} = 0 AND {v} < {at}), sumIf({h}, {d} = 0 AND {v} < {at}), "
                   f"groupArrayIf({MAX_SET_ASIDE + 1})({k}, {v} >= {at}) FROM ({places})",
                   parameters=params).result_rows[0]
    return (int(row[0]), int(row[1])), [tuple(k) for k in row[2]]


def history_look(ch, history: HistoryTable, check: TableCheck, slice_id: int, position: BinlogPosition,
                 set_aside: list[tuple]) -> tuple:
    """The history's side of a look (core/verify/history.latest_at): its newest versions in the
    slice at ``position`` (rows, checksum; the copy's keys ``set_aside`` left out), and its keys
    there with two different rows at one version, unanswered."""
    where, params = check.predicate(slice_id)
    if check.window:  # as the copy's: only the rows no TTL merge can have expired
        where = f"({where}) AND {check.window.ch_sql()}"
    return latest_at(ch, history, where, params, int(position.version()), set_aside)


def repair(spec: CdcApplySpec, ch, snapshot: Snapshot, check: TableCheck, slice_id: int) -> int:
    """Rewrite a slice of the copy from the snapshot: the source's rows at S's repair version, and
    tombstones of that version for the copy's rows the source no longer has (rows written after
    S rank above it and are left alone). Returns the rows written. A copy that keeps a history:
    the rows are read into a table beside it first, its history hears of the rows that differ
    (``repair`` events, core/clickhouse/history_snapshots.py), then the copy takes them."""
    database, table = check.table.target_database, check.table.writes_to
    version = snapshot.position.snapshot_version(repair=True)
    names = [m.name for m in check.schema.mappings()] + ([SPLIT_WEIGHT_COLUMN] if check.weight else [])
    if check.multiset:
        return _repair_multiset(spec, ch, snapshot, check, slice_id)
    history, into = HistoryTable.of(ch, check.schema, database, table), (database, table)
    if history is not None:
        into = (spec.ledger_database, private_name(table, "verify", f"{spec.pipeline}.{slice_id}"))
        ch.command(f"DROP TABLE IF EXISTS {ch_table(*into)}")  # an attempt that stopped half way
        create_working(ch, check.schema, *into, check.weight is not None, direct=False)
    written = 0
    writer = shared_client(spec.target)  # session-less: an insert may be acknowledged while the next streams
    inserts = ArrowInserts(writer, ch_table(*into), settings=WEIGHT_SETTINGS if check.weight else None,
                           compression=spec.target.insert_compression)
    try:
        for batch in snapshot.rows(check, slice_id):
            stamp = pa.repeat(pa.scalar(version, pa.uint64()), batch.num_rows)
            inserts.write(pa.RecordBatch.from_arrays([*batch.columns, stamp], names=[*names, VERSION_COLUMN]))
            written += batch.num_rows
        inserts.finish()
    finally:
        inserts.close()
    where, params = check.predicate(slice_id)
    if history is not None:
        write_published(ch, history, into, Stamp("repair", "verify", int(snapshot.began * 1_000_000)),
                        [Scope(where, params, version)])
        copy_parts(ch, check.schema, into[1], into[0], database, table, check.weight is not None)
        ch.command(f"DROP TABLE {ch_table(*into)}")
    repairs.tombstone_older(ch, database, table, version, where, params)
    return written


def _repair_multiset(spec: CdcApplySpec, ch, snapshot: Snapshot, check: TableCheck, slice_id: int) -> int:
    """A multiset's repair: the source's rows at S go beside the copy, and ClickHouse writes the
    difference with the copy as of S (+1 per occurrence it lacks, -1 per one too many) at S's
    repair version, so the changes after S add up on top (core/clickhouse/multisets.py)."""
    where, params = check.predicate(slice_id)
    with multisets.Beside(ch, spec.target, check.table.target_database, check.table.writes_to,
                          [m.name for m in check.schema.mappings()], spec.pipeline) as beside:
        beside.fill(snapshot.rows(check, slice_id))
        return beside.write_differences(beside.differences(where, int(snapshot.position.version())),
                                        snapshot.position.snapshot_version(repair=True), params)

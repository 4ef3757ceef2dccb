"""The pipeline checks itself: per-shard checksums of its tables, source vs copy, at one binlog
position S, and mismatched shards repaired in place.

S is a consistent snapshot of the source (core/cdc/positions.snapshot_position): the source's
checksums are computed in it, the applier then applies the binlog exactly up to S, and the
copy's checksums (``FINAL``, tombstones excluded) are computed before anything past S is
written, so both sides describe the same moment. A mismatched shard is re-read in the same
snapshot and written with S's repair version, which ranks above every change before S and
below every change after it; rows of the shard the source no longer has get tombstones of
that version. A repaired shard is checked again at a new snapshot (on MySQL, whose snapshot
position can miss a transaction inside group commit, that second look catches a repair made
from a read that missed it).
"""

from __future__ import annotations

import dataclasses
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pyarrow as pa

from airflow_sync_provider.core.cdc.positions import (
    BinlogError, BinlogPosition, TransientBinlogError, snapshot_position,
)
from airflow_sync_provider.core.cdc.tables import PipelineTable
from airflow_sync_provider.core.jobspec import CdcApplySpec, copied_schema
from airflow_sync_provider.core.source import reader as mysql_reader
from airflow_sync_provider.core.source.planning import Plan, Shard, SpeedLimits, choose_split_column, plan_table
from airflow_sync_provider.core.source.schema import TableSchema, table_rows
from airflow_sync_provider.core.sql import ch_ident, ch_table
from airflow_sync_provider.core.target import clickhouse as target
from airflow_sync_provider.core.target.inserts import ArrowInserts
from airflow_sync_provider.core.target.shards import SPLIT_WEIGHT_COLUMN, NotComparable, needs_weight, shard_predicates
from airflow_sync_provider.core.verify.reconcile import (
    checksum_source, checksum_target, clickhouse_checksum_sql, mysql_checksum_sql,
)

SHARD_ROWS = 20_000  # rows per verification shard: what a mismatch costs to re-read
MAX_SHARDS = 256


class VerifyFailed(BinlogError):
    pass


def copy_columns(schema: TableSchema) -> dict:
    """What the copy's columns must be: name → ClickHouse type."""
    return {m.name: m.ch_type for m in schema.mappings()}


@dataclass
class TableCheck:
    """One table's shards (kept between rounds: a second look compares the same shards)."""

    name: str
    table: PipelineTable
    plan: Plan
    predicates: list
    weight: object  # the copy's collated split column (rows carry its weight), or None
    schema: TableSchema | None = None  # the definition at S
    ids: list = field(default_factory=list)  # the shards looked at
    source: dict = field(default_factory=dict)  # shard id → (rows, checksum) at S
    copy: dict = field(default_factory=dict)  # the same of the copy at S


def _plan(pconn, ch, entry: PipelineTable, schema: TableSchema) -> tuple[Plan, list, object]:
    """Shards of about SHARD_ROWS on the split column the copy can compare (a collated one only
    when the copy carries its weights); one shard when there is none."""
    database, table = entry.target_database, entry.target_table
    weighted = SPLIT_WEIGHT_COLUMN in target.column_types(ch, database, table) and entry.split_column
    split = entry.split_column if weighted else choose_split_column(schema)[0]
    if split and needs_weight(schema.column(split)) and not weighted:
        split = None
    rows = table_rows(pconn, entry.source_database, entry.source_table)
    shards = max(1, min(MAX_SHARDS, math.ceil(rows / SHARD_ROWS)))
    plan = None
    if split:
        try:
            plan = plan_table(pconn, schema, speed=SpeedLimits(channels=1), split_column=split, split_factor=shards,
                              estimate=False)
            predicates = shard_predicates(pconn, ch, plan, schema, {}, database, table)
        except NotComparable:
            plan = None
    if plan is None:
        plan = Plan(schema.database, schema.table, None, None, "balanced", 1, 1, (Shard(0, "1=1"),))
        predicates = [("1", {})]
    weight = schema.column(entry.split_column) if weighted else None
    return plan, predicates, weight


class Snapshot:
    """A consistent snapshot of the source at S, with the tables' definitions at S."""

    def __init__(self, spec: CdcApplySpec, tables: list[PipelineTable]):
        self.spec = spec
        self.pool, self.pending = ThreadPoolExecutor(1, thread_name_prefix="verify"), None
        self.pconn = mysql_reader.connect(spec.source)
        self.sconn = mysql_reader.stream_connect(spec.source)
        try:
            for _ in range(10):  # the definitions read on both sides of S are those at S
                before = [copied_schema(self.pconn, t.copy_spec()) for t in tables]
                self.position = snapshot_position(self.sconn)
                if [copied_schema(self.pconn, t.copy_spec()) for t in tables] == before:
                    self.schemas = before
                    return
                self.sconn.rollback()
            raise TransientBinlogError(f"pipeline {spec.pipeline!r}: table definitions kept changing while a "
                                       "verification began; a retry may find them settled")
        except BaseException:
            self.close()
            raise

    def ready(self, timeout: float) -> bool:
        """Are the source's checksums all computed? (raises what computing them raised)"""
        try:
            self.pending.result(timeout)
        except TimeoutError:
            return False
        return True

    def checksums(self, check: TableCheck, shard_ids) -> dict:
        plan = _subset(check.plan, shard_ids)
        sums = checksum_source(self.sconn, mysql_checksum_sql(check.schema, plan), plan)
        return dict(zip((s.id for s in plan.shards), sums))

    def rows(self, check: TableCheck, shard_id: int):
        """The shard's rows in the snapshot, as Arrow batches (with the weight the copy keeps)."""
        plan = _subset(check.plan, [shard_id])
        mappings = check.schema.mappings()
        columns_sql = mysql_reader.select_list(mappings, check.weight)
        return mysql_reader.read_shard(self.sconn, plan, mappings, plan.shards[0], 65536, columns_sql,
                                       check.weight is not None)

    def close(self):
        if self.pending is not None:
            self.pending.exception()  # the connection is the checksums' until they are done
        self.pool.shutdown()
        for conn in (self.pconn, self.sconn):
            try:
                conn.close()
            except Exception:
                pass


def _subset(plan: Plan, shard_ids) -> Plan:
    wanted = set(shard_ids)
    return dataclasses.replace(plan, shards=tuple(s for s in plan.shards if s.id in wanted))


def prepare(spec: CdcApplySpec, ch, checks: dict, tables: list[PipelineTable], shards: dict | None) -> Snapshot:
    """Open a snapshot S and start computing the source's checksums of ``configs``' tables in it
    (``shards``: name → shard ids to look at, all when None), in a thread: the stream goes on up to
    S meanwhile (:meth:`Snapshot.wait` before comparing). ``checks`` keeps each table's plan."""
    snapshot = Snapshot(spec, tables)
    try:
        work = []
        for table, schema in zip(tables, snapshot.schemas):
            name = table.name
            check = checks.get(name)
            if check is None or copy_columns(check.schema) != copy_columns(schema):
                plan, predicates, weight = _plan(snapshot.pconn, ch, table, schema)
                check = checks[name] = TableCheck(name, table, plan, predicates, weight)
            check.schema = schema
            check.ids = [s.id for s in check.plan.shards]
            if shards is not None:
                check.ids = [i for i in check.ids if i in shards.get(name, ())]
            check.source, check.copy = {}, {}
            work.append(check)

        def checksums():  # on the snapshot's own connection, which nothing else uses meanwhile
            for check in work:
                check.source = snapshot.checksums(check, check.ids)

        snapshot.pending = snapshot.pool.submit(checksums)
    except BaseException:
        snapshot.close()
        raise
    return snapshot


def copy_checksums(ch, check: TableCheck, tracked: TableSchema) -> str:
    """The copy's checksums of the shards looked at, kept in ``check.copy`` (the copy must be at S
    now), or a reason when the copy's columns are not the source's at S."""
    database, table = check.table.target_database, check.table.target_table
    wanted, have = copy_columns(check.schema), copy_columns(tracked)
    present = target.column_types(ch, database, table)
    missing = [c for c in wanted if c not in present]
    if have != wanted or missing:
        diff = sorted(set(wanted.items()) ^ set(have.items()))
        return (f"the copy's columns are not the source's at {check.schema.qualified}: "
                f"{diff[:6] or 'missing ' + str(missing)}")
    head = clickhouse_checksum_sql(check.schema, database, table)
    predicates = [(f"({check.predicates[_index(check, i)][0]}) AND {ch_ident(target.DELETED_COLUMN)} = 0",
                   check.predicates[_index(check, i)][1]) for i in check.ids]
    check.copy = dict(zip(check.ids, checksum_target(ch, head, predicates)))
    return ""


def mismatched(check: TableCheck) -> list[int]:
    """The shards whose counts or checksums differ (both sides computed)."""
    return [i for i in check.ids if tuple(check.source[i]) != tuple(check.copy[i])]


def _index(check: TableCheck, shard_id: int) -> int:
    return [s.id for s in check.plan.shards].index(shard_id)


def repair(spec: CdcApplySpec, ch, snapshot: Snapshot, check: TableCheck, shard_ids: list[int]) -> int:
    """Rewrite ``shard_ids`` of the copy from the snapshot: the source's rows at S's repair
    version, and tombstones of that version for the copy's rows the source no longer has.
    Returns the rows written."""
    database, table = check.table.target_database, check.table.target_table
    version = snapshot.position.snapshot_version(repair=True)
    written = 0
    names = [m.name for m in check.schema.mappings()] + ([SPLIT_WEIGHT_COLUMN] if check.weight else [])
    writer = target.shared_client(spec.target)  # session-less: an insert may be acknowledged while the next streams
    for shard_id in shard_ids:
        inserts = ArrowInserts(writer, ch_table(database, table),
                               settings=target.WEIGHT_SETTINGS if check.weight else None)
        try:
            for batch in snapshot.rows(check, shard_id):
                stamp = pa.repeat(pa.scalar(version, pa.uint64()), batch.num_rows)
                inserts.write(pa.RecordBatch.from_arrays([*batch.columns, stamp],
                                                         names=[*names, target.VERSION_COLUMN]))
                written += batch.num_rows
            inserts.finish()
        finally:
            inserts.close()
        where, params = check.predicates[_index(check, shard_id)]
        target.tombstone_older(ch, database, table, version, where, params)
    return written


def record(table: PipelineTable, position: BinlogPosition, look: dict, began: float) -> dict:
    """What a verification of a table says (``look``: shards, mismatched, repaired_shards,
    rows_repaired[, note]), kept in its entry (carried with the checkpoint); ``seconds``: since
    ``began`` (the look's start: its catch-up, snapshot, checksums, repairs)."""
    now = time.time()
    outcome = {"position": position.to_dict(), "at": now, **look, "seconds": round(now - began, 3)}
    table.verified = outcome
    table.verifications += 1
    table.repaired += look["repaired_shards"]
    table.verify_due = False
    return outcome

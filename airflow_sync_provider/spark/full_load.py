"""Full load: shards read by ``channels`` concurrent Spark tasks, written as Arrow batches.

Driver: find or start the load in the ledger, plan (or reuse the stored plan when resuming),
hand each channel its queue of unfinished shards, report progress, publish when every shard
has succeeded. Executors: one channel = one source connection draining its queue; per shard,
drop what earlier attempts wrote, stream the rows, write Arrow batches, report counters.
"""

from __future__ import annotations

import threading
import time

import pyarrow as pa

from airflow_sync_provider.core.cdc.positions import position_if_readable, snapshot_position
from airflow_sync_provider.core.flow_control import Throttle
from airflow_sync_provider.core.jobspec import FullLoadSpec, copied_schema, public_dict, spec_to_dict
from airflow_sync_provider.core.ledger import (
    LOAD_FAILED, LOAD_PUBLISHED, LOAD_RUNNING, SHARD_FAILED, SHARD_RUNNING, SHARD_SUCCESS, Ledger, LoadState,
    ShardState, executor_address,
)
from airflow_sync_provider.core.source import reader as mysql_reader
from airflow_sync_provider.core.source.planning import Plan, plan_table
from airflow_sync_provider.core.sql import ch_table
from airflow_sync_provider.core.target import clickhouse as target
from airflow_sync_provider.core.target.shards import SPLIT_WEIGHT_COLUMN, needs_weight, shard_predicates
from airflow_sync_provider.core.verify.reports import shard_table

REPORT_EVERY_SECONDS = 1.0


class LoadFailed(RuntimeError):
    pass


def _retrying(action, wait_seconds: float):
    """Run a ledger write, retrying while the target is unreachable (a failure must be recorded)."""
    deadline = time.monotonic() + wait_seconds
    delay = 0.5
    while True:
        try:
            return action()
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 10)


def _load_shard(spec, plan, mappings, weight, columns_sql, ch, ledger, state, shard, attempt, throttle):
    names = ([m.name for m in mappings] + ([SPLIT_WEIGHT_COLUMN] if weight else [])
             + [target.VERSION_COLUMN, target.SHARD_COLUMN])
    record = ShardState(shard.id, attempt, SHARD_RUNNING, shard.where, list(shard.params), started_at=time.time(),
                        executor=executor_address(spec.source.host, spec.source.port))
    pending, pending_rows, pending_bytes, reported = [], 0, 0, time.monotonic()

    def flush():
        nonlocal pending, pending_rows, pending_bytes
        if not pending:
            return
        table = pa.Table.from_batches(pending)
        table = table.append_column(target.VERSION_COLUMN, pa.array([record.version] * table.num_rows, pa.uint64()))
        table = table.append_column(target.SHARD_COLUMN, pa.array([shard.id] * table.num_rows, pa.uint32()))
        try:
            ch.insert_arrow(state.parts_table, table.rename_columns(names), database=spec.ledger_database)
        except Exception:
            record.records_failed += table.num_rows
            raise
        record.records_written += table.num_rows
        pending, pending_rows, pending_bytes = [], 0, 0

    conn = None
    try:
        ledger.write_shard(state.load_key, state.generation, record)
        target.drop_shard(ch, spec.ledger_database, state.parts_table, shard.id)  # an earlier attempt's rows
        conn = mysql_reader.stream_connect(spec.source)
        # the rows' version: the binlog position this read's consistent snapshot saw
        record.version = (snapshot_position(conn).snapshot_version(repair=bool(state.repair)) if state.start_position
                          else state.version)
        for batch in mysql_reader.read_shard(conn, plan, mappings, shard, throttle.chunk_rows(spec.batch_rows),
                                             columns_sql, weight is not None):
            record.records_read += batch.num_rows
            record.bytes += batch.nbytes
            pending.append(batch)
            pending_rows += batch.num_rows
            pending_bytes += batch.nbytes
            if pending_rows >= spec.batch_rows or pending_bytes >= spec.batch_bytes:
                flush()
            throttle.account(batch.num_rows, batch.nbytes)
            if time.monotonic() - reported >= REPORT_EVERY_SECONDS:  # live hook counters
                flush()
                ledger.write_shard(state.load_key, state.generation, record)
                reported = time.monotonic()
        flush()
        record.status = SHARD_SUCCESS
    except Exception as exc:
        record.status, record.error = SHARD_FAILED, f"{type(exc).__name__}: {exc}"[:4000]
    finally:
        if conn is not None:
            conn.close()
    record.finished_at = time.time()
    _retrying(lambda: ledger.write_shard(state.load_key, state.generation, record), spec.ledger_wait_seconds)
    return record


def _finished_meanwhile(ledger: Ledger, state: LoadState, shard_id: int, previous) -> ShardState | None:
    """A shard this job already loaded: Spark re-runs a channel whose executor was lost (a worker
    died), and the shards it had finished before are not read again."""
    now = ledger.state(state.load_key)
    shard = now.shards.get(shard_id) if now is not None and now.generation == state.generation else None
    if shard is not None and shard.status == SHARD_SUCCESS and shard.attempt > (previous.attempt if previous else 0):
        return shard
    return None


def _load_channel(spec: FullLoadSpec, plan: Plan, mappings, weight, columns_sql: str, state: LoadState,
                  shard_ids: list[int]):
    """Runs on an executor: one channel = one source connection at a time, one throttle."""
    ch = target.client(spec.target)
    ledger = Ledger(ch, spec.ledger_database)
    throttle = Throttle(spec.channel_record_speed, spec.channel_byte_speed)
    shards = {s.id: s for s in plan.shards}
    for shard_id in shard_ids:
        previous = state.shards.get(shard_id)
        done = _finished_meanwhile(ledger, state, shard_id, previous)
        if done is not None:
            yield vars(done) | {"seconds": done.seconds}
            continue
        record = _load_shard(spec, plan, mappings, weight, columns_sql, ch, ledger, state, shards[shard_id],
                             (previous.attempt if previous else 0) + 1, throttle)
        yield vars(record) | {"seconds": record.seconds}
    ch.close()


def _binlog_start(spec: FullLoadSpec, ch) -> tuple[dict | None, int]:
    """The source's binlog position now (each shard's read then takes its own snapshot's), or,
    for a source without a binlog (or without the privilege to see it), one version above
    everything the target table holds: snapshot writers still outrank older copies, but the
    copy cannot be a starting point for CDC."""
    with mysql_reader.connect(spec.source) as conn:
        position = position_if_readable(conn, f"{spec.source_database}.{spec.source_table}")
    if position is not None:
        return position.to_dict(), 0
    top = 0
    if target.table_exists(ch, spec.target_database, spec.target_table):
        top = int(ch.command(f"SELECT max({target.VERSION_COLUMN}) FROM {ch_table(spec.target_database, spec.target_table)}")
                  or 0)
    return None, top + 1


def _start_or_resume(spec: FullLoadSpec, ledger: Ledger, schema) -> tuple[LoadState, Plan]:
    state = ledger.state(spec.load_key)
    if spec.reimport == "failed":
        if state is None:
            raise LoadFailed(f"load {spec.load_key!r} is not in the ledger: nothing to re-import")
        if state.status == LOAD_PUBLISHED:  # shards a reconciliation marked: repair them in place
            if not state.failed():
                raise LoadFailed(f"load {spec.load_key!r} is published and no shard is marked failed or mismatched "
                                 "(a reconciliation marks mismatched shards); run it again for a fresh copy")
            target.check_layout(ledger.ch, spec.target_database, spec.target_table)
            state.status, state.error, state.repair = LOAD_RUNNING, "", state.failed()
            state.start_position, state.version = _binlog_start(spec, ledger.ch)
            return state, Plan.from_dict(state.plan)
    if state is not None and state.status == LOAD_RUNNING:
        age = time.time() - state.heartbeat
        if age < spec.stale_after_seconds:
            raise LoadFailed(f"load {spec.load_key!r} is running elsewhere (last report {age:.0f} s ago); two jobs "
                             f"must not load the same key at once. If that job is dead, retry after "
                             f"{spec.stale_after_seconds:.0f} s without a report")
    if state is not None and state.status != LOAD_PUBLISHED:
        state.status, state.error = LOAD_RUNNING, ""
        return state, Plan.from_dict(state.plan)  # resume: same shards, so earlier attempts line up
    with mysql_reader.connect(spec.source) as conn:
        plan = plan_table(conn, schema, speed=spec.speed(), split_column=spec.split_column,
                          split_factor=spec.split_factor, strategy=spec.strategy, where=spec.filter())
    generation = state.generation + 1 if state else 1
    start, version = _binlog_start(spec, ledger.ch)
    state = LoadState(spec.load_key, generation, LOAD_RUNNING, schema.qualified,
                      f"{spec.target_database}.{spec.target_table}", plan.to_dict(),
                      target.parts_table_name(spec.load_key, generation), version, public_dict(spec),
                      start_position=start)
    return state, plan


class _Progress(threading.Thread):
    """Driver-side: keeps the load's heartbeat and logs each shard as it finishes."""

    def __init__(self, spec: FullLoadSpec, state: LoadState, todo: list[int]):
        super().__init__(daemon=True)
        self.spec, self.state, self.todo = spec, state, set(todo)
        self.stop = threading.Event()

    def run(self):
        ch = target.client(self.spec.target)
        ledger = Ledger(ch, self.spec.ledger_database)
        seen = set()
        while not self.stop.wait(2.0):
            try:
                ledger.write_load(self.state)  # heartbeat
                current = ledger.state(self.state.load_key)
            except Exception as exc:  # the target may be briefly unreachable; the shards record it
                print(f"[airflow-sync] progress: ledger unreachable ({type(exc).__name__})", flush=True)
                continue
            for shard in sorted(current.shards.values(), key=lambda s: s.shard_id):
                if shard.shard_id in self.todo and shard.status != SHARD_RUNNING and shard.shard_id not in seen:
                    seen.add(shard.shard_id)
                    print(f"[airflow-sync] shard {shard.shard_id} {shard.status}: {shard.records_written:,} rows, "
                          f"{shard.bytes / 1e6:.1f} MB, {shard.seconds:.1f} s"
                          + (f" — {shard.error}" if shard.error else ""), flush=True)
        ch.close()


def _publish(spec: FullLoadSpec, ch, schema, plan: Plan, state: LoadState, weight: bool) -> int:
    """Make the loaded rows visible: swap in a full copy, replace a period's partitions, or
    repair the re-imported shards of a published table in place. Returns the rows published."""
    args = (ch, schema, state.parts_table, spec.ledger_database, spec.target_database, spec.target_table)
    if state.repair:
        with mysql_reader.connect(spec.source) as conn:
            predicates = shard_predicates(conn, ch, plan, schema, state.spec, spec.target_database, spec.target_table)
        chosen = [(where, params, state.shards[shard.id].version)
                  for shard, (where, params) in zip(plan.shards, predicates) if shard.id in state.repair]
        return target.publish_repair(*args, chosen, weight)
    if spec.partition_by:
        return target.publish_partitions(*args, spec.partition_by, list(spec.replace_partitions), weight)
    return target.publish_full(*args, weight)


def run_full_load(spec: FullLoadSpec, spark) -> dict:
    started = time.time()
    ch = target.client(spec.target)
    ledger = Ledger(ch, spec.ledger_database)
    ledger.ensure()
    with mysql_reader.connect(spec.source) as conn:
        schema = copied_schema(conn, spec_to_dict(spec))
    target.check_columns(schema)
    mappings = schema.mappings()
    state, plan = _start_or_resume(spec, ledger, schema)
    split = schema.column(plan.split_column) if plan.split_column else None
    weight = split if needs_weight(split) else None  # collated key: rows carry their weight
    columns_sql = mysql_reader.select_list(mappings, weight)  # every type rule's conversion, built once
    ch.command(target.create_parts_sql(schema, spec.ledger_database, state.parts_table, weight is not None))
    ledger.write_load(state)
    todo = state.todo()
    print(f"[airflow-sync] load {state.load_key!r} generation {state.generation}: {len(todo)} of "
          f"{len(plan.shards)} shards to read{' (repair of the published table)' if state.repair else ''}, "
          f"{plan.channels} channel(s), split on {plan.split_column!r}", flush=True)

    per_shard = []
    if todo:
        channels = min(plan.channels, len(todo))
        queues = [todo[i::channels] for i in range(channels)]  # round-robin, like DataX task groups
        progress = _Progress(spec, state, todo)
        progress.start()
        try:
            per_shard = (spark.sparkContext.parallelize(queues, channels)
                         .mapPartitions(lambda qs: (r for q in qs for r in _load_channel(spec, plan, mappings, weight, columns_sql, state, q)))
                         .collect())
        finally:
            progress.stop.set()
            progress.join()

    state = ledger.state(spec.load_key)
    failed = [i for i in (s["id"] for s in state.plan["shards"]) if i not in state.shards
              or state.shards[i].status != SHARD_SUCCESS]
    if failed:
        errors = "; ".join(f"shard {i}: {state.shards[i].error}" for i in failed if i in state.shards)
        state.status, state.error = LOAD_FAILED, f"shards {failed} failed: {errors}"[:4000]
        _retrying(lambda: ledger.write_load(state), spec.ledger_wait_seconds)
        print(shard_table([vars(s) | {"seconds": s.seconds} for s in state.shards.values()]), flush=True)
        raise LoadFailed(f"table {schema.qualified}: {state.error}. Nothing was published; re-import with "
                         f"reimport='failed' (airflow-sync reimport --load {spec.load_key!r} --failed)")

    repaired = list(state.repair)
    published = repaired or [s.id for s in plan.shards]
    written = sum(s.records_written for s in state.shards.values() if s.shard_id in published)
    landed = _publish(spec, ch, schema, plan, state, weight is not None)
    if landed != written:
        raise LoadFailed(f"table {schema.qualified}: {written} rows written but {landed} published")
    state.status, state.repair = LOAD_PUBLISHED, []
    ledger.write_load(state)
    ch.command(f"DROP TABLE IF EXISTS {ch_table(spec.ledger_database, state.parts_table)}")
    shards = [vars(s) | {"seconds": s.seconds} for s in state.shards.values()]
    print(shard_table(shards), flush=True)
    ch.close()
    return {
        "load_key": state.load_key,
        "generation": state.generation,
        "table": schema.qualified,
        "target": f"{spec.target_database}.{spec.target_table}",
        "rows": written,
        "shards": len(plan.shards),
        "shards_read": len(todo),
        "repaired": repaired,
        "per_shard": [{k: s[k] for k in ("shard_id", "status", "attempt", "records_read", "records_written", "records_failed",
                                         "bytes", "seconds")} for s in per_shard],
        "channels": plan.channels,
        "split_column": plan.split_column,
        "start_position": state.start_position,
        "strategy": plan.strategy,
        "warnings": list(plan.warnings),
        "seconds": round(time.time() - started, 3),
    }

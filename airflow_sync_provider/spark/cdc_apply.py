"""CDC catch-up: binlog → ClickHouse, versions in binlog order, checkpoint after the write.

Driver: find the pipeline's checkpoint (or, for a new pipeline, the earliest position its
tables' copies began at: core/cdc/checkpoints.py's ``cdc_tables``), check the source, then
read complete transactions in batches (a reader process decodes the next batches while the
current one is written). Each batch's changes are routed by hash(table, primary key) on a
consistent-hash ring to apply lanes; the lanes write in parallel, each lane's rows in binlog
order: as Spark tasks for a large batch, as threads of the driver for one of at most
``driver_write_rows`` changes (a Spark job would cost more than the write). Only when every
lane's write has been acknowledged does the checkpoint advance to the batch's end, so it is
never ahead of durable data; a failed write leaves it before the batch, and the next run
replays from there (same versions: idempotent).
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import queue
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa

from airflow_sync_provider.core.cdc.binlog import (
    BinlogReader, TableRoute, backlog_events, batches, preflight, split_backlog,
)
from airflow_sync_provider.core.cdc.checkpoints import (
    PIPELINE_FAILED, PIPELINE_IDLE, PIPELINE_RUNNING, Checkpoints, PipelineState, PipelineTable,
)
from airflow_sync_provider.core.cdc.lease import Lease, LeaseError
from airflow_sync_provider.core.cdc.positions import BinlogError, BinlogPosition, current_position
from airflow_sync_provider.core.cdc.ring import HashRing
from airflow_sync_provider.core.crash_points import crash_point
from airflow_sync_provider.core.jobspec import CdcApplySpec, table_config
from airflow_sync_provider.core.ledger import LOAD_PUBLISHED, Ledger
from airflow_sync_provider.core.source import reader as mysql_reader
from airflow_sync_provider.core.source.selection import TableSelection
from airflow_sync_provider.core.target import clickhouse as target
from airflow_sync_provider.core.target.shards import SPLIT_WEIGHT_COLUMN, weights_of
from airflow_sync_provider.spark import cdc_ddl, cdc_verify
from airflow_sync_provider.spark.session import LazySession, lazy


class ApplyFailed(RuntimeError):
    pass


def _register(spec: CdcApplySpec, checkpoints: Checkpoints, loads: Ledger, fresh: bool) -> None:
    """Tables named by the run (full loads, or tables with a start position) join the pipeline
    from where their copies began; a table already in it keeps its place."""
    for key in spec.start_from_loads:
        load = loads.state(key)
        if load is None or load.status != LOAD_PUBLISHED:
            raise ApplyFailed(f"pipeline {spec.pipeline!r}: full load {key!r} is "
                              f"{load.status if load else 'not in the ledger'}; start from a published load")
        if not load.start_position:
            raise ApplyFailed(f"pipeline {spec.pipeline!r}: full load {key!r} recorded no binlog position (binlog "
                              "off or not visible to its user when it ran); reload with binlog access to start CDC")
        source_db, source_table = load.source_table.split(".", 1)
        target_db, target_table = load.target_table.split(".", 1)
        checkpoints.register(spec.pipeline, table_config({
            "source_database": source_db, "source_table": source_table, "target_database": target_db,
            "target_table": target_table, "columns": load.spec.get("columns"),
            "exclude_columns": load.spec.get("exclude_columns"), "split_column": load.plan.get("split_column")})
            | (load.spec.get("source_shape") or {}), BinlogPosition.from_dict(load.start_position))
    known = {t.name for t in checkpoints.tables(spec.pipeline)}
    for table in spec.tables:
        name = f"{table['source_database']}.{table['source_table']}"
        if name in known:
            continue
        if not spec.start_position:
            raise ApplyFailed(f"pipeline {spec.pipeline!r}: table {name} is not part of it; bootstrap it "
                              "(CdcBootstrapOperator / airflow-sync cdc bootstrap), start from its full load "
                              "(start_from_loads) or give start_position")
        checkpoints.register(spec.pipeline, table, BinlogPosition.from_dict(spec.start_position))
    if fresh and not checkpoints.tables(spec.pipeline) and not spec.select:
        raise ApplyFailed(f"pipeline {spec.pipeline!r} has no tables yet: bootstrap them (CdcBootstrapOperator), "
                          "start from full loads of them (start_from_loads=[load keys]) or give start_position "
                          "with tables")


def _start(spec: CdcApplySpec, state: PipelineState | None, checkpoints: Checkpoints,
           loads: Ledger) -> tuple[BinlogPosition, list[dict]]:
    """Where a run starts and the tables already streaming (the others join during the run)."""
    fresh = state is None or state.checkpoint is None or spec.reset
    if state is not None and state.tables and not checkpoints.tables(spec.pipeline):
        for table in state.tables:  # a pipeline from before cdc_tables existed
            checkpoints.write_table(spec.pipeline, PipelineTable(table, state.checkpoint, joined=True))
    if spec.reset:
        checkpoints.forget_tables(spec.pipeline)
    _register(spec, checkpoints, loads, fresh)
    tables = checkpoints.tables(spec.pipeline)
    if not fresh:  # what the last checkpoint knew of each table (its shape there, a re-copy, leaving)
        known = {cdc_ddl.name_of(c): c for c in state.tables}
        return state.checkpoint, [cdc_ddl.carried(t.config, known.get(t.name)) for t in tables if t.joined]
    if not tables:  # a new pipeline of patterns alone: its tables are bootstrapped beside the stream from now
        with mysql_reader.connect(spec.source) as conn:
            return current_position(conn), []
    start = min((t.since for t in tables), key=BinlogPosition.key)  # a new pipeline: every table joins now
    for table in tables:
        if not table.joined:
            table.joined = True
            checkpoints.write_table(spec.pipeline, table)
    return start, [t.config for t in tables]


def _latest(route: TableRoute, rows, versions, deleted):
    """Per key only its last change in the batch (the highest version: the one FINAL keeps)."""
    last = {route.key_of(row): i for i, row in enumerate(rows)}
    if len(last) == len(rows):
        return rows, versions, deleted
    keep = sorted(last.values())
    return [rows[i] for i in keep], [versions[i] for i in keep], [deleted[i] for i in keep]


def _lane_payloads(batch, routes: dict[str, TableRoute], lanes: int, source_endpoint) -> list[list[tuple]]:
    """Per lane (index = lane): [(target database, target table, source table, Arrow IPC bytes)]."""
    payloads = [[] for _ in range(lanes)]
    conn = None
    for source, per_lane in batch.lanes.items():
        route = routes[source]
        for lane, changes in per_lane.items():
            rows, versions, deleted = _latest(route, *changes)
            table = route.arrow(rows, versions, deleted, f"table {source}, binlog {batch.start}…{batch.end}")
            if route.weight is not None:  # rows of a table split on a collated key carry their weight
                conn = conn or mysql_reader.connect(source_endpoint)
                values = table.column(route.weight.name).to_pylist()
                table = table.append_column(SPLIT_WEIGHT_COLUMN, pa.array(weights_of(conn, route.weight, values),
                                                                          pa.binary()))
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(table)
            payloads[lane].append((route.target_database, route.target_table, source, sink.getvalue().to_pybytes()))
    if conn is not None:
        conn.close()
    return payloads


def _write_lane(endpoint, items: list[tuple]) -> list[tuple[str, int]]:
    """On an executor or a driver thread: one lane's tables, in order. Returns (source table, rows) per write."""
    ch = target.shared_client(endpoint)
    out = []
    for database, table, source, data in items:
        rows = pa.ipc.open_stream(data).read_all()
        ch.insert_arrow(table, rows, database=database,
                        settings=target.WEIGHT_SETTINGS if SPLIT_WEIGHT_COLUMN in rows.column_names else None)
        out.append((source, rows.num_rows))
        crash_point("cdc.lane-write")
    return out


def _write_lanes(spec: CdcApplySpec, session: LazySession, payloads: list, changes: int) -> list:
    """Every lane's writes, in parallel; returns when all are acknowledged."""
    if changes > spec.driver_write_rows:
        session.start()  # in the background: until it is up, the driver writes these too
        if session.ready or spec.driver_write_rows == 0:
            return (session.get().sparkContext.parallelize(payloads, len(payloads))
                    .map(lambda items: _write_lane(spec.target, items)).collect())
    with ThreadPoolExecutor(len(payloads), thread_name_prefix="lane") as pool:
        return list(pool.map(lambda items: _write_lane(spec.target, items), payloads))


@dataclass
class _Decoded:
    """A batch as the reader process hands it to the driver: positions, counts, lane payloads."""

    start: BinlogPosition
    end: BinlogPosition
    events: int
    per_table: dict
    ddl: tuple | None
    done: bool
    last_event_at: float
    payloads: list


def _hand_over(out, item, halt, parent: int) -> bool:
    """Put ``item`` on the queue; False when the driver stopped us or is gone (killed: the
    reader must not outlive it holding a binlog connection)."""
    while not halt.is_set() and os.getppid() == parent:
        try:
            out.put(item, timeout=1.0)
            return True
        except queue.Full:
            continue
    return False


def _read_batches(spec: CdcApplySpec, routes: dict, watched: frozenset, start: BinlogPosition, stop, deadline, out,
                  halt, parent: int) -> None:
    """The reader process: decode complete transactions from ``start`` and turn them into lane
    payloads (the CPU-heavy part, a core of its own), handing each batch over in order."""
    try:
        reader = BinlogReader(spec.source, start, routes, HashRing(spec.lanes, spec.vnodes), spec.server_id,
                              blocking=spec.service, watched=watched, selection=TableSelection.of(spec.select))
        # a service checkpoints every batch_seconds; a bounded run cuts batches by size (each
        # batch costs a Spark job and a checkpoint), with a time cap so progress is recorded
        seconds = spec.batch_seconds if spec.service else max(spec.batch_seconds, 30.0)
        try:
            for batch in batches(reader, stop, spec.batch_events, seconds):
                if deadline is not None and time.time() >= deadline:
                    batch.done = True
                decoded = _Decoded(batch.start, batch.end, batch.events, dict(batch.per_table), batch.ddl,
                                   batch.done, batch.last_event_at,
                                   _lane_payloads(batch, routes, spec.lanes, spec.source))
                if not _hand_over(out, decoded, halt, parent) or batch.done or batch.ddl:
                    break
        finally:
            reader.close()
    except BaseException as exc:  # handed to the driver, which fails the run
        _hand_over(out, ApplyFailed(f"binlog reader: {type(exc).__name__}: {exc}") if not isinstance(exc, BinlogError)
                   else exc, halt, parent)


class _Reader:
    """Runs :func:`_read_batches` in a process of its own (decoding is pure Python and would
    otherwise share the driver's interpreter with the writes' bookkeeping)."""

    def __init__(self, spec: CdcApplySpec, routes: dict, watched: frozenset, start: BinlogPosition, stop, deadline,
                 ahead: int = 2):
        context = multiprocessing.get_context("spawn")  # the driver has JVM gateway threads: no fork
        self.out, self.halt = context.Queue(maxsize=ahead), context.Event()
        self.process = context.Process(target=_read_batches, args=(spec, routes, watched, start, stop, deadline,
                                                                    self.out, self.halt, os.getpid()), daemon=True)
        self.process.start()

    def get(self):
        while True:
            try:
                return self.out.get(timeout=5)
            except queue.Empty:
                if not self.process.is_alive():
                    raise ApplyFailed(f"the binlog reader process died (exit code {self.process.exitcode})") from None

    def close(self):
        self.halt.set()
        while self.process.is_alive():  # unblock a reader waiting to hand over a batch
            try:
                self.out.get(timeout=0.1)
            except queue.Empty:
                self.process.join(0.1)
        self.process.join()


class _Readers:
    """The range split between reader processes at ``cuts`` (core/cdc/binlog.split_backlog),
    each decoding its part at once; their batches are handed on in binlog order, so the
    checkpoint still only moves forward over applied batches. A later part's reader decodes
    ahead into a deeper queue while the earlier parts are applied."""

    AHEAD = 32  # batches a later part's reader may decode ahead (≈ 5–7 MB each at 50k changes)

    def __init__(self, spec: CdcApplySpec, routes: dict, watched: frozenset, start: BinlogPosition, stop, deadline,
                 cuts: list[BinlogPosition]):
        bounds = [start, *cuts, stop]
        self.ends = bounds[1:]
        self.readers = []
        try:
            for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
                # each its own replica id: the server drops a second connection under the same one
                part = dataclasses.replace(spec, server_id=spec.server_id + i)
                self.readers.append(_Reader(part, routes, watched, a, b, deadline, 2 if i == 0 else self.AHEAD))
        except BaseException:
            self.close()
            raise
        self.part = 0

    def _handed_on(self, item):
        """A part's last batch ends at its cut: the next part follows, so it is not the end."""
        if (isinstance(item, _Decoded) and item.done and self.part < len(self.readers) - 1
                and item.end.key() == self.ends[self.part].key()):
            self.part += 1
            return dataclasses.replace(item, done=False)
        return item

    def get(self):
        return self._handed_on(self.readers[self.part].get())

    def get_nowait(self):
        return self._handed_on(self.readers[self.part].out.get_nowait())

    def close(self):
        for reader in self.readers:
            reader.close()


def _merged(reader: _Readers, limit: int = 8) -> _Decoded:
    """The next batch, merged with the batches already waiting behind it (in order, up to a DDL
    or the end): when writing is slower than reading, one write and one checkpoint cover them
    all, so the applier keeps up instead of falling behind by a Spark job per batch."""
    batch = reader.get()
    if isinstance(batch, BaseException):
        raise batch
    while not (batch.ddl or batch.done) and limit > 1:
        try:
            more = reader.get_nowait()
        except queue.Empty:
            return batch
        if isinstance(more, BaseException):
            raise more
        per_table = dict(batch.per_table)
        for source, count in more.per_table.items():
            per_table[source] = per_table.get(source, 0) + count
        batch = _Decoded(batch.start, more.end, batch.events + more.events, per_table, more.ddl, more.done,
                         more.last_event_at or batch.last_event_at,
                         [a + b for a, b in zip(batch.payloads, more.payloads)])
        limit -= 1
    return batch


def _apply_batches(spec: CdcApplySpec, session: LazySession, reader: _Readers, record, totals: dict, poll) -> _Decoded | None:
    """Write the reader's batches lane by lane and ``record`` each once all its writes are
    acknowledged; returns the last batch (done: the stop was reached; ddl: the reader must
    restart after it), or None when ``poll()`` says tables are waiting to join."""
    while True:
        batch = _merged(reader)
        crash_point("cdc.batch-read")
        payloads = [lane for lane in batch.payloads if lane]
        per_table = {source: [count, 0, 0] for source, count in batch.per_table.items()}
        if payloads:
            try:
                results = _write_lanes(spec, session, payloads, batch.events)
            except Exception:
                record(None, {t: [n, 0, n] for t, (n, _, _) in per_table.items()})
                raise
            for lane in results:
                for source, rows in lane:
                    per_table[source][1] += rows
                    totals["rows_written"] += rows
        crash_point("cdc.written")
        totals["events"] += batch.events
        record(batch, per_table)  # every write of the batch is acknowledged: now the checkpoint may pass it
        crash_point("cdc.checkpointed")
        if batch.ddl or batch.done:
            return batch
        if poll():
            return None


SPLIT_MIN_BYTES = 4 << 20  # a bounded range with fewer row-event bytes is read by one process


def _cuts(spec: CdcApplySpec, start: BinlogPosition, stop, deadline) -> list[BinlogPosition]:
    """Where a bounded range is split between ``spec.readers`` reader processes (none for a
    service, whose end is open, or a range with a DDL on it)."""
    if stop is None or deadline is not None or spec.readers < 2 or stop.key() <= start.key():
        return []
    cuts = split_backlog(backlog_events(spec.source, start, stop), spec.readers, SPLIT_MIN_BYTES) or []
    if cuts:
        print(f"[airflow-sync] pipeline {spec.pipeline!r}: {start} … {stop} read by {len(cuts) + 1} processes, split "
              f"at {', '.join(map(str, cuts))}", flush=True)
    return cuts


def _follow(spec: CdcApplySpec, session: LazySession, routes: dict, configs: list[dict], start: BinlogPosition, stop,
            deadline, record, totals: dict, checkpoints: Checkpoints, recopies: cdc_ddl.Recopies,
            poll=lambda: False) -> bool:
    """Apply ``routes``' changes from ``start`` until ``stop`` (True) or until ``poll()`` asks to
    stop early (False), following each DDL on the pipeline's tables (``configs``, those that
    left included) before reading on."""
    if stop is not None and stop.key() <= start.key():
        return True  # nothing to read (a service's blocking reader would wait for the next event)
    position = start
    while True:
        watched = frozenset(cdc_ddl.name_of(c) for c in configs)
        reader = _Readers(spec, routes, watched, position, stop, deadline, _cuts(spec, position, stop, deadline))
        try:
            batch = _apply_batches(spec, session, reader, record, totals, poll)
        finally:
            reader.close()
        if batch is None:
            return False
        position = batch.end
        if batch.ddl:
            statement, schema, after, _ = batch.ddl
            checkpoints.fence()  # the ALTERs and a re-copy write the copy: only under the lease
            changed, recopied = cdc_ddl.follow(spec, recopies, checkpoints.ch, routes, configs, statement, schema,
                                               after)
            totals["ddl"] += 1
            totals["recopied"] += recopied
            position = after
            # the DDL's effects and the tables' new shapes are recorded with the checkpoint past it
            record(dataclasses.replace(batch, end=after, events=0, last_event_at=0.0, ddl=None), {})
            if changed:
                print(f"[airflow-sync] pipeline {spec.pipeline!r}: {', '.join(changed)} changed at {after}: "
                      f"{statement[:200]}", flush=True)
        if batch.done:
            return True


def _join(spec: CdcApplySpec, session: LazySession, ch, checkpoints: Checkpoints, state: PipelineState, routes: dict,
          totals: dict, recopies: cdc_ddl.Recopies) -> list[str]:
    """Tables registered since the stream started (a bootstrap under way, a full load) join it:
    each first replays its own changes from where its copy began up to the checkpoint."""
    joined = []
    for table in checkpoints.tables(spec.pipeline):
        if table.joined:
            continue
        with mysql_reader.connect(spec.source) as conn:
            route = cdc_ddl.open_routes(conn, ch, [table.config])
        if table.since.key() < state.checkpoint.key():
            print(f"[airflow-sync] pipeline {spec.pipeline!r}: {table.name} replays {table.since} … "
                  f"{state.checkpoint} before joining", flush=True)

            def record(batch, per_table, table=table):
                if batch is not None:
                    table.since = batch.end
                    checkpoints.write_table(spec.pipeline, table)
                checkpoints.count(spec.pipeline, per_table)

            _follow(spec, session, route, [table.config], table.since, state.checkpoint, None, record, totals,
                    checkpoints, recopies)
        table.joined, table.since = True, state.checkpoint
        checkpoints.write_table(spec.pipeline, table)
        routes.update(route)
        state.tables.append(table.config)
        joined.append(table.name)
        print(f"[airflow-sync] pipeline {spec.pipeline!r}: {table.name} joined at {state.checkpoint}", flush=True)
    return joined


def run_cdc_apply(spec: CdcApplySpec, spark) -> dict:
    """``spark``: a SparkSession or a :class:`LazySession` (spark_jobs/cdc_apply.py), built only
    when a batch is too large for the driver to write (``driver_write_rows``)."""
    started = time.time()
    ch = target.client(spec.target)
    try:
        checkpoints = Checkpoints(ch, spec.ledger_database)
        checkpoints.ensure()
        loads = Ledger(ch, spec.ledger_database)
        loads.ensure()
        lease = Lease.acquire(spec.source, checkpoints, spec.pipeline)  # refused: names the holder
        try:
            # From here every ledger write checks the lease first (Checkpoints._fence): the
            # checkpoint after each batch, so also before the next batch's write and before a
            # DDL's ALTER, which follows its batch's checkpoint.
            checkpoints.lease = lease
            return _apply(spec, lazy(spark), ch, checkpoints, loads, lease, started)
        finally:
            lease.release()
    finally:
        ch.close()


def _apply(spec: CdcApplySpec, session: LazySession, ch, checkpoints: Checkpoints, loads: Ledger, lease: Lease,
           started: float) -> dict:
    previous = checkpoints.state(spec.pipeline)  # read under the lease: the last holder's final word
    state = PipelineState(spec.pipeline, PIPELINE_RUNNING, previous.checkpoint if previous else None,
                          previous.tables if previous else [], "", previous.source_position if previous else None,
                          previous.source_time if previous else 0.0,
                          previous.events if previous and not spec.reset else 0,
                          generation=lease.generation, holder=lease.holder)
    totals = {"events": 0, "rows_written": 0, "joined": [], "ddl": 0, "recopied": [], "verified": [],
              "repaired_shards": 0}
    stop, start, routes = None, None, {}
    try:
        checkpoints.write(state)  # from now on older generations' writes are ignored
        _await_tables(spec, checkpoints, state, previous, started)
        start, tables = _start(spec, previous, checkpoints, loads)
        state.checkpoint, state.tables = start, tables
        with mysql_reader.connect(spec.source) as conn:
            routes = cdc_ddl.open_routes(conn, ch, tables)
            preflight(conn, start, spec.source.user)
            stop = BinlogPosition.from_dict(spec.stop_position) or (None if spec.service else current_position(conn))
        state.source_position = stop
        checkpoints.write(state)
        print(f"[airflow-sync] pipeline {spec.pipeline!r}: {len(routes)} table(s) from {start} to "
              f"{stop or 'until stopped'}, {spec.lanes} lane(s), lease generation {lease.generation}", flush=True)
        _run(spec, session, ch, routes, checkpoints, state, stop, totals, started)
        state.status, state.error = PIPELINE_IDLE, ""
        checkpoints.write(state)
    except BaseException as exc:
        state.status, state.error = PIPELINE_FAILED, f"{type(exc).__name__}: {exc}"[:4000]
        if not lease.lost:  # else the state is the next holder's to write
            checkpoints.write(state)  # the checkpoint stays at the last durable batch
        if isinstance(exc, (BinlogError, ApplyFailed, LeaseError, ValueError)):
            raise
        raise ApplyFailed(f"pipeline {spec.pipeline!r} stopped at checkpoint {state.checkpoint}: "
                          f"{type(exc).__name__}: {exc}. Run it again to replay from there") from exc
    return {"pipeline": spec.pipeline, "tables": sorted(routes), "start": start.to_dict(),
            "checkpoint": state.checkpoint.to_dict(), "stop": stop.to_dict() if stop else None,
            **totals, "lanes": spec.lanes, "generation": lease.generation,
            "seconds": round(time.time() - started, 3)}


JOIN_POLL_SECONDS = 2.0  # how often a running pipeline looks for tables waiting to join


def _await_tables(spec: CdcApplySpec, checkpoints: Checkpoints, state: PipelineState, previous, started: float):
    """A service started for a new pipeline before any table joined it (e.g. ahead of the
    bootstrap) waits for the first table instead of failing; bounded runs do not wait."""
    if not spec.service or spec.tables or spec.start_from_loads or (previous and previous.checkpoint):
        return
    announced = False
    while not checkpoints.tables(spec.pipeline):
        if spec.max_seconds and time.time() - started > spec.max_seconds:
            raise ApplyFailed(f"pipeline {spec.pipeline!r}: no table joined within {spec.max_seconds:.0f} s")
        if not announced:
            print(f"[airflow-sync] pipeline {spec.pipeline!r}: waiting for a table to join (a bootstrap or a full "
                  "load given to start_from_loads)", flush=True)
            announced = True
        checkpoints.write(state)  # heartbeat: `cdc status` shows it waiting
        time.sleep(JOIN_POLL_SECONDS)


def _run(spec: CdcApplySpec, session: LazySession, ch, routes, checkpoints: Checkpoints, state: PipelineState, stop, totals: dict,
         started: float) -> None:
    """Follow the binlog from the checkpoint until the stop; tables registered meanwhile join,
    re-copies run beside the stream, tables due a verification are checked."""
    deadline = started + spec.max_seconds if spec.max_seconds else None

    def record(batch, per_table):
        if batch is not None:
            state.checkpoint, state.events = batch.end, state.events + batch.events
            state.source_time = batch.last_event_at or state.source_time
            checkpoints.write(state)
        checkpoints.count(spec.pipeline, per_table)

    polled = [time.monotonic()]

    def waiting() -> bool:
        if recopies.finished():
            return True
        if time.monotonic() - polled[0] < JOIN_POLL_SECONDS:
            return False
        polled[0] = time.monotonic()
        return (bool(_due(spec, state, routes, started, recopies))
                or any(not t.joined for t in checkpoints.tables(spec.pipeline)))

    def verify(due):
        _verify(spec, session, ch, routes, checkpoints, state, totals, record, recopies, due)

    recopies = cdc_ddl.Recopies(spec, session, checkpoints)
    try:
        recopies.resume(state.tables)  # a crashed applier's unfinished re-copies
        totals["recopied"] += _adopt_selected(spec, ch, routes, state, recopies)
        while True:
            recopies.collect()
            totals["joined"] += _join(spec, session, ch, checkpoints, state, routes, totals, recopies)
            if due := _due(spec, state, routes, started, recopies):
                verify(due)
            if _follow(spec, session, routes, state.tables, state.checkpoint, stop, deadline, record, totals,
                       checkpoints, recopies, waiting):
                break
        for name in list(recopies.running):  # a run ends with its re-copies done and recorded
            recopies.wait(name)
        checkpoints.write(state)
        if due := _due(spec, state, routes, started, recopies):  # a bounded run checks what it changed
            verify(due)
    finally:
        recopies.close()


def _adopt_selected(spec: CdcApplySpec, ch, routes: dict, state: PipelineState,
                    recopies: cdc_ddl.Recopies) -> list[str]:
    """Tables the pipeline's patterns select now that it does not have yet join it (copied
    beside the stream); later ones join as their CREATE / RENAME TABLE is read. Returns those
    being copied."""
    selection = TableSelection.of(spec.select)
    if selection is None:
        return []
    with mysql_reader.connect(spec.source) as conn:
        names = selection.resolve(conn)
    known = {cdc_ddl.name_of(c) for c in state.tables}
    new = [n for n in names if n not in known]
    print(f"[airflow-sync] pipeline {spec.pipeline!r}: {selection.to_dict()} selects {len(names)} table(s)"
          + (f"; {len(new)} join now: {', '.join(new)}" if new else ""), flush=True)
    copied = [n for n in new if recopies.adopt(ch, routes, state.tables, n, state.checkpoint, "selected by the patterns")]
    unstreamable = [f"{cdc_ddl.name_of(c)} ({c['unstreamable']})" for c in state.tables if c.get("unstreamable")]
    if unstreamable:
        print(f"[airflow-sync] pipeline {spec.pipeline!r}: not streamed: " + "; ".join(unstreamable), flush=True)
    recopies.checkpoints.write(state)
    return copied


def _due(spec: CdcApplySpec, state: PipelineState, routes: dict, started: float,
         recopies: cdc_ddl.Recopies) -> list[dict]:
    """The streaming tables to verify now: those a DDL touched since their last verification,
    with ``verify_every`` those not verified for that long, with ``verify`` those not verified
    in this run."""
    now = time.time()

    def last(config):
        return (config.get("verified") or {}).get("at", 0)

    return [c for c in state.tables if cdc_ddl.name_of(c) in routes and not recopies.busy(cdc_ddl.name_of(c))
            and ((spec.verify_after_ddl and c.get("verify_due")) or (spec.verify and last(c) < started)
                 or (spec.verify_every and now - last(c) >= spec.verify_every))]


VERIFY_ROUNDS = 3  # a repaired shard is looked at again; still different on the third look: stop


def _verify(spec: CdcApplySpec, session: LazySession, ch, routes: dict, checkpoints: Checkpoints,
            state: PipelineState, totals: dict, record, recopies: cdc_ddl.Recopies, configs: list[dict]) -> None:
    """Check ``configs``' tables against the source at a snapshot position S (spark/cdc_verify.py):
    apply up to S, compare per-shard checksums, repair mismatched shards, look at those again."""
    checks, shards = {}, None
    for look in range(1, VERIFY_ROUNDS + 1):
        began = time.time()
        with mysql_reader.connect(spec.source) as conn:  # catch up first: the snapshot is then held briefly
            now = current_position(conn)
        _follow(spec, session, routes, state.tables, state.checkpoint, now, None, record, totals, checkpoints,
                recopies)
        # a table may have left or begun a re-copy meanwhile
        configs = [c for c in configs if cdc_ddl.name_of(c) in routes and not recopies.busy(cdc_ddl.name_of(c))]
        if not configs:
            return
        snapshot = cdc_verify.prepare(spec, ch, checks, configs, shards)  # S; MySQL's checksums begin
        again = {}
        try:
            _follow(spec, session, routes, state.tables, state.checkpoint, snapshot.position, None, record, totals,
                    checkpoints, recopies)
            # the copy is at S: its checksums now (the stream stands still for them only) ...
            checked = [c for c in configs if cdc_ddl.name_of(c) in routes and not recopies.busy(cdc_ddl.name_of(c))]
            wrong = {cdc_ddl.name_of(c): cdc_verify.copy_checksums(ch, checks[cdc_ddl.name_of(c)],
                                                                   routes[cdc_ddl.name_of(c)].schema) for c in checked}
            # ... then the stream goes on while MySQL finishes the source's: a repair at S's repair
            # version ranks below every change after S, so it may be written once the stream is past S
            while not snapshot.ready(timeout=0.5):
                with mysql_reader.connect(spec.source) as conn:
                    now = current_position(conn)
                _follow(spec, session, routes, state.tables, state.checkpoint, now, None, record, totals,
                        checkpoints, recopies)
            checkpoints.fence()  # repairs write the copy: only under the lease
            for config in checked:
                name = cdc_ddl.name_of(config)
                check = checks[name]
                moved = name in routes and (cdc_verify.copy_columns(routes[name].schema)
                                            != cdc_verify.copy_columns(check.schema))
                if name not in routes or recopies.busy(name) or (moved and not wrong[name]):
                    config["verify_due"] = True  # it left, or a DDL changed it after S: look again later
                    continue
                if wrong[name]:
                    if recopies.start(ch, routes, routes[name].config,
                                      f"verification at {snapshot.position}: {wrong[name]}"):
                        totals["recopied"].append(name)
                    outcome = cdc_verify.record(routes[name].config, snapshot.position, len(check.plan.shards),
                                                [], len(check.plan.shards), 0, wrong[name], began=began)
                else:
                    mismatched = cdc_verify.mismatched(check)
                    if mismatched and look == VERIFY_ROUNDS:
                        raise ApplyFailed(
                            f"table {name}: its copy still differs from the source at {snapshot.position} in "
                            f"shards {mismatched} after {look - 1} repairs; the copy may hold values the checksums "
                            "cannot match (see docs/cdc.md, Verification). Re-bootstrap the table (restart=True)")
                    rows = cdc_verify.repair(spec, ch, snapshot, check, mismatched) if mismatched else 0
                    outcome = cdc_verify.record(routes[name].config, snapshot.position, len(check.ids),
                                                mismatched, len(mismatched), rows, began=began)
                    if mismatched:
                        again[name] = mismatched
                        print(f"[airflow-sync] pipeline {spec.pipeline!r}: {name} differed from the source at "
                              f"{snapshot.position} in {len(mismatched)} of {len(check.ids)} shard(s); "
                              f"repaired ({rows:,} rows rewritten)", flush=True)
                totals["verified"].append({"table": name, "look": look} | outcome)
                totals["repaired_shards"] += outcome["repaired_shards"]
        finally:
            snapshot.close()
        checkpoints.write(state)  # the verdicts travel with the checkpoint (cdc status shows them)
        if not again:
            return
        shards = again
        configs = [c for c in configs if cdc_ddl.name_of(c) in again]

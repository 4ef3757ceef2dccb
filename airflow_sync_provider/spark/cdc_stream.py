"""The CDC applier's stream: binlog ranges decoded in reader processes, written by apply lanes.

A range of the binlog (:class:`ReadRange`) is decoded by python-mysql-replication in a process
of its own (pure Python: it would otherwise share the driver's interpreter with the writes'
bookkeeping), which turns each batch of complete transactions — or piece of a large one
(core/cdc/binlog/batches.Batch) — into per-lane Arrow payloads (routes by hash(table, primary key) on
the ring). A bounded range with enough row-event bytes is split between reader processes
(:class:`Readers`), after commits or inside a large transaction; their batches are handed on
in binlog order. The driver writes a batch's lanes in parallel (:func:`write_lanes`): threads of the
driver for a batch of at most ``driver_write_rows`` changes, Spark tasks above.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import multiprocessing
import multiprocessing.forkserver
import os
import queue
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from airflow_sync_provider.core.cdc.binlog.backlog import backlog_events, split_backlog
from airflow_sync_provider.core.cdc.binlog.batches import MidTransaction
from airflow_sync_provider.core.cdc.binlog.reader import BinlogReader, Watch, batches
from airflow_sync_provider.core.cdc.binlog.routes import TableRoute
from airflow_sync_provider.core.cdc.cascades import Rows, gathered
from airflow_sync_provider.core.cdc.ring import HashRing
from airflow_sync_provider.core.cdc.staging import stage_table
from airflow_sync_provider.core.clickhouse.client import shared_client
from airflow_sync_provider.core.clickhouse.columns import WEIGHT_SETTINGS
from airflow_sync_provider.core.crash_points import crash_point
from airflow_sync_provider.core.jobspec import CdcApplySpec
from airflow_sync_provider.core.positions import BinlogError, BinlogPosition
from airflow_sync_provider.core.selection import TableSelection
from airflow_sync_provider.core.source import reader as mysql_reader
from airflow_sync_provider.core.source.weights import SPLIT_WEIGHT_COLUMN, weights_of
from airflow_sync_provider.spark.cdc_history import HistoryRows, history_lane
from airflow_sync_provider.spark.entry import without_pandas

log = logging.getLogger(__name__)


class ApplyFailed(RuntimeError):
    """The run failed for a reason a retry may cure (it replays from the checkpoint)."""


@dataclass
class ReadRange:
    """What a reader decodes: ``routes``' changes from ``start`` until ``stop`` (None: until
    stopped) or ``deadline``; a DDL on a ``watched`` name (or a name ``selection`` matches) ends
    a batch so the applier follows it before reading on."""

    routes: dict[str, TableRoute]
    watched: frozenset
    start: BinlogPosition | MidTransaction  # a share of a split range may begin or end inside a transaction
    stop: BinlogPosition | MidTransaction | None
    deadline: float | None = None
    selection: dict | None = None
    prepared: dict | None = None  # XA transactions prepared before ``start`` (BinlogReader): xid → position
    parents: dict | None = None  # tables whose row events cascade into ``routes``' (core/cdc/binlog/parents.py)
    children: frozenset = frozenset()  # ``routes``' tables a cascade can change (Watch.children)

    def part(self, start, stop) -> "ReadRange":
        return dataclasses.replace(self, start=start, stop=stop)


@dataclass
class Decoded:
    """A batch as the reader process hands it to the driver: positions, counts, lane payloads."""

    start: BinlogPosition
    end: BinlogPosition  # before ``ddl`` when there is one
    events: int
    per_table: dict
    ddl: tuple | None  # (statement, schema, position after it, timestamp)
    done: bool
    last_event_at: float
    payloads: list
    prepared: dict = dataclasses.field(default_factory=dict)  # XA transactions open at ``end``
    xa_commits_unseen: int = 0  # Batch.xa_commits_unseen
    through: BinlogPosition | None = None  # a piece of a transaction still open (Batch.through)
    staging: list = dataclasses.field(default_factory=list)  # lane payloads into staging tables (Batch.staging)
    stage: BinlogPosition | None = None  # where the XA transaction they belong to began
    staged_ends: list = dataclasses.field(default_factory=list)  # Batch.staged_ends
    # Batch.cascades, its changes of the children numbered (core/cdc/cascades.gathered): resolved
    # before the batch is written; ``changed``: those rows per table, shaped as the copy holds them
    cascades: list = dataclasses.field(default_factory=list)
    changed: dict = dataclasses.field(default_factory=dict)
    history: dict = dataclasses.field(default_factory=dict)  # source → [history rows, their versions' sum]

    @property
    def alone(self) -> bool:
        """Never merged with another batch: a piece (claimed apart) or staging rows (one transaction's)."""
        return self.through is not None or self.stage is not None

    def merged(self, more: "Decoded") -> "Decoded":
        per_table = dict(self.per_table)
        for source, count in more.per_table.items():
            per_table[source] = per_table.get(source, 0) + count
        history = {s: list(c) for s, c in self.history.items()}
        for source, (rows, total) in more.history.items():
            history[source] = [history.get(source, [0, 0])[0] + rows, history.get(source, [0, 0])[1] + total]
        return Decoded(self.start, more.end, self.events + more.events, per_table, more.ddl, more.done,
                       more.last_event_at or self.last_event_at, [a + b for a, b in zip(self.payloads, more.payloads)],
                       more.prepared, self.xa_commits_unseen + more.xa_commits_unseen,
                       staged_ends=self.staged_ends + more.staged_ends, cascades=self.cascades or more.cascades,
                       changed=self.changed or more.changed, history=history)

    def joins(self, more: "Decoded", children: frozenset) -> bool:
        """Can ``more`` be written with this batch? Not alone, and not with cascades to resolve
        against copies this batch changes first (its changes of the children are not in ``more``'s
        items): one batch's cascades at most."""
        return not more.alone and (not more.cascades or not (self.cascades or children.intersection(self.per_table)))


def _latest(route: TableRoute, rows, deleted) -> list[int] | None:
    """Per place (the key, and the layout's columns: TableRoute.keyed) only its last change in the
    batch (the highest version: the one FINAL keeps): their indices, None for all of them in order
    (a copy's history takes every change: spark/cdc_history.py).

    A row that moves (core/clickhouse/layout.py) leaves a tombstone of its old values at the same
    version as its new row; when the layout's expressions put both in one sorting key and
    partition after all (a date moved within its month), ReplacingMergeTree keeps the row
    inserted last of two equal versions: so the tombstones go first."""
    if route.multiset:  # every occurrence counts: nothing is replaced
        return None
    last = dict(zip(map(route.place_getter, rows), range(len(rows))))
    if len(last) == len(rows) and not (route.moves and any(deleted)):
        return None
    return sorted(last.values(), key=lambda i: (not deleted[i], i)) if route.moves else sorted(last.values())


# A batch of at most this many row changes is written by one insert per target table: lanes pay
# off for large batches, while each insert of a small one costs the target a part (and the chDB
# stand-in a statement), which at a service's 0.5 s batches over many tables is the bottleneck.
ONE_LANE_EVENTS = 10_000
# A partitioned copy costs ClickHouse a part per partition each insert touches (about 2 ms a part
# on the stand-in, bench/results/layouts.md): a pipeline that follows one cuts its batches at this
# many times batch_events, so its inserts are that much larger and fewer (batch_bytes, the memory
# bound, stays as it is).
PARTITIONED_BATCHES = 4


def _lane_payloads(batch, routes: dict[str, TableRoute], lanes: int, weigh: Weigher,
                   combine: bool = True) -> tuple[list[list[tuple]], dict]:
    """Per lane (index = lane): [(target database, target table, ((source table, rows), …), Arrow
    IPC bytes)]. ``combine``: the source tables of one target table (a merged copy's members) in
    one insert per lane, a small batch in one lane (ONE_LANE_EVENTS), and a partitioned copy's rows
    in one insert: a key is in one lane only, so nothing is lost by joining them. A copy that keeps
    a history: every change made Arrow once, the copy's rows taken from it, and the history's
    rows in one more lane (spark/cdc_history.py). Also returns the history's counts per table."""
    one_lane = combine and batch.events <= ONE_LANE_EVENTS
    tables: list[list[list]] = [[] for _ in range(lanes)]  # per lane: [target db, target table, counts, Arrow]
    every: dict = defaultdict(list)  # source table → [(Arrow of all its changes in a lane, their flags)]
    for source, per_lane in batch.lanes.items():
        route = routes[source]
        for lane, (rows, versions, deleted) in per_lane.items():
            keep, where = _latest(route, rows, deleted), f"table {source}, binlog {batch.start}…{batch.end}"
            if route.history is not None:
                table = weigh(route, route.arrow(rows, versions, deleted, where))
                every[source].append((table, deleted))
                table = table if keep is None else table.take(keep)
            else:
                if keep is not None:
                    rows, versions, deleted = ([c[i] for i in keep] for c in (rows, versions, deleted))
                # a table split on a collated key: its rows carry their weight
                table = weigh(route, route.arrow(rows, versions, deleted, where))
            # a partitioned copy (core/clickhouse/layout.py) takes a part per partition per insert: its
            # rows of a batch go in one insert, not one per lane (lanes x partitions parts)
            into = tables[0 if one_lane or (combine and route.partitioned) else lane]
            _add(into, (route.target_database, route.target_table), table, combine)[source] += table.num_rows
            if route.also is not None and combine:  # a reshape's old copy: the same rows, not counted twice
                _add(into, route.also, table, combine)  # (a staged transaction's reach it at its commit: staging.py)
    payloads = [[(database, name, tuple(counts.items()), _ipc(pa.concat_tables(parts)))
                 for database, name, counts, parts in lane] for lane in tables]
    history, counts = history_lane(batch, routes, every, _ipc) if every else ([], {})
    return payloads + [history], counts


def _cascade_items(batch, routes: dict[str, TableRoute], weigh: Weigher) -> tuple[list, dict]:
    """A batch's cascade items (core/cdc/cascades.gathered) and its changed rows of the children
    per table as Arrow, shaped and checked as its lanes' rows are (with a collated split key's
    weight): the copy's rows as they will be."""
    items, rows = gathered(batch.cascades)
    gone: dict = defaultdict(list)
    for item in items:
        if isinstance(item, Rows):
            gone[item.table] += item.gone
    changed = {}
    for table, raw in rows.items():
        route = routes[table]
        data = route.arrow(raw, [0] * len(raw), [int(g) for g in gone[table]],
                           f"table {table}, binlog {batch.start}…{batch.end}")
        changed[table] = weigh(route, data.select(route.names))
    return items, changed


class Weigher:
    """The collation weights a batch's rows of a table split on a collated key carry
    (core/source/weights.py), from one source connection, opened when first needed."""

    def __init__(self, endpoint):
        self.endpoint, self.conn = endpoint, None

    def __call__(self, route: TableRoute, table: pa.Table) -> pa.Table:
        if route.weight is None:
            return table
        self.conn = self.conn or mysql_reader.connect(self.endpoint)
        values = table.column(route.weight.name).to_pylist()
        return table.append_column(SPLIT_WEIGHT_COLUMN, pa.array(weights_of(self.conn, route.weight, values),
                                                                 pa.binary()))

    def __enter__(self) -> "Weigher":
        return self

    def __exit__(self, *exc) -> None:
        if self.conn is not None:
            self.conn.close()


def _add(into: list, target: tuple[str, str], table: pa.Table, combine: bool) -> dict:
    """``table`` into a lane's entry for ``target`` (one of the same columns, when ``combine``);
    returns the entry's rows per source table."""
    same = next((t for t in into if combine and tuple(t[:2]) == target and t[3][0].schema.equals(table.schema)), None)
    if same is None:
        into.append(same := [*target, defaultdict(int), []])
    same[3].append(table)
    return same[2]


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _write_lane(endpoint, items: list[tuple]) -> list[tuple[str, int]]:
    """On an executor or a driver thread: one lane's tables, in order. Returns (source table, rows) per source table."""
    ch = shared_client(endpoint)
    out = []
    for item in items:
        database, table, counts, data = item
        rows = pa.ipc.open_stream(data).read_all()
        ch.insert_arrow(table, rows, database=database,
                        settings=WEIGHT_SETTINGS if SPLIT_WEIGHT_COLUMN in rows.column_names else None)
        out.extend(counts)
        crash_point("cdc.history-write" if isinstance(item, HistoryRows) else "cdc.lane-write")
    return out


def write_lanes(spec: CdcApplySpec, session, payloads: list, changes: int) -> list:
    """Every lane's writes, in parallel; returns when all are acknowledged."""
    if changes > spec.driver_write_rows:
        session.start()  # in the background: until it is up, the driver writes these too
        if session.ready or spec.driver_write_rows == 0:
            return (session.get().sparkContext.parallelize(payloads, len(payloads))
                    .map(lambda items: _write_lane(spec.target, items)).collect())
    with ThreadPoolExecutor(len(payloads), thread_name_prefix="lane") as pool:
        return list(pool.map(lambda items: _write_lane(spec.target, items), payloads))


def _hand_over(out, item, halt, process: bool) -> bool:
    """Put ``item`` on the queue; False when the driver stopped us or is gone (killed: a reader
    ``process`` must not outlive it holding a binlog connection; else a thread of the driver)."""
    driver = multiprocessing.parent_process() if process else None  # the forkserver's client: the driver
    while not halt.is_set() and (driver is None or driver.is_alive()):
        try:
            out.put(item, timeout=1.0)
            return True
        except queue.Full:
            continue
    if process:  # nobody reads the queue any more: exit without flushing what it buffers
        out.cancel_join_thread()
    return False


def _read_batches(spec: CdcApplySpec, part: ReadRange, out, halt, process: bool, waiting=None) -> None:
    """The reader process: decode complete transactions of ``part`` and turn them into lane
    payloads (the CPU-heavy part, a core of its own), handing each batch over in order.
    ``waiting``: set while the applier waits for a batch (a service's: a batch goes at once then)."""
    if process:
        without_pandas()  # as the driver does (a fork server's child did not run the job's entry)
    try:
        reader = BinlogReader(spec.source, part.start, part.routes, HashRing(spec.lanes, spec.vnodes), spec.server_id,
                              blocking=spec.service,
                              watch=Watch(part.watched, TableSelection.of(part.selection), part.prepared,
                                          part.parents, children=part.children,
                                          ready=waiting.is_set if waiting is not None else None))
        # a service checkpoints every batch_seconds; a bounded run cuts batches by size (each
        # batch costs a Spark job and a checkpoint), with a time cap so progress is recorded
        seconds = spec.batch_seconds if spec.service else max(spec.batch_seconds, 30.0)
        events = spec.batch_events * (PARTITIONED_BATCHES if any(r.partitioned for r in part.routes.values()) else 1)
        try:
            for batch in batches(reader, part.stop, events, seconds, spec.batch_bytes):
                # a service's time is up at a commit: a transaction it is inside is finished first
                if part.deadline is not None and time.time() >= part.deadline and batch.through is None:
                    batch.done = True
                with Weigher(spec.source) as weigh:  # one connection for the batch's weights, if any
                    payloads, history = _lane_payloads(batch, part.routes, spec.lanes, weigh)
                    decoded = Decoded(batch.start, batch.end, batch.events, dict(batch.per_table), batch.ddl,
                                      batch.done, batch.last_event_at, payloads, batch.prepared,
                                      batch.xa_commits_unseen, batch.through,
                                      _staging_payloads(spec, batch, part.routes, weigh),
                                      batch.staging.start if batch.staging else None, batch.staged_ends,
                                      *_cascade_items(batch, part.routes, weigh), history=history)
                if not _hand_over(out, decoded, halt, process) or batch.done or batch.ddl:
                    break
        finally:
            reader.close()
    except BaseException as exc:  # handed to the driver, which fails the run
        _hand_over(out, exc if isinstance(exc, BinlogError)
                   else ApplyFailed(f"binlog reader: {type(exc).__name__}: {exc}"), halt, process)


def _staging_payloads(spec: CdcApplySpec, batch, routes: dict[str, TableRoute], weigh: Weigher) -> list[list[tuple]]:
    """The lane payloads of ``batch.staging``, addressed to the XA transaction's staging tables."""
    if batch.staging is None:
        return []
    return [[(spec.ledger_database, stage_table(spec.pipeline, batch.staging.start, counts[0][0]), counts, data)
             for _, _, counts, data in lane]
            for lane in _lane_payloads(batch.staging, routes, spec.lanes, weigh, combine=False)[0][:spec.lanes]]


def reader_processes():
    """Where reader processes come from: forks of one fork server that imported this module and
    the job's entry script once (the driver itself has JVM gateway threads: it must not fork).
    A spawned reader imported them itself, ≈1.5 CPU-s each: a group's eight readers starting at
    once on 2 cores saw their first change ≈9 s late. The fork server starts on the first call;
    call this early to have it warm when the first reader is needed."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["__main__", __name__])
    multiprocessing.forkserver.ensure_running()
    return context


class _Reader:
    """Runs :func:`_read_batches` in a process of its own (:func:`reader_processes`), or
    (``inline``: a range too small to be worth a process's start, which the first time includes
    the fork server's: a fresh interpreter importing everything) in a driver thread."""

    def __init__(self, spec: CdcApplySpec, part: ReadRange, ahead: int = 2, inline: bool = False):
        if inline:
            self.out, self.halt, self.waiting = queue.Queue(maxsize=ahead), threading.Event(), threading.Event()
            self.process = threading.Thread(target=_read_batches, name="binlog-reader", daemon=True,
                                            args=(spec, part, self.out, self.halt, False,
                                                  self.waiting if spec.service else None))
        else:
            context = reader_processes()
            self.out, self.halt, self.waiting = context.Queue(maxsize=ahead), context.Event(), context.Event()
            self.process = context.Process(target=_read_batches, daemon=True,
                                           args=(spec, part, self.out, self.halt, True,
                                                 self.waiting if spec.service else None))
        self.process.start()

    def get(self):
        self.waiting.set()  # a service's reader hands its batch over at the next commit
        try:
            while True:
                try:
                    return self.out.get(timeout=5)
                except queue.Empty:
                    if not self.process.is_alive():
                        raise ApplyFailed("the binlog reader died (exit code "
                                          f"{getattr(self.process, 'exitcode', None)})") from None
        finally:
            self.waiting.clear()

    def close(self):
        self.halt.set()
        while self.process.is_alive():  # unblock a reader waiting to hand over a batch
            try:
                self.out.get(timeout=0.1)
            except queue.Empty:
                self.process.join(0.1)
        self.process.join()


SPLIT_MIN_BYTES = 4 << 20  # a bounded range with fewer row-event bytes is read by one process
MAX_READERS = 8  # each holds a replication connection and its own interpreter (≈100 MB)
CPU_MAX = Path("/sys/fs/cgroup/cpu.max")  # cgroup v2: the CPU quota of the driver's group
INLINE_MAX_BYTES = 1 << 20  # a bounded range of fewer binlog bytes is read in a driver thread


def driver_cores() -> int:
    """The cores this driver may use: its CPU affinity, lowered by a cgroup's CPU quota (a
    container's limit, which the affinity does not show)."""
    cores = len(os.sched_getaffinity(0))
    try:  # cgroup v2: "<quota> <period>" or "max <period>"
        quota, period = CPU_MAX.read_text().split()
    except (OSError, ValueError):
        return cores
    return cores if quota == "max" else max(1, min(cores, math.ceil(int(quota) / int(period))))


def reader_count(spec: CdcApplySpec) -> int:
    """``spec.readers``, or one reader process per core of the driver (at most MAX_READERS)."""
    return spec.readers or min(MAX_READERS, driver_cores())


def _binlog_bytes(part: ReadRange) -> int | None:
    """The binlog bytes of a bounded range in one file (None: open-ended or across files)."""
    start, stop = part.start, part.stop
    if stop is None or part.deadline is not None or not isinstance(start, BinlogPosition) or \
            not isinstance(stop, BinlogPosition) or start.file != stop.file or start.epoch != stop.epoch:
        return None
    return max(0, stop.pos - start.pos)


def cuts(spec: CdcApplySpec, part: ReadRange) -> list[BinlogPosition | MidTransaction]:
    """Where a bounded range is split between :func:`reader_count` reader processes (none for a
    service, whose end is open, or a range with a DDL on it): after commits, or inside a
    transaction larger than a share."""
    start, stop, readers = part.start, part.stop, reader_count(spec)
    size = _binlog_bytes(part)
    if (stop is None or part.deadline is not None or readers < 2 or stop.key() <= start.key()
            or part.prepared  # a parked XA transaction's commit must reach the reader that holds its rows
            or size is not None and size < SPLIT_MIN_BYTES):  # fewer row-event bytes still: not worth a look
        return []
    found = split_backlog(backlog_events(spec.source, start, stop), readers, SPLIT_MIN_BYTES, start) or []
    if any(r.history is not None for r in part.routes.values()):  # a share begun inside a transaction has
        found = [c for c in found if isinstance(c, BinlogPosition)]  # not read its GTID event (commits.py)
    if found:
        log.info(f"pipeline {spec.pipeline!r}: {start} … {stop} read by {len(found) + 1} processes, split "
              f"at {', '.join(map(str, found))}")
    return found


class Readers:
    """``part`` split between reader processes at :func:`cuts` (core/cdc/binlog/backlog.split_backlog),
    each decoding its share at once; their batches are handed on in binlog order, so the
    checkpoint still only moves forward over applied batches (a share that ends inside a
    transaction ends with a piece, and the next share's first batches are its further pieces).
    A later share's reader decodes ahead into a deeper queue while the earlier ones are applied."""

    AHEAD = 32  # batches the later shares' readers may decode ahead in all (≈ 5–7 MB each at 50k
    # changes): split between them, so the memory bound does not grow with the readers (the cores)

    def __init__(self, spec: CdcApplySpec, part: ReadRange):
        bounds = [part.start, *cuts(spec, part), part.stop]
        self.ends = bounds[1:]
        ahead = max(2, self.AHEAD // max(1, len(bounds) - 2))  # per later share
        self.readers = []
        try:
            for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
                # each its own replica id: the server drops a second connection under the same one
                share = dataclasses.replace(spec, server_id=spec.server_id + i)
                size = _binlog_bytes(part) if len(bounds) == 2 else None
                self.readers.append(_Reader(share, part.part(a, b), 2 if i == 0 else ahead,
                                            inline=size is not None and size < INLINE_MAX_BYTES))
        except BaseException:
            self.close()
            raise
        self.index = 0
        self.children = part.children
        self._held = None  # a batch taken while merging that must go on its own (Decoded.joins)

    def _handed_on(self, item):
        """A share's last batch ends at its cut (a piece: read through it): the next share
        follows, so it is not the end."""
        if (isinstance(item, Decoded) and item.done and self.index < len(self.readers) - 1
                and (item.through or item.end).key() == self.ends[self.index].key()):
            self.index += 1
            return dataclasses.replace(item, done=False)
        return item

    def get(self):
        return self._handed_on(self.readers[self.index].get())

    def get_nowait(self):
        return self._handed_on(self.readers[self.index].out.get_nowait())

    def next_batch(self, limit: int = 8) -> Decoded:
        """The next batch, merged with the batches already waiting behind it (in order, up to a
        DDL or the end): when writing is slower than reading, one write and one checkpoint cover
        them all, so the applier keeps up instead of falling behind by a Spark job per batch.
        Pieces and staging rows go alone."""
        batch, self._held = self._held or self.get(), None
        if isinstance(batch, BaseException):
            raise batch
        while not (batch.ddl or batch.done or batch.alone) and limit > 1:
            try:
                more = self.get_nowait()
            except queue.Empty:
                return batch
            if isinstance(more, BaseException):
                raise more
            if not batch.joins(more, self.children):
                self._held = more
                return batch
            batch = batch.merged(more)
            limit -= 1
        return batch

    def close(self):
        for reader in self.readers:
            reader.close()

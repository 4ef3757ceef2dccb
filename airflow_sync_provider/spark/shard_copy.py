"""The shard loop a full load and a CDC bootstrap share: one run object per copied table.

:class:`ShardCopy` holds the copy's context — its load spec, plan, copy decisions
(:class:`Copy`), ledger state — and its steps are methods:

* driver side: :meth:`ShardCopy.run` hands each channel a queue of the unfinished shards
  (round-robin, like DataX task groups) under a :class:`~airflow_sync_provider.spark.channels.Progress`
  heartbeat, records a failed Spark job in the ledger; :meth:`ShardCopy.settle` takes the shards
  as the channels left them and fails the load, naming its failed shards, when any did not succeed;
* channel side (a Spark task or a driver thread): :meth:`ShardCopy.channel` drains a queue,
  :meth:`ShardCopy.copy_shard` copies one shard (its running record, its inserts, success or
  failure, the final report), :meth:`ShardCopy.write` streams a read's batches into the inserts
  with their version.

What differs between the two copies is in their subclasses, a few hooks each:
``full_load.FullLoadCopy`` reads a shard whole (its pieces), clears what an earlier attempt
wrote and writes to the load's working table, published later; ``cdc_bootstrap.BootstrapCopy``
reads a shard in key chunks on the channel's own source connection, each chunk a snapshot of
its own, straight into the live copy, and counts a chunk only once it is durable.
"""

from __future__ import annotations

import collections
import logging
import queue
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import pyarrow as pa

from airflow_sync_provider.core.clickhouse.client import shared_client
from airflow_sync_provider.core.clickhouse.columns import ORDINAL_COLUMN, SHARD_COLUMN, SIGN_COLUMN, VERSION_COLUMN
from airflow_sync_provider.core.clickhouse.inserts import ArrowInserts, Sent
from airflow_sync_provider.core.clickhouse.layout import Layout
from airflow_sync_provider.core.failures import SOURCE, TARGET, Outage, ServerUnreachable, common
from airflow_sync_provider.core.flow_control import Throttle
from airflow_sync_provider.core.guard import SourcePing, target_answers
from airflow_sync_provider.core.jobspec import FullLoadSpec
from airflow_sync_provider.core.ledger import Ledger
from airflow_sync_provider.core.loads import (
    LOAD_FAILED,
    SHARD_FAILED,
    SHARD_RUNNING,
    SHARD_SUCCESS,
    LoadState,
    ShardState,
)
from airflow_sync_provider.core.positions import EPOCH_SHIFT, snapshot_version
from airflow_sync_provider.core.source.planning import Plan, Shard
from airflow_sync_provider.core.source.weights import SPLIT_WEIGHT_COLUMN, Weights
from airflow_sync_provider.core.typemap import MySQLColumn
from airflow_sync_provider.core.verify.reports import shard_table
from airflow_sync_provider.spark.channels import Progress, run_channels

log = logging.getLogger(__name__)

REPORT_EVERY_SECONDS = 1.0  # live hook counters: a running shard's report to the ledger
# a channel's shared insert ends at the first shard end after this long: a read shard is reported
# success within a few seconds (a person or a test watching), and its parts stay large
SHARED_INSERT_SECONDS = 3.0


ORDINAL_SHARD_SHIFT = 40  # a multiset copy's row ordinal: the shard's id above, the row's index below

MAX_TRIES = 5  # a shard failed by a passing cause (core/failures.py) is read again up to this often in a run


class LoadFailed(RuntimeError):
    pass


class LockLost(LoadFailed):
    """The job's lock on the source is gone: another run may own the load now, so this one
    writes nothing more, to the copy or to the ledger."""

    retry_helps = True


@dataclass(frozen=True)
class Copy:
    """How every channel copies its shards, decided once by the driver."""

    mappings: list
    weight: MySQLColumn | None  # a collated split column: rows carry its collation weight
    text_sql: str  # the mysqlclient reader's SELECT list
    native_sql: str | None  # the Arrow-native reader's, None when mysqlclient reads
    mariadb: bool  # the native read takes MariaDB's own snapshot position (else one read before)
    direct: bool  # rows go to a table of the final layout (else a parts table, a partition per shard)
    split: MySQLColumn | None = None
    weights: Weights | None = None  # the cuts' collation weights, for the direct layout's deletes
    # a merged copy's member (core/source/group.py): the filter of its rows on the target, and
    # where its shards' ids start in the group's shared parts table
    member: tuple = ("1", {})
    shard_base: int = 0
    layout: Layout = Layout()  # the copy's (core/clickhouse/layout.py): the working table's when direct
    # a table without a key into a multiset copy (core/clickhouse/clickhouse.SIGN_COLUMN): each row +1,
    # told apart by its ordinal within the read (the shard's id in its top bits)
    multiset: bool = False
    epoch: int = 0  # the source server's epoch (core/cdc/servers.py): the top byte of its reads' versions

    def names(self) -> list[str]:
        return ([m.name for m in self.mappings] + ([SPLIT_WEIGHT_COLUMN] if self.weight else [])
                + [VERSION_COLUMN] + ([] if self.direct else [SHARD_COLUMN])
                + ([ORDINAL_COLUMN, SIGN_COLUMN] if self.multiset else []))


class RowVersion:
    """The ``_version`` a read's rows take: known before the read (a position read first, or the
    load's own version without a binlog), or MariaDB's own snapshot position, which the native
    reader puts in ``holder["snapshot"]`` before its first batch (core/positions.py)."""

    def __init__(self, value: int | None, holder: dict, repair: bool = False, epoch: int = 0):
        self.value, self.holder, self.repair, self.epoch = value, holder, repair, epoch

    def get(self) -> int:
        if self.value is None:  # MariaDB's snapshot position as one number, of the server's epoch
            self.value = snapshot_version(self.holder["snapshot"] | self.epoch << EPOCH_SHIFT, self.repair)
        return self.value


class Channel:
    """What one channel holds for one copy while it drains its queue: a target client and the
    ledger on it, one throttle (DataX flow control), what a subclass adds (a source connection),
    and the output it shares with the channel's other copies (:class:`ChannelOutput`)."""

    def __init__(self, spec: FullLoadSpec):
        self.ch = shared_client(spec.target)
        self.ledger = Ledger(self.ch, spec.ledger_database)
        self.throttle = Throttle(spec.channel_record_speed, spec.channel_byte_speed)
        self.conn = None  # a source connection of the channel's own, if the copy keeps one
        self.kind = None  # that source's flavour
        self.at_start: LoadState | None = None  # the load as the ledger had it when the channel started
        self.output: ChannelOutput | None = None  # set by the channel's loop (_drain)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


class ChannelOutput:
    """One channel's inserts across its shards (of one copy, or of a source group's members):
    a stream per target table, shared by the shards one after another, so small shards make a
    few large parts (core/clickhouse/inserts.py), and the shards read but not yet acknowledged. A
    held shard is reported (success, or failed naming its insert's error) as soon as every insert
    carrying its rows is answered, a batch of them in one ledger write; the channel reads on
    meanwhile. Never ahead of the data: a shard is success only once its rows are durable;
    a crash before its report re-reads it (clearing what it wrote)."""

    def __init__(self):
        self.streams: dict = {}
        self.ledgers: dict = {}
        self.held: list[tuple["ShardCopy", Channel, ShardState, Sent]] = []
        self.again: list[tuple["ShardCopy", ShardState]] = []  # failed by a passing cause: to read again

    def join(self, channel: Channel) -> Channel:
        """A copy's channel joins the output; the channel's copies on one ledger database share one
        ledger writer, so the report times of a shard's records (live, then final, written by
        whichever copy's turn it is) increase, and the records of several copies go in one insert."""
        channel.output = self
        first = self.ledgers.setdefault((channel.ledger.database, id(channel.ch)), channel.ledger)
        channel.ledger = first
        return channel

    def stream(self, key, make) -> ArrowInserts:
        if key not in self.streams:
            self.streams[key] = make()
        return self.streams[key]

    def hold(self, copier: "ShardCopy", channel: Channel, record: ShardState, sent: Sent) -> None:
        self.held.append((copier, channel, record, sent))
        self.report()

    def report(self) -> None:
        """Report the held shards whose inserts are answered (in order: a shard's rows are sent
        after the earlier shards')."""
        ready = 0
        while ready < len(self.held) and self.held[ready][3].done():
            ready += 1
        if not ready:  # the common case, checked after every batch a channel writes
            return
        done, self.held = self.held[:ready], self.held[ready:]
        for copier, _, record, sent in done:
            error = sent.error()
            record.status = SHARD_SUCCESS if error is None else SHARD_FAILED
            if error is not None:
                record.error = f"the insert of its rows failed: {type(error).__name__}: {error}"[:4000]
                record.count_unacknowledged()
                failure = copier.failures[record.shard_id] = copier.outage.failed(error, TARGET)
                if failure.transient:
                    self.again.append((copier, record))
            record.finished_at = time.time()
        by_ledger: dict[int, tuple] = {}  # one write for all (a source group's members' too)
        for copier, channel, record, _ in done:
            by_ledger.setdefault(id(channel.ledger), (channel.ledger, copier, []))[2].append(
                (copier.state.load_key, copier.state.generation, record))
        for ledger, copier, entries in by_ledger.values():
            copier.record(lambda ledger=ledger, entries=entries: ledger.write_shards_of(entries),
                          f"recording {len(entries)} shard(s)")

    def close(self) -> None:
        """End every stream, wait for its answers and report the shards still held (a stream is
        made again if a shard read again needs it)."""
        streams, self.streams = list(self.streams.values()), {}
        for inserts in streams:
            inserts.close()
        self.report()


class ShardCopy:
    """One table's shards copied by channels: the loop a full load and a bootstrap share.

    ``spec``: the copy as the ledger knows it (a full load's spec; a bootstrap's table has one
    too); ``plan``: its shards; ``copy``: how they are read and written; ``state``: the load's
    ledger state (the driver's, when the channels start). The driver's ``ledger`` stays on the
    driver: an executor gets the rest (pickled with the channels' loop, :func:`_drain`).
    """

    # a channel's shards share its inserts (ChannelOutput), each reported once its rows are
    # acknowledged; else each shard's rows are acknowledged before its report
    shares_inserts = False

    def __init__(self, spec: FullLoadSpec, plan: Plan, copy: Copy, state: LoadState, ledger: Ledger):
        self.spec, self.plan, self.copy, self.state, self.ledger = spec, plan, copy, state, ledger
        self.shards = {s.id: s for s in plan.shards}
        self.announced: dict[int, ShardState] = {}  # running records the driver wrote for its threads
        # the job's one bounded wait for its servers (core/failures.py), shared by its channels
        self.outage = Outage(spec.failure_wait_seconds, {
            TARGET: f"ClickHouse {spec.target.host}:{spec.target.port}",
            SOURCE: f"MySQL {spec.source.host}:{spec.source.port}" if spec.source is not None else ""})
        self.tries: dict[int, int] = {}  # shard -> reads in this run
        self.failures: dict = {}  # shard -> what its last failure means (core/failures.Failure), in the driver
        self.stopping: Callable[[], str] = lambda: ""  # why the job must stop writing (its lock is lost)

    def __getstate__(self):
        return {k: v for k, v in vars(self).items() if k not in ("ledger", "stopping")}

    def __setstate__(self, state):
        self.__dict__.update(state, stopping=lambda: "")

    def record(self, write: Callable[[], None], what: str) -> bool:
        """A ledger write, retried while the target is unreachable within the job's bound; False
        when the bound passed first (the record is left to the next run, which trusts no shard
        left running and reads it again)."""
        try:
            self.outage.call(write, what)
            return True
        except ServerUnreachable as exc:
            log.info(f"not recorded: {exc}")
            return False

    # --- the driver ---------------------------------------------------------------------

    def run(self, session, in_driver: bool) -> list[dict]:
        """Copy the unfinished shards, ``channels`` at a time (threads of the driver or Spark
        tasks: spark/channels.py); returns each shard's final record. A channel's task failing
        outright is recorded in the ledger (a retry then resumes at once) and raised."""
        return run_together([self], session, self.plan.channels, in_driver)[0]

    def settle(self, per_shard: list[dict], in_driver: bool) -> LoadState:
        """The load's shards once the channels are done: the driver threads' own records, or
        what the executors reported to the ledger (attempts of re-run tasks included). When a
        shard did not succeed, the load is marked failed and :meth:`shards_failed` raised."""
        if in_driver:
            for record in per_shard:
                self.state.shards[record["shard_id"]] = ShardState(**{k: v for k, v in record.items()
                                                                      if k != "seconds"})
        else:
            self.state = self.outage.call(lambda: self.ledger.state(self.spec.load_key), "reading the shards' records")
        state = self.state
        failed = [i for i in (s["id"] for s in state.plan["shards"])
                  if i not in state.shards or state.shards[i].status != SHARD_SUCCESS]
        if failed:
            errors = "; ".join(f"shard {i}: {state.shards[i].error}" for i in failed if i in state.shards)
            state.status, state.error = LOAD_FAILED, f"shards {failed} failed: {errors}"[:4000]
            self.record(lambda: self.ledger.write_load(state), "recording the load's failure")
            log.info("%s", shard_table([vars(s) | {"seconds": s.seconds} for s in state.shards.values()]))
            error = self.shards_failed()
            error.failure = common([self.failures[i] for i in failed if i in self.failures]
                                   if all(i in self.failures for i in failed) else [])
            raise error
        return state

    def before_channels(self, session, todo: list[int], in_driver: bool) -> None:
        """Hook: the driver's last step before the channels start."""

    def job_error(self, exc: Exception) -> str:
        """Hook: the ledger's error text when a channel's task failed outright."""
        return f"{type(exc).__name__}: {exc}"

    def job_failed(self, exc: Exception) -> Exception | None:
        """Hook: what to raise then (None: the task's own exception)."""
        return None

    def shards_failed(self) -> Exception:
        """Hook: what to raise when shards failed (``self.state.error`` names them)."""
        return LoadFailed(f"table {self.state.source_table}: {self.state.error}")

    # --- a channel ----------------------------------------------------------------------

    def copy_one(self, channel: Channel, shard_id: int) -> ShardState:
        """One shard on an open channel: its record (skipped when an earlier run of the task
        finished it); final, or final once the channel's output answers for it."""
        shard = self.shards[shard_id]
        record = self.start_record(channel, shard)
        if record.status == SHARD_RUNNING:  # else finished already, by an earlier run of this task
            record = self.copy_shard(channel, shard, record)
            self.after_shard(channel, record)
        return record

    def copy_shard(self, channel: Channel, shard: Shard, record: ShardState) -> ShardState:
        """Copy one shard: recorded as running before any row is written (so a re-read knows
        rows may be there), read and written (:meth:`read`), then its final report, retried
        while the ledger is unreachable (a failure must be recorded). A copy whose shards share
        the channel's inserts (:attr:`shares_inserts`) leaves a read shard to the channel's
        output, which reports it once the inserts carrying its rows are acknowledged."""
        inserts = self.inserts(channel, record)
        try:
            if shard.id not in self.announced:
                channel.ledger.write_shard(self.state.load_key, self.state.generation, record)
            self.read(channel, shard, record, inserts)
            if self.shares_inserts:
                inserts.end_if_older(SHARED_INSERT_SECONDS)
                channel.output.hold(self, channel, record, inserts.sent())
                return record
            record.status = SHARD_SUCCESS
        except Exception as exc:
            inserts.settle()  # every insert answered: the shards held before this one too
            record.status, record.error = SHARD_FAILED, f"{type(exc).__name__}: {exc}"[:4000]
            record.version = record.version or 0
            if not self.stopping():
                failure = self.failures[shard.id] = self.outage.failed(exc)
                if failure.transient:
                    channel.output.again.append((self, record))
        finally:
            if not self.shares_inserts:
                inserts.close()
        record.finished_at = time.time()
        self.record(lambda: channel.ledger.write_shard(self.state.load_key, self.state.generation, record),
                    f"recording shard {shard.id}")
        if self.shares_inserts:
            channel.output.report()
        return record

    def write(self, channel: Channel, inserts: ArrowInserts, shard: Shard, batches, version: RowVersion,
              live: ShardState | None = None) -> tuple[int, int]:
        """Stream one read's ``batches`` into ``inserts`` with their version (and the shard's id
        in the parts layout), within the channel's speed limits; returns (rows, bytes) once all
        of it is acknowledged (sent, with :attr:`shares_inserts`). ``live``: the shard's record,
        counted as rows go and reported to the ledger every second (a sensor or a person watches
        a running load), and the owner of its rows in the inserts."""
        names, rows_total, bytes_total = self.copy.names(), 0, 0
        reported = time.monotonic()
        for batch in batches:
            if why := self.stopping():
                raise LockLost(why)
            rows = batch.num_rows
            tail = [pa.repeat(pa.scalar(version.get(), pa.uint64()), rows)]
            if not self.copy.direct:
                tail.append(pa.repeat(pa.scalar(self.copy.shard_base + shard.id, pa.uint32()), rows))
            if self.copy.multiset:
                first = (shard.id << ORDINAL_SHARD_SHIFT) + rows_total
                tail += [pa.array(range(first, first + rows), pa.uint64()), pa.repeat(pa.scalar(1, pa.int8()), rows)]
            if live is not None:
                live.version = version.value
                live.count_read(rows, batch.nbytes)
            inserts.write(pa.RecordBatch.from_arrays([*batch.columns, *tail], names=names), live)
            rows_total, bytes_total = rows_total + rows, bytes_total + batch.nbytes
            channel.throttle.account(rows, batch.nbytes)
            if live is not None and time.monotonic() - reported >= REPORT_EVERY_SECONDS:
                channel.ledger.write_shard(self.state.load_key, self.state.generation, live)
                reported = time.monotonic()
            if channel.output is not None and channel.output.held:
                channel.output.report()  # earlier shards whose inserts were answered meanwhile
        if not self.shares_inserts:
            inserts.finish()
        return rows_total, bytes_total

    def open_channel(self, in_driver: bool) -> Channel:
        """Hook: the channel's clients (a subclass may add a source connection)."""
        return Channel(self.spec)

    def start_record(self, channel: Channel, shard: Shard) -> ShardState:
        """Hook: the shard's record for this attempt (running), or its finished one to skip it."""
        raise NotImplementedError

    def inserts(self, channel: Channel, record: ShardState) -> ArrowInserts:
        """Hook: where the shard's rows go."""
        raise NotImplementedError

    def read(self, channel: Channel, shard: Shard, record: ShardState, inserts: ArrowInserts) -> None:
        """Hook: read the shard and write it (:meth:`write`), counting into ``record``."""
        raise NotImplementedError

    def after_shard(self, channel: Channel, record: ShardState) -> None:
        """Hook: after a shard's final report (e.g. a fresh connection after a failure)."""


def run_together(copiers: list[ShardCopy], session, channels: int, in_driver: bool) -> list[list[dict]]:
    """The unfinished shards of several copies (one table's, or a source group's members') copied
    by one set of ``channels``, the largest shards first; returns each copy's final records. In
    the driver a channel takes the next shard whoever's it is, so one slow source keeps one
    channel busy, not the others idle; as Spark tasks each channel gets a fixed queue, balanced by
    estimated rows. A channel opens a copy's connections when it first takes one of its shards.
    A channel's task failing outright is recorded in every copy's ledger state and raised; a server
    that stayed unreachable past the job's bound (core/failures.py) raises
    :class:`~airflow_sync_provider.core.failures.ServerUnreachable`, the job's lock lost
    :class:`LockLost` (then nothing more is written: another run may own the load)."""
    items = sorted(((i, shard_id) for i, copier in enumerate(copiers) for shard_id in copier.state.todo()),
                   key=lambda item: -(copiers[item[0]].shards[item[1]].estimated_rows or 0))
    out: list[list[dict]] = [[] for _ in copiers]
    if not items:
        return out
    for copier in copiers[1:]:  # one bounded wait for the whole job
        copier.outage = copiers[0].outage
    channels = max(1, min(channels, len(items)))
    try:
        with Progress(copiers[0].spec, [(c.state, c.state.todo()) for c in copiers]):
            for copier in copiers:
                copier.before_channels(session, copier.state.todo(), in_driver)
            announced = [(c.state.load_key, c.state.generation, r) for c in copiers for r in c.announced.values()]
            if announced:  # running records written before the channels start: one write for all
                copiers[0].outage.call(lambda: copiers[0].ledger.write_shards_of(announced), "recording the shards")
            if in_driver:
                work = queue.SimpleQueue()
                for item in items:
                    work.put(item)
                with ThreadPoolExecutor(channels, thread_name_prefix="channel") as pool:
                    done = [r for records in pool.map(lambda _: _drain(copiers, work, True), range(channels))
                            for r in records]
            else:
                queues, weights = [[] for _ in range(channels)], [0] * channels
                for item in items:  # longest first onto the least loaded queue
                    j = weights.index(min(weights))
                    queues[j].append(item)
                    weights[j] += (copiers[item[0]].shards[item[1]].estimated_rows or 0) + 1
                done = run_channels(session, queues, lambda q, _: _drain(copiers, q, False), False)
    except Exception as exc:
        if why := copiers[0].stopping():
            raise LockLost(why) from exc
        for copier in copiers:
            copier.state.status, copier.state.error = LOAD_FAILED, copier.job_error(exc)[:4000]
            copier.record(lambda c=copier: c.ledger.write_load(c.state), "recording the load's failure")
        failure = copiers[0].job_failed(exc)
        if failure is None:
            raise
        raise failure from exc
    if why := copiers[0].stopping():
        raise LockLost(why)
    outage = copiers[0].outage
    if outage.expired:
        error = outage.unreachable("copying the shards")
        for copier in copiers:  # what can be recorded (the target may be the one that is down)
            copier.state.status, copier.state.error = LOAD_FAILED, str(error)[:4000]
            try:
                copier.ledger.write_load(copier.state)
            except Exception:  # noqa: BLE001 - the next run trusts no shard left running
                pass
        raise error
    for i, record in done:
        out[i].append(record)
    return out


def _drain(copiers: list[ShardCopy], work, in_driver: bool) -> list[tuple[int, dict]]:
    """One channel: the shards of ``work`` (a shared queue in the driver, a list on an executor),
    each on the channel of its copy (opened when first needed); (copy index, record) each.

    A shard failed by a passing cause (a server restarting, TOO_MANY_PARTS: core/failures.py) is
    read again (up to :data:`MAX_TRIES` times), once its server answers; while a server is down
    the channel starts no new shard. When the job's bound passes first, or its lock is lost, the
    channel stops and leaves the rest unread (the next run reads them)."""
    opened: dict[int, Channel] = {}
    output = ChannelOutput()
    items = iter(lambda: _next(work), None) if isinstance(work, queue.SimpleQueue) else iter(work)
    again: collections.deque = collections.deque()
    outage, probes = copiers[0].outage, _probes(copiers)
    out: dict[tuple[int, int], ShardState] = {}
    try:
        while True:
            _read_again(copiers, output, again)
            if copiers[0].stopping() or (outage.down and not outage.wait_until_up(probes)):
                break
            item = again.popleft() if again else next(items, None)
            if item is None:
                output.close()  # its last inserts' answers may fail shards: read those again
                if output.again:
                    continue
                break
            i, shard_id = item
            if i not in opened:
                try:
                    opened[i] = output.join(copiers[i].open_channel(in_driver))
                except Exception as exc:
                    if not outage.failed(exc).transient:
                        raise
                    again.appendleft(item)
                    continue
            out[item] = copiers[i].copy_one(opened[i], shard_id)
        output.close()
    finally:  # on a failure too: no insert thread outlives the channel (closing twice is harmless)
        for inserts in output.streams.values():
            inserts.close()
        for channel in opened.values():
            channel.close()
    return [(i, vars(record) | {"seconds": record.seconds}) for (i, _), record in out.items()]


def _read_again(copiers: list[ShardCopy], output: ChannelOutput, again: collections.deque) -> None:
    """Queue the shards ``output`` holds as failed by a passing cause for another read: the
    failed record becomes the one the next attempt starts from (its attempt number, a
    bootstrap's resume key)."""
    failed, output.again = output.again, []
    for copier, record in failed:
        tries = copier.tries[record.shard_id] = copier.tries.get(record.shard_id, 1) + 1
        if tries > MAX_TRIES or copier.stopping() or copier.outage.expired:
            continue
        copier.state.shards[record.shard_id] = record
        copier.announced.pop(record.shard_id, None)
        again.append((copiers.index(copier), record.shard_id))
        log.info(f"shard {record.shard_id} is read again (try {tries} of {MAX_TRIES}) once its server answers: "
                 f"{record.error[:300]}")


def _probes(copiers: list[ShardCopy]) -> dict:
    """How a waiting channel asks whether its servers answer again (core/failures.Outage)."""
    sources = {c.spec.source for c in copiers if c.spec.source is not None}
    pings = [SourcePing(s) for s in sources]
    ch = shared_client(copiers[0].spec.target)

    def source() -> None:
        try:
            for ping in pings:
                ping()
        finally:
            for ping in pings:
                ping.close()

    return {TARGET: lambda: target_answers(ch), SOURCE: source}


def _next(work: queue.SimpleQueue):
    try:
        return work.get_nowait()
    except queue.Empty:
        return None

"""A channel's rows into one ClickHouse table as a few large, streamed INSERTs.

Each INSERT (``FORMAT ArrowStream``) stays open while the channel reads: its body is sent
batch by batch from a short queue as the rows arrive, and it ends at ``max_rows`` /
``max_bytes`` / ``max_seconds`` or when the caller asks. Why:

* **Few parts.** Every INSERT makes a part that ClickHouse merges later; 65,536-row inserts
  cost the chDB stand-in about 1.4 CPU-s per million rows, 1M-row inserts 0.9
  (bench/results/full_load.md). Streaming makes an insert's size free for the client.
* **Bounded memory.** The client holds the queue (a few read batches) and one batch being
  serialised, never a whole insert body (clickhouse-connect's ``insert_arrow`` builds the
  body, then copies it to prepend the statement).
* **Reading and writing overlap.** Serialising, compressing and sending run on the insert's
  thread (all release the GIL) while the channel reads the next rows.

``max_rows`` stays below ClickHouse's ``min_insert_block_size_rows`` (1,048,449), so the server
normally makes one part per insert, and a body cut short (the client died) writes nothing; the
callers do not rely on it: a shard or chunk read again first clears what an earlier attempt
wrote. An insert that waits long for rows (a slow source, a speed limit) is kept alive with
empty batches; ClickHouse would otherwise time the request out.

One stream may carry the rows of several owners (a channel's shards, one after another, into one
working table): every write names its owner, the callbacks count rows per owner, and
:meth:`ArrowInserts.sent` names the inserts that carry what was written so far, so an owner is
recorded done once those are acknowledged while the channel already reads the next one. Many
small shards (a source group's tables) then make a few large parts instead of one each: merging
those was what cost most (10M rows on the chDB stand-in: 192 parts of 64 tables whose ids overlap
took 27.6 CPU-s of merges, one table's 20 parts 5.6; bench/results/source_groups.md).
"""

from __future__ import annotations

import queue
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import pyarrow as pa

MAX_ROWS = 1_000_000
MAX_BYTES = 128 * 1024 * 1024  # Arrow bytes; a ClickHouse block of them stays under 256 MB
MAX_SECONDS = 10.0  # the hook counters' "written" moves at least this often
KEEPALIVE_SECONDS = 5.0
QUEUE_BATCHES = 2
# The rows' own work is done: no need to merge equal keys inside an insert's block (a shard or
# chunk holds each key once); FINAL and merges still resolve versions across inserts.
SETTINGS = {"optimize_on_insert": 0}

_END = object()


class _Chunks:
    """A write-only file for Arrow's IPC writer: what it wrote since the last :meth:`take`. The
    writer hands a batch's body buffers over as Arrow buffers (its own or the batch's, immutable:
    kept by reference, not copied) and the framing between them as small bytes."""

    closed = False

    def __init__(self):
        self.parts: list = []

    def write(self, data) -> int:
        self.parts.append(data if isinstance(data, (bytes, pa.Buffer)) else bytes(data))
        return len(data)

    def flush(self) -> None:
        pass

    def take(self) -> list:
        """The parts written since the last take, consecutive small ones joined: each goes out as
        one HTTP chunk (the body's bytes are copied once, into the chunk's framing)."""
        out, small = [], []
        for part in self.parts:
            if isinstance(part, bytes):
                small.append(part)
                continue
            if small:
                out.append(b"".join(small))
                small = []
            out.append(part)
        if small:
            out.append(b"".join(small))
        self.parts = []
        return out


class _Insert:
    def __init__(self):
        self.queue: queue.Queue = queue.Queue(QUEUE_BATCHES)
        self.rows = 0
        self.bytes = 0
        self.opened = time.monotonic()
        self.future = None
        self.counted = False  # its outcome reached the callbacks
        self.owners: list[list] = []  # [owner, rows] in the order written


class Sent:
    """The inserts carrying the rows written up to some point: :meth:`done` once all are
    answered, :meth:`error` the first failure then (None: every row is acknowledged)."""

    def __init__(self, futures: list):
        self.futures = futures

    def done(self) -> bool:
        return all(f.done() for f in self.futures)

    def error(self) -> BaseException | None:
        return next((f.exception() for f in self.futures if f.exception() is not None), None)


@dataclass(frozen=True)
class InsertLimits:
    """Where one insert ends: at ``rows`` rows, ``bytes`` Arrow bytes or ``seconds`` open, or once it
    holds rows of ``owners`` owners (None: any number)."""

    rows: int = MAX_ROWS
    bytes: int = MAX_BYTES
    seconds: float = MAX_SECONDS
    owners: int | None = None


class ArrowInserts:
    """Streamed INSERTs into ``table_sql`` (quoted, e.g. ``ch_table(db, t)``; ``ch``: a
    session-less clickhouse-connect client, as ``clickhouse.shared_client``, since one insert may
    still be acknowledged while the next streams). ``write`` batches of one schema; ``finish``
    ends the open insert and waits until every insert is acknowledged (raising the first
    failure). ``on_written(rows, owner)`` runs (on the insert's thread) when an insert is
    acknowledged, ``on_failed(rows, owner)`` (on the caller's) when one failed, once per owner of
    its rows. At most one insert is open and one more may be awaiting its acknowledgement.
    ``limits``: where an insert ends (:class:`InsertLimits`; a parts table's partitions: at most
    100 owners in one insert, ClickHouse refuses more). ``compression``: the Arrow IPC body's
    (the endpoint's ``insert_compression``: core/endpoints.py)."""

    def __init__(self, ch, table_sql: str, *, settings: dict | None = None, compression: str | None = None,
                 limits: InsertLimits = InsertLimits(), on_written: Callable[[int, object], None] | None = None,
                 on_failed: Callable[[int, object], None] | None = None):
        self.ch, self.table_sql = ch, table_sql
        self.settings = {**SETTINGS, **(settings or {})}
        self.options = pa.ipc.IpcWriteOptions(compression=compression) if compression else None
        self.max_rows, self.max_bytes, self.max_seconds = limits.rows, limits.bytes, limits.seconds
        self.max_owners = limits.owners
        self.on_written = on_written or (lambda rows, owner: None)
        self.on_failed = on_failed or (lambda rows, owner: None)
        self.pool = ThreadPoolExecutor(2, thread_name_prefix="insert")
        self.open: _Insert | None = None
        self.ending: _Insert | None = None

    def write(self, batch: pa.RecordBatch, owner=None) -> None:
        if self.open is not None and self.max_owners is not None and len(self.open.owners) >= self.max_owners \
                and self.open.owners[-1][0] is not owner:
            self._end()
        if self.open is None:
            self.open = _Insert()
            self.open.future = self.pool.submit(self._send, self.open, batch.schema)
        insert = self.open
        self._put(insert, batch)
        insert.rows += batch.num_rows
        insert.bytes += batch.nbytes
        if insert.owners and insert.owners[-1][0] is owner:
            insert.owners[-1][1] += batch.num_rows
        else:
            insert.owners.append([owner, batch.num_rows])
        if (insert.rows >= self.max_rows or insert.bytes >= self.max_bytes
                or time.monotonic() - insert.opened >= self.max_seconds):
            self._end()

    def end_if_older(self, seconds: float) -> None:
        """End the open insert if it has been open ``seconds`` (an owner's end: its rows are
        then acknowledged soon, not when the stream's later owners have filled the insert)."""
        if self.open is not None and time.monotonic() - self.open.opened >= seconds:
            self._end()

    def sent(self) -> Sent:
        """The inserts that carry every row written so far (the open one goes on taking rows:
        it is answered once it ends, by size, age or :meth:`finish`)."""
        return Sent([i.future for i in (self.ending, self.open) if i is not None])

    def finish(self) -> None:
        """End the open insert and wait for every acknowledgement; raises an insert's error."""
        try:
            self._end()
        finally:
            self._collect()

    def settle(self) -> None:
        """:meth:`finish` without raising (the shard or chunk already failed)."""
        try:
            self.finish()
        except Exception:
            pass

    def close(self) -> None:
        self.settle()
        self.pool.shutdown()

    def __enter__(self) -> "ArrowInserts":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- internals -----------------------------------------------------------------------------

    def _put(self, insert: _Insert, item) -> None:
        while True:
            try:
                insert.queue.put(item, timeout=1.0)
                return
            except queue.Full:
                if insert.future.done():  # it stopped taking rows: it failed
                    self._outcome(insert)
                    raise RuntimeError(f"the insert into {self.table_sql} ended before its rows were sent") from None

    def _end(self) -> None:
        """End the open insert; it is acknowledged in the background while the next one streams
        (the one before it is waited for here)."""
        insert, self.open = self.open, None
        if insert is None:
            return
        self._put(insert, _END)
        previous, self.ending = self.ending, insert  # set first: a failure below still leaves it to collect
        if previous is not None:
            self._outcome(previous)

    def _collect(self) -> None:
        insert, self.ending = self.ending, None
        if insert is not None:
            self._outcome(insert)

    def _outcome(self, insert: _Insert) -> None:
        """Wait for ``insert``; raise its error (its rows counted as failed, once)."""
        try:
            insert.future.result()
        except BaseException:
            if not insert.counted:
                insert.counted = True
                for owner, rows in insert.owners:
                    self.on_failed(rows, owner)
            raise

    def _send(self, insert: _Insert, schema: pa.Schema) -> None:
        """The insert's thread. Its rows count as written as soon as ClickHouse acknowledged
        them (the channel's live counters); every row was handed over before ``_END``."""
        self.ch.raw_insert(self.table_sql, schema.names, self._body(insert, schema), settings=self.settings,
                           fmt="ArrowStream")
        insert.counted = True
        for owner, rows in insert.owners:
            self.on_written(rows, owner)

    def _body(self, insert: _Insert, schema: pa.Schema):
        sink = _Chunks()
        writer = pa.ipc.new_stream(sink, schema, options=self.options)
        yield from sink.take()
        while True:
            try:
                item = insert.queue.get(timeout=KEEPALIVE_SECONDS)
            except queue.Empty:
                item = pa.RecordBatch.from_pylist([], schema=schema)  # keeps the request alive
            if item is _END:
                break
            writer.write_batch(item)
            yield from sink.take()
        writer.close()
        yield from sink.take()

"""Channels: where a copy's shards are read and written, and the driver-side machinery around them.

A full load, a CDC bootstrap, a reconciliation and a snapshot diff hand each channel a queue of
shards. Channels run as Spark tasks on a cluster's executors, or as threads of the driver for a
small table or on a local master (then no SparkContext is started at all): executors of
``local[N]`` would be processes of this same machine, adding the SparkContext's start-up and
CPU while spreading nothing (connectorx and the HTTP inserts release the GIL, so the threads do
run in parallel).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator

from airflow_sync_provider.core.clickhouse.client import shared_client
from airflow_sync_provider.core.endpoints import MySQLEndpoint
from airflow_sync_provider.core.ledger import Ledger
from airflow_sync_provider.core.loads import SHARD_RUNNING, LoadState, ShardState, executor_address
from airflow_sync_provider.core.series import SeriesWriter

log = logging.getLogger(__name__)

DRIVER_COPY_ROWS = 300_000  # on a cluster: tables up to this size are copied by the driver


def driver_copy_limit(configured: int | None, session) -> float:
    """Tables estimated at no more rows are copied (reconciled, diffed) by the driver's threads
    (``driver_copy_rows``; None: all of them on a local master, :data:`DRIVER_COPY_ROWS` on a
    cluster; 0: never)."""
    if configured is not None:
        return configured
    return math.inf if session.local else DRIVER_COPY_ROWS


def running_record(source: MySQLEndpoint, shard, attempt: int) -> ShardState:
    """A shard's ledger record as its channel starts it (written before any of its rows)."""
    return ShardState(shard.id, attempt, SHARD_RUNNING, shard.where, list(shard.params), started_at=time.time(),
                      executor=executor_address(source.host, source.port))


def run_channels(session, queues: list[list[int]], channel: Callable[[list[int], bool], Iterator[dict]],
                 in_driver: bool) -> list[dict]:
    """Every channel's per-shard records: ``channel(queue, in_driver)`` for each queue, as a thread
    of the driver or as one Spark task (``session``: a :class:`LazySession`)."""
    if in_driver:
        with ThreadPoolExecutor(len(queues), thread_name_prefix="channel") as pool:
            return [r for records in pool.map(lambda q: list(channel(q, True)), queues) for r in records]
    context = session.get().sparkContext
    return (context.parallelize(queues, len(queues))
            .mapPartitions(lambda qs: (r for q in qs for r in channel(q, False)))
            .collect())


class Progress(threading.Thread):
    """Driver-side: keeps the loads' heartbeats (one load, or a source group's members) and logs
    each shard as it finishes. ``loads``: (state, shard ids to do) each."""

    LOOKS = 4  # loads whose shards one tick reads (a group of many: in turns)

    def __init__(self, spec, loads: list[tuple[LoadState, list[int]]]):
        super().__init__(daemon=True)
        self.spec, self.loads = spec, [(state, set(todo)) for state, todo in loads]
        self.stop = threading.Event()

    def run(self):
        ledger = Ledger(shared_client(self.spec.target), self.spec.ledger_database)
        series = SeriesWriter(ledger.ch, ledger.database)  # the Sync view's progress chart (core/series.py)
        seen, turn = set(), 0
        named = len(self.loads) > 1  # a group's shards are named with their table
        while not self.stop.wait(2.0):
            looked = [self.loads[(turn + i) % len(self.loads)] for i in range(min(self.LOOKS, len(self.loads)))]
            turn += len(looked)
            try:
                ledger.write_heartbeat(*(state for state, _ in self.loads))
                found = [(state, todo, ledger.shards(state.load_key, state.generation)) for state, todo in looked]
            except Exception as exc:  # the target may be briefly unreachable; the shards record it
                log.info(f"progress: ledger unreachable ({type(exc).__name__})")
                continue
            series.loads([(state, shards) for state, _, shards in found])
            for state, todo, shards in found:
                for shard in sorted(shards.values(), key=lambda s: s.shard_id):
                    key = (state.load_key, shard.shard_id, shard.attempt)  # a shard read again is logged again
                    if shard.shard_id in todo and shard.status != SHARD_RUNNING and key not in seen:
                        seen.add(key)
                        log.info(f"{state.source_table + ' ' if named else ''}shard {shard.shard_id} {shard.status}: "
                                 f"{shard.records_written:,} rows, {shard.bytes / 1e6:.1f} MB, {shard.seconds:.1f} s"
                                 + (f" — {shard.error}" if shard.error else ""))

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.join()

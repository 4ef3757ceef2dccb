"""Ledger contents for the Sync view's tests, written through the ledger's own writers (with a
clock the test sets, so rows can be old): loads with shards in any state, pipelines, task
instances, reconciliations; and ``whole_database``, a ledger as a job over the 200-table
database of bench/whole_database.py leaves it."""

from __future__ import annotations

import time
import uuid

from airflow_sync_provider.core.cdc.checkpoints import Checkpoints, PipelineState
from airflow_sync_provider.core.cdc.tables import PipelineTable
from airflow_sync_provider.core.ledger import TASK_LOAD, TASK_PIPELINE, Ledger, TaskRef
from airflow_sync_provider.core.loads import LoadState, ShardState
from airflow_sync_provider.core.positions import BinlogPosition


class Clocked:
    """Report times from ``self.at`` (default: now) instead of the wall clock."""

    at: float | None = None

    def _stamp(self) -> float:
        if self.at is None:
            return super()._stamp()
        self.at += 1e-6
        return self.at


class FillLedger(Clocked, Ledger):
    pass


def fresh(ch, kind, prefix: str):
    """A fixture's body: a ``kind`` (a ledger or a series book) in a database of its own, made
    and dropped afterwards."""
    book = kind(ch, f"{prefix}_{uuid.uuid4().hex[:8]}")
    book.ensure()
    yield book
    ch.command(f"DROP DATABASE IF EXISTS {book.database}")


class FillCheckpoints(Clocked, Checkpoints):
    pass


def add_load(ledger: FillLedger, key: str, source: str, target: str, status: str, shards: list,
             estimated_rows: int = 1_000, at: float | None = None, heartbeat: bool = False, error: str = "",
             generation: int = 1, planned: int | None = None) -> LoadState:
    """A load of ``planned`` shards (default: as many as ``shards``), of which ``shards`` (each
    ``(status, read, written, failed, error)``) have a newest attempt; written ``at`` (default now)."""
    planned = len(shards) if planned is None else planned
    plan = {"shards": [{"id": i, "where": "1=1", "params": [], "estimated_rows": estimated_rows // max(1, planned)}
                       for i in range(planned)]}
    state = LoadState(key, generation, status, source, target, plan, f"parts_{abs(hash(key))}", 1, {"load_key": key},
                      error)
    ledger.at = at
    started = (at or time.time()) - 30
    for i, (shard_status, read, written, failed, shard_error) in enumerate(shards):
        state.shards[i] = ShardState(i, 1, shard_status, "1=1", [], read, written, failed, read * 40, started,
                                     None if shard_status == "running" else started + 5, shard_error)
    ledger.write_load(state)
    if state.shards:
        ledger.write_shards(key, generation, list(state.shards.values()))
    if heartbeat:
        ledger.write_heartbeat(state)
    ledger.at = None
    return state


def add_pipeline(ch, database: str, name: str, status: str, tables: list[str], behind_seconds: float = 0.0,
                 at: float | None = None, error: str = "", events: int = 0, verified: dict | None = None,
                 recopying: str = "", seen: bool = True) -> PipelineState:
    """A pipeline whose last report was ``at`` (default now): caught up, or behind the source by
    ``behind_seconds`` (its last applied change that old); ``seen=False``: the source's position
    never read (a run that failed before its first look)."""
    book = FillCheckpoints(ch, database)
    book.ensure()
    configs = [PipelineTable.of(t) for t in tables]
    if verified:
        configs[0].verified, configs[0].verifications = verified, 1
    if recopying:
        configs[-1].recopying = {"reason": recopying, "position": {"file": "mysql-bin.000001", "pos": 4},
                                 "started": time.time() - 60}
    checkpoint = BinlogPosition("mysql-bin.000003", 1_000)
    source = BinlogPosition("mysql-bin.000003", 9_000 if behind_seconds else 1_000) if seen else None
    state = PipelineState(name, status, checkpoint, configs, error, source,
                          time.time() - behind_seconds if behind_seconds else time.time(), events)
    book.at = at
    book.write(state)
    return state


def add_task(ledger: Ledger, kind: str, key: str, dag_id: str, task_id: str, run_id: str, map_index: int = -1):
    ledger.write_task(kind, key, TaskRef(dag_id, task_id, run_id, map_index, 1))


def whole_database(ch, database: str, tables: int = 200, failed: tuple = (17, 88, 150), running: int = 42,
                   shards: int = 11, job: str = "sync_whole_db.load_all.manual__2026-01-05T00:00:00+00:00") -> dict:
    """A job of many tables over ``tables`` tables (bench/whole_database.py's names, ``shards``
    shards each): those in ``failed`` with two failed shards, ``running`` under way (4 shards
    done), the rest published; a pipeline 900 s behind (``lagging_cdc``) and one caught up; the
    job's task instance for every table. Returns the names the test looks for."""
    from bench.whole_database import layout

    book = FillLedger(ch, database)
    book.ensure()
    names = list(layout(tables - 10, 10, 1_000_000))[:tables]
    now = time.time()
    keys = []
    for i, name in enumerate(names):
        key = f"{job}:bench_whole.{name}"
        keys.append(key)
        rows = 1_000_000 if name.startswith("b") else 20_000
        per = rows // shards
        if i in failed:
            states = [("success", per, per, 0, "")] * (shards - 2) + [
                ("failed", 10, 0, 10, f"DataError: {name}: value out of range for shard"), ("failed", 0, 0, 0,
                                                                                          "connection reset")]
            add_load(book, key, f"bench_whole.{name}", f"bench_whole.{name}", "failed", states, rows, at=now - 600)
        elif i == running:
            states = [("success", per, per, 0, "")] * 4 + [("running", per // 2, per // 2, 0, "")] * 2
            add_load(book, key, f"bench_whole.{name}", f"bench_whole.{name}", "running", states, rows,
                     heartbeat=True, planned=shards)
        else:
            add_load(book, key, f"bench_whole.{name}", f"bench_whole.{name}", "published",
                     [("success", per, per, 0, "")] * shards, rows, at=now - 3600 - i)
    add_task(book, TASK_LOAD, job, "sync_whole_db", "load_all", "manual__2026-01-05T00:00:00+00:00")
    add_pipeline(ch, database, "lagging_cdc", "running", ["bench_whole.s000_int", "bench_whole.s001_varchar"],
                 behind_seconds=900, events=123_456)
    add_pipeline(ch, database, "steady_cdc", "idle", ["bench_whole.s002_composite"], events=42,
                 verified={"position": {"file": "mysql-bin.000003", "pos": 900}, "at": now - 120, "shards": 11,
                           "mismatched": [], "repaired_shards": 0, "rows_repaired": 0})
    add_task(book, TASK_PIPELINE, "lagging_cdc", "sync_cdc", "catch_up", "scheduled__2026-01-05T00:00:00+00:00")
    return {"names": names, "keys": keys, "failed": [names[i] for i in failed], "running": names[running],
            "job": job}

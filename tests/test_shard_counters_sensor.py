"""ShardCountersSensor (poke, deferrable) and its trigger against a real ledger; the verdict rules."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from airflow_sync_provider.compat import AirflowFailException
from airflow_sync_provider.core import ledger as ledger_module
from airflow_sync_provider.core.endpoints import ClickHouseEndpoint
from airflow_sync_provider.core.ledger import Ledger
from airflow_sync_provider.core.loads import LoadState, ShardState, counters_verdict
from airflow_sync_provider.sensors.shard_counters import ShardCountersSensor
from airflow_sync_provider.triggers.shard_counters import ShardCountersTrigger

PLAN = {"shards": [{"id": i, "where": "1=1", "params": []} for i in range(3)]}


def state(status="running", shards=(), heartbeat=None):
    s = LoadState("k", 1, status, "db.t", "db.t", PLAN, "parts_x", 1, {}, heartbeat=heartbeat or time.time())
    for shard in shards:
        s.shards[shard.shard_id] = shard
    return s


def shard(i, status="success", read=10, written=10, failed=0, error=""):
    return ShardState(i, 1, status, "1=1", [], read, written, failed, 100, time.time() - 1, time.time(), error)


def test_verdict_rules():
    assert counters_verdict(None)[0] == "wait"
    assert counters_verdict(state(shards=[shard(0), shard(1)]))[0] == "wait"
    assert counters_verdict(state(shards=[shard(0), shard(1), shard(2, "running")]))[0] == "wait"
    assert counters_verdict(state("published", [shard(0), shard(1), shard(2)]))[0] == "success"
    verdict, message = counters_verdict(state("published", [shard(0), shard(1, "mismatch"), shard(2)]))
    assert verdict == "failed" and "shards [1]" in message and "--failed" in message  # a reconciliation marked it
    verdict, message = counters_verdict(state("failed", [shard(0), shard(1, "failed", error="boom"), shard(2)]))
    assert verdict == "failed" and "[1]" in message and "boom" in message and "reimport --load 'k' --failed" in message
    verdict, message = counters_verdict(state("published", [shard(0), shard(1, read=10, written=9), shard(2)]))
    assert verdict == "failed" and "[1]" in message  # read != written is never success
    dead = state("running", [shard(0), shard(1, "running")], heartbeat=time.time() - 3600)
    verdict, message = counters_verdict(dead)
    assert verdict == "failed" and "died" in message and "[1, 2]" in message


@pytest.fixture
def ledger_conn(clickhouse_url, ch, monkeypatch):
    endpoint = ClickHouseEndpoint.from_url(clickhouse_url)
    monkeypatch.setenv("AIRFLOW_CONN_SENSOR_CH", json.dumps(
        {"conn_type": "clickhouse", "host": endpoint.host, "port": endpoint.port, "login": endpoint.user}))
    ledger = Ledger(ch)
    ledger.ensure()
    return ledger


def write(ledger, key, load_status, shards):
    load = state(load_status, shards)
    load.load_key = key
    ledger.write_load(load)
    for s in shards:
        ledger.write_shard(key, 1, s)


def sensor(key, **kwargs):
    return ShardCountersSensor(task_id="wait", load_key=key, clickhouse_conn_id="sensor_ch", poke_interval=0.1,
                               **kwargs)


def test_poke_waits_succeeds_and_fails_fast(ledger_conn):
    write(ledger_conn, "s.wait", "running", [shard(0), shard(1, "running", read=5, written=5)])
    assert sensor("s.wait").poke({}).is_done is False
    write(ledger_conn, "s.ok", "published", [shard(0), shard(1), shard(2)])
    done = sensor("s.ok").poke({})
    assert done.is_done and done.xcom_value["rows_written"] == 30 and done.xcom_value["failed_shards"] == []
    write(ledger_conn, "s.bad", "failed", [shard(0), shard(1, "failed", error="Code: 210. Connection refused"),
                                           shard(2, "failed", error="x")])
    with pytest.raises(AirflowFailException, match=r"shards \[1, 2\].*Connection refused.*reimport"):
        sensor("s.bad").poke({})


def test_trigger_round_trips_and_reports(ledger_conn):
    write(ledger_conn, "t.ok", "published", [shard(0), shard(1), shard(2)])
    trigger = ShardCountersTrigger("t.ok", "sensor_ch", poke_interval=0.1)
    path, kwargs = trigger.serialize()
    assert path == "airflow_sync_provider.triggers.shard_counters.ShardCountersTrigger"
    again = ShardCountersTrigger(**kwargs)
    assert again.serialize() == (path, kwargs)

    async def first_event(t):
        async for event in t.run():
            return event

    event = asyncio.run(first_event(again))
    assert event.payload["status"] == "success" and event.payload["summary"]["shards"] == 3

    write(ledger_conn, "t.later", "running", [shard(0)])
    waiting = ShardCountersTrigger("t.later", "sensor_ch", poke_interval=0.2)

    async def finish_later():
        task = asyncio.create_task(first_event(waiting))
        await asyncio.sleep(0.5)
        assert not task.done()  # still waiting for shards 1 and 2
        write(ledger_conn, "t.later", "failed",
              [shard(0), shard(1, "failed", error="e"), shard(2, "failed", error="e")])
        return await asyncio.wait_for(task, 30)

    event = asyncio.run(finish_later())
    assert event.payload["status"] == "failed" and "[1, 2]" in event.payload["message"]


def test_deferrable_sensor_defers_only_while_waiting(ledger_conn):
    from airflow.sdk.exceptions import TaskDeferred

    write(ledger_conn, "d.ok", "published", [shard(0), shard(1), shard(2)])
    assert sensor("d.ok", deferrable=True).execute({})["verdict"] == "success"
    write(ledger_conn, "d.wait", "running", [shard(0)])
    with pytest.raises(TaskDeferred) as deferred:
        sensor("d.wait", deferrable=True).execute({})
    assert isinstance(deferred.value.trigger, ShardCountersTrigger) and deferred.value.trigger.load_key == "d.wait"
    with pytest.raises(AirflowFailException, match="boom"):
        sensor("d.wait", deferrable=True).execute_complete({}, {"status": "failed", "message": "boom", "summary": {}})


def test_stale_heartbeat_counts_as_dead(ledger_conn, monkeypatch):
    with monkeypatch.context() as past:
        past.setattr(ledger_module, "now", lambda: time.time() - 3600)
        write(Ledger(ledger_conn.ch), "s.dead", "running", [shard(0), shard(1, "running")])
    with pytest.raises(AirflowFailException, match="died"):
        sensor("s.dead").poke({})


def test_a_heartbeat_keeps_a_running_load_alive(ledger_conn, monkeypatch):
    """The driver's heartbeat (its own row, not the load's with its plan) is what keeps a running
    load fresh; without one the load's own row counts, and the newest generation's counts."""
    with monkeypatch.context() as past:
        past.setattr(ledger_module, "now", lambda: time.time() - 3600)
        write(Ledger(ledger_conn.ch), "s.beat", "running", [shard(0), shard(1, "running")])
    ledger = Ledger(ledger_conn.ch)
    assert ledger.state("s.beat").stale
    load = ledger.state("s.beat")
    ledger.write_heartbeat(load)
    fresh = ledger.state("s.beat")
    assert not fresh.stale and abs(fresh.heartbeat - load.heartbeat) < 1e-3
    assert sensor("s.beat").poke({}).is_done is False  # waiting, not dead
    assert fresh.plan == PLAN and set(fresh.shards) == {0, 1}
    # a heartbeat of an older generation does not keep a newer one alive
    with monkeypatch.context() as past:
        past.setattr(ledger_module, "now", lambda: time.time() - 3600)
        newer = ledger.state("s.beat")
        newer.generation = 2
        Ledger(ledger_conn.ch).write_load(newer)
    assert ledger.state("s.beat").generation == 2 and ledger.state("s.beat").stale


def test_a_ledger_of_an_earlier_release_gains_the_columns_added_since(ch):
    """ensure() on a ledger whose tables lack columns added later (as the first releases wrote
    them) adds those columns, keeps the rows, and a job then reads and writes it as usual."""
    old = Ledger(ch, "ledger_old_release")
    ch.command("DROP DATABASE IF EXISTS ledger_old_release")
    ch.command("CREATE DATABASE ledger_old_release")
    first = [(n, t) for n, t in ledger_module._LOADS if n != "start_position"]
    old._create("loads", tuple(first), "ReplacingMergeTree(updated_at) ORDER BY (load_key, generation)")
    ch.command("INSERT INTO ledger_old_release.loads (load_key, generation, status, plan, spec) "
               "VALUES ('old', 1, 'published', '{\"shards\": []}', '{}')")
    old.ensure()
    columns = {t: set(c.split(",")) for t, c in ch.query(
        "SELECT table, arrayStringConcat(groupArray(name), ',') FROM system.columns "
        "WHERE database = 'ledger_old_release' GROUP BY table").result_rows}
    assert columns == {"loads": {n for n, _ in ledger_module._LOADS}, "shards": {n for n, _ in ledger_module._SHARDS},
                       "heartbeats": {n for n, _ in ledger_module._HEARTBEATS}}
    assert old.state("old").status == "published" and old.state("old").start_position is None
    write(old, "new", "running", [shard(0)])
    assert old.state("new").shards[0].records_written == 10
    old.ensure()  # up to date: nothing to do
    ch.command("DROP DATABASE ledger_old_release")

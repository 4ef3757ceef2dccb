"""BinlogPositionSensor (poke, reschedule, deferrable) and its trigger against a real ledger and
the real MariaDB; the flavour's status statements are unit-tested in tests/test_versions.py."""

from __future__ import annotations

import asyncio
import json

import pytest

from airflow_sync_provider.compat import AirflowFailException
from airflow_sync_provider.core.cdc.checkpoints import Checkpoints, PipelineState
from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
from airflow_sync_provider.core.positions import BinlogPosition, current_position
from airflow_sync_provider.sensors.binlog_position import BinlogPositionSensor
from airflow_sync_provider.triggers.binlog_position import BinlogPositionTrigger


@pytest.fixture
def ledger(clickhouse_url, mysql_url, ch, monkeypatch):
    target, source = ClickHouseEndpoint.from_url(clickhouse_url), MySQLEndpoint.from_url(mysql_url)
    monkeypatch.setenv("AIRFLOW_CONN_SENSOR_CH", json.dumps(
        {"conn_type": "clickhouse", "host": target.host, "port": target.port, "login": target.user}))
    monkeypatch.setenv("AIRFLOW_CONN_SENSOR_MYSQL", json.dumps(
        {"conn_type": "mysql", "host": source.host, "port": source.port, "login": source.user,
         "password": source.password}))
    checkpoints = Checkpoints(ch)
    checkpoints.ensure()
    return checkpoints


def at(ledger, pipeline, position, status="idle", error="", source_time=0.0):
    ledger.write(PipelineState(pipeline, status, position, [], error, source_time=source_time))


def sensor(pipeline, **kwargs):
    return BinlogPositionSensor(task_id="caught_up", pipeline=pipeline, clickhouse_conn_id="sensor_ch",
                                mysql_conn_id="sensor_mysql", poke_interval=0.1, **kwargs)


class TaskInstance:
    """What a sensor uses of Airflow's task instance between pokes: its XCom."""

    def __init__(self):
        self.xcom = {}

    def xcom_push(self, key, value):
        self.xcom[key] = value

    def xcom_pull(self, task_ids=None, key="return_value"):
        return self.xcom.get(key)


def test_poke_waits_for_a_given_position_succeeds_and_fails_fast(ledger):
    target = {"file": "mysql-bin.000003", "pos": 500}
    at(ledger, "p.given", BinlogPosition("mysql-bin.000003", 499))
    assert sensor("p.given", position=target).poke({}).is_done is False
    at(ledger, "p.given", BinlogPosition("mysql-bin.000004", 4))  # a later file is further
    done = sensor("p.given", position="mysql-bin.000003:500").poke({})  # the text form of a template
    assert done.is_done and done.xcom_value["checkpoint"]["file"] == "mysql-bin.000004"
    at(ledger, "p.given", BinlogPosition("mysql-bin.000004", 4), "failed", "BinlogError: the binlog file was purged")
    with pytest.raises(AirflowFailException, match="purged.*run it again"):
        sensor("p.given", position=target).poke({})


def test_a_table_still_replaying_towards_the_checkpoint_holds_the_sensor_back(ledger):
    """A table added to the pipeline (a bootstrap) counts from where its own replay is until it
    has joined the stream: the pipeline's position is the lower of the two."""
    from airflow_sync_provider.core.cdc.tables import PipelineTable, Registration

    at(ledger, "p.joining", BinlogPosition("mysql-bin.000007", 900))
    table = Registration(PipelineTable("db", "added"), BinlogPosition("mysql-bin.000007", 300))
    ledger.write_registration("p.joining", table)
    assert ledger.position("p.joining") == BinlogPosition("mysql-bin.000007", 300)
    assert sensor("p.joining", position="mysql-bin.000007:900").poke({}).is_done is False
    table.since, table.joined = BinlogPosition("mysql-bin.000007", 900), True
    ledger.write_registration("p.joining", table)
    assert sensor("p.joining", position="mysql-bin.000007:900").poke({}).is_done


def test_without_a_position_the_sources_position_at_the_first_poke_is_the_goal(ledger, mysql_conn):
    behind = current_position(mysql_conn)
    with mysql_conn.cursor() as cur:
        cur.execute("CREATE DATABASE IF NOT EXISTS sensor_db")
        cur.execute("CREATE TABLE IF NOT EXISTS sensor_db.t (id INT PRIMARY KEY)")
        cur.execute("REPLACE INTO sensor_db.t VALUES (1)")
    at(ledger, "p.now", behind)
    ti = TaskInstance()
    rescheduled = sensor("p.now", mode="reschedule")
    assert rescheduled.poke({"ti": ti}).is_done is False
    goal = ti.xcom["target_position"]
    assert BinlogPosition.from_dict(goal).key() > behind.key()
    with mysql_conn.cursor() as cur:  # the source moves on; a later poke keeps the first goal
        cur.execute("REPLACE INTO sensor_db.t VALUES (2)")
    at(ledger, "p.now", BinlogPosition.from_dict(goal))
    again = sensor("p.now", mode="reschedule").poke({"ti": ti})
    assert again.is_done and again.xcom_value["target_position"] == goal


def test_lag_bound(ledger, mysql_conn):
    import time

    at(ledger, "p.lag", current_position(mysql_conn))
    assert sensor("p.lag", max_lag_seconds=0).poke({}).xcom_value["lag_seconds"] == 0.0
    at(ledger, "p.lag", BinlogPosition("mysql-bin.000001", 4), source_time=time.time() - 120)
    result = sensor("p.lag", max_lag_seconds=30).poke({})
    assert result.is_done is False and result.xcom_value["lag_seconds"] >= 119


def test_deferrable_sensor_and_trigger(ledger):
    from airflow.sdk.exceptions import TaskDeferred

    target = {"file": "mysql-bin.000009", "pos": 100}
    at(ledger, "p.defer", BinlogPosition("mysql-bin.000009", 4))
    with pytest.raises(TaskDeferred) as deferred:
        sensor("p.defer", position=target, deferrable=True).execute({})
    trigger = deferred.value.trigger
    assert isinstance(trigger, BinlogPositionTrigger) and trigger.position == target
    path, kwargs = trigger.serialize()
    again = BinlogPositionTrigger(**kwargs)
    assert again.serialize() == (path, kwargs)

    async def reach_later():
        async def first_event():
            async for event in again.run():
                return event

        task = asyncio.create_task(first_event())
        await asyncio.sleep(0.5)
        assert not task.done()
        await asyncio.to_thread(at, ledger, "p.defer", BinlogPosition("mysql-bin.000009", 100))
        return await asyncio.wait_for(task, 30)

    again.poke_interval = 0.2
    event = asyncio.run(reach_later())
    assert event.payload["status"] == "success"
    done = sensor("p.defer", position=target, deferrable=True).execute_complete({}, event.payload)
    assert done["checkpoint"]["pos"] == 100


def test_a_source_groups_sensor_waits_for_every_source_and_fails_naming_the_one_that_stopped(ledger):
    """sources=: every source's pipeline ``<pipeline>@<source>`` at its own position (a template's
    text form too); deferred, the trigger carries the sources; one stopped source fails it, named."""
    from airflow.sdk.exceptions import TaskDeferred

    group = [{"name": "a", "mysql_conn_id": "sensor_mysql"}, {"name": "b", "mysql_conn_id": "sensor_mysql"}]
    targets = {"a": {"file": "mysql-bin.000005", "pos": 100}, "b": {"file": "mysql-bin.000007", "pos": 50}}
    at(ledger, "g@a", BinlogPosition("mysql-bin.000005", 100))
    at(ledger, "g@b", BinlogPosition("mysql-bin.000007", 10))
    first = sensor("g", position=targets, sources=group).poke({})
    assert first.is_done is False and first.xcom_value["sources"]["b"]["checkpoint"]["pos"] == 10
    with pytest.raises(TaskDeferred) as deferred:
        sensor("g", position=targets, sources=group, deferrable=True).execute({})
    path, kwargs = deferred.value.trigger.serialize()
    assert kwargs["sources"] == group and BinlogPositionTrigger(**kwargs).serialize() == (path, kwargs)
    at(ledger, "g@b", BinlogPosition("mysql-bin.000008", 4))
    done = sensor("g", position=str(targets), sources=group).poke({})
    assert done.is_done and set(done.xcom_value["sources"]) == {"a", "b"}
    at(ledger, "g@a", BinlogPosition("mysql-bin.000005", 100), status="stopped", error="BinlogError: retyped on a")
    with pytest.raises(AirflowFailException, match="g@a.*retyped on a"):
        sensor("g", position=targets, sources=group).poke({})

"""The example DAGs under a real Airflow (tests/airflow_real.py): scheduler with the
LocalExecutor, DAG processor, triggerer and API server as separate processes, driven through
the REST API as the UI drives them, with Airflow's default configuration (the Sync view's plugin
comes through its entry point) and its metrics sent to a StatsD listener of the tier's. Own
MariaDB, ClickHouse endpoint and demo data, so what the DAGs leave behind (pipelines,
partitions) does not meet the `dags test` tier's.

Every test sets up what it reads (its own runs, pipelines, days) and passes alone (``-k``).
Nothing is proven by comparing timestamps: runs held together at a hold point show they ran
side by side (core/crash_points.py); a deferred sensor is released only by what the test does
after seeing it deferred and the scheduler having taken in its worker's exit (released sooner,
Airflow 3.3's scheduler can fail the resumed task: RealAirflow.wait_for_defer_exit).
"""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pymysql
import pytest

from airflow_sync_provider.core.cdc.checkpoints import PIPELINE_FAILED, PIPELINE_RUNNING, Checkpoints, PipelineState
from airflow_sync_provider.core.cdc.tables import PipelineTable
from airflow_sync_provider.core.clickhouse.client import client
from airflow_sync_provider.core.crash_points import arrived_file, hold_file
from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
from airflow_sync_provider.core.ledger import Ledger
from airflow_sync_provider.core.positions import BinlogPosition, current_position
from devenv import demo_data
from devenv.airflow_env import REPO
from devenv.mariadb import group_servers
from devenv.services import clickhouse_service, mysql_service
from tests.airflow_real import POLL, ApiError, RealAirflow, StatsdListener
from tests.helpers import assert_merged_rows, assert_same_rows

pytestmark = [pytest.mark.slow, pytest.mark.airflow_real]
DAYS = ("2025-01-02", "2025-01-03", "2025-01-04")  # the backfill's
REIMPORT_DAY = "2025-01-06"  # the failed-shard test's own day


@dataclass
class Tier:
    airflow: RealAirflow
    conn: pymysql.connections.Connection
    ch: object  # clickhouse-connect client
    counts: dict
    statsd: StatsdListener
    holds: Path  # AIRFLOW_SYNC_HOLD_DIR of every Airflow process
    shards: dict  # the source group's servers (dags/example_source_group.py): name → URL


@pytest.fixture(scope="module")
def tier(tmp_path_factory):
    """Services, demo data and a running Airflow, shared by the tests of this module."""
    base = tmp_path_factory.mktemp("airflow-real")
    dags = base / "dags"  # the example DAGs themselves, and the test-only one
    dags.mkdir()
    for path in [*sorted((REPO / "dags").glob("*.py")), *sorted((REPO / "tests" / "real_dags").glob("*.py"))]:
        (dags / path.name).symlink_to(path)
    holds = base / "holds"
    holds.mkdir()
    statsd = StatsdListener()
    started = time.monotonic()
    with mysql_service(base) as mysql_url, clickhouse_service(base) as clickhouse_url, \
            group_servers(base / "shards", SHARDS) as shards, ThreadPoolExecutor(1) as background:
        # the data is made while Airflow starts (no DAG reads a database when it is parsed, and
        # every DAG is paused until a test unpauses it): ready before the first test
        def data() -> dict:
            counts = demo_data.generate(mysql_url, "demo", orders=20_000, customers=2_000, item_orders=5_000)
            _shop(shards)
            return counts

        made = background.submit(data)
        with RealAirflow(base / "home", mysql_url, clickhouse_url, dags, statsd_port=statsd.port,
                         hold_dir=holds, shards=shards) as airflow:
            counts = made.result()
            airflow.timings["services"] = time.monotonic() - started
            conn = pymysql.connect(**MySQLEndpoint.from_url(mysql_url).connect_args(), autocommit=True)
            ch = client(ClickHouseEndpoint.from_url(clickhouse_url))
            yield Tier(airflow, conn, ch, counts, statsd, holds, shards)
            print(f"\n[airflow-real] start-up: {airflow.timings}")
            ch.close()
            conn.close()
    statsd.close()


SHARDS = ("s0", "s1")  # dags/example_source_group.py's connections sync_shard_s0, sync_shard_s1
SHOP = {"shop_a": ("orders_0", "orders_1"), "shop_b": ("orders_2",)}


def _shop(shards: dict) -> None:
    """Each shard server's orders tables, ids from 1 on every one (they overlap)."""
    for i, url in enumerate(shards.values()):
        with pymysql.connect(**MySQLEndpoint.from_url(url).connect_args(), autocommit=True) as conn, \
                conn.cursor() as cur:
            for database, tables in SHOP.items():
                cur.execute(f"CREATE DATABASE {database}")
                for table in tables:
                    cur.execute(f"CREATE TABLE {database}.{table} (id INT AUTO_INCREMENT PRIMARY KEY, "
                                "amount DECIMAL(10,2) NOT NULL, note VARCHAR(20) NULL)")
                    cur.execute(f"INSERT INTO {database}.{table} (amount, note) SELECT seq / 4, "
                                f"IF(seq % 3 = 0, NULL, 'shard {i}') FROM {database}.seq_1_to_{500 + 100 * i}")


def _log_tail(airflow: RealAirflow, dag_id: str, run_id: str) -> str:
    out = []
    for task_id, ti in airflow.task_instances(dag_id, run_id).items():
        if ti["state"] != "success":
            try:
                out.append(f"--- {task_id} ({ti['state']})\n" + airflow.task_log(dag_id, run_id, task_id,
                                                                                  max(1, ti["try_number"]))[-3000:])
            except Exception as exc:  # noqa: BLE001 - a diagnostic only
                out.append(f"--- {task_id} ({ti['state']}): no log ({exc})")
    return "\n".join(out)


def _succeeded(airflow: RealAirflow, dag_id: str, run_ids: list[str], timeout: float = 600) -> None:
    states = airflow.wait_for_runs(dag_id, run_ids, timeout)
    failed = [r for r, s in states.items() if s != "success"]
    assert not failed, "\n".join(_log_tail(airflow, dag_id, r) for r in failed)


def test_full_load_dag_triggered_through_the_api_succeeds_and_sends_its_metrics(tier):
    """The full-load DAG through the API; its tasks send their metrics from the workers: rows
    written per table (this try's shards) and the reconciliations' verdicts."""
    airflow = tier.airflow
    airflow.wait_for_dag("sync_demo_full_load")
    since = tier.statsd.mark()
    run_id = airflow.trigger("sync_demo_full_load")
    _succeeded(airflow, "sync_demo_full_load", [run_id])
    for table, count in tier.counts.items():
        assert assert_same_rows(tier.conn, tier.ch, "demo", table) == count
    assert airflow.xcom("sync_demo_full_load", run_id, "load_orders")["rows"] == tier.counts["orders"]
    tis = airflow.task_instances("sync_demo_full_load", run_id)
    for table, count in tier.counts.items():
        written = tier.statsd.received(f"airflow.sync.load.rows_written.demo.{table}", "c", since)
        assert written, f"no rows_written counter for demo.{table}"
        if tis[f"load_{table}"]["try_number"] == 1:  # one try: every row counted once
            assert sum(written) == count, (table, written)
        assert tier.statsd.received(f"airflow.sync.load.shards_failed.demo.{table}", "c", since) in ([], [0.0])
        assert tier.statsd.received(f"airflow.sync.load.duration.demo.{table}", "ms", since)
        assert tier.statsd.received(f"airflow.sync.reconcile.ok.demo.{table}", "c", since) == [1.0]


def _day(conn, ch, day: str) -> tuple[set, set]:
    with conn.cursor() as cur:
        cur.execute("SELECT id, amount FROM demo.orders WHERE created_at >= %s AND created_at < %s + INTERVAL 1 DAY",
                    (day, day))
        source = set(cur.fetchall())
    target = set(ch.query("SELECT id, amount FROM demo.orders_daily FINAL WHERE _partition_id = {p:String}",
                          parameters={"p": day.replace("-", "")}).result_rows)
    return source, target


def _backfill(tier: Tier, reprocess: str, held: bool = False) -> list[dict]:
    """A backfill over DAYS as the UI creates it (its runs are created, or cleared for
    reprocessing, by the request); returns its runs once they all ended. ``held``: each day's
    load waits at its hold point until all three are there, then all go on — so they ran side
    by side, or the test fails naming how many got there together."""
    airflow = tier.airflow
    holds = [Path(hold_file(str(tier.holds), "full_load.started", f"daily_orders.{day}")) for day in DAYS] if held \
        else []
    for hold in holds:
        hold.touch()
    try:
        backfill = airflow.api("POST", "/api/v2/backfills", {
            "dag_id": "sync_demo_daily_orders", "from_date": f"{DAYS[0]}T00:00:00Z",
            "to_date": f"{DAYS[-1]}T00:00:00Z", "max_active_runs": 3, "reprocess_behavior": reprocess})
        runs = [r for r in airflow.runs("sync_demo_daily_orders") if r["run_type"] == "backfill"]
        assert sorted(r["data_interval_start"][:10] for r in runs) == list(DAYS), runs
        ids = [r["dag_run_id"] for r in runs]
        arrived = [Path(arrived_file(str(hold))) for hold in holds]
        deadline = time.monotonic() + 600
        while not all(a.exists() for a in arrived):
            ended = {r["dag_run_id"]: r["state"] for r in airflow.runs("sync_demo_daily_orders")
                     if r["dag_run_id"] in ids and r["state"] in ("success", "failed")}
            assert not ended and time.monotonic() < deadline, (
                f"only {sum(a.exists() for a in arrived)} of {len(DAYS)} days' loads were under way together "
                f"(runs ended: {ended})\n" + "\n".join(_log_tail(airflow, "sync_demo_daily_orders", r) for r in ids))
            time.sleep(POLL)
    finally:
        for hold in holds:
            hold.unlink(missing_ok=True)
    _succeeded(airflow, "sync_demo_daily_orders", ids)
    deadline = time.monotonic() + 120  # the scheduler marks the backfill complete after its runs
    while not airflow.api("GET", f"/api/v2/backfills/{backfill['id']}")["completed_at"]:
        assert time.monotonic() < deadline, "the backfill was never marked complete"
        time.sleep(POLL)
    return [r for r in airflow.runs("sync_demo_daily_orders") if r["dag_run_id"] in ids]


def test_backfill_through_the_api_runs_days_side_by_side_and_reprocessing_changes_nothing(tier):
    airflow, conn, ch = tier.airflow, tier.conn, tier.ch
    airflow.wait_for_dag("sync_demo_daily_orders")
    # held at their hold point until all three days' loads are under way (max_active_runs=3)
    runs = _backfill(tier, "none", held=True)
    first = {}
    for day in DAYS:
        source, target = _day(conn, ch, day)
        assert source and target == source, day
        first[day] = target
    raw, distinct = ch.query("SELECT count(), uniqExact(id) FROM demo.orders_daily").result_rows[0]
    assert raw == distinct
    assert {airflow.xcom("sync_demo_daily_orders", r["dag_run_id"], "load_day")["generation"] for r in runs} == {1}

    again = _backfill(tier, "completed")  # the same backfill, reprocessing the completed days
    assert len(again) == len(DAYS)
    for day in DAYS:
        assert _day(conn, ch, day)[1] == first[day], day
    assert ch.query("SELECT count(), uniqExact(id) FROM demo.orders_daily").result_rows[0] == (raw, distinct)
    generations = {airflow.xcom("sync_demo_daily_orders", r["dag_run_id"], "load_day")["generation"] for r in again}
    assert generations == {2}  # each day loaded afresh, not resumed from the first backfill


def _position_text(conn) -> str:
    position = current_position(conn)
    return f"{position.file}:{position.pos}"


def _wait_for_state(airflow: RealAirflow, dag_id: str, run_id: str, task_id: str, state: str, timeout=300) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        ti = airflow.task_instances(dag_id, run_id).get(task_id)
        if ti and ti["state"] == state:
            return ti
        if time.monotonic() > deadline or (ti and ti["state"] in ("success", "failed", "upstream_failed")):
            raise AssertionError(f"{dag_id}.{task_id} is {ti and ti['state']}, not {state}:\n"
                                 + _log_tail(airflow, dag_id, run_id))
        time.sleep(POLL)


def _pause(airflow: RealAirflow, dag_id: str, paused: bool) -> None:
    airflow.api("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": paused})


def _applier_idle(airflow: RealAirflow, dag_id: str, task_id: str, timeout: float = 600) -> None:
    """Wait until no instance of ``task_id`` is queued or running (a paused DAG starts no more)."""
    deadline = time.monotonic() + timeout
    while airflow.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/~/taskInstances?task_id={task_id}"
                             "&state=queued&state=running")["total_entries"]:
        assert time.monotonic() < deadline, f"{dag_id}.{task_id} still queued or running after {timeout:.0f} s"
        time.sleep(POLL)


def test_cdc_dag_succeeds_and_a_binlog_sensor_defers_into_the_real_triggerer(tier):
    """The CDC DAG as the scheduler runs it; then a BinlogPositionSensor deferred into the
    triggerer waits for a position only a later CDC run can reach: the DAG is paused (no applier
    left running) before the change is made, so nothing releases the sensor before the test has
    seen it deferred; then a run of the DAG does."""
    airflow, conn, ch, counts = tier.airflow, tier.conn, tier.ch, tier.counts
    airflow.wait_for_dag("sync_demo_cdc")  # unpaused: the scheduler starts its latest interval's run
    try:
        deadline = time.monotonic() + 120
        while not airflow.runs("sync_demo_cdc"):
            assert time.monotonic() < deadline, "the scheduler started no run of sync_demo_cdc"
            time.sleep(POLL)
        first = airflow.runs("sync_demo_cdc")[0]["dag_run_id"]
        _succeeded(airflow, "sync_demo_cdc", [first])
        assert [t["rows"] for t in airflow.xcom("sync_demo_cdc", first, "bootstrap")["tables"]] == \
            [counts["orders"], counts["order_items"]]

        _pause(airflow, "sync_demo_cdc", True)  # no catch_up starts from here ...
        _applier_idle(airflow, "sync_demo_cdc", "catch_up")  # ... and none is under way
        with conn.cursor() as cur:
            cur.execute("UPDATE demo.orders SET amount = amount + 1 WHERE id <= 500")
        target = _position_text(conn)
        airflow.wait_for_dag("sync_test_wait_for_position")
        wait = airflow.trigger("sync_test_wait_for_position", {"pipeline": "demo_cdc", "position": target})
        _wait_for_state(airflow, "sync_test_wait_for_position", wait, "wait", "deferred")
        airflow.wait_for_defer_exit("sync_test_wait_for_position", wait, "wait")  # only now may it be released
        second = airflow.trigger("sync_demo_cdc")
        _pause(airflow, "sync_demo_cdc", False)  # the release: a CDC run applies the change
        _succeeded(airflow, "sync_demo_cdc", [second])
        _succeeded(airflow, "sync_test_wait_for_position", [wait], timeout=300)
    finally:
        _pause(airflow, "sync_demo_cdc", True)  # its schedule (every 10 min) would keep running
    summary = airflow.xcom("sync_test_wait_for_position", wait, "wait")
    assert BinlogPosition.from_dict(summary["checkpoint"]).key() >= BinlogPosition.from_dict(target).key()
    for table in ("orders", "order_items"):
        assert assert_same_rows(conn, ch, "demo", table, target_database="demo_cdc") == counts[table]
    log = airflow.task_log("sync_test_wait_for_position", wait, "wait")  # the trigger's lines are in the task's log
    assert f"waiting for {BinlogPosition.from_dict(target)}" in log, log[-3000:]


def test_a_deferred_binlog_sensor_fails_fast_when_the_pipeline_reports_an_error(tier):
    """Deferred in the triggerer, the sensor fails as soon as the pipeline reports an error (its
    timeout is an hour: nothing else can end it within this test's wait), naming the error."""
    airflow, conn, ch = tier.airflow, tier.conn, tier.ch
    ledger = Checkpoints(ch)
    ledger.ensure()
    at = BinlogPosition.from_dict(_position_text(conn))
    ledger.write(PipelineState("real_tier_failing", PIPELINE_RUNNING, at, heartbeat=time.time()))
    airflow.wait_for_dag("sync_test_wait_for_position")
    far = f"{at.file}:{at.pos + 10**9}"
    run = airflow.trigger("sync_test_wait_for_position", {"pipeline": "real_tier_failing", "position": far})
    _wait_for_state(airflow, "sync_test_wait_for_position", run, "wait", "deferred")
    airflow.wait_for_defer_exit("sync_test_wait_for_position", run, "wait")
    ledger.write(PipelineState("real_tier_failing", PIPELINE_FAILED, at,
                               error="BinlogError: the binlog file was purged"))
    assert airflow.wait_for_runs("sync_test_wait_for_position", [run], timeout=300)[run] == "failed"
    ti = airflow.task_instances("sync_test_wait_for_position", run)["wait"]
    log = airflow.task_log("sync_test_wait_for_position", run, "wait", max(1, ti["try_number"]))
    assert "the binlog file was purged" in log, log[-3000:]


def test_a_deferred_sensor_sends_the_lag_of_a_running_pipeline_from_the_triggerer(tier):
    """While a BinlogPositionSensor waits in the triggerer, the pipeline's gauges reach StatsD from
    there: the lag of a running pipeline behind its source, and they follow the pipeline (a lag
    written after the sensor deferred arrives)."""
    airflow, conn, ch, statsd = tier.airflow, tier.conn, tier.ch, tier.statsd
    ledger = Checkpoints(ch)
    ledger.ensure()
    at = BinlogPosition.from_dict(_position_text(conn))
    ahead = BinlogPosition(at.file, at.pos + 10**6)
    ledger.write(PipelineState("real_tier_lagging", PIPELINE_RUNNING, at, source_position=ahead,
                               source_time=time.time() - 300, heartbeat=time.time()))
    airflow.wait_for_dag("sync_test_wait_for_position")
    run = airflow.trigger("sync_test_wait_for_position",
                          {"pipeline": "real_tier_lagging", "position": f"{ahead.file}:{ahead.pos}"})
    _wait_for_state(airflow, "sync_test_wait_for_position", run, "wait", "deferred")
    airflow.wait_for_defer_exit("sync_test_wait_for_position", run, "wait")  # before the release below
    lag = "airflow.sync.pipeline.lag_seconds.real_tier_lagging"
    assert statsd.wait_for(lag, "g", lambda v: v >= 300, timeout=120) >= 300
    since = statsd.mark()  # from here only the trigger looks at the pipeline
    ledger.write(PipelineState("real_tier_lagging", PIPELINE_RUNNING, at, source_position=ahead,
                               source_time=time.time() - 7200, heartbeat=time.time()))
    assert statsd.wait_for(lag, "g", lambda v: v >= 7200, since=since, timeout=120) >= 7200
    assert statsd.received("airflow.sync.pipeline.checkpoint_age_seconds.real_tier_lagging", "g", since)
    assert statsd.received("airflow.sync.pipeline.failed.real_tier_lagging", "g", since)[-1] == 0
    ledger.write(PipelineState("real_tier_lagging", PIPELINE_RUNNING, ahead, source_position=ahead,
                               source_time=time.time(), heartbeat=time.time()))  # caught up: the sensor succeeds
    _succeeded(airflow, "sync_test_wait_for_position", [run], timeout=300)
    assert statsd.wait_for(lag, "g", lambda v: v == 0, since=since, timeout=120) == 0


def _clear(airflow: RealAirflow, dag_id: str, run_id: str, task_id: str, only_failed: bool) -> None:
    """Clear a task and what follows it, as the UI's "Clear" does."""
    airflow.api("POST", f"/api/v2/dags/{dag_id}/clearTaskInstances", {
        "dry_run": False, "dag_run_id": run_id, "task_ids": [task_id], "only_failed": only_failed,
        "include_downstream": True, "reset_dag_runs": True})


def test_a_failure_no_retry_cures_fails_its_task_at_once_and_others_are_retried(tier):
    """core/failures.py under a real scheduler: with retries=2, a load of a table that does not
    exist fails on its first try (the job says a retry will not help: AirflowFailException); a
    failure the policy does not know is tried three times."""
    airflow = tier.airflow
    Ledger(tier.ch).ensure()  # the reconciliation then finds the ledger, and no load of its key
    airflow.wait_for_dag("sync_test_retry_or_not")
    run = airflow.trigger("sync_test_retry_or_not")
    assert airflow.wait_for_runs("sync_test_retry_or_not", [run], timeout=300)[run] == "failed"
    tis = airflow.task_instances("sync_test_retry_or_not", run)
    assert (tis["refused"]["state"], tis["refused"]["try_number"]) == ("failed", 1), tis["refused"]
    assert (tis["retried"]["state"], tis["retried"]["try_number"]) == ("failed", 3), tis["retried"]
    log = airflow.task_log("sync_test_retry_or_not", run, "refused", 1)
    assert "A retry will not help" in log and "no_such_table" in log, log[-3000:]


def test_a_failed_shard_is_re_imported_by_clearing_the_task_through_the_api(tier):
    """A row the copy cannot take (a date before ClickHouse's range) fails its shard and the day's
    load; the load's task sends the failed shard to StatsD; the row is fixed and the task cleared
    from the API: the load resumes and reads only that shard."""
    airflow, conn, ch, statsd = tier.airflow, tier.conn, tier.ch, tier.statsd
    airflow.wait_for_dag("sync_demo_daily_orders")
    day = REIMPORT_DAY
    with conn.cursor() as cur:
        cur.execute("SELECT MAX(id) FROM demo.orders WHERE created_at >= %s AND created_at < %s + INTERVAL 1 DAY",
                    (day, day))
        bad = cur.fetchone()[0]
        cur.execute("UPDATE demo.orders SET shipped_at = '1000-01-01 00:00:00' WHERE id = %s", (bad,))
    since = statsd.mark()
    try:
        run = airflow.api("POST", "/api/v2/dags/sync_demo_daily_orders/dagRuns", {
            "logical_date": f"{day}T00:00:00Z", "data_interval_start": f"{day}T00:00:00Z",
            "data_interval_end": f"{day[:-2]}{int(day[-2:]) + 1:02d}T00:00:00Z"})["dag_run_id"]
        assert airflow.wait_for_runs("sync_demo_daily_orders", [run])[run] == "failed"
        load = airflow.task_instances("sync_demo_daily_orders", run)["load_day"]
        log = airflow.task_log("sync_demo_daily_orders", run, "load_day", load["try_number"])
        assert "'shipped_at'" in log and "outside ClickHouse" in log and "reimport" in log, log[-3000:]
    finally:
        with conn.cursor() as cur:
            cur.execute("UPDATE demo.orders SET shipped_at = NULL WHERE id = %s", (bad,))
    counter = "airflow.sync.load.shards_failed.demo.orders_daily"  # named by the target table
    statsd.wait_for(counter, "c", lambda v: v >= 1, since=since, timeout=60)  # sent by the failed try
    _clear(airflow, "sync_demo_daily_orders", run, "load_day", only_failed=True)
    _succeeded(airflow, "sync_demo_daily_orders", [run])
    summary = airflow.xcom("sync_demo_daily_orders", run, "load_day")
    assert 0 < summary["shards_read"] < summary["shards"], summary  # only what had failed
    # every try of a load into the table adds its failed shards (the successful ones 0): in all,
    # exactly the shards the re-import then read
    assert sum(statsd.received(counter, "c", since)) == summary["shards_read"]
    source, target = _day(conn, ch, day)
    assert source and target == source


def test_a_database_by_pattern_maps_one_task_instance_per_table(tier):
    """dags/example_whole_database.py's mapped DAG under the real scheduler: the discovery task's
    list becomes one load and one reconciliation per table, each with its own load key and a
    "Sync view" link; every copy equals its source."""
    airflow, conn, ch, counts = tier.airflow, tier.conn, tier.ch, tier.counts
    airflow.wait_for_dag("sync_demo_database_mapped")
    run_id = airflow.trigger("sync_demo_database_mapped")
    _succeeded(airflow, "sync_demo_database_mapped", [run_id])
    tis = airflow.api("GET", f"/api/v2/dags/sync_demo_database_mapped/dagRuns/{run_id}/taskInstances?limit=100")
    by_task: dict = {}
    for ti in tis["task_instances"]:
        by_task.setdefault(ti["task_id"], []).append(ti)
    for task in ("load", "reconcile"):
        assert sorted(ti["map_index"] for ti in by_task[task]) == list(range(len(counts)))
        assert {ti["state"] for ti in by_task[task]} == {"success"}
    for table, count in counts.items():
        assert assert_same_rows(conn, ch, "demo", table, target_database="demo_mapped") == count
    links = airflow.api("GET", f"/api/v2/dags/sync_demo_database_mapped/dagRuns/{run_id}/taskInstances/load/links"
                               "?map_index=0")["extra_links"]
    assert links["Sync view"].startswith("/sync/?load=sync_demo_database_mapped.load."), links


def test_the_sync_view_is_loaded_by_default_and_shows_what_its_tasks_made(tier):
    """The provider's plugin with Airflow's default configuration: listed by the API, its pages
    served by the API server behind Airflow's auth, from the ledger. What it shows is made here:
    a full-load run (its tables, each linked to the task instance that loaded it, and their
    reconciliations), a snapshot-diff run, a failing pipeline named first with its error. Each
    page is rendered by headless Chromium (a screenshot each)."""
    airflow, conn, ch = tier.airflow, tier.conn, tier.ch
    assert not any(k.startswith("AIRFLOW__CORE__LAZY_DISCOVER") for k in airflow.env)  # Airflow's default
    plugins = airflow.api("GET", "/api/v2/plugins")["plugins"]
    sync = next(p for p in plugins if p["name"] == "airflow_sync")
    assert [v["href"] for v in sync["external_views"]] == ["/sync/"]
    errors = airflow.api("GET", "/api/v2/plugins/importErrors")["import_errors"]
    assert not [e for e in errors if "sync" in str(e)], errors
    with pytest.raises(ApiError, match="HTTP 401"):
        airflow.api("GET", "/sync/", auth=False, raw=True)

    airflow.wait_for_dag("sync_demo_full_load")
    full_load = airflow.trigger("sync_demo_full_load")
    airflow.wait_for_dag("sync_demo_snapshot_diff")  # unpaused and @daily: the scheduler runs it once by itself
    deadline = time.monotonic() + 180
    while not any(r["run_type"] == "scheduled" for r in airflow.runs("sync_demo_snapshot_diff")):
        assert time.monotonic() < deadline, "the scheduler never ran sync_demo_snapshot_diff"
        time.sleep(POLL)
    airflow.wait_for_runs("sync_demo_snapshot_diff", [r["dag_run_id"] for r in airflow.runs("sync_demo_snapshot_diff")])
    with conn.cursor() as cur:  # something for this run to find
        cur.execute("UPDATE demo.orders SET note = CONCAT('view test ', id) WHERE id <= 3")
    diff_run = airflow.trigger("sync_demo_snapshot_diff")
    _succeeded(airflow, "sync_demo_full_load", [full_load])
    _succeeded(airflow, "sync_demo_snapshot_diff", [diff_run])
    ledger = Checkpoints(ch)
    ledger.ensure()
    at = BinlogPosition.from_dict(_position_text(conn))
    ledger.write(PipelineState("real_tier_view_failing", PIPELINE_FAILED, at, [PipelineTable("demo", "customers")],
                               error="BinlogError: <purged> binlog file"))

    page = airflow.api("GET", "/sync/", raw=True)
    attention = page[page.index("id='attention'"):page.index("id='tables'")]
    assert "real_tier_view_failing" in attention and "BinlogError: &lt;purged&gt; binlog file" in attention
    key = airflow.xcom("sync_demo_full_load", full_load, "load_orders")["load_key"]
    row = re.search(rf"<tr class='published' data-key='{re.escape(key)}'>.*?</tr>", page, re.S)
    assert row, page[:3000]
    ti = re.search(r"href='\.\./dags/([^/]+)/runs/([^/]+)/tasks/([^/']+)'", row.group(0))
    assert ti and ti.groups() == ("sync_demo_full_load", quote(full_load, safe=""), "load_orders"), row.group(0)
    assert airflow.api("GET", f"/api/v2/dags/sync_demo_full_load/dagRuns/{ti.group(2)}/taskInstances/"
                              f"{ti.group(3)}")["state"] == "success"  # the link names a real task instance
    assert "href='reconciliation?load=" in row.group(0) and ">ok</a>" in row.group(0)
    narrowed = airflow.api("GET", "/sync/?table=demo.orders&state=published", raw=True)
    keys = re.findall(r"data-key='([^']+)'", narrowed)
    assert key in keys and all("customers" not in k for k in keys)
    shards = airflow.api("GET", f"/sync/load?key={quote(key, safe='')}", raw=True)
    assert "id='shards'" in shards and "sync_demo_full_load.load_orders" in shards
    scoped = airflow.api("GET", "/sync/?pipeline=real_tier_view_failing", raw=True)
    assert "Pipeline <code>real_tier_view_failing</code>" in scoped and "&lt;purged&gt;" in scoped

    links = airflow.api("GET", f"/api/v2/dags/sync_demo_full_load/dagRuns/{full_load}/taskInstances/"
                               "reconcile_orders/links")["extra_links"]
    assert links["Sync view"] == f"/sync/reconciliation?load={quote(key, safe='')}"
    report = airflow.api("GET", links["Sync view"], raw=True)
    assert "demo.orders → demo.orders: ok" in report and report.count("<tr class=''>") >= 2
    diff_link = airflow.api("GET", f"/api/v2/dags/sync_demo_snapshot_diff/dagRuns/{diff_run}/taskInstances/"
                                   "diff_and_apply/links")["extra_links"]["Sync view"]
    assert diff_link == "/sync/diff?key=demo_diff.orders"
    diff = airflow.api("GET", diff_link, raw=True)
    assert "demo.orders → demo_diff.orders: applied" in diff and "<h2>shards</h2>" in diff
    assert re.search(r"<h2>changed: [\d,]+ \(first \d+\)</h2>", diff) and "view test 1" in diff, \
        re.sub(r"<style>.*?</style>", "", diff, flags=re.S)[:3000]
    with pytest.raises(ApiError, match="HTTP 404"):
        airflow.api("GET", "/sync/reconciliation?load=no-such-load", raw=True)

    # each page in Chromium at 1,280 px, light and dark: no horizontal scrolling; a lag series written
    # here drawn where it was written; the colour mode stored by Airflow's UI followed
    from tests.chromium import Chromium
    from tests.sync_view_checks import (
        assert_drawn_where_written,
        chart_points,
        in_airflow_ui,
        page_checks,
        write_lag_series,
    )

    wrote = write_lag_series(ch, ledger.database, "real_tier_view_failing")
    pages_seen = (("sync-view", "/sync/"), ("reconciliation", links["Sync view"]), ("diff", diff_link),
                  ("load", f"/sync/load?key={quote(key, safe='')}"),
                  ("pipeline", "/sync/?pipeline=real_tier_view_failing"), ("table", "/sync/table?name=demo.orders"))
    with Chromium(Path(airflow.home) / "chromium", 1280, 900) as browser:
        auth = {"Authorization": f"Bearer {airflow.token()}"}
        for name, path in pages_seen:
            png = Path(airflow.home) / f"sync-{name}.png"
            timing = browser.open(airflow.base + path, auth)
            seen = page_checks(browser, png)
            assert timing["status"] == 200 and png.stat().st_size > 10_000, name
            print(f"\n[airflow-real] {name}: loaded in Chromium in {timing['load']:.0f} ms, first paint "
                  f"{seen['first_paint']:.0f} ms; screenshots {png} (and -dark)")
            if name == "pipeline":
                assert_drawn_where_written(chart_points(browser, "lag-chart", "lag"), wrote)
        light = browser.evaluate("getComputedStyle(document.body).backgroundColor")
        browser.evaluate("localStorage.setItem('theme', 'dark')")  # as Airflow's UI stores its dark mode
        browser.open(airflow.base + "/sync/", auth)
        assert browser.evaluate("document.documentElement.className") == "dark"
        assert browser.evaluate("getComputedStyle(document.body).backgroundColor") != light
        browser.screenshot(Path(airflow.home) / "sync-sync-view-airflow-dark.png")
        # Airflow's own pages beside it, light and dark, and the view inside Airflow's UI (its nav entry):
        # the same font, sizes, weights, colours and backgrounds (asserted), screenshots side by side
        airflow.sign_in(browser)
        styles = in_airflow_ui(browser, airflow.base, Path(airflow.home))
        print(f"\n[airflow-real] the Sync view in Airflow's UI matches its audit log's styles: {styles}; screenshots "
              f"{airflow.home}/side-by-side.png (and -dark), sync-in-airflow.png, airflow-dags.png, airflow-events.png")


def test_a_source_group_dag_loads_gates_reconciles_and_streams_every_shard_into_one_table(tier):
    """dags/example_source_group.py as the scheduler runs it: a group's load → its counters sensor
    → a checksum reconciliation against every source → the group's CDC bootstrap and catch-up (a
    pipeline per source) → a deferred position sensor over every source in the real triggerer;
    both merged copies equal the union of the shards row for row, the CDC one after changes on
    every shard."""
    airflow, ch = tier.airflow, tier.ch
    members = [(s, d, t) for s in SHARDS for d, tables in SHOP.items() for t in tables]
    airflow.wait_for_dag("sync_demo_source_group")
    run = airflow.trigger("sync_demo_source_group")
    _succeeded(airflow, "sync_demo_source_group", [run], timeout=600)
    conns = {name: pymysql.connect(**MySQLEndpoint.from_url(url).connect_args(), autocommit=True)
             for name, url in tier.shards.items()}
    try:
        rows = assert_merged_rows(conns, ch, "analytics_group.orders", members)
        load = airflow.xcom("sync_demo_source_group", run, "load_orders")
        assert load["rows"] == rows and load["sources"] == list(SHARDS) and len(load["tables"]) == len(members)
        assert airflow.xcom("sync_demo_source_group", run, "counters")["verdict"] == "success"
        assert airflow.xcom("sync_demo_source_group", run, "reconcile")["verdict"] == "ok"
        sensor = airflow.xcom("sync_demo_source_group", run, "caught_up")
        assert set(sensor["sources"]) == set(SHARDS)
        assert assert_merged_rows(conns, ch, "analytics_group.orders_live", members) == rows
        for conn in conns.values():  # changes on every shard; a second run applies them all
            with conn.cursor() as cur:
                cur.execute("UPDATE shop_a.orders_0 SET amount = amount + 1 WHERE id % 5 = 0")
                cur.execute("DELETE FROM shop_b.orders_2 WHERE id % 7 = 0")
        again = airflow.trigger("sync_demo_source_group")
        _succeeded(airflow, "sync_demo_source_group", [again], timeout=600)
        assert_merged_rows(conns, ch, "analytics_group.orders_live", members)
    finally:
        for conn in conns.values():
            conn.close()

"""The example DAGs under a real Airflow (tests/airflow_real.py): scheduler with the
LocalExecutor, DAG processor, triggerer and API server as separate processes, driven through
the REST API as the UI drives them. Own MariaDB, ClickHouse endpoint and demo data, so what the
DAGs leave behind (pipelines, partitions) does not meet the `dags test` tier's.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pymysql
import pytest

from airflow_sync_provider.core.cdc.checkpoints import PIPELINE_FAILED, PIPELINE_RUNNING, Checkpoints, PipelineState
from airflow_sync_provider.core.cdc.positions import BinlogPosition, current_position
from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
from airflow_sync_provider.core.target import clickhouse as clickhouse_target
from devenv import demo_data
from devenv.airflow_env import REPO
from devenv.services import clickhouse_service, mysql_service
from tests.airflow_real import ApiError, RealAirflow
from tests.helpers import assert_same_rows

pytestmark = [pytest.mark.slow, pytest.mark.airflow_real]
DAYS = ("2025-01-02", "2025-01-03", "2025-01-04")


@pytest.fixture(scope="module")
def tier(tmp_path_factory):
    """Services, demo data and a running Airflow, shared by the tests of this module."""
    base = tmp_path_factory.mktemp("airflow-real")
    dags = base / "dags"  # the example DAGs themselves, and the test-only one
    dags.mkdir()
    for path in [*sorted((REPO / "dags").glob("*.py")), REPO / "tests" / "real_dags" / "wait_for_position.py"]:
        (dags / path.name).symlink_to(path)
    started = time.monotonic()
    with mysql_service(base) as mysql_url, clickhouse_service(base) as clickhouse_url:
        counts = demo_data.generate(mysql_url, "demo", orders=20_000, customers=2_000, item_orders=5_000)
        with RealAirflow(base / "home", mysql_url, clickhouse_url, dags) as airflow:
            airflow.timings["services"] = time.monotonic() - started
            conn = pymysql.connect(**MySQLEndpoint.from_url(mysql_url).connect_args(), autocommit=True)
            ch = clickhouse_target.client(ClickHouseEndpoint.from_url(clickhouse_url))
            yield airflow, conn, ch, counts
            print(f"\n[airflow-real] start-up: {airflow.timings}")
            ch.close()
            conn.close()


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


def test_full_load_dag_triggered_through_the_api_succeeds(tier):
    airflow, conn, ch, counts = tier
    airflow.wait_for_dag("sync_demo_full_load")
    run_id = airflow.trigger("sync_demo_full_load")
    _succeeded(airflow, "sync_demo_full_load", [run_id])
    for table, count in counts.items():
        assert assert_same_rows(conn, ch, "demo", table) == count
    assert airflow.xcom("sync_demo_full_load", run_id, "load_orders")["rows"] == counts["orders"]


def _day(conn, ch, day: str) -> tuple[set, set]:
    with conn.cursor() as cur:
        cur.execute("SELECT id, amount FROM demo.orders WHERE created_at >= %s AND created_at < %s + INTERVAL 1 DAY",
                    (day, day))
        source = set(cur.fetchall())
    target = set(ch.query("SELECT id, amount FROM demo.orders_daily FINAL WHERE _partition_id = {p:String}",
                          parameters={"p": day.replace("-", "")}).result_rows)
    return source, target


def _backfill(airflow: RealAirflow, reprocess: str) -> list[dict]:
    """A backfill over DAYS as the UI creates it (its runs are created, or cleared for
    reprocessing, by the request); returns its runs once they all ended."""
    backfill = airflow.api("POST", "/api/v2/backfills", {
        "dag_id": "sync_demo_daily_orders", "from_date": f"{DAYS[0]}T00:00:00Z", "to_date": f"{DAYS[-1]}T00:00:00Z",
        "max_active_runs": 3, "reprocess_behavior": reprocess})
    runs = [r for r in airflow.runs("sync_demo_daily_orders") if r["run_type"] == "backfill"]
    assert sorted(r["data_interval_start"][:10] for r in runs) == list(DAYS), runs
    ids = [r["dag_run_id"] for r in runs]
    _succeeded(airflow, "sync_demo_daily_orders", ids)
    deadline = time.monotonic() + 120  # the scheduler marks the backfill complete after its runs
    while not airflow.api("GET", f"/api/v2/backfills/{backfill['id']}")["completed_at"]:
        assert time.monotonic() < deadline, "the backfill was never marked complete"
        time.sleep(2)
    return [r for r in airflow.runs("sync_demo_daily_orders") if r["dag_run_id"] in ids]


def test_backfill_through_the_api_runs_days_side_by_side_and_reprocessing_changes_nothing(tier):
    airflow, conn, ch, _ = tier
    airflow.wait_for_dag("sync_demo_daily_orders")
    runs = _backfill(airflow, "none")
    loads = {r["dag_run_id"]: airflow.task_instances("sync_demo_daily_orders", r["dag_run_id"])["load_day"]
             for r in runs}
    # the scheduler ran the days' loads at once (max_active_runs=3): their run times overlap
    starts, ends = [ti["start_date"] for ti in loads.values()], [ti["end_date"] for ti in loads.values()]
    assert max(starts) < min(ends), loads
    first = {}
    for day in DAYS:
        source, target = _day(conn, ch, day)
        assert source and target == source, day
        first[day] = target
    raw, distinct = ch.query("SELECT count(), uniqExact(id) FROM demo.orders_daily").result_rows[0]
    assert raw == distinct

    again = _backfill(airflow, "completed")  # the same backfill, reprocessing the completed days
    assert len(again) == len(DAYS)
    for day in DAYS:
        assert _day(conn, ch, day)[1] == first[day], day
    assert ch.query("SELECT count(), uniqExact(id) FROM demo.orders_daily").result_rows[0] == (raw, distinct)
    generations = {airflow.xcom("sync_demo_daily_orders", r["dag_run_id"], "load_day")["generation"] for r in again}
    assert generations == {2}  # each day loaded afresh, not resumed from the first backfill


def _position_text(conn) -> str:
    position = current_position(conn)
    return f"{position.file}:{position.pos}"


def _wait_for_state(airflow: RealAirflow, dag_id: str, run_id: str, task_id: str, state: str, timeout=180) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        ti = airflow.task_instances(dag_id, run_id).get(task_id)
        if ti and ti["state"] == state:
            return ti
        if time.monotonic() > deadline:
            raise TimeoutError(f"{dag_id}.{task_id} is {ti and ti['state']}, not {state}:\n"
                               + _log_tail(airflow, dag_id, run_id))
        time.sleep(1)


def test_cdc_dag_succeeds_and_a_binlog_sensor_defers_into_the_real_triggerer(tier):
    airflow, conn, ch, counts = tier
    airflow.wait_for_dag("sync_demo_cdc")  # unpaused: the scheduler starts its latest interval's run
    deadline = time.monotonic() + 120
    while not airflow.runs("sync_demo_cdc"):
        assert time.monotonic() < deadline, "the scheduler started no run of sync_demo_cdc"
        time.sleep(2)
    first = airflow.runs("sync_demo_cdc")[0]["dag_run_id"]
    _succeeded(airflow, "sync_demo_cdc", [first])
    assert [t["rows"] for t in airflow.xcom("sync_demo_cdc", first, "bootstrap")["tables"]] == \
        [counts["orders"], counts["order_items"]]

    # the source changes; a sensor waits, deferred in the triggerer, for the position after the
    # change until a second run of the CDC DAG has applied it
    with conn.cursor() as cur:
        cur.execute("UPDATE demo.orders SET amount = amount + 1 WHERE id <= 500")
    target = _position_text(conn)
    airflow.wait_for_dag("sync_test_wait_for_position")
    wait = airflow.trigger("sync_test_wait_for_position", {"pipeline": "demo_cdc", "position": target})
    _wait_for_state(airflow, "sync_test_wait_for_position", wait, "wait", "deferred")
    second = airflow.trigger("sync_demo_cdc")
    _succeeded(airflow, "sync_demo_cdc", [second])
    _succeeded(airflow, "sync_test_wait_for_position", [wait], timeout=120)
    summary = airflow.xcom("sync_test_wait_for_position", wait, "wait")
    assert BinlogPosition.from_dict(summary["checkpoint"]).key() >= BinlogPosition.from_dict(target).key()
    for table in ("orders", "order_items"):
        assert assert_same_rows(conn, ch, "demo", table, target_database="demo_cdc") == counts[table]
    log = airflow.task_log("sync_test_wait_for_position", wait, "wait")
    assert "BinlogPositionTrigger" in (Path(airflow.home) / "triggerer.log").read_text(errors="replace") or \
        "defer" in log.lower(), log[-3000:]


def test_a_deferred_binlog_sensor_fails_fast_when_the_pipeline_reports_an_error(tier):
    airflow, conn, ch, _ = tier
    ledger = Checkpoints(ch)
    ledger.ensure()
    at = BinlogPosition.from_dict(_position_text(conn))
    ledger.write(PipelineState("real_tier_failing", PIPELINE_RUNNING, at, heartbeat=time.time()))
    airflow.wait_for_dag("sync_test_wait_for_position")
    far = f"{at.file}:{at.pos + 10**9}"
    run = airflow.trigger("sync_test_wait_for_position", {"pipeline": "real_tier_failing", "position": far})
    _wait_for_state(airflow, "sync_test_wait_for_position", run, "wait", "deferred")
    failed_at = time.monotonic()
    ledger.write(PipelineState("real_tier_failing", PIPELINE_FAILED, at, error="BinlogError: the binlog file was purged"))
    assert airflow.wait_for_runs("sync_test_wait_for_position", [run], timeout=120)[run] == "failed"
    assert time.monotonic() - failed_at < 60  # the trigger's next check, not the sensor's 600 s timeout
    ti = airflow.task_instances("sync_test_wait_for_position", run)["wait"]
    log = airflow.task_log("sync_test_wait_for_position", run, "wait", max(1, ti["try_number"]))
    assert "the binlog file was purged" in log, log[-3000:]


def _clear(airflow: RealAirflow, dag_id: str, run_id: str, task_id: str, only_failed: bool) -> None:
    """Clear a task and what follows it, as the UI's "Clear" does."""
    airflow.api("POST", f"/api/v2/dags/{dag_id}/clearTaskInstances", {
        "dry_run": False, "dag_run_id": run_id, "task_ids": [task_id], "only_failed": only_failed,
        "include_downstream": True, "reset_dag_runs": True})


def test_a_failed_shard_is_re_imported_by_clearing_the_task_through_the_api(tier):
    """A row the copy cannot take (a date before ClickHouse's range) fails its shard and the day's load; the row is
    fixed and the task cleared from the API: the load resumes and reads only that shard."""
    airflow, conn, ch, _ = tier
    airflow.wait_for_dag("sync_demo_daily_orders")
    day = DAYS[1]
    run = next(r for r in airflow.runs("sync_demo_daily_orders")
               if r["run_type"] == "backfill" and r["data_interval_start"][:10] == day)["dag_run_id"]
    with conn.cursor() as cur:
        cur.execute("SELECT MAX(id) FROM demo.orders WHERE created_at >= %s AND created_at < %s + INTERVAL 1 DAY",
                    (day, day))
        bad = cur.fetchone()[0]
        cur.execute("UPDATE demo.orders SET shipped_at = '1000-01-01 00:00:00' WHERE id = %s", (bad,))
    try:
        _clear(airflow, "sync_demo_daily_orders", run, "load_day", only_failed=False)
        assert airflow.wait_for_runs("sync_demo_daily_orders", [run])[run] == "failed"
        load = airflow.task_instances("sync_demo_daily_orders", run)["load_day"]
        log = airflow.task_log("sync_demo_daily_orders", run, "load_day", load["try_number"])
        assert "'shipped_at'" in log and "outside ClickHouse" in log and "reimport" in log, log[-3000:]
    finally:
        with conn.cursor() as cur:
            cur.execute("UPDATE demo.orders SET shipped_at = NULL WHERE id = %s", (bad,))
    _clear(airflow, "sync_demo_daily_orders", run, "load_day", only_failed=True)
    _succeeded(airflow, "sync_demo_daily_orders", [run])
    summary = airflow.xcom("sync_demo_daily_orders", run, "load_day")
    assert 0 < summary["shards_read"] < summary["shards"], summary  # only what had failed
    source, target = _day(conn, ch, day)
    assert target == source


def test_a_database_by_pattern_maps_one_task_instance_per_table(tier):
    """dags/example_whole_database.py's mapped DAG under the real scheduler: the discovery task's
    list becomes one load and one reconciliation per table, each with its own load key and a
    "Sync view" link; every copy equals its source."""
    airflow, conn, ch, counts = tier
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


def test_the_sync_view_shows_loads_pipelines_reconciliations_and_diffs_from_the_ledger(tier):
    """The provider's plugin: its pages are served by the API server, behind Airflow's auth, from
    the ledger: the loads (the backfill's days among them) with their shards' counters, the CDC
    pipelines (the example's, and the one the fail-fast test reported failed), the
    reconciliations and a snapshot diff with their reports; our tasks' "Sync view" links lead
    there. Each page is rendered by headless Chromium (a screenshot each)."""
    from urllib.parse import quote

    airflow, conn, _, _ = tier
    airflow.wait_for_dag("sync_demo_snapshot_diff")  # unpaused and @daily: the scheduler runs it once by itself
    deadline = time.monotonic() + 180
    while not any(r["run_type"] == "scheduled" for r in airflow.runs("sync_demo_snapshot_diff")):
        assert time.monotonic() < deadline, "the scheduler never ran sync_demo_snapshot_diff"
        time.sleep(2)
    airflow.wait_for_runs("sync_demo_snapshot_diff", [r["dag_run_id"] for r in airflow.runs("sync_demo_snapshot_diff")])
    with conn.cursor() as cur:  # something for this run to find
        cur.execute("UPDATE demo.orders SET note = CONCAT('view test ', id) WHERE id <= 3")
    diff_run = airflow.trigger("sync_demo_snapshot_diff")
    _succeeded(airflow, "sync_demo_snapshot_diff", [diff_run])
    plugins = airflow.api("GET", "/api/v2/plugins")["plugins"]
    sync = next(p for p in plugins if p["name"] == "airflow_sync")
    assert [v["href"] for v in sync["external_views"]] == ["/sync/"]
    with pytest.raises(ApiError, match="HTTP 401"):
        airflow.api("GET", "/sync/", auth=False, raw=True)
    page = airflow.api("GET", "/sync/", raw=True)
    for day in DAYS:
        assert f"daily_orders.{day}" in page
    assert "demo.orders → demo.orders_daily" in page and page.count("<tr class=") > len(DAYS)
    assert "<code>demo_cdc</code> — idle" in page and '<svg class="chart"' in page
    assert "<code>real_tier_failing</code> — failed" in page and "the binlog file was purged" in page
    assert '<meta http-equiv="refresh"' in page
    assert "href='reconciliation?load=" in page and "href='diff?key=demo_diff.orders&amp;run=" in page

    full_load = next(r for r in airflow.runs("sync_demo_full_load") if r["state"] == "success")["dag_run_id"]
    links = airflow.api("GET", f"/api/v2/dags/sync_demo_full_load/dagRuns/{full_load}/taskInstances/"
                               "reconcile_orders/links")["extra_links"]
    key = airflow.xcom("sync_demo_full_load", full_load, "load_orders")["load_key"]
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
    scoped = airflow.api("GET", "/sync/?pipeline=demo_cdc", raw=True)
    assert "<code>demo_cdc</code>" in scoped and "real_tier_failing" not in scoped and "daily_orders" not in scoped

    for name, path in (("sync-view", "/sync/"), ("reconciliation", links["Sync view"]), ("diff", diff_link)):
        png = airflow.screenshot(path, Path(airflow.home) / f"{name}.png")
        assert png.stat().st_size > 10_000, name
        print(f"\n[airflow-real] {name} screenshot: {png}")

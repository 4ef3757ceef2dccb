"""The Sync view's page as core renders it (no Airflow, no services): tests/test_airflow_real.py
fetches it from a running API server and screenshots it."""

from __future__ import annotations

import time

from airflow_sync_provider.core.cdc.checkpoints import PipelineState
from airflow_sync_provider.core.cdc.positions import BinlogPosition
from airflow_sync_provider.core.ledger import LoadState, ShardState, counters_verdict
from airflow_sync_provider.core.verify.reports import sync_html


def test_the_page_shows_loads_with_shard_counters_and_pipelines_with_a_chart():
    load = LoadState("daily.<2025-01-02>", 2, "running", "demo.orders", "demo.orders_daily",
                     {"shards": [{"id": 0}, {"id": 1}]}, "parts_x", 0, {}, heartbeat=time.time())
    load.shards = {0: ShardState(0, 1, "success", "1", [], 1_167, 1_167, 0, started_at=1.0, finished_at=2.0),
                   1: ShardState(1, 2, "failed", "1", [], 10, 5, 5, error="ValueError: <bad> date")}
    flow = PipelineState("demo_cdc", "running", BinlogPosition("mysql-bin.000002", 400), events=1_234,
                         heartbeat=time.time())
    counters = [{"table": "demo.orders", "minute": "2026-01-01T00:00:00", "events": 30, "rows_written": 30,
                 "rows_failed": 0},
                {"table": "demo.orders", "minute": "2026-01-01T00:01:00", "events": 10, "rows_written": 10,
                 "rows_failed": 0}]
    page = sync_html([load], {load.load_key: counters_verdict(load)}, [(flow, counters)])
    assert "daily.&lt;2025-01-02&gt;" in page and "<2025" not in page  # escaped
    assert "demo.orders → demo.orders_daily, generation 2, 1/2 shards done" in page
    assert "<tr class='bad'><td>1</td><td class='v'>failed</td><td>2</td><td>10</td><td>5</td><td>5</td>" in page
    assert "ValueError: &lt;bad&gt; date" in page
    assert "mysql-bin.000002:400" in page and "1,234 row changes" in page
    assert "nothing applied yet" in page or "caught up" in page or "lag ≈" in page
    assert page.count("<rect ") == 2 and "peak 30" in page
    empty = sync_html([], {})
    assert "No loads in the ledger yet" in empty and "No pipelines yet" in empty


def test_the_page_lists_reconciliations_and_diffs_linked_to_their_reports():
    checks = [{"load_key": "nightly:shop.a b", "generation": 3, "verdict": "mismatch", "mismatched": [2],
               "checksum": True}]
    runs = [{"diff_key": "diff:shop.t->ch.t", "run_id": "r1", "verdict": "changed", "rows_read_old": 5,
             "rows_read_new": 6, "counts": {"identical": 10, "changed": 1, "new": 2, "deleted": 0}}]
    page = sync_html([], {}, [], checks, runs, refresh=7, scope="Showing loads nightly")
    assert "href='reconciliation?load=nightly%3Ashop.a%20b'" in page and "<td>3</td>" in page
    assert "<tr class='bad'><td class='v'><a href='diff?key=diff%3Ashop.t-%3Ech.t&amp;run=r1'>" in page
    assert "<td>10</td><td>1</td><td>2</td><td>0</td><td>11</td>" in page
    assert '<meta http-equiv="refresh" content="7">' in page and "Showing loads nightly" in page
    empty = sync_html([], {})
    assert "No reconciliations yet" in empty and "No diffs yet" in empty


def test_each_operator_links_to_its_page_in_the_sync_view():
    from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
    from airflow_sync_provider.core.jobspec import FullLoadSpec, ReconcileSpec, SnapshotDiffSpec
    from airflow_sync_provider.links import SyncViewLink
    from airflow_sync_provider.operators.cdc_apply import CdcApplyOperator
    from airflow_sync_provider.operators.full_load import FullLoadOperator
    from airflow_sync_provider.operators.reconcile import ReconcileOperator
    from airflow_sync_provider.operators.snapshot_diff import SnapshotDiffOperator

    source, target = MySQLEndpoint("h", 1, "u", "p"), ClickHouseEndpoint("h", 2, "u", "p")
    load = FullLoadOperator(task_id="l", table="t")
    assert isinstance(load.operator_extra_links[0], SyncViewLink)
    assert load.sync_page(FullLoadSpec(source, target, "d", "t", "d", "t", load_key="k 1")) == "/sync/?load=k+1"
    check = ReconcileOperator(task_id="r", load_key="k")
    assert check.sync_page(ReconcileSpec(source, target, "a:b")) == "/sync/reconciliation?load=a%3Ab"
    assert check.sync_page(ReconcileSpec(source, target, "p", select={"databases": ["d"]})) == "/sync/?load=p"
    diff = SnapshotDiffOperator(task_id="d", old_table="d.t", source_table="d.t")
    assert diff.sync_page(SnapshotDiffSpec(target, "d.t", source, "d", "t", diff_key="x")) == "/sync/diff?key=x"
    assert CdcApplyOperator(task_id="c", pipeline="p1").sync_page(type("S", (), {"pipeline": "p1"})) == \
        "/sync/?pipeline=p1"
    link = SyncViewLink()
    load.sync_link = "/sync/?load=k"
    assert link.name == "Sync view" and link.get_link(load, ti_key=None) == "/sync/?load=k"


def test_a_pipeline_behind_the_source_shows_its_lag():
    behind = PipelineState("p", "running", BinlogPosition("mysql-bin.000002", 400),
                           source_position=BinlogPosition("mysql-bin.000002", 900), source_time=time.time() - 42,
                           heartbeat=time.time())
    assert "lag ≈ 42 s" in sync_html([], {}, [(behind, [])])
    caught_up = PipelineState("p", "idle", BinlogPosition("mysql-bin.000002", 900),
                              source_position=BinlogPosition("mysql-bin.000002", 900), heartbeat=time.time() - 5)
    assert "caught up as of 5 s ago" in sync_html([], {}, [(caught_up, [])])

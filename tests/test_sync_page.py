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
    assert page.count("<rect ") == 2 and "peak 30" in page
    empty = sync_html([], {})
    assert "No loads in the ledger yet" in empty and "No pipelines yet" in empty

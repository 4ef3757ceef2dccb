"""The provider's metrics: values computed in core (core/metrics.py) and names Airflow accepts;
sent through Airflow's own Stats to a StatsD listener on loopback as a task process sends them.
tests/test_airflow_real.py receives them from a running Airflow's worker and triggerer."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest
from airflow.sdk._shared.observability.metrics.validators import stat_name_default_handler, stat_name_otel_handler

from airflow_sync_provider.core import metrics
from airflow_sync_provider.core.cdc.checkpoints import PipelineState
from airflow_sync_provider.core.cdc.tables import PipelineTable
from airflow_sync_provider.core.loads import LoadState, ShardState
from airflow_sync_provider.core.positions import BinlogPosition


def _shard(i, attempt, status="success", read=10, written=10, failed=0):
    return ShardState(i, attempt, status, "1=1", [], read, written, failed)


def _load(shards, target="shop.orders_daily"):
    state = LoadState("daily.2025-01-02", 1, "failed", "shop.orders", target, {"shards": [{"id": s.shard_id}
                                                                                         for s in shards]}, "", 0, {})
    state.shards = {s.shard_id: s for s in shards}
    return state


@pytest.mark.parametrize("obj", ["demo.orders", "demo_cdc", "shop.my table (v2)", "ßchema.tä-ble", "a.b.c",
                                 "x" * 400, ""])
def test_every_name_passes_airflows_statsd_and_opentelemetry_rules(obj):
    names = [m.name for m in metrics.load_metrics(_load([_shard(0, 1)], target=obj), {}, 1.0)]
    names += [m.name for m in metrics.pipeline_gauges(PipelineState(obj or "p", checkpoint=BinlogPosition("f.1", 4),
                                                                    heartbeat=time.time()))]
    for name in names:
        assert stat_name_default_handler(name) == name
        assert stat_name_otel_handler("airflow", name) == f"airflow.{name}"
    long = [n for n in names if len(n) == metrics.MAX_NAME]
    if len(obj) > 300:  # shortened with a checksum: two long names stay apart
        assert long and all(n.rsplit("_", 1)[1].isalnum() for n in long)
        other = metrics.load_metrics(_load([_shard(0, 1)], target="y" * 400), {}, 1.0)[0].name
        assert other != names[0]


def test_a_table_is_two_segments_and_a_dot_inside_one_is_kept_apart():
    assert metrics._name("load", "rows_read", *metrics.table_object("demo.orders")) == "sync.load.rows_read.demo.orders"
    assert metrics._name("pipeline", "lag_seconds", "eu.orders") == "sync.pipeline.lag_seconds.eu__orders"
    assert metrics.table_object("a.b.c") == ("a", "b.c")  # the database ends at the first dot


def test_load_metrics_count_this_tries_shard_attempts_and_every_shard_that_did_not_succeed():
    # shards 0 and 1 succeeded in an earlier try (attempt 1); this try re-read 2 (failed again) and 3
    state = _load([_shard(0, 1, read=100, written=100), _shard(1, 1, read=100, written=100),
                   _shard(2, 2, "failed", read=7, written=0, failed=7), _shard(3, 1, "running", read=5, written=5)])
    got = {m.name: (m.kind, m.value) for m in metrics.load_metrics(state, {0: 1, 1: 1, 2: 1}, 12.5)}
    table = "shop.orders_daily"
    assert got == {f"sync.load.rows_read.{table}": ("incr", 12), f"sync.load.rows_written.{table}": ("incr", 5),
                   f"sync.load.rows_failed.{table}": ("incr", 7), f"sync.load.shards_failed.{table}": ("incr", 2),
                   f"sync.load.duration.{table}": ("timing", 12.5)}
    assert metrics.attempts(state) == {0: 1, 1: 1, 2: 2, 3: 1}
    again = metrics.load_metrics(state, metrics.attempts(state), None)  # nothing new read: all zero, no duration
    assert [m.value for m in again] == [0, 0, 0, 0]


def test_pipeline_gauges_and_the_counters_of_a_run():
    now = 1_000_000.0
    state = PipelineState("orders_cdc", "running", BinlogPosition("f.2", 400), [
        PipelineTable("shop", "orders"), PipelineTable("shop", "items", recopying={"reason": "DDL", "started": now})],
        source_position=BinlogPosition("f.2", 900), source_time=now - 300, heartbeat=now - 20)
    got = {m.name.rsplit(".", 1)[0]: m.value for m in metrics.pipeline_gauges(state, now)}
    assert got == {"sync.pipeline.lag_seconds": 300, "sync.pipeline.checkpoint_age_seconds": 20,
                   "sync.pipeline.recopies_running": 1, "sync.pipeline.failed": 0}
    measured = {m.name: m.value for m in metrics.pipeline_gauges(state, now, measured_lag=7.5)}
    assert measured["sync.pipeline.lag_seconds.orders_cdc"] == 7.5
    state.status = "failed"
    assert {m.name: m.value for m in metrics.pipeline_gauges(state, now)}["sync.pipeline.failed.orders_cdc"] == 1
    result = {"pipeline": "orders_cdc", "events": 1234, "repaired_shards": 2, "recopied": ["shop.items"],
              "verified": [{"table": "shop.orders", "mismatched": [1, 4]}, {"table": "shop.items", "mismatched": []}]}
    counters = {m.name: (m.kind, m.value) for m in metrics.pipeline_run_counters(result)}
    assert counters == {"sync.pipeline.changes_applied.orders_cdc": ("incr", 1234),
                        "sync.pipeline.verifications.orders_cdc": ("incr", 2),
                        "sync.pipeline.verify_mismatches.orders_cdc": ("incr", 2),
                        "sync.pipeline.repairs.orders_cdc": ("incr", 2),
                        "sync.pipeline.recopies.orders_cdc": ("incr", 1)}


def test_reconciliation_and_diff_metrics_carry_the_verdict_and_rows_read():
    check = {"target": "shop.orders", "load_key": "k", "verdict": "mismatch", "mismatched": [3],
             "shards": [{"source_rows": 10, "target_rows": 9}, {"source_rows": 5, "target_rows": 5}]}
    assert {m.name: m.value for m in metrics.reconcile_metrics(check)} == {
        "sync.reconcile.mismatch.shop.orders": 1, "sync.reconcile.mismatched_shards.shop.orders": 1,
        "sync.reconcile.rows_read.shop.orders": 29}
    diff = {"old": "copy.orders", "diff_key": "d", "verdict": "changed", "rows_read_old": 3, "rows_read_new": 4,
            "counts": {"identical": 100, "changed": 2, "new": 1, "deleted": 0}}
    assert {m.name: m.value for m in metrics.diff_metrics(diff)} == {
        "sync.diff.changed.copy.orders": 1, "sync.diff.rows_read.copy.orders": 7,
        "sync.diff.differences.copy.orders": 3}


def test_metrics_reach_a_statsd_server_through_airflows_stats(tmp_path):
    """A process configured as Airflow configures a task's (``[metrics] statsd_on``) sends our
    metrics through ``Stats``: counters, gauges and timings arrive with Airflow's prefix."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    listener.bind(("127.0.0.1", 0))
    listener.settimeout(30)
    sent = [metrics.Metric(metrics.GAUGE, "sync.pipeline.lag_seconds.orders_cdc", 12.5, {"pipeline": "orders_cdc"}),
            metrics.Metric(metrics.INCR, "sync.load.shards_failed.shop.orders", 2, {"table": "shop.orders"}),
            metrics.Metric(metrics.TIMING, "sync.load.duration.shop.orders", 1.5, {"table": "shop.orders"})]
    script = ("import json, sys\n"
              "from airflow.sdk._shared.observability.metrics import stats\n"
              "from airflow.sdk.observability.metrics import stats_utils\n"
              "from airflow_sync_provider.core.metrics import Metric\n"
              "from airflow_sync_provider.stats import emit\n"
              "stats.initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=False)  # as a task does\n"
              "emit([Metric(**m) for m in json.loads(sys.argv[1])])\n")
    env = {"AIRFLOW_HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "AIRFLOW__METRICS__STATSD_ON": "True",
           "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
           "AIRFLOW__METRICS__STATSD_PORT": str(listener.getsockname()[1]),
           "AIRFLOW__METRICS__STATSD_PREFIX": "airflow"}
    out = subprocess.run([sys.executable, "-c", script, json.dumps([vars(m) for m in sent])], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    received = set()
    while len(received) < 3:  # Airflow's own metrics come too (serde.load_serializers)
        received |= {line for line in listener.recv(65536).decode().split("\n") if line.startswith("airflow.sync.")}
    listener.close()
    assert received == {"airflow.sync.pipeline.lag_seconds.orders_cdc:12.5|g",
                        "airflow.sync.load.shards_failed.shop.orders:2|c",
                        "airflow.sync.load.duration.shop.orders:1500.000000|ms"}

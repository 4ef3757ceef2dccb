"""Our metrics (core/metrics.py computes them) sent through Airflow's ``Stats``, from the Airflow
processes that know them: a job operator after its job (counters of what the run did, in the
task's process), a sensor or trigger while it watches a pipeline (gauges, in the worker or the
triggerer). What each metric means and where it comes from: docs/metrics.md."""

from __future__ import annotations

import logging

from airflow_sync_provider.compat import Stats
from airflow_sync_provider.core.metrics import GAUGE, INCR, Metric, pipeline_gauges

log = logging.getLogger(__name__)


def emit(metrics: list[Metric]) -> None:
    """Send each metric; a metrics backend that fails is logged, never fails the task."""
    for m in metrics:
        try:
            if m.kind == INCR:
                Stats.incr(m.name, int(m.value), tags=m.tags)
            elif m.kind == GAUGE:
                Stats.gauge(m.name, m.value, tags=m.tags)
            else:
                Stats.timing(m.name, m.delta, tags=m.tags)
        except Exception:  # noqa: BLE001 - a metric is never worth a failed task
            log.warning("could not send metric %s", m.name, exc_info=True)


def pipeline_state(target, pipeline: str, database: str):
    """The pipeline's ``PipelineState`` in the ledger, or None (none yet, or unreadable: logged)."""
    from airflow_sync_provider.core.cdc.checkpoints import Checkpoints
    from airflow_sync_provider.core.clickhouse.client import client

    try:
        ch = client(target)
        try:
            return Checkpoints(ch, database).state(pipeline)
        finally:
            ch.close()
    except Exception:  # noqa: BLE001 - the sensor's own check reports ledger trouble
        log.warning("could not read pipeline %r for its metrics", pipeline, exc_info=True)
        return None


def watch_pipeline(target, pipeline: str, database: str, measured_lag: float | None = None) -> None:
    """A sensor's or trigger's look at a pipeline, as gauges (lag, checkpoint age, re-copies
    under way, failed) read from the ledger; ``measured_lag``: the lag it measured against the
    source's position now, if it did."""
    state = pipeline_state(target, pipeline, database)
    if state is not None:
        emit(pipeline_gauges(state, measured_lag=measured_lag))

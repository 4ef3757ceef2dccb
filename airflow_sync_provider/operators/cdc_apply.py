from __future__ import annotations

from airflow_sync_provider.assets import clickhouse_table, mysql_table, qualified, target_of
from airflow_sync_provider.core.jobspec import CdcApplySpec
from airflow_sync_provider.core.ledger import DEFAULT_LEDGER_DATABASE, TASK_PIPELINE
from airflow_sync_provider.core.metrics import pipeline_gauges, pipeline_run_counters
from airflow_sync_provider.core.source.group import Merge, one_server
from airflow_sync_provider.hooks.endpoints import SyncEndpointsHook
from airflow_sync_provider.links import sync_link
from airflow_sync_provider.operators.configs import Layout, Selection, layout_argument, unpack
from airflow_sync_provider.operators.spark_job import SparkJobOperator
from airflow_sync_provider.stats import pipeline_state


class CdcApplyOperator(SparkJobOperator):
    """Catch a CDC pipeline up: apply the source's binlog changes from the pipeline's checkpoint
    to the position the source had when the task started (a bounded run), then stop.

    Versions follow the binlog order, so re-running (an Airflow retry, a backfill, a crash)
    replays from the checkpoint and duplicates nothing; the checkpoint only passes changes
    whose writes ClickHouse acknowledged.

    :param pipeline: the pipeline's name in the ledger (its checkpoint, tables, counters).
    :param start_from_loads: full-load keys whose tables join the pipeline from the binlog
        position those loads began at (tables bootstrapped by ``CdcBootstrapOperator`` join by
        themselves; a running pipeline replays a new table up to its checkpoint first).
    :param selection: ``Selection(tables=…, select=…)``, or the plain ``tables`` (entries may
        carry a ``start_position``) / ``select`` (:mod:`airflow_sync_provider.operators.configs`):
        the tables selected now and those later created or renamed onto a selected name are copied
        beside the stream and join it.
    :param start_position: ``{"file": …, "pos": …}`` for a new pipeline without full loads.
    :param stop_position: stop here instead of at the source's position at start.
    :param lanes: apply lanes (concurrent writers); keys are routed on a consistent-hash ring
        with ``vnodes`` virtual nodes per lane.
    :param batch_events: row changes per batch (a checkpoint after each).
    :param batch_bytes: row-event bytes per batch. A transaction larger than ``batch_events`` or
        ``batch_bytes`` is written in pieces of that size (the checkpoint passes it only at its
        commit): the bound on the applier's memory (docs/cdc.md, Large transactions).
    :param driver_write_rows: a batch of at most this many row changes is written by the
        driver's lane threads, a larger one by Spark tasks (0: always Spark tasks).
    :param verify_period: every table is checked against the source slice by slice at least
        once per this many seconds (default 900), beside the stream; mismatched slices are
        repaired in place (docs/cdc.md, Verification). 0: only tables due (after a DDL, a
        re-copy, a takeover, or ``verify``).
    :param verify_budget: the share of one source core the checks may use (default 0.1).
    :param verify: check every table once in this run (before it ends).
    :param verify_after_ddl: check a table at once after a DDL changed it (default on).
    :param change_selection: replace the patterns the pipeline keeps with ``select`` (else a run
        with other patterns than the pipeline's is refused).
    :param on_binlog_lost: the binlog the checkpoint needs is gone (purged; a new server without
        that history): ``"recopy"`` (default) restarts the stream at the source's position now and
        copies every table again beside it; ``"stop"`` stops the pipeline, at every retry.
    :param reset: forget the checkpoint and start again from ``start_from_loads`` (after a
        re-bootstrap, e.g. when the checkpoint's binlog file was purged).
    :param sources, merge_into: a source group's pipeline (as ``CdcBootstrapOperator`` took them,
        docs/source-groups.md): every source's pipeline ``<pipeline>@<source>`` is run, each with
        its own checkpoint, server and lag; one failing or stopping does not stop the others (the
        task fails at its end naming it). XCom: ``sources`` (each one's summary).
    :param placement: a group's sources run in this driver (``"driver"``, a thread each) or as one
        long-running Spark task each on the cluster's executors (``"executors"``).
    :param on_shard_removed: a group's shard that leaves (its table dropped or renamed away):
        its rows in the merged copy are kept (``"keep"``) or deleted (``"delete"``).
    :param reshape: lay the named ``tables``' copies out anew under ``layout`` (their entries' own over
        it): each is re-copied beside the stream into a new table and swapped in when done, the
        changes going on into it; the task ends once every swap is recorded (docs/layouts.md).
    :param layout: ``Layout(…)`` or its dict form (:mod:`airflow_sync_provider.operators.configs`):
        the layout a reshape lays the copies out in.
    :param history: ``True`` or the history's options (``partition_by``, ``retention_days``): keep
        every version of the copies' rows in ``<table>_history``, begun from each copy as it is at
        the checkpoint (docs/content.md, History). Until they write it too, an XA transaction, a
        cascade, a TRUNCATE or DDL, a re-copy or a repair of such a copy stops the pipeline.
    """

    job = "cdc_apply"
    template_fields = ("pipeline", "start_from_loads", "tables", "select", "start_position", "stop_position",
                       "merge_into")

    def __init__(self, *, pipeline: str, selection: Selection | dict | None = None,
                 mysql_conn_id: str = "mysql_default", clickhouse_conn_id: str = "clickhouse_default",
                 start_from_loads: list | None = None,
                 tables: list | None = None, select: dict | None = None, start_position: dict | None = None,
                 stop_position: dict | None = None,
                 lanes: int = 4, vnodes: int = 256, batch_events: int = 50_000, batch_bytes: int = 16 << 20,
                 driver_write_rows: int = 500_000,
                 reset: bool = False, reshape: bool = False, layout: Layout | dict | None = None,
                 verify: bool = False, verify_period: float = 900.0, verify_budget: float = 0.1,
                 verify_after_ddl: bool = True, change_selection: bool = False, on_binlog_lost: str = "recopy",
                 verify_every: float = 0.0, sources: list | None = None, merge_into: str = "",
                 placement: str = "driver", on_shard_removed: str = "keep",
                 follow_cascades: bool = True, cascade_rows: int = 2_000_000,
                 history: bool | dict | None = None,
                 ledger_database: str = DEFAULT_LEDGER_DATABASE, **kwargs):
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.follow_cascades, self.cascade_rows = follow_cascades, cascade_rows
        self.sources = sources
        self.merge_into = merge_into
        self.placement = placement
        self.on_shard_removed = on_shard_removed
        self.mysql_conn_id = mysql_conn_id
        self.clickhouse_conn_id = clickhouse_conn_id
        self.start_from_loads = start_from_loads
        given = unpack(self, {"selection": selection}, dict(tables=tables, select=select))
        self.tables, self.select = given["tables"], given["select"]  # the Selection unpacked into them
        self.start_position = start_position
        self.stop_position = stop_position
        self.lanes = lanes
        self.vnodes = vnodes
        self.batch_events = batch_events
        self.batch_bytes = batch_bytes
        self.driver_write_rows = driver_write_rows
        self.reset = reset
        self.reshape = reshape
        self.layout = layout_argument(self, layout)
        self.verify, self.verify_period, self.verify_budget = verify, verify_every or verify_period, verify_budget
        self.verify_after_ddl, self.change_selection = verify_after_ddl, change_selection
        self.on_binlog_lost = on_binlog_lost
        self.history = history  # carried by self.tableset() as the job's content (spark_job.SparkJobOperator)
        self.ledger_database = ledger_database
        named = self.tables if isinstance(self.tables, (list, tuple)) else []
        self.declare_assets([mysql_table(mysql_conn_id, *q) for t in named if (q := qualified(t))],
                            [clickhouse_table(clickhouse_conn_id, *q) for t in named if (q := target_of(t))])

    def sync_page(self, spec) -> str:
        return sync_link(pipeline=spec.pipeline)

    def ledger_subject(self, spec):
        return TASK_PIPELINE, spec.pipeline

    def job_metrics(self, spec, result, seconds, baseline):
        """What the run did (counters), and where the pipeline stands after it (gauges)."""
        state = pipeline_state(spec.target, spec.pipeline, spec.ledger_database)
        return (pipeline_run_counters(result) if result else []) + (pipeline_gauges(state) if state else [])

    def build_spec(self, context) -> CdcApplySpec:
        hook = SyncEndpointsHook(self.mysql_conn_id, self.clickhouse_conn_id)
        group = hook.sources(self.sources) if self.sources else []
        return CdcApplySpec(sources=group or one_server(hook.source()), target=hook.target(), pipeline=self.pipeline,
                            merge=Merge.of(self.merge_into, placement=self.placement,
                                           on_shard_removed=self.on_shard_removed),
                            tableset=self.tableset(),
                            start_from_loads=list(self.start_from_loads or []), start_position=self.start_position,
                            stop_position=self.stop_position, lanes=self.lanes, vnodes=self.vnodes,
                            batch_events=self.batch_events, batch_bytes=self.batch_bytes,
                            driver_write_rows=self.driver_write_rows, reset=self.reset, reshape=self.reshape,
                            verify=self.verify,
                            verify_period=self.verify_period, verify_budget=self.verify_budget,
                            verify_after_ddl=self.verify_after_ddl, change_selection=self.change_selection,
                            on_binlog_lost=self.on_binlog_lost, follow_cascades=self.follow_cascades,
                            cascade_rows=self.cascade_rows, ledger_database=self.ledger_database)

    def summarize(self, result: dict) -> dict:
        if "sources" in result:  # a source group: every source's pipeline
            for name, one in result["sources"].items():
                self.log.info("Source %s:", name)
                self.summarize(one)
            return {"pipeline": result["pipeline"], "events": result["events"], "rows_written": result["rows_written"],
                    "sources": {n: {k: one.get(k) for k in ("pipeline", "checkpoint", "events", "rows_written")}
                                for n, one in result["sources"].items()}, "seconds": result["seconds"]}
        self.log.info("Pipeline %s: %d row changes applied (%d rows written) from %s to %s in %.1f s",
                      result["pipeline"], result["events"], result["rows_written"], result["start"],
                      result["checkpoint"], result["seconds"])
        for look in result["verified"]:
            self.log.info("Verified %s up to %s: %d slice(s), mismatched %s%s", look["table"], look["position"],
                          look["shards"], look["mismatched"] or "none",
                          f" ({look['note']})" if look.get("note") else "")
        if result.get("cascaded_rows"):
            self.log.info("Foreign-key cascades: %d child rows written at their parents' positions",
                          result["cascaded_rows"])
        return {k: result.get(k) for k in ("pipeline", "tables", "joined", "start", "checkpoint", "stop", "events",
                                           "rows_written", "cascaded_rows", "ddl", "recopied", "verified",
                                           "repaired_shards", "seconds")}

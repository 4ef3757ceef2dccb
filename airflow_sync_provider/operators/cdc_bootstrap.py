from __future__ import annotations

from airflow_sync_provider.assets import clickhouse_table, mysql_table, namespace, qualified, source_of, target_of
from airflow_sync_provider.core.jobspec import DEFAULT_CHUNK_ROWS, CdcBootstrapSpec
from airflow_sync_provider.core.ledger import DEFAULT_LEDGER_DATABASE, TASK_LOAD
from airflow_sync_provider.core.source.group import Merge, one_server
from airflow_sync_provider.hooks.endpoints import SyncEndpointsHook
from airflow_sync_provider.links import sync_link
from airflow_sync_provider.operators.configs import Content, Layout, Selection, SpeedLimits, layout_argument, unpack
from airflow_sync_provider.operators.spark_job import SparkJobOperator


class CdcBootstrapOperator(SparkJobOperator):
    """Copy a CDC pipeline's tables while the source keeps changing — no locks, chunk by chunk —
    and hand them over to the pipeline's catch-up (``CdcApplyOperator``), which replays their
    changes from the position the bootstrap began at. Works on a busy primary or a replica.

    Resumable: a re-run (an Airflow retry) continues after each shard's last finished chunk.
    Adding a table to a running pipeline is a bootstrap of just that table; the pipeline's
    catch-up picks it up by itself. XCom: ``start_position`` / ``end_position`` (give the end
    to ``BinlogPositionSensor``), rows and chunks per table.

    The tables, their layout, their content and the read speed are settings documented once, in
    :mod:`airflow_sync_provider.operators.configs` (docs/operators/configs.md): each given as a
    config object or as its plain arguments.

    :param pipeline: the pipeline the tables join.
    :param selection: ``Selection(tables=…, select=…)``, or the plain ``tables`` / ``select``
        (docs/cdc.md, "A database by pattern"). Tables CDC cannot stream are left out and listed
        in XCom ``unstreamable`` with the reason.
    :param layout: ``Layout(…)`` or its dict form: how the copies are laid out in ClickHouse.
    :param content: ``Content(…)``, or the plain ``transform``, ``row_filter``, ``on_delete``, ``history``.
    :param speed: ``SpeedLimits(channels=…, channel_byte=…, channel_record=…)``, or the plain
        ``channels`` (default 2), ``channel_byte_speed``, ``channel_record_speed``.
    :param chunk_rows: rows per chunk: each chunk is one short consistent read.
    :param watermark_table: MySQL sources only: a ``db.table`` the job may create and write,
        which makes each chunk's binlog position exact (MariaDB reports it without one).
    :param restart: start again instead of resuming an unfinished bootstrap.
    :param driver_copy_rows: tables estimated at no more rows are read by the Spark driver's own
        channels (threads), without executors; default: 300,000 on a cluster, every table on a
        local master; 0: always Spark tasks.
    :param sources, merge_into: a source group (docs/source-groups.md): ``select`` / ``tables``
        applied to every source, each source's tables joining its own pipeline
        ``<pipeline>@<source>``; with ``merge_into`` (``"db.table"``) all of them bootstrapped into one
        merged copy (its columns the union of the shards', created or extended before anything is
        copied). XCom: ``sources`` (each one's summary), ``tables`` (with their ``source``).
    """

    job = "cdc_bootstrap"
    template_fields = ("layout", "transform", "row_filter", "pipeline", "tables", "select", "merge_into")

    def __init__(self, *, pipeline: str, selection: Selection | dict | None = None,
                 layout: Layout | dict | None = None, content: Content | dict | None = None,
                 speed: SpeedLimits | dict | None = None, tables: list | None = None, select: dict | None = None,
                 transform: dict | None = None,
                 row_filter: str | None = None, on_delete: str | None = None,
                 history: bool | dict | None = None,
                 mysql_conn_id: str = "mysql_default", clickhouse_conn_id: str = "clickhouse_default",
                 channels: int = 2, chunk_rows: int = DEFAULT_CHUNK_ROWS, split_factor: int | None = None,
                 watermark_table: str | None = None, restart: bool = False,
                 channel_record_speed: int | None = None, channel_byte_speed: int | None = None,
                 ledger_database: str = DEFAULT_LEDGER_DATABASE, driver_copy_rows: int | None = None,
                 sources: list | None = None, merge_into: str = "", **kwargs):
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.sources = sources
        self.merge_into = merge_into
        self.layout = layout_argument(self, layout)
        for name, value in unpack(self, {"selection": selection, "content": content, "speed": speed}, dict(
                tables=tables, select=select, transform=transform, row_filter=row_filter, on_delete=on_delete,
                history=history,
                channels=channels, channel_byte_speed=channel_byte_speed,
                channel_record_speed=channel_record_speed)).items():
            setattr(self, name, value)  # the plain arguments, with the config objects unpacked into them
        self.tables = self.tables or []
        self.mysql_conn_id = mysql_conn_id
        self.clickhouse_conn_id = clickhouse_conn_id
        self.chunk_rows = chunk_rows
        self.split_factor = split_factor
        self.watermark_table = watermark_table
        self.restart = restart
        self.ledger_database = ledger_database
        self.driver_copy_rows = driver_copy_rows
        tables = self.tables if isinstance(self.tables, (list, tuple)) else []
        self.declare_assets([mysql_table(mysql_conn_id, *q) for t in tables if (q := qualified(t))],
                            [clickhouse_table(clickhouse_conn_id, *q) for t in tables if (q := target_of(t))])

    def sync_page(self, spec) -> str:
        return sync_link(pipeline=spec.pipeline)

    def ledger_subject(self, spec):
        return TASK_LOAD, f"cdc:{spec.pipeline}"  # the prefix of its tables' load keys (jobspec.bootstrap_load_key)

    def lineage(self, spec, result):
        return ([(namespace("mysql", source_of(spec, t)), t["table"]) for t in result["tables"]],
                [(namespace("clickhouse", spec.target), t["target"], t["rows"]) for t in result["tables"]])

    def build_spec(self, context) -> CdcBootstrapSpec:
        hook = SyncEndpointsHook(self.mysql_conn_id, self.clickhouse_conn_id)
        group = hook.sources(self.sources) if self.sources else []
        return CdcBootstrapSpec(sources=group or one_server(hook.source()), target=hook.target(),
                                pipeline=self.pipeline, merge=Merge.of(self.merge_into),
                                tableset=self.tableset(), channels=self.channels,
                                chunk_rows=self.chunk_rows, watermark_table=self.watermark_table, restart=self.restart,
                                channel_record_speed=self.channel_record_speed,
                                channel_byte_speed=self.channel_byte_speed, ledger_database=self.ledger_database,
                                driver_copy_rows=self.driver_copy_rows, split_factor=self.split_factor)

    def summarize(self, result: dict) -> dict:
        if "sources" in result:  # a source group
            for table in result["tables"]:
                self.log.info("Bootstrap of %s:%s: %d rows in %d chunks, %.1f s", table["source"], table["table"],
                              table["rows"], table["chunks"], table["seconds"])
            return {k: result[k] for k in ("pipeline", "merge_into", "tables", "rows", "seconds")} | {
                "sources": {n: {k: r.get(k) for k in ("pipeline", "start_position", "end_position", "rows")}
                            for n, r in result["sources"].items()}}
        for table in result["tables"]:
            self.log.info("Bootstrap of %s: %d rows in %d chunks (%d rows read by this run), %.1f s",
                          table["table"], table["rows"], table["chunks"], table["rows_read_now"], table["seconds"])
        for name, why in result["unstreamable"].items():
            self.log.warning("%s is left out: %s", name, why)
        return {k: result[k] for k in ("pipeline", "tables", "unstreamable", "rows", "start_position", "end_position",
                                       "seconds")}

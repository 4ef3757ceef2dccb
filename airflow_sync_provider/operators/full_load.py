from __future__ import annotations

from airflow_sync_provider.assets import clickhouse_table, is_static, mysql_table, namespace, source_of
from airflow_sync_provider.core.clickhouse.inserts import MAX_BYTES as INSERT_BYTES
from airflow_sync_provider.core.clickhouse.inserts import MAX_ROWS as INSERT_ROWS
from airflow_sync_provider.core.jobspec import FullLoadSpec
from airflow_sync_provider.core.ledger import DEFAULT_LEDGER_DATABASE, TASK_LOAD
from airflow_sync_provider.core.metrics import attempts, load_metrics
from airflow_sync_provider.core.source.group import Merge, one_server
from airflow_sync_provider.core.verify.reports import shard_table
from airflow_sync_provider.hooks.endpoints import SyncEndpointsHook
from airflow_sync_provider.links import sync_link
from airflow_sync_provider.operators.configs import Content, Layout, Selection, SpeedLimits, layout_argument, unpack
from airflow_sync_provider.operators.spark_job import SparkJobOperator


def default_load_key(task, context, source_database: str | None) -> str:
    """``<dag>.<task>.<run_id>``; a mapped task's instances (one table each) add the table."""
    key = f"{task.dag_id}.{task.task_id}.{context['run_id']}"
    ti = context.get("ti") if hasattr(context, "get") else None
    if getattr(ti, "map_index", -1) is not None and getattr(ti, "map_index", -1) >= 0 and task.table:
        key += f".{source_database}.{task.table}"
    return key


class FullLoadOperator(SparkJobOperator):
    """Copy one MySQL table (or one period of it) into ClickHouse, restartably.

    A full reload is built aside and swapped in atomically; a period load (``where`` +
    ``partition_by`` + ``replace_partitions``) replaces exactly its partitions, so a backfill of
    the same period is idempotent. Progress and hook counters go to the ledger as they happen.

    The tables, their layout, their content and the read speed are settings documented once, in
    :mod:`airflow_sync_provider.operators.configs`: each given as a config object or as its plain
    arguments (docs/operators/configs.md).

    :param selection: ``Selection(…)``, or the plain ``table`` (one table), ``select`` / ``tables``
        (many: each table is a load of its own, keyed ``<load_key>:<db>.<table>``, the other
        parameters applying to every table; XCom ``tables``, one summary each, ``selected``,
        ``rows``), ``source_database``, ``target_database``, ``target_table``, ``columns``,
        ``exclude_columns``.
    :param layout: ``Layout(…)`` or its dict form: how the copies are laid out in ClickHouse.
    :param content: ``Content(…)``, or the plain ``transform``, ``row_filter``, ``on_delete``, ``history``: what
        the copies hold.
    :param speed: ``SpeedLimits(…)``, or the plain ``channels`` (default 2), ``byte_speed``,
        ``record_speed``, ``channel_byte_speed``, ``channel_record_speed``.
    :param parallel_tables: tables copied at once in a task of many (each with its ``channels``).
    :param sources: a source group instead of ``mysql_conn_id``: ``[{"name": "s0", "mysql_conn_id":
        "shard0"}, …]``, ``select`` / ``tables`` applied to every source (docs/source-groups.md).
    :param merge_into: with ``sources``, ``"db.table"``: every selected table of every source copied
        into this one table, keyed by the primary key and the source columns ``_source``,
        ``_source_database``, ``_source_table``, published at once; each source table is a load of
        its own (``<load_key>:<source>:<db>.<table>``). Without it the sources' tables are copied
        side by side (target database ``{source}_{database}`` unless the selection names one).
    :param load_key: names the load in the ledger (default ``<dag>.<task>.<run_id>``, with
        ``.<db>.<table>`` added in a mapped task): a retry resumes it and reads only unfinished
        shards; once published, the same key copies afresh.
    :param reimport: ``"failed"`` re-reads only the failed (or never finished) shards of an
        unpublished load, then publishes; for a published load, the shards a reconciliation
        marked ``mismatch`` are re-read and replaced in place in the published table.
    :param batch_rows: rows per read batch (the unit a channel streams to ClickHouse).
    :param insert_rows, insert_bytes: a channel's INSERT ends at this many rows or Arrow bytes
        (few large inserts: few parts for ClickHouse to merge; streamed, they cost no memory).
    :param split_column: column to shard on (default: primary key → unique → plain index).
    :param split_factor: shards per channel; default: DataX's 5, fewer for a table whose shards would
        hold under 50,000 rows (``planning.auto_split_factor``). A NULL shard is added.
    :param strategy: ``balanced`` (index-ordered bounds, even shards) or ``equal`` (equal widths).
    :param where, where_params: MySQL filter with ``%s`` placeholders and their (templated) values,
        e.g. ``"created_at >= %s AND created_at < %s"``, ``["{{ data_interval_start | ds }}", …]``.
    :param partition_by: ClickHouse PARTITION BY expression of the target, e.g. ``toYYYYMMDD(created_at)``.
    :param replace_partitions: partition ids the period owns, e.g. ``["{{ ds_nodash }}"]``.
    :param ledger_database: ClickHouse database of the ledger (default ``airflow_sync``).
    :param skip_if_published: when ``load_key`` is already published, do nothing and return its
        summary (e.g. the full load a CDC pipeline starts from, in a scheduled DAG); in a task of
        many tables, per table. Without it, a task of many tables run again after an unfinished
        run of its key (a retry after a table failed, or after the job died) goes on with that run:
        the tables it published are not copied again (``skipped``); once a run of the key has
        published every table, the next one copies them all afresh.
    :param reader: ``auto`` (default: Arrow-native, unless a probe of the first rows disagrees with
        mysqlclient; the task log says which ran), ``native`` or ``mysqlclient``.
    :param driver_copy_rows: tables estimated at no more rows are copied by the Spark driver
        alone, without starting executors (default: 300,000 on a cluster, every table on a local
        master; 0: always on executors).
    :param reshape: the copy exists laid out otherwise: this load replaces it under ``layout`` (a copy
        a CDC pipeline follows is laid out anew by ``CdcApplyOperator(reshape=True)``).
    """

    job = "full_load"
    template_fields = ("layout", "transform", "row_filter", "table", "select", "tables", "merge_into", "load_key",
                       "source_database", "target_database", "target_table",
                       "columns", "exclude_columns", "split_column", "where", "where_params", "replace_partitions")

    def __init__(self, *, selection: Selection | dict | None = None, layout: Layout | dict | None = None,
                 content: Content | dict | None = None, speed: SpeedLimits | dict | None = None,
                 table: str | None = None, select: dict | None = None, tables: list | None = None,
                 transform: dict | None = None,
                 row_filter: str | None = None, on_delete: str | None = None,
                 history: bool | dict | None = None,
                 parallel_tables: int = 2, mysql_conn_id: str = "mysql_default",
                 clickhouse_conn_id: str = "clickhouse_default", sources: list | None = None,
                 merge_into: str = "", load_key: str | None = None,
                 reimport: str | None = None, source_database: str | None = None,
                 target_database: str | None = None, target_table: str | None = None,
                 columns: list | None = None, exclude_columns: list | None = None,
                 channels: int | None = 2, batch_rows: int = 65536, insert_rows: int = INSERT_ROWS,
                 insert_bytes: int = INSERT_BYTES,
                 split_column: str | None = None, split_factor: int | None = None,
                 strategy: str = "balanced", byte_speed: int | None = None, record_speed: int | None = None,
                 channel_byte_speed: int | None = None, channel_record_speed: int | None = None,
                 where: str | None = None, where_params: list | None = None, partition_by: str | None = None,
                 replace_partitions: list | None = None, ledger_database: str = DEFAULT_LEDGER_DATABASE,
                 skip_if_published: bool = False, reshape: bool = False,
                 reader: str = "auto", driver_copy_rows: int | None = None, **kwargs):
        super().__init__(**kwargs)
        self.layout = layout_argument(self, layout)
        for name, value in unpack(self, {"selection": selection, "content": content, "speed": speed}, dict(
                table=table, select=select, tables=tables, columns=columns, exclude_columns=exclude_columns,
                source_database=source_database, target_database=target_database, target_table=target_table,
                transform=transform, row_filter=row_filter, on_delete=on_delete,
                history=history, channels=channels,
                byte_speed=byte_speed, record_speed=record_speed, channel_byte_speed=channel_byte_speed,
                channel_record_speed=channel_record_speed)).items():
            setattr(self, name, value)  # the plain arguments, with the config objects unpacked into them
        if bool(self.table) == bool(self.select or self.tables):
            raise ValueError(f"task {self.task_id}: give table= (one table) or select= / tables= (many)")
        if (sources or merge_into) and not (self.select or self.tables):
            raise ValueError(f"task {self.task_id}: a source group applies select= / tables= to every source")
        self.sources = sources
        self.merge_into = merge_into
        self.parallel_tables = parallel_tables
        self.mysql_conn_id = mysql_conn_id
        self.clickhouse_conn_id = clickhouse_conn_id
        self.load_key = load_key
        self.reimport = reimport
        self.batch_rows = batch_rows
        self.insert_rows = insert_rows
        self.insert_bytes = insert_bytes
        self.split_column = split_column
        self.split_factor = split_factor
        self.strategy = strategy
        self.where = where
        self.where_params = where_params
        self.partition_by = partition_by
        self.replace_partitions = replace_partitions
        self.ledger_database = ledger_database
        self.skip_if_published = skip_if_published
        self.reshape = reshape
        self.reader = reader
        self.driver_copy_rows = driver_copy_rows
        if not self.table:  # the tables are known when the task runs
            return
        source_database, target_table = self.source_database, self.target_table or self.table
        self.declare_assets(
            [mysql_table(mysql_conn_id, source_database, self.table)
             if is_static(source_database, self.table) else None],
            [clickhouse_table(clickhouse_conn_id, self.target_database, target_table)
             if is_static(self.target_database, target_table) else None])

    def sync_page(self, spec) -> str:
        return sync_link(load=spec.load_key)

    def ledger_subject(self, spec):
        return TASK_LOAD, spec.load_key

    def metrics_baseline(self, spec) -> dict:
        """Each table load's shard attempts before the job: a resumed load's earlier ones are not
        counted again."""
        states = self.with_ledger(spec, lambda ledger: ledger.table_states(spec.load_key))
        return {key: attempts(state) for key, state in states.items()}

    def job_metrics(self, spec, result, seconds, baseline):
        """Per table: rows read / written / failed and failed shards of this try (from the ledger,
        so a failed job's shards count too), and its duration (a table of a job of many: its own)."""
        own = {t["load_key"]: t["seconds"] for t in (result or {}).get("tables", []) if t.get("seconds") is not None}
        states = self.with_ledger(spec, lambda ledger: ledger.table_states(spec.load_key))
        return [m for key, state in states.items()
                for m in load_metrics(state, (baseline or {}).get(key, {}), own.get(key, seconds))]

    def lineage(self, spec, result):
        tables = result.get("tables") or [result | {"table": f"{spec.source_database}.{spec.source_table}",
                                                     "target": f"{spec.target_database}.{spec.target_table}"}]
        return ([(namespace("mysql", source_of(spec, t)), t["table"]) for t in tables],
                [(namespace("clickhouse", spec.target), t["target"], t.get("rows")) for t in tables])

    def build_spec(self, context) -> FullLoadSpec:
        hook = SyncEndpointsHook(self.mysql_conn_id, self.clickhouse_conn_id)
        target = hook.target()
        if self.sources:  # a source group: its tables are resolved per source when the job runs
            sources, names = hook.sources(self.sources), ("", "", "", "")
            load_key = default_load_key(self, context, None)
        else:
            source = hook.source()
            source_db = self.source_database or source.database
            if not source_db and self.table:
                raise ValueError(f"table {self.table!r}: no source database (set source_database or the "
                                 f"schema of connection {self.mysql_conn_id!r})")
            target_db = self.target_database or (target.database if target.database != "default" else source_db)
            sources, load_key = one_server(source), default_load_key(self, context, source_db)
            names = (source_db or "", self.table or "", target_db or "", self.target_table or self.table or "")
        return FullLoadSpec(sources=sources, target=target, merge=Merge.of(self.merge_into) if self.sources else None,
                            source_database=names[0], source_table=names[1], target_database=names[2],
                            target_table=names[3], load_key=self.load_key or load_key, tableset=self.tableset(),
                            reimport=self.reimport, columns=list(self.columns) if self.columns else None,
                            exclude_columns=list(self.exclude_columns or []), channels=self.channels,
                            batch_rows=self.batch_rows, insert_rows=self.insert_rows, insert_bytes=self.insert_bytes,
                            split_column=self.split_column, split_factor=self.split_factor, strategy=self.strategy,
                            byte_speed=self.byte_speed, record_speed=self.record_speed,
                            channel_byte_speed=self.channel_byte_speed, channel_record_speed=self.channel_record_speed,
                            where=self.where, where_params=list(self.where_params or []),
                            partition_by=self.partition_by, replace_partitions=list(self.replace_partitions or []),
                            ledger_database=self.ledger_database, reader=self.reader,
                            driver_copy_rows=self.driver_copy_rows, skip_published=self.skip_if_published,
                            reshape=self.reshape)

    def summarize(self, result: dict) -> dict:
        if "tables" in result:
            tables = [{k: t.get(k) for k in ("table", "member", "source", "target", "load_key", "generation", "rows",
                                             "shards", "seconds", "skipped")}
                      for t in result["tables"]]
            self.log.info("Loaded %d table(s), %d rows, in %.1f s", len(tables), sum(t["rows"] or 0 for t in tables),
                          result["seconds"])
            group = {k: result[k] for k in ("merge_into", "sources", "members") if k in result}
            return {"load_key": result["load_key"], "selected": result.get("selected") or result.get("members", []),
                    "tables": tables, "rows": sum(t["rows"] or 0 for t in tables), "seconds": result["seconds"]} | group
        for warning in result.get("warnings", []):
            self.log.warning("%s", warning)
        if result["per_shard"]:
            self.log.info("Shards read by this run:\n%s", shard_table(result["per_shard"]))
        self.log.info("Loaded %s → %s: %d rows, %d shards (%d read now), %.1f s", result["table"], result["target"],
                      result["rows"], result["shards"], result["shards_read"], result["seconds"])
        return {k: result[k] for k in ("load_key", "generation", "table", "target", "rows", "shards", "shards_read",
                                       "channels", "split_column", "strategy", "start_position", "seconds")} | (
            {"skipped": True} if result.get("skipped") else {})

from __future__ import annotations

from airflow_sync_provider.assets import clickhouse_table, mysql_table, namespace, qualified
from airflow_sync_provider.compat import AirflowException
from airflow_sync_provider.core.jobspec import SnapshotDiffSpec
from airflow_sync_provider.core.ledger import DEFAULT_LEDGER_DATABASE, TASK_DIFF
from airflow_sync_provider.core.metrics import diff_metrics
from airflow_sync_provider.core.source.group import Merge, one_server
from airflow_sync_provider.core.verify.reports import diff_summary
from airflow_sync_provider.hooks.endpoints import SyncEndpointsHook
from airflow_sync_provider.links import sync_link
from airflow_sync_provider.operators.configs import Content, Layout, Selection, SpeedLimits, layout_argument, unpack
from airflow_sync_provider.operators.spark_job import SparkJobOperator
from airflow_sync_provider.plugins.reports import write_diff_report


class SnapshotDiffOperator(SparkJobOperator):
    """Compare two snapshots of a table by key, as Kettle's "Merge rows (diff)" does, at Spark
    scale: every key is ``identical``, ``changed`` (with the changed columns), ``new`` or
    ``deleted``. Old: a ClickHouse table (the copy: ``FINAL``, deleted rows excluded). New: the
    MySQL table (read in the planner's shards) or another ClickHouse table. Buckets of keys whose
    counts and checksums agree in both databases are not read row by row; differing buckets are
    cut finer inside the databases, so only rows near a change are read. On a local master (or
    for a small table) the job starts no SparkContext.

    The change set goes to a ClickHouse table (flag, key, changed columns, old and new values);
    XCom carries the counts per flag and the path of an HTML report with sample rows.

    :param old_table: ``db.table`` on ClickHouse.
    :param source_table: ``db.table`` in MySQL (the new snapshot), or give ``new_table``.
    :param new_table: ``db.table`` on ClickHouse as the new snapshot instead.
    :param key_columns: default: the MySQL primary key (the old table's sorting key for two
        ClickHouse tables).
    :param compare_columns: default: every non-key column both sides have; ``ignore_columns``
        leaves some out.
    :param tolerances: ``{column: abs}`` or ``{column: {"abs": x, "rel": y}}`` for FLOAT/DOUBLE.
    :param on_change: ``warn`` (default), ``fail`` (the task fails when anything differs) or
        ``apply``: ``new``/``changed`` rows are upserted and ``deleted`` keys get tombstones in
        the old table, versioned below any change after the diff began (a CDC pipeline writing
        the same copy is never out-ranked); running it again changes nothing.
    :param diff_key: the diff's name in the ledger and the change set (default: from the tables).
    :param changes_table: default ``<old_table>__changes``.
    :param selection: ``Selection(select=…, tables=…)``, or the plain ``select`` / ``tables``
        (:mod:`airflow_sync_provider.operators.configs`): diff many MySQL tables with their copies
        in one task, instead of ``old_table`` / ``source_table`` (a selection's
        ``target_database`` says where the copies are); ``diff_key`` becomes each one's prefix.
        XCom: ``verdict`` (``changed`` — ``applied`` with ``on_change="apply"`` — if any table
        differed), ``tables`` (one summary and report each).
    :param parallel_tables: tables compared at once.
    :param sources, merge_into: a source group (as ``FullLoadOperator`` takes them) with ``select``
        / ``tables``: with ``merge_into`` each source table against the merged copy's rows of it
        (keyed by the primary key and the source columns; ``diff_key`` each one's prefix, one
        change set ``<merge_into>__changes``; XCom also names ``orphans``: source tables the copy
        holds rows of that are no longer selected); without it, each source's tables against
        their side-by-side copies.
    :param reader: how large reads of MySQL rows go, as ``FullLoadOperator``'s: ``auto``
        (Arrow-native unless a probe of the first rows disagrees with mysqlclient), ``native`` or
        ``mysqlclient``. Reads of a few rows (a scattered change's) always use mysqlclient.
    :param layout: ``Layout(…)`` or its dict form: how the copies are laid out
        (:mod:`airflow_sync_provider.operators.configs`, as every setting below).
    :param content: ``Content(…)``, or the plain ``transform``, ``row_filter``, ``on_delete``, ``history``: what
        the copies hold.
    :param speed: ``SpeedLimits(channels=…)`` or the plain ``channels`` (default 2): shards
        compared at once.
    """

    job = "snapshot_diff"
    template_fields = ("layout", "transform", "row_filter", "old_table", "select", "tables", "merge_into",
                       "source_table", "new_table", "diff_key", "changes_table", "report_dir")

    def __init__(self, *, selection: Selection | dict | None = None, layout: Layout | dict | None = None,
                 content: Content | dict | None = None, speed: SpeedLimits | dict | None = None,
                 transform: dict | None = None,
                 row_filter: str | None = None, on_delete: str | None = None,
                 history: bool | dict | None = None,
                 old_table: str = "",
                 source_table: str = "", new_table: str = "",
                 select: dict | None = None, tables: list | None = None, parallel_tables: int = 2,
                 mysql_conn_id: str = "mysql_default", clickhouse_conn_id: str = "clickhouse_default",
                 sources: list | None = None, merge_into: str = "",
                 key_columns: list[str] | None = None, compare_columns: list[str] | None = None,
                 ignore_columns: list[str] | None = None, tolerances: dict | None = None, on_change: str = "warn",
                 diff_key: str = "", changes_table: str = "", channels: int = 2, split_factor: int = 1,
                 bucket_rows: int = 50_000, ledger_database: str = DEFAULT_LEDGER_DATABASE,
                 report_dir: str | None = None, reader: str = "auto", **kwargs):
        super().__init__(**kwargs)
        if on_change not in ("fail", "warn", "apply"):
            raise ValueError(f"on_change must be 'fail', 'warn' or 'apply', got {on_change!r}")
        self.layout = layout_argument(self, layout)
        for name, value in unpack(self, {"selection": selection, "content": content, "speed": speed}, dict(
                select=select, tables=tables, transform=transform, row_filter=row_filter, on_delete=on_delete,
                history=history,
                channels=channels)).items():
            setattr(self, name, value)  # the plain arguments, with the config objects unpacked into them
        if bool(old_table) == bool(self.select or self.tables):
            raise ValueError(f"task {self.task_id}: give old_table= (one table) or select= / tables= (many)")
        self.sources = sources
        self.merge_into = merge_into
        self.old_table = old_table
        self.parallel_tables = parallel_tables
        self.source_table = source_table
        self.new_table = new_table
        self.mysql_conn_id = mysql_conn_id
        self.clickhouse_conn_id = clickhouse_conn_id
        self.key_columns = key_columns
        self.compare_columns = compare_columns
        self.ignore_columns = ignore_columns
        self.tolerances = tolerances
        self.on_change = on_change
        self.diff_key = diff_key
        self.changes_table = changes_table
        self.split_factor = split_factor
        self.bucket_rows = bucket_rows
        self.ledger_database = ledger_database
        self.report_dir = report_dir
        self.reader = reader
        if not old_table:  # the tables are known when the task runs
            return
        old, new = qualified(old_table), qualified(new_table) if new_table else None
        changes = qualified(changes_table) if changes_table else (old and (old[0], f"{old[1]}__changes"))
        self.declare_assets(
            [mysql_table(mysql_conn_id, *q) for q in [qualified(source_table)] if source_table and q]
            + [clickhouse_table(clickhouse_conn_id, *q) for q in (old, new) if q],
            [clickhouse_table(clickhouse_conn_id, *q) for q in [changes, old if on_change == "apply" else None] if q])

    def sync_page(self, spec) -> str:
        return sync_link(diff=spec.diff_key or "diff:") if spec.tableset else sync_link(
            "diff", key=spec.diff_key)

    def ledger_subject(self, spec):
        return TASK_DIFF, spec.diff_key

    def job_metrics(self, spec, result, seconds, baseline):
        return [m for one in (result or {}).get("tables") or ([result] if result else []) for m in diff_metrics(one)]

    def lineage(self, spec, result):
        if "tables" in result:
            pairs = [self.lineage(spec.for_table(t["config"]), t) for t in result["tables"]]
            return [x for inputs, _ in pairs for x in inputs], [x for _, outputs in pairs for x in outputs]
        ch = namespace("clickhouse", spec.target)
        new = (namespace("mysql", spec.source), spec.new_name) if spec.source_table else (ch, spec.new_table)
        changed = sum(n for flag, n in result["counts"].items() if flag != "identical")
        outputs = [(ch, spec.changes_table, changed)]
        if spec.on_change == "apply":
            outputs.append((ch, spec.old_table, changed))
        return [new, (ch, spec.old_table)], outputs

    def build_spec(self, context) -> SnapshotDiffSpec:
        hook = SyncEndpointsHook(self.mysql_conn_id, self.clickhouse_conn_id)
        database, _, table = self.source_table.partition(".")
        if self.source_table and not table:
            raise ValueError(f"source_table {self.source_table!r}: give it as database.table")
        group = hook.sources(self.sources) if self.sources else []
        source = hook.source() if (self.source_table or self.select or self.tables) and not group else None
        return SnapshotDiffSpec(sources=group or one_server(source), merge=Merge.of(self.merge_into),
                                target=hook.target(), old_table=self.old_table, source_database=database,
                                source_table=table, new_table=self.new_table, key_columns=self.key_columns,
                                compare_columns=self.compare_columns, ignore_columns=list(self.ignore_columns or []),
                                tolerances=dict(self.tolerances or {}), on_change=self.on_change,
                                diff_key=self.diff_key, changes_table=self.changes_table, channels=self.channels,
                                split_factor=self.split_factor, bucket_rows=self.bucket_rows,
                                ledger_database=self.ledger_database,
                                tableset=self.tableset(),
                                reader=self.reader)

    def summarize(self, result: dict) -> dict:
        if "tables" not in result:
            return self._summarize_one(result)
        tables = [{"table": one.get("member") or one["table"], **self._summarize_one(one, raise_on_change=False)}
                  for one in result["tables"]]
        changed = [t for t in tables if t["verdict"] != "identical"]  # "changed", or "applied" (on_change="apply")
        verdict = ("applied" if self.on_change == "apply" else "changed") if changed else "identical"
        self.log.info("Snapshot diff of %d table(s): %s", len(tables), verdict)
        if changed and self.on_change == "fail":
            raise AirflowException(f"{len(changed)} of {len(tables)} table(s) differ: "
                                   + "; ".join(f"{t['table']} {t['counts']}" for t in changed))
        for orphan in result.get("orphans", []):  # a merged copy's rows of source tables no longer selected
            self.log.warning("%s holds rows of %s, no longer selected (a re-load removes them)",
                             result["merge_into"], orphan)
        return {"diff_key": result["diff_key"], "verdict": verdict, "selected": result["selected"], "tables": tables,
                **({"orphans": result["orphans"]} if "orphans" in result else {})}

    def _summarize_one(self, result: dict, raise_on_change: bool = True) -> dict:
        self.log.info("Snapshot diff %s", diff_summary(result))
        report = write_diff_report(result, self.report_dir)
        self.log.info("Report: %s; change set: %s (diff_key %r)", report, result["changes_table"], result["diff_key"])
        summary = {k: result[k] for k in ("diff_key", "run_id", "verdict", "counts", "rows_read_old", "rows_read_new",
                                          "shards", "shards_read", "changes_table")} | {"report": report}
        for note in result.get("notes", []):  # the old table's engine or key against the diff's key
            self.log.info("%s", note)
        if result.get("notes"):
            summary["notes"] = result["notes"]
        if result["verdict"] == "changed" and self.on_change == "fail" and raise_on_change:
            raise AirflowException(f"snapshot diff {result['diff_key']!r}: {diff_summary(result)}; see {report}")
        return summary

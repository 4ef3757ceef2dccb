from __future__ import annotations

from airflow_sync_provider.assets import namespace, source_of
from airflow_sync_provider.compat import AirflowException
from airflow_sync_provider.core.jobspec import ReconcileSpec
from airflow_sync_provider.core.ledger import DEFAULT_LEDGER_DATABASE, TASK_RECONCILIATION
from airflow_sync_provider.core.metrics import reconcile_metrics
from airflow_sync_provider.core.source.group import Merge, one_server
from airflow_sync_provider.core.verify.reconcile import OK, SHAPE_MISMATCH, overall_verdict
from airflow_sync_provider.core.verify.reports import reconcile_table
from airflow_sync_provider.hooks.endpoints import SyncEndpointsHook
from airflow_sync_provider.links import sync_link
from airflow_sync_provider.operators.configs import Selection, unpack
from airflow_sync_provider.operators.spark_job import SparkJobOperator
from airflow_sync_provider.plugins.reports import write_report

ON_MISMATCH = ("fail", "warn", "reimport")


def _why(result: dict) -> str:
    """What a table's verdict other than ``ok`` means, in one line."""
    if result["verdict"] == SHAPE_MISMATCH:
        return (f"the copy's shape no longer matches the source ({'; '.join(result['shape']['problems'])}); "
                f"{result['remedy']}")
    history = result.get("history") or {}
    if history and not history["ok"]:  # core/cdc/history_checks.py: which of its three checks failed
        failed = [f"{check} ({history[check]['faults']} fault(s))" for check in ("latest", "conflicts")
                  if history[check]["faults"]]
        failed += [f"gaps of pipeline {p!r} ({g['faults']})" for p, g in history["gaps"].items() if g["faults"]]
        return f"shards {result['mismatched']} do not match; its history fails: {', '.join(failed)}"
    return f"shards {result['mismatched']} do not match"


class ReconcileOperator(SparkJobOperator):
    """Compare a published load shard by shard: source count vs target count (``FINAL``) vs the
    hook counters, and optionally a content checksum per shard. Mismatched shards are marked in
    the ledger. Writes an HTML report (its path goes to XCom with the verdict).

    :param load_key: the load to check (e.g. ``{{ ti.xcom_pull('load_orders')['load_key'] }}``); with
        ``select`` / ``tables``, the key the full load of many tables was given (their prefix).
    :param selection: ``Selection(select=…, tables=…)``, or the plain ``select`` / ``tables``
        (:mod:`airflow_sync_provider.operators.configs`): check the loads of many tables in one
        task; a selected table without a published load under the key fails the task, named. XCom:
        ``verdict`` (``ok`` only if every table is; else ``shape_mismatch`` before ``mismatch``),
        ``tables`` (one summary and report each).
    :param parallel_tables: tables checked at once.
    :param sources, merge_into: a source group's load (as ``FullLoadOperator`` took them; ``load_key``
        the group's): with ``merge_into`` every source table of the merged copy against its own
        source, re-imported together (``on_mismatch="reimport"``); without it, each source's tables
        copied side by side (``select`` / ``tables``).
    :param checksum: also compare an order-independent sum of row hashes per shard.
    :param on_mismatch: ``fail`` (default), ``warn``, or ``reimport``: re-import the mismatched
        shards into the published table (in place: newer versions first, then the shards' older
        rows deleted, so readers never miss a row), compare again, and fail if they still differ.
        A copy whose columns or key no longer match the source's (verdict ``shape_mismatch``,
        docs/design-reconciliation.md) is compared shard by shard by no mode: ``fail`` and
        ``reimport`` fail naming what differs and the remedy (a full reload), ``warn`` warns.
    :param report_dir: where the HTML report goes (default: a directory under the temp dir).
    """

    job = "reconcile"
    template_fields = ("load_key", "select", "tables", "merge_into", "report_dir")

    def __init__(self, *, load_key: str = "", selection: Selection | dict | None = None,
                 select: dict | None = None, tables: list | None = None,
                 parallel_tables: int = 2, mysql_conn_id: str = "mysql_default",
                 clickhouse_conn_id: str = "clickhouse_default", sources: list | None = None, merge_into: str = "",
                 checksum: bool = False, on_mismatch: str = "fail",
                 ledger_database: str = DEFAULT_LEDGER_DATABASE, report_dir: str | None = None, **kwargs):
        super().__init__(**kwargs)
        if on_mismatch not in ON_MISMATCH:
            raise ValueError(f"on_mismatch must be one of {ON_MISMATCH}, got {on_mismatch!r}")
        self.load_key = load_key
        self.sources = sources
        self.merge_into = merge_into
        given = unpack(self, {"selection": selection}, dict(select=select, tables=tables))
        self.select, self.tables = given["select"], given["tables"]  # the Selection unpacked into them
        self.parallel_tables = parallel_tables
        self.mysql_conn_id = mysql_conn_id
        self.clickhouse_conn_id = clickhouse_conn_id
        self.checksum = checksum
        self.on_mismatch = on_mismatch
        self.ledger_database = ledger_database
        self.report_dir = report_dir

    def build_spec(self, context) -> ReconcileSpec:
        hook = SyncEndpointsHook(self.mysql_conn_id, self.clickhouse_conn_id)
        group = hook.sources(self.sources) if self.sources else []
        return ReconcileSpec(sources=group or one_server(hook.source()), target=hook.target(), load_key=self.load_key,
                             checksum=self.checksum, reimport=self.on_mismatch == "reimport",
                             ledger_database=self.ledger_database,
                             tableset=self.tableset(),
                             merge=Merge.of(self.merge_into))

    def sync_page(self, spec) -> str:
        return sync_link(load=spec.load_key) if spec.tableset else sync_link("reconciliation",
                                                                                         load=spec.load_key)

    def ledger_subject(self, spec):
        return TASK_RECONCILIATION, spec.load_key

    def job_metrics(self, spec, result, seconds, baseline):
        return [m for one in (result or {}).get("tables") or ([result] if result else [])
                for m in reconcile_metrics(one)]

    def lineage(self, spec, result):
        return [x for t in result.get("tables") or [result]
                for x in ((namespace("mysql", source_of(spec, t)), t["table"]),
                          (namespace("clickhouse", spec.target), t["target"]))], []

    def summarize(self, result: dict) -> dict:
        if "tables" not in result:
            return self._summarize_one(result)
        tables, problems = [], []
        for one in result["tables"]:
            name = one.get("member") or one["table"]
            tables.append({"table": name, **self._summarize_one(one, raise_on_mismatch=False)})
            if one["verdict"] != OK:
                problems.append(f"{name}: {_why(one)}")
        verdict = result.get("verdict") or overall_verdict(one["verdict"] for one in result["tables"])
        self.log.info("Reconciled %d table(s): %s", len(tables), verdict)
        if problems:
            message = f"{len(problems)} of {len(tables)} table(s) do not match: " + "; ".join(problems)
            if self.on_mismatch in ("fail", "reimport"):
                raise AirflowException(message)
            self.log.warning("%s", message)
        return {"load_key": result["load_key"], "verdict": verdict, "selected": result.get("selected", []),
                "tables": tables}

    def _summarize_one(self, result: dict, raise_on_mismatch: bool = True) -> dict:
        self.log.info("Reconciliation of %s → %s:\n%s", result["table"], result["target"],
                      reconcile_table(result["shards"]))
        report = write_report(result, self.report_dir)
        self.log.info("Report: %s", report)
        summary = {k: result[k] for k in ("load_key", "generation", "verdict", "mismatched", "checksum")}
        if "history" in result:  # a copy that keeps a history: its checks (core/verify/history.py)
            summary["history"] = result["history"]
        summary["report"] = report
        for note in (result.get("shape") or {}).get("notes", []):
            self.log.info("%s → %s: %s", result["table"], result["target"], note)
        if result["verdict"] == SHAPE_MISMATCH:
            summary |= {"problems": result["shape"]["problems"], "remedy": result["remedy"]}
        if result.get("before"):
            self.log.info("First pass found shards %s mismatched; re-imported %s rows into them, then compared again",
                          result["before"]["mismatched"], result["reimported"]["rows"])
            summary |= {"mismatched_before": result["before"]["mismatched"], "reimported": result["reimported"]}
        if result["verdict"] != OK:
            message = (f"load {result['load_key']!r} ({result['table']} → {result['target']}): {_why(result)}; "
                       f"see {report}")
            if self.on_mismatch in ("fail", "reimport") and raise_on_mismatch:
                raise AirflowException(message)
            self.log.warning("%s", message)
        return summary

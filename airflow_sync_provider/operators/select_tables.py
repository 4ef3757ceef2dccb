"""Resolve table patterns against MySQL when the task runs, for dynamic task mapping: one task
instance per table in the Airflow UI (docs/whole-databases.md says when to prefer one job)."""

from __future__ import annotations

from airflow_sync_provider.compat import BaseOperator
from airflow_sync_provider.core.selection import TableSelection, selected_tables
from airflow_sync_provider.core.source import reader as mysql_reader
from airflow_sync_provider.hooks.endpoints import SyncEndpointsHook


class SelectTablesOperator(BaseOperator):
    """The tables ``select`` (and ``tables``) name now, as keyword arguments of
    ``FullLoadOperator`` (``source_database``, ``table``, ``target_database``, ``target_table``,
    ``columns``, ``exclude_columns``, ``split_column``), one dict per table: feed it to
    ``FullLoadOperator.partial(...).expand_kwargs(select.output)``.

    :param select: ``{"databases": [...], "tables": [...], "exclude_tables": [...],
        "target_database": "{database}"}`` (shell wildcards or ``re:`` regexes).
    :param tables: tables by name besides (``"db.table"`` or dicts).
    :param fail_if_empty: fail when nothing is selected (default: a typo in a pattern should not
        pass as an empty, successful run).
    """

    template_fields = ("select", "tables")
    ui_color = "#d8f0d8"

    def __init__(self, *, select: dict | None = None, tables: list | None = None,
                 mysql_conn_id: str = "mysql_default", fail_if_empty: bool = True, **kwargs):
        super().__init__(**kwargs)
        if not (select or tables):
            raise ValueError(f"task {self.task_id}: give select= (patterns) and/or tables=")
        TableSelection.of(select)  # a bad pattern fails when the DAG is parsed
        self.select = select
        self.tables = tables
        self.mysql_conn_id = mysql_conn_id
        self.fail_if_empty = fail_if_empty

    def execute(self, context) -> list[dict]:
        source = SyncEndpointsHook(self.mysql_conn_id, "clickhouse_default").source()
        with mysql_reader.connect(source) as conn:
            configs = selected_tables(conn, self.select, list(self.tables or []))
        self.log.info("%d table(s) selected: %s", len(configs),
                      ", ".join(f"{c['source_database']}.{c['source_table']}" for c in configs) or "(none)")
        if not configs and self.fail_if_empty:
            raise ValueError(f"no table of the source matches {self.select} (and tables={self.tables})")
        return [{"source_database": c["source_database"], "table": c["source_table"],
                 "target_database": c["target_database"], "target_table": c["target_table"],
                 "columns": c["columns"], "exclude_columns": c["exclude_columns"], "split_column": c["split_column"]}
                for c in configs]

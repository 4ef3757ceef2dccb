"""The tables a job reads and writes: Airflow assets (a downstream DAG can be scheduled on a copy
being refreshed) and OpenLineage datasets (lineage with row counts, when the OpenLineage
provider is installed).

An asset's URI names the table by its Airflow connection id, which is known when the DAG is
parsed (the connection's host is not): ``clickhouse://<conn_id>/<database>/<table>`` for a copy,
``mysql://<conn_id>/<database>/<table>`` for a source table (the MySQL provider adds ``:3306``).
A consumer builds the same asset with :func:`clickhouse_table`. Lineage uses the real hosts,
read at run time: namespace ``mysql://host:port`` / ``clickhouse://host:port``, name ``db.table``.
"""

from __future__ import annotations

from airflow_sync_provider.compat import Asset


def is_static(*names) -> bool:
    """Known when the DAG is parsed: given, and not a template rendered at run time."""
    return all(isinstance(n, str) and n and "{{" not in n and "{%" not in n for n in names)


def clickhouse_table(conn_id: str, database: str, table: str) -> Asset:
    """The asset of a ClickHouse table (a copy, a change set) reached through ``conn_id``."""
    return Asset(uri=f"clickhouse://{conn_id}/{database}/{table}")


def mysql_table(conn_id: str, database: str, table: str) -> Asset:
    return Asset(uri=f"mysql://{conn_id}/{database}/{table}")


def qualified(name, default_database: str | None = None) -> tuple[str, str] | None:
    """``"db.table"`` (or a table dict of the CDC operators) → (db, table), None when not static."""
    if isinstance(name, dict):
        database, table = name.get("source_database"), name.get("source_table")
    else:
        database, _, table = str(name).rpartition(".")
        database = database or default_database
    return (database, table) if is_static(database, table) else None


def target_of(table) -> tuple[str, str] | None:
    """Where the CDC operators copy ``table`` (dict targets default to the source's names)."""
    if isinstance(table, dict):
        database = table.get("target_database") or table.get("source_database")
        return (database, table.get("target_table") or table.get("source_table")) if is_static(
            database, table.get("target_table") or table.get("source_table")) else None
    return qualified(table)


def namespace(kind: str, endpoint) -> str:
    return f"{kind}://{endpoint.host}:{endpoint.port}"


def source_of(spec, result: dict):
    """The MySQL endpoint a table's result came from: its source's (a group's table names it in
    its ``member`` or ``source``; a job of one server has one)."""
    name = result.get("source") or (result.get("member") or "").partition(":")[0]
    return next((s.endpoint for s in spec.sources if s.name == name), None) or spec.sources[0].endpoint


def openlineage(inputs: list[tuple[str, str]], outputs: list[tuple[str, str, int | None]]):
    """An ``OperatorLineage`` (None without the OpenLineage provider): inputs (namespace, name),
    outputs (namespace, name, rows written or None)."""
    try:
        from airflow.providers.common.compat.openlineage.facet import (
            Dataset,
            OutputStatisticsOutputDatasetFacet,
        )
        from airflow.providers.openlineage.extractors import OperatorLineage
    except ImportError:
        return None

    def output(ns, name, rows):
        facets = {"outputStatistics": OutputStatisticsOutputDatasetFacet(rowCount=rows)} if rows is not None else {}
        return Dataset(namespace=ns, name=name, facets=facets)

    return OperatorLineage(inputs=[Dataset(namespace=ns, name=name) for ns, name in inputs],
                           outputs=[output(*o) for o in outputs])

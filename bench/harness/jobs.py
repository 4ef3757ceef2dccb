"""Our jobs as the benches run them: the full load (the one runner every bench shares), and a
content fingerprint of any copy (ours or a peer's)."""

from __future__ import annotations

import contextlib
import uuid

from airflow_sync_provider.core.source.group import one_server
from bench.harness.clients import ch_client, source, target
from bench.harness.measure import timer

JOB_TIMEOUT = 7200.0


def unique_key(prefix: str) -> str:
    """A load key no earlier run used (a used one would resume that load, or publish afresh)."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def full_load(mysql, ch, database: str, table: str, target_database: str, target_table: str, *, during=None,
              master: str = "local[2]", conf: dict | None = None, timeout: float = JOB_TIMEOUT, log=None,
              in_process: bool = False, expect_rows: int | None = None, count: str | None = None, **options) -> dict:
    """Our full load of ``database.table`` into ``target_database.target_table`` (``mysql`` and ``ch``:
    URLs or endpoints; ``options``: more of FullLoadSpec, e.g. ``channels``, ``load_key``), through
    ``spark_submit`` (``in_process``: the job function in this process). ``during``: a context
    (a :class:`ProcessSampler`, a :class:`LoadAverage`) around the job alone. Raises unless it
    succeeded; with ``expect_rows`` the job's row count must be that, and with ``count`` ("" or
    " FINAL") the target's ``count()`` too.

    Returns ``wall`` (the call), ``inner`` (the job's own seconds), ``result`` and the result's
    ``rows``, ``load_key``, ``start`` (binlog position), ``shards``, ``strategy``, ``split_column``,
    ``channels``, ``phases``, ``reader``, ``per_shard``; ``table``: the target table."""
    from airflow_sync_provider.core.jobspec import FullLoadSpec
    from airflow_sync_provider.core.sql import ch_table
    from airflow_sync_provider.core.submission import spark_submit

    spec = FullLoadSpec(sources=one_server(source(mysql)), target=target(ch), source_database=database,
                        source_table=table, target_database=target_database, target_table=target_table, **options)
    with during or contextlib.nullcontext(), timer() as wall:
        if in_process:
            from airflow_sync_provider.spark.full_load import run_full_load

            result = {"status": "success", **run_full_load(spec, None)}  # (a failure raises)
        else:
            result = spark_submit(spec, master=master, conf=conf, timeout=timeout, log=log)
    if result.get("status") != "success":
        raise RuntimeError(f"full load ({master}) failed: {result.get('error', result)}"[:4000])
    if expect_rows is not None:
        assert result["rows"] == expect_rows, (result["rows"], expect_rows)
    if count is not None:
        client = ch_client(ch)
        copied = int(client.command(f"SELECT count() FROM {ch_table(target_database, target_table)}{count}"))
        client.close()
        assert copied == result["rows"], (copied, result["rows"])
    return {"wall": wall["seconds"], "inner": float(result["seconds"]), "result": result, "rows": result.get("rows"),
            "load_key": result.get("load_key", spec.load_key), "start": result.get("start_position"),
            "table": target_table, "shards": result.get("shards"), "strategy": result.get("strategy"),
            "split_column": result.get("split_column"), "channels": result.get("channels") or spec.channels,
            "phases": result.get("phases", {}), "reader": result.get("reader", ""),
            "per_shard": result.get("per_shard", [])}


def fingerprint(ch, database: str, table: str, columns: dict[str, str], final: bool = False) -> dict:
    """count() and, per column, sum(cityHash64(normalised text)) — NULL hashed as its own marker:
    an order-independent content fingerprint that compares copies whose column types differ (a
    peer's DECIMAL → Float64, DATETIME → DateTime64). ``columns``: name → its text expression."""
    from airflow_sync_provider.core.sql import ch_table

    sums = ", ".join(f"sum(cityHash64(ifNull({expr}, '\\N')))" for expr in columns.values())
    try:
        row = ch.query(f"SELECT count(), {sums} FROM {ch_table(database, table)}{' FINAL' if final else ''}"
                       ).result_rows[0]
        types = dict(ch.query("SELECT name, type FROM system.columns"
                              " WHERE database = {d:String} AND table = {t:String}",
                              parameters={"d": database, "t": table}).result_rows)
    except Exception as exc:  # reported, not fatal: the row count was already checked
        return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    return {"count": int(row[0]), "columns": dict(zip(columns, (int(v) for v in row[1:]))), "types": types}

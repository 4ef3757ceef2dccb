"""Reconciliation building blocks (issue in progress): the load's shards evaluated on the target.

A shard is planned as a MySQL predicate. To count its rows in ClickHouse the same cut points are
compared there, which is exact only where ClickHouse orders values as MySQL does: integers,
DECIMAL, FLOAT/DOUBLE, DATE, DATETIME/TIMESTAMP (stored as UTC wall clock) and binary strings.
Collated strings (case/accent-insensitive, PAD SPACE), TIME and period filters are refused with a
clear error until the weight-string approach of docs/design-reconciliation.md is built.
"""

from __future__ import annotations

from airflow_sync_provider.core.planning import Plan
from airflow_sync_provider.core.sql import ch_ident, ch_table, mysql_ident
from airflow_sync_provider.core.typemap import MySQLColumn

_PARAM_TYPES = {
    "tinyint": "Int128", "smallint": "Int128", "mediumint": "Int128", "int": "Int128", "integer": "Int128",
    "bigint": "Int128", "year": "Int128", "bit": "Int128",
    "float": "Float64", "double": "Float64", "real": "Float64",
    "date": "Date32", "datetime": "DateTime64(6, 'UTC')", "timestamp": "DateTime64(6, 'UTC')",
    "binary": "String", "varbinary": "String", "tinyblob": "String", "blob": "String", "mediumblob": "String",
    "longblob": "String",
}


_BINARY = {"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"}


class NotComparable(ValueError):
    pass


def _param_type(column: MySQLColumn, table: str) -> str:
    if column.data_type in ("decimal", "numeric"):
        return f"Decimal({column.precision or 10}, {column.scale or 0})"
    if column.data_type in _PARAM_TYPES:
        return _PARAM_TYPES[column.data_type]
    raise NotComparable(
        f"table {table}: split column {column.name!r} is {column.column_type}; ClickHouse does not order it as "
        "MySQL does (collation), so its shards cannot be counted on the target yet")


def cut_points(plan: Plan) -> list:
    """The cuts the planner made, read back from the range shards (their leading parameters)."""
    ranges = [s for s in plan.shards if "IS NULL" not in s.where]
    if len(ranges) <= 1:
        return []
    return [ranges[0].params[0]] + [s.params[1] for s in ranges[1:-1]]


def target_predicates(plan: Plan, column: MySQLColumn | None) -> list[tuple[str, dict]]:
    """One ClickHouse predicate with server-side parameters per shard, in plan order."""
    if any(") AND (" in s.where for s in plan.shards):
        raise NotComparable(f"table {plan.database}.{plan.table}: period filters are not translated to ClickHouse yet")
    if column is None:
        return [("1", {}) for _ in plan.shards]
    kind = _param_type(column, f"{plan.database}.{plan.table}")
    col = ch_ident(column.name)
    binary = kind == "String"

    def ref(i):
        return f"unhex({{c{i}:String}})" if binary else f"{{c{i}:{kind}}}"

    cuts = cut_points(plan)
    params = {f"c{i}": c for i, c in enumerate(cuts)}
    out = []
    if not cuts:
        out.append((f"isNotNull({col})", {}))
    else:
        out.append((f"{col} < {ref(0)}", {"c0": params["c0"]}))
        for i in range(len(cuts) - 1):
            out.append((f"{col} >= {ref(i)} AND {col} < {ref(i + 1)}",
                        {f"c{i}": params[f"c{i}"], f"c{i + 1}": params[f"c{i + 1}"]}))
        last = len(cuts) - 1
        out.append((f"{col} >= {ref(last)}", {f"c{last}": params[f"c{last}"]}))
    out.append((f"isNull({col})", {}))
    return out


def shard_problems(row: dict, counters=None) -> list[str]:
    """Why one shard does not reconcile (empty when it does): source vs target rows, checksums
    (None when not computed), and the load's hook counters (a ledger ShardState, if any)."""
    out = []
    if row["source_rows"] != row["target_rows"]:
        out.append(f"source {row['source_rows']} != target {row['target_rows']}")
    if row.get("source_checksum") != row.get("target_checksum"):
        out.append("content checksum differs")
    if counters is not None and (counters.records_read != counters.records_written or counters.records_failed):
        out.append(f"hook counters read {counters.records_read} / written {counters.records_written} / "
                   f"failed {counters.records_failed}")
    return out


def count_source(conn, plan: Plan) -> list[int]:
    """COUNT(*) of every shard in MySQL, through the split index (pymysql connection)."""
    counts = []
    with conn.cursor() as cur:
        for shard in plan.shards:
            cur.execute(f"SELECT COUNT(*) {plan.from_clause()} WHERE {shard.where}", shard.params)
            counts.append(int(cur.fetchone()[0]))
    return counts


def count_target(ch, database: str, table: str, predicates: list[tuple[str, dict]], final: bool = True) -> list[int]:
    """count() of every shard in ClickHouse; ``FINAL`` for ReplacingMergeTree targets, so
    unmerged older versions of a row do not count (tables without a primary key have none)."""
    source = ch_table(database, table) + (" FINAL" if final else "")
    return [int(ch.command(f"SELECT count() FROM {source} WHERE {where}", parameters=params))
            for where, params in predicates]


# --- content checksums: an order-independent sum of 64-bit row hashes, same text on both sides ---

def _mysql_text(column: MySQLColumn) -> str:
    col = mysql_ident(column.name)
    t = column.data_type
    if t in _BINARY:
        return f"HEX({col})"
    if t == "bit":
        return f"CAST({col} + 0 AS CHAR)"
    return f"CAST({col} AS CHAR CHARACTER SET utf8mb4)"


def _clickhouse_text(mapping) -> str:
    col = ch_ident(mapping.name)
    t = mapping.source.data_type
    if t in _BINARY:
        return f"hex({col})"
    if t in ("decimal", "numeric"):
        return f"toDecimalString({col}, {mapping.source.scale or 0})"
    return f"toString({col})"


def mysql_checksum_sql(schema, plan: Plan) -> str:
    """``SELECT COUNT(*), SUM(hash)`` for one shard (append the shard's WHERE and params)."""
    unsupported = [c.name for c in schema.columns if c.data_type == "time"]
    if unsupported:
        raise NotComparable(f"table {schema.qualified}: TIME columns {unsupported} are stored as text and not "
                            "checksummed yet")
    values = ", ".join(f"IF({mysql_ident(c.name)} IS NULL, 'N', CONCAT('V', {_mysql_text(c)}))" for c in schema.columns)
    row = f"CONCAT_WS(CHAR(31), {values})"
    return (f"SELECT COUNT(*), COALESCE(SUM(CAST(CONV(LEFT(MD5({row}), 16), 16, 10) AS UNSIGNED)), 0) "
            f"{plan.from_clause()} WHERE ")


def clickhouse_checksum_sql(schema, database: str, table: str, final: bool = True) -> str:
    """The same row text and hash in ClickHouse (append the shard's predicate)."""
    values = ", ".join(f"ifNull(concat('V', {_clickhouse_text(m)}), 'N')" for m in schema.mappings())
    row = f"concatWithSeparator(char(31), {values})"
    digest = f"reinterpretAsUInt64(reverse(unhex(substring(hex(MD5({row})), 1, 16))))"
    return (f"SELECT count(), sum(toUInt128({digest})) FROM {ch_table(database, table)}"
            f"{' FINAL' if final else ''} WHERE ")


def checksum_source(conn, schema, plan: Plan) -> list[tuple[int, int]]:
    head = mysql_checksum_sql(schema, plan)
    out = []
    with conn.cursor() as cur:
        for shard in plan.shards:
            cur.execute(head + shard.where, shard.params)
            count, total = cur.fetchone()
            out.append((int(count), int(total)))
    return out


def checksum_target(ch, schema, database: str, table: str, predicates, final: bool = True) -> list[tuple[int, int]]:
    head = clickhouse_checksum_sql(schema, database, table, final)
    return [tuple(int(v) for v in ch.query(head + where, parameters=params).result_rows[0])
            for where, params in predicates]

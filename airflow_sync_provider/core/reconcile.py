"""Reconciliation: per-shard counts and content checksums on both sides, and what differs.

The shards are the load's own (core/target_shards.py evaluates them on the target). Both
databases compute the numbers themselves; only one row per shard travels.
"""

from __future__ import annotations

from airflow_sync_provider.core.planning import Plan
from airflow_sync_provider.core.sql import ch_ident, ch_table, mysql_ident
from airflow_sync_provider.core.target_shards import BINARY_TYPES

FLOAT_TYPES = {"float", "double", "real"}
from airflow_sync_provider.core.typemap import MySQLColumn


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

# Floats: both databases print the shortest round-trip digits of a DOUBLE, but in different
# notations (MariaDB '1e20', '0.00000015'; ClickHouse '100000000000000000000', '1.5e-7'). Both
# sides rewrite their text to one form: sign, significant digits, 'e', exponent (value =
# 0.digits × 10^exponent); zero (and -0) is '0'. FLOAT is widened to DOUBLE first (exactly).

def _mysql_float_text(col: str) -> str:
    t = f"CAST({col} + 0e0 AS CHAR)"
    a = f"TRIM(LEADING '-' FROM {t})"
    m = f"SUBSTRING_INDEX({a}, 'e', 1)"
    exponent = f"IF(LOCATE('e', {a}) > 0, CAST(SUBSTRING_INDEX({a}, 'e', -1) AS SIGNED), 0)"
    whole = f"SUBSTRING_INDEX({m}, '.', 1)"
    digits = f"CONCAT({whole}, IF(LOCATE('.', {m}) > 0, SUBSTRING_INDEX({m}, '.', -1), ''))"
    stripped = f"TRIM(LEADING '0' FROM {digits})"
    significant = f"TRIM(TRAILING '0' FROM {stripped})"
    exp10 = f"CHAR_LENGTH({whole}) - (CHAR_LENGTH({digits}) - CHAR_LENGTH({stripped})) + {exponent}"
    return f"IF({significant} = '', '0', CONCAT(IF(LEFT({t}, 1) = '-', '-', ''), {significant}, 'e', {exp10}))"


def _clickhouse_float_text(col: str) -> str:
    t = f"toString(toFloat64({col}))"
    a = f"if(startsWith({t}, '-'), substring({t}, 2), {t})"
    m = f"splitByChar('e', {a})[1]"
    exponent = f"if(position({a}, 'e') > 0, toInt64(replaceOne(splitByChar('e', {a})[2], '+', '')), 0)"
    whole = f"splitByChar('.', {m})[1]"
    digits = f"concat({whole}, if(position({m}, '.') > 0, splitByChar('.', {m})[2], ''))"
    stripped = f"replaceRegexpOne({digits}, '^0+', '')"
    significant = f"replaceRegexpOne({stripped}, '0+$', '')"
    exp10 = f"toInt64(length({whole})) - (toInt64(length({digits})) - toInt64(length({stripped}))) + {exponent}"
    return (f"if(isNull({col}), NULL, if({significant} = '', '0', concat(if(startsWith({t}, '-'), '-', ''),"
            f" {significant}, 'e', toString({exp10}))))")


def _mysql_text(column: MySQLColumn) -> str:
    col = mysql_ident(column.name)
    t = column.data_type
    if t in BINARY_TYPES:
        return f"HEX({col})"
    if t in FLOAT_TYPES:
        return _mysql_float_text(col)
    if t == "time":  # as the loader stores it: [-]HH:MM:SS, then .ffffff unless zero
        return (f"CONCAT(SUBSTRING_INDEX(CAST({col} AS CHAR), '.', 1),"
                f" IF(MICROSECOND({col}) = 0, '', CONCAT('.', LPAD(MICROSECOND({col}), 6, '0'))))")
    if t == "bit":
        return f"CAST({col} + 0 AS CHAR)"
    return f"CAST({col} AS CHAR CHARACTER SET utf8mb4)"


def _clickhouse_text(mapping) -> str:
    col = ch_ident(mapping.name)
    t = mapping.source.data_type
    if t in BINARY_TYPES:
        return f"hex({col})"
    if t in FLOAT_TYPES:
        return _clickhouse_float_text(col)
    if t in ("decimal", "numeric"):
        return f"toDecimalString({col}, {mapping.source.scale or 0})"
    return f"toString({col})"


def mysql_checksum_sql(schema, plan: Plan) -> str:
    """``SELECT COUNT(*), SUM(hash)`` for one shard (append the shard's WHERE and params)."""
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

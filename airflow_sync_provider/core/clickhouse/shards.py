"""A load's shards on the target: which ClickHouse rows belong to shard *i*.

Reconciliation counts and checksums every shard on both sides, and re-importing a mismatched
shard of a published table replaces exactly that shard's rows, so both need the planner's MySQL
predicates evaluated in ClickHouse, with the same cut points (the plan records them) and the
same order:

* integers, DECIMAL, FLOAT/DOUBLE, DATE, DATETIME/TIMESTAMP (UTC wall clock) and binary strings
  are ordered by ClickHouse as by MySQL: the predicate translates one to one, with typed
  server-side parameters.
* TIME is stored as text (``[-]HH:MM:SS[.ffffff]``): compared as signed microseconds.
* strings under a collation are compared by MySQL by collation (case/accent-insensitive, PAD
  SPACE), by ClickHouse as bytes. A load split on such a column also stores each row's sort key,
  MySQL's ``WEIGHT_STRING(col)``, in a hidden column (``MATERIALIZED``: not in ``SELECT *``);
  bytes of weights order as the collation orders strings. The cuts' weights come from MySQL.
  PAD SPACE collations compare as if the shorter string were padded with spaces, so both sides
  are right-padded with the space's weight to one length in the query (trailing spaces, and
  characters below the space such as a tab, then compare as MySQL compares them).
* a period load (``where`` + replaced partitions) also restricts to those partitions.
"""

from __future__ import annotations

from dataclasses import dataclass

from airflow_sync_provider.core.source.group import member_filter
from airflow_sync_provider.core.source.planning import Plan
from airflow_sync_provider.core.source.weights import (
    SPLIT_WEIGHT_COLUMN,
    NotComparable,
    Weights,
    needs_weight,
    read_weights,
)
from airflow_sync_provider.core.sql import ch_ident, ch_table
from airflow_sync_provider.core.typemap import MySQLColumn

_PARAM_TYPES = {
    "tinyint": "Int128", "smallint": "Int128", "mediumint": "Int128", "int": "Int128", "integer": "Int128",
    "bigint": "Int128", "year": "Int128", "bit": "Int128",
    "float": "Float64", "double": "Float64", "real": "Float64",
    "date": "Date32", "datetime": "DateTime64(6, 'UTC')", "timestamp": "DateTime64(6, 'UTC')",
}
BINARY_TYPES = {"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"}

def cut_points(plan: Plan) -> list:
    """The cuts the planner made, as it recorded them (:meth:`Plan.cut_points`)."""
    return plan.cut_points()


def time_micros(text: str) -> int:
    """``[-]HHH:MM:SS[.ffffff]`` → signed microseconds (TIME cuts as the target compares them)."""
    sign = -1 if text.startswith("-") else 1
    hours, minutes, seconds = text.lstrip("-").split(":")
    whole, _, fraction = seconds.partition(".")
    return sign * ((int(hours) * 3600 + int(minutes) * 60 + int(whole)) * 1_000_000 + int((fraction + "000000")[:6]))


def _ch_time_micros(col: str) -> str:
    parts = f"splitByChar(':', replaceOne({col}, '-', ''))"
    return (f"if(startsWith({col}, '-'), -1, 1) * (toInt64({parts}[1]) * 3600000000 + toInt64({parts}[2]) * 60000000"
            f" + toInt64(toDecimal64({parts}[3], 6) * 1000000))")


@dataclass(frozen=True)
class Period:
    """The partitions a period load replaced (its rows on the target are exactly those)."""

    partitions: tuple[str, ...]

    @classmethod
    def of_spec(cls, spec: dict) -> "Period | None":
        return cls(tuple(spec["replace_partitions"])) if spec.get("partition_by") else None


def target_predicates(plan: Plan, column: MySQLColumn | None, weights: Weights | None = None,
                      period: Period | None = None, weight_width: int = 0,
                      member: tuple[str, dict] = ("1", {})) -> list[tuple[str, dict]]:
    """One ClickHouse predicate with server-side parameters per shard, in plan order.

    ``weights`` (from :func:`read_weights`) is required for collated string columns, with
    ``weight_width`` ≥ the longest weight stored on the target (for PAD SPACE padding).
    ``member``: a merged copy's member filter (core/source/group.member_filter), and-ed to each.
    """
    table = f"{plan.database}.{plan.table}"
    cuts = cut_points(plan)
    params: dict = {}
    if column is None:
        value, refs = None, []
    elif needs_weight(column):
        if weights is None:
            raise NotComparable(f"table {table}: split column {column.name!r} is collated; its weights are needed")
        if len(weights.cuts) != len(cuts):
            raise NotComparable(f"table {table}: {len(cuts)} cuts but {len(weights.cuts)} weights")
        value, refs = ch_ident(SPLIT_WEIGHT_COLUMN), [f"unhex({{c{i}:String}})" for i in range(len(cuts))]
        params = {f"c{i}": w.hex() for i, w in enumerate(weights.cuts)}
        if weights.space is not None:  # PAD SPACE: compare as if padded with spaces to one length
            unit = len(weights.space)
            width = unit * (-(-max([weight_width, *map(len, weights.cuts)]) // unit) + 1)
            params |= {"pad": weights.space.hex(), "width": width}

            def padded(sql):
                return f"rightPad({sql}, {{width:UInt64}}, unhex({{pad:String}}))"

            value, refs = padded(value), [padded(r) for r in refs]
    elif column.data_type == "time":
        value, refs = _ch_time_micros(ch_ident(column.name)), [f"{{c{i}:Int64}}" for i in range(len(cuts))]
        params = {f"c{i}": time_micros(c) for i, c in enumerate(cuts)}
    elif column.data_type in BINARY_TYPES:
        value, refs = ch_ident(column.name), [f"unhex({{c{i}:String}})" for i in range(len(cuts))]
        params = {f"c{i}": c for i, c in enumerate(cuts)}
    elif column.data_type in ("decimal", "numeric"):
        kind = f"Decimal({column.precision or 10}, {column.scale or 0})"
        value, refs = ch_ident(column.name), [f"{{c{i}:{kind}}}" for i in range(len(cuts))]
        params = {f"c{i}": c for i, c in enumerate(cuts)}
    elif column.data_type in _PARAM_TYPES:
        kind = _PARAM_TYPES[column.data_type]
        value, refs = ch_ident(column.name), [f"{{c{i}:{kind}}}" for i in range(len(cuts))]
        params = {f"c{i}": c for i, c in enumerate(cuts)}
    else:
        raise NotComparable(f"table {table}: split column {column.name!r} is {column.column_type}; ClickHouse "
                            "cannot evaluate its shards (choose another split_column to reconcile this table)")

    def used(where: str) -> dict:
        return {k: v for k, v in params.items() if "{" + k + ":" in where}

    if column is None:
        out = [("1", {}) for _ in plan.shards]
    else:
        col = ch_ident(column.name)
        if not cuts:
            ranges = [f"isNotNull({col})"]
        else:
            ranges = [f"{value} < {refs[0]}"]
            ranges += [f"{value} >= {refs[i]} AND {value} < {refs[i + 1]}" for i in range(len(cuts) - 1)]
            ranges.append(f"{value} >= {refs[-1]}")
        if cuts:  # NULL keys belong to the NULL shard alone (NULL comparisons are NULL, not false)
            ranges = [f"isNotNull({col}) AND {r}" for r in ranges]
        out = [(r, used(r)) for r in ranges] + [(f"isNull({col})", {})]
    if period is not None:
        out = [(f"({w}) AND _partition_id IN {{partitions:Array(String)}}", p | {"partitions": list(period.partitions)})
               for w, p in out]
    if member[0] != "1":
        out = [(f"({w}) AND {member[0]}", p | member[1]) for w, p in out]
    return out


def weight_width(ch, database: str, table: str) -> int:
    """The longest collation weight stored on the target (0 when the table has none)."""
    return int(ch.command(f"SELECT max(length({ch_ident(SPLIT_WEIGHT_COLUMN)})) FROM {ch_table(database, table)}") or 0)


def shard_predicates(conn, ch, plan: Plan, schema, copy: tuple[str, str], load_spec: dict | None = None,
                     also: str = "") -> list[tuple[str, dict]]:
    """The copy's (``(database, table)``) side of each of ``plan``'s shards (the planner's,
    core/source/planning.py): everything :func:`target_predicates` needs, read from MySQL (``conn``)
    and the target; ``load_spec``: a period load's (its partitions); ``also``: a ClickHouse condition
    every shard carries besides (a TTL window)."""
    database, table = copy
    column = schema.column(plan.split_column) if plan.split_column else None
    weights, width = None, 0
    if needs_weight(column):
        weights = read_weights(conn, column, cut_points(plan))
        if weights.space is not None:
            width = weight_width(ch, database, table)
    member, params = member_filter(schema)
    if also:
        member = f"({member}) AND {also}"
    return target_predicates(plan, column, weights, Period.of_spec(load_spec or {}), width, (member, params))

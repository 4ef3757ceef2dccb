"""Shard planning (seeds 000 DataX, 003 DBus): which column to split on, where to cut, how many channels.

A plan is a list of shards over one split column, each a WHERE clause with ``%s`` placeholders
and JSON-serialisable parameters, so it is always executed with bound values:

* ``N - 1`` cut points ``c1 < c2 < …`` give the range shards ``col < c1``,
  ``col >= c1 AND col < c2``, …, ``col >= c_last``. The outer shards are open-ended, so the
  range shards cover every non-NULL value whatever the cuts are (rows inserted after planning
  included), and half-open intervals never overlap: they partition the table exactly as long
  as the cuts increase, which both strategies guarantee.
* ``col IS NULL`` is always a shard of its own.
* A range shard of a large table is also cut into **pieces**: consecutive finer ranges (the
  same predicate forms, cut the same way) that partition it. A shard is the unit of the ledger,
  retries and versions; a piece is one reader query. The Arrow-native reader (connectorx) buffers
  a query's whole result when writing falls behind reading, so pieces of about
  :data:`PIECE_BYTES` keep a channel's memory the same whatever the table's size.
* Every comparison is made by the database, with the column's own collation: string cuts are
  real key values taken in index order, so case-insensitive and PAD SPACE collations, utf8mb4
  and 4-byte characters order exactly as MySQL orders them, and no cut can contain a surrogate.

Strategies: ``equal`` cuts the [min, max] range into equal widths (numbers, dates, times; the
DataX/Sqoop baseline); ``balanced`` walks the split index, taking every ``rows / N``-th key
(index-ordered bounds), so shards hold about the same number of rows on skewed or sparse keys.
Strings have no meaningful width, so ``equal`` uses index-ordered bounds for them (and says so).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import math
from dataclasses import dataclass
from decimal import ROUND_FLOOR, Decimal, localcontext
from typing import Any, Protocol

from airflow_sync_provider.core.source.schema import TableSchema, average_row_bytes
from airflow_sync_provider.core.sql import mysql_ident, mysql_table
from airflow_sync_provider.core.typemap import MySQLColumn

DEFAULT_SPLIT_FACTOR = 5  # DataX: shards = channels × split_factor (+1 NULL shard)
# An automatic split factor (split_factor=None) stays below DEFAULT_SPLIT_FACTOR so that a shard
# holds at least this many rows (estimated): each shard costs ledger writes, a source
# connection and an insert (≈0.1 s), which on a small table outweighs what splitting it buys.
MIN_SHARD_ROWS = 50_000
# A piece (one reader query) holds about this many bytes at most (InnoDB's average row length).
PIECE_BYTES = 4 * 1024 * 1024
EVEN_ENOUGH = 1.2  # balanced keeps equal-width cuts when estimated max/mean rows per shard is at most this
STRATEGIES = ("equal", "balanced")

_INTEGER = {"tinyint", "smallint", "mediumint", "int", "integer", "bigint", "year", "bit"}
_DECIMAL = {"decimal", "numeric"}
_FLOAT = {"float", "double", "real"}
_TEMPORAL = {"date", "datetime", "timestamp", "time"}
_BINARY = {"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"}
_EPOCH = dt.datetime(1970, 1, 1)


class PlanError(ValueError):
    """A configuration the planner cannot honour (the message says what to change)."""

    retry_helps = False


@dataclass(frozen=True)
class Filter:
    """A row filter every shard carries (e.g. one accounting period): SQL with ``%s`` and params."""

    sql: str = "1=1"
    params: tuple = ()

    def __post_init__(self):
        if self.sql.replace("%%", "").count("%s") != len(self.params):
            raise PlanError(f"where {self.sql!r} has {self.sql.count('%s')} placeholders but "
                            f"{len(self.params)} parameters")

    def also(self, sql: str) -> "Filter":
        """This filter and ``sql`` (a condition without placeholders: its '%' doubled here)."""
        sql = sql.replace("%", "%%")
        return Filter(sql, self.params) if self.sql == "1=1" else Filter(f"({self.sql}) AND ({sql})", self.params)

    def apply(self, shard: "Shard") -> "Shard":
        if self.sql == "1=1":
            return shard
        pieces = tuple((f"({w}) AND ({self.sql})", (*p, *self.params)) for w, p in shard.pieces)
        return dataclasses.replace(shard, where=f"({shard.where}) AND ({self.sql})",
                                   params=(*shard.params, *self.params), pieces=pieces)


@dataclass(frozen=True)
class Shard:
    id: int
    where: str
    params: tuple = ()
    estimated_rows: int | None = None
    # (where, params) of each piece, in key order; () when the shard is read as one piece
    pieces: tuple[tuple[str, tuple], ...] = ()
    # a range shard's cut points (parameter values, None at an open end): ``low <= key < high``;
    # None for the NULL shard and the whole table's one shard
    bounds: tuple | None = None

    def queries(self) -> tuple[tuple[str, tuple], ...]:
        """The reader's predicates for this shard: its pieces, or the shard itself."""
        return self.pieces or ((self.where, self.params),)


@dataclass(frozen=True)
class Plan:
    database: str
    table: str
    split_column: str | None
    index: str | None  # the index the range shards are read through
    strategy: str
    channels: int
    split_factor: int
    shards: tuple[Shard, ...]
    warnings: tuple[str, ...] = ()

    def null_shard(self, shard: Shard) -> bool:
        """Is ``shard`` the one of the split column's NULL keys?"""
        return (self.split_column is not None and shard.bounds is None
                and shard.where.lstrip("(").startswith(f"{mysql_ident(self.split_column)} IS NULL"))

    def range_shards(self) -> list[Shard]:
        """The shards cut from the split column's range, in key order (they come first; the NULL
        shard follows them)."""
        return [s for s in self.shards if s.bounds is not None]

    def cut_points(self) -> list:
        """The cuts the planner made (bound parameter values), in key order."""
        return [s.bounds[1] for s in self.range_shards()[:-1]]

    def to_dict(self) -> dict:
        ranges = self.range_shards()
        return {
            "table": self.table, "database": self.database, "split_column": self.split_column,
            "index": self.index, "strategy": self.strategy, "channels": self.channels,
            "split_factor": self.split_factor,
            "shards": [{"id": s.id, "where": s.where, "params": list(s.params), "estimated_rows": s.estimated_rows,
                        **({"pieces": [{"where": w, "params": list(p)} for w, p in s.pieces]} if s.pieces else {})}
                       for s in self.shards],
            "warnings": list(self.warnings),
            **({"cuts": self.cut_points()} if ranges else {}),
        }

    def to_json(self, **kwargs) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, **kwargs)

    @classmethod
    def from_dict(cls, data: dict) -> "Plan":
        bounds = _stored_bounds(data)
        shards = tuple(Shard(s["id"], s["where"], tuple(s["params"]), s.get("estimated_rows"),
                             tuple((p["where"], tuple(p["params"])) for p in s.get("pieces", ())),
                             bounds[i] if i < len(bounds) else None)
                       for i, s in enumerate(data["shards"]))
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in fields and k not in ("shards", "warnings")}
        return cls(**values, shards=shards, warnings=tuple(data.get("warnings", ())))

    def from_clause(self) -> str:
        """``FROM db.table [FORCE INDEX (ix)]``: range shards must use the split index."""
        hint = f" FORCE INDEX ({mysql_ident(self.index)})" if self.index else ""
        return f"FROM {mysql_table(self.database, self.table)}{hint}"


def _bounds(cuts: list) -> list[tuple]:
    """Each range's (low, high) between increasing cuts, open-ended at both ends."""
    edges = [None, *cuts, None]
    return list(zip(edges[:-1], edges[1:]))


def _stored_bounds(data: dict) -> list[tuple]:
    """The range shards' bounds of a plan as :meth:`Plan.to_dict` stored it (its ``cuts``). A plan
    stored before cuts were kept has its range shards first and the NULL shard last, each range
    shard's parameters led by its bounds: ``< c1``, ``>= c_i AND < c_i+1``, ``>= c_last``."""
    if "cuts" in data:
        return _bounds(list(data["cuts"]))
    if not data.get("split_column") or len(data["shards"]) < 2:
        return []
    ranges = data["shards"][:-1]
    cuts = [ranges[0]["params"][0]] + [s["params"][1] for s in ranges[1:-1]] if len(ranges) > 1 else []
    return _bounds(cuts)


# --- channels (DataX flow control) -------------------------------------------------------

@dataclass(frozen=True)
class SpeedLimits:
    """DataX's ``job.setting.speed`` (global) and ``core.transport.channel.speed`` (per channel)."""

    channels: int | None = None
    byte: int | None = None  # global bytes/s
    record: int | None = None  # global records/s
    channel_byte: int | None = None  # per-channel bytes/s
    channel_record: int | None = None  # per-channel records/s

    def channel_count(self) -> int:
        """DataX's rule: global ÷ per-channel speed, the smaller when both are limited; else ``channels``."""
        counts = []
        for name, total, per_channel in (("byte", self.byte, self.channel_byte),
                                         ("record", self.record, self.channel_record)):
            if total is None or total <= 0:
                continue
            if per_channel is None or per_channel <= 0:
                raise PlanError(f"a global {name} speed limit ({total}/s) needs a per-channel {name} limit "
                                f"(channel_{name}) to derive the channel count; set channel_{name} or drop {name}")
            counts.append(max(1, total // per_channel))
        if counts:
            return min(counts)
        if self.channels is None:
            raise PlanError("set channels, or a global speed limit with its per-channel limit")
        if self.channels < 1:
            raise PlanError(f"channels must be at least 1, got {self.channels}")
        return self.channels


# --- split column ------------------------------------------------------------------------

def choose_split_column(schema: TableSchema, override: str | None = None) -> tuple[str | None, str | None, list[str]]:
    """(column, index, warnings): user override → primary key → unique index (NOT NULL first) → plain index.

    A composite index splits on its first column. Only a column that leads an index can be
    read shard by shard with range access.
    """
    warnings: list[str] = []
    # a column the copy holds transformed (core/content/) cannot cut the copy into the same ranges
    shaped = {name for name, _ in schema.content.transform}
    leading = [ix for ix in schema.indexes if ix.columns and ix.columns[0] is not None and ix.columns[0] not in shaped]
    if override is not None and override in shaped:
        raise PlanError(f"table {schema.qualified}: split column {override!r} is transformed in the copy "
                        f"({dict(schema.content.transform)[override]}), so the copy's rows cannot be found by its "
                        "ranges; split on another indexed column")
    if override is not None:
        column = schema.column(override).name  # KeyError names the table and column
        index = next((ix.name for ix in leading if ix.columns[0] == column), None)
        if index is None:
            raise PlanError(f"table {schema.qualified}: split column {override!r} does not lead any index, "
                            "so every shard would scan the whole table; index it or choose an indexed column")
        return column, index, warnings

    def not_null(ix):
        return not schema.column(ix.columns[0]).nullable

    ranked = ([ix for ix in leading if ix.name == "PRIMARY"]
              + sorted((ix for ix in leading if ix.unique and ix.name != "PRIMARY"), key=lambda ix: not not_null(ix))
              + [ix for ix in leading if not ix.unique])
    for ix in ranked:
        if len(ix.columns) > 1:
            warnings.append(f"index {ix.name!r} is composite; splitting on its first column {ix.columns[0]!r}")
        return ix.columns[0], ix.name, warnings
    warnings.append(f"table {schema.qualified} has no index to split on; it is read as one shard (one channel)")
    return None, None, warnings


# --- parameters: JSON-serialisable and exact ---------------------------------------------

def _placeholder(column: MySQLColumn) -> str:
    """The SQL a bound parameter appears as, so that a JSON value compares exactly."""
    if column.data_type in _DECIMAL:
        return f"CAST(%s AS DECIMAL({column.precision or 10}, {column.scale or 0}))"
    if column.data_type in _BINARY:
        return "UNHEX(%s)"
    return "%s"


def _key_value(column: MySQLColumn, value: Any):
    """BIT values arrive as bytes; everything else is already comparable."""
    if column.data_type == "bit" and isinstance(value, (bytes, bytearray)):
        return int.from_bytes(value, "big")
    return value


def to_param(column: MySQLColumn, value: Any):
    """A key value as a JSON value for ``_placeholder`` (decimals and times as text, bytes as hex)."""
    value = _key_value(column, value)
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float, str)) and column.data_type not in _BINARY:
        return value
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, dt.datetime):
        return value.isoformat(sep=" ", timespec="microseconds")
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        micros = abs(value) // dt.timedelta(microseconds=1)
        sign = "-" if value < dt.timedelta(0) else ""
        return (f"{sign}{micros // 3_600_000_000:02d}:{micros // 60_000_000 % 60:02d}:"
                f"{micros // 1_000_000 % 60:02d}.{micros % 1_000_000:06d}")
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).hex()
    if isinstance(value, str):  # a binary column read back as text
        return value.encode("utf-8", "surrogateescape").hex()
    raise PlanError(f"column {column.name!r}: cannot bind a split value of type {type(value).__name__}")


def _ranges(column: MySQLColumn, cuts: list) -> list[tuple[str, tuple]]:
    """The half-open ranges increasing cut points make: ``col < c1``, …, ``col >= c_last``."""
    col, ph = mysql_ident(column.name), _placeholder(column)
    params = [to_param(column, c) for c in cuts]
    if not cuts:
        return [(f"{col} IS NOT NULL", ())]
    ranges = [(f"{col} < {ph}", (params[0],))]
    ranges += [(f"{col} >= {ph} AND {col} < {ph}", (params[i], params[i + 1])) for i in range(len(cuts) - 1)]
    ranges.append((f"{col} >= {ph}", (params[-1],)))
    return ranges


def shards_from_cuts(column: MySQLColumn, cuts: list, shards: int | None = None) -> list[Shard]:
    """Range shards from increasing cut points, then the NULL shard. With ``shards``, at most
    that many range shards: the ranges are grouped, as evenly as they go, into shards whose
    pieces they are (when there are fewer cuts than asked for, shards come first)."""
    pieces = _ranges(column, cuts)
    count = min(shards or len(pieces), len(pieces))
    bounds = [i * len(pieces) // count for i in range(count + 1)]
    out, chosen = [], [cuts[b - 1] for b in bounds[1:-1]]
    edges = _bounds([to_param(column, c) for c in chosen])
    for i, (where, params) in enumerate(_ranges(column, chosen)):
        group = pieces[bounds[i]:bounds[i + 1]]
        out.append(Shard(i, where, params, pieces=tuple(group) if len(group) > 1 else (), bounds=edges[i]))
    out.append(Shard(len(out), f"{mysql_ident(column.name)} IS NULL"))
    return out


def pieces_per_shard(rows: int, shards: int, row_bytes: int) -> int:
    """Pieces per range shard so that one holds about :data:`PIECE_BYTES` at most."""
    return max(1, math.ceil(rows / max(1, shards) * max(1, row_bytes) / PIECE_BYTES))


# --- cut points --------------------------------------------------------------------------

def equal_width_cuts(column: MySQLColumn, lo, hi, n: int) -> list | None:
    """``n - 1`` equal-width cuts inside (lo, hi], increasing; None when the type has no width."""
    lo, hi = _key_value(column, lo), _key_value(column, hi)
    t = column.data_type
    if t not in _INTEGER | _DECIMAL | _FLOAT | _TEMPORAL:
        return None
    if n <= 1 or lo is None or lo == hi:
        return []
    # Discrete types split their inclusive span (hi - lo + 1), so a span smaller than n still
    # gets one shard per value instead of none.
    if t in _INTEGER:
        lo, hi = int(lo), int(hi)
        cuts = [lo + (hi - lo + 1) * i // n for i in range(1, n)]
    elif t in _DECIMAL:
        with localcontext() as ctx:
            ctx.prec = 100
            quantum = Decimal(1).scaleb(-(column.scale or 0))
            cuts = [(lo + (hi - lo) * i / n).quantize(quantum, rounding=ROUND_FLOOR) for i in range(1, n)]
    elif t in _FLOAT:
        lo, hi = float(lo), float(hi)
        cuts = [lo * (1 - i / n) + hi * (i / n) for i in range(1, n)]  # no (hi - lo) overflow
    elif t == "date":
        a, b = lo.toordinal(), hi.toordinal()
        cuts = [dt.date.fromordinal(a + (b - a + 1) * i // n) for i in range(1, n)]
    elif t in ("datetime", "timestamp"):
        unit = dt.timedelta(microseconds=1)
        a, b = (lo - _EPOCH) // unit, (hi - _EPOCH) // unit
        cuts = [_EPOCH + unit * (a + (b - a + 1) * i // n) for i in range(1, n)]
    elif t == "time":
        unit = dt.timedelta(microseconds=1)
        a, b = lo // unit, hi // unit
        cuts = [unit * (a + (b - a + 1) * i // n) for i in range(1, n)]
    out = []
    for cut in cuts:  # strictly increasing and inside (lo, hi]: no empty or inverted ranges
        if lo < cut <= hi and (not out or cut > out[-1]):
            out.append(cut)
    return out


class KeyIndex(Protocol):
    """Ordered access to the split column's non-NULL values (the database's order)."""

    def count(self) -> int: ...
    def first(self) -> Any: ...
    def nth_above(self, value, n: int) -> Any: ...  # the n-th value (1-based) > value, or None


def index_ordered_cuts(keys: KeyIndex, n: int) -> list:
    """Cuts every ``count / n`` keys along the index. Each cut is read as a value strictly above
    the previous one, so the cuts increase in the database's own order (duplicates, collations)."""
    total = keys.count()
    if n <= 1 or total == 0:
        return []
    step = max(1, math.ceil(total / n))
    cuts, current = [], keys.first()
    for _ in range(n - 1):
        current = keys.nth_above(current, step)
        if current is None:
            break
        cuts.append(current)
    return cuts


class MySQLKeyIndex:
    """KeyIndex over a live table (optionally only rows matching ``where``): each step is one
    index range scan of ``step`` entries."""

    def __init__(self, conn, schema: TableSchema, column: MySQLColumn, index: str, where: Filter | None = None):
        self.conn, self.column = conn, column
        self.col = mysql_ident(column.name)
        hint = f" FORCE INDEX ({mysql_ident(index)})"
        self.source = f"{mysql_table(schema.database, schema.table)}{hint}"
        self.filter = where or Filter()

    def _one(self, condition, params=(), tail="", tail_params=()):
        with self.conn.cursor() as cur:
            cur.execute(f"{condition} AND {self.filter.sql}{tail}", (*params, *self.filter.params, *tail_params))
            row = cur.fetchone()
        return row[0] if row else None

    @functools.cache  # noqa: B019 - one instance per plan; the COUNT(*) scan is run once, not per use
    def count(self) -> int:
        return int(self._one(f"SELECT COUNT(*) FROM {self.source} WHERE {self.col} IS NOT NULL"))

    def null_count(self) -> int:
        return int(self._one(f"SELECT COUNT(*) FROM {self.source} WHERE {self.col} IS NULL"))

    def first(self):
        return self._one(f"SELECT {self.col} FROM {self.source} WHERE {self.col} IS NOT NULL",
                         tail=f" ORDER BY {self.col} LIMIT 1")

    def min_max(self):
        with self.conn.cursor() as cur:
            cur.execute(f"SELECT MIN({self.col}), MAX({self.col}) FROM {self.source} WHERE {self.filter.sql}",
                        self.filter.params)
            return cur.fetchone()

    def nth_above(self, value, n: int):
        return self._one(f"SELECT {self.col} FROM {self.source} WHERE {self.col} > {_placeholder(self.column)}",
                         (to_param(self.column, value),), f" ORDER BY {self.col} LIMIT 1 OFFSET %s", (n - 1,))


# --- the plan ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Sharding:
    """How a table is split: its channels and speed limits (DataX), the split column (None: the
    planner chooses, :func:`choose_split_column`), shards per channel (None:
    :func:`auto_split_factor`), the strategy, a filter of the rows to load (a period: every shard
    carries it, and cuts are taken among the matching rows, so split on the period column to keep
    an index range), and whether each shard's rows are estimated."""

    speed: SpeedLimits | None = None
    split_column: str | None = None
    split_factor: int | None = None
    strategy: str = "balanced"
    where: Filter | None = None
    estimate: bool = True


def rows_filter(schema: TableSchema, where: Filter | None = None) -> Filter:
    """The rows a job reads of ``schema``'s table: ``where`` (a period, a TTL window) and the
    copy's row filter (core/content/: the copy holds only those rows). Every plan carries it."""
    where = where or Filter()
    return where if schema.row_filter is None else where.also(schema.row_filter.sql())


def whole_table(conn, schema: TableSchema, where: Filter | None = None, estimate: bool = False,
                strategy: str = "balanced", split_factor: int = 1, warnings: tuple = ()) -> Plan:
    """``schema``'s table as one shard of the rows :func:`rows_filter` picks (no split column, or
    one a check cannot compare); ``estimate``: with EXPLAIN's row estimate (``conn`` may be None
    without it)."""
    shard = rows_filter(schema, where).apply(Shard(0, "1=1"))
    plan = Plan(schema.database, schema.table, None, None, strategy, 1, split_factor, (shard,), tuple(warnings))
    if estimate:
        return dataclasses.replace(plan, shards=(dataclasses.replace(shard, estimated_rows=_explain_rows(
            conn, plan, shard)),))
    return plan


def plan_table(conn, schema: TableSchema, sharding: Sharding = Sharding()) -> Plan:
    """Plan the shards of ``schema``'s table over an open pymysql connection (session time
    zone UTC, as the readers use, so TIMESTAMP cuts mean the same instants), as ``sharding`` says."""
    speed, split_column, split_factor = sharding.speed, sharding.split_column, sharding.split_factor
    strategy, where, estimate = sharding.strategy, rows_filter(schema, sharding.where), sharding.estimate
    if strategy not in STRATEGIES:
        raise PlanError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    if split_factor is not None and split_factor < 1:
        raise PlanError(f"split_factor must be at least 1, got {split_factor}")
    channels = (speed or SpeedLimits(channels=1)).channel_count()
    column_name, index, warnings = choose_split_column(schema, split_column)
    if column_name is None:
        return whole_table(conn, schema, sharding.where, estimate, strategy, split_factor or 1, tuple(warnings))
    whole = Plan(schema.database, schema.table, None, None, strategy, 1, 1, ())
    rows = _explain_rows(conn, whole, where.apply(Shard(0, "1=1")))
    if split_factor is None:
        split_factor = auto_split_factor(rows, channels)
    column = schema.column(column_name)
    wanted = channels * split_factor
    k = pieces_per_shard(rows, wanted, average_row_bytes(conn, schema.database, schema.table))
    keys = MySQLKeyIndex(conn, schema, column, index, where)
    plan = Plan(schema.database, schema.table, column.name, index, strategy, channels, split_factor, (),
                tuple(warnings))
    cuts = equal_width_cuts(column, *keys.min_max(), wanted * k)
    estimates = None
    if strategy == "equal" and cuts is None:
        warnings.append(f"equal-width ranges are not defined for {column.data_type} column "
                        f"{column.name!r}; used index-ordered bounds")
    elif strategy == "balanced" and cuts:
        # Walking the index costs one pass over it (≈5 s per 10M rows); when the optimizer's
        # range estimates already show equal widths holding even shards, skip the walk.
        estimates = [_explain_rows(conn, plan, where.apply(s)) for s in shards_from_cuts(column, cuts, wanted)]
        ranges = estimates[:-1]
        if not (min(ranges) > 0 and max(ranges) <= EVEN_ENOUGH * sum(ranges) / len(ranges)):
            cuts, estimates = None, None
    walked = cuts is None
    if walked:
        cuts = index_ordered_cuts(keys, wanted * k)
    shards = shards_from_cuts(column, cuts, wanted)
    if walked and estimate:  # the walk itself measured the shards: ``step`` keys per piece, the rest last
        step = max(1, math.ceil(keys.count() / (wanted * k)))
        ranges = [len(s.queries()) * step for s in shards[:-2]]
        estimates = [*ranges, keys.count() - sum(ranges), keys.null_count()]
    shards = [where.apply(s) for s in shards]
    if estimates:
        shards = [dataclasses.replace(s, estimated_rows=max(0, e)) for s, e in zip(shards, estimates)]
    plan = Plan(schema.database, schema.table, column.name, index, strategy, channels, split_factor, (),
                tuple(warnings))
    if estimate:
        shards = [s if s.estimated_rows is not None
                  else dataclasses.replace(s, estimated_rows=_explain_rows(conn, plan, s)) for s in shards]
    return dataclasses.replace(plan, shards=tuple(shards))


def auto_split_factor(estimated_rows: int, channels: int) -> int:
    """Shards per channel for a table of about ``estimated_rows``: DataX's 5, fewer when shards
    would hold under MIN_SHARD_ROWS rows, never under one per channel (channels stay busy)."""
    return max(1, min(DEFAULT_SPLIT_FACTOR, estimated_rows // (channels * MIN_SHARD_ROWS)))


def explain(conn, plan: Plan, shard: Shard) -> dict:
    """EXPLAIN of the SELECT a reader runs for ``shard``: {'type', 'key', 'rows', …} of its table row."""
    with conn.cursor() as cur:
        cur.execute(f"EXPLAIN SELECT * {plan.from_clause()} WHERE {shard.where}", shard.params)
        names = [d[0].lower() for d in cur.description]
        return dict(zip(names, cur.fetchone()))


def _explain_rows(conn, plan: Plan, shard: Shard) -> int:
    rows = explain(conn, plan, shard).get("rows")
    return int(rows) if rows is not None else 0

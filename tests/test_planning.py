"""Planner logic without a database: split-column choice, channels, and (hypothesis) exact partition."""

from __future__ import annotations

import bisect
import datetime as dt
import json
import math
import re
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_sync_provider.core.source.planning import (
    DEFAULT_SPLIT_FACTOR,
    MIN_SHARD_ROWS,
    PIECE_BYTES,
    Plan,
    PlanError,
    Shard,
    SpeedLimits,
    auto_split_factor,
    choose_split_column,
    equal_width_cuts,
    index_ordered_cuts,
    pieces_per_shard,
    shards_from_cuts,
)
from airflow_sync_provider.core.source.schema import Index, TableSchema
from airflow_sync_provider.core.typemap import MySQLColumn

# --- a Python evaluator for the planner's five predicate forms --------------------------

def decode(column, param):
    t = column.data_type
    if t in ("decimal",):
        return Decimal(param)
    if t == "date":
        return dt.date.fromisoformat(param)
    if t in ("datetime", "timestamp"):
        return dt.datetime.fromisoformat(param)
    return param


def matches(shard, column, value) -> bool:
    col = re.escape(f"`{column.name}`")
    p = [decode(column, x) for x in shard.params]
    ph = r"(?:%s|CAST\(%s AS DECIMAL\(\d+, \d+\)\))"
    if re.fullmatch(f"{col} IS NULL", shard.where):
        return value is None
    if value is None:
        return False
    if re.fullmatch(f"{col} IS NOT NULL", shard.where):
        return True
    if re.fullmatch(f"{col} < {ph}", shard.where):
        return value < p[0]
    if re.fullmatch(f"{col} >= {ph} AND {col} < {ph}", shard.where):
        return p[0] <= value < p[1]
    if re.fullmatch(f"{col} >= {ph}", shard.where):
        return value >= p[0]
    raise AssertionError(f"unexpected predicate {shard.where!r}")


class SortedKeys:
    """KeyIndex over an in-memory sorted list (Python order stands in for the collation)."""

    def __init__(self, values):
        self.keys = sorted(v for v in values if v is not None)

    def count(self):
        return len(self.keys)

    def first(self):
        return self.keys[0] if self.keys else None

    def nth_above(self, value, n):
        i = bisect.bisect_right(self.keys, value) + n - 1
        return self.keys[i] if i < len(self.keys) else None


def assert_partition(shards, column, values):
    for v in values:
        hits = [s.id for s in shards if matches(s, column, v)]
        assert len(hits) == 1, (v, hits, shards)


COLUMNS = {
    "bigint": (MySQLColumn("k", "bigint", "bigint", True), st.integers(-2**63, 2**63 - 1)),
    "ubigint": (MySQLColumn("k", "bigint", "bigint unsigned", True), st.integers(0, 2**64 - 1)),
    "decimal": (MySQLColumn("k", "decimal", "decimal(65,30)", True, precision=65, scale=30),
                st.decimals(min_value=Decimal("-1e34"), max_value=Decimal("1e34"), places=30, allow_nan=False)),
    "double": (MySQLColumn("k", "double", "double", True),
               st.floats(allow_nan=False, allow_infinity=False)),
    "date": (MySQLColumn("k", "date", "date", True), st.dates(dt.date(1000, 1, 1), dt.date(9999, 12, 31))),
    "datetime": (MySQLColumn("k", "datetime", "datetime(6)", True, fsp=6),
                 st.datetimes(dt.datetime(1000, 1, 1), dt.datetime(9999, 12, 31))),
    "varchar": (MySQLColumn("k", "varchar", "varchar(20)", True), st.text(max_size=6)),
}


@pytest.mark.parametrize("kind", sorted(COLUMNS))
@pytest.mark.parametrize("strategy", ["equal", "balanced"])
def test_shards_partition_generated_keys(kind, strategy):
    column, values = COLUMNS[kind]

    @settings(max_examples=60, deadline=None)
    @given(keys=st.lists(st.one_of(st.none(), values), max_size=60), n=st.integers(1, 30),
           probes=st.lists(values, max_size=20))
    def check(keys, n, probes):
        present = [k for k in keys if k is not None]
        cuts = None
        if strategy == "equal" and present:
            cuts = equal_width_cuts(column, min(present), max(present), n)
        if cuts is None:
            cuts = index_ordered_cuts(SortedKeys(keys), n)
        assert all(a < b for a, b in zip(cuts, cuts[1:])), cuts
        shards = shards_from_cuts(column, cuts)
        assert len(shards) <= n + 1 and shards[-1].where == "`k` IS NULL"
        json.dumps([s.params for s in shards])  # parameters are JSON
        assert_partition(shards, column, keys + probes + [None])  # also values never seen at planning

    check()


@pytest.mark.parametrize("kind", ["bigint", "decimal", "datetime", "varchar"])
def test_pieces_partition_their_shard(kind):
    """A shard cut into pieces: every value is in exactly one shard and, inside it, in exactly
    one of its pieces (the reader's queries), whatever the cuts and the pieces per shard."""
    column, values = COLUMNS[kind]

    @settings(max_examples=60, deadline=None)
    @given(keys=st.lists(values, max_size=60), n=st.integers(1, 12), k=st.integers(1, 6),
           probes=st.lists(values, max_size=20))
    def check(keys, n, k, probes):
        cuts = index_ordered_cuts(SortedKeys(keys), n * k)
        shards = shards_from_cuts(column, cuts, n)
        assert len(shards) == min(n, len(cuts) + 1) + 1  # shards first, then pieces
        assert all(len(s.pieces) <= k for s in shards) and all(len(s.pieces) != 1 for s in shards)
        for v in keys + probes:
            (shard,) = [s for s in shards if matches(s, column, v)]
            pieces = [Shard(0, where, params) for where, params in shard.queries()]
            assert sum(matches(p, column, v) for p in pieces) == 1, (v, shard)
        for shard in shards:  # a piece never reaches outside its shard
            for where, params in shard.queries():
                assert all(matches(shard, column, v) for v in keys + probes
                           if matches(Shard(0, where, params), column, v))

    check()


def test_pieces_per_shard_bound_a_query_in_bytes():
    assert pieces_per_shard(PIECE_BYTES // 100 * 10, 10, 100) == 1  # a shard of one piece's bytes
    assert pieces_per_shard(10_000_000, 10, 98) == math.ceil(1_000_000 * 98 / PIECE_BYTES)
    assert pieces_per_shard(0, 10, 0) == 1
    rows, shards, width = 10_000_000, 10, 700
    assert rows / shards / pieces_per_shard(rows, shards, width) * width <= PIECE_BYTES


@given(st.lists(st.integers(0, 10**6), min_size=1, max_size=400), st.integers(1, 20))
def test_index_ordered_cuts_balance_rows(keys, n):
    cuts = index_ordered_cuts(SortedKeys(keys), n)
    shards = shards_from_cuts(COLUMNS["bigint"][0], cuts)
    sizes = [sum(matches(s, COLUMNS["bigint"][0], k) for k in keys) for s in shards[:-1]]
    step = -(-len(keys) // n)
    # each range shard holds one step of keys plus the duplicates of its lower bound
    dups = max(keys.count(k) for k in set(keys))
    assert max(sizes) <= step + dups


def test_float_range_does_not_overflow():
    cuts = equal_width_cuts(COLUMNS["double"][0], -1.7e308, 1.7e308, 10)
    assert len(cuts) == 9 and all(abs(c) < float("inf") for c in cuts)


def schema(columns, indexes):
    cols = tuple(MySQLColumn(n, "int", "int", nullable) for n, nullable in columns)
    pk = next((ix.columns for ix in indexes if ix.name == "PRIMARY"), ())
    return TableSchema("db", "t", cols, pk, tuple(indexes))


def test_split_column_precedence():
    cols = [("a", False), ("b", True), ("c", False), ("d", True)]
    pk = Index("PRIMARY", ("a", "b"), True)
    uq_null = Index("uq_b", ("b",), True)
    uq = Index("uq_c", ("c",), True)
    plain = Index("ix_d", ("d",), False)
    assert choose_split_column(schema(cols, [pk, uq_null, uq, plain]))[:2] == ("a", "PRIMARY")
    assert "composite" in choose_split_column(schema(cols, [pk]))[2][0]
    assert choose_split_column(schema(cols, [plain, uq_null, uq]))[:2] == ("c", "uq_c")  # NOT NULL unique first
    assert choose_split_column(schema(cols, [plain, uq_null]))[:2] == ("b", "uq_b")
    assert choose_split_column(schema(cols, [plain]))[:2] == ("d", "ix_d")
    assert choose_split_column(schema(cols, [pk, plain], ), override="d")[:2] == ("d", "ix_d")
    column, index, warnings = choose_split_column(schema(cols, []))
    assert column is None and "no index" in warnings[0]
    with pytest.raises(PlanError, match="does not lead any index"):
        choose_split_column(schema(cols, [pk]), override="c")
    with pytest.raises(KeyError, match="no column 'zz'"):
        choose_split_column(schema(cols, [pk]), override="zz")


@pytest.mark.parametrize("limits, expected", [
    (SpeedLimits(channels=7), 7),
    (SpeedLimits(channels=7, byte=10_000_000, channel_byte=1_000_000), 10),
    (SpeedLimits(record=50_000, channel_record=20_000), 2),
    (SpeedLimits(byte=10_000_000, channel_byte=1_000_000, record=50_000, channel_record=20_000), 2),
    (SpeedLimits(record=100, channel_record=1_000), 1),
])
def test_datax_channel_rules(limits, expected):
    assert limits.channel_count() == expected


def test_global_limit_without_channel_limit_is_a_configuration_error():
    with pytest.raises(PlanError, match="needs a per-channel byte limit"):
        SpeedLimits(byte=1_000_000).channel_count()
    with pytest.raises(PlanError, match="channels"):
        SpeedLimits().channel_count()


def test_plan_json_round_trip():
    column = COLUMNS["decimal"][0]
    shards = shards_from_cuts(column, [Decimal("1.5"), Decimal("2.25")])
    plan = Plan("db", "t", "k", "PRIMARY", "equal", 2, 5, tuple(shards), ("w",))
    again = Plan.from_dict(json.loads(plan.to_json()))
    assert again == plan
    pieced = Plan("db", "t", "k", "PRIMARY", "equal", 1, 1,
                  tuple(shards_from_cuts(column, [Decimal(i) for i in range(1, 6)], 2)))
    assert Plan.from_dict(json.loads(pieced.to_json())) == pieced and pieced.shards[0].pieces
    assert plan.to_dict()["shards"][1] == {"id": 1, "where": "`k` >= CAST(%s AS DECIMAL(65, 30)) AND "
                                           "`k` < CAST(%s AS DECIMAL(65, 30))",
                                           "params": ["1.5", "2.25"],
                                           "estimated_rows": None}


@given(st.integers(0, 10**9), st.integers(1, 64))
def test_auto_split_factor_keeps_shards_above_the_floor_and_channels_busy(rows, channels):
    factor = auto_split_factor(rows, channels)
    assert 1 <= factor <= DEFAULT_SPLIT_FACTOR
    # shards hold at least the floor unless that would leave a channel without a shard
    assert factor == 1 or rows // (channels * factor) >= MIN_SHARD_ROWS
    # and the full factor once the table is large enough for it
    if rows >= channels * DEFAULT_SPLIT_FACTOR * MIN_SHARD_ROWS:
        assert factor == DEFAULT_SPLIT_FACTOR

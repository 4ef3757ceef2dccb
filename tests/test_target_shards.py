"""Pure logic of core/clickhouse/shards.py: the planner's shards as ClickHouse predicates."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_sync_provider.core.clickhouse.shards import Period, cut_points, target_predicates, time_micros
from airflow_sync_provider.core.source.planning import Plan, shards_from_cuts, to_param
from airflow_sync_provider.core.source.weights import NotComparable, Weights, needs_weight
from airflow_sync_provider.core.typemap import MySQLColumn

TIME = MySQLColumn("k", "time", "time(6)", True, fsp=6)
VARCHAR = MySQLColumn("s", "varchar", "varchar(8)", False, char_length=8, charset="utf8mb4",
                      collation="utf8mb4_general_ci")
INT = MySQLColumn("k", "int", "int", True)


def plan_for(column, cuts) -> Plan:
    return Plan("db", "t", column.name, "ix", "balanced", 2, 5, tuple(shards_from_cuts(column, cuts)))


@given(st.timedeltas(dt.timedelta(hours=-838, minutes=-59, seconds=-59, microseconds=-999999),
                     dt.timedelta(hours=838, minutes=59, seconds=59, microseconds=999999)))
def test_time_cuts_become_signed_microseconds(value):
    assert time_micros(to_param(TIME, value)) == value // dt.timedelta(microseconds=1)


def test_time_text_as_mysql_and_the_loader_write_it():
    assert time_micros("-838:59:59.000") == -3_020_399_000_000
    assert time_micros("00:00:00.5") == 500_000 and time_micros("-00:00:01") == -1_000_000


def test_cut_points_are_read_back_from_the_plan_in_order():
    plan = plan_for(INT, [10, 20, 30])
    assert cut_points(plan) == [10, 20, 30]
    assert cut_points(plan_for(INT, [])) == []


def test_each_shard_gets_only_its_own_parameters_and_null_keys_their_shard():
    predicates = target_predicates(plan_for(INT, [10, 20]), INT)
    assert [p for _, p in predicates] == [{"c0": 10}, {"c0": 10, "c1": 20}, {"c1": 20}, {}]
    assert all(w.startswith("isNotNull(`k`) AND ") for w, _ in predicates[:-1])
    assert predicates[-1][0] == "isNull(`k`)"
    assert target_predicates(plan_for(INT, []), INT) == [("isNotNull(`k`)", {}), ("isNull(`k`)", {})]


def test_collated_strings_compare_weights_padded_to_one_width_for_pad_space():
    plan = plan_for(VARCHAR, ["b", "k"])
    with pytest.raises(NotComparable, match="weights are needed"):
        target_predicates(plan, VARCHAR)
    pad = target_predicates(plan, VARCHAR, Weights([b"\x00B", b"\x00K"], b"\x00 "), weight_width=9)
    where, params = pad[1]
    assert "rightPad(`_split_weight`, {width:UInt64}, unhex({pad:String}))" in where
    assert params["width"] % 2 == 0 and params["width"] > 9 and params["pad"] == "0020"
    assert params["c0"] == "0042" and params["c1"] == "004b"
    nopad = target_predicates(plan, VARCHAR, Weights([b"\x00B", b"\x00K"], None))
    assert "rightPad" not in nopad[1][0] and "`_split_weight` >= unhex({c0:String})" in nopad[1][0]
    assert needs_weight(VARCHAR) and not needs_weight(INT) and not needs_weight(None)


def test_period_loads_are_restricted_to_their_partitions():
    predicates = target_predicates(plan_for(INT, [10]), INT, period=Period(("20250301", "20250302")))
    assert all(w.endswith("AND _partition_id IN {partitions:Array(String)}") for w, _ in predicates)
    assert all(p["partitions"] == ["20250301", "20250302"] for _, p in predicates)
    assert Period.of_spec({"partition_by": None, "replace_partitions": []}) is None


def test_unorderable_split_columns_are_refused_naming_table_and_column():
    enum = MySQLColumn("e", "enum", "enum('x','y')", False)
    with pytest.raises(NotComparable, match=r"table db\.t: split column 'e' is enum\('x','y'\)"):
        target_predicates(plan_for(enum, ["x"]), enum)

"""Tables by pattern (core/source/selection.py): pure logic."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_sync_provider.core.source.selection import TableSelection


def test_wildcards_qualified_patterns_regexes_and_exclusions():
    s = TableSelection.of({"databases": ["shop", "log_*"], "tables": ["orders*", "shop.items", "re:t_\\d+"],
                           "exclude_tables": ["*_tmp", "log_2024.orders_old"]})
    assert s.matches("shop.orders") and s.matches("shop.orders_2024") and s.matches("shop.items")
    assert s.matches("log_2024.orders_x") and s.matches("shop.t_12")
    assert not s.matches("shop.orders_tmp")  # excluded
    assert not s.matches("log_2024.orders_old")  # excluded by a qualified pattern
    assert not s.matches("log_2024.items")  # `shop.items` names shop's only
    assert not s.matches("shop.t_12a") and not s.matches("other.orders")
    assert not s.matches("shop.Orders")  # case-sensitive, as table names on Linux


def test_defaults_and_targets():
    s = TableSelection.of({"databases": "shop"})
    assert s.tables == ("*",) and s.matches("shop.anything") and not s.matches("shopx.a")
    assert s.config("shop.a") == {"source_database": "shop", "source_table": "a", "target_database": "shop"}
    mapped = TableSelection.of({"databases": ["a", "b"], "target_database": "{database}_copy"})
    assert mapped.config("b.t")["target_database"] == "b_copy"
    assert TableSelection.of(mapped.to_dict()) == mapped


@pytest.mark.parametrize("bad, message", [
    ({"databases": []}, "needs databases"),
    ({"databases": ["a"], "tables": ["re:("]}, "not a regular expression"),
    ({"databases": ["a"], "table": ["x"]}, "unknown key"),
])
def test_bad_selections_are_refused_with_the_reason(bad, message):
    with pytest.raises(ValueError, match=message):
        TableSelection.of(bad)


names = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True)


@given(names, names, st.lists(names, max_size=3))
def test_an_exclusion_always_wins_and_star_selects_everything_else(database, table, others):
    everything = TableSelection.of({"databases": ["*"]})
    assert everything.matches(f"{database}.{table}")
    excluded = TableSelection.of({"databases": ["*"], "exclude_tables": [table, *others]})
    assert not excluded.matches(f"{database}.{table}")
    qualified = TableSelection.of({"databases": ["*"], "tables": [f"{database}.{table}"]})
    assert qualified.matches(f"{database}.{table}") and not qualified.matches(f"{database}x.{table}")

"""Tables by pattern (core/selection.py): pure logic."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_sync_provider.core.selection import TableSelection, TableSet


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


def test_a_tableset_configures_its_tables_once_and_a_side_by_side_group_per_source():
    named = TableSet(select={"databases": ["shop"]}, tables=["shop.a", {"source_database": "shop", "source_table": "b",
                                                                      "target_database": "kept"}])
    assert not TableSet() and named
    configured = named.configured("{source}_{database}")
    assert configured.select["target_database"] == "{source}_{database}"
    assert [t["target_database"] for t in configured.tables] == ["{source}_shop", "kept"]
    assert configured.configured("{source}_{database}") == configured  # a spec re-checked changes nothing
    east = configured.for_source("east")
    assert east.select["target_database"] == "east_{database}"
    assert [t["target_database"] for t in east.tables] == ["east_shop", "kept"]
    assert named.configured().tables[0]["target_database"] == "shop"  # one server: the source's own name
    with pytest.raises(ValueError, match="parallel_tables must be >= 1"):
        TableSet(tables=["shop.a"], parallel=0)
    with pytest.raises(ValueError, match="unknown key"):
        TableSet(select={"databases": ["shop"], "table": ["x"]})


def test_a_spec_an_earlier_release_stored_is_read_back_with_its_tables_and_merge():
    """The ledger keeps specs as they were written: select / tables / parallel_tables, one
    ``source`` and ``merge_into`` come back as today's tableset, sources and merge."""
    from airflow_sync_provider.core.specfile import spec_from_dict

    old = {"job": "full_load", "target": {"host": "ch", "port": 8123}, "merge_into": "",
           "source": {"host": "db", "port": 3306, "user": "u", "password": "p"},
           "source_database": "", "source_table": "", "target_database": "", "target_table": "",
           "load_key": "nightly", "select": {"databases": ["shop"]}, "tables": ["shop.a"], "parallel_tables": 3}
    spec = spec_from_dict(old)
    assert spec.tableset.select["databases"] == ["shop"] and spec.tableset.parallel == 3
    assert [t["source_table"] for t in spec.tableset.tables] == ["a"]
    assert spec.source.host == "db" and not spec.grouped and spec.merge is None


def test_a_tableset_holds_its_layout_and_content_as_types_and_a_spec_json_their_dict_forms():
    """Parsed once when the tableset is made (a dict, as a stored spec or the command line gives
    them, or the types); the spec's JSON holds the dict forms, None for the mirror's, as before."""
    from airflow_sync_provider.core.clickhouse.layout import Layout
    from airflow_sync_provider.core.content.shaping import Content
    from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
    from airflow_sync_provider.core.jobspec import FullLoadSpec
    from airflow_sync_provider.core.source.group import one_server
    from airflow_sync_provider.core.specfile import spec_from_dict, spec_to_dict

    given = TableSet(select={"databases": ["shop"]}, layout={"order_by": ["status"]},
                     content={"row_filter": "tenant = 7"})
    assert given.layout == Layout(order_by=("status",)) and given.content == Content(row_filter="tenant = 7")
    assert TableSet(select={"databases": ["shop"]}, layout=Layout(order_by=("status",)),
                    content=Content(row_filter="tenant = 7")) == given
    assert TableSet().layout == Layout() and not TableSet().layout and not TableSet().content
    common = dict(source_database="", source_table="", target_database="", target_table="")
    spec = FullLoadSpec(sources=one_server(MySQLEndpoint()), target=ClickHouseEndpoint(), load_key="k",
                        tableset=given, **common)
    data = spec_to_dict(spec)
    assert data["tableset"]["layout"] == {"order_by": ["status"]}
    assert data["tableset"]["content"] == {"row_filter": "tenant = 7"}
    assert spec_to_dict(spec_from_dict(data)) == data
    plain = FullLoadSpec(sources=one_server(MySQLEndpoint()), target=ClickHouseEndpoint(), load_key="k",
                         tableset=TableSet(select={"databases": ["shop"]}), **common)
    assert spec_to_dict(plain)["tableset"]["layout"] is None and spec_to_dict(plain)["tableset"]["content"] is None

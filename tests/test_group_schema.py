"""The merged copy's shape (core/source/group.py): union of the shards' columns, one ClickHouse type
per name, one primary key, the source columns after it in the target's key; a member's view
reads NULL for what it lacks and its tags for the source columns."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_sync_provider.core.clickhouse.ddl import create_table_sql
from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
from airflow_sync_provider.core.jobspec import FullLoadSpec
from airflow_sync_provider.core.selection import TableSet
from airflow_sync_provider.core.source.group import (
    SOURCE_COLUMNS,
    GroupPart,
    IncompatibleShards,
    Member,
    Merge,
    Source,
    env_name,
    member_filter,
    member_view,
    merged_schema,
)
from airflow_sync_provider.core.source.schema import TableSchema
from airflow_sync_provider.core.specfile import public_dict, spec_from_dict, spec_to_dict
from airflow_sync_provider.core.typemap import MySQLColumn


def col(name, data_type="int", column_type=None, nullable=False, **kw) -> MySQLColumn:
    return MySQLColumn(name, data_type, column_type or data_type, nullable, **kw)


ID, AMOUNT = col("id", "bigint"), col("amount", "decimal", "decimal(12,2)", precision=12, scale=2)
NOTE = col("note", "varchar", "varchar(64)", True, char_length=64, charset="utf8mb4", collation="utf8mb4_general_ci")


def table(name, *columns, key=("id",)) -> TableSchema:
    db, _, t = name.partition(".")
    return TableSchema(db, t, tuple(columns), key)


def test_the_union_of_the_shards_columns_with_the_source_columns_after_the_key():
    a, b = Member("s0", "shop", "orders_0"), Member("s1", "shop", "orders_1")
    merged = merged_schema([(a, table("shop.orders_0", ID, AMOUNT, NOTE)), (b, table("shop.orders_1", ID, AMOUNT))],
                           "an.orders")
    assert [c.name for c in merged.columns] == ["id", "amount", "note", *SOURCE_COLUMNS]
    assert merged.target_key == ("id", *SOURCE_COLUMNS)
    ddl = create_table_sql(member_view(merged, b, table("shop.orders_1", ID, AMOUNT)), "an", "orders")
    assert "ORDER BY (`id`, `_source`, `_source_database`, `_source_table`)" in ddl
    assert "`note` Nullable(String)" in ddl and "`amount` Decimal(12, 2)," in ddl


def test_a_view_reads_null_for_what_its_table_lacks_and_its_tags_for_the_source_columns():
    a, b = Member("s0", "shop", "orders_0"), Member("s1", "shop_y", "orders_9")
    merged = merged_schema([(a, table("shop.orders_0", ID, NOTE)), (b, table("shop_y.orders_9", ID))], "an.orders")
    view = member_view(merged, b, table("shop_y.orders_9", ID))
    mappings = {m.name: m for m in view.mappings()}
    assert mappings["note"].source.absent and mappings["note"].source_sql("`note`") == "CAST(NULL AS CHAR)"
    assert mappings["_source"].source_sql("`_source`") == f"_utf8mb4 X'{b's1'.hex()}'"
    assert mappings["_source_table"].source.tag == "orders_9" and not mappings["_source"].source.in_table
    assert view.primary_key == ("id",)  # MySQL is read by its own key; the target's adds the tags
    where, params = member_filter(view)
    assert where == "`_source` = {member_tag0:String} AND `_source_database` = {member_tag1:String} AND " \
                    "`_source_table` = {member_tag2:String}"
    assert params == {"member_tag0": "s1", "member_tag1": "shop_y", "member_tag2": "orders_9"}
    assert member_filter(table("shop.t", ID)) == ("1", {})


@pytest.mark.parametrize("other, words", [
    (col("amount", "decimal", "decimal(14,4)", precision=14, scale=4), ["'amount'", "s0:shop.orders_0",
                                                                          "s1:shop.orders_1"]),
    (col("amount", "varchar", "varchar(10)", charset="utf8mb4"), ["'amount'", "decimal(12,2)", "varchar(10)"]),
])
def test_one_name_of_two_types_is_refused_naming_both_shards(other, words):
    with pytest.raises(IncompatibleShards) as refused:
        merged_schema([(Member("s0", "shop", "orders_0"), table("shop.orders_0", ID, AMOUNT)),
                       (Member("s1", "shop", "orders_1"), table("shop.orders_1", ID, other))], "an.orders")
    assert all(w in str(refused.value) for w in words), refused.value


def test_different_keys_and_source_column_names_are_refused():
    with pytest.raises(IncompatibleShards, match="PRIMARY KEY"):
        merged_schema([(Member("s0", "d", "t"), table("d.t", ID, AMOUNT)),
                       (Member("s1", "d", "t"), table("d.t", ID, AMOUNT, key=("id", "amount")))], "an.t")
    with pytest.raises(IncompatibleShards, match="_source"):
        merged_schema([(Member("s0", "d", "t"), table("d.t", ID, col("_source", "varchar", "varchar(3)")))], "an.t")


@given(st.lists(st.sets(st.sampled_from(["a", "b", "c", "d"])), min_size=1, max_size=5))
def test_every_shard_column_is_in_the_union_and_nullable_where_a_shard_lacks_it(shards):
    members = [(Member(f"s{i}", "d", "t"), table("d.t", ID, *(col(n, nullable=False) for n in sorted(cols))))
               for i, cols in enumerate(shards)]
    merged = merged_schema(members, "an.t")
    names = {c.name: c for c in merged.columns}
    for name in set().union(*shards):
        assert names[name].nullable == (not all(name in cols for cols in shards))
    for member, schema in members:
        view = member_view(merged, member, schema)
        assert [c.name for c in view.columns] == [c.name for c in merged.columns]
        assert {c.name for c in view.columns if c.in_table} == {c.name for c in schema.columns}


def test_sources_travel_in_specs_without_their_passwords():
    spec = FullLoadSpec(target=ClickHouseEndpoint(), source_database="", source_table="", target_database="",
                        target_table="", sources=[Source("s0", MySQLEndpoint(password="pw-0")),
                                                 Source("s1", MySQLEndpoint(password="pw-1"))],
                        merge=Merge.of("an.orders"), tableset=TableSet(select={"databases": ["shop_*"]}))
    assert "pw-0" not in repr(public_dict(spec)) and "pw-1" not in repr(public_dict(spec))
    again = spec_from_dict(spec_to_dict(spec))
    assert again.sources == spec.sources and again.sources[1].endpoint.password == "pw-1"
    with pytest.raises(ValueError, match="named twice"):
        FullLoadSpec(target=spec.target, source_database="", source_table="", target_database="", target_table="",
                     sources=[Source("s0", MySQLEndpoint())] * 2, tableset=TableSet(select={"databases": ["x"]}))
    with pytest.raises(ValueError, match="selection"):
        FullLoadSpec(target=spec.target, source_database="", source_table="", target_database="", target_table="",
                     sources=[Source("s0", MySQLEndpoint())])
    assert env_name("eu-west.shard_3") == "MYSQL_URL_EU_WEST_SHARD_3"
    with pytest.raises(ValueError, match="source name"):
        Source("a b", MySQLEndpoint())


def test_a_group_parts_record_is_typed_and_travels_as_the_dict_it_always_was():
    """A CDC part's ``group`` is a :class:`GroupPart`, built by the group's spec and parsed back
    from a spec's JSON; its JSON is byte for byte the dict earlier releases wrote, so stored specs
    still read. The ledger's record of a group (``cdc_groups``) is a :class:`GroupRecord`."""
    import json

    from airflow_sync_provider.core.cdc.checkpoints import GroupRecord
    from airflow_sync_provider.core.jobspec import CdcApplySpec

    group = CdcApplySpec(target=ClickHouseEndpoint(), pipeline="orders",
                         sources=[Source("s0", MySQLEndpoint()), Source("s1", MySQLEndpoint())],
                         merge=Merge("an.orders", on_shard_removed="delete"),
                         tableset=TableSet(select={"databases": ["shop_*"]}))
    part = group.for_source(group.sources[1])
    assert part.group == GroupPart("orders", "s1", ("s0", "s1"), "an.orders", "delete") and part.group.merged
    old = {"pipeline": "orders", "source": "s1", "sources": ["s0", "s1"], "merge_into": "an.orders",
           "on_shard_removed": "delete"}  # the dict a part carried before it was typed
    assert json.dumps(spec_to_dict(part)["group"]) == json.dumps(old) and part.group.to_dict() == old
    again = spec_from_dict(json.loads(json.dumps(spec_to_dict(part))))
    assert again.group == part.group and GroupPart.of(old) == part.group
    one = Source("s0", MySQLEndpoint())
    side_by_side = CdcApplySpec(target=ClickHouseEndpoint(), pipeline="p", sources=[one],
                                tableset=TableSet(select={"databases": ["x"]})).for_source(one)
    assert not side_by_side.group.merged and side_by_side.group.on_shard_removed == "keep"
    assert GroupPart.of(None) is None and CdcApplySpec(target=ClickHouseEndpoint(), pipeline="p").group is None
    record = GroupRecord.of({"sources": ["s0", "s1"], "merge_into": "an.orders"})
    assert record == GroupRecord(("s0", "s1"), "an.orders") and record.merged
    assert record.to_dict() == {"sources": ["s0", "s1"], "merge_into": "an.orders"}

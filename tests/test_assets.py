"""Airflow assets the operators declare (parse time) and the OpenLineage facets they report."""

from __future__ import annotations

from airflow_sync_provider.assets import clickhouse_table
from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
from airflow_sync_provider.core.jobspec import FullLoadSpec, SnapshotDiffSpec
from airflow_sync_provider.core.source.group import one_server
from airflow_sync_provider.operators.cdc_bootstrap import CdcBootstrapOperator
from airflow_sync_provider.operators.full_load import FullLoadOperator
from airflow_sync_provider.operators.snapshot_diff import SnapshotDiffOperator

CONNS = {"mysql_conn_id": "src", "clickhouse_conn_id": "dst"}


def uris(assets):
    return [a.uri for a in assets]


def test_operators_declare_the_tables_they_read_and_write():
    load = FullLoadOperator(task_id="a", table="orders", source_database="shop", target_database="copy", **CONNS)
    assert uris(load.inlets) == ["mysql://src:3306/shop/orders"]
    assert load.outlets == [clickhouse_table("dst", "copy", "orders")]  # what a consumer schedules on
    templated = FullLoadOperator(task_id="b", table="orders", target_table="orders_{{ ds_nodash }}",
                                 target_database="copy", **CONNS)
    assert templated.inlets == [] and templated.outlets == []  # known at run time only: not an asset
    boot = CdcBootstrapOperator(task_id="c", pipeline="p", tables=["shop.orders", {
        "source_database": "shop", "source_table": "items", "target_database": "cdc", "target_table": "lines"}],
        **CONNS)
    assert uris(boot.outlets) == ["clickhouse://dst/shop/orders", "clickhouse://dst/cdc/lines"]
    diff = SnapshotDiffOperator(task_id="d", source_table="shop.orders", old_table="copy.orders", on_change="apply",
                                **CONNS)
    assert uris(diff.inlets) == ["mysql://src:3306/shop/orders", "clickhouse://dst/copy/orders"]
    assert uris(diff.outlets) == ["clickhouse://dst/copy/orders__changes", "clickhouse://dst/copy/orders"]
    warn = SnapshotDiffOperator(task_id="e", source_table="shop.orders", old_table="copy.orders", **CONNS)
    assert uris(warn.outlets) == ["clickhouse://dst/copy/orders__changes"]  # only the change set is written


def test_openlineage_facets_name_the_real_hosts_and_the_rows_written():
    source, target = MySQLEndpoint("db1", 3307, "u", "pw"), ClickHouseEndpoint("ch1", 8123, "u", "pw")
    load = FullLoadOperator(task_id="a", table="orders", **CONNS)
    spec = FullLoadSpec(sources=one_server(source), target=target, source_database="shop", source_table="orders",
                        target_database="copy", target_table="orders", load_key="k")
    load._lineage = load.lineage(spec, {"rows": 42})
    facets = load.get_openlineage_facets_on_complete(None)
    assert [(d.namespace, d.name) for d in facets.inputs] == [("mysql://db1:3307", "shop.orders")]
    [out] = facets.outputs
    assert ((out.namespace, out.name, out.facets["outputStatistics"].rowCount)
            == ("clickhouse://ch1:8123", "copy.orders", 42))
    diff = SnapshotDiffOperator(task_id="d", source_table="shop.orders", old_table="copy.orders", on_change="apply",
                                **CONNS)
    spec = SnapshotDiffSpec(target=target, old_table="copy.orders", sources=one_server(source), source_database="shop",
                            source_table="orders", on_change="apply")
    diff._lineage = diff.lineage(spec, {"counts": {"identical": 5, "changed": 2, "new": 1, "deleted": 1}})
    facets = diff.get_openlineage_facets_on_complete(None)
    assert [(d.name, d.facets["outputStatistics"].rowCount) for d in facets.outputs] == \
        [("copy.orders__changes", 4), ("copy.orders", 4)]

"""The operators' config objects (operators/configs.py): ``selection=``, ``layout=``, ``content=``,
``speed=`` beside the plain arguments. No database: the operators are built and their job specs
compared as the JSON a job reads."""

from __future__ import annotations

import json

import pytest

from airflow_sync_provider.core.clickhouse.layout import LayoutError
from airflow_sync_provider.core.content import ContentError
from airflow_sync_provider.core.specfile import spec_to_dict
from airflow_sync_provider.operators import Content, Layout, Selection, SpeedLimits, TableSelection
from airflow_sync_provider.operators.cdc_apply import CdcApplyOperator
from airflow_sync_provider.operators.cdc_bootstrap import CdcBootstrapOperator
from airflow_sync_provider.operators.full_load import FullLoadOperator
from airflow_sync_provider.operators.reconcile import ReconcileOperator
from airflow_sync_provider.operators.snapshot_diff import SnapshotDiffOperator

CONNS = {"mysql_conn_id": "cfg_src", "clickhouse_conn_id": "cfg_dst"}
SELECT = {"databases": ["shop"], "tables": ["order*"], "exclude_tables": ["orders_old"], "target_database": "copy"}
TABLES = ["shop.items", {"source_database": "shop", "source_table": "users", "target_table": "people",
                         "transform": {"phone": "mask(0,4)"}}]


@pytest.fixture(autouse=True)
def connections(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_CFG_SRC", json.dumps(
        {"conn_type": "mysql", "host": "db1", "port": 3306, "login": "u", "password": "secret", "schema": "shop"}))
    monkeypatch.setenv("AIRFLOW_CONN_CFG_DST", json.dumps(
        {"conn_type": "clickhouse", "host": "ch1", "port": 8123, "login": "u", "password": "secret"}))


def spec_json(operator) -> str:
    """The job spec the operator writes, as the job reads it."""
    return json.dumps(spec_to_dict(operator.build_spec({"run_id": "r1"})), sort_keys=True, default=str)


def same_spec(kind, plain: dict, objects: dict, **common) -> str:
    by_plain = spec_json(kind(task_id="t", **plain, **common, **CONNS))
    by_objects = spec_json(kind(task_id="t", **objects, **common, **CONNS))
    assert by_objects == by_plain
    return by_plain


# --- the same job spec either way ------------------------------------------------------------

def test_full_load_of_one_table_objects_and_plain_arguments_build_the_same_spec():
    spec = same_spec(
        FullLoadOperator,
        dict(table="orders", source_database="shop", target_database="copy", target_table="orders_copy",
             columns=["id", "email", "status"], exclude_columns=["note"],
             layout={"order_by": ["status"], "partition_by": "toYYYYMM(created_at)",
                     "settings": {"index_granularity": 4096}},
             transform={"email": "hash"}, row_filter="tenant_id = 7", on_delete="keep",
             channels=3, byte_speed=10_000_000, record_speed=50_000, channel_byte_speed=2_000_000,
             channel_record_speed=20_000),
        dict(selection=Selection(table="orders", source_database="shop", target_database="copy",
                                 target_table="orders_copy", columns=("id", "email", "status"),
                                 exclude_columns=("note",)),
             layout=Layout(order_by=("status",), partition_by="toYYYYMM(created_at)",
                           settings=(("index_granularity", "4096"),)),
             content=Content(transform=(("email", "hash"),), row_filter="tenant_id = 7", on_delete="keep"),
             speed=SpeedLimits(channels=3, byte=10_000_000, record=50_000, channel_byte=2_000_000,
                               channel_record=20_000)),
        hash_salt_env="SALT")
    data = json.loads(spec)  # the objects' values reached the spec
    assert data["tableset"]["layout"]["order_by"] == ["status"]
    assert data["tableset"]["content"] == {"transform": {"email": "hash"}, "row_filter": "tenant_id = 7",
                                           "on_delete": "keep"}
    assert (data["channels"], data["byte_speed"], data["channel_record_speed"]) == (3, 10_000_000, 20_000)
    assert (data["target_table"], data["columns"], data["exclude_columns"]) == ("orders_copy",
                                                                                  ["id", "email", "status"], ["note"])


def test_objects_written_as_a_dag_author_writes_them_and_their_dict_forms():
    """Lists and dicts inside the objects (not only the tuples they keep), Layout.of / Content.of,
    and each object's dict form give the spec the plain arguments give."""
    plain = dict(table="orders", layout={"order_by": ["status"], "engine": "ReplacingMergeTree"},
                 transform={"email": "hash", "phone": "mask(0,4)"}, row_filter="tenant_id = 7", channels=4,
                 channel_byte_speed=1 << 20)
    same_spec(FullLoadOperator, plain, dict(
        selection=Selection(table="orders"), layout=Layout(order_by=["status"]),
        content=Content(transform={"email": "hash", "phone": "mask(0,4)"}, row_filter="tenant_id = 7"),
        speed=SpeedLimits(channels=4, channel_byte=1 << 20)))
    same_spec(FullLoadOperator, plain, dict(
        selection={"table": "orders"}, layout=Layout.of({"order_by": "status"}),
        content=Content.of({"transform": {"phone": "mask(0,4)", "email": "hash"}, "row_filter": "tenant_id = 7"}),
        speed={"channels": 4, "channel_byte": 1 << 20}))


def test_full_load_of_many_tables_objects_and_plain_arguments_build_the_same_spec():
    same_spec(FullLoadOperator, dict(select=SELECT, tables=TABLES, layout={"order_by": ["status"]}),
              dict(selection=Selection(select=SELECT, tables=TABLES), layout=Layout(order_by=("status",))),
              parallel_tables=3)
    # a TableSelection stands for its dict form
    same_spec(FullLoadOperator, dict(select=TableSelection.of(SELECT).to_dict()),
              dict(selection=Selection(select=TableSelection.of(SELECT))))


def test_an_unset_channel_count_is_the_operators_default_or_derived_from_the_limits():
    same_spec(FullLoadOperator, dict(table="orders", channel_record_speed=100),
              dict(selection=Selection(table="orders"), speed=SpeedLimits(channel_record=100)))
    spec = json.loads(same_spec(FullLoadOperator, dict(table="orders", record_speed=1000, channel_record_speed=100),
                                dict(table="orders", speed=SpeedLimits(record=1000, channel_record=100))))
    assert spec["channels"] == 2  # as the plain form has it; the job derives 10 from the limits


def test_cdc_bootstrap_objects_and_plain_arguments_build_the_same_spec():
    same_spec(CdcBootstrapOperator,
              dict(tables=TABLES, select=SELECT, layout={"order_by": ["status"]}, transform={"email": "hash"},
                   on_delete="keep", channels=4, channel_byte_speed=1000, channel_record_speed=10),
              dict(selection=Selection(tables=TABLES, select=SELECT), layout=Layout(order_by=("status",)),
                   content=Content(transform={"email": "hash"}, on_delete="keep"),
                   speed=SpeedLimits(channels=4, channel_byte=1000, channel_record=10)),
              pipeline="p", hash_salt_env="SALT")


def test_cdc_apply_snapshot_diff_and_reconcile_take_the_same_objects():
    same_spec(CdcApplyOperator, dict(tables=TABLES, select=SELECT, layout={"order_by": ["status"]}),
              dict(selection=Selection(tables=TABLES, select=SELECT), layout=Layout(order_by=("status",))),
              pipeline="p", reshape=True)
    same_spec(SnapshotDiffOperator,
              dict(select=SELECT, tables=TABLES, layout={"partition_by": "toYYYYMM(d)"}, row_filter="tenant_id = 7",
                   channels=5),
              dict(selection=Selection(select=SELECT, tables=TABLES), layout=Layout(partition_by="toYYYYMM(d)"),
                   content=Content(row_filter="tenant_id = 7"), speed=SpeedLimits(channels=5)))
    same_spec(ReconcileOperator, dict(select=SELECT, tables=TABLES),
              dict(selection=Selection(select=SELECT, tables=TABLES)), load_key="k")


def test_history_is_a_content_setting_of_the_operators_that_make_copies():
    """``history=`` (plain) and ``Content(history=…)`` give one spec; a table's entry carries its own
    (the jobs refuse it until history tables are built: tests/test_history_table.py)."""
    spec = same_spec(FullLoadOperator, dict(table="orders", history={"retention_days": 30}),
                     dict(table="orders", content=Content(history={"retention_days": 30})))
    assert json.loads(spec)["tableset"]["content"] == {"history": {"retention_days": 30}}
    spec = same_spec(CdcBootstrapOperator, dict(tables=["shop.orders"], history=True),
                     dict(tables=["shop.orders"], content=Content.of({"history": True})), pipeline="p")
    assert json.loads(spec)["tableset"]["content"] == {"history": True}
    spec = same_spec(SnapshotDiffOperator, dict(select=SELECT, history=True, on_delete="keep"),
                     dict(select=SELECT, content=Content(on_delete="keep", history=True)))
    assert json.loads(spec)["tableset"]["content"] == {"on_delete": "keep", "history": True}
    entry = {"source_database": "shop", "source_table": "orders",
             "history": {"partition_by": "toYYYYMMDD(_commit_time)"}}
    tables = json.loads(spec_json(FullLoadOperator(task_id="t", tables=[entry, "shop.items"], **CONNS)))
    assert [t.get("content") for t in tables["tableset"]["tables"]] == [
        {"history": {"partition_by": "toYYYYMMDD(_commit_time)"}}, None]
    assert FullLoadOperator(task_id="t", table="orders", history=False, content=Content(), **CONNS).history is None
    with pytest.raises(ValueError, match=r"task t: history=True and content= disagree"):
        FullLoadOperator(task_id="t", table="orders", history=True, content=Content(history={"retention_days": 3}),
                         **CONNS)
    with pytest.raises(ContentError, match=r"history: unknown option\(s\) \['days'\]"):
        FullLoadOperator(task_id="t", table="orders", history={"days": 3}, **CONNS).build_spec({"run_id": "r1"})


# --- templates ---------------------------------------------------------------------------------

def test_an_objects_values_are_rendered_as_the_plain_arguments_are():
    op = FullLoadOperator(task_id="t", selection=Selection(table="orders", target_table="orders_{{ ds_nodash }}"),
                          content=Content(row_filter="day = '{{ ds }}'"), **CONNS)
    assert {"table", "target_table", "row_filter"} <= set(op.template_fields)
    op.render_template_fields({"ds": "2024-05-01", "ds_nodash": "20240501"})
    assert (op.target_table, op.row_filter) == ("orders_20240501", "day = '2024-05-01'")
    plain = FullLoadOperator(task_id="t", table="orders", target_table="orders_{{ ds_nodash }}", **CONNS)
    plain.render_template_fields({"ds_nodash": "20240501"})
    assert plain.target_table == "orders_20240501"


# --- one setting given once ----------------------------------------------------------------------

@pytest.mark.parametrize(("objects", "plain", "names"), [
    (dict(selection=Selection(table="orders")), dict(table="customers"), ("selection=", "table=")),
    (dict(selection=Selection(table="orders")), dict(table="orders", target_table="x"),
     ("selection=", "target_table=")),
    (dict(content=Content(row_filter="a = 1")), dict(table="orders", row_filter="a = 2"), ("content=", "row_filter=")),
    (dict(content=Content(row_filter="a = 1")), dict(table="orders", transform={"e": "hash"}),
     ("content=", "transform=")),
    (dict(speed=SpeedLimits(channels=4)), dict(table="orders", channels=8), ("speed=", "channels=")),
    (dict(speed=SpeedLimits(record=10, channel_record=1)), dict(table="orders", channels=8), ("speed=", "channels=")),
    (dict(speed=SpeedLimits(channels=4)), dict(table="orders", byte_speed=100), ("speed=", "byte_speed=")),
])
def test_an_object_and_a_plain_argument_that_disagree_are_refused_by_name(objects, plain, names):
    with pytest.raises(ValueError) as refused:
        FullLoadOperator(task_id="load_orders", **objects, **plain, **CONNS)
    message = str(refused.value)
    assert message.startswith("task load_orders: ") and all(name in message for name in names), message


def test_an_object_and_a_plain_argument_that_agree_or_a_default_are_accepted():
    op = FullLoadOperator(task_id="t", selection=Selection(table="orders"), table="orders",
                          speed=SpeedLimits(channels=4), channels=4, content=Content(on_delete="delete"),
                          on_delete="delete", **CONNS)
    assert (op.table, op.channels, op.on_delete) == ("orders", 4, None)
    op = FullLoadOperator(task_id="t", selection=Selection(table="orders"), speed=SpeedLimits(channels=6),
                          channels=2, **CONNS)  # channels=2 is the default: the object's value wins
    assert op.channels == 6


def test_a_setting_the_operator_does_not_take_is_refused_by_name():
    with pytest.raises(ValueError, match=r"task boot: CdcBootstrapOperator takes no byte_speed"):
        CdcBootstrapOperator(task_id="boot", pipeline="p", tables=["shop.a"], speed=SpeedLimits(byte=1000), **CONNS)
    with pytest.raises(ValueError, match=r"task apply: CdcApplyOperator takes no table "):
        CdcApplyOperator(task_id="apply", pipeline="p", selection=Selection(table="orders"), **CONNS)
    with pytest.raises(ValueError, match=r"task diff: SnapshotDiffOperator takes no channel_record_speed"):
        SnapshotDiffOperator(task_id="diff", select=SELECT, speed=SpeedLimits(channel_record=5), **CONNS)
    with pytest.raises(ValueError, match=r"task check: ReconcileOperator takes no columns"):
        ReconcileOperator(task_id="check", load_key="k", selection=Selection(select=SELECT, columns=["id"]), **CONNS)


def test_objects_of_the_wrong_kind_or_with_unknown_fields_are_refused():
    with pytest.raises(ValueError, match=r"task t: speed= takes a SpeedLimits"):
        FullLoadOperator(task_id="t", table="orders", speed=4, **CONNS)
    with pytest.raises(ValueError, match=r"task t: speed=\{'channel': 4\}: .*channel"):
        FullLoadOperator(task_id="t", table="orders", speed={"channel": 4}, **CONNS)
    with pytest.raises(ValueError, match=r"task t: content= takes a Content"):
        FullLoadOperator(task_id="t", table="orders", content=Layout(), **CONNS)
    with pytest.raises(ValueError, match=r"task t: layout= takes a Layout"):
        FullLoadOperator(task_id="t", table="orders", layout="ORDER BY status", **CONNS)


# --- bad values: refused as the plain arguments are ---------------------------------------------------

def test_one_table_or_many_is_checked_either_way():
    with pytest.raises(ValueError, match="selection: give table= .* or select= / tables= .*, not both"):
        Selection(table="orders", select=SELECT)
    for arguments in (dict(selection=Selection()), dict()):
        with pytest.raises(ValueError, match=r"task t: give table= \(one table\) or select= / tables= \(many\)"):
            FullLoadOperator(task_id="t", **arguments, **CONNS)
    with pytest.raises(ValueError, match=r"task t: table='orders' and selection= disagree \(its table: None\)"):
        FullLoadOperator(task_id="t", selection=Selection(select=SELECT), table="orders", **CONNS)
    with pytest.raises(ValueError, match="selection columns: give a list"):
        Selection(table="orders", columns="id")


@pytest.mark.parametrize(("plain", "objects", "error", "match"), [
    (dict(table="orders", on_delete="forget"), dict(table="orders", content=Content(on_delete="forget")),
     ContentError, "on_delete='forget'"),
    (dict(table="orders", transform={"email": "rot13"}),
     dict(table="orders", content=Content(transform={"email": "rot13"})), ContentError, "rot13"),
    (dict(table="orders", layout={"order_by": ["status"], "engine": "Log"}),
     dict(table="orders", layout=Layout(order_by=("status",), engine="Log")), LayoutError, "engine 'Log'"),
    (dict(select={"databases": ["re:("]}), dict(selection=Selection(select={"databases": ["re:("]})), ValueError,
     "not a regular expression"),
])
def test_bad_values_in_an_object_are_refused_as_the_plain_ones_are(plain, objects, error, match):
    """Both when the spec is built (a template may hold the value until the task runs), with the
    same message."""
    messages = []
    for arguments in (plain, objects):
        op = FullLoadOperator(task_id="t", **arguments, **CONNS)
        with pytest.raises(error, match=match) as refused:
            op.build_spec({"run_id": "r1"})
        messages.append(str(refused.value))
    assert messages[0] == messages[1]


def test_the_config_types_import_in_one_line_and_are_the_cores():
    from airflow_sync_provider.core.clickhouse.layout import Layout as CoreLayout
    from airflow_sync_provider.core.content.shaping import Content as CoreContent
    from airflow_sync_provider.core.selection import Selection as CoreSelection
    from airflow_sync_provider.core.source.planning import SpeedLimits as CoreSpeedLimits
    assert (Layout, Content, Selection, SpeedLimits) == (CoreLayout, CoreContent, CoreSelection, CoreSpeedLimits)


def test_a_subclass_taking_kwargs_keeps_the_operators_defaults():
    class MyLoad(FullLoadOperator):
        def __init__(self, **kwargs):
            super().__init__(mysql_conn_id="cfg_src", clickhouse_conn_id="cfg_dst", **kwargs)

    op = MyLoad(task_id="t", selection=Selection(table="orders"), speed=SpeedLimits(channels=5))
    assert (op.table, op.channels) == ("orders", 5)
    with pytest.raises(ValueError, match="task t: channels=3 and speed= disagree"):
        MyLoad(task_id="t", table="orders", speed=SpeedLimits(channels=5), channels=3)

"""A copy's history, the groundwork of slice 2 (issue 61, docs/design/history-tables.md): the history
found from the copy itself (its comment), and the writer primitives, ``HistoryTable.arrow`` (from
copy-shaped Arrow, as core/cdc/binlog/routes.TableRoute.arrow makes it) and ``insert_select`` (from
the copy or a table of its columns), on the real ClickHouse endpoint. Every expected row is the
test's own record of what was written, not the package's."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest

from airflow_sync_provider.core.cdc.binlog.routes import KEPT_FROM, MOVED, TableRoute, moved_rows
from airflow_sync_provider.core.clickhouse.ddl import create_table_sql
from airflow_sync_provider.core.clickhouse.history import HistoryTable, Stamp, conflicts_sql
from airflow_sync_provider.core.clickhouse.layout import Layout
from airflow_sync_provider.core.content.shaping import Content, HistorySettings
from airflow_sync_provider.core.source.schema import TableSchema
from airflow_sync_provider.core.typemap import MySQLColumn

DB = "hist_slice2"
T0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=timezone.utc)
COLUMNS = (MySQLColumn("id", "int", "int(11)", False),
           MySQLColumn("status", "varchar", "varchar(16)", True, char_length=16, charset="utf8mb4",
                       collation="utf8mb4_general_ci"),
           MySQLColumn("note", "text", "text", True, char_length=65535, charset="utf8mb4",
                       collation="utf8mb4_general_ci"))


def schema(**content) -> TableSchema:
    return TableSchema("shop", "orders", COLUMNS, ("id",), content=Content.of(content))


def copy(ch, table: str, shaped: TableSchema, **kwargs) -> None:
    """A fresh copy ``DB.table`` made as the jobs make it (its comment keeps its content), no history yet."""
    ch.command(f"CREATE DATABASE IF NOT EXISTS {DB}")
    for name in (table + "_asof", table + "_asof_time", table + "_scd2", table + "_history", table):
        ch.command(f"DROP TABLE IF EXISTS {DB}.`{name}`")
    ch.command(create_table_sql(shaped, DB, table, **kwargs))


def rows(ch, sql: str) -> list:
    return ch.query(sql).result_rows


def count(ch, sql: str) -> int:
    return rows(ch, sql)[0][0]


# --- found from the copy -------------------------------------------------------------------------

def test_a_copys_history_is_found_from_its_comment_and_none_without_one(ch):
    kept = schema(on_delete="keep", history={"retention_days": 30})
    layout = Layout.of({"settings": {"index_granularity": 1024}})
    copy(ch, "found", kept, layout=layout, weight=True)
    plain = schema(on_delete="keep")  # the job's schema without history: the copy's comment decides
    history = HistoryTable.of(ch, plain, DB, "found")
    assert history is not None and history.table == "found" and history.weight
    assert history.settings == HistorySettings(retention_days=30) and history.schema.content == kept.content
    assert history.layout == layout
    history.create(ch)
    # the history's columns begin with the copy's written ones (the weight too), in their types
    def described(table):
        return rows(ch, f"SELECT name, type FROM system.columns WHERE database = '{DB}' AND table = '{table}' "
                        "AND (default_kind != 'MATERIALIZED' OR name = '_split_weight') ORDER BY position")
    written = [c for c in described("found") if c[0] not in ("_version", "_deleted", "_deleted_at_source")]
    assert described("found_history")[:len(written)] == written and ("_split_weight", "String") in written
    # no history kept: None, for a copy without content, one with other content, and no copy at all
    copy(ch, "mirror", schema())
    copy(ch, "shaped", schema(on_delete="keep", row_filter="id > 0"))
    assert HistoryTable.of(ch, kept, DB, "mirror") is None
    assert HistoryTable.of(ch, kept, DB, "shaped") is None
    assert HistoryTable.of(ch, kept, DB, "absent") is None


# --- arrow: from the rows CDC makes --------------------------------------------------------------

def changes():
    """A batch as the reader hands it to a route (rows, versions, deleted flags) with the test's
    own record of what each change is: (id, status, note, version, flag, event, history deleted)."""
    kept_at = int((T0 + timedelta(seconds=9)).timestamp())  # a kept delete's flag: its commit time
    assert kept_at >= KEPT_FROM
    log = [(1, "new", None, 100, False, "insert", 0),
           (2, "new", "gift", 110, False, "insert", 0),
           (1, "new", None, 200, MOVED, "update", None),  # the moved row's old place: not an event
           (1, "paid", None, 200, False, "update", 0),
           (2, "new", "gift", 300, kept_at, "delete", 1),  # kept: live in the copy, an absence in the history
           (3, "x", "a\\'b`", 310, False, "insert", 0),
           (3, "x", "a\\'b`", 320, True, "update", 1)]  # left the row filter inside an update: an absence
    return log


def test_arrow_takes_a_routes_rows_a_kept_delete_is_an_absence_and_a_move_no_event(ch):
    shaped = schema(on_delete="keep", history=True)
    copy(ch, "routed", shaped)
    history = HistoryTable.of(ch, shaped, DB, "routed")
    history.create(ch)
    route = TableRoute(shaped, DB, "routed")
    route.keyed(["id"], ["status"])  # a layout ordering by status: a status change moves the row
    log = changes()
    flags = [c[4] for c in log]
    shaped_rows = route.arrow([c[:3] for c in log], [c[3] for c in log], flags, "test")
    # the copy's rows: the kept delete is live, marked with its time; the moved tombstone a tombstone
    assert shaped_rows["_deleted"].to_pylist() == [0, 0, 1, 0, 0, 0, 1]
    assert [bool(v) for v in shaped_rows["_deleted_at_source"].to_pylist()] == [False] * 4 + [True, False, False]
    ch.insert_arrow(f"{DB}.routed", shaped_rows)
    assert count(ch, f"SELECT count() FROM {DB}.routed FINAL WHERE id = 2 AND _deleted = 0") == 1
    assert moved_rows(flags) == [False, False, True, False, False, False, False]
    stamp = Stamp(event=[c[5] for c in log], via="binlog",
                  commit_time=[T0 + timedelta(seconds=c[3] // 10) for c in log], server="db-1",
                  gtid_domain="0", gtid_seq=[c[3] // 10 for c in log])
    made = history.arrow(shaped_rows, stamp, moved=moved_rows(flags))
    assert "_deleted_at_source" not in made.column_names and made.num_rows == 6
    history.insert(ch, made)
    history.insert(ch, history.arrow(shaped_rows, stamp, moved=moved_rows(flags)))  # a replay: the same rows again
    expected = [(c[0], c[1], c[2], c[3], c[6], c[5]) for c in log if c[6] is not None]
    got = f"SELECT id, status, note, _version, _deleted, _event FROM {DB}.routed_history FINAL ORDER BY _version, id"
    assert rows(ch, got) == expected
    ch.command(f"OPTIMIZE TABLE {DB}.routed_history FINAL")
    assert count(ch, f"SELECT count() FROM {DB}.routed_history") == len(expected)  # collapsed, not doubled
    assert rows(ch, conflicts_sql(DB, "routed", ("id",))) == []
    assert rows(ch, f"SELECT _commit_time, _gtid_seq, _server FROM {DB}.routed_history WHERE _version = 300") == [
        (T0.replace(tzinfo=None) + timedelta(seconds=30), 30, "db-1")]
    # as of a version, the history is the copy as it was, a kept delete absent
    assert rows(ch, f"SELECT id, status FROM {DB}.routed_asof(at_version=300) ORDER BY id") == [(1, "paid")]
    # another row at a version already written (another commit time): not a replay, kept and counted
    other = dataclasses.replace(stamp, commit_time=[T0] * len(log))
    history.insert(ch, history.arrow(shaped_rows, other, moved=moved_rows(flags)).slice(0, 1))
    ch.command(f"OPTIMIZE TABLE {DB}.routed_history FINAL")
    assert rows(ch, conflicts_sql(DB, "routed", ("id",))) == [(1, 100, 2)]


def test_arrow_refuses_what_it_cannot_stamp_naming_the_table():
    history = HistoryTable(schema(history=True), DB, "refused")
    table = pa.table({"id": [1], "status": ["a"], "note": [None], "_version": pa.array([1], pa.uint64()),
                      "_deleted": pa.array([0], pa.uint8())})
    with pytest.raises(ValueError, match=r"history event \['inserted'\]"):
        Stamp(event="inserted", via="binlog", commit_time=T0)
    with pytest.raises(ValueError, match=r"history via \['spark'\]"):
        Stamp(event="insert", via="spark", commit_time=T0)
    with pytest.raises(ValueError, match="aware datetime"):
        history.arrow(table, Stamp(event="insert", via="binlog", commit_time=T0.replace(tzinfo=None)))
    with pytest.raises(ValueError, match=r"hist_slice2.refused: the rows lack the copy's column\(s\) \['note'\]"):
        history.arrow(table.drop(["note"]), Stamp(event="insert", via="binlog", commit_time=T0))
    with pytest.raises(ValueError, match="2 values for 1 rows"):
        history.arrow(table, Stamp(event=["insert", "update"], via="binlog", commit_time=T0))
    with pytest.raises(ValueError, match="one stamp for the write"):
        history.insert_select_sql("SELECT 1", Stamp(event=["insert"], via="binlog", commit_time=T0))


def test_arrow_stamps_per_row_or_once_and_takes_arrow_times_of_any_unit():
    history = HistoryTable(schema(history=True), DB, "stamped")
    table = pa.table({"id": pa.array([1, 2], pa.int32()), "status": ["a", None], "note": [None, "n"],
                      "_version": pa.array([7, 9], pa.uint64()), "_deleted": pa.array([0, 1], pa.uint8())})
    seconds = pa.array([T0, T0 + timedelta(seconds=1)], pa.timestamp("s", tz="UTC"))
    made = history.arrow(table, Stamp(event=["insert", "delete"], via="xa", commit_time=seconds, server="s",
                                      gtid_domain="0", gtid_seq=pa.array([3, 4], pa.int64())))
    assert made.column_names == ["id", "status", "note", "_version", "_deleted", "_event", "_via", "_commit_time",
                                 "_server", "_source", "_gtid_domain", "_gtid_seq"]
    assert made["_commit_time"].to_pylist() == [T0, T0 + timedelta(seconds=1)]
    assert made["_event"].to_pylist() == ["insert", "delete"] and made["_via"].to_pylist() == ["xa", "xa"]
    assert made["_gtid_seq"].to_pylist() == [3, 4] and made["_deleted"].to_pylist() == [0, 1]
    micros = int(T0.timestamp()) * 1_000_000 + 5
    once = history.arrow(table, Stamp(event="repair", via="verify", commit_time=micros, version=11, deleted=1))
    assert once["_commit_time"].to_pylist() == [T0 + timedelta(microseconds=5)] * 2
    assert once["_version"].to_pylist() == [11, 11] and once["_deleted"].to_pylist() == [1, 1]


# --- insert_select: from the copy or a table of its columns --------------------------------------

def test_insert_select_from_the_copy_replays_collapse_and_match_the_arrow_writers_rows(ch):
    shaped = schema(on_delete="keep", history=True)
    copy(ch, "selected", shaped, weight=True)
    history = HistoryTable.of(ch, shaped, DB, "selected")
    history.create(ch)
    log = [c for c in changes() if c[4] is not MOVED]
    route = TableRoute(shaped, DB, "selected")
    copied = route.arrow([c[:3] for c in log], [c[3] for c in log], [c[4] for c in log], "test")
    copied = copied.append_column("_split_weight", pa.array([f"w{c[0]}" for c in log]))
    ch.insert_arrow(f"{DB}.selected", copied, settings={"insert_allow_materialized_columns": 1})
    server = "it's `a\\b` {x:String}"  # bound, not formatted in
    stamp = Stamp(event="snapshot", via="enable", commit_time=T0, server=server, gtid_domain="0-1", gtid_seq=7)
    select = history.copy_rows_sql("_version >= {low:UInt64}")
    history.insert_select(ch, select, stamp, {"low": 110})
    history.insert_select(ch, select, stamp, {"low": 110})  # a replay after a crash
    # the copy's newest row of each key at or above 110, at its own version; the kept delete an absence
    # (FINAL hides the copy's tombstones: id 3's; id 2's delete is kept, live in the copy)
    expected = [(2, 300, 1, "w2"), (1, 200, 0, "w1")]
    got = (f"SELECT id, _version, _deleted, _split_weight FROM {DB}.selected_history FINAL "
           "ORDER BY _deleted DESC, id")
    assert rows(ch, got) == expected
    assert rows(ch, f"SELECT DISTINCT _server, _event, _via, _commit_time, _gtid_domain, _gtid_seq FROM "
                    f"{DB}.selected_history") == [(server, "snapshot", "enable", T0.replace(tzinfo=None), "0-1", 7)]
    ch.command(f"OPTIMIZE TABLE {DB}.selected_history FINAL")
    assert count(ch, f"SELECT count() FROM {DB}.selected_history") == 2
    # the Arrow writer's rows for the same write are the same rows: they collapse into them
    final = ch.query_arrow(select, parameters={"low": 110})
    history.insert(ch, history.arrow(final, stamp))
    ch.command(f"OPTIMIZE TABLE {DB}.selected_history FINAL")
    assert count(ch, f"SELECT count() FROM {DB}.selected_history") == 2
    # a TRUNCATE's tombstones: every live row at the DDL's version, an absence
    truncate = Stamp(event="truncate", via="ddl", commit_time=T0 + timedelta(minutes=1), version=900, deleted=1)
    history.insert_select(ch, history.copy_rows_sql("toUInt32(_deleted_at_source) = 0"), truncate)
    assert rows(ch, f"SELECT id, _deleted, _event FROM {DB}.selected_history FINAL WHERE _version = 900 "
                    "ORDER BY id") == [(1, 1, "truncate")]
    assert rows(ch, f"SELECT count() FROM {DB}.selected_asof(at_version=900)") == [(0,)]
    assert rows(ch, f"SELECT id FROM {DB}.selected_asof(at_version=899)") == [(1,)]
    with pytest.raises(ValueError, match=r"\['history_server'\] are the stamps' own"):
        history.insert_select(ch, select, stamp, {"low": 1, "history_server": "x"})

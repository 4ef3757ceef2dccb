"""A copy's history table (issue 61, slice 1: docs/design/history-tables.md): the ``history`` content
option (parsed, kept in the comment, carried, accepted by the command line, refused by every job
until writers write it) and core/clickhouse/history.py's table and views on the real ClickHouse
endpoint. Rows are written here by hand, as the test's own record of each version; every expected
state is computed from that record in plain Python, not by the package."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest
from clickhouse_connect.driver.exceptions import DatabaseError

from airflow_sync_provider.core.cdc.tables import PipelineTable
from airflow_sync_provider.core.clickhouse.ddl import create_table_sql
from airflow_sync_provider.core.clickhouse.history import HistoryTable, conflicts_sql
from airflow_sync_provider.core.clickhouse.layout import Layout
from airflow_sync_provider.core.content import ContentError
from airflow_sync_provider.core.content.shaping import (
    Content,
    HistorySettings,
    check_same,
    content_comment,
    describe_content,
    stored,
)
from airflow_sync_provider.core.jobspec import FullLoadSpec, copied_schema
from airflow_sync_provider.core.selection import TableSet
from airflow_sync_provider.core.source.group import SOURCE_COLUMNS
from airflow_sync_provider.core.source.schema import TableSchema
from airflow_sync_provider.core.specfile import spec_from_dict, spec_to_dict
from airflow_sync_provider.core.typemap import MySQLColumn

DB = "hist_slice1"
T0 = datetime(2025, 1, 1, 10, 0, 0, tzinfo=timezone.utc)
EPOCH = 1 << 56  # a version after a failover (core/positions.py: the epoch is the top byte)

COLUMNS = (MySQLColumn("id", "int", "int(11)", False),
           MySQLColumn("status", "varchar", "varchar(16)", True, char_length=16, charset="utf8mb4",
                       collation="utf8mb4_general_ci"),
           MySQLColumn("amount", "decimal", "decimal(10,2)", True, precision=10, scale=2),
           MySQLColumn("note", "text", "text", True, char_length=65535, charset="utf8mb4",
                       collation="utf8mb4_general_ci"))
VALUES = ("status", "amount", "note")


def schema(history=True, columns=COLUMNS, key=("id",), **content) -> TableSchema:
    """The table as copied, asking for a history (built directly: TableSchema.shaped refuses it)."""
    return TableSchema("shop", "orders", columns, key, content=Content.of({**content, "history": history}))


def fresh(ch, table: str, **kwargs) -> HistoryTable:
    """A new history of ``DB.table`` with its views (any earlier one dropped)."""
    ch.command(f"CREATE DATABASE IF NOT EXISTS {DB}")
    history = HistoryTable(kwargs.pop("schema", None) or schema(), DB, table, **kwargs)
    for name in (*history.view_names(), history.name, table):
        ch.command(f"DROP TABLE IF EXISTS {DB}.`{name}`")
    history.create(ch)
    return history


def row(id, version, seconds, status=None, amount=None, note=None, deleted=0, event="update", **stamps) -> dict:
    return {"id": id, "status": status, "amount": None if amount is None else Decimal(amount), "note": note,
            "_version": version, "_deleted": deleted, "_event": "delete" if deleted else event,
            "_via": stamps.get("via", "binlog"), "_commit_time": T0 + timedelta(seconds=seconds),
            "_server": stamps.get("server", "s1"), "_source": "", "_gtid_domain": "0",
            "_gtid_seq": stamps.get("seq", version)}


def write(ch, history: HistoryTable, rows: list[dict]) -> None:
    """One INSERT (one part) of ``rows``; ``_row_hash`` left to its DEFAULT."""
    names = list(rows[0])
    ch.insert(history.name, [[r[n] for n in names] for r in rows], column_names=names, database=DB)


def count(ch, sql: str) -> int:
    return ch.query(sql).result_rows[0][0]


def state(rows: list[dict], keep) -> dict:
    """The test's own as-of: each key's newest row among those ``keep`` takes, unless it is a delete."""
    latest: dict = {}
    for r in sorted((r for r in rows if keep(r)), key=lambda r: r["_version"]):
        latest[r["id"]] = r
    return {k: (r["status"], r["amount"], r["note"]) for k, r in latest.items() if not r["_deleted"]}


def text(at: datetime) -> str:
    """A UTC time as a DateTime64(6, 'UTC') parameter's text."""
    return at.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")


def view(ch, sql: str, **parameters) -> dict:
    return {r[0]: tuple(r[1:4]) for r in ch.query(sql, parameters=parameters).result_rows}


# --- the content option (no database) ------------------------------------------------------------

def test_history_is_a_content_option_kept_in_the_comment_and_carried_by_the_tableset():
    assert Content.of({"history": True}).history == HistorySettings()
    custom = Content.of({"history": {"partition_by": "toYYYYMMDD(_commit_time)", "retention_days": 30}})
    assert custom.history == HistorySettings("toYYYYMMDD(_commit_time)", 30)
    assert Content.of({"history": False}) == Content.of({}) and not Content.of({"history": None})
    assert Content.of({"history": True}).to_dict() == {"history": True}
    assert Content.of(custom.to_dict()) == custom and custom.to_dict()["history"]["retention_days"] == 30
    # kept in the copy's comment: a job asking for another history (or none) is refused as for any setting
    comment = content_comment(custom)
    assert stored(comment)[0] == custom
    check_same("copy.orders", custom, b"", comment)
    with pytest.raises(ContentError, match=r"^table copy\.orders: its copy keeps a history \(copy\.orders_history\), "
                                           "which this job.s content settings leave out"):
        check_same("copy.orders", Content(), b"", comment)  # the job writes none: it would change the copy behind it
    with pytest.raises(ContentError, match="holds .*history.* but this job asks for .*row_filter"):
        check_same("copy.orders", Content(row_filter="id > 1"), b"", comment)  # another content: as for any setting
    assert "every version kept in <table>_history (30 days)" in describe_content(custom)
    # a table's entry over the job's; carried through a spec as the job reads it
    tableset = TableSet(content={"on_delete": "keep"},
                        tables=[{"source_database": "shop", "source_table": "orders", "history": True},
                                "shop.items"])
    orders, items = tableset.configured().tables
    assert tableset.content_of(orders) == Content(on_delete="keep", history=HistorySettings())
    assert tableset.content_of(items).history is None
    job_wide = TableSet(content={"history": {"retention_days": 7}}, tables=["shop.items"])
    assert job_wide.content_of(job_wide.configured().tables[0]).history == HistorySettings(retention_days=7)
    assert TableSet(select={"databases": ["shop"], "history": True}).has_content
    from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
    from airflow_sync_provider.core.source.group import one_server
    spec = FullLoadSpec(sources=one_server(MySQLEndpoint("h", 3306, "u", "p", "shop")),
                        target=ClickHouseEndpoint("c", 8123, "u", "p"), source_database="shop",
                        source_table="orders", target_database="copy", target_table="orders",
                        tableset=TableSet(content={"history": {"retention_days": 7}}))
    again = spec_from_dict(json.loads(json.dumps(spec_to_dict(spec))))
    assert again.tableset.content_of().history == HistorySettings(retention_days=7)
    followed = PipelineTable("shop", "orders", "copy", "orders", content=custom)  # a pipeline's table, in the ledger
    assert PipelineTable.from_dict(json.loads(json.dumps(followed.to_dict()))).content == custom


@pytest.mark.parametrize(("value", "match"), [
    ({"history": "yes"}, r"history: give True or a dict"),
    ({"history": {"retention": 3}}, r"history: unknown option\(s\) \['retention'\]"),
    ({"history": {"retention_days": -1}}, r"retention_days=-1"),
    ({"history": {"retention_days": "30"}}, r"retention_days='30'"),
    ({"history": {"partition_by": 7}}, r"history partition_by: give a ClickHouse expression"),
])
def test_a_bad_history_option_is_refused_by_name(value, match):
    with pytest.raises(ContentError, match=match):
        Content.of(value)


REFUSED = (r"history tables are written so far by the CDC stream, full loads of one server's table, reconcile's "
           r"re-import and the snapshot diff's apply \(issue 61\)")


def test_every_job_refuses_a_table_asking_for_a_history_naming_it():
    """TableSchema.shaped — the one place every job reads the table it copies, compares or
    follows through — refuses it, so no job makes an empty history."""
    plain = TableSchema("shop", "orders", COLUMNS, ("id",))
    for content in ({"history": True}, {"history": {"retention_days": 3}, "row_filter": "id > 1"}):
        with pytest.raises(ContentError, match=r"^table shop\.orders: " + REFUSED):
            plain.shaped(content)
    assert plain.shaped({"row_filter": "id > 1"}).content.row_filter == "id > 1"  # the others still shape
    for writer in ("cdc", "load", "reconcile", "diff"):  # the paths that write one (slices 2 and 4)
        assert plain.shaped({"history": True}, writer=writer).content.history
    merged = TableSet(content={"history": True}, tables=["shop.orders"])
    from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
    from airflow_sync_provider.core.source.group import Source
    with pytest.raises(ContentError, match="the merged copy all.orders: .*a history are not supported"):
        FullLoadSpec(sources=[Source("a", MySQLEndpoint("h", 3306, "u", "p")),
                              Source("b", MySQLEndpoint("i", 3306, "u", "p"))],
                     target=ClickHouseEndpoint("c", 8123, "u", "p"), merge={"into": "all.orders"}, tableset=merged,
                     load_key="k", source_database="", source_table="", target_database="", target_table="")


def test_a_job_reading_its_table_refuses_the_history_before_writing(mysql_conn):
    """The jobs' own reading of a table (core/jobspec.copied_schema: full loads, bootstraps,
    reconciliation, the pipeline's tables) stops at the history, on a real table."""
    with mysql_conn.cursor() as cur:
        cur.execute("CREATE DATABASE IF NOT EXISTS hist_src")
        cur.execute("DROP TABLE IF EXISTS hist_src.orders")
        cur.execute("CREATE TABLE hist_src.orders (id INT PRIMARY KEY, status VARCHAR(16))")
    table = {"source_database": "hist_src", "source_table": "orders"}
    assert [c.name for c in copied_schema(mysql_conn, {**table, "content": {}}).columns] == ["id", "status"]
    with pytest.raises(ContentError, match=r"^table hist_src\.orders: " + REFUSED):
        copied_schema(mysql_conn, {**table, "content": {"history": True}})
    with pytest.raises(ContentError, match=REFUSED):
        copied_schema(mysql_conn, {**table, "tableset": {"content": {"history": {"retention_days": 1}}}})


@pytest.mark.slow
def test_a_load_asked_for_a_history_on_the_command_line_writes_it(mysql_conn, mysql_url, clickhouse_url, ch):
    """End to end (airflow-sync load --history, this checkout's job process): the copy and its
    history, a snapshot event of each row (slice 4; the paths still refused: test above)."""
    with mysql_conn.cursor() as cur:
        cur.execute("CREATE DATABASE IF NOT EXISTS hist_src")
        cur.execute("DROP TABLE IF EXISTS hist_src.loaded")
        cur.execute("CREATE TABLE hist_src.loaded (id INT PRIMARY KEY, status VARCHAR(16))")
        cur.execute("INSERT INTO hist_src.loaded VALUES (1, 'new'), (2, 'paid')")
    ch.command("DROP DATABASE IF EXISTS hist_copy")
    root = str(Path(__file__).resolve().parents[1])  # this checkout's package, whichever one is installed
    env = dict(os.environ, MYSQL_URL=mysql_url, CLICKHOUSE_URL=clickhouse_url,
               PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    load = subprocess.run([sys.executable, "-m", "airflow_sync_provider.cli", "load", "--database", "hist_src",
                           "--table", "loaded", "--target-database", "hist_copy", "--load-key",
                           f"hist-cli-{time.time_ns()}", "--history"], env=env, cwd=root, capture_output=True,
                          text=True, timeout=600)
    assert load.returncode == 0, (load.stdout + load.stderr)[-3000:]
    assert ch.query("SELECT id, status, toString(_event), toString(_via) FROM hist_copy.loaded_history FINAL "
                    "ORDER BY id").result_rows == [(1, "new", "snapshot", "load"), (2, "paid", "snapshot", "load")]


def test_the_command_line_takes_history_and_the_spec_carries_it(monkeypatch):
    from airflow_sync_provider import cli
    from airflow_sync_provider.cli import cdc as cdc_cli
    from airflow_sync_provider.cli import load as load_cli

    specs = []
    monkeypatch.setattr(load_cli, "run_load", lambda spec, args: specs.append(spec) or 0)
    monkeypatch.setattr(cdc_cli, "submit", lambda spec, *args, **kwargs: specs.append(spec) or 0)
    urls = ["--mysql-url", "mysql://u:p@db:3306/shop", "--clickhouse-url", "http://u:p@ch:8123/"]
    assert cli.main(["load", *urls, "--table", "orders", "--history"]) == 0
    assert cli.main(["load", *urls, "--table", "orders", "--history-retention-days", "30",
                     "--history-partition-by", "toYYYYMMDD(_commit_time)"]) == 0
    assert cli.main(["cdc", "bootstrap", *urls, "--pipeline", "p", "--table", "shop.orders", "--history"]) == 0
    assert cli.main(["load", *urls, "--table", "orders"]) == 0
    assert [s.tableset.content_of().history for s in specs] == [
        HistorySettings(), HistorySettings("toYYYYMMDD(_commit_time)", 30), HistorySettings(), None]


# --- the table (ClickHouse) ----------------------------------------------------------------------

def test_the_history_has_the_copys_written_columns_and_its_own(ch):
    """Its columns are the copy's as written (shaped types, derived and hidden ones alike), then the
    history's; partitioned by commit month by default, keyed (key, _version, _row_hash)."""
    columns = (*COLUMNS, MySQLColumn("doc", "json", "json", True, charset="utf8mb4", collation="utf8mb4_bin"))
    shaped = schema(columns=columns, transform={"note": "hash"}, history={"retention_days": 30})
    shaped = dataclasses.replace(shaped, salt=b"pepper")
    layout = Layout.of({"json": "json", "settings": {"index_granularity": 1024}})
    history = fresh(ch, "shaped", schema=shaped, layout=layout, weight=True)
    ch.command(create_table_sql(shaped, DB, "shaped", layout, weight=True))

    def described(table):
        return ch.query("SELECT name, type, default_kind FROM system.columns WHERE database = {d:String} AND "
                        "table = {t:String} ORDER BY position", parameters={"d": DB, "t": table}).result_rows

    copy = [c for c in described("shaped") if c[0] not in ("_version", "_deleted")]
    own = described(history.name)
    assert own[:len(copy)] == copy  # the copy's columns, types and MATERIALIZED ones, in order
    assert [c[0] for c in own[len(copy):]] == ["_version", "_deleted", "_event", "_via", "_commit_time", "_server",
                                              "_source", "_gtid_domain", "_gtid_seq", "_row_hash", "_epoch",
                                              "_binlog_seq", "_binlog_offset"]
    types = {c[0]: c[1] for c in own}
    assert types["_commit_time"] == "DateTime64(6, 'UTC')" and types["_event"].startswith("Enum8('insert' = 1")
    assert types["note"] == dict((c[0], c[1]) for c in copy)["note"]  # shaped: the hash's type, as the copy's
    facts = ch.query("SELECT partition_key, sorting_key, engine_full, comment FROM system.tables WHERE database = "
                     "{d:String} AND name = {t:String}", parameters={"d": DB, "t": history.name}).result_rows[0]
    partition, sorting, engine, comment = facts
    assert (partition, sorting) == ("toYYYYMM(_commit_time)", "id, _version, _row_hash")
    assert "TTL toDateTime(_commit_time) + toIntervalDay(30)" in engine and "index_granularity = 1024" in engine
    assert "history_of=" in comment and stored(comment)[0] == shaped.content  # what it holds, as the copy's says
    # retention: a version committed more than 30 days ago has expired
    write(ch, history, [row(7, 100, 0, status="a")])
    ch.command(f"OPTIMIZE TABLE {DB}.{history.name} FINAL")
    assert count(ch, f"SELECT count() FROM {DB}.{history.name}") == 0
    daily = fresh(ch, "daily", schema=schema(history={"partition_by": "toYYYYMMDD(_commit_time)"}))
    assert count(ch, f"SELECT partition_key = 'toYYYYMMDD(_commit_time)' FROM system.tables WHERE database = '{DB}' "
                     f"AND name = '{daily.name}'") == 1
    # a version's position, read from it (no retention here: kept)
    write(ch, daily, [row(7, EPOCH + (3 << 32) + 4096, 0, status="a")])
    assert ch.query(f"SELECT _epoch, _binlog_seq, _binlog_offset FROM {DB}.{daily.name}").result_rows == [
        (1, 3, 4096)]


def test_what_a_history_cannot_hold_is_refused_naming_the_table(ch):
    with pytest.raises(ContentError, match=r"table shop\.orders: a history of a table without a primary key"):
        HistoryTable(schema(key=()), DB, "keyless").create_sql()
    clash = (*COLUMNS, MySQLColumn("_event", "int", "int(11)", True), MySQLColumn("_valid_to", "int", "int(11)", True))
    with pytest.raises(ContentError, match=r"table shop\.orders: column\(s\) \['_event', '_valid_to'\] have the names"):
        HistoryTable(schema(columns=clash), DB, "clash").create_sql()
    # a merged copy's own _source column (a source column, tagged) is the history's _source
    tags = tuple(MySQLColumn(name, "varchar", "varchar(255)", False, charset="utf8mb4", collation="utf8mb4_bin",
                             tag="") for name in SOURCE_COLUMNS)
    merged = fresh(ch, "merged", schema=schema(columns=(*COLUMNS, *tags)))
    names = [r[0] for r in ch.query(f"SELECT name FROM system.columns WHERE database = '{DB}' AND "
                                    f"table = '{merged.name}'").result_rows]
    assert names.count("_source") == 1 and "_source_table" in names
    assert ch.query(f"SELECT sorting_key FROM system.tables WHERE database = '{DB}' AND name = '{merged.name}'"
                    ).result_rows[0][0] == "id, _source, _source_database, _source_table, _version, _row_hash"


def test_a_replayed_write_collapses_and_a_conflicting_row_survives_and_is_counted(ch):
    history = fresh(ch, "replay")
    batch = [row(1, 100, 0, "new", "1.50", event="insert"), row(2, 101, 0, "new", None, "x", event="insert"),
             row(1, 200, 5, "paid", "1.50"), row(2, 300, 9, deleted=1)]
    table = f"{DB}.{history.name}"
    write(ch, history, batch)
    write(ch, history, batch)  # the same versions again, as after a SIGKILL: another part, the same rows
    assert count(ch, f"SELECT count() FROM {table}") == 8
    assert count(ch, f"SELECT count() FROM {table} FINAL") == 4
    ch.command(f"OPTIMIZE TABLE {table} FINAL")
    assert count(ch, f"SELECT count() FROM {table}") == 4
    assert ch.query(conflicts_sql(DB, "replay", ("id",))).result_rows == []
    # a different row at a version the history has: both kept through merges, and counted
    write(ch, history, [row(1, 200, 5, "refunded", "1.50")])
    ch.command(f"OPTIMIZE TABLE {table} FINAL")
    assert count(ch, f"SELECT count() FROM {table}") == 5
    assert ch.query(conflicts_sql(DB, "replay", ("id",))).result_rows == [(1, 200, 2)]
    # a stamp differs (another commit time for the same version): a conflict too, not a replay
    write(ch, history, [{**row(2, 101, 0, "new", None, "x", event="insert"), "_commit_time": T0 + timedelta(1)}])
    write(ch, history, [{**row(2, 101, 0, "new", None, "x", event="insert"), "_via": "xa"}])
    ch.command(f"OPTIMIZE TABLE {table} FINAL")
    assert ch.query(conflicts_sql(DB, "replay", ("id",))).result_rows == [(1, 200, 2), (2, 101, 3)]


def test_the_row_hash_is_the_same_from_an_arrow_insert_and_tells_every_column_apart(ch):
    history = fresh(ch, "hashes")
    one = row(1, 100, 0, "new", "2.00", None, event="insert")
    write(ch, history, [one])
    arrow = pa.table({"id": pa.array([1], pa.int32()), "status": ["new"], "amount": pa.array([Decimal("2.00")],
                                                                                              pa.decimal128(10, 2)),
                      "note": pa.array([None], pa.string()), "_version": pa.array([100], pa.uint64()),
                      "_deleted": pa.array([0], pa.uint8()), "_event": ["insert"], "_via": ["binlog"],
                      "_commit_time": pa.array([T0], pa.timestamp("us", tz="UTC")), "_server": ["s1"],
                      "_source": [""], "_gtid_domain": ["0"], "_gtid_seq": pa.array([100], pa.uint64())})
    ch.insert_arrow(f"{DB}.{history.name}", arrow)
    hashes = ch.query(f"SELECT _row_hash FROM {DB}.{history.name}").result_rows
    assert len(hashes) == 2 and hashes[0] == hashes[1] and hashes[0][0] != 0
    # every column of the row, and NULL against '', moves the hash
    variants = [{"status": "paid"}, {"amount": Decimal("2.01")}, {"note": ""}, {"note": "x"}, {"_deleted": 1},
                {"_event": "snapshot"}, {"_via": "load"}, {"_server": "s2"}, {"_gtid_seq": 7},
                {"_commit_time": T0 + timedelta(microseconds=1)}, {"_source": "a"}, {"_gtid_domain": "1"}]
    write(ch, history, [{**one, **change} for change in variants])
    assert count(ch, f"SELECT uniqExact(_row_hash) FROM {DB}.{history.name}") == 1 + len(variants)


LOG = [  # (id, version, seconds, status, amount, note, deleted): the test's record of every version
    (1, 100, 0, "new", "1.00", None, 0), (2, 150, 1, "new", "5.00", "gift", 0), (1, 200, 2, "paid", "1.00", None, 0),
    (3, 250, 3, "new", None, None, 0), (2, 300, 4, "new", "5.00", "gift", 1), (1, 350, 5, "paid", "1.25", "late", 0),
    (2, 400, 6, "again", "6.00", None, 0), (3, 450, 7, "new", None, None, 1),
]


def logged(history_rows=LOG) -> list[dict]:
    return [row(i, v, s, st, a, n, deleted=d) for i, v, s, st, a, n, d in history_rows]


def test_the_copy_as_of_a_version(ch):
    history = fresh(ch, "asof")
    rows = logged()
    write(ch, history, rows[:5])
    write(ch, history, rows[3:])  # overlapping parts, as replays leave them
    asof = f"SELECT * FROM {DB}.asof_asof(at_version={{v:UInt64}}) ORDER BY id"
    seen = set()
    for version in (0, 99, 100, 149, 150, 200, 250, 299, 300, 350, 400, 449, 450, 10_000):
        expected = state(rows, lambda r, v=version: r["_version"] <= v)
        assert view(ch, asof, v=version) == expected, version
        seen.add(tuple(sorted(expected.items())))
    assert len(seen) == 9  # each state of the log told apart (the empty one included)
    # each key's version and its commit time
    assert ch.query(f"SELECT id, _valid_from_version, _valid_from FROM {DB}.asof_asof(at_version=400) ORDER BY id"
                    ).result_rows == [(1, 350, T0.replace(tzinfo=None) + timedelta(seconds=5)),
                                      (2, 400, T0.replace(tzinfo=None) + timedelta(seconds=6)),
                                      (3, 250, T0.replace(tzinfo=None) + timedelta(seconds=3))]


def test_the_copy_as_of_a_time_never_shows_a_state_that_did_not_exist(ch):
    """After a failover the new server's clock is behind: the version after 10:00:10 was committed
    at 10:00:05. As of T is the longest prefix of binlog order committed by T."""
    history = fresh(ch, "clock")
    rows = [row(1, 100, 0, "a1", event="insert"), row(2, 200, 10, "b1", event="insert"),
            row(1, EPOCH + 100, 5, "a2", server="s2"), row(3, EPOCH + 200, 12, "c1", event="insert", server="s2"),
            row(2, EPOCH + 300, 20, deleted=1, server="s2")]
    write(ch, history, rows)
    prefixes = [state(rows, lambda r, n=n: r in rows[:n]) for n in range(len(rows) + 1)]
    asof = f"SELECT * FROM {DB}.clock_asof_time(at_time={{t:DateTime64(6, 'UTC')}}) ORDER BY id"
    for seconds in (-1, 0, 3, 5, 7, 9.5, 10, 11, 12, 15, 20, 60):
        at = T0 + timedelta(seconds=seconds)
        committed = next(n for n in range(len(rows), -1, -1)
                         if all(r["_commit_time"] <= at for r in rows[:n]))  # the longest prefix committed by T
        result = view(ch, asof, t=text(at))
        assert result == prefixes[committed] and result in prefixes, seconds
    # the naive filter on commit time alone mixes both sides of the skew: A's second value without B
    at = T0 + timedelta(seconds=7)
    naive = state(rows, lambda r: r["_commit_time"] <= at)
    assert naive == {1: ("a2", None, None)} and naive not in prefixes
    assert view(ch, asof, t=text(at)) == {1: ("a1", None, None)}


def test_the_scd2_view_gives_each_versions_validity_operation_and_changed_columns(ch):
    history = fresh(ch, "scd")
    rows = logged() + [row(1, 500, 8, "paid", "1.25", "late", event="snapshot", via="load")]  # a version, no change
    write(ch, history, rows)
    got = ch.query(f"SELECT id, status, amount, note, _valid_from_version, _valid_from, _valid_to_version, _valid_to, "
                   f"_op, _changed FROM {DB}.scd_scd2 ORDER BY id, _valid_from_version").result_rows
    at = [T0.replace(tzinfo=None) + timedelta(seconds=s) for s in range(9)]
    assert got == [
        (1, "new", Decimal("1.00"), None, 100, at[0], 200, at[2], "insert", []),
        (1, "paid", Decimal("1.00"), None, 200, at[2], 350, at[5], "update", ["status"]),
        (1, "paid", Decimal("1.25"), "late", 350, at[5], 500, at[8], "update", ["amount", "note"]),
        (1, "paid", Decimal("1.25"), "late", 500, at[8], None, None, "update", []),
        (2, "new", Decimal("5.00"), "gift", 150, at[1], 300, at[4], "insert", []),  # closed by its delete
        (2, "again", Decimal("6.00"), None, 400, at[6], None, None, "insert", []),  # back after the delete
        (3, "new", None, None, 250, at[3], 450, at[7], "insert", []),
    ]
    # current rows (valid_to NULL) are the latest state
    current = {r[0]: tuple(r[1:4]) for r in got if r[7] is None}
    assert current == state(rows, lambda r: True)


def test_schema_changes_add_and_rename_work_and_a_hashed_column_cannot_be_dropped(ch):
    history = fresh(ch, "alter")
    table = f"{DB}.{history.name}"
    before = [row(1, 100, 0, "new", "1.00", event="insert"), row(2, 150, 1, "new", "2.00", event="insert")]
    write(ch, history, before)
    extra = MySQLColumn("extra", "int", "int(11)", True)
    added = dataclasses.replace(history, schema=schema(columns=(*COLUMNS, extra)))
    for sql in added.add_column_sql("extra"):
        ch.command(sql)
    # a replay of a version written before the column (the row image lacks it): the same row, collapsed
    write(ch, added, [before[0]])
    write(ch, added, [{**row(1, 200, 2, "paid", "1.00"), "extra": 5}])
    ch.command(f"OPTIMIZE TABLE {table} FINAL")
    assert count(ch, f"SELECT count() FROM {table}") == 3
    assert ch.query(f"SELECT id, status, extra FROM {DB}.alter_asof(at_version=300) ORDER BY id").result_rows == [
        (1, "paid", 5), (2, "new", None)]
    assert ch.query(f"SELECT _changed FROM {DB}.alter_scd2 WHERE id = 1 ORDER BY _valid_from_version"
                    ).result_rows == [([],), (["status", "extra"],)]
    # a column added with a default: rows at the default keep their hash too
    flag = MySQLColumn("flag", "tinyint", "tinyint(4)", False)
    flagged = dataclasses.replace(added, schema=schema(columns=(*COLUMNS, extra, flag)))
    for sql in flagged.add_column_sql("flag", "1"):
        ch.command(sql)
    flagged = dataclasses.replace(flagged, defaults={"flag": "1"})
    write(ch, flagged, [before[1]])  # replayed without the column: flag 1, its default
    ch.command(f"OPTIMIZE TABLE {table} FINAL")
    assert count(ch, f"SELECT count() FROM {table}") == 3
    # RENAME: ClickHouse rewrites the hash's expression; the views are made again over the new name
    ch.command(f"ALTER TABLE {table} RENAME COLUMN note TO remark")
    renamed = tuple(dataclasses.replace(c, name="remark") if c.name == "note" else c for c in (*COLUMNS, extra, flag))
    for sql in dataclasses.replace(flagged, schema=schema(columns=renamed)).views_sql(replace=True):
        ch.command(sql)
    default = ch.query(f"SELECT default_expression FROM system.columns WHERE database = '{DB}' AND "
                       f"table = '{history.name}' AND name = '_row_hash'").result_rows[0][0]
    assert "isNull(remark)" in default and "note" not in default.replace("'note'", "")
    write(ch, flagged, [{**{k: v for k, v in before[0].items() if k != "note"}, "remark": None}])  # a replay again
    ch.command(f"OPTIMIZE TABLE {table} FINAL")
    assert count(ch, f"SELECT count() FROM {table}") == 3
    assert ch.query(f"SELECT id, remark FROM {DB}.alter_asof(at_version=300) ORDER BY id").result_rows == [
        (1, None), (2, None)]
    # DROP: a hashed column cannot go (what a dropped source column becomes is the DDL follower's call)
    with pytest.raises(DatabaseError, match="_row_hash"):
        ch.command(f"ALTER TABLE {table} DROP COLUMN status")
    assert "status" in [r[0] for r in ch.query(f"DESCRIBE TABLE {table}").result_rows]

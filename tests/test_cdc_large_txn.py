"""Transactions larger than a batch (issue 43): applied in pieces in bounded memory, never
claimed before their commit, cut between reader processes; XA transactions beyond the bounds
wait in staging. Real MariaDB, the chDB endpoint, and the job as spark-submit runs it."""

from __future__ import annotations

import dataclasses
import threading

import pymysql
import pytest

from airflow_sync_provider.core.cdc.binlog.backlog import backlog_events, split_backlog
from airflow_sync_provider.core.cdc.binlog.batches import MidTransaction
from airflow_sync_provider.core.cdc.binlog.reader import BinlogReader
from airflow_sync_provider.core.cdc.binlog.routes import TableRoute
from airflow_sync_provider.core.cdc.checkpoints import Checkpoints
from airflow_sync_provider.core.cdc.ring import HashRing
from airflow_sync_provider.core.cdc.staging import stage_prefix
from airflow_sync_provider.core.jobspec import CdcApplySpec, CdcBootstrapSpec
from airflow_sync_provider.core.positions import BinlogPosition, current_position
from airflow_sync_provider.core.selection import TableSet
from airflow_sync_provider.core.source.group import one_server
from airflow_sync_provider.core.source.schema import read_table_schema
from airflow_sync_provider.core.submission import spark_submit
from devenv.rss import PeakRss
from tests.helpers import assert_same_rows, recreate_tables
from tests.helpers import run_sql as sql

DB, TARGET = "big_src", "big_ch"
ROWS = 1_000_000  # one transaction updates each twice and deletes a tenth: 2.1M row changes
MEMORY_BOUND_MIB = 1024  # docs/cdc.md, Large transactions: the applier's tree with the defaults


def _transactions(sizes, file="mysql-bin.000009", start=4, statements=1):
    """SHOW BINLOG EVENTS rows (MariaDB's shape) of transactions of ``statements`` statements,
    each of rows events of these sizes; GTIDs 0-1-7, 0-1-8 …"""
    rows, pos = [], start
    for n, sizes_of in enumerate(sizes):
        shape = [("Gtid", 42, f"BEGIN GTID 0-1-{7 + n}")]
        for _ in range(statements):
            shape += [("Annotate_rows", 50, "UPDATE t SET v = v + 1"), ("Table_map", 60, "table_id: 25 (d.t)")]
            shape += [("Update_rows_v1", size, "table_id: 25") for size in sizes_of]
        shape.append(("Xid", 31, f"COMMIT /* xid={n} */"))
        for kind, length, info in shape:
            rows.append((file, pos, kind, pos + length, info))
            pos += length
    return rows


def test_a_large_transaction_is_cut_inside_at_rows_events_with_its_gtid_and_epoch():
    start = BinlogPosition("mysql-bin.000009", 4, "0-1-6,1-2-40", epoch=3)
    events = _transactions([[1000] * 6], statements=2)
    cut, = split_backlog(events, 2, 0, start)
    assert isinstance(cut, MidTransaction)
    maps = [pos for _, pos, kind, _, _ in events if kind == "Table_map"]
    rows = [pos for _, pos, kind, _, _ in events if kind.startswith("Update_rows")]
    # half the row bytes before it: the first rows event of the second statement, read from its table map
    assert cut.at.pos == rows[6] and cut.maps == maps[1]
    assert cut.at.epoch == 3 and cut.at.gtid == "0-1-7,1-2-40"  # the state after the transaction it is in
    assert cut.began == start  # ... which began at the start (its state: before the transaction)
    three = split_backlog(events, 3, 0, start)
    assert [c.at.pos for c in three] == [rows[4], rows[8]] and [c.maps for c in three] == [maps[0], maps[1]]
    # commits carry the epoch and the GTID state after them too (they had neither: a share's versions were epoch 0)
    small = _transactions([[1000]] * 4)
    after = split_backlog(small, 2, 0, start)
    second = [end for _, _, kind, end, _ in small if kind == "Xid"][1]
    assert after == [BinlogPosition("mysql-bin.000009", second, "0-1-8,1-2-40", 3)]


def _changes(batches) -> list[tuple]:
    out = []
    for batch in batches:
        for source, lanes in batch.lanes.items():
            for rows, versions, deleted in lanes.values():
                out += [(source, version, row, flag) for row, version, flag in zip(rows, versions, deleted)]
    return sorted(out)


def _read(endpoint, routes, start, stop, server_id, max_events=700):
    reader = BinlogReader(endpoint, start, routes, HashRing(2, 16), server_id)
    out = []
    try:
        while not (out and out[-1].done):
            out.append(reader.read(stop, max_events, 30.0))
    finally:
        reader.close()
    return out


@pytest.mark.slow
def test_shares_cut_inside_a_transaction_read_exactly_what_one_reader_reads(endpoints, mysql_conn):
    """A transaction of three statements cut in three shares (two cuts inside it): together they
    give the one reader's changes at the same versions (epoch included), the first two end with
    a piece read through their cut, and the last ends at the commit with the server's GTID state."""
    recreate_tables(mysql_conn, DB, f"CREATE TABLE {DB}.shares (id INT PRIMARY KEY, v INT NOT NULL, s VARCHAR(30))")
    sql(mysql_conn, f"INSERT INTO {DB}.shares SELECT seq, seq, CONCAT('row ', seq) FROM {DB}.seq_1_to_4000")
    start = dataclasses.replace(current_position(mysql_conn), epoch=2)
    sql(mysql_conn, "BEGIN", f"UPDATE {DB}.shares SET v = v + 1",
        f"UPDATE {DB}.shares SET s = 'changed' WHERE id % 3 = 0", f"DELETE FROM {DB}.shares WHERE id % 7 = 0",
        f"UPDATE {DB}.shares SET id = id + 10000 WHERE id % 11 = 0", "COMMIT")
    stop = dataclasses.replace(current_position(mysql_conn), epoch=2)
    route = TableRoute(read_table_schema(mysql_conn, DB, "shares"), TARGET, "shares")
    routes = {route.source: route}
    whole = _read(endpoints[0], routes, start, stop, 4501)
    assert len(whole) > 4 and all(b.through is not None for b in whole[:-1]) and whole[-1].through is None
    cuts = split_backlog(backlog_events(endpoints[0], start, stop), 3, 0, start)
    assert len(cuts) == 2 and all(isinstance(c, MidTransaction) for c in cuts), cuts
    bounds = [start, *cuts, stop]
    shares = [_read(endpoints[0], routes, a, b, 4502 + i) for i, (a, b) in enumerate(zip(bounds, bounds[1:]))]
    for share, cut in zip(shares, cuts):
        assert share[-1].through == cut.at and share[-1].done
        assert not any(b.through is None for b in share)  # no batch claims anything before the commit
    assert _changes(b for share in shares for b in share) == _changes(whole)
    assert {v >> 56 for _, v, _, _ in _changes(whole)} == {2}
    last = shares[-1][-1]
    assert last.end == whole[-1].end and last.end.gtid == stop.gtid and last.end.key() == stop.key()


@pytest.mark.slow
def test_a_dump_connection_dropped_inside_a_statement_loses_no_row(endpoints, mysql_conn):
    """A reader's binlog connection is lost inside one large statement (the server drops it when
    the reader waited longer than net_write_timeout to hand a batch on); python-mysql-replication
    reconnects where it was. Every change still comes: the table maps read before are kept (they
    were forgotten at the reconnection's rotate event, and the rest of the statement was skipped
    as rows of an unknown table: a 5M-change transaction lost 256,560 in the bench)."""
    recreate_tables(mysql_conn, DB, f"CREATE TABLE {DB}.drop (id INT PRIMARY KEY, v INT NOT NULL)")
    sql(mysql_conn, f"INSERT INTO {DB}.drop SELECT seq, seq FROM {DB}.seq_1_to_20000")
    start = current_position(mysql_conn)
    sql(mysql_conn, f"UPDATE {DB}.drop SET v = v + 1")
    stop = current_position(mysql_conn)
    route = TableRoute(read_table_schema(mysql_conn, DB, "drop"), TARGET, "drop")
    reader = BinlogReader(endpoints[0], start, {route.source: route}, HashRing(2, 16), 4511)
    read = []
    try:
        read.append(reader.read(stop, 3000, 30.0))
        assert read[0].through is not None  # inside the statement
        reader.stream.close()  # what the library does at a lost connection: the next read reconnects
        while not read[-1].done:
            read.append(reader.read(stop, 3000, 30.0))
    finally:
        reader.close()
    assert sum(b.events for b in read) == 20_000
    assert _changes(read) == _changes(_read(endpoints[0], {route.source: route}, start, stop, 4512, 3000))


@pytest.fixture(scope="module")
def big(endpoints):
    """A 1M-row table bootstrapped into pipeline "big", then one transaction of 2.1M row changes
    (every row updated twice, a tenth deleted). Returns (the position before it, after it)."""
    conn = pymysql.connect(**endpoints[0].connect_args(), autocommit=True)
    try:
        recreate_tables(conn, DB, f"CREATE TABLE {DB}.t (id INT PRIMARY KEY, v INT NOT NULL, s VARCHAR(24) NULL)")
        sql(conn, f"INSERT INTO {DB}.t SELECT seq, seq, CONCAT('s', seq) FROM {DB}.seq_1_to_{ROWS}")
        result = spark_submit(CdcBootstrapSpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline="big",
                                               channels=2,
                                               tableset=TableSet(tables=[{"source_database": DB, "source_table": "t",
                                                                          "target_database": TARGET}])), timeout=600)
        assert result["status"] == "success", result
        assert spark_submit(_spec(endpoints), timeout=600)["status"] == "success"  # the pipeline begins
        before = current_position(conn)
        sql(conn, "BEGIN", f"UPDATE {DB}.t SET v = v + 1", f"UPDATE {DB}.t SET s = CONCAT('t', id)",
            f"DELETE FROM {DB}.t WHERE id % 10 = 3", "COMMIT")
        yield before, current_position(conn)
    finally:
        conn.close()


def _spec(endpoints, **kwargs) -> CdcApplySpec:
    return CdcApplySpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline="big", verify_period=0,
                        verify_after_ddl=False, **kwargs)


class StateWatch(threading.Thread):
    """The pipeline's state as a sensor or `cdc status` would read it, every 0.3 s while a run goes."""

    def __init__(self, ch):
        super().__init__(daemon=True)
        self.ch, self.seen, self.stop = ch, [], threading.Event()

    def run(self):
        ledger = Checkpoints(self.ch)
        while not self.stop.wait(0.3):
            state = ledger.state("big")
            self.seen.append((state.checkpoint, state.applying, state.events))

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.join()


@pytest.mark.slow
def test_a_transaction_of_two_million_changes_killed_then_applied_in_bounded_memory(big, endpoints, clickhouse_url,
                                                                                   mysql_conn, ch, monkeypatch,
                                                                                   capsys):
    before, after = big
    ledger = Checkpoints(ch)
    events = ledger.state("big").events

    def counted() -> int:
        return int(ch.command("SELECT sum(events) FROM airflow_sync.cdc_counters WHERE pipeline = 'big'"))

    counted_before = counted()
    monkeypatch.setenv("AIRFLOW_SYNC_CRASH_AT", "cdc.piece-written:3")
    killed = spark_submit(_spec(endpoints), timeout=900)
    monkeypatch.delenv("AIRFLOW_SYNC_CRASH_AT")
    assert killed["status"] == "failed", killed
    state = ledger.state("big")
    # three pieces written, none claimed: the checkpoint, the counts and the counters stay before it
    assert state.checkpoint.key() <= before.key() and state.events == events
    assert counted() == counted_before
    assert state.applying and state.applying["pieces"] == 3 and state.applying["changes"] >= 3 * 50_000
    assert BinlogPosition.from_dict(state.applying["began"]).key() == before.key()
    changed = ch.command(f"SELECT countIf(v = id + 1) FROM {TARGET}.t FINAL")
    assert 0 < changed < ROWS  # the copy holds part of it
    from airflow_sync_provider.cli import main as cli
    from airflow_sync_provider.core.overview import PipelineRow
    from airflow_sync_provider.plugins.pages import pipeline_html

    assert cli(["cdc", "status", "--pipeline", "big", "--clickhouse-url", clickhouse_url]) == 0
    assert "being applied in pieces" in capsys.readouterr().out
    assert "being applied in pieces" in pipeline_html(PipelineRow(state, None, None))

    with StateWatch(ch) as watch, PeakRss() as peak:
        result = spark_submit(_spec(endpoints), timeout=1800)
    assert result["status"] == "success", result
    print(f"2.1M row changes in one transaction: {result['seconds']} s, {result['pieces']} pieces, "
          f"peak RSS of the applier's processes {peak.mib:,.0f} MiB ({len(peak.processes)} processes)")
    assert result["events"] == 2_100_000 and result["pieces"] >= 2_000_000 // 50_000
    assert peak.samples > 10 and 0 < peak.mib < MEMORY_BOUND_MIB, peak.mib
    # while pieces were written the checkpoint stayed before the transaction; past it, nothing is open
    assert any(applying for _, applying, _ in watch.seen)
    for checkpoint, applying, applied in watch.seen:
        assert checkpoint.key() <= before.key() and applied == events if applying else True
        assert applying is None if checkpoint.key() > before.key() else True
    final = ledger.state("big")
    assert final.checkpoint.key() == after.key() and final.applying is None
    assert final.events == events + 2_100_000 and counted() == counted_before + 2_100_000
    assert assert_same_rows(mysql_conn, ch, DB, "t", TARGET) == ROWS - ROWS // 10


class Prepared:
    """XA transactions prepared on sessions of their own, each ended by its session (tests/test_cdc_xa.py)."""

    def __init__(self, endpoint):
        self.endpoint, self.sessions = endpoint, {}

    def __call__(self, xid: str, *statements: str) -> None:
        conn = pymysql.connect(**self.endpoint.connect_args(), autocommit=True)
        try:
            sql(conn, f"XA START '{xid}'", *statements, f"XA END '{xid}'", f"XA PREPARE '{xid}'")
        except Exception:
            conn.close()  # the server rolls an unprepared transaction back
            raise
        self.sessions[xid] = conn

    def end(self, xid: str, commit: bool = True) -> None:
        conn = self.sessions.pop(xid)
        try:
            sql(conn, f"XA {'COMMIT' if commit else 'ROLLBACK'} '{xid}'")
        finally:
            conn.close()

    def close(self) -> None:
        for xid in list(self.sessions):
            self.end(xid, commit=False)


@pytest.mark.slow
def test_xa_transactions_beyond_the_bound_wait_in_staging_across_runs(endpoints, mysql_conn, ch):
    """Two XA transactions of 5,101 and 2,000 row changes (the bound: 1,000) prepared, parked
    across runs in staging, one committed, one rolled back: the copy shows each exactly when the
    source does; staging lost between runs is read again; a copy taken between prepare and commit
    (a re-bootstrap) is outranked by the committed rows; nothing is left in staging."""
    recreate_tables(mysql_conn, DB, f"CREATE TABLE {DB}.x (id INT PRIMARY KEY, v INT NOT NULL, s VARCHAR(20))")
    sql(mysql_conn, f"INSERT INTO {DB}.x SELECT seq, seq, 's' FROM {DB}.seq_1_to_6000")

    def bootstrap(**kwargs):
        result = spark_submit(CdcBootstrapSpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline="bigxa",
                                               channels=1,
                                               tableset=TableSet(tables=[{"source_database": DB, "source_table": "x",
                                                                          "target_database": TARGET}]),
                                               **kwargs), timeout=600)
        assert result["status"] == "success", result

    bootstrap()
    spec = CdcApplySpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline="bigxa", lanes=2,
                        batch_events=1000, verify_period=0, verify_after_ddl=False)

    def apply() -> dict:
        result = spark_submit(spec, timeout=600)
        assert result["status"] == "success", result
        assert_same_rows(mysql_conn, ch, DB, "x", TARGET)
        return result

    def staging() -> list[str]:
        return [n for (n,) in ch.query("SELECT name FROM system.tables WHERE database = 'airflow_sync' AND "
                                       "startsWith(name, {p:String})", parameters={"p": stage_prefix("bigxa")})
                .result_rows]

    apply()
    prepare = Prepared(endpoints[0])
    try:
        prepare("keep", f"UPDATE {DB}.x SET v = v + 1 WHERE id <= 3000",
                f"UPDATE {DB}.x SET s = 'kept' WHERE id <= 2000", f"DELETE FROM {DB}.x WHERE id BETWEEN 2001 AND 2100",
                f"INSERT INTO {DB}.x VALUES (0, 1, 'new')")  # (row locks apart from the other's)
        prepare("drop", f"UPDATE {DB}.x SET s = 'rolled back', v = 0 WHERE id BETWEEN 4001 AND 6000")
        sql(mysql_conn, f"UPDATE {DB}.x SET s = 'plain' WHERE id = 3500")
        first = apply()  # neither is in the copy; both wait in staging
        assert first["prepared_xa"] == 2 and first["xa_staged"] >= 5101 + 2000 - 2 * 1000, first
        assert first["events"] == 1 and len(staging()) == 2
        state = Checkpoints(ch).state("bigxa")
        assert all("staged" in entry for entry in state.prepared.values())
        assert apply()["xa_staged"] == 0  # a new run does not read them again: staging is whole
        ch.command(f"DROP TABLE airflow_sync.{staging()[0]}")  # staging lost: the next reader reads it again
        sql(mysql_conn, f"UPDATE {DB}.x SET s = 'plain again' WHERE id = 3600")
        again = apply()
        assert again["xa_staged"] > 0 and again["events"] == 1 and len(staging()) == 2, again
        prepare.end("drop", commit=False)
        assert apply()["prepared_xa"] == 1 and len(staging()) == 1
        bootstrap(restart=True)  # its snapshot cannot see the prepared rows: they must rank above it
        apply()  # the table joins again: its parked transaction is read again into staging
        prepare.end("keep")
        last = apply()  # each key's last change, at the commit's version
        assert last["prepared_xa"] == 0 and last["events"] == 3000 + 2000 + 100 + 1 and not staging(), last
        assert ch.command(f"SELECT count() FROM {TARGET}.x FINAL WHERE s = 'rolled back'") == 0
    finally:
        prepare.close()

"""XA transactions (two-phase commit) on the source: a prepared transaction's rows are in the
binlog at XA PREPARE, but they exist only once XA COMMIT comes, maybe much later, maybe after the
applier was restarted, or never (XA ROLLBACK). The copy shows them exactly when the source does.
Verification is off here (verify_period=0) so only the stream itself can make the copy right."""

from __future__ import annotations

import pymysql
import pytest

from airflow_sync_provider.core.cdc.binlog.backlog import split_backlog
from airflow_sync_provider.core.jobspec import CdcApplySpec
from airflow_sync_provider.core.source.group import one_server
from airflow_sync_provider.spark.cdc_apply import run_cdc_apply
from tests.helpers import assert_same_rows, bootstrap_tables, recreate_tables
from tests.helpers import run_sql as sql

pytestmark = pytest.mark.slow
DB, TARGET = "xa_src", "xa_ch"


class Prepared:
    """XA transactions prepared on the source, each on a session of its own that stays open and
    later ends it. (Closing the session and ending the transaction from another one, as a
    transaction manager may, races MariaDB: XA RECOVER lists the transaction while the closed
    session still holds it, and an XA COMMIT then fails with "Unknown XID".)"""

    def __init__(self, endpoint):
        self.endpoint, self.sessions = endpoint, {}

    def __call__(self, xid: str, *statements: str) -> None:
        conn = pymysql.connect(**self.endpoint.connect_args(), autocommit=True)
        self.sessions[xid] = conn
        sql(conn, f"XA START '{xid}'", *statements, f"XA END '{xid}'", f"XA PREPARE '{xid}'")

    def end(self, xid: str, commit: bool = True) -> None:
        conn = self.sessions.pop(xid)
        try:
            sql(conn, f"XA {'COMMIT' if commit else 'ROLLBACK'} '{xid}'")
        finally:
            conn.close()

    def close(self) -> None:  # what a failed test left prepared would lock the tables of the next
        for xid in list(self.sessions):
            self.end(xid, commit=False)


@pytest.fixture
def prepare(endpoints):
    prepared = Prepared(endpoints[0])
    yield prepared
    prepared.close()


@pytest.fixture
def xa(endpoints, mysql_conn, spark):
    recreate_tables(mysql_conn, DB, f"CREATE TABLE {DB}.t (id INT PRIMARY KEY, v VARCHAR(20))",
                    f"CREATE TABLE {DB}.u (id INT PRIMARY KEY, v VARCHAR(20))")
    sql(mysql_conn, f"INSERT INTO {DB}.t VALUES (1, 'one'), (2, 'two')", f"INSERT INTO {DB}.u VALUES (1, 'one')")
    bootstrap_tables(endpoints, spark, "xa", DB, TARGET, "t", "u")


def _apply(endpoints, spark) -> dict:
    return run_cdc_apply(CdcApplySpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline="xa", lanes=2,
                                      verify_period=0, verify_after_ddl=False), spark)


def _same(conn, ch):
    for table in ("t", "u"):
        assert_same_rows(conn, ch, DB, table, TARGET)


def test_prepared_rows_appear_at_commit_and_never_after_a_rollback(xa, prepare, endpoints, mysql_conn, ch,
                                                                    spark):
    prepare("keep", f"INSERT INTO {DB}.t VALUES (10, 'prepared')", f"UPDATE {DB}.t SET v = 'changed' WHERE id = 1")
    prepare("drop", f"INSERT INTO {DB}.u VALUES (20, 'rolled back')",
            f"DELETE FROM {DB}.t WHERE id = 2")
    sql(mysql_conn, f"INSERT INTO {DB}.u VALUES (30, 'plain')")
    first = _apply(endpoints, spark)
    _same(mysql_conn, ch)  # neither prepared transaction is visible yet, the plain insert is
    assert first["prepared_xa"] == 2, first

    prepare.end("drop", commit=False)
    sql(mysql_conn, f"INSERT INTO {DB}.t VALUES (11, 'after')")
    _apply(endpoints, spark)  # a new run: the parked transaction is read again from its start
    _same(mysql_conn, ch)

    prepare.end("keep")
    prepare("both", f"UPDATE {DB}.t SET v = 'again' WHERE id = 10")
    prepare.end("both")  # prepared and committed within one run
    sql(mysql_conn, "XA START 'one'", f"INSERT INTO {DB}.u VALUES (40, 'one phase')", "XA END 'one'",
        "XA COMMIT 'one' ONE PHASE")
    last = _apply(endpoints, spark)
    _same(mysql_conn, ch)
    assert last["prepared_xa"] == 0 and last["xa_commits_unseen"] == 0 and not last["repaired_shards"], last
    assert ch.command(f"SELECT v FROM {TARGET}.t FINAL WHERE id = 10") == "again"


def test_a_copy_taken_between_prepare_and_commit_is_outranked_by_the_commit(xa, prepare, endpoints, mysql_conn,
                                                                             ch, spark):
    """The stream reads the prepare, a re-bootstrap's snapshot (which cannot see the prepared rows)
    comes next, then the commit: the committed rows rank at the commit, above the snapshot (at
    their events' positions they ranked below it and the copy kept the old row)."""
    _apply(endpoints, spark)
    prepare("between", f"INSERT INTO {DB}.t VALUES (5, 'between')", f"UPDATE {DB}.t SET v = 'new' WHERE id = 1",
            f"DELETE FROM {DB}.u WHERE id = 1")
    bootstrap_tables(endpoints, spark, "xa", DB, TARGET, "t", "u", restart=True)
    prepare.end("between")
    result = _apply(endpoints, spark)
    _same(mysql_conn, ch)
    assert result["xa_commits_unseen"] == 0, result


def test_a_commit_whose_prepare_came_before_the_pipeline_has_every_table_looked_at(prepare, endpoints, mysql_conn,
                                                                                   ch, spark):
    """Prepared before a new pipeline's bootstrap, committed after: the stream has only the
    commit, so the run looks at every table and repairs what it brought."""
    recreate_tables(mysql_conn, DB, f"CREATE TABLE {DB}.t (id INT PRIMARY KEY, v VARCHAR(20))",
                    f"CREATE TABLE {DB}.u (id INT PRIMARY KEY, v VARCHAR(20))")
    sql(mysql_conn, f"INSERT INTO {DB}.t VALUES (1, 'one')")
    prepare("early", f"INSERT INTO {DB}.t VALUES (5, 'early')")
    bootstrap_tables(endpoints, spark, "xa_late", DB, TARGET, "t", "u", restart=True)
    prepare.end("early")
    result = run_cdc_apply(CdcApplySpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline="xa_late",
                                        lanes=2, verify_period=0, verify_after_ddl=False), spark)
    _same(mysql_conn, ch)
    assert result["xa_commits_unseen"] == 1 and result["repaired_shards"] >= 1, result


def test_a_backlog_with_xa_is_read_in_one_piece():
    events = [("b.000001", 100, "Write_rows_v1", 5000, ""), ("b.000001", 5000, "Query", 5100, "XA END X'6b',X'',1"),
              ("b.000001", 5100, "XA_prepare", 5140, "XA PREPARE X'6b',X'',1"),
              ("b.000001", 5140, "Write_rows_v1", 9000, ""), ("b.000001", 9000, "Xid", 9031, "COMMIT"),
              ("b.000001", 9031, "Query", 9100, "XA COMMIT X'6b',X'',1")]
    assert split_backlog(events, 2, 10) is None


def test_a_parked_transaction_whose_binlog_is_gone_is_let_go(endpoints):
    """Its file purged: the reader starts without it (its commit then counts as unseen, and the
    tables are looked at) instead of failing every run."""
    from airflow_sync_provider.core.cdc.binlog.reader import BinlogReader, Watch
    from airflow_sync_provider.core.cdc.ring import HashRing

    reader = BinlogReader(endpoints[0], _now(endpoints[0]), {}, HashRing(2), 4242,
                          watch=Watch(prepared={"6b,,1": {"file": "mysql-bin.000000", "pos": 4}}))
    try:
        assert reader.read(None, 1, 1.0).prepared == {}
    finally:
        reader.close()


def _now(endpoint):
    from airflow_sync_provider.core.positions import current_position

    conn = pymysql.connect(**endpoint.connect_args())
    try:
        return current_position(conn)
    finally:
        conn.close()

"""A MariaDB source with log_bin_compress=ON (issue 34, part 3): its compressed row and query
events are decoded, so the copy ends exact; without the decoding the reader stops, it does not
report success with the changes left behind. Server-free tests: tests/test_binlog_events.py."""

from __future__ import annotations

import pymysql
import pytest

from airflow_sync_provider.core.cdc.binlog import library
from airflow_sync_provider.core.cdc.binlog.backlog import backlog_events, split_backlog
from airflow_sync_provider.core.cdc.binlog.reader import BinlogReader
from airflow_sync_provider.core.cdc.binlog.routes import TableRoute
from airflow_sync_provider.core.cdc.ring import HashRing
from airflow_sync_provider.core.endpoints import MySQLEndpoint
from airflow_sync_provider.core.jobspec import CdcApplySpec, CdcBootstrapSpec
from airflow_sync_provider.core.positions import BinlogError, current_position, event_version
from airflow_sync_provider.core.selection import TableSet
from airflow_sync_provider.core.source.group import one_server
from airflow_sync_provider.core.source.schema import read_table_schema
from airflow_sync_provider.spark.cdc_apply import run_cdc_apply
from airflow_sync_provider.spark.cdc_bootstrap import run_cdc_bootstrap
from tests.helpers import assert_same_rows
from tests.helpers import run_sql as sql

pytestmark = pytest.mark.slow
DB, TARGET = "zc", "zc_ch"


@pytest.fixture
def source(compressed_mysql_url, clickhouse_url):
    endpoint = MySQLEndpoint.from_url(compressed_mysql_url)
    conn = pymysql.connect(**endpoint.connect_args(), autocommit=True)
    yield endpoint, conn
    conn.close()


def _seed(conn, *tables):
    sql(conn, f"CREATE DATABASE IF NOT EXISTS {DB}")
    for table in tables:
        sql(conn, f"DROP TABLE IF EXISTS {DB}.{table}",
            f"CREATE TABLE {DB}.{table} (id INT PRIMARY KEY, note VARCHAR(40) NULL, amount DECIMAL(10, 2) NULL,"
            " n INT NULL)",
            f"INSERT INTO {DB}.{table} SELECT seq, CONCAT('note ', seq), seq / 7, seq % 13 FROM {DB}.seq_1_to_1000")


def _kinds(endpoint, start, stop) -> list[str]:
    return [kind for _, _, kind, _, _ in backlog_events(endpoint, start, stop)]


def test_a_compressed_binlog_pipeline_ends_exact(source, endpoints, ch, spark):
    """The issue's report — 100 updates, 2 inserts, 51 deletes — plus an ADD COLUMN with changes
    after it and a TRUNCATE, all written as compressed events, reach the copy; FINAL == source."""
    endpoint, conn = source
    _seed(conn, "orders", "items")
    tables = [{"source_database": DB, "source_table": t, "target_database": TARGET} for t in ("orders", "items")]
    run_cdc_bootstrap(CdcBootstrapSpec(sources=one_server(endpoint), target=endpoints[1], pipeline="zc", channels=2,
                                       tableset=TableSet(tables=tables)), spark)
    apply = CdcApplySpec(sources=one_server(endpoint), target=endpoints[1], pipeline="zc", lanes=2,
                         verify_after_ddl=False)
    run_cdc_apply(apply, spark)
    start = current_position(conn)
    sql(conn, f"UPDATE {DB}.orders SET note = CONCAT(note, ' changed'), amount = amount + 1 WHERE id <= 100",
        f"INSERT INTO {DB}.orders (id, note, amount, n) VALUES (5001, 'new one', 12.5, 1)",
        f"INSERT INTO {DB}.orders (id, note) VALUES (5002, 'new two')",
        f"DELETE FROM {DB}.orders WHERE id BETWEEN 900 AND 950")
    rows_only = current_position(conn)
    sql(conn, f"ALTER TABLE {DB}.orders ADD COLUMN c INT NOT NULL DEFAULT 7",
        f"UPDATE {DB}.orders SET c = 8 WHERE id <= 10",
        f"TRUNCATE TABLE {DB}.items",
        f"INSERT INTO {DB}.items (id, note) VALUES (1, 'after the truncate'), (2, 'another')")
    stop = current_position(conn)
    kinds = _kinds(endpoint, start, stop)
    # what the test is about: the server really wrote compressed events, and only those
    assert {"Write_rows_compressed_v1", "Update_rows_compressed_v1", "Delete_rows_compressed_v1",
            "Query_compressed"} <= set(kinds)
    assert not {"Write_rows_v1", "Update_rows_v1", "Delete_rows_v1"} & set(kinds), kinds

    result = run_cdc_apply(apply, spark)
    assert result["events"] == 100 + 2 + 51 + 10 + 2 and result["ddl"] == 2, result
    assert assert_same_rows(conn, ch, DB, "orders", TARGET) == 1000 + 2 - 51
    assert assert_same_rows(conn, ch, DB, "items", TARGET) == 2
    assert ch.command(f"SELECT countIf(c = 7) FROM {TARGET}.orders FINAL") == 1000 + 2 - 51 - 10

    # versions are those of the compressed events in the file: each updated row's lies inside
    # the bytes of the Update_rows_compressed_v1 event that carried it
    events = list(backlog_events(endpoint, start, rows_only))
    spans = [(event_version(f, pos), event_version(f, end)) for f, pos, kind, end, _ in events
             if kind == "Update_rows_compressed_v1"]
    versions = [v for (v,) in ch.query(f"SELECT _version FROM {TARGET}.orders FINAL WHERE id BETWEEN 11 AND 100")
                .result_rows]
    assert len(versions) == 90 and all(any(lo < v < hi for lo, hi in spans) for v in versions), (spans, versions[:5])

    # a backlog of compressed events is split by their bytes; a compressed DDL keeps it whole
    assert sum(end - pos for _, pos, kind, end, _ in events if kind.startswith(("Write", "Update", "Delete"))) > 0
    assert split_backlog(events, 2, min_bytes=0)
    assert split_backlog(list(backlog_events(endpoint, start, stop)), 2, min_bytes=0) is None


def test_without_the_decoding_the_reader_stops_instead_of_skipping(source, monkeypatch):
    """The mutation of the shim, kept in the suite: with the compressed classes taken out of
    python-mysql-replication's event map they are unknown types again, and the reader stops at the
    first one, naming it and its position, where it used to read on and report nothing."""
    endpoint, conn = source
    _seed(conn, "plain")
    start = current_position(conn)
    sql(conn, f"UPDATE {DB}.plain SET n = n + 100 WHERE id <= 20")
    stop = current_position(conn)
    route = TableRoute(read_table_schema(conn, DB, "plain"), TARGET, "plain")

    def read():
        reader = BinlogReader(endpoint, start, {route.source: route}, HashRing(2, 16), server_id=4411)
        try:
            return reader.read(stop, 10_000, 30.0)
        finally:
            reader.close()

    assert read().events == 20  # decoded
    for code in library.COMPRESSED_EVENTS:
        monkeypatch.delitem(library.EVENT_MAP, code)
    with pytest.raises(BinlogError, match=rf"binlog {start.file}:\d+: event type 167 \(Update_rows_compressed_v1\), "
                                          r"which python-mysql-replication 1\.0\.17 does not decode.*"
                                          r"A retry stops here again"):
        read()

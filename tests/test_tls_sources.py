"""Production-shaped sources (issue 41): a MariaDB that takes TLS connections only, least-privileged
accounts created REQUIRE SSL / REQUIRE X509, a read-only server, an HTTPS ClickHouse with mutual
TLS (tests/tls_source.py). Every driver the product opens a source connection with is tried in
each TLS mode, refusals must name the server, the mode and the cause, and the jobs run end to end
from the command line with TLS in the URLs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pymysqlreplication import BinLogStreamReader

from airflow_sync_provider.core.cdc.binlog.preflight import preflight
from airflow_sync_provider.core.clickhouse.client import client
from airflow_sync_provider.core.endpoints import MySQLEndpoint
from airflow_sync_provider.core.jobspec import FullLoadSpec
from airflow_sync_provider.core.positions import BinlogError, ensure_fence
from airflow_sync_provider.core.source import reader
from airflow_sync_provider.core.source.group import one_server
from airflow_sync_provider.core.tls import SourceRefused
from tests.helpers import assert_same_rows, recreate_tables
from tests.tls_source import OTHER_HOST, PASSWORD

pytestmark = pytest.mark.slow
CLI = str(Path(sys.executable).parent / "airflow-sync")
DB = "tls_db"


def _pymysql(endpoint):
    with reader.connect(endpoint) as conn, conn.cursor() as cur:
        cur.execute("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
        return cur.fetchone()[1]


def _mysqlclient(endpoint):
    conn = reader.stream_connect(endpoint)
    try:
        cur = conn.cursor()
        cur.execute("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
        return cur.fetchall()[0][1]
    finally:
        conn.close()


def _binlog(endpoint):
    """The binlog stream's two connections (control and dump); the server is TLS-only, so a
    connection it accepts is encrypted."""
    stream = BinLogStreamReader(**endpoint.replication_args(), server_id=7_700_001, blocking=False)
    try:
        stream.fetchone()
        return "accepted by a TLS-only server"
    finally:
        stream.close()


PATHS = {"pymysql": _pymysql, "mysqlclient": _mysqlclient, "binlog stream": _binlog}


@pytest.mark.parametrize("path", PATHS)
def test_every_driver_speaks_each_mode_and_a_refusal_names_server_mode_and_cause(tls, mysql_url, path):
    """The modes through every path: VERIFY_CA passes a host its certificate does not name,
    VERIFY_IDENTITY refuses it; a CA that did not sign the certificate, a server without TLS, an
    account REQUIRE SSL reached without TLS and one REQUIRE X509 without a certificate are refused,
    each with the host:port, the mode and the cause, as a stop a retry does not pass."""
    connect = PATHS[path]
    assert connect(tls.endpoint("sync_x509", "VERIFY_IDENTITY", client_cert=True))
    assert connect(tls.endpoint("sync", "REQUIRED"))
    assert connect(tls.endpoint("sync", "PREFERRED"))  # the server offers TLS: it is used
    assert connect(tls.endpoint("sync", "VERIFY_CA", host=OTHER_HOST))
    plain = MySQLEndpoint.from_url(mysql_url)  # the session's MariaDB has no TLS at all
    refused = {
        "host name mismatch": tls.endpoint("sync", "VERIFY_IDENTITY", host=OTHER_HOST),
        "unknown CA": tls.endpoint("sync", "VERIFY_CA", ca=tls.certs.other_ca),
        "the server does not offer TLS": MySQLEndpoint.from_url(mysql_url + "?ssl_mode=REQUIRED"),
        "access denied over a connection without TLS": tls.endpoint("sync", "DISABLED"),
        "REQUIRE X509": tls.endpoint("sync_x509", "REQUIRED"),
    }
    for cause, endpoint in refused.items():
        with pytest.raises(SourceRefused) as caught:
            connect(endpoint)
        message = str(caught.value)
        assert f"{endpoint.host}:{endpoint.port} (ssl_mode={endpoint.ssl_mode}" in message and cause in message
        assert "A retry will not help" in message and not caught.value.retry_helps
        assert PASSWORD not in message
    for endpoint in (MySQLEndpoint.from_url(mysql_url + "?ssl_mode=PREFERRED"), plain):  # no TLS offered: plain
        assert connect(endpoint) == "" or path == "binlog stream"


def test_connectorx_is_never_given_a_source_that_asks_for_tls(tls, mysql_url):
    """connectorx 0.4.6 has no TLS: a TLS source is read by mysqlclient (auto), an explicit
    reader='native' is refused before anything connects."""
    from airflow_sync_provider.core.source.planning import Plan

    endpoint = tls.endpoint("sync", "VERIFY_CA")
    with pytest.raises(ValueError, match="connectorx cannot connect with TLS"):
        endpoint.connectorx_url(DB)
    with pytest.raises(ValueError, match=r"reader='native' \(connectorx\) cannot connect with TLS"):
        FullLoadSpec(sources=one_server(endpoint), target=tls.target(), source_database=DB, source_table="t",
                     target_database=DB, target_table="t", reader="native")
    plan = Plan(DB, "t", None, None, "balanced", 1, 1, ())
    choice, note = reader.choose_reader(endpoint, plan, [], [])
    assert choice == reader.MYSQLCLIENT and "asks for TLS (ssl_mode=VERIFY_CA)" in note
    with pytest.raises(ValueError, match="connectorx has no TLS"):
        reader.native_reader("native", endpoint, plan, [], [])
    marked = MySQLEndpoint.from_url(mysql_url + "?init_command=" + "SET @sync_marker = 41 %2B 1")
    batches = list(reader._native_stream(marked, "mysql", "SELECT CAST(@sync_marker AS CHAR) AS m", 10))
    assert [b.column(0).to_pylist() for b in batches if b.num_rows] == [["42"]]  # init_command ran first


def test_init_command_runs_on_every_pymysql_and_mysqlclient_connection(tls):
    endpoint = MySQLEndpoint.from_url(tls.url("sync", "VERIFY_IDENTITY") + "&init_command=SET+%40m+%3D+7")
    with reader.connect(endpoint) as conn, conn.cursor() as cur:
        cur.execute("SELECT @m")
        assert cur.fetchone()[0] == 7
    conn = reader.stream_connect(endpoint)
    cur = conn.cursor()
    cur.execute("SELECT @m")
    assert cur.fetchall()[0][0] in (7, "7", b"7")  # the text reader converts nothing
    conn.close()


def test_preflight_names_the_missing_grant_and_the_bootstrap_fence_stands_aside_when_read_only(tls):
    weak = tls.endpoint("no_repl", "VERIFY_IDENTITY")
    with reader.connect(weak) as conn:
        with pytest.raises(BinlogError, match=r"needs REPLICATION SLAVE: GRANT REPLICATION SLAVE ON \*\.\* TO "
                                              r"'no_repl'@'%'") as caught:
            preflight(conn, None, weak, 7_700_070)
        assert not caught.value.retry_helps
    tls.read_only(True)
    try:
        with reader.connect(tls.endpoint()) as conn:
            assert ensure_fence(conn, f"`{DB}`.`fence`") is None  # nothing is written to a read-only server
    finally:
        tls.read_only(False)


def _run(env, *args):
    done = subprocess.run([CLI, *args, "--json"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert PASSWORD not in done.stdout + done.stderr
    return json.loads(done.stdout)


ROWS = 6_000


def test_the_cli_flow_over_tls_as_the_least_privileged_user_on_a_read_only_server_ends_exact(tls):
    """From the command line, TLS in both URLs (VERIFY_IDENTITY; HTTPS with a CA and a client
    certificate), as ``sync`` (SELECT, REPLICATION SLAVE, BINLOG MONITOR; REQUIRE SSL), the
    password percent-encoded, on a server with read_only=ON: full load, reconcile --checksum,
    bootstrap, two CDC applies and a snapshot diff that applies changes all end with FINAL ==
    source. The writes meanwhile are root's, as a replica applies its primary's."""
    root = tls.root()
    for table in ("orders", "events"):
        recreate_tables(root, DB, f"CREATE TABLE {DB}.{table} (id BIGINT PRIMARY KEY, who VARCHAR(40) NOT NULL, "
                                  "amount DECIMAL(12,2) NULL, at DATETIME(3) NOT NULL, note TEXT NULL)")
        with root.cursor() as cur:
            cur.execute(f"INSERT INTO {DB}.{table} SELECT seq, CONCAT('naïve 😀 ', seq % 97), seq / 100, "
                        f"TIMESTAMPADD(SECOND, seq, '2025-01-01'), IF(seq % 5 = 0, NULL, REPEAT('n', seq % 30)) "
                        f"FROM {DB}.seq_1_to_{ROWS}")
    env = dict(os.environ, MYSQL_URL=tls.url("sync", "VERIFY_IDENTITY"), CLICKHOUSE_URL=tls.clickhouse_url)
    ch = client(tls.target())
    tls.read_only(True)
    try:
        load = _run(env, "load", "--table", "orders", "--load-key", "tls.orders")
        assert load["rows"] == ROWS and load["start_position"]  # its position read: BINLOG MONITOR suffices
        assert load["reader"].startswith("mysqlclient: the source asks for TLS")
        assert assert_same_rows(root, ch, DB, "orders") == ROWS
        checked = _run(env, "reconcile", "--load", "tls.orders", "--checksum")
        assert checked["verdict"] == "ok" and checked["checksum"]
        boot = _run(env, "cdc", "bootstrap", "--pipeline", "tls", "--table", f"{DB}.events", "--chunk-rows", "2500")
        assert boot["tables"][0]["rows"] == ROWS
        for round_ in range(2):
            with root.cursor() as cur:
                cur.execute(f"INSERT INTO {DB}.events VALUES ({ROWS + 1 + round_}, 'nouveau 🎉', NULL, NOW(3), NULL)")
                cur.execute(f"UPDATE {DB}.events SET note = CONCAT('r{round_} ', id) WHERE id % 89 = {round_}")
                cur.execute(f"DELETE FROM {DB}.events WHERE id % 301 = {round_}")
            applied = _run(env, "cdc", "apply", "--pipeline", "tls", "--lanes", "2")
            assert applied["events"] > 0
            assert_same_rows(root, ch, DB, "events")
        with root.cursor() as cur:
            cur.execute(f"UPDATE {DB}.orders SET amount = amount + 1 WHERE id % 500 = 0")
            cur.execute(f"DELETE FROM {DB}.orders WHERE id % 1000 = 7")
            cur.execute(f"INSERT INTO {DB}.orders VALUES ({ROWS + 1}, 'late', 1.5, NOW(3), 'x')")
        diff = _run(env, "diff", "--old", f"{DB}.orders", "--table", f"{DB}.orders", "--apply")
        assert {k: v for k, v in diff["counts"].items() if k != "identical"} == \
            {"changed": ROWS // 500, "new": 1, "deleted": ROWS // 1000}
        assert assert_same_rows(root, ch, DB, "orders") == ROWS + 1 - ROWS // 1000
    finally:
        tls.read_only(False)
        ch.close()
        root.close()

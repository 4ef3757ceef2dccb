import pymysql
import pytest

from devenv.mariadb import BINLOG_SETTINGS


def test_binlog_settings_for_cdc(mysql_conn):
    with mysql_conn.cursor() as cur:
        cur.execute("SHOW VARIABLES WHERE Variable_name IN "
                    "('log_bin', 'binlog_format', 'binlog_row_image', 'binlog_row_metadata', 'server_id')")
        values = dict(cur.fetchall())
    assert values == {"log_bin": "ON", "binlog_format": "ROW", "binlog_row_image": "FULL",
                      "binlog_row_metadata": "FULL", "server_id": BINLOG_SETTINGS["server_id"]}


def test_binlog_records_row_events(mysql_conn):
    with mysql_conn.cursor() as cur:
        cur.execute("CREATE DATABASE IF NOT EXISTS fixture_check")
        cur.execute("CREATE TABLE IF NOT EXISTS fixture_check.t (id INT PRIMARY KEY)")
        cur.execute("SHOW BINLOG STATUS")
        file, position = cur.fetchone()[:2]
        cur.execute("INSERT INTO fixture_check.t VALUES (1) ON DUPLICATE KEY UPDATE id = id")
        cur.execute("SHOW BINLOG EVENTS IN %s FROM %s", (file, position))
        events = [row[2] for row in cur.fetchall()]
    assert any(e.startswith("Write_rows") for e in events), events


def test_wrong_password_is_refused(mysql_url):
    from airflow_sync_provider.core.endpoints import MySQLEndpoint
    endpoint = MySQLEndpoint.from_url(mysql_url)
    with pytest.raises(pymysql.err.OperationalError):
        pymysql.connect(host=endpoint.host, port=endpoint.port, user=endpoint.user, password="wrong")

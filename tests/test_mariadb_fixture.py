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


def test_the_comparison_reads_a_large_table_as_it_reads_a_small_one(mysql_conn, monkeypatch):
    """tests/helpers.source_rows reads a large table of plain types through mysqlclient (faster):
    both readers give the same values for each of those types, edge values and NULLs included."""
    from tests import helpers

    with mysql_conn.cursor() as cur:
        cur.execute("SET SESSION sql_mode = ''")  # zero dates, as some sources have them
        cur.execute("CREATE DATABASE IF NOT EXISTS fixture_check")
        cur.execute("DROP TABLE IF EXISTS fixture_check.plain")
        cur.execute("CREATE TABLE fixture_check.plain (id BIGINT UNSIGNED PRIMARY KEY, t TINYINT, s SMALLINT UNSIGNED,"
                    " m MEDIUMINT, i INT, d DECIMAL(30,10), dbl DOUBLE, f FLOAT, c CHAR(4), v VARCHAR(20)"
                    " CHARACTER SET utf8mb4 COLLATE utf8mb4_bin, tt TINYTEXT, tx TEXT, mt MEDIUMTEXT, lt LONGTEXT,"
                    " dt DATE, dtt DATETIME(6), ts TIMESTAMP(3) NULL)")
        cur.execute("INSERT INTO fixture_check.plain VALUES"
                    " (18446744073709551615, -128, 65535, -8388608, -2147483648, -12345678901234567890.0123456789,"
                    "  -1.7976931348623157e308, 1.17549435e-38, '', 'é😀\\t', 'a', NULL, '', REPEAT('x', 70000),"
                    "  '0000-00-00', '0000-00-00 00:00:00', NULL),"
                    " (1, 127, 0, 0, 2147483647, 0.0000000001, 5e-324, -3.4e38, 'abcd', '', NULL, 'ß', NULL, NULL,"
                    "  '1000-01-01', '9999-12-31 23:59:59.999999', '2038-01-19 03:14:07.999'),"
                    " (2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, '', '', 'm', 'l',"
                    "  NULL, '2024-02-29 12:00:00.000001', '1970-01-01 00:00:01')")
    small = helpers.source_rows(mysql_conn, "fixture_check", "plain")
    monkeypatch.setattr(helpers, "LARGE", 0)
    calls = []
    import MySQLdb

    real = MySQLdb.connect
    monkeypatch.setattr(MySQLdb, "connect", lambda **kw: calls.append(kw) or real(**kw))
    large = helpers.source_rows(mysql_conn, "fixture_check", "plain")
    assert calls, "the large table was not read through mysqlclient"
    assert large == small and len(small) == 3
    assert small[(2,)][11] == "" and small[(1,)][14] is not None and small[(18446744073709551615,)][14] is None

"""The full-load Spark job through spark-submit (local[2]) on a table of every mapped type."""

from __future__ import annotations

import dataclasses
import time

import pytest

from airflow_sync_provider.core.clickhouse import ddl, publishing
from airflow_sync_provider.core.clickhouse.ddl import create_table_sql, create_working, create_working_sql
from airflow_sync_provider.core.clickhouse.described import table_exists
from airflow_sync_provider.core.clickhouse.publishing import publish_working
from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
from airflow_sync_provider.core.jobspec import FullLoadSpec
from airflow_sync_provider.core.source.group import one_server
from airflow_sync_provider.core.sql import ch_ident
from airflow_sync_provider.core.submission import spark_submit
from tests.helpers import assert_same_rows

pytestmark = pytest.mark.slow

TYPES_DDL = """
CREATE TABLE types_matrix (
  id BIGINT UNSIGNED NOT NULL PRIMARY KEY,
  i8 TINYINT NULL, u8 TINYINT UNSIGNED NULL, i16 SMALLINT NULL, u24 MEDIUMINT UNSIGNED NULL,
  i32 INT NULL, u32 INT UNSIGNED NULL, i64 BIGINT NULL,
  d12 DECIMAL(12, 2) NULL, d65 DECIMAL(65, 30) NULL, f FLOAT NULL, g DOUBLE NULL,
  dt DATE NULL, ts0 DATETIME NULL, ts6 DATETIME(6) NULL, tstz TIMESTAMP(3) NULL,
  s VARCHAR(64) NULL, txt TEXT NULL, e ENUM('a', 'b', 'c') NULL, st SET('x', 'y') NULL,
  j JSON NULL, b BIT(12) NULL, bin VARBINARY(16) NULL, bl BLOB NULL, tm TIME(3) NULL, y YEAR NULL,
  flag BOOLEAN NULL
) DEFAULT CHARSET = utf8mb4
"""
ROWS = [
    "(0, -128, 255, -32768, 16777215, -2147483648, 4294967295, -9223372036854775808, -9999999999.99,"
    " '-12345678901234567890123456789012345.123456789012345678901234567890', -1.5, -2.25e300,"
    " '1970-01-01', '1999-12-31 23:59:59', '2000-01-01 00:00:00.000001', '2038-01-19 03:14:07.999',"
    " 'it''s \\\\ 🙂', REPEAT('x', 5000), 'a', 'x,y', '{\"k\": [1, 2]}', b'101010101010', X'00FF10', X'DEADBEEF',"
    " '-838:59:59.000', 1901, TRUE)",
    "(18446744073709551615, 127, 0, 32767, 0, 2147483647, 0, 9223372036854775807, 9999999999.99,"
    " '99999999999999999999999999999999999.999999999999999999999999999999', 3.25, 1e-300,"
    " '2299-12-31', '2106-02-07 06:28:15', '2299-12-31 23:59:59.999999', '1970-01-01 00:00:01.000',"
    " '', '', 'c', '', '[]', b'0', X'', X'', '00:00:00.001', 2155, FALSE)",
    "(5" + ", NULL" * 26 + ")",
    # FLOAT values MariaDB prints with 6 digits (123456792 → 1.23457e8), DOUBLEs both sides print
    # in different notations (1e20, 1.5e-7, -0)
    "(6" + ", NULL" * 9 + ", 123456789.125, 1e20" + ", NULL" * 15 + ")",
    "(7" + ", NULL" * 9 + ", 0.1, 1.5e-7" + ", NULL" * 15 + ")",
    "(8" + ", NULL" * 9 + ", 3.4028234e38, -0.0" + ", NULL" * 15 + ")",
    "(9" + ", NULL" * 9 + ", -1.17549435e-38, 5e-324" + ", NULL" * 15 + ")",
]


@pytest.mark.parametrize("reader, driver_copy_rows", [("auto", None), ("mysqlclient", 0)])
def test_every_mapped_type_is_copied_exactly(mysql_url, clickhouse_url, mysql_conn, ch, reader, driver_copy_rows):
    """Both readers (the Arrow-native default and the mysqlclient fallback) through spark-submit,
    the channels as threads of the driver (the default on a local master) and as Spark tasks."""
    with mysql_conn.cursor() as cur:
        cur.execute("CREATE DATABASE IF NOT EXISTS job_types")
        cur.execute("USE job_types")
        cur.execute("DROP TABLE IF EXISTS types_matrix")
        cur.execute(TYPES_DDL)
        cur.execute("INSERT INTO types_matrix VALUES " + ", ".join(ROWS))
    spec = FullLoadSpec(sources=one_server(MySQLEndpoint.from_url(mysql_url)),
                        target=ClickHouseEndpoint.from_url(clickhouse_url), source_database="job_types",
                        source_table="types_matrix", target_database="job_types_ch", target_table="types_matrix",
                        channels=2, batch_rows=1, reader=reader, driver_copy_rows=driver_copy_rows,
                        load_key=f"types-{reader}")
    result = spark_submit(spec, timeout=600)
    assert result["status"] == "success", result
    assert result["reader"].startswith("Arrow-native" if reader == "auto" else "mysqlclient"), result["reader"]
    assert result["rows"] == len(ROWS) and sum(s["records_written"] for s in result["per_shard"]) == len(ROWS)
    assert_same_rows(mysql_conn, ch, "job_types", "types_matrix", target_database="job_types_ch")


LOADED = ["we`ird tab'le ñ", "varchar_ci_pad", "emoji_4byte", "binary_key", "composite_pk", "no_index",
          "nullable_key", "decimal_65_30", "quoted_values"]


@pytest.mark.parametrize("strategy, tables, reader", [
    ("balanced", LOADED, "auto"), ("equal", ["decimal_65_30", "composite_pk", "nullable_key"], "mysqlclient")])
def test_adversarial_tables_load_row_for_row(matrix, mysql_url, clickhouse_url, ch, strategy, tables, reader):
    """Shards from the planner feed the real load: every row arrives once (no_index: a MergeTree copy)."""
    from tests.adversarial import DB, SPLIT

    for name in tables:
        spec = FullLoadSpec(sources=one_server(MySQLEndpoint.from_url(mysql_url)),
                            target=ClickHouseEndpoint.from_url(clickhouse_url), source_database=DB,
                            source_table=name, target_database=f"{DB}_{strategy}", target_table=name, channels=2,
                            split_column=SPLIT.get(name), strategy=strategy, reader=reader)
        result = spark_submit(spec, timeout=600)
        assert result["status"] == "success", (name, result)
        total = assert_same_rows(matrix, ch, DB, name, target_database=f"{DB}_{strategy}")
        assert result["rows"] == total and ch.command(
            f"SELECT count() FROM `{DB}_{strategy}`.{ch_ident(name)}") == total  # raw rows: no duplicates


def test_zero_and_out_of_range_dates_fail_naming_the_column(mysql_conn, mysql_url, clickhouse_url):
    with mysql_conn.cursor() as cur:
        cur.execute("CREATE DATABASE IF NOT EXISTS job_types")
        cur.execute("SET SESSION sql_mode = ''")  # MySQL lets such rows in under a lax sql_mode
        for name, ddl, row, why in [
            ("zero_date", "d DATE NOT NULL", "'0000-00-00'", "zero or invalid dates"),
            ("old_date", "d DATETIME NOT NULL", "'1000-01-01 00:00:00'", "outside ClickHouse's"),
        ]:
            cur.execute(f"DROP TABLE IF EXISTS job_types.{name}")
            cur.execute(f"CREATE TABLE job_types.{name} (id INT PRIMARY KEY, {ddl})")
            cur.execute(f"INSERT INTO job_types.{name} VALUES (1, {row})")
            spec = FullLoadSpec(sources=one_server(MySQLEndpoint.from_url(mysql_url)),
                                target=ClickHouseEndpoint.from_url(clickhouse_url), source_database="job_types",
                                source_table=name, target_database="job_types_ch", target_table=name,
                                load_key=f"test.{name}")
            result = spark_submit(spec, timeout=600)
            assert result["status"] == "failed"
            error = result["error"]
            assert f"job_types.{name}" in error and "column 'd'" in error and why in error, error


class PanicException(BaseException):
    """Stands in for pyo3's PanicException (connectorx panics on values it cannot decode)."""


def test_a_native_reader_failure_mid_shard_is_read_again_with_mysqlclient(mysql_conn, mysql_url, clickhouse_url, ch,
                                                                           monkeypatch):
    """connectorx fails after a shard's first batch was written: the shard is cleared and read
    again by mysqlclient; the copy is exact and counts no row twice. In the driver (no Spark)."""
    import connectorx

    from airflow_sync_provider.spark.full_load import run_full_load

    with mysql_conn.cursor() as cur:
        cur.execute("CREATE DATABASE IF NOT EXISTS job_types")
        cur.execute("CREATE OR REPLACE TABLE job_types.flaky (id INT PRIMARY KEY, v DECIMAL(12, 2), s VARCHAR(20))")
        cur.execute("INSERT INTO job_types.flaky SELECT seq, seq / 7, CONCAT('s', seq) FROM job_types.seq_1_to_5000")
    real = connectorx.read_sql
    calls = []

    class FailsAfterOneBatch:
        def __init__(self, stream):
            self.stream, self.sent = stream, 0

        def read_next_batch(self):
            if self.sent:
                raise PanicException("Could not retrieve `Decimal`: a stand-in failure")
            self.sent += 1
            return self.stream.read_next_batch()

        def close(self):
            self.stream.close()

    def read_sql(url, query, **kwargs):
        calls.append("probe" if "LIMIT" in query else "shard")
        stream = real(url, query, **kwargs)
        return FailsAfterOneBatch(stream) if calls.count("shard") == 1 and calls[-1] == "shard" else stream

    monkeypatch.setattr(connectorx, "read_sql", read_sql)
    spec = FullLoadSpec(sources=one_server(MySQLEndpoint.from_url(mysql_url)),
                        target=ClickHouseEndpoint.from_url(clickhouse_url), source_database="job_types",
                        source_table="flaky", target_database="job_types_ch", target_table="flaky", channels=1,
                        split_factor=2, batch_rows=1000, load_key="test.flaky")
    result = run_full_load(spec, None)
    assert result["reader"].startswith("Arrow-native")
    assert calls.count("shard") >= 2  # the failed shard went to mysqlclient, the others stayed native
    assert result["rows"] == 5000 and sum(s["records_read"] for s in result["per_shard"]) == 5000
    assert assert_same_rows(mysql_conn, ch, "job_types", "flaky", target_database="job_types_ch") == 5000
    assert ch.command("SELECT count() FROM job_types_ch.flaky") == 5000  # raw rows: nothing doubled


def test_the_probe_falls_back_when_the_native_reader_disagrees(mysql_conn, mysql_url, clickhouse_url, ch, monkeypatch):
    """A native read that differs from mysqlclient's on the first rows is not used."""
    import pyarrow as pa

    from airflow_sync_provider.core.source import reader
    from airflow_sync_provider.spark.full_load import run_full_load

    real = reader._native_stream

    def off_by_one(*args, **kwargs):
        for batch in real(*args, **kwargs):
            yield batch.set_column(0, batch.schema.field(0),
                                   pa.compute.add(batch.column(0), pa.scalar(1, batch.column(0).type)))

    monkeypatch.setattr(reader, "_native_stream", off_by_one)
    with mysql_conn.cursor() as cur:
        cur.execute("CREATE DATABASE IF NOT EXISTS job_types")
        cur.execute("CREATE OR REPLACE TABLE job_types.probed (id INT PRIMARY KEY, s VARCHAR(20))")
        cur.execute("INSERT INTO job_types.probed SELECT seq, CONCAT('s', seq) FROM job_types.seq_1_to_300")
    spec = FullLoadSpec(sources=one_server(MySQLEndpoint.from_url(mysql_url)),
                        target=ClickHouseEndpoint.from_url(clickhouse_url), source_database="job_types",
                        source_table="probed", target_database="job_types_ch", target_table="probed",
                        load_key="test.probed")
    result = run_full_load(spec, None)
    assert result["reader"] == "the native reader read the first rows differently from mysqlclient (3 tries)"
    assert assert_same_rows(mysql_conn, ch, "job_types", "probed", target_database="job_types_ch") == 300
    # a difference once (a writer changed a row between the two reads) is looked at again
    calls = []

    def off_once(*args, **kwargs):
        calls.append(1)
        yield from (off_by_one if len(calls) == 1 else real)(*args, **kwargs)

    monkeypatch.setattr(reader, "_native_stream", off_once)
    result = run_full_load(dataclasses.replace(spec, load_key="test.probed.2"), None)
    assert result["reader"].startswith("Arrow-native (connectorx, binary protocol); 300 probe rows equal"), result
    assert assert_same_rows(mysql_conn, ch, "job_types", "probed", target_database="job_types_ch") == 300


def _working_and_live(mysql_conn, ch, source_table: str, database: str):
    """The schema of a fresh source table ``job_types.<source_table>`` (id INT key, v INT), and
    ``database`` on the target without its ``work`` and ``live`` tables."""
    from airflow_sync_provider.core.source.schema import read_table_schema

    with mysql_conn.cursor() as cur:
        cur.execute("CREATE DATABASE IF NOT EXISTS job_types")
        cur.execute(f"CREATE OR REPLACE TABLE job_types.{source_table} (id INT PRIMARY KEY, v INT)")
    ch.command(f"CREATE DATABASE IF NOT EXISTS {database}")
    for table in ("work", "live"):
        ch.command(f"DROP TABLE IF EXISTS {database}.{table}")
    return read_table_schema(mysql_conn, "job_types", source_table)


def test_publishing_again_after_a_crash_between_swap_and_drop_keeps_the_new_copy(mysql_conn, ch):
    """The working table holds the old copy after the swap: a resumed publish drops it instead
    of swapping the old copy back in."""
    from airflow_sync_provider.core.clickhouse.publishing import publish_working
    schema = _working_and_live(mysql_conn, ch, "swapped", "job_swap")
    ch.command(create_working_sql(schema, "job_swap", "work", False, True))
    ch.command("INSERT INTO job_swap.work (id, v) SELECT number, 1 FROM numbers(5)")  # the new copy
    ch.command(create_table_sql(schema, "job_swap", "live"))
    ch.command("INSERT INTO job_swap.live (id, v) SELECT number, 0 FROM numbers(3)")  # the old copy
    ch.command("EXCHANGE TABLES job_swap.work AND job_swap.live")  # ... and the job died here
    assert publish_working(ch, "job_swap", "work", "job_swap", "live") == 5
    assert ch.query("SELECT count(), min(v) FROM job_swap.live").result_rows == [(5, 1)]
    assert not table_exists(ch, "job_swap", "work")


def test_a_working_table_defers_its_merges_until_it_is_published(mysql_conn, ch):
    """Filled in many inserts, it keeps its parts (no merge rewrites rows that are still
    arriving); once swapped in, the copy has the server's default and merges them."""
    schema = _working_and_live(mysql_conn, ch, "deferred", "job_defer")
    create_working(ch, schema, "job_defer", "work", False, True)
    for i in range(8):
        ch.command(f"INSERT INTO job_defer.work (id, v) SELECT number + {i * 1000}, 1 FROM numbers(1000)")

    def parts(table):
        return int(ch.command("SELECT count() FROM system.parts WHERE database = 'job_defer' AND table = "
                              f"'{table}' AND active"))

    time.sleep(3)  # the merge selector looks every few seconds: it has had its chance
    assert parts("work") == 8
    assert publish_working(ch, "job_defer", "work", "job_defer", "live") == 8000
    assert "min_parts_to_merge_at_once" not in ch.command("SHOW CREATE TABLE job_defer.live")
    deadline = time.monotonic() + 60
    while parts("live") > 1 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert parts("live") < 8, "the published copy did not merge its parts"
    assert ch.query("SELECT count(), uniqExact(id) FROM job_defer.live").result_rows == [(8000, 8000)]


def test_a_server_that_does_not_know_the_deferral_setting_gets_the_working_table_as_it_is(mysql_conn, ch,
                                                                                         monkeypatch):
    """(An older ClickHouse; a user without ALTER MODIFY SETTING takes the same branch.)"""
    schema = _working_and_live(mysql_conn, ch, "undeferred", "job_nodefer")
    for module in (ddl, publishing):  # where the working table is made, and where it is published
        monkeypatch.setattr(module, "DEFER_MERGES", {"a_setting_this_server_lacks": 64})
    create_working(ch, schema, "job_nodefer", "work", False, True)
    ch.command("INSERT INTO job_nodefer.work (id, v) SELECT number, 1 FROM numbers(10)")
    assert publish_working(ch, "job_nodefer", "work", "job_nodefer", "live") == 10
    assert ch.query("SELECT count(), uniqExact(id) FROM job_nodefer.live").result_rows == [(10, 10)]

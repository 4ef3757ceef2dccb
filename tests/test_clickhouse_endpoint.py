"""clickhouse-connect's client API against the ClickHouse endpoint (chDB stand-in or CLICKHOUSE_URL)."""

from __future__ import annotations

import decimal
import subprocess
import sys
import textwrap
import uuid

import clickhouse_connect
import pyarrow as pa
import pytest
from clickhouse_connect.driver.exceptions import DatabaseError

from airflow_sync_provider.core.endpoints import ClickHouseEndpoint

ROWS = 200_000  # more than one clickhouse-connect block (and several compressed frames)


def client_for(url, compress):
    return clickhouse_connect.get_client(**ClickHouseEndpoint.from_url(url).client_args(), compress=compress)


@pytest.fixture
def table(ch):
    name = f"t_{uuid.uuid4().hex[:8]}"
    ch.command(f"CREATE TABLE {name} (id UInt64, s String, d Decimal(12, 2), n Nullable(Float64))"
               " ENGINE = MergeTree ORDER BY id")
    yield name
    ch.command(f"DROP TABLE IF EXISTS {name}")


@pytest.mark.parametrize("compress", [False, True, "lz4", "zstd", "gzip"])
def test_insert_and_query_many_blocks(clickhouse_url, table, compress):
    client = client_for(clickhouse_url, compress)
    rows = [[i, f"s{i}", decimal.Decimal(i) / 100, None if i % 3 else i / 7] for i in range(ROWS)]
    summary = client.insert(table, rows, column_names=["id", "s", "d", "n"])
    assert summary.written_rows == ROWS
    arrow = pa.table({
        "id": pa.array(range(ROWS, 2 * ROWS), pa.uint64()),
        "s": pa.array([f"a{i}" for i in range(ROWS)]),
        "d": pa.array([decimal.Decimal("1.25")] * ROWS, pa.decimal128(12, 2)),
        "n": pa.array([None] * ROWS, pa.float64()),
    })
    client.insert_arrow(table, arrow)
    count, id_sum, d_sum, nulls = client.query(f"SELECT count(), sum(id), sum(d), countIf(n IS NULL) FROM {table}"
                                               ).result_rows[0]
    assert count == 2 * ROWS
    assert id_sum == sum(range(2 * ROWS))
    assert d_sum == sum(decimal.Decimal(i) / 100 for i in range(ROWS)) + decimal.Decimal("1.25") * ROWS
    assert nulls == ROWS + sum(1 for i in range(ROWS) if i % 3)

    back = client.query_arrow(f"SELECT id, s FROM {table} WHERE id >= {{lo:UInt64}} ORDER BY id",
                              parameters={"lo": ROWS})
    assert back.num_rows == ROWS and back.column("s")[0].as_py() == "a0"
    df = client.query_df(f"SELECT id, d FROM {table} WHERE id < 5 ORDER BY id")
    assert list(df["id"]) == [0, 1, 2, 3, 4]
    streamed = 0
    with client.query_column_block_stream(f"SELECT id FROM {table}") as stream:
        for block in stream:
            streamed += len(block[0])
    assert streamed == 2 * ROWS
    client.close()


def test_server_side_parameters_and_command(ch):
    assert ch.command("SELECT {a:UInt32} + {b:UInt32}", parameters={"a": 40, "b": 2}) == 42
    result = ch.query("SELECT {s:String} AS s, {d:Date} AS d", parameters={"s": "it's \\ 🙂", "d": "2025-01-02"})
    assert result.result_rows[0][0] == "it's \\ 🙂"
    assert str(result.result_rows[0][1]) == "2025-01-02"
    ch.command("CREATE DATABASE IF NOT EXISTS `we``ird db`")
    ch.command("CREATE TABLE IF NOT EXISTS `we``ird db`.t (x UInt8) ENGINE = Memory")
    ch.command("INSERT INTO `we``ird db`.t VALUES (1), (2)")
    assert ch.command("SELECT sum(x) FROM `we``ird db`.t") == 3
    ch.command("DROP DATABASE `we``ird db`")


def test_parameters_too_long_for_a_url_travel_as_form_fields(ch):
    """clickhouse-connect sends the query and its parameters as multipart/form-data when they
    would make the URL too long (the Sync view looks up a page's load keys so)."""
    keys = [f"dag.task.manual__2026-01-05T00:00:00+00:00:db.table_{i:04d} 'q' \\ ü" for i in range(2_000)]
    rows = ch.query("SELECT length({k:Array(String)}), {k:Array(String)}[2000], {n:UInt32}",
                    parameters={"k": keys, "n": 7}).result_rows
    assert rows == [(2_000, keys[-1], 7)]


def test_database_setting_is_per_client(clickhouse_url, ch):
    ch.command("CREATE DATABASE IF NOT EXISTS other_db")
    other = clickhouse_connect.get_client(**ClickHouseEndpoint.from_url(clickhouse_url).client_args(),
                                          database="other_db")
    assert other.command("SELECT currentDatabase()") == "other_db"
    assert ch.command("SELECT currentDatabase()") == "default"  # the other client's database did not leak


def test_errors_are_database_errors_with_the_engine_message(ch):
    with pytest.raises(DatabaseError) as err:
        ch.query("SELECT * FROM no_such_table_xyz")
    assert "no_such_table_xyz" in str(err.value) and "60" in str(err.value)
    with pytest.raises(DatabaseError) as err:
        ch.command("SELECT toUInt8('not a number')")
    assert "DB::Exception" in str(err.value)


WRITER = textwrap.dedent("""
    import sys, clickhouse_connect, pyarrow as pa
    host, port, table, start, n = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    c = clickhouse_connect.get_client(host=host, port=port, compress="lz4")
    for lo in range(start, start + n, 10_000):
        ids = range(lo, min(lo + 10_000, start + n))
        c.insert_arrow(table, pa.table({"id": pa.array(ids, pa.uint64()), "s": pa.array([str(i) for i in ids]),
                                        "d": pa.array([0] * len(ids), pa.decimal128(12, 2)),
                                        "n": pa.array([None] * len(ids), pa.float64())}))
""")


def test_two_processes_write_concurrently(clickhouse_url, ch, table):
    endpoint = ClickHouseEndpoint.from_url(clickhouse_url)
    n = 100_000
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, endpoint.host, str(endpoint.port), table,
                               str(i * n), str(n)]) for i in range(2)]
    assert [p.wait(120) for p in procs] == [0, 0]
    count, distinct, lo, hi = ch.query(f"SELECT count(), uniqExact(id), min(id), max(id) FROM {table}").result_rows[0]
    assert (count, distinct, lo, hi) == (2 * n, 2 * n, 0, 2 * n - 1)


def test_set_lasts_for_the_session_and_does_not_leak(clickhouse_url, ch):
    other = client_for(clickhouse_url, False)
    baseline = ch.command("SELECT getSetting('max_block_size')")
    other.command("SET max_block_size = 1234")
    assert other.command("SELECT getSetting('max_block_size')") == 1234  # same HTTP session keeps it
    assert ch.command("SELECT getSetting('max_block_size')") == baseline  # another session does not see it
    other.close()

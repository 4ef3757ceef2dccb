"""Fast unit and property tests of the core (no services)."""

from __future__ import annotations

import json
import os
import stat

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
from airflow_sync_provider.core.jobspec import FullLoadSpec
from airflow_sync_provider.core.source.group import one_server
from airflow_sync_provider.core.specfile import public_dict, read_spec, write_spec
from airflow_sync_provider.core.sql import ch_ident, mysql_ident
from airflow_sync_provider.core.typemap import MySQLColumn, UnsupportedType, map_column


def col(data_type, column_type=None, nullable=False, **kw):
    return MySQLColumn("c", data_type, column_type or data_type, nullable, **kw)


@pytest.mark.parametrize("column, ch_type, arrow_type", [
    (col("bigint", "bigint(20) unsigned"), "UInt64", pa.uint64()),
    (col("int"), "Int32", pa.int32()),
    (col("mediumint", "mediumint unsigned"), "UInt32", pa.uint32()),
    (col("tinyint", "tinyint(1)"), "Int8", pa.int8()),
    (col("decimal", precision=12, scale=2), "Decimal(12, 2)", pa.decimal128(12, 2)),
    (col("decimal", precision=65, scale=30), "Decimal(65, 30)", pa.decimal256(65, 30)),
    (col("double", nullable=True), "Nullable(Float64)", pa.float64()),
    (col("float"), "Float32", pa.float32()),
    (col("datetime", fsp=6), "DateTime64(6, 'UTC')", pa.timestamp("us")),
    (col("timestamp", fsp=0), "DateTime64(0, 'UTC')", pa.timestamp("us")),
    (col("date"), "Date32", pa.date32()),
    (col("varchar", "varchar(10)"), "String", pa.string()),
    (col("enum", "enum('a','b')"), "String", pa.string()),
    (col("json"), "String", pa.string()),
    (col("varbinary", "varbinary(8)"), "String", pa.binary()),
    (col("bit", "bit(3)"), "UInt64", pa.uint64()),
    (col("time", fsp=3), "String", pa.string()),
])
def test_type_mapping(column, ch_type, arrow_type):
    mapping = map_column(column)
    assert (mapping.ch_type, mapping.arrow_type) == (ch_type, arrow_type)


def test_unsupported_type_names_table_and_column():
    with pytest.raises(UnsupportedType, match=r"table db\.t, column 'c'.*inet6"):
        map_column(col("inet6"), "db.t")


@given(st.text(min_size=1).filter(lambda s: "\x00" not in s))
def test_identifier_quoting_round_trips(name):
    quoted = mysql_ident(name)
    assert quoted[0] == quoted[-1] == "`" and quoted[1:-1].replace("``", "`") == name
    ch = ch_ident(name)
    assert ch[1:-1].replace("\\`", "`").replace("\\\\", "\\") == name


def test_endpoints_parse_and_hide_passwords():
    m = MySQLEndpoint.from_url("mysql://u%40x:p%3Aw@db.example:3307/shop")
    assert (m.user, m.password, m.host, m.port, m.database) == ("u@x", "p:w", "db.example", 3307, "shop")
    assert "p:w" not in repr(m)
    c = ClickHouseEndpoint.from_url("https://u:secret@ch:8443/dw")
    assert c.secure and c.database == "dw" and "secret" not in repr(c)
    with pytest.raises(ValueError, match="not a MySQL URL"):
        MySQLEndpoint.from_url("postgres://x@y/z")


def test_job_spec_file_is_private_and_round_trips(tmp_path):
    spec = FullLoadSpec(sources=one_server(MySQLEndpoint(password="s3cret")), target=ClickHouseEndpoint(password="c1"),
                        source_database="d", source_table="t", target_database="d", target_table="t")
    path = str(tmp_path / "spec.json")
    write_spec(spec, path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert read_spec(path) == spec
    public = json.dumps(public_dict(spec))
    assert "s3cret" not in public and "c1" not in public and public.count("***") == 2


def test_job_spec_rejects_bad_values():
    with pytest.raises(ValueError, match="channels"):
        FullLoadSpec(sources=one_server(MySQLEndpoint()), target=ClickHouseEndpoint(), source_database="d",
                     source_table="t", target_database="d", target_table="t", channels=0)


def test_throttle_holds_the_rate_over_totals():
    from airflow_sync_provider.core.flow_control import Throttle

    now = [0.0]
    slept = []
    throttle = Throttle(records_per_second=1000, bytes_per_second=None, clock=lambda: now[0],
                        sleep=lambda s: (slept.append(s), now.__setitem__(0, now[0] + s)))
    assert throttle.chunk_rows(65536) == 50  # ~20 chunks a second
    for _ in range(40):
        throttle.account(50, 5000)
    assert abs(now[0] - 2.0) < 1e-9  # 2000 records at 1000/s: exactly 2 s, whatever the chunking
    bytes_only = Throttle(bytes_per_second=1_000_000, clock=lambda: 0.0, sleep=slept.append)
    assert bytes_only.account(10, 500_000) == 0.5 and bytes_only.chunk_rows(100) == 100


def test_shard_problems_name_each_discrepancy():
    from airflow_sync_provider.core.loads import ShardState
    from airflow_sync_provider.core.verify.reconcile import shard_problems

    good = ShardState(0, 1, "success", "", [], records_read=5, records_written=5)
    assert shard_problems({"source_rows": 5, "target_rows": 5}, good) == []
    assert shard_problems({"source_rows": 5, "target_rows": 4}, good) == ["source 5 != target 4"]
    assert shard_problems({"source_rows": 5, "target_rows": 5, "source_checksum": "1", "target_checksum": "2"},
                          good) == ["content checksum differs"]
    bad = ShardState(0, 1, "success", "", [], records_read=5, records_written=4, records_failed=1)
    assert shard_problems({"source_rows": 5, "target_rows": 5}, bad) == ["hook counters read 5 / written 4 / failed 1"]


def test_the_hook_counters_are_counted_by_the_shard_record():
    from airflow_sync_provider.core.loads import ShardState

    shard = ShardState(3, 1, "running", "", [])
    shard.count_read(10, 400)
    shard.count_written(6)
    assert shard.counters_disagree()  # 4 rows not acknowledged yet
    shard.count_unacknowledged()  # their insert failed
    assert (shard.records_read, shard.records_written, shard.records_failed, shard.bytes) == (10, 6, 4, 400)
    chunked = ShardState(4, 1, "running", "", [])
    chunked.count_chunk(5, 5, 100)
    chunked.count_chunk(3, 3, 60)
    assert (chunked.records_read, chunked.records_written, chunked.chunks, chunked.bytes) == (8, 8, 2, 160)
    assert not chunked.counters_disagree()


def test_type_mapping_doc_is_the_rules_table():
    from pathlib import Path

    from airflow_sync_provider.core.typemap import markdown_table

    doc = (Path(__file__).parent.parent / "docs" / "type-mapping.md").read_text()
    assert markdown_table() in doc, "docs/type-mapping.md: paste core.typemap.markdown_table() into it"


def test_native_reader_errors_never_carry_the_password():
    from airflow_sync_provider.core.endpoints import MySQLEndpoint
    from airflow_sync_provider.core.source.reader import _redacted

    endpoint = MySQLEndpoint(password="p@ss word/1")
    error = RuntimeError("cannot connect to mysql://root:p%40ss%20word%2F1@host/db (p@ss word/1)\nmore")
    assert _redacted(error, endpoint) == "cannot connect to mysql://root:***@host/db (***)"

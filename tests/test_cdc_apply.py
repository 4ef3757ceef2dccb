"""CDC catch-up against the real services: binlog → ClickHouse, compared with the source."""

from __future__ import annotations

import pytest

from airflow_sync_provider.core.cdc.checkpoints import Checkpoints
from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
from airflow_sync_provider.core.jobspec import CdcApplySpec, FullLoadSpec
from airflow_sync_provider.spark.cdc_apply import run_cdc_apply
from airflow_sync_provider.spark.full_load import run_full_load
from tests.helpers import assert_same_rows

pytestmark = pytest.mark.slow
DB, TARGET = "cdc", "cdc_ch"


@pytest.fixture(scope="module")
def endpoints(mysql_url, clickhouse_url):
    return MySQLEndpoint.from_url(mysql_url), ClickHouseEndpoint.from_url(clickhouse_url)


def full_load(endpoints, spark, table, key=None):
    key = key or f"cdc.{table}"
    run_full_load(FullLoadSpec(source=endpoints[0], target=endpoints[1], source_database=DB, source_table=table,
                               target_database=TARGET, target_table=table, load_key=key, channels=2,
                               split_factor=2), spark)
    return key


def apply(endpoints, spark, pipeline, **kwargs):
    return run_cdc_apply(CdcApplySpec(source=endpoints[0], target=endpoints[1], pipeline=pipeline, lanes=3,
                                      **kwargs), spark)


def test_inserts_updates_deletes_and_key_changes_reach_the_target(mysql_conn, ch, endpoints, spark):
    with mysql_conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE IF NOT EXISTS {DB}")
        cur.execute(f"DROP TABLE IF EXISTS {DB}.basic")
        cur.execute(f"CREATE TABLE {DB}.basic (id INT PRIMARY KEY, name VARCHAR(20), amount DECIMAL(12, 2) NULL)")
        cur.execute(f"INSERT INTO {DB}.basic SELECT seq, CONCAT('n', seq), seq / 4 FROM {DB}.seq_1_to_1000")
    key = full_load(endpoints, spark, "basic")
    with mysql_conn.cursor() as cur:
        cur.execute(f"INSERT INTO {DB}.basic VALUES (2001, 'new', 1.25), (2002, 'newer', NULL)")
        cur.execute(f"UPDATE {DB}.basic SET name = 'changed', amount = NULL WHERE id <= 10")
        cur.execute(f"DELETE FROM {DB}.basic WHERE id BETWEEN 11 AND 20")
        cur.execute(f"UPDATE {DB}.basic SET id = id + 5000 WHERE id BETWEEN 21 AND 25")  # key changes
        cur.execute(f"UPDATE {DB}.basic SET amount = 7 WHERE id = 2001")
        cur.execute(f"DELETE FROM {DB}.basic WHERE id = 2002")
    result = apply(endpoints, spark, "basic", start_from_loads=[key])
    assert result["events"] >= 2 + 10 + 10 + 5 + 1 + 1
    assert assert_same_rows(mysql_conn, ch, DB, "basic", TARGET) == 1000 + 1 - 10
    state = Checkpoints(ch).state("basic")
    assert state.status == "idle" and state.checkpoint.to_dict() == result["checkpoint"]
    # a second bounded run with nothing new applies nothing and keeps the copy exact
    again = apply(endpoints, spark, "basic")
    assert again["events"] == 0 and again["start"] == result["checkpoint"]
    assert assert_same_rows(mysql_conn, ch, DB, "basic", TARGET) == 991

"""Foreign-key cascades followed by CDC (issue 58), on the real services: InnoDB changes the
children without binlog events; after every apply the copies equal the source row for row with
rolling verification off, so it cannot mask a miss."""

from __future__ import annotations

import pytest

from airflow_sync_provider.core.jobspec import CdcApplySpec, CdcBootstrapSpec
from airflow_sync_provider.core.source.group import one_server
from airflow_sync_provider.core.source.selection import TableSet
from airflow_sync_provider.spark.cdc_apply import run_cdc_apply
from airflow_sync_provider.spark.cdc_bootstrap import run_cdc_bootstrap
from tests.helpers import assert_same_rows

pytestmark = pytest.mark.slow
DB = "fk"


def _sql(conn, *statements):
    with conn.cursor() as cur:
        for statement in statements:
            cur.execute(statement)


def _fresh(conn, *ddls):
    _sql(conn, f"DROP DATABASE IF EXISTS {DB}", f"CREATE DATABASE {DB}", *ddls)


def bootstrap(endpoints, spark, pipeline, tables, **kwargs):
    kwargs.setdefault("chunk_rows", 500)
    return run_cdc_bootstrap(CdcBootstrapSpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline=pipeline,
                                              tableset=TableSet(tables=[f"{DB}.{t}" for t in tables]), **kwargs), spark)


def apply(endpoints, spark, pipeline, **kwargs):
    kwargs.setdefault("verify_period", 0)  # no rolling verification: it would mask a missed cascade
    kwargs.setdefault("verify_after_ddl", False)
    return run_cdc_apply(CdcApplySpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline=pipeline,
                                      lanes=2, **kwargs), spark)


def same(conn, ch, *tables):
    for table in tables:
        assert_same_rows(conn, ch, DB, table)


CHAIN = (
    f"CREATE TABLE {DB}.a (id INT PRIMARY KEY, name VARCHAR(20)) ENGINE=InnoDB",
    f"CREATE TABLE {DB}.b (id INT PRIMARY KEY, a_id INT, note VARCHAR(20), KEY (a_id),"
    f" CONSTRAINT b_a FOREIGN KEY (a_id) REFERENCES {DB}.a (id) ON UPDATE CASCADE ON DELETE CASCADE) ENGINE=InnoDB",
    f"CREATE TABLE {DB}.c (id INT PRIMARY KEY, b_id INT, KEY (b_id),"
    f" CONSTRAINT c_b FOREIGN KEY (b_id) REFERENCES {DB}.b (id) ON UPDATE CASCADE ON DELETE SET NULL) ENGINE=InnoDB",
)


def test_a_chain_of_three_follows_update_cascade_delete_cascade_and_set_null(mysql_conn, ch, endpoints, spark):
    """a ← b (ON UPDATE CASCADE, ON DELETE CASCADE) ← c (ON UPDATE CASCADE, ON DELETE SET NULL):
    a renumbered key rewrites b's references; a renumbered b key rewrites c's; a deleted a row
    deletes its b rows, which set their c rows' references to NULL."""
    _fresh(mysql_conn, *CHAIN)
    _sql(mysql_conn,
         f"INSERT INTO {DB}.a SELECT seq, CONCAT('a', seq) FROM {DB}.seq_1_to_50",
         f"INSERT INTO {DB}.b SELECT seq, 1 + seq % 50, 'b' FROM {DB}.seq_1_to_500",
         f"INSERT INTO {DB}.c SELECT seq, 1 + seq % 500 FROM {DB}.seq_1_to_2000")
    bootstrap(endpoints, spark, "chain", ["a", "b", "c"])
    apply(endpoints, spark, "chain")
    same(mysql_conn, ch, "a", "b", "c")
    _sql(mysql_conn, f"UPDATE {DB}.a SET id = 1000 WHERE id = 7")  # b rows with a_id 7 → 1000
    result = apply(endpoints, spark, "chain")
    same(mysql_conn, ch, "a", "b", "c")
    assert result["cascaded_rows"] == 10
    _sql(mysql_conn, f"UPDATE {DB}.b SET id = id + 10000 WHERE id <= 20")  # c's references follow
    _sql(mysql_conn, f"DELETE FROM {DB}.a WHERE id IN (3, 4)")  # b rows deleted, their c rows' b_id NULL
    result = apply(endpoints, spark, "chain")
    same(mysql_conn, ch, "a", "b", "c")
    assert result["cascaded_rows"] > 20 + 20 + 80


def test_with_cascade_following_off_the_copy_goes_wrong(mysql_conn, ch, endpoints, spark):
    """The control: the same renumbering with follow_cascades=False leaves b's copy behind, so the
    tests above can fail."""
    _fresh(mysql_conn, *CHAIN)
    _sql(mysql_conn,
         f"INSERT INTO {DB}.a SELECT seq, CONCAT('a', seq) FROM {DB}.seq_1_to_50",
         f"INSERT INTO {DB}.b SELECT seq, 1 + seq % 50, 'b' FROM {DB}.seq_1_to_500",
         f"INSERT INTO {DB}.c SELECT seq, 1 + seq % 500 FROM {DB}.seq_1_to_2000")
    bootstrap(endpoints, spark, "chain-off", ["a", "b", "c"])
    apply(endpoints, spark, "chain-off", follow_cascades=False)
    _sql(mysql_conn, f"UPDATE {DB}.a SET id = 1000 WHERE id = 7")
    result = apply(endpoints, spark, "chain-off", follow_cascades=False)
    assert result["cascaded_rows"] == 0
    same(mysql_conn, ch, "a", "c")
    with pytest.raises(AssertionError, match="10 rows differ"):
        same(mysql_conn, ch, "b")

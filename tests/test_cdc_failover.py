"""A source failover or a lost binlog costs no re-bootstrap (issue 35), against real servers: a
MariaDB primary A and its GTID replica B (devenv/mariadb.ReplicatedPair; B's binlog offsets
differ from A's), behind an address that can move from A to B."""

from __future__ import annotations

import time

import pytest

from airflow_sync_provider.core.cdc.checkpoints import Checkpoints
from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
from airflow_sync_provider.core.jobspec import CdcApplySpec, CdcBootstrapSpec
from airflow_sync_provider.core.positions import BinlogError
from airflow_sync_provider.core.selection import TableSet
from airflow_sync_provider.core.source.group import one_server
from airflow_sync_provider.spark.cdc_apply import run_cdc_apply
from airflow_sync_provider.spark.cdc_bootstrap import run_cdc_bootstrap
from devenv.mariadb import ROOT_PASSWORD
from tests.helpers import assert_same_rows
from tests.helpers import run_sql as sql

pytestmark = pytest.mark.slow
DB = "fo"


def _source(conn):
    sql(conn, f"CREATE DATABASE {DB}",
        f"CREATE TABLE {DB}.accounts (id INT PRIMARY KEY, balance DECIMAL(12, 2) NOT NULL, note VARCHAR(40))",
        f"INSERT INTO {DB}.accounts SELECT seq, seq * 10, CONCAT('a', seq) FROM {DB}.seq_1_to_2000",
        f"CREATE TABLE {DB}.lines (account_id INT NOT NULL, seq INT NOT NULL, amount DECIMAL(12, 2),"
        " PRIMARY KEY (account_id, seq))",
        f"INSERT INTO {DB}.lines SELECT seq % 50, seq, seq / 4 FROM {DB}.seq_1_to_3000")


def _writes(conn, round_: int):
    """Changes to the same rows on each side of a failover."""
    sql(conn, f"UPDATE {DB}.accounts SET balance = balance + {round_}, note = 'round {round_}' WHERE id <= 300",
        f"DELETE FROM {DB}.accounts WHERE id BETWEEN {1000 + round_ * 10} AND {1004 + round_ * 10}",
        f"INSERT INTO {DB}.accounts VALUES ({5000 + round_}, {round_}, 'new in round {round_}')",
        f"UPDATE {DB}.lines SET amount = -amount WHERE account_id = {round_ % 50}",
        f"DELETE FROM {DB}.lines WHERE seq = {round_ + 1}")


def _pipeline(pair, clickhouse_url, spark, name: str):
    """A pipeline of the two tables, bootstrapped on A into a copy of its own (``<name>_ch``)."""
    endpoints = (MySQLEndpoint.from_url(pair.url), ClickHouseEndpoint.from_url(clickhouse_url))
    with pair.connect(pair.primary) as conn:
        sql(conn, f"DROP DATABASE IF EXISTS {DB}")
        _source(conn)
        _writes(conn, 1)
    pair.wait_caught_up()
    run_cdc_bootstrap(CdcBootstrapSpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline=name, channels=2,
                                       tableset=TableSet(tables=[{"source_database": DB, "source_table": t,
                                                "target_database": f"{name}_ch"} for t in ("accounts", "lines")])),
                      spark)
    return endpoints


def apply(endpoints, spark, pipeline, **kwargs):
    return run_cdc_apply(CdcApplySpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline=pipeline, lanes=2,
                                      **kwargs), spark)


def _exact(server_conn, ch, pipeline):
    return (assert_same_rows(server_conn, ch, DB, "accounts", f"{pipeline}_ch"),
            assert_same_rows(server_conn, ch, DB, "lines", f"{pipeline}_ch"))


def test_a_replica_promoted_behind_the_primarys_address_is_followed_by_gtid(mariadb_pair, ch, clickhouse_url, spark):
    """(1) B takes A's address; its offsets differ from A's; the same rows change on both sides of
    the failover: the next run resumes on B by GTID, B's changes out-rank A's, nothing re-copied."""
    pair = mariadb_pair
    endpoints = _pipeline(pair, clickhouse_url, spark, "fo1")
    apply(endpoints, spark, "fo1")
    with pair.connect(pair.primary) as conn:
        _writes(conn, 2)
    pair.wait_caught_up()
    assert pair.binlog_status(pair.primary) != pair.binlog_status(pair.replica)  # other offsets
    apply(endpoints, spark, "fo1")  # A's last changes, from A
    with pair.connect(pair.primary) as conn:
        _writes(conn, 3)  # reach B, not yet the copy
    pair.wait_caught_up()
    pair.fail_over()
    with pair.connect(pair.replica) as conn:
        _writes(conn, 4)  # B changes the same rows again
    state_before = Checkpoints(ch).state("fo1")
    result = apply(endpoints, spark, "fo1")
    assert result["recopied"] == [] and result["failover"]["to"]["server_id"] == 2
    state = Checkpoints(ch).state("fo1")
    assert state.checkpoint.epoch > state_before.checkpoint.epoch and state.server["server_id"] == 2
    with pair.connect(pair.replica) as conn:
        assert _exact(conn, ch, "fo1") == (2000 - 4 * 5 + 4, 3000 - 4)
    with pair.connect(pair.replica) as conn:  # and it goes on streaming on B
        _writes(conn, 5)
    apply(endpoints, spark, "fo1")
    with pair.connect(pair.replica) as conn:
        _exact(conn, ch, "fo1")
    # the copy's versions: B's rows above every row A wrote
    top_a = state_before.checkpoint.version()
    assert ch.command("SELECT min(_version) FROM fo1_ch.accounts FINAL WHERE note = 'round 5'") > top_a


def test_a_connection_pointed_at_the_replica_is_followed_by_gtid(mariadb_pair, ch, clickhouse_url, spark):
    """(2) The pipeline's connection is changed to B's own address after A dies."""
    pair = mariadb_pair
    endpoints = _pipeline(pair, clickhouse_url, spark, "fo2")
    apply(endpoints, spark, "fo2")
    with pair.connect(pair.primary) as conn:
        _writes(conn, 2)
    pair.wait_caught_up()
    pair.kill_primary()
    pair.promote_replica()
    with pair.connect(pair.replica) as conn:
        _writes(conn, 3)
    on_b = (MySQLEndpoint.from_url(f"mysql://root:{ROOT_PASSWORD}@127.0.0.1:{pair.replica.port}/"),
            endpoints[1])
    result = apply(on_b, spark, "fo2")
    assert result["recopied"] == [] and result["failover"]
    with pair.connect(pair.replica) as conn:
        _exact(conn, ch, "fo2")


def test_a_replica_promoted_while_behind_brings_the_copy_level_with_it(mariadb_pair, ch, clickhouse_url, spark):
    """(3) B misses A's last transactions, which the copy already holds: the pipeline sees them in
    the GTIDs and brings the tables level with B (a verification at B), nothing re-copied."""
    pair = mariadb_pair
    endpoints = _pipeline(pair, clickhouse_url, spark, "fo3")
    apply(endpoints, spark, "fo3")
    pair.stop_replication()
    with pair.connect(pair.primary) as conn:
        _writes(conn, 2)  # only A has these
    apply(endpoints, spark, "fo3")  # and the copy
    pair.fail_over()
    with pair.connect(pair.replica) as conn:
        _writes(conn, 3)
    result = apply(endpoints, spark, "fo3")
    assert result["recopied"] == [] and result["failover"]["missing"]
    assert result["repaired_shards"] >= 1
    with pair.connect(pair.replica) as conn:
        _exact(conn, ch, "fo3")


def test_a_purged_binlog_heals_by_recopying_beside_the_stream(mariadb_pair, ch, clickhouse_url, spark):
    """(4) The binlog the checkpoint needs is purged under a live writer: the next apply, at its
    defaults, re-copies the tables beside a stream restarted at the source's position and ends
    exact; with on_binlog_lost="stop" every retry stops with a clear error instead."""
    pair = mariadb_pair
    endpoints = _pipeline(pair, clickhouse_url, spark, "fo4")
    apply(endpoints, spark, "fo4")
    with pair.connect(pair.primary) as conn:
        _writes(conn, 2)
        with conn.cursor() as cur:
            cur.execute("FLUSH BINARY LOGS")
            _writes(conn, 3)
            cur.execute("FLUSH BINARY LOGS")
            cur.execute("SHOW BINARY LOGS")
            newest = cur.fetchall()[-1][0]
            deadline = time.monotonic() + 20
            while True:  # MariaDB keeps a file a dump thread (the replica) still reads
                cur.execute(f"PURGE BINARY LOGS TO '{newest}'")
                cur.execute("SHOW BINARY LOGS")
                if cur.fetchall()[0][0] == newest or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
    for _ in range(3):
        with pytest.raises(BinlogError, match=r"purged.*A retry stops here again"):
            apply(endpoints, spark, "fo4", on_binlog_lost="stop")
        assert Checkpoints(ch).state("fo4").status == "stopped"
    with pair.connect(pair.primary) as conn:
        _writes(conn, 4)
    result = apply(endpoints, spark, "fo4")
    assert sorted(result["recopied"]) == [f"{DB}.accounts", f"{DB}.lines"] and result["binlog_lost"]
    with pair.connect(pair.primary) as conn:
        _exact(conn, ch, "fo4")
        _writes(conn, 5)
    apply(endpoints, spark, "fo4")
    with pair.connect(pair.primary) as conn:
        _exact(conn, ch, "fo4")

"""The one version scheme (core/positions.py): binlog order, snapshot reads between."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_sync_provider.core.positions import BinlogPosition, Flavor, event_version, file_seq
from airflow_sync_provider.core.source.group import one_server

_events = st.tuples(st.integers(1, 2 ** 20), st.integers(4, 2 ** 32 - 2 ** 20), st.integers(20, 2 ** 16))


@given(st.lists(_events, min_size=2, max_size=30, unique_by=lambda e: e[:2]))
def test_versions_increase_strictly_along_the_binlog(events):
    """Events in binlog order (file number, then offset), each of ``size`` bytes holding fewer
    than ``size`` rows: every row's version is above every earlier row's, across files."""
    ordered = sorted(events)
    versions = []
    for (seq, start, size), following in zip(ordered, [*ordered[1:], None]):
        if following and following[0] == seq and following[1] < start + size:
            continue  # overlapping events cannot exist in one file
        rows = min(size - 19, 50)
        versions += [event_version(f"mysql-bin.{seq:06d}", start, i) for i in range(rows)]
    assert versions == sorted(versions) and len(set(versions)) == len(versions)


@given(_events, st.integers(0, 2 ** 16))
def test_a_snapshot_ranks_between_the_changes_before_and_after_its_position(event, rows):
    seq, start, size = event
    before = event_version(f"b.{seq}", start, min(rows, size - 20))  # the last row of the event before P
    position = BinlogPosition(f"b.{seq}", start + size)
    after = event_version(f"b.{seq}", start + size)  # the first row change at P
    assert before < position.snapshot_version() < position.snapshot_version(repair=True) < after
    rotated = BinlogPosition(f"b.{seq + 1}", 4)
    assert after < rotated.snapshot_version()  # a rotation outranks every offset of the older file


def test_positions_parse_and_order():
    assert file_seq("mysql-bin.000042") == 42 and file_seq("/var/log/my.bin.7") == 7
    with pytest.raises(ValueError, match="not a binlog file name"):
        file_seq("mysql-bin")
    assert BinlogPosition("m.000002", 4) > BinlogPosition("m.000001", 999999)
    assert (BinlogPosition.from_dict(BinlogPosition("m.1", 120, "0-1-5").to_dict())
            == BinlogPosition("m.1", 120, "0-1-5"))


@pytest.mark.parametrize("version, statement", [
    ("8.4.3", "SHOW BINARY LOG STATUS"), ("8.2.0", "SHOW BINARY LOG STATUS"), ("8.0.39", "SHOW MASTER STATUS"),
    ("5.7.44-log", "SHOW MASTER STATUS"), ("10.11.19-MariaDB-0+deb12u1-log", "SHOW BINLOG STATUS"),
    ("10.5.2-MariaDB", "SHOW BINLOG STATUS"), ("10.4.34-MariaDB-log", "SHOW MASTER STATUS"),
    ("5.5.5-10.6.18-MariaDB", "SHOW BINLOG STATUS"),
])
def test_each_server_flavour_gets_its_status_statement(version, statement):
    assert Flavor.parse(version).status_statement() == statement


@pytest.fixture
def small_table(mysql_conn):
    with mysql_conn.cursor() as cur:
        cur.execute("CREATE DATABASE IF NOT EXISTS versions")
        cur.execute("DROP TABLE IF EXISTS versions.t")
        cur.execute("CREATE TABLE versions.t (id INT PRIMARY KEY, v INT)")
        cur.execute("INSERT INTO versions.t SELECT seq, seq FROM versions.seq_1_to_2000")
    return "versions", "t"


def _spec(mysql_url, clickhouse_url, key, **kwargs):
    from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
    from airflow_sync_provider.core.jobspec import FullLoadSpec

    return FullLoadSpec(sources=one_server(MySQLEndpoint.from_url(mysql_url)),
                        target=ClickHouseEndpoint.from_url(clickhouse_url), source_database="versions",
                        source_table="t", target_database="versions_ch", target_table="t", load_key=key, channels=2,
                        split_factor=2, **kwargs)


def _transactions(sizes, file="mysql-bin.000007", start=4):
    """SHOW BINLOG EVENTS rows of transactions whose rows events have these sizes (MariaDB's shape)."""
    rows, pos = [], start
    for n, size in enumerate(sizes):
        for kind, length, info in (("Gtid", 42, f"BEGIN GTID 0-1-{n}"), ("Table_map", 60, "table_id: 25 (d.t)"),
                                   ("Update_rows_v1", size, "table_id: 25 flags: STMT_END_F"),
                                   ("Xid", 31, f"COMMIT /* xid={n} */")):
            rows.append((file, pos, kind, pos + length, info))
            pos += length
    return rows


@given(st.lists(st.integers(100, 5000), min_size=1, max_size=60), st.integers(2, 4))
def test_a_backlog_is_cut_after_commits_into_shares_of_its_row_bytes(sizes, parts):
    from airflow_sync_provider.core.cdc.binlog.backlog import split_backlog

    events = _transactions(sizes)
    cuts = split_backlog(events, parts, min_bytes=0)
    commits = {BinlogPosition(f, end) for f, _, kind, end, _ in events if kind == "Xid"}
    assert set(cuts) <= commits and cuts == sorted(cuts, key=BinlogPosition.key) and len(cuts) < parts
    assert len(set(cuts)) == len(cuts) and all(c.key() < (7, events[-1][3]) for c in cuts)  # no empty last part
    # each part but the last holds at least its share of the row bytes (it ends at the first commit past it)
    weight, total = 0, sum(sizes)
    done = {}
    for f, pos, kind, end, _ in events:
        weight += (end - pos) if kind.startswith("Update_rows") else 0
        done[BinlogPosition(f, end)] = weight
    shares = [done[c] for c in cuts]
    assert all(share >= total / parts * (k + 1) for k, share in enumerate(shares))
    if max(sizes) * parts <= total:  # no single transaction larger than a share: every cut is made
        assert len(cuts) == parts - 1


def test_a_small_backlog_is_not_split_and_a_ddl_keeps_it_whole():
    from airflow_sync_provider.core.cdc.binlog.backlog import split_backlog

    events = _transactions([1000] * 10)
    assert split_backlog(events, 2, min_bytes=20_000) == []
    assert split_backlog(events, 1, min_bytes=0) == []
    assert split_backlog(events, 2, min_bytes=0) == [BinlogPosition("mysql-bin.000007", events[4 * 5 - 1][3])]
    ddl = ("mysql-bin.000007", events[-1][3], "Query", events[-1][3] + 80, "use `d`; ALTER TABLE t ADD COLUMN x INT")
    assert split_backlog(events[:20] + [ddl] + _transactions([1000] * 10, start=ddl[3]), 2, min_bytes=0) is None
    commit = ("mysql-bin.000007", ddl[1], "Query", ddl[1] + 30, "COMMIT")  # a non-transactional table's commit
    assert split_backlog(events[:20] + [commit] + _transactions([1000] * 10, start=commit[3]), 2, min_bytes=0)



@pytest.mark.slow
def test_a_full_load_ranks_each_shard_by_its_reads_binlog_position(small_table, mysql_conn, ch, mysql_url,
                                                                   clickhouse_url, spark):
    from airflow_sync_provider.core.ledger import Ledger
    from airflow_sync_provider.core.positions import current_position
    from airflow_sync_provider.spark.full_load import run_full_load

    before = current_position(mysql_conn)
    result = run_full_load(_spec(mysql_url, clickhouse_url, "versions.rank"), spark)
    start = BinlogPosition.from_dict(result["start_position"])
    with mysql_conn.cursor() as cur:
        cur.execute("UPDATE versions.t SET v = -v WHERE id = 1")  # a change after the load
    after = current_position(mysql_conn)
    assert before.key() <= start.key() < after.key()
    shards = Ledger(ch).state("versions.rank").shards.values()
    stored = {int(v) for (v,) in ch.query("SELECT DISTINCT _version FROM versions_ch.t").result_rows}
    assert stored <= {s.version for s in shards} and stored
    assert all(start.snapshot_version() <= v < after.version() - 20 for v in stored)
    comment = ch.command("SELECT comment FROM system.tables WHERE database = 'versions_ch' AND name = 't'")
    assert comment.startswith("airflow_sync version=binlog-v1 ")  # then the load that published it


@pytest.mark.slow
def test_a_table_of_the_old_wall_clock_scheme_is_refused_and_a_full_reload_migrates_it(
        small_table, mysql_url, clickhouse_url, ch, spark):
    from airflow_sync_provider.core.clickhouse.described import OldLayout
    from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
    from airflow_sync_provider.core.jobspec import ReconcileSpec
    from airflow_sync_provider.spark.full_load import run_full_load
    from airflow_sync_provider.spark.reconcile import run_reconcile

    run_full_load(_spec(mysql_url, clickhouse_url, "versions.old"), spark)
    # what an earlier release left: wall-clock versions, no marker
    ch.command("ALTER TABLE versions_ch.t MODIFY COMMENT ''")
    ch.command("INSERT INTO versions_ch.t (id, v, _version) VALUES (5, 0, 1763800000000000000)")
    verdict = run_reconcile(ReconcileSpec(sources=one_server(MySQLEndpoint.from_url(mysql_url)),
                                          target=ClickHouseEndpoint.from_url(clickhouse_url),
                                          load_key="versions.old", checksum=True), spark)
    assert verdict["verdict"] == "mismatch"
    with pytest.raises(OldLayout, match=r"table versions_ch\.t was written by an earlier airflow-sync release.*"
                                        r"Reload it in full"):
        run_full_load(_spec(mysql_url, clickhouse_url, "versions.old", reimport="failed"), spark)
    run_full_load(_spec(mysql_url, clickhouse_url, "versions.old"), spark)  # a new generation: a fresh table
    assert ch.command("SELECT max(_version) < 1763800000000000000 FROM versions_ch.t") == 1
    assert ch.command("SELECT v FROM versions_ch.t FINAL WHERE id = 5") == 5

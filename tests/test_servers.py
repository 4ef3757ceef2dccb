"""Servers, GTID states and epochs (core/cdc/servers.py, core/positions.py) without a server:
MariaDB's domain states and MySQL's GTID sets as python-mysql-replication parses them (no MySQL
8 server can be installed here), and versions that keep every later server above every earlier
one."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from airflow_sync_provider.core.cdc.servers import (
    GtidState,
    Server,
    as_target,
    common_state,
    covers,
    is_gtid,
    missing_from,
    reached,
    with_their_domains,
)
from airflow_sync_provider.core.positions import EPOCH_SHIFT, BinlogPosition, event_version, version_position

U1, U2 = "3e11fa47-71ca-11e1-9e33-c80aa9429562", "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"


def test_mariadb_states_follow_transactions_per_domain():
    state = GtidState("0-1-5,1-2-3")
    state.add("0-1-6", mariadb=True)
    state.add("2-7-1", mariadb=True)
    assert state.text() == "0-1-6,1-2-3,2-7-1"
    assert missing_from("0-1-10,1-2-3", "0-1-8,1-2-5", True) == "0-1-10"
    assert missing_from("0-1-8", "0-1-8,1-2-5", True) == ""
    assert common_state("0-1-10,1-2-3", "0-1-8,1-2-5", True) == "0-1-8,1-2-3"
    # a promoted replica's own domain is taken as it is there, ours as ours
    assert with_their_domains("0-1-8", "0-2-9,1-2-5", True) == "0-1-8,1-2-5"


def test_mysql_gtid_sets_follow_transactions_and_differ_by_server():
    state = GtidState(f"{U1}:1-5")
    state.add(f"{U1}:6", mariadb=False)
    state.add(f"{U2}:1", mariadb=False)
    assert covers(state.text(), f"{U1}:1-6") and covers(state.text(), f"{U2}:1")
    assert not covers(state.text(), f"{U1}:7")
    ours, theirs = f"{U1}:1-10,{U2}:1-3", f"{U1}:1-7"
    assert missing_from(ours, theirs, False) == f"{U1}:8-10,{U2}:1-3"
    assert common_state(ours, theirs, False) == f"{U1}:1-7"
    assert missing_from(f"{U1}:1-7", f"{U1}:1-10", False) == ""
    assert with_their_domains(ours, theirs, False) == ours  # MySQL: the set is the set


def test_targets_and_reaching_them_across_servers():
    assert is_gtid("0-1-1043") and is_gtid(f"{U1}:1-1043") and not is_gtid("mysql-bin.000001:4")
    assert as_target("0-1-5") == "0-1-5"
    assert as_target("mysql-bin.000007:300") == BinlogPosition("mysql-bin.000007", 300)
    old = BinlogPosition("mysql-bin.000040", 900, "0-1-100", epoch=0)
    # on the new server, lower coordinates: reached by history, not by offsets
    new = BinlogPosition("mysql-bin.000003", 120, "0-2-105", epoch=1)  # B went on writing domain 0
    assert reached(new, old)
    behind = BinlogPosition("mysql-bin.000003", 120, "0-1-90", epoch=1)
    assert not reached(behind, old)  # the new server has not caught up with that history yet
    assert reached(new, "0-1-100") and not reached(new, "0-1-106")
    same = BinlogPosition("mysql-bin.000040", 901, epoch=0)
    assert reached(same, old) and not reached(old, same)


def test_server_identity_names_the_server():
    a, b = Server(True, 1, domain=0), Server(True, 2, domain=0)
    assert a.key != b.key and Server.from_dict(a.to_dict()) == a
    m = Server(False, 1, U1)
    assert m.key == f"mysql:{U1}" and "MySQL" in str(m)


positions = st.tuples(st.integers(0, 255), st.integers(1, (1 << 24) - 1), st.integers(4, (1 << 32) - 1 - 1000),
                      st.integers(0, 999))


@given(positions, positions)
def test_versions_order_by_epoch_then_binlog_coordinates(a, b):
    """Whatever a later server's coordinates, its versions out-rank an earlier one's; on one
    server they follow file, offset and row; a version tells where it came from."""
    va = event_version(f"mysql-bin.{a[1]:06d}", a[2], a[3], a[0])
    vb = event_version(f"mysql-bin.{b[1]:06d}", b[2], b[3], b[0])
    assert (va < vb) == ((a[0], a[1], a[2] + a[3]) < (b[0], b[1], b[2] + b[3]))
    assert version_position(va) == (a[0], a[1], a[2] + a[3])
    assert va >> EPOCH_SHIFT == a[0]


@given(positions)
def test_a_snapshot_at_a_position_ranks_between_the_changes_before_and_after_it(p):
    epoch, seq, pos, _ = p
    at = BinlogPosition(f"mysql-bin.{seq:06d}", pos, epoch=epoch)
    before = event_version(at.file, pos - 20 if pos >= 24 else 4, 0, epoch) if pos >= 24 else None
    if before is not None:
        assert before < at.snapshot_version() < at.snapshot_version(repair=True) < at.version()
    earlier_server = BinlogPosition("mysql-bin.999999", (1 << 32) - 1, epoch=max(0, epoch - 1))
    if epoch:
        assert earlier_server.version() < at.snapshot_version()

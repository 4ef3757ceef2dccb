"""The failover stand-in itself (devenv/mariadb.ReplicatedPair): a MariaDB primary, a GTID
replica with a binlog of its own, and the address (a TCP proxy) that moves to the replica."""

from __future__ import annotations

import pymysql
import pytest

from devenv.mariadb import LOCAL_DOMAIN, ROOT_PASSWORD, ReplicatedPair

pytestmark = pytest.mark.slow


def gtids(position: str) -> dict[int, tuple[int, int]]:
    """``0-1-15,1-2-3`` → {domain: (server_id, seq_no)}."""
    return {int(d): (int(s), int(n)) for d, s, n in (p.split("-") for p in position.split(",") if p)}


def via(pair: ReplicatedPair) -> pymysql.connections.Connection:
    """A client of "the primary's address"."""
    return pymysql.connect(host="127.0.0.1", port=pair.proxy.port, user="root", password=ROOT_PASSWORD,
                           autocommit=True)


def rows(pair, server, statement):
    with pair.connect(server) as conn, conn.cursor() as cur:
        cur.execute(statement)
        return cur.fetchall()


def gtid_event_offset(pair, server, gtid: str) -> tuple[str, int]:
    """Where the transaction ``gtid`` starts in ``server``'s binlog."""
    for (name,) in (r[:1] for r in rows(pair, server, "SHOW BINARY LOGS")):
        for _, pos, kind, _, _, info in rows(pair, server, f"SHOW BINLOG EVENTS IN '{name}'"):
            if kind == "Gtid" and info.endswith(f"GTID {gtid}"):
                return name, pos
    raise AssertionError(f"{gtid} not in the binlog of port {server.port}")


@pytest.fixture
def pair(mariadb_pair):
    return mariadb_pair


def test_the_replica_follows_by_gtid_with_offsets_of_its_own_and_takes_the_address(pair):
    a, b = pair.primary, pair.replica
    with via(pair) as client, client.cursor() as cur:
        cur.execute("SELECT @@server_id")
        assert cur.fetchone()[0] == 1
        cur.execute("CREATE DATABASE shop")
        cur.execute("CREATE TABLE shop.t (id INT PRIMARY KEY, v INT)")
        cur.execute("INSERT INTO shop.t SELECT seq, seq * 2 FROM shop.seq_1_to_500")
        cur.execute("UPDATE shop.t SET v = -v WHERE id % 7 = 0")
    position = pair.wait_caught_up()
    assert rows(pair, b, "SELECT count(*), sum(v) FROM shop.t") == rows(pair, a, "SELECT count(*), sum(v) FROM shop.t")

    # GTID positions agree: B applied A's domain-0 history exactly; its own history is domain 1 only
    assert rows(pair, b, "SELECT @@gtid_slave_pos")[0][0] == position == pair.gtid_binlog_pos(a)
    replica = gtids(pair.gtid_binlog_pos(b))
    # (B's own: CREATE DATABASE, CREATE TABLE and its inserts)
    assert replica[0] == gtids(position)[0] and replica[LOCAL_DOMAIN] == (2, 2 + pair.replica_history)
    assert LOCAL_DOMAIN not in gtids(pair.gtid_binlog_pos(a))
    status = pair.replica_status()
    assert status["Using_Gtid"] == "Slave_Pos" and status["Slave_IO_Running"] == status["Slave_SQL_Running"] == "Yes"
    assert rows(pair, b, "SELECT @@log_slave_updates, @@read_only, @@server_id, @@binlog_row_metadata") == \
        ((1, 1, 2, "FULL"),)

    # B's binlog is not A's: its position now and the same transaction's offset differ
    assert pair.binlog_status(a) != pair.binlog_status(b)
    last = "-".join(map(str, (0, *gtids(position)[0])))
    assert gtid_event_offset(pair, a, last) != gtid_event_offset(pair, b, last)

    # B takes A's address: old connections break, new ones reach B, which takes writes
    held = via(pair)
    pair.fail_over()
    with pytest.raises(pymysql.err.OperationalError):
        with held.cursor() as cur:
            cur.execute("SELECT 1")
    with via(pair) as client, client.cursor() as cur:
        cur.execute("SELECT @@server_id, @@read_only")
        assert cur.fetchone() == (2, 0)
        cur.execute("INSERT INTO shop.t VALUES (10000, 1)")
    assert gtids(pair.gtid_binlog_pos(b))[0] == (2, gtids(position)[0][1] + 1)  # domain 0 goes on as 0-2-N
    assert pair.primary.proc is None  # killed


def test_a_replica_promoted_while_behind_misses_exactly_the_last_transactions(pair):
    a, b = pair.primary, pair.replica
    with pair.connect(a) as conn, conn.cursor() as cur:
        cur.execute("CREATE DATABASE shop")
        cur.execute("CREATE TABLE shop.t (id INT PRIMARY KEY, v INT)")
        cur.execute("INSERT INTO shop.t SELECT seq, seq FROM shop.seq_1_to_100")
    caught_up = pair.wait_caught_up()
    assert pair.stop_replication() == caught_up
    with pair.connect(a) as conn, conn.cursor() as cur:
        for i in range(3):  # three transactions B will never see
            cur.execute("INSERT INTO shop.t VALUES (%s, %s)", (1000 + i, i))
    on_a = gtids(pair.gtid_binlog_pos(a))[0]
    pair.fail_over()
    on_b = gtids(pair.gtid_binlog_pos(b))[0]
    assert on_a == (1, gtids(caught_up)[0][1] + 3) and on_b == gtids(caught_up)[0]  # behind by those 3 GTIDs
    with via(pair) as client, client.cursor() as cur:
        cur.execute("SELECT count(*), max(id) FROM shop.t")
        assert cur.fetchone() == (100, 100)
        cur.execute("INSERT INTO shop.t VALUES (2000, 0)")  # B's own next transaction …
    # … takes a sequence number A already used for a transaction B never had: 0-2-N vs 0-1-N
    assert gtids(pair.gtid_binlog_pos(b))[0] == (2, on_b[1] + 1) and on_b[1] + 1 <= on_a[1]


def test_a_failed_start_leaves_no_server_behind(monkeypatch):
    """A start that fails after the servers are up (here: setting up replication) stops both and
    removes their data dirs: a context manager's exit is not called for a failed __enter__."""
    def broken(self):
        raise RuntimeError("replication setup failed")

    monkeypatch.setattr(ReplicatedPair, "_replicate", broken)
    pair = ReplicatedPair()
    with pytest.raises(RuntimeError, match="replication setup failed"):
        pair.start()
    assert pair.primary.proc is None and pair.replica.proc is None and pair.proxy is None
    assert not pair.primary.base.parent.exists()

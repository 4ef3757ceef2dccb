"""Epochs in the ledger (core/cdc/servers.ServerEpochs) against the ClickHouse endpoint: claims
made at once by many processes agree, and no two servers share an epoch. Claims take no lock, so
the invariants are asserted over many rounds of threads released together."""

from __future__ import annotations

import threading
import uuid

import pytest

from airflow_sync_provider.core.cdc.servers import Server, ServerEpochs
from airflow_sync_provider.core.clickhouse.client import client
from airflow_sync_provider.core.endpoints import ClickHouseEndpoint
from airflow_sync_provider.core.ledger import LedgerTables

A, B, C = (Server(True, n, domain=0) for n in (1, 2, 3))


def _epochs(ch, database: str) -> ServerEpochs:
    epochs = ServerEpochs(LedgerTables(ch, database))
    epochs.ensure()
    return epochs


def _at_once(clickhouse_url, database: str, calls: list) -> list[int]:
    """Each ``(method, server)`` in its own thread with its own client, released together."""
    results: list = [None] * len(calls)
    start = threading.Barrier(len(calls))

    def claim(i, method, server):
        ch = client(ClickHouseEndpoint.from_url(clickhouse_url))
        try:
            epochs = _epochs(ch, database)
            start.wait()
            results[i] = getattr(epochs, method)(server)
        except Exception as exc:  # noqa: BLE001 - asserted below
            results[i] = exc
        finally:
            ch.close()

    threads = [threading.Thread(target=claim, args=(i, *call)) for i, call in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not [r for r in results if isinstance(r, Exception)], results
    return results


def test_first_sightings_at_once_agree_on_one_epoch(clickhouse_url, ch):
    """Three backfill days and a sensor see the source for the first time together: one epoch,
    0, and the server keeps it (an earlier release gave the late ones the next epoch, so one
    day's rows ranked above a newer CDC change and a ``file:pos`` target compared low)."""
    for round_ in range(12):
        database = f"epochs_{uuid.uuid4().hex[:8]}"
        got = _at_once(clickhouse_url, database, [("epoch", A)] * 4)
        assert got == [0] * 4, (round_, got)
        assert _epochs(ch, database).epoch(A) == 0
        ch.command(f"DROP DATABASE {database}")


class _Interjected:
    """A client through which another process's claim runs right after statement ``after``."""

    def __init__(self, ch, after: int, interject):
        self.ch, self.after, self.interject, self.statements = ch, after, interject, 0

    def __getattr__(self, name):
        return getattr(self.ch, name)

    def _then(self, result):
        self.statements += 1
        if self.statements == self.after:
            self.interject()
        return result

    def query(self, *args, **kwargs):
        return self._then(self.ch.query(*args, **kwargs))

    def command(self, *args, **kwargs):
        return self._then(self.ch.command(*args, **kwargs))


@pytest.mark.parametrize("after", [1, 2, 3])  # a claim is 3 statements (6 when it lost one)
@pytest.mark.parametrize("theirs", [A, B])
def test_a_claim_interrupted_after_any_statement_agrees_with_the_other(ch, after, theirs):
    """The same two claims at every interleaving point: process X claims A's epoch; after X's
    statement ``after``, Y claims ``theirs`` (the same server, or another new one). Each server
    ends with one epoch, every process got its server's, and no two servers share one."""
    epochs = _epochs(ch, f"epochs_{uuid.uuid4().hex[:8]}")
    got = {}
    x = ServerEpochs(LedgerTables(_Interjected(ch, after, lambda: got.setdefault("y", epochs.epoch(theirs))),
                                  epochs.database))
    got["x"] = x.epoch(A)
    assert "y" in got
    assert got["x"] == epochs.epoch(A) and got["y"] == epochs.epoch(theirs)
    assert (got["x"] == got["y"]) == (theirs == A)
    assert epochs.server_of_epoch(got["x"]) == A and epochs.server_of_epoch(got["y"]) == theirs
    ch.command(f"DROP DATABASE {epochs.database}")


def test_two_new_servers_at_once_never_share_an_epoch(clickhouse_url, ch):
    """B and C registered (each made the highest) and looked up, all four at once. A lookup may
    come before its server's register: then it gets the epoch the server had then, which a
    register that finds the other server above it raises (C: looked up 1, B registered 2, C
    registered 3 is such a run). Whatever the order: every answer is an epoch of its own server,
    a register's is its server's epoch from then on, and B and C never share one."""
    for round_ in range(12):
        database = f"epochs_{uuid.uuid4().hex[:8]}"
        _epochs(ch, database).epoch(A)
        got = _at_once(clickhouse_url, database, [("register", B), ("register", C), ("epoch", B), ("epoch", C)])
        epochs = _epochs(ch, database)
        assert got[0] == epochs.epoch(B) and got[1] == epochs.epoch(C), (round_, got)
        assert got[0] != got[1] and max(got) == max(got[0], got[1]), (round_, got)
        assert epochs.server_of_epoch(got[0]) == epochs.server_of_epoch(got[2]) == B, (round_, got)
        assert epochs.server_of_epoch(got[1]) == epochs.server_of_epoch(got[3]) == C, (round_, got)
        assert 0 not in got, (round_, got)  # A's
        ch.command(f"DROP DATABASE {database}")


def test_a_move_takes_the_highest_epoch_once(ch):
    epochs = _epochs(ch, f"epochs_{uuid.uuid4().hex[:8]}")
    assert [epochs.epoch(A), epochs.register(B), epochs.epoch(A), epochs.register(B)] == [0, 1, 0, 1]
    assert epochs.register(A) == 2  # back on A after B: above B
    assert epochs.register(A) == 2 and epochs.epoch(B) == 1  # a second pipeline moving there keeps it
    assert epochs.server_of_epoch(0) == epochs.server_of_epoch(2) == A and epochs.server_of_epoch(3) is None
    ch.command(f"DROP DATABASE {epochs.database}")


def test_a_claim_lost_to_another_server_is_not_its_epoch(ch):
    """A claim that lost (another server took the epoch first) and whose process died before
    claiming again: the server still has no epoch of its own."""
    epochs = _epochs(ch, f"epochs_{uuid.uuid4().hex[:8]}")
    table = epochs._table()
    ch.command(f"INSERT INTO {table} VALUES ('{B.key}', 1, '2026-01-01 00:00:00'), "
               f"('{C.key}', 1, '2026-01-01 00:00:01')")
    assert epochs.epoch(C) == 2 and epochs.epoch(B) == 1
    assert epochs.server_of_epoch(1) == B
    ch.command(f"DROP DATABASE {epochs.database}")


@pytest.mark.parametrize("text", ["mysql-bin.000003:400", {"file": "mysql-bin.000003", "pos": 400}])
def test_a_position_without_an_epoch_is_one_on_the_server_read_now(text):
    from airflow_sync_provider.core.cdc.servers import as_target, reached
    from airflow_sync_provider.core.positions import BinlogPosition

    target = as_target(text, epoch=3)
    assert target == BinlogPosition("mysql-bin.000003", 400, epoch=3)
    assert not reached(BinlogPosition("mysql-bin.000003", 300, epoch=3), target)
    assert reached(BinlogPosition("mysql-bin.000003", 400, epoch=3), target)
    assert as_target({"file": "mysql-bin.000003", "pos": 400, "epoch": 1}, epoch=3).epoch == 1

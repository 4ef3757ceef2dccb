"""One job at a time per pipeline or load key, and a dead job's successor at once: a MySQL
named lock on the *source* server, ``GET_LOCK(name, 0)``, taken on a connection of its own that
the job holds for its whole run.

The server releases the lock the moment that connection ends: a killed process's socket closes
at once; a lost host's connection is dropped after ``LOCK_WAIT_TIMEOUT`` seconds of silence (the
connection's ``wait_timeout``), which a background thread keeps from happening to a live holder
by checking the lock every ``PING_SECONDS``. ClickHouse (where the ledger is) has no
compare-and-set, so the lock cannot live there; named locks need no privilege and work on
read-only replicas, on MySQL and MariaDB alike. Used by CDC's pipeline lease
(core/cdc/lease.py), the full load and the CDC bootstrap (per load key).
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import time

from airflow_sync_provider.core.endpoints import MySQLEndpoint

# A lost host's successor can start within ~10 s: the lock is freed after LOCK_WAIT_TIMEOUT. The
# holder learns of a loss within PING_SECONDS + PING_TIMEOUT, before the server frees the lock.
LOCK_WAIT_TIMEOUT = 5  # seconds of silence after which the source drops a holder's connection and lock
PING_SECONDS = 1.0  # how often the holder checks its lock (which also keeps the connection alive)
PING_TIMEOUT = 2  # a check unanswered this long: the holder gives up
# A job's successor (an Airflow retry right after its submitter was killed) waits this long for the
# lock: the dying job's guard ends it within a second (core/guard.py), and the source frees its lock
TAKEOVER_SECONDS = 3.0


class LockHeld(RuntimeError):
    """Another connection holds the lock: ``connection_id`` (None if it was freed meanwhile) and
    ``where`` (``source connection N from host:port``)."""

    def __init__(self, name: str, connection_id: int | None, where: str):
        super().__init__(f"lock {name!r} is held by {where}")
        self.name, self.connection_id, self.where = name, connection_id, where


def lock_name(database: str, key: str) -> str:
    name = f"{database}:{key}"
    if len(name) > 64:  # MySQL's limit for lock names
        name = f"{database[:20]}:{hashlib.sha1(key.encode()).hexdigest()}"
    return name


def lock_holder(conn, name: str) -> int | None:
    """The source connection id holding ``name``, or None when it is free."""
    with conn.cursor() as cur:
        cur.execute("SELECT IS_USED_LOCK(%s)", (name,))
        return cur.fetchone()[0]


class NamedLock:
    """Held from :meth:`take` until :meth:`release` (or the process's end)."""

    def __init__(self, name: str, conn, connection_id: int):
        self.name = name
        self.holder = f"{socket.gethostname()} pid {os.getpid()}, source connection {connection_id}"
        self.lost = ""  # why the lock is gone, once it is
        self._conn = conn
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=f"lock {name}", daemon=True)
        self._thread.start()

    @classmethod
    def take(cls, source: MySQLEndpoint, name: str, wait_seconds: float = 0) -> "NamedLock":
        """Take ``name`` (waiting up to ``wait_seconds`` for its holder to let go) or raise
        :class:`LockHeld`."""
        conn = source.connect(autocommit=True, connect_timeout=PING_TIMEOUT * 3, read_timeout=PING_TIMEOUT,
                              write_timeout=PING_TIMEOUT)
        try:
            deadline = time.monotonic() + wait_seconds
            with conn.cursor() as cur:
                cur.execute("SET SESSION wait_timeout = %s", (LOCK_WAIT_TIMEOUT,))
                while True:  # polled: a GET_LOCK that waits would outlast the connection's read timeout
                    cur.execute("SELECT GET_LOCK(%s, 0), CONNECTION_ID()", (name,))
                    got, connection_id = cur.fetchone()
                    if got == 1 or time.monotonic() >= deadline:
                        break
                    time.sleep(min(PING_SECONDS, max(0.0, deadline - time.monotonic())))
            if got != 1:
                holder = lock_holder(conn, name)
                with conn.cursor() as cur:
                    cur.execute("SELECT HOST FROM information_schema.PROCESSLIST WHERE ID = %s", (holder,))
                    row = cur.fetchone()
                raise LockHeld(name, holder, f"source connection {holder}" + (f" from {row[0]}" if row else "")
                               if holder is not None else "a job that has just stopped")
        except BaseException:
            conn.close()
            raise
        return cls(name, conn, connection_id)

    def _watch(self) -> None:
        while not self._stop.wait(PING_SECONDS):
            try:
                with self._conn.cursor() as cur:
                    cur.execute("SELECT IS_USED_LOCK(%s) = CONNECTION_ID()", (self.name,))
                    if cur.fetchone()[0] != 1:
                        raise RuntimeError("the lock is no longer this connection's")
            except Exception as exc:
                self.lost = f"{type(exc).__name__}: {exc}"
                self._conn.close()  # a slow but live connection must not keep the lock either
                return

    def release(self) -> None:
        self._stop.set()
        self._thread.join()
        if self.lost:
            return
        try:
            with self._conn.cursor() as cur:
                cur.execute("SELECT RELEASE_LOCK(%s)", (self.name,))
        finally:
            self._conn.close()  # closing alone would release it too

    def __enter__(self) -> "NamedLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def load_lock(source: MySQLEndpoint, database: str, load_key: str, what: str) -> NamedLock:
    """The lock of one load key (a full load, a table's CDC bootstrap); refused with a
    :class:`LockHeld` whose message says ``what`` runs elsewhere and when to run it again."""
    try:
        return NamedLock.take(source, lock_name(database, f"load:{load_key}"), wait_seconds=TAKEOVER_SECONDS)
    except LockHeld as held:
        held.args = (f"{what} is running elsewhere: {held.where} holds lock {held.name!r} on the source, and two jobs "
                     "must not run it at once. If that job died, the source frees its lock as its connection drops (at "
                     f"once for a killed process, within {LOCK_WAIT_TIMEOUT} s for a lost host): run this again then",)
        raise

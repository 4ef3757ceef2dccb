"""A pipeline's lease: one applier at a time, and a dead one's successor starts within seconds.

**Mutual exclusion** is a MySQL named lock on the *source* server, ``GET_LOCK('<ledger
database>:<pipeline>', 0)``, taken on a connection of its own that the applier holds for its
whole run. The server releases the lock the moment that connection ends: a killed process's
socket closes at once; a lost host's connection is dropped after ``LOCK_WAIT_TIMEOUT`` seconds
of silence (the connection's ``wait_timeout``), which a background thread keeps from happening
to a live holder by checking the lock every ``PING_SECONDS``. ClickHouse (where the ledger is)
has no compare-and-set, so the lock cannot live there; named locks need no privilege and work
on read-only replicas, on MySQL and MariaDB alike.

**Fencing** by generation: each acquisition takes the pipeline's highest generation in the
ledger plus one, every state row it writes carries it, and readers take the row of the highest
generation (core/cdc/checkpoints.py). A holder that lost its lock without noticing yet (a
stalled process, a partition) can therefore neither move the checkpoint back nor forward once
its successor has written. The holder itself stops at its next ledger write after a failed
check (:meth:`Lease.check`, called by every write of ``Checkpoints``): it notices within
``PING_SECONDS + PING_TIMEOUT`` seconds, before the server frees the lock.
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading

import pymysql

from airflow_sync_provider.core.endpoints import MySQLEndpoint

# A lost host's successor can start within ~10 s: the lock is freed after LOCK_WAIT_TIMEOUT, and
# an applier starts in 3–5 s (spark-submit). The holder learns of a loss within PING_SECONDS +
# PING_TIMEOUT, before the server frees the lock.
LOCK_WAIT_TIMEOUT = 5  # seconds of silence after which the source drops a holder's connection and lock
PING_SECONDS = 1.0  # how often the holder checks its lock (which also keeps the connection alive)
PING_TIMEOUT = 2  # a check unanswered this long: the holder gives up


class LeaseError(RuntimeError):
    pass


class LeaseHeld(LeaseError):
    """Another applier holds the pipeline."""


class LeaseLost(LeaseError):
    """This applier's lock is gone: it must not write again."""


def lock_name(database: str, pipeline: str) -> str:
    name = f"{database}:{pipeline}"
    if len(name) > 64:  # MySQL's limit for lock names
        name = f"{database[:20]}:{hashlib.sha1(pipeline.encode()).hexdigest()}"
    return name


def lock_holder(conn, name: str) -> int | None:
    """The source connection id holding ``name``, or None when it is free."""
    with conn.cursor() as cur:
        cur.execute("SELECT IS_USED_LOCK(%s)", (name,))
        return cur.fetchone()[0]


class Lease:
    """Held from :meth:`acquire` until :meth:`release` (or the process's end)."""

    def __init__(self, pipeline: str, name: str, conn, connection_id: int, generation: int):
        self.pipeline, self.name, self.generation = pipeline, name, generation
        self.holder = f"{socket.gethostname()} pid {os.getpid()}, source connection {connection_id}"
        self.lost = ""  # why the lock is gone, once it is
        self._conn = conn
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=f"lease {name}", daemon=True)
        self._thread.start()

    @classmethod
    def acquire(cls, source: MySQLEndpoint, checkpoints, pipeline: str) -> "Lease":
        """Take the pipeline or raise :class:`LeaseHeld` naming its holder and what to do."""
        name = lock_name(checkpoints.database, pipeline)
        conn = pymysql.connect(**source.connect_args(), autocommit=True, connect_timeout=PING_TIMEOUT * 3,
                               read_timeout=PING_TIMEOUT, write_timeout=PING_TIMEOUT)
        try:
            with conn.cursor() as cur:
                cur.execute("SET SESSION wait_timeout = %s", (LOCK_WAIT_TIMEOUT,))
                cur.execute("SELECT GET_LOCK(%s, 0), CONNECTION_ID()", (name,))
                got, connection_id = cur.fetchone()
            if got != 1:
                raise LeaseHeld(_refusal(conn, checkpoints, pipeline, name))
            # under the lock: no other applier of this pipeline computes a generation now
            generation = checkpoints.generation(pipeline) + 1
        except BaseException:
            conn.close()
            raise
        return cls(pipeline, name, conn, connection_id, generation)

    def _watch(self) -> None:
        while not self._stop.wait(PING_SECONDS):
            try:
                with self._conn.cursor() as cur:
                    cur.execute("SELECT IS_USED_LOCK(%s) = CONNECTION_ID()", (self.name,))
                    if cur.fetchone()[0] != 1:
                        raise LeaseError("the lock is no longer this connection's")
            except Exception as exc:
                self.lost = f"{type(exc).__name__}: {exc}"
                self._conn.close()  # a slow but live connection must not keep the lock either
                return

    def check(self) -> None:
        """Raise :class:`LeaseLost` if the lock is gone (called before every ledger write)."""
        if self.lost:
            raise LeaseLost(
                f"pipeline {self.pipeline!r}: this applier (generation {self.generation}) lost its lease — the source "
                f"connection holding lock {self.name!r} failed ({self.lost}) — and stops without writing again; "
                "another applier may have taken over. Check `airflow-sync cdc status`; if none runs, start one (it "
                "resumes from the checkpoint)")

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


def _refusal(conn, checkpoints, pipeline: str, name: str) -> str:
    connection_id = lock_holder(conn, name)
    state = checkpoints.state(pipeline)
    if connection_id is None:
        holder = "an applier that has just stopped"
    elif state is not None and state.holder.endswith(f"source connection {connection_id}"):
        holder = f"{state.holder} (generation {state.generation})"
    else:  # it has not written its first state row yet, or it records to another ledger
        with conn.cursor() as cur:
            cur.execute("SELECT HOST FROM information_schema.PROCESSLIST WHERE ID = %s", (connection_id,))
            row = cur.fetchone()
        holder = f"source connection {connection_id}" + (f" from {row[0]}" if row else "")
    return (f"pipeline {pipeline!r} is held by another applier: {holder}, which holds lock {name!r} on the source. "
            "Two appliers must not run one pipeline, so this one did nothing. Leave that applier running (or stop it "
            "first); if it died, the source frees its lock as its connection drops (at once for a killed process, "
            f"within {LOCK_WAIT_TIMEOUT} s for a lost host): run this again then")

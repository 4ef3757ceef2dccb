"""A pipeline's lease: one applier at a time, and a dead one's successor starts within seconds.

**Mutual exclusion** is a MySQL named lock on the *source* server, ``<ledger database>:<pipeline>``
(core/source/locks.py: held on a connection of its own for the applier's whole run, freed by the
server the moment a killed applier's connection closes, or after ``LOCK_WAIT_TIMEOUT`` seconds of
a lost host's silence).

**Fencing** by generation: each acquisition takes the pipeline's highest generation in the
ledger plus one, every state row it writes carries it, and readers take the row of the highest
generation (core/cdc/checkpoints.py). A holder that lost its lock without noticing yet (a
stalled process, a partition) can therefore neither move the checkpoint back nor forward once
its successor has written. The holder itself stops at its next ledger write after a failed
check (:meth:`Lease.check`, called by every write of ``Checkpoints``): it notices within
``PING_SECONDS + PING_TIMEOUT`` seconds, before the server frees the lock.
"""

from __future__ import annotations

from airflow_sync_provider.core.endpoints import MySQLEndpoint
from airflow_sync_provider.core.source.locks import LOCK_WAIT_TIMEOUT, TAKEOVER_SECONDS, LockHeld, NamedLock, lock_name


class LeaseError(RuntimeError):
    pass


class LeaseHeld(LeaseError):
    """Another applier holds the pipeline."""


class LeaseLost(LeaseError):
    """This applier's lock is gone: it must not write again."""


class Lease:
    """Held from :meth:`acquire` until :meth:`release` (or the process's end)."""

    def __init__(self, pipeline: str, lock: NamedLock, generation: int):
        self.pipeline, self.lock, self.generation = pipeline, lock, generation
        self.name, self.holder = lock.name, lock.holder

    @property
    def lost(self) -> str:
        return self.lock.lost

    @classmethod
    def acquire(cls, source: MySQLEndpoint, checkpoints, pipeline: str) -> "Lease":
        """Take the pipeline or raise :class:`LeaseHeld` naming its holder and what to do."""
        try:
            lock = NamedLock.take(source, lock_name(checkpoints.database, pipeline), wait_seconds=TAKEOVER_SECONDS)
        except LockHeld as held:
            raise LeaseHeld(_refusal(checkpoints, pipeline, held)) from None
        try:  # under the lock: no other applier of this pipeline computes a generation now
            return cls(pipeline, lock, checkpoints.generation(pipeline) + 1)
        except BaseException:
            lock.release()
            raise

    def check(self) -> None:
        """Raise :class:`LeaseLost` if the lock is gone (called before every ledger write)."""
        if self.lost:
            raise LeaseLost(
                f"pipeline {self.pipeline!r}: this applier (generation {self.generation}) lost its lease — the source "
                f"connection holding lock {self.name!r} failed ({self.lost}) — and stops without writing again; "
                "another applier may have taken over. Check `airflow-sync cdc status`; if none runs, start one (it "
                "resumes from the checkpoint)")

    def release(self) -> None:
        self.lock.release()


def _refusal(checkpoints, pipeline: str, held: LockHeld) -> str:
    state = checkpoints.state(pipeline)
    holder = held.where
    if state is not None and held.connection_id is not None and \
            state.holder.endswith(f"source connection {held.connection_id}"):
        holder = f"{state.holder} (generation {state.generation})"
    return (f"pipeline {pipeline!r} is held by another applier: {holder}, which holds lock {held.name!r} on the "
            "source. Two appliers must not run one pipeline, so this one did nothing. Leave that applier running (or "
            "stop it first); if it died, the source frees its lock as its connection drops (at once for a killed "
            f"process, within {LOCK_WAIT_TIMEOUT} s for a lost host): run this again then")

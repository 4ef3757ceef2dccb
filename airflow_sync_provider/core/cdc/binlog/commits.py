"""Per transaction and per rows event, what a history row needs beyond the copy's row (issue 61;
docs/design/history-tables.md §2): a side table of a batch, not a wider item per row change.

* :class:`Commit`: one per transaction, at its GTID event's version (the transaction's first byte
  lies at or after it, and every row of it ranks above: pieces of a large transaction, and XA rows
  at their XA COMMIT's version, which lies inside the commit's own group), with its commit time
  in microseconds and its GTID. MariaDB writes the GTID event when the transaction commits: its
  header time is the commit's, to the second. MySQL ≥ 8.0 also writes ``immediate_commit_timestamp``
  (µs) in it, read by core/cdc/binlog/library.py. Without a GTID event (MySQL with ``gtid_mode=OFF``:
  its anonymous GTID events are not read) the transaction's first rows event stands in: its
  statement's start, to the second, and no GTID. The MySQL paths cannot run here (the test services
  are MariaDB only).
* :class:`Kinds`: one per rows event, its first row's version and whether it wrote, updated or
  deleted rows — each row's operation, refined by its flag (a tombstone in an update event is the
  old key of a key change, or a row leaving the copy's filter: a delete).

A row finds both by its version (:func:`stamps`: ``numpy.searchsorted``, vectorised), since versions
are binlog offsets and only grow within a batch's transactions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

INSERT, UPDATE, DELETE = "insert", "update", "delete"
KINDS = (INSERT, UPDATE, DELETE)


@dataclass(frozen=True)
class Commit:
    """A transaction: from ``version`` (its GTID event's, or its first rows event's) on."""

    version: int
    commit_us: int  # microseconds since the Unix epoch
    gtid_domain: str = ""  # MariaDB's domain id, MySQL's source uuid
    gtid_seq: int = 0
    server: str = ""  # the server it was committed on, named as core/cdc/servers.Server.key names it


def gtid_parts(gtid: str) -> tuple[str, int, str]:
    """(domain, sequence, server) of a GTID: MariaDB's ``domain-server-seq``, MySQL's ``uuid:seq``;
    the server it names as core/cdc/servers.Server.key does (a function of the transaction alone,
    so a replay, or a reader on a replica, stamps the same)."""
    if ":" in gtid:
        uuid, _, seq = gtid.rpartition(":")
        return uuid, int(seq), f"mysql:{uuid}"
    domain, server, seq = gtid.split("-")
    return domain, int(seq), f"mariadb:{server}:{domain}"


def commit_of(event, version: int) -> Commit:
    """The :class:`Commit` of a GTID event read at ``version`` (MariaDB's or MySQL's)."""
    micros = getattr(event, "immediate_commit_us", None)  # MySQL ≥ 8.0 (core/cdc/binlog/library.py)
    domain, seq, server = gtid_parts(str(event.gtid))
    return Commit(version, int(micros) if micros else int(event.timestamp) * 1_000_000, domain, seq, server)


@dataclass
class Stamps:
    """Per row of a table's changes, as Arrow arrays: commit time (µs), GTID domain and sequence,
    operation, server."""

    commit_us: pa.Array
    gtid_domain: pa.Array
    gtid_seq: pa.Array
    event: pa.Array
    server: pa.Array


def stamps(commits: list[Commit], kinds: list[tuple[int, int]], versions, deleted, where: str) -> Stamps:
    """Each row change's :class:`Stamps` from a batch's ``commits`` and rows events' ``kinds``
    ((first version, index in :data:`KINDS`), in binlog order); ``deleted``: the rows' flags (a
    tombstone of an update event is a delete). A row before every commit is a reader's bug: said.
    Vectorised: per transaction or event a value, taken per row (no Python object a row)."""
    versions = np.asarray(versions, dtype=np.uint64)
    starts = np.fromiter((c.version for c in commits), np.uint64, len(commits))
    at = np.searchsorted(starts, versions, side="right") - 1
    kind_at = np.searchsorted(np.fromiter((k for k, _ in kinds), np.uint64, len(kinds)), versions, side="right") - 1
    if (at < 0).any() or (kind_at < 0).any():
        first = int(versions[(at < 0) | (kind_at < 0)][0])
        raise RuntimeError(f"{where}: no transaction or rows event read before version {first} (a history row "
                           "needs its commit time)")
    codes = np.fromiter((code for _, code in kinds), np.int8, len(kinds))[kind_at] if len(versions) else \
        np.zeros(0, np.int8)
    codes[(codes == 1) & (np.asarray(deleted, dtype=np.int64) != 0)] = 2  # an update's tombstone: a delete
    take = pa.array(at, pa.int64())

    def per_commit(values, kind):
        return pa.array(values, kind).take(take)

    return Stamps(per_commit([c.commit_us for c in commits], pa.int64()),
                  per_commit([c.gtid_domain for c in commits], pa.string()),
                  per_commit([c.gtid_seq for c in commits], pa.uint64()),
                  pa.array(KINDS, pa.string()).take(pa.array(codes, pa.int8())),
                  per_commit([c.server for c in commits], pa.string()))

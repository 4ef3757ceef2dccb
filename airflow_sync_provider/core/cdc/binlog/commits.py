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
    """Per row of a table's changes: commit time (µs), GTID domain and sequence, operation, server."""

    commit_us: np.ndarray
    gtid_domain: list
    gtid_seq: np.ndarray
    event: list
    server: list


def stamps(commits: list[Commit], kinds: list[tuple[int, int]], versions, deleted, where: str) -> Stamps:
    """Each row change's :class:`Stamps` from a batch's ``commits`` and rows events' ``kinds``
    ((first version, index in :data:`KINDS`), in binlog order); ``deleted``: the rows' flags (a
    tombstone of an update event is a delete). A row before every commit is a reader's bug: said."""
    versions = np.asarray(versions, dtype=np.uint64)
    if not len(versions):
        return Stamps(np.zeros(0, np.int64), [], np.zeros(0, np.uint64), [], [])
    starts = np.fromiter((c.version for c in commits), np.uint64, len(commits))
    at = np.searchsorted(starts, versions, side="right") - 1
    kind_at = np.searchsorted(np.fromiter((k for k, _ in kinds), np.uint64, len(kinds)), versions, side="right") - 1
    if (at < 0).any() or (kind_at < 0).any():
        first = int(versions[(at < 0) | (kind_at < 0)][0])
        raise RuntimeError(f"{where}: no transaction or rows event read before version {first} (a history row "
                           "needs its commit time)")
    times = np.fromiter((c.commit_us for c in commits), np.int64, len(commits))[at]
    seqs = np.fromiter((c.gtid_seq for c in commits), np.uint64, len(commits))[at]
    rows = at.tolist()
    domains, servers = [commits[i].gtid_domain for i in rows], [commits[i].server for i in rows]
    codes = [kinds[i][1] for i in kind_at.tolist()]
    events = [DELETE if code == 2 or (code == 1 and flag) else KINDS[code] for code, flag in zip(codes, deleted)]
    return Stamps(times, domains, seqs, events, servers)

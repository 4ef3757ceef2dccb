"""What a read of the binlog hands on: a :class:`Batch` of complete transactions or a piece of a
large one, a cut inside a transaction (:class:`MidTransaction`), an XA transaction parked until
its commit (:class:`Parked`)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from airflow_sync_provider.core.cdc.binlog.routes import TableRoute
from airflow_sync_provider.core.positions import BinlogPosition

# the bound on a batch's and an open transaction's row-event bytes (CdcApplySpec.batch_bytes)
BATCH_BYTES = 16 << 20


@dataclass(frozen=True)
class MidTransaction:
    """A cut inside a transaction, at a rows event (:func:`split_backlog`). The share that
    starts here reads the statement's table maps from offset ``maps`` of ``at``'s file on, skips
    the rows events before ``at`` undecoded and continues the transaction that began at
    ``began`` (whose GTID state is the one before it); the share before it stops here. ``at``
    carries the epoch and the GTID state after the transaction: the share passes its commit."""

    at: BinlogPosition
    maps: int
    began: BinlogPosition

    def key(self) -> tuple[int, int, int]:
        return self.at.key()

    def __str__(self) -> str:
        return f"{self.at.file}:{self.at.pos} (inside the transaction that began at {self.began.file}:{self.began.pos})"


@dataclass
class Batch:
    """Complete transactions read from ``start`` up to ``end``, grouped by table and lane — or,
    when ``through`` is set, a **piece**: changes of one transaction still open at ``through``
    (it began at ``start``, which is also ``end``), handed on before its commit so that memory
    stays bounded whatever the transaction's size. The applier writes a piece at its versions
    but claims it (checkpoint, counters) only with the batch that holds the commit."""

    start: BinlogPosition
    end: BinlogPosition
    # table → lane → (rows, versions, deleted flags)
    lanes: dict = field(default_factory=lambda: defaultdict(lambda: defaultdict(lambda: ([], [], []))))
    events: int = 0  # row changes read
    per_table: dict = field(default_factory=lambda: defaultdict(int))
    # (statement, schema, position after it, timestamp): follow it before reading on. The batch
    # itself ends before the statement (``end``), so its checkpoint never passes an unfollowed DDL
    ddl: tuple | None = None
    done: bool = False  # the stop position (or the end of the binlog) was reached
    last_event_at: float = 0.0  # the source's timestamp of the last transaction
    # XA transactions prepared and not yet committed at ``end``: xid → where each began (a new
    # reader reads their rows again from there: see BinlogReader) and, for one kept in staging,
    # "staged": its row changes per table
    prepared: dict = field(default_factory=dict)
    xa_commits_unseen: int = 0  # XA COMMITs in it of transactions prepared before the reader's start
    through: BinlogPosition | None = None  # a piece: how far the open transaction was read
    bytes: int = 0  # row-event bytes of its changes
    # rows of one XA transaction kept in staging until its XA COMMIT (a batch of their own whose
    # ``start`` is where the transaction began): the applier writes them to staging tables
    staging: Batch | None = None
    # XA transactions kept in staging that ended here: {"began": position dict, "commit": bool,
    # "version": the commit's (None: XA COMMIT … ONE PHASE, rows keep theirs), "sources": {table:
    # lowest version kept}}
    staged_ends: list = field(default_factory=list)
    # parent row changes whose foreign keys act on followed children (core/cdc/cascades.Trigger)
    # between its changes of those children (cascades.Rows), in binlog order: the applier derives
    # the children's changes from them and the copies before it writes the batch
    cascades: list = field(default_factory=list)
    # its transactions' Commits and its rows events' (first version, kind): its history rows'
    # stamps (core/cdc/binlog/commits.py)
    commits: list = field(default_factory=list)
    kinds: list = field(default_factory=list)

    def add(self, route: TableRoute, lane: int, row: tuple, version: int, deleted: bool):
        rows, versions, flags = self.lanes[route.source][lane]
        rows.append(row)
        versions.append(version)
        flags.append(int(deleted))


@dataclass
class Parked:
    """A prepared XA transaction waiting for its XA COMMIT: its changes in memory, or — once they
    or everything parked outgrow the batch bounds — in staging (``staged``: rows per table)."""

    began: BinlogPosition
    changes: list = field(default_factory=list)
    bytes: int = 0
    staged: dict | None = None
    cascades: list = field(default_factory=list)  # its parent changes that cascade (kept in memory)

    def to_dict(self) -> dict:
        return self.began.to_dict() | ({"staged": dict(self.staged)} if self.staged is not None else {})

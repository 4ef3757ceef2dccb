"""What each part of a pipeline run may see of it: the run (spark/cdc_apply.PipelineRun, its start
in spark/cdc_start.RunStart) hands itself to the DDL follower and re-copies (spark/cdc_ddl.py), the
verifier (spark/cdc_verify.py) and the cascades (spark/cdc_cascades.py) typed as one of these views,
and each of those modules touches nothing of the run outside its view (tests/test_structure.py
reads every ``run.<name>`` they use). A new need is a line here, in sight of a reviewer.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from airflow_sync_provider.core.cdc.binlog.routes import TableRoute
from airflow_sync_provider.core.cdc.tables import PipelineTable, Registration
from airflow_sync_provider.core.positions import BinlogPosition

if TYPE_CHECKING:
    from airflow_sync_provider.core.cdc.checkpoints import Checkpoints, PipelineState
    from airflow_sync_provider.core.jobspec import CdcApplySpec
    from airflow_sync_provider.core.ledger import Ledger
    from airflow_sync_provider.core.selection import TableSelection
    from airflow_sync_provider.spark.session import LazySession


# --- what a run holds -------------------------------------------------------------------------

@dataclass
class Applying:
    """A transaction being applied in pieces: written past the stream's position, not claimed."""

    began: BinlogPosition
    since: float
    through: BinlogPosition | None = None
    pieces: int = 0
    changes: int = 0  # row changes written to the copy
    staged: int = 0  # rows of an XA transaction written to staging (core/cdc/staging.py)
    per_table: dict = field(default_factory=dict)  # source table → [row changes, rows written]

    def to_dict(self, joining: str = "") -> dict:
        return {"began": self.began.to_dict(), "through": (self.through or self.began).to_dict(), "since": self.since,
                "pieces": self.pieces, "changes": self.changes, "staged": self.staged} | (
                    {"joining": joining} if joining else {})


@dataclass
class Stream:
    """What one follow of the binlog applies: ``routes`` (name → route) of ``tables``, from
    ``position``. The pipeline's stream moves its checkpoint; a table joining replays its own
    changes up to the checkpoint first, moving its registration's ``since`` (``joining``)."""

    routes: dict[str, TableRoute]
    tables: list[PipelineTable]
    position: BinlogPosition
    joining: Registration | None = None
    applying: Applying | None = None  # the open transaction's pieces written so far
    # only the cascades into ``routes``' tables (after a re-copy: PipelineRun.replay_cascades);
    # their own row changes and DDL are the pipeline stream's, already applied
    cascades_only: bool = False


@dataclass
class Totals:
    events: int = 0
    rows_written: int = 0
    joined: list = field(default_factory=list)
    ddl: int = 0
    recopied: list = field(default_factory=list)
    verified: list = field(default_factory=list)
    repaired_shards: int = 0
    failover: dict = field(default_factory=dict)  # the source became another server: from, to, where
    binlog_lost: dict = field(default_factory=dict)  # the binlog the checkpoint needed was gone: what it cost
    xa_commits_unseen: int = 0  # commits of XA transactions prepared before the copy (BinlogReader)
    pieces: int = 0  # pieces of large transactions written (core/cdc/binlog/batches.Batch)
    xa_staged: int = 0  # rows of large XA transactions written to staging (core/cdc/staging.py)
    cascaded_rows: int = 0  # child rows written for foreign-key cascades (spark/cdc_cascades.py)
    cascade_seconds: float = 0.0  # the time spent deriving and writing them



# --- the views --------------------------------------------------------------------------------

class Recopying(Protocol):
    """A run's re-copies (spark/cdc_ddl.Recopies), as the verifier sees them."""

    def busy(self, name: str) -> bool: ...

    def start(self, routes: dict, table: PipelineTable, reason: str) -> bool: ...


class _Common(Protocol):
    spec: CdcApplySpec
    state: PipelineState  # the tables and the checkpoint
    stream: Stream  # its routes: each followed table's shape now
    checkpoints: Checkpoints  # fence(): writes only under the lease
    writing: threading.RLock  # held while a DDL is followed, a copy swapped or a slice repaired


class DdlRun(_Common, Protocol):
    """What following DDL, re-copies and shard moves use (spark/cdc_ddl.py)."""

    ch: object  # the ClickHouse client
    session: LazySession  # a re-copy's Spark job
    selection: TableSelection | None  # which tables a whole-database pipeline follows
    recopies: Recopying

    @property
    def epoch(self) -> int: ...

    @property
    def loads(self) -> Ledger: ...

    def replay_cascades(self, table: PipelineTable, since: BinlogPosition, cause: str = "re-copy") -> None: ...


class VerifiedRun(_Common, Protocol):
    """What rolling verification uses (spark/cdc_verify.py)."""

    recopies: Recopying  # busy(name): not looked at; start(...): a slice it cannot repair
    totals: Totals  # its looks and repairs, reported by the run
    stream_ended: bool

    @property
    def epoch(self) -> int: ...

    def log(self, text: str) -> None: ...

    def follow_to(self, position: BinlogPosition) -> bool: ...

    def replay_cascades(self, table: PipelineTable, since: BinlogPosition, cause: str = "re-copy") -> None: ...


class CascadingRun(_Common, Protocol):
    """What following foreign-key cascades uses (spark/cdc_cascades.py)."""

    ch: object

    def log(self, text: str) -> None: ...

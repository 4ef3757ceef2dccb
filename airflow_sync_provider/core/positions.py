"""Binlog positions, the one version scheme, and the source's binlog status per server flavour.

**Versions.** Every writer to a target table ranks its rows by the source's binlog order:

* a row change from the binlog gets ``(epoch << 56 | file_seq << 32 | event_start) + row_index``
  (the epoch: the server's, core/cdc/servers.py; 0 for the first server a ledger sees). A rows
  event of n rows is longer than n bytes (every row image has at least a null bitmap), so
  ``event_start + row_index`` stays below the next event's start: versions increase strictly
  along the binlog, across events, transactions, file rotations (``file_seq`` is the number in
  ``mysql-bin.000042``) and restarts (they rotate the file). No clock, no in-memory counter.
* a snapshot read (full-load shard, bootstrap chunk, diff apply) that saw exactly the changes
  before position P gets ``version(P) - 2``, and a repair's read ``version(P) - 1`` (so a
  repair outranks the copy it repairs even when no change happened in between): above every
  change before P (their versions are at most ``version(P) - 20``, an event header is 19
  bytes), below every change at or after P.
* a source without a binlog (full loads only, no CDC) has no order to follow: a load takes
  one more than the highest version the target holds.

Coordinates are one server's: after a failover another server's file numbers and offsets
continue none of them. So every server gets an **epoch** (core/cdc/servers.py), one above every
server seen before, in the version's top byte: whatever is read from a new server out-ranks
everything read from the old one. File numbers must stay below 2**24 (16,777,216).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

log = logging.getLogger(__name__)

SCHEME = "binlog-v1"  # marks target tables whose _version follows this module
# a snapshot read at P ranks just below P's own version (see the module's text): its rows, or a
# repair's (one above, so a repair outranks the copy it repairs)
SNAPSHOT_OFFSET, REPAIR_OFFSET = 2, 1
_FILE = re.compile(r"^(.*)\.(\d+)$")
EPOCH_SHIFT, MAX_FILE_SEQ = 56, 1 << 24  # the epoch is the version's top byte


class BinlogError(RuntimeError):
    """The source or its binlog cannot be followed as things are (binlog off, a purged file, a
    value or a change the copy cannot take…). The pipeline stops with its checkpoint before the
    cause, so a retry stops there again until the remedy the message names is applied."""

    retry_helps = False


class TransientBinlogError(BinlogError):
    """A failure a retry may cure (it replays from the checkpoint): a re-copy that failed, a
    definition that kept changing while it was read."""

    retry_helps = True


class ValueRefused(BinlogError, ValueError):
    """A value the copy's type would store wrongly (the full load refuses it the same way)."""


@dataclass(frozen=True, order=True)
class BinlogPosition:
    """A point between two events of one server's binlog: ``file`` and the byte offset ``pos``
    of the next event; ``gtid``: the server's GTID state there (how another server with the same
    history finds this point, core/cdc/servers.locate); ``epoch``: the server's
    (core/cdc/servers.py), the versions' top byte."""

    file: str
    pos: int
    gtid: str = ""
    epoch: int = 0

    def __post_init__(self):
        file_seq(self.file)
        if not 4 <= self.pos < 2 ** 32:
            raise ValueError(f"binlog position {self.pos} out of range in {self.file}")
        if not 0 <= self.epoch < 256:
            raise ValueError(f"epoch {self.epoch} out of range (0..255)")

    @property
    def seq(self) -> int:
        return file_seq(self.file)

    def version(self) -> int:
        """The version of the first row change at or after this position."""
        return event_version(self.file, self.pos, 0, self.epoch)

    def snapshot_version(self, repair: bool = False) -> int:
        """The version of a snapshot read that saw exactly the changes before this position."""
        return snapshot_version(self.version(), repair)

    def key(self) -> tuple[int, int, int]:
        """Order along the pipeline's binlog history: a later epoch (another server) comes after."""
        return self.epoch, self.seq, self.pos

    def __str__(self) -> str:
        return (f"{self.file}:{self.pos}" + (f" (gtid {self.gtid})" if self.gtid else "")
                + (f" [epoch {self.epoch}]" if self.epoch else ""))

    def to_dict(self) -> dict:
        return {"file": self.file, "pos": self.pos, "gtid": self.gtid, "epoch": self.epoch}

    @classmethod
    def from_dict(cls, data: dict | str | None, epoch: int = 0) -> "BinlogPosition | None":
        """From ``{"file", "pos"[, "gtid", "epoch"]}`` or the text ``file:pos`` (e.g. a rendered
        template); ``epoch`` when it names none."""
        if isinstance(data, str):
            if data.strip().startswith("{"):  # a dict rendered by a template
                import ast

                return cls.from_dict(ast.literal_eval(data.strip()), epoch)
            file, _, pos = data.strip().rpartition(":")
            return cls(file, int(pos), epoch=epoch) if file else None
        if not data:
            return None
        named = data.get("epoch")
        return cls(data["file"], int(data["pos"]), data.get("gtid") or "", epoch if named is None else int(named))


def file_seq(name: str) -> int:
    match = _FILE.match(name or "")
    if not match:
        raise ValueError(f"not a binlog file name: {name!r} (expected <base>.<number>)")
    if int(match.group(2)) >= MAX_FILE_SEQ:
        raise ValueError(f"binlog file {name!r}: numbers from {MAX_FILE_SEQ} on do not fit the versions "
                         "(core/positions.py); reset the server's binlog numbering (RESET MASTER) and reload")
    return int(match.group(2))


def event_version(file: str, event_start: int, row_index: int = 0, epoch: int = 0) -> int:
    return (epoch << EPOCH_SHIFT | file_seq(file) << 32 | event_start) + row_index


def snapshot_version(position_version: int, repair: bool = False) -> int:
    """The version of a snapshot read that saw exactly the changes before the position whose
    version is ``position_version`` (e.g. MariaDB's snapshot position as one number)."""
    return position_version - (REPAIR_OFFSET if repair else SNAPSHOT_OFFSET)


def version_position(version: int) -> tuple[int, int, int]:
    """(epoch, file_seq, offset) a version came from (for messages and status)."""
    return version >> EPOCH_SHIFT, (version >> 32) & (MAX_FILE_SEQ - 1), version & 0xFFFFFFFF


# --- the source's flavour and its status statements ---

@dataclass(frozen=True)
class Flavor:
    mariadb: bool
    version: tuple[int, ...]

    @classmethod
    def parse(cls, version_text: str) -> "Flavor":
        mariadb = "mariadb" in version_text.lower()
        if mariadb and version_text.startswith("5.5.5-"):  # the replication handshake's prefix
            version_text = version_text[6:]
        numbers = tuple(int(n) for n in re.findall(r"\d+", version_text.split("-")[0])[:3])
        return cls(mariadb, numbers)

    def status_statement(self) -> str:
        """The statement that shows the current binlog file and position."""
        if self.mariadb:
            return "SHOW BINLOG STATUS" if self.version >= (10, 5, 2) else "SHOW MASTER STATUS"
        return "SHOW BINARY LOG STATUS" if self.version >= (8, 2) else "SHOW MASTER STATUS"

    def gtid_statement(self) -> str | None:
        return "SELECT @@GLOBAL.gtid_binlog_pos" if self.mariadb else "SELECT @@GLOBAL.gtid_executed"


def account(conn) -> str:
    """The account the server authenticated this connection as, quoted for a GRANT: ``'sync'@'%'``."""
    with conn.cursor() as cur:
        cur.execute("SELECT CURRENT_USER()")
        row = cur.fetchone()
        text = next(iter(row.values())) if isinstance(row, dict) else row[0]  # (a DictCursor's row too)
    text = text.decode() if isinstance(text, bytes) else str(text)
    user, _, host = text.rpartition("@")
    return "'{}'@'{}'".format(user.replace("'", "''"), host.replace("'", "''"))


def grant(conn, privilege: str, on: str = "*.*") -> str:
    """The statement that gives this connection's account ``privilege`` (for an error to name)."""
    return f"GRANT {privilege} ON {on} TO {account(conn)}"


def monitor_privilege(kind: Flavor) -> str:
    """The privilege that shows the binlog's files and position: MariaDB >= 10.5.2 renamed
    REPLICATION CLIENT to BINLOG MONITOR."""
    return "BINLOG MONITOR" if kind.mariadb and kind.version >= (10, 5, 2) else "REPLICATION CLIENT"


def flavor(conn) -> Flavor:
    with conn.cursor() as cur:
        cur.execute("SELECT VERSION()")
        return Flavor.parse(cur.fetchone()[0])


def current_position(conn, kind: Flavor | None = None, epoch: int = 0) -> BinlogPosition | None:
    """The source's binlog position now (None when the binlog is off), of a server of ``epoch``.
    The GTID state is read first, so it never claims more than the file/position does."""
    kind = kind or flavor(conn)
    with conn.cursor() as cur:
        cur.execute(kind.gtid_statement())
        gtid = (cur.fetchone() or [""])[0] or ""
        cur.execute(kind.status_statement())
        row = cur.fetchone()
    if not row:
        return None
    return BinlogPosition(row[0], int(row[1]), str(gtid).replace("\n", ""), epoch)


def position_if_readable(conn, table: str, epoch: int = 0) -> BinlogPosition | None:
    """:func:`current_position`, or None (with a note naming ``table``) when the source has no
    binlog or the user may not see it: snapshot writers then version above the target's rows."""
    try:
        position = current_position(conn, epoch=epoch)
    except Exception as exc:  # e.g. no REPLICATION CLIENT / BINLOG MONITOR privilege
        try:
            remedy = (f"; to record it (a CDC pipeline can then start from this load): "
                      f"{grant(conn, monitor_privilege(flavor(conn)))}")
        except Exception:  # the connection itself is gone: the error above says why
            remedy = ""
        log.warning(f"table {table}: binlog position unavailable ({type(exc).__name__}: {exc}); the load's rows are "
                    f"versioned above the copy's highest{remedy}")
        return None
    if position is None:
        log.warning(f"table {table}: the source has no binlog; versions continue above the target's "
              "highest")
    return position


def snapshot_position(conn, kind: Flavor | None = None, fence: str | None = None,
                      epoch: int = 0) -> BinlogPosition | None:
    """Open a consistent-snapshot transaction on ``conn`` and return a binlog position P such that
    the snapshot sees every change before P (changes after P may or may not be visible: they
    outrank the snapshot's rows, so either way the newest value wins).

    MariaDB reports the snapshot's own position (``binlog_snapshot_file`` / ``_position``,
    taken under the commit order). MySQL has no such status: P is read before the snapshot
    opens, but a transaction already in the binlog before P may not yet be committed in the
    engine (binlog write precedes engine commit in group commit) and so be invisible to the
    snapshot while ranking below it. ``fence`` (a quoted MySQL table, see
    :func:`ensure_fence`) closes that window: a write committed after reading P returns only
    once every transaction before it in the binlog is committed in the engine too
    (``binlog_order_commits=ON``), so the snapshot opened after it sees all of them.
    Without a fence on MySQL the window (microseconds inside group commit) stays open;
    docs/cdc-bootstrap.md says so.
    """
    kind = kind or flavor(conn)
    before = None if kind.mariadb else current_position(conn, kind, epoch)
    with conn.cursor() as cur:
        if fence and not kind.mariadb:
            cur.execute(f"INSERT INTO {fence} (id, at) VALUES (1, NOW(6)) ON DUPLICATE KEY UPDATE at = NOW(6)")
            cur.execute("COMMIT")
        cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
        if not kind.mariadb:
            return before
        cur.execute("SHOW STATUS LIKE 'binlog_snapshot_%'")
        status = {name.lower(): value for name, value in cur.fetchall()}
    name, pos = status.get("binlog_snapshot_file"), status.get("binlog_snapshot_position")
    if not name:
        raise BinlogError("the source reports no binlog snapshot position (binlog off?)")
    return BinlogPosition(name, int(pos), epoch=epoch)


def ensure_fence(conn, table: str) -> str | None:
    """Create the watermark (fence) table ``table`` (quoted) and check that commits reach the
    engine in binlog order, which the fence relies on (MySQL; MariaDB needs no fence); returns
    the fence, or None on a read-only server (a replica: nothing may be written there, so the
    snapshots go unfenced, as without ``watermark_table``)."""
    with conn.cursor() as cur:
        cur.execute("SELECT @@GLOBAL.read_only")
        if int(cur.fetchone()[0]):
            log.warning(f"the source is read-only (read_only=ON: a replica?): the watermark table {table} cannot be "
                        "written, so the bootstrap's snapshots are not fenced (docs/cdc-bootstrap.md: the window "
                        "it closes stays open; point watermark_table at a writable primary to close it)")
            return None
        cur.execute("SELECT @@GLOBAL.binlog_order_commits")
        if not int(cur.fetchone()[0]):
            raise BinlogError("binlog_order_commits is OFF on the source: engine commits may then overtake the "
                              "binlog order and the watermark cannot fence a snapshot; turn it ON")
        cur.execute(f"CREATE TABLE IF NOT EXISTS {table} (id TINYINT PRIMARY KEY, at DATETIME(6)) ENGINE = InnoDB")
    return table

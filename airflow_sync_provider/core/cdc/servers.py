"""Which server a binlog position belongs to, its GTID state, and the epochs that keep versions
in order across servers.

A file and offset mean something on one server only: after a failover (a promoted replica behind
the same address, or a connection pointed at another server) the same coordinates name other
events, or none. So every checkpoint records the server it is a position on (:class:`Server`:
``@@server_uuid`` on MySQL, ``@@server_id`` and the GTID domain on MariaDB) and the GTID state
there; a run compares that with the server it reads and, on another server, finds the
checkpoint's GTID state in that server's binlog (:func:`locate`) and goes on from there.

**Epochs.** Versions are binlog coordinates (core/cdc/positions.py), and another server's
coordinates do not continue the first's (its file numbers and offsets can be lower). Every
server a ledger sees gets an epoch (:class:`ServerEpochs`, in the ledger), one more than any
before it, and a pipeline that moves to another server registers it again, so its epoch is the
highest; the epoch is the version's top byte. Every writer — CDC, full loads, repairs, bootstrap
chunks, re-copies, a diff's apply — takes the epoch of the server it read from, so whatever is
read from the new server out-ranks everything read from the old one. Epoch 0 is the version of
earlier releases (no migration: their copies keep their versions).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from airflow_sync_provider.core.cdc.positions import BinlogError, BinlogPosition, Flavor, flavor

MAX_EPOCH = 255


@dataclass(frozen=True)
class Server:
    """A server a binlog is read from, as it names itself."""

    mariadb: bool
    server_id: int
    uuid: str = ""  # MySQL's @@server_uuid
    domain: int = 0  # MariaDB's @@gtid_domain_id

    @property
    def key(self) -> str:
        return f"mysql:{self.uuid}" if not self.mariadb else f"mariadb:{self.server_id}:{self.domain}"

    def __str__(self) -> str:
        return (f"MySQL server {self.uuid}" if not self.mariadb
                else f"MariaDB server_id {self.server_id} (GTID domain {self.domain})")

    def to_dict(self) -> dict:
        return {"mariadb": self.mariadb, "server_id": self.server_id, "uuid": self.uuid, "domain": self.domain}

    @classmethod
    def from_dict(cls, data: dict | None) -> "Server | None":
        return cls(**data) if data else None


def server_of(conn, kind: Flavor | None = None) -> Server:
    kind = kind or flavor(conn)
    with conn.cursor() as cur:
        if kind.mariadb:
            cur.execute("SELECT @@GLOBAL.server_id, @@GLOBAL.gtid_domain_id")
            server_id, domain = cur.fetchone()
            return Server(True, int(server_id), domain=int(domain))
        cur.execute("SELECT @@GLOBAL.server_id, @@GLOBAL.server_uuid")
        server_id, uuid = cur.fetchone()
        return Server(False, int(server_id), str(uuid))


# --- GTID states ------------------------------------------------------------------------------
# MariaDB: "domain-server-seq" per domain, comma-separated (gtid_binlog_pos, gtid_slave_pos).
# MySQL: a GTID set "uuid:1-5:7,uuid2:1-3" (gtid_executed), through python-mysql-replication's GtidSet.

_MARIADB_GTID = re.compile(r"^(\d+)-(\d+)-(\d+)$")


def mariadb_state(text: str) -> dict[int, tuple[int, int]]:
    """``"0-1-100,1-2-5"`` → {domain: (server_id, seq)}."""
    out = {}
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        match = _MARIADB_GTID.match(part)
        if not match:
            raise ValueError(f"not a MariaDB GTID: {part!r} (expected domain-server-sequence)")
        domain, server, seq = map(int, match.groups())
        out[domain] = (server, seq)
    return out


def mariadb_text(state: dict[int, tuple[int, int]]) -> str:
    return ",".join(f"{d}-{s}-{n}" for d, (s, n) in sorted(state.items()))


def advance_state(state: str, gtid: str, mariadb: bool) -> str:
    """The GTID state after a transaction with ``gtid`` (what a reader carries from event to event)."""
    if mariadb:
        domains = mariadb_state(state)
        domain, server, seq = map(int, _MARIADB_GTID.match(gtid).groups())
        domains[domain] = (server, seq)
        return mariadb_text(domains)
    from pymysqlreplication.gtid import Gtid, GtidSet

    return str(GtidSet(state or None) + Gtid(gtid)) if state else str(GtidSet(gtid))


def missing_from(ours: str, theirs: str, mariadb: bool) -> str:
    """The part of GTID state ``ours`` that ``theirs`` does not have ("": nothing): transactions a
    copy holds that a server never had (a replica promoted while behind)."""
    if mariadb:
        a, b = mariadb_state(ours), mariadb_state(theirs)
        return mariadb_text({d: v for d, v in a.items() if v[1] > b.get(d, (0, 0))[1]})
    from pymysqlreplication.gtid import GtidSet

    mine, server = GtidSet(ours or None), GtidSet(theirs or None)
    return "" if mine <= server else str(_difference(mine, server))


def common_state(ours: str, theirs: str, mariadb: bool) -> str:
    """The newest state both have: where a stream on ``theirs``' server may start when ``ours`` is
    ahead of it in some domain (MariaDB: per domain the lower sequence; MySQL: the intersection)."""
    if mariadb:
        a, b = mariadb_state(ours), mariadb_state(theirs)
        return mariadb_text({d: v if v[1] <= b.get(d, (0, 0))[1] else b[d] for d, v in a.items() if d in b})
    from pymysqlreplication.gtid import GtidSet

    mine, server = GtidSet(ours or None), GtidSet(theirs or None)
    return str(_difference(mine, _difference(mine, server)))


def _difference(a, b):
    """GtidSet a − b (python-mysql-replication's GtidSet has ``-`` for a single Gtid only)."""
    from pymysqlreplication.gtid import GtidSet

    out = GtidSet(str(a) or None)
    for gtid in b.gtids:
        for start, end in gtid.intervals:
            out = _minus(out, gtid.sid, start, end)
    return out


def _minus(gtid_set, sid: str, start: int, end: int):
    from pymysqlreplication.gtid import Gtid, GtidSet

    parts = []
    for gtid in gtid_set.gtids:
        if gtid.sid != sid:
            parts.append(str(gtid))
            continue
        keep = []
        for a, b in gtid.intervals:  # half-open [a, b)
            if b <= start or a >= end:
                keep.append((a, b))
                continue
            if a < start:
                keep.append((a, start))
            if b > end:
                keep.append((end, b))
        if keep:
            parts.append(str(Gtid(sid + ":" + ":".join(f"{a}-{b - 1}" if b - 1 > a else f"{a}" for a, b in keep))))
    return GtidSet(",".join(parts) or None)


def gtid_state(conn, kind: Flavor | None = None) -> str:
    kind = kind or flavor(conn)
    with conn.cursor() as cur:
        cur.execute(kind.gtid_statement())
        return str((cur.fetchone() or [""])[0] or "").replace("\n", "")


# --- finding a GTID state in a server's binlog -------------------------------------------------

class GtidNotFound(BinlogError):
    """The server's binlog does not have what follows the state (purged, or a diverged history)."""


def locate(endpoint, state: str, mariadb: bool, server_id: int, epoch: int) -> BinlogPosition:
    """The position in this server's binlog right after GTID state ``state``: where the first
    transaction the state does not cover begins (the end of the binlog when there is none). Raises
    :class:`GtidNotFound` when the server cannot serve the state."""
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.event import GtidEvent, MariadbGtidEvent, RotateEvent

    from airflow_sync_provider.core.cdc.positions import current_position

    settings = endpoint.connect_args()
    settings.pop("database", None)
    stream = BinLogStreamReader(connection_settings=settings, server_id=server_id, blocking=False,
                                auto_position=state, is_mariadb=mariadb,
                                only_events=[GtidEvent, MariadbGtidEvent, RotateEvent])
    try:
        for event in stream:
            if isinstance(event, (GtidEvent, MariadbGtidEvent)):
                return BinlogPosition(stream.log_file, stream.log_pos - event.event_size, state, epoch)
    except Exception as exc:  # pymysql's OperationalError 1236: the server cannot find or serve the state
        raise GtidNotFound(f"the server cannot stream from GTID state {state!r}: {exc}") from exc
    finally:
        stream.close()
    import pymysql

    with pymysql.connect(**endpoint.connect_args()) as conn:
        here = current_position(conn, epoch=epoch)
    return BinlogPosition(here.file, here.pos, state, epoch)


# --- epochs in the ledger -----------------------------------------------------------------------

_SERVERS = (("server", "String"), ("epoch", "UInt8"), ("at", "DateTime64(6, 'UTC')"))


class ServerEpochs:
    """The epoch of each server a ledger has seen (``airflow_sync.source_servers``: a row per
    registration; a server's epoch is its newest row's)."""

    def __init__(self, ledger):
        from airflow_sync_provider.core.ledger import LedgerTables

        self.tables = ledger if isinstance(ledger, LedgerTables) else None
        self.ch, self.database = ledger.ch, ledger.database

    def _table(self) -> str:
        from airflow_sync_provider.core.sql import ch_table

        return ch_table(self.database, "source_servers")

    def ensure(self) -> None:
        from airflow_sync_provider.core.sql import ch_ident

        self.ch.command(f"CREATE DATABASE IF NOT EXISTS {ch_ident(self.database)}")
        body = ", ".join(f"{ch_ident(n)} {t}" for n, t in _SERVERS)
        self.ch.command(f"CREATE TABLE IF NOT EXISTS {self._table()} ({body}) ENGINE = MergeTree ORDER BY (server, at)")

    def epoch(self, server: Server) -> int:
        """The server's epoch; a server seen for the first time gets one above every other."""
        rows = self.ch.query(f"SELECT epoch FROM {self._table()} WHERE server = {{s:String}} ORDER BY at DESC LIMIT 1",
                             parameters={"s": server.key}).result_rows
        return int(rows[0][0]) if rows else self.register(server)

    def register(self, server: Server) -> int:
        """Give ``server`` an epoch above every other (a pipeline moving to it: what it reads from now
        on out-ranks everything read before, even from a server that was this one once)."""
        seen, top = self.ch.query(f"SELECT count(), max(epoch) FROM {self._table()}").result_rows[0]
        epoch = int(top) + 1 if seen else 0
        if epoch > MAX_EPOCH:
            raise BinlogError(f"{server}: the ledger has seen {MAX_EPOCH + 1} server changes, the most versions can "
                              "tell apart; reload the copies in full into a new ledger database")
        self.ch.insert(self._table(), [[server.key, epoch, time.time()]], column_names=[n for n, _ in _SERVERS])
        return epoch

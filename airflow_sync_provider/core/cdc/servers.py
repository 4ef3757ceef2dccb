"""Which server a binlog position belongs to, its GTID state, and the epochs that keep versions
in order across servers.

A file and offset mean something on one server only: after a failover (a promoted replica behind
the same address, or a connection pointed at another server) the same coordinates name other
events, or none. So every checkpoint records the server it is a position on (:class:`Server`:
``@@server_uuid`` on MySQL, ``@@server_id`` and the GTID domain on MariaDB) and the GTID state
there; a run compares that with the server it reads and, on another server, finds the
checkpoint's GTID state in that server's binlog (:func:`locate`) and goes on from there.

**Epochs.** Versions are binlog coordinates (core/positions.py), and another server's
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
from dataclasses import dataclass

from airflow_sync_provider.core.positions import BinlogError, BinlogPosition, Flavor, flavor

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


class GtidState:
    """A GTID state kept up to date transaction by transaction (a reader's, cheap per event):
    MariaDB's last GTID per domain, or MySQL's executed set."""

    def __init__(self, text: str = ""):
        self._text, self._domains, self._set = text or "", None, None

    def add(self, gtid: str, mariadb: bool) -> None:
        if mariadb:
            if self._domains is None:
                self._domains = mariadb_state(self._text)
            domain, server, seq = map(int, _MARIADB_GTID.match(gtid).groups())
            self._domains[domain] = (server, seq)
        else:
            from pymysqlreplication.gtid import Gtid, GtidSet

            if self._set is None:
                self._set = GtidSet(self._text or None)
            self._set = self._set + Gtid(gtid)
        self._text = None

    def text(self) -> str:
        if self._text is None:
            self._text = mariadb_text(self._domains) if self._domains is not None else str(self._set)
        return self._text


def missing_from(ours: str, theirs: str, mariadb: bool) -> str:
    """The part of GTID state ``ours`` that ``theirs`` does not have ("": nothing): transactions a
    copy holds that a server never had (a replica promoted while behind)."""
    if mariadb:
        a, b = mariadb_state(ours), mariadb_state(theirs)
        return mariadb_text({d: v for d, v in a.items() if v[1] > b.get(d, (0, 0))[1]})
    return _mysql_minus(ours, theirs)


def common_state(ours: str, theirs: str, mariadb: bool) -> str:
    """The newest state both have: where a stream on ``theirs``' server may start when ``ours`` is
    ahead of it in some domain (MariaDB: per domain the lower sequence; MySQL: the intersection)."""
    if mariadb:
        a, b = mariadb_state(ours), mariadb_state(theirs)
        return mariadb_text({d: v if v[1] <= b.get(d, (0, 0))[1] else b[d] for d, v in a.items() if d in b})
    return _mysql_minus(ours, _mysql_minus(ours, theirs))


def _mysql_minus(a: str, b: str) -> str:
    """MySQL GTID sets: ``a`` without ``b``."""
    from pymysqlreplication.gtid import GtidSet

    if not a:
        return ""
    theirs = GtidSet(b or None).gtids if b else []
    left = []
    for gtid in GtidSet(a).gtids:
        for other in theirs:
            gtid = gtid - other  # a no-op for another server's uuid
        if gtid.intervals:
            left.append(str(gtid))
    return ",".join(left)


def with_their_domains(state: str, theirs: str, mariadb: bool) -> str:
    """MariaDB: ``state`` with the domains only ``theirs`` has, at their position there (a promoted
    replica's own writes, in a domain the pipeline never saw: not asked for again from the start)."""
    if not mariadb:
        return state
    ours = mariadb_state(state)
    return mariadb_text({**{d: v for d, v in mariadb_state(theirs).items() if d not in ours}, **ours})


_GTID_INFO = re.compile(r"GTID (\d+)-(\d+)-(\d+)")


def shared_history(conn, ours: str) -> str | None:
    """MariaDB, a server whose history left ours (a replica promoted while behind: after the last
    transaction it got from our server it wrote its own, under the same sequence numbers): per
    domain, the newest GTID of ours it has — the newest one in its binlog from our server with a
    sequence not beyond ours. None when a domain has none (its binlog no longer reaches back)."""
    wanted = mariadb_state(ours)
    found: dict[int, tuple[int, int]] = {}
    with conn.cursor() as cur:
        cur.execute("SHOW BINARY LOGS")
        files = [row[0] for row in cur.fetchall()]
        for file in reversed(files):  # newest first: the divergence is recent
            cur.execute("SHOW BINLOG EVENTS IN %s", (file,))
            for *_, kind, _server, _end, info in cur.fetchall():
                match = kind == "Gtid" and _GTID_INFO.search(info or "")
                if not match:
                    continue
                domain, server, seq = map(int, match.groups())
                if domain in wanted and server == wanted[domain][0] and seq <= wanted[domain][1] \
                        and seq > found.get(domain, (0, 0))[1]:
                    found[domain] = (server, seq)
            if len(found) == len(wanted):
                break
    return mariadb_text(found) if len(found) == len(wanted) else None


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
    from pymysqlreplication.event import GtidEvent, MariadbGtidEvent

    from airflow_sync_provider.core.positions import current_position
    from airflow_sync_provider.core.tls import SourceRefused

    stream = BinLogStreamReader(**endpoint.replication_args(), server_id=server_id, blocking=False,
                                auto_position=state, is_mariadb=mariadb)
    try:
        before = None  # where the event before it ended: the first transaction's own start
        for event in stream:
            if isinstance(event, (GtidEvent, MariadbGtidEvent)):
                return BinlogPosition(stream.log_file, before, state, epoch)
            before = stream.log_pos  # (the server sends a Gtid_list ending where it skipped to)
    except SourceRefused:
        raise
    except Exception as exc:  # pymysql's OperationalError 1236: the server cannot find or serve the state
        raise GtidNotFound(f"the server cannot stream from GTID state {state!r}: {exc}") from exc
    finally:
        stream.close()
    with endpoint.connect() as conn:
        here = current_position(conn, epoch=epoch)
    return BinlogPosition(here.file, here.pos, state, epoch)


# --- epochs in the ledger -----------------------------------------------------------------------

_SERVERS = (("server", "String"), ("epoch", "UInt8"), ("at", "DateTime64(6, 'UTC')"))


class ServerEpochs:
    """The epoch of each server a ledger has seen (``airflow_sync.source_servers``: a row per
    claim of an epoch by a server).

    An epoch belongs to the server that claimed it first (the ClickHouse server's clock, then the
    server key); a server's epoch is the highest it owns. Claims take no lock (ClickHouse has no
    transactions), so every claim reads the table in one statement, inserts, and reads the
    epoch's owner back: processes that see a server for the first time at once (three backfill
    days, a bootstrap and a sensor) read the same state and claim the same epoch, and of two
    servers that claimed one epoch at once the later takes the next one before writing anything.
    """

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
        return self._claim(server, highest=False)

    def register(self, server: Server) -> int:
        """The server's epoch, made the highest: a pipeline moving to it (what it reads from now on
        out-ranks everything read before, even from a server that was this one once). A server
        that already has the highest epoch keeps it (the second pipeline to move to it)."""
        return self._claim(server, highest=True)

    def server_of_epoch(self, epoch: int) -> Server | None:
        """The server that owns ``epoch`` (None: no server claimed it)."""
        rows = self.ch.query(f"SELECT argMin(server, (at, server)) FROM {self._table()} WHERE epoch = {{e:UInt8}} "
                             "HAVING count() > 0", parameters={"e": epoch}).result_rows
        if not rows:
            return None
        kind, rest = rows[0][0].split(":", 1)
        if kind == "mysql":
            return Server(False, 0, rest)
        server_id, domain = rest.split(":")
        return Server(True, int(server_id), domain=int(domain))

    def _claim(self, server: Server, highest: bool) -> int:
        owners = f"SELECT epoch, argMin(server, (at, server)) AS owner FROM {self._table()} GROUP BY epoch"
        for _ in range(MAX_EPOCH + 2):
            owned, mine, top, seen = self.ch.query(
                f"SELECT countIf(owner = {{s:String}}), maxIf(epoch, owner = {{s:String}}), max(epoch), count() "
                f"FROM ({owners})", parameters={"s": server.key}).result_rows[0]
            if owned and (not highest or mine == top):
                return int(mine)
            epoch = int(top) + 1 if seen else 0
            if epoch > MAX_EPOCH:
                raise BinlogError(f"{server}: the ledger has seen {MAX_EPOCH + 1} server changes, the most versions "
                                  "can tell apart; reload the copies in full into a new ledger database")
            self.ch.command(f"INSERT INTO {self._table()} SELECT {{s:String}}, {{e:UInt8}}, now64(6, 'UTC')",
                            parameters={"s": server.key, "e": epoch})
            holder = self.server_of_epoch(epoch)
            if holder is not None and holder.key == server.key:
                return epoch
        raise BinlogError(f"{server}: no epoch could be claimed in the ledger {self.database!r}")


def source_epoch(conn, ch, ledger_database: str) -> int:
    """The epoch of the server ``conn`` reads from, as the ledger on ``ch`` knows it (registered
    when first seen): the top byte of every version a writer reading it gives its rows."""
    from airflow_sync_provider.core.ledger import LedgerTables

    epochs = ServerEpochs(LedgerTables(ch, ledger_database))
    epochs.ensure()
    return epochs.epoch(server_of(conn))


# --- has a checkpoint reached a position? ---------------------------------------------------------

_MYSQL_GTID = re.compile(r"^[0-9a-fA-F-]{36}:\d+")


def is_gtid(text: str) -> bool:
    """A GTID state (MariaDB ``0-1-100,1-2-5`` or a MySQL GTID set) rather than ``file:pos``."""
    first = (text or "").strip().split(",")[0].strip()
    return bool(_MARIADB_GTID.match(first) or _MYSQL_GTID.match(first))


def covers(state: str, wanted: str) -> bool:
    """Does GTID state ``state`` include every transaction of ``wanted``?"""
    if not wanted:
        return True
    if _MARIADB_GTID.match(wanted.split(",")[0].strip()):
        have = mariadb_state(state) if state and _MARIADB_GTID.match(state.split(",")[0].strip()) else {}
        return all(have.get(d, (0, 0))[1] >= seq for d, (_, seq) in mariadb_state(wanted).items())
    from pymysqlreplication.gtid import GtidSet

    return bool(state) and GtidSet(wanted) in GtidSet(state)


def reached(checkpoint: BinlogPosition, target: "BinlogPosition | str") -> bool:
    """Has a pipeline at ``checkpoint`` applied everything before ``target`` (a position, or a GTID
    state)? Positions of one server compare as coordinates; of servers before and after a
    failover, by GTID when both carry one, else by epoch (a later server comes after)."""
    if isinstance(target, str):
        return covers(checkpoint.gtid, target)
    if target.epoch != checkpoint.epoch and target.gtid and checkpoint.gtid:
        return covers(checkpoint.gtid, target.gtid)
    return checkpoint.key() >= target.key()


def as_target(value, epoch: int = 0) -> "BinlogPosition | str | None":
    """A sensor's ``position``: ``{"file", "pos"[, "gtid", "epoch"]}``, ``"file:pos"`` or a GTID
    state. A position that names no epoch is one on the server read now (``epoch``): a
    ``file:pos`` read off the source by hand after a failover must not compare as the first
    server's, which every checkpoint since has passed."""
    if isinstance(value, BinlogPosition) or value is None:
        return value
    if isinstance(value, str) and is_gtid(value):
        return value.strip()
    return BinlogPosition.from_dict(value, epoch)

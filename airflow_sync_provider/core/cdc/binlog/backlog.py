"""Splitting a bounded run's backlog between reader processes: cut points from SHOW BINLOG EVENTS."""

from __future__ import annotations

import re

from airflow_sync_provider.core.cdc import ddl
from airflow_sync_provider.core.cdc.binlog.batches import MidTransaction
from airflow_sync_provider.core.cdc.servers import GtidState
from airflow_sync_provider.core.endpoints import MySQLEndpoint
from airflow_sync_provider.core.positions import BinlogPosition, file_seq

_ROWS_EVENT = re.compile(r"^(Write|Update|Delete)_rows")
_USE_PREFIX = re.compile(r"^\s*use\s+`(?:[^`]|``)*`\s*;\s*", re.IGNORECASE)
_GTID_INFO = re.compile(r"GTID (\d+-\d+-\d+)|GTID_NEXT\s*=\s*'([^']+)'")  # MariaDB's / MySQL's Gtid event
MAX_CUT_CANDIDATES = 4096  # kept while reading a backlog (every other one dropped beyond): bounded memory


def split_backlog(events, parts: int, min_bytes: int,
                  start: BinlogPosition | None = None) -> list[BinlogPosition | MidTransaction] | None:
    """Cut points that split the row-event bytes of ``events`` — (file, pos, type, end_pos,
    info) rows of SHOW BINLOG EVENTS from ``start``, in binlog order — into about ``parts``
    equal shares: positions right after a commit, or inside a transaction at a rows event
    (:class:`MidTransaction`), so that a large transaction's pieces are decoded in parallel
    too. Given ``start``, every cut carries its epoch and the GTID state there (``start``'s
    plus the transactions passed): what a reader starting at the cut continues from.
    ``[]``: too little to split (under ``min_bytes``); None: a DDL statement lies in the range,
    so its reading must stay in one piece (the routes change there), or an XA transaction (its
    rows are applied at its commit, which one reader must see)."""
    epoch = start.epoch if start is not None else 0
    gtids = GtidState(start.gtid) if start is not None else None
    state = gtids.text() if gtids else ""  # the GTID state after the last commit
    candidates, weight = [], 0  # (cut, row-event bytes before it)
    began = start  # where the open transaction began (after the last commit)
    maps, in_maps, rows = None, False, 0  # its statement's first Table_map event, rows events so far
    for file, pos, kind, end_pos, info in events:
        kind = "Query" if kind == "Query_compressed" else kind  # MariaDB's log_bin_compress=ON
        if began is None:
            began = BinlogPosition(file, pos, state, epoch)
        if kind == "Gtid" and gtids is not None and (match := _GTID_INFO.search(info or "")):
            gtids.add(match.group(1) or match.group(2), mariadb=bool(match.group(1)))
        elif kind == "Table_map":
            maps, in_maps = (maps if in_maps else pos), True
        elif _ROWS_EVENT.match(kind):  # Write_rows_v1, Write_rows_compressed_v1 …: bytes as written
            if rows and maps is not None:  # a share may start here, reading from the statement's table maps
                at = BinlogPosition(file, pos, gtids.text() if gtids else "", epoch)
                candidates.append((MidTransaction(at, maps, began), weight))
            weight += end_pos - pos
            in_maps, rows = False, rows + 1
        elif kind == "Xid" or kind == "Query" and _USE_PREFIX.sub("", info or "").strip().upper() == "COMMIT":
            state = gtids.text() if gtids else ""
            began = BinlogPosition(file, end_pos, state, epoch)
            candidates.append((began, weight))
            maps, in_maps, rows = None, False, 0
        elif kind == "Query" and ddl.parse(_USE_PREFIX.sub("", info or ""), "") is not None:
            return None
        elif kind == "XA_prepare" or kind == "Query" and _USE_PREFIX.sub("", info or "").upper().startswith("XA "):
            return None  # a prepared transaction's rows travel to its commit: one reader sees both
        if len(candidates) > MAX_CUT_CANDIDATES:
            candidates = candidates[1::2]
    if parts < 2 or weight < min_bytes:
        return []
    cuts, share = [], weight / parts
    for position, before in candidates:
        if before >= share * (len(cuts) + 1) and before < weight:
            cuts.append(position)
            if len(cuts) == parts - 1:
                break
    return cuts


BACKLOG_PAGE = 20_000  # SHOW BINLOG EVENTS rows read at a time (a large transaction is many events)


def backlog_events(endpoint: MySQLEndpoint, start: BinlogPosition, stop: BinlogPosition):
    """SHOW BINLOG EVENTS from ``start`` (an event boundary: a checkpoint) up to ``stop``, read a
    page at a time. Raw bytes: an Info column quotes statements, binary values and all."""
    conn = endpoint.connect(use_unicode=False)
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW BINARY LOGS")
            files = [row[0].decode() for row in cur.fetchall()]
            for file in [f for f in files if start.seq <= file_seq(f) <= stop.seq]:
                at = start.pos if file == start.file else 4
                while True:
                    cur.execute(f"SHOW BINLOG EVENTS IN %s FROM %s LIMIT {BACKLOG_PAGE}", (file, at))
                    rows = cur.fetchall()
                    for name, pos, kind, _server, end_pos, info in rows:
                        if (stop.epoch, file_seq(name.decode()), pos) >= stop.key():
                            return
                        yield file, pos, kind.decode(), end_pos, (info or b"").decode(errors="replace")
                    if len(rows) < BACKLOG_PAGE:
                        break
                    at = rows[-1][4]  # the next event begins where the page's last ended
    finally:
        conn.close()

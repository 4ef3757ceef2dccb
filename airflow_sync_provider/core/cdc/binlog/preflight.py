"""Before a pipeline reads: refuse, with what to do, a source that cannot feed CDC."""

from __future__ import annotations

import logging

import pymysql
from pymysqlreplication.event import RotateEvent

from airflow_sync_provider.core.cdc.binlog.gate import CheckedBinLogStream
from airflow_sync_provider.core.endpoints import MySQLEndpoint
from airflow_sync_provider.core.positions import BinlogError, BinlogPosition, flavor, grant, monitor_privilege

log = logging.getLogger(__name__)


class BinlogLost(BinlogError):
    """The binlog a checkpoint needs is no longer on the source (purged)."""


def preflight(conn, start: BinlogPosition | None, endpoint: MySQLEndpoint, server_id: int) -> list[str]:
    """Refuse, with what to do, a source that cannot feed CDC from ``start``; returns the
    binlog files the server still has (``conn``: pymysql, to ``endpoint``). The user's right to
    stream the binlog is tried with a dump from its end as replica ``server_id`` (one no
    pipeline uses: a server drops a replica's older dump when another registers with its id)."""
    with conn.cursor() as cur:
        cur.execute("SHOW GLOBAL VARIABLES WHERE Variable_name IN"
                    " ('log_bin', 'binlog_format', 'binlog_row_image', 'binlog_row_metadata')")
        settings = {name.lower(): str(value).upper() for name, value in cur.fetchall()}
        wanted = {"log_bin": "ON", "binlog_format": "ROW", "binlog_row_image": "FULL", "binlog_row_metadata": "FULL"}
        wrong = {k: settings.get(k, "(not supported)") for k, v in wanted.items() if settings.get(k) != v}
        if wrong:
            raise BinlogError("the source cannot feed CDC: " + ", ".join(f"{k}={v}" for k, v in wrong.items())
                              + "; it needs log_bin=ON, binlog_format=ROW, binlog_row_image=FULL and "
                                "binlog_row_metadata=FULL (MySQL >= 8.0.14 or MariaDB >= 10.5) and a server_id")
        try:
            cur.execute("SHOW BINARY LOGS")
            files = [row[0] for row in cur.fetchall()]
        except pymysql.err.OperationalError as exc:  # access denied
            privilege = monitor_privilege(flavor(conn))
            raise BinlogError(f"user {endpoint.user!r} may not read the binlog ({exc}); CDC needs {privilege} to "
                              f"list it and REPLICATION SLAVE to stream it: {grant(conn, privilege)}") from exc
    check_compression(conn)
    check_dump(endpoint, files[-1] if files else None, server_id)
    if start is not None and start.file not in files:
        raise BinlogLost(f"the binlog file {start.file} holding the checkpoint {start} was purged from the source "
                          f"(it has {files[0] if files else 'none'} … {files[-1] if files else ''}): the changes "
                          "since then are gone. Re-bootstrap: run a fresh full load of the tables and start the "
                          "pipeline again from it (start_from_loads=[...], reset=True)")
    return files


def check_dump(endpoint: MySQLEndpoint, last_file: str | None, server_id: int) -> None:
    """Preflight: the user may stream the binlog (REPLICATION SLAVE): a dump of the last file's
    head, nothing of it read (CheckedBinLogStream names the grant when the server refuses)."""
    if last_file is None:
        return
    stream = CheckedBinLogStream(**endpoint.replication_args(), server_id=server_id, blocking=False,
                                 resume_stream=True, log_file=last_file, log_pos=4, only_events=[RotateEvent],
                                 followed=lambda: {})
    try:
        stream.fetchone()
    finally:
        stream.close()


def check_compression(conn) -> None:
    """Preflight: refuse MySQL's compressed transactions (the reader cannot decode them); MariaDB's
    compressed events are decoded (the shims above)."""
    with conn.cursor() as cur:
        cur.execute("SHOW GLOBAL VARIABLES WHERE Variable_name IN ('binlog_transaction_compression', "
                    "'log_bin_compress', 'log_bin_compress_min_len')")
        settings = {str(name).lower(): str(value).upper() for name, value in cur.fetchall()}
    if settings.get("binlog_transaction_compression") == "ON":
        raise BinlogError(
            "the source cannot feed CDC: binlog_transaction_compression=ON (MySQL writes each transaction as "
            "one zstd-compressed Transaction_payload event, which python-mysql-replication 1.0.17 does not "
            "decode: the changes would be lost). Set binlog_transaction_compression=OFF (SET PERSIST, and in "
            "sessions that set it) and start again; a checkpoint older than the change needs a re-bootstrap "
            "if compressed transactions were written since")
    if settings.get("log_bin_compress") == "ON":
        log.info("the source compresses its binlog events (log_bin_compress=ON, min length %s): decoded",
                  settings.get("log_bin_compress_min_len", "?"))

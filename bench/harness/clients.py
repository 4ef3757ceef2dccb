"""Clients of both sides, opened through the endpoints only (core/endpoints.py), which apply TLS
and a connection's extras: :func:`mysql` is ``MySQLEndpoint.connect``, :func:`ch_client` is
core/clickhouse/client. A bench opens no connection of its own. And the bench's databases.
"""

from __future__ import annotations

from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint


def source(url_or_endpoint) -> MySQLEndpoint:
    return url_or_endpoint if isinstance(url_or_endpoint, MySQLEndpoint) else MySQLEndpoint.from_url(url_or_endpoint)


def target(url_or_endpoint) -> ClickHouseEndpoint:
    return (url_or_endpoint if isinstance(url_or_endpoint, ClickHouseEndpoint)
            else ClickHouseEndpoint.from_url(url_or_endpoint))


def mysql(url_or_endpoint, database: str | None = None, **overrides):
    """A pymysql connection, autocommit unless ``autocommit=False``: ``MySQLEndpoint.connect``
    (TLS and the URL's settings applied; ``overrides`` replace pymysql arguments)."""
    if database:
        overrides["database"] = database
    return source(url_or_endpoint).connect(**{"autocommit": True, **overrides})


def ch_client(url_or_endpoint, **kwargs):
    """A clickhouse-connect client: core/clickhouse/client (statements may take 2 h)."""
    from airflow_sync_provider.core.clickhouse.client import client
    return client(target(url_or_endpoint), **{"send_receive_timeout": 7200, **kwargs})


# --- the bench's databases ------------------------------------------------------------------------

def target_databases(ch_url, create=(), drop=()) -> None:
    """On the ClickHouse side: ``drop`` dropped, then ``create`` created if not there."""
    from airflow_sync_provider.core.sql import ch_ident

    ch = ch_client(ch_url)
    try:
        for name in drop:
            ch.command(f"DROP DATABASE IF EXISTS {ch_ident(name)}")
        for name in create:
            ch.command(f"CREATE DATABASE IF NOT EXISTS {ch_ident(name)}")
    finally:
        ch.close()


def drop_bench_data(mysql_url, ch_url=None, source_dbs=(), target_dbs=()) -> None:
    """A bench's databases on both sides, and the source's binlog of the generated rows (RESET
    MASTER: the bench's own server; GBs at 10M rows)."""
    if ch_url is not None:
        target_databases(ch_url, drop=target_dbs)
    with mysql(mysql_url) as conn, conn.cursor() as cur:
        for name in source_dbs:
            cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
        cur.execute("RESET MASTER")


def source_stats(mysql_url, database: str, table: str, key: str = "id") -> tuple[int, int, int]:
    """COUNT(*), MIN(key), MAX(key) of a source table."""
    with mysql(mysql_url) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT COUNT(*), MIN(`{key}`), MAX(`{key}`) FROM `{database}`.`{table}`")
        return tuple(int(v) for v in cur.fetchone())


def source_columns(mysql_url, database: str, table: str) -> list[str]:
    """A source table's columns in their order."""
    with mysql(mysql_url) as conn, conn.cursor() as cur:
        cur.execute("SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s "
                    "ORDER BY ORDINAL_POSITION", (database, table))
        return [row[0] for row in cur.fetchall()]

"""The ClickHouse client (clickhouse-connect): one per job, or one shared by a process's threads."""

from __future__ import annotations

import threading

import clickhouse_connect

from airflow_sync_provider.core.endpoints import ClickHouseEndpoint


def client(endpoint: ClickHouseEndpoint, **kwargs):
    return clickhouse_connect.get_client(**{**endpoint.client_args(), **kwargs})


_SHARED: dict = {}


_SHARED_LOCK = threading.Lock()


def shared_client(endpoint: ClickHouseEndpoint):
    """This process's client for ``endpoint``, shared by its threads and by later Spark tasks in
    the same Python worker: opening a client costs three queries (version, time zone, every
    setting), ~0.1 s on the chDB stand-in. Without a session, so threads may share it."""
    with _SHARED_LOCK:
        ch = _SHARED.get(endpoint)
        if ch is None:
            ch = _SHARED[endpoint] = client(endpoint, autogenerate_session_id=False)
        return ch

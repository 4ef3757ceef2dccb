from __future__ import annotations

import ast
import asyncio
from typing import Any

from airflow_sync_provider.compat import BaseTrigger, TriggerEvent
from airflow_sync_provider.core.failures import sensor_verdict
from airflow_sync_provider.core.ledger import DEFAULT_LEDGER_DATABASE
from airflow_sync_provider.hooks.endpoints import SyncEndpointsHook


class BinlogPositionTrigger(BaseTrigger):
    """Polls a CDC pipeline's checkpoint until it reaches a position (or its lag is under a
    bound), or the pipeline reports a failure."""

    def __init__(self, pipeline: str, position: dict | None = None, max_lag_seconds: float | None = None,
                 clickhouse_conn_id: str = "clickhouse_default", mysql_conn_id: str = "mysql_default",
                 ledger_database: str = DEFAULT_LEDGER_DATABASE, poke_interval: float = 10.0,
                 sources: list | None = None):
        super().__init__()
        self.sources = sources
        self.pipeline = pipeline
        self.position = position
        self.max_lag_seconds = max_lag_seconds
        self.clickhouse_conn_id = clickhouse_conn_id
        self.mysql_conn_id = mysql_conn_id
        self.ledger_database = ledger_database
        self.poke_interval = poke_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"pipeline": self.pipeline, "position": self.position, "max_lag_seconds": self.max_lag_seconds,
                 "clickhouse_conn_id": self.clickhouse_conn_id, "mysql_conn_id": self.mysql_conn_id,
                 "ledger_database": self.ledger_database, "poke_interval": self.poke_interval,
                 "sources": self.sources})

    def _check(self):
        return check(self.pipeline, self.position, self.max_lag_seconds, self.mysql_conn_id, self.clickhouse_conn_id,
                     self.sources, self.ledger_database)

    async def run(self):
        while True:
            verdict, message, summary = await asyncio.to_thread(self._check)  # blocking clients, off the loop
            if verdict != "wait":
                yield TriggerEvent({"status": verdict, "message": message, "summary": summary})
                return
            self.log.info("%s", message)
            await asyncio.sleep(self.poke_interval)


def check(pipeline: str, position, max_lag_seconds: float | None, mysql_conn_id: str, clickhouse_conn_id: str,
          sources: list | None, ledger_database: str) -> tuple[str, str, dict]:
    """The sensor's and the trigger's check: one pipeline's, or a source group's (every source's);
    a server that does not answer is waited for (core/failures.sensor_verdict)."""
    hook = SyncEndpointsHook(mysql_conn_id, clickhouse_conn_id)
    if sources:
        if isinstance(position, str) and position.strip():  # a rendered template: {"s0": {...}, …}
            position = ast.literal_eval(position.strip())
        return sensor_verdict(lambda: hook.group_position_check(pipeline, sources, position or None,
                                                                max_lag_seconds, ledger_database))
    return sensor_verdict(lambda: hook.binlog_position_check(pipeline, position, max_lag_seconds, ledger_database))

from __future__ import annotations

import asyncio
from typing import Any

from airflow_sync_provider.compat import BaseTrigger, TriggerEvent
from airflow_sync_provider.core.failures import sensor_verdict
from airflow_sync_provider.core.ledger import DEFAULT_LEDGER_DATABASE
from airflow_sync_provider.hooks.endpoints import SyncEndpointsHook


class ShardCountersTrigger(BaseTrigger):
    """Polls a load's hook counters in the ledger until it succeeds or fails for good."""

    def __init__(self, load_key: str, clickhouse_conn_id: str = "clickhouse_default",
                 ledger_database: str = DEFAULT_LEDGER_DATABASE, poke_interval: float = 10.0):
        super().__init__()
        self.load_key = load_key
        self.clickhouse_conn_id = clickhouse_conn_id
        self.ledger_database = ledger_database
        self.poke_interval = poke_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"load_key": self.load_key, "clickhouse_conn_id": self.clickhouse_conn_id,
                 "ledger_database": self.ledger_database, "poke_interval": self.poke_interval})

    def _check(self):
        return sensor_verdict(lambda: SyncEndpointsHook(clickhouse_conn_id=self.clickhouse_conn_id)
                              .shard_counters_check(self.load_key, self.ledger_database))

    async def run(self):
        while True:
            verdict, message, summary = await asyncio.to_thread(self._check)  # blocking client, off the loop
            if verdict != "wait":
                yield TriggerEvent({"status": verdict, "message": message, "summary": summary})
                return
            self.log.info("%s: %s", self.load_key, message)
            await asyncio.sleep(self.poke_interval)

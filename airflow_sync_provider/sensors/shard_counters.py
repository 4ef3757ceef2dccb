from __future__ import annotations

from datetime import timedelta

from airflow_sync_provider.compat import AirflowFailException, BaseSensorOperator, PokeReturnValue
from airflow_sync_provider.core.failures import sensor_verdict
from airflow_sync_provider.core.ledger import DEFAULT_LEDGER_DATABASE
from airflow_sync_provider.hooks.endpoints import SyncEndpointsHook
from airflow_sync_provider.triggers.shard_counters import ShardCountersTrigger


class ShardCountersSensor(BaseSensorOperator):
    """Waits until every shard of a load succeeded with read == written and failed == 0.

    Fails fast (no retries) when the load failed or its job died, naming the shards and the
    re-import to run. Works in ``poke`` and ``reschedule`` mode, or ``deferrable=True`` (trigger).

    :param load_key: the load to watch (e.g. ``{{ ti.xcom_pull('load_orders')['load_key'] }}``).
    :param clickhouse_conn_id: the ``clickhouse`` connection holding the ledger.
    :param ledger_database: the ledger's ClickHouse database.
    """

    template_fields = ("load_key",)
    ui_color = "#c8e6c9"

    def __init__(self, *, load_key: str, clickhouse_conn_id: str = "clickhouse_default",
                 ledger_database: str = DEFAULT_LEDGER_DATABASE, deferrable: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.load_key = load_key
        self.clickhouse_conn_id = clickhouse_conn_id
        self.ledger_database = ledger_database
        self.deferrable = deferrable

    def _check(self):
        return sensor_verdict(lambda: SyncEndpointsHook(clickhouse_conn_id=self.clickhouse_conn_id)
                              .shard_counters_check(self.load_key, self.ledger_database))

    def poke(self, context):
        verdict, message, summary = self._check()
        if verdict == "failed":
            raise AirflowFailException(message)
        self.log.info("%s: %s", self.load_key, message)
        return PokeReturnValue(is_done=verdict == "success", xcom_value=summary)

    def execute(self, context):
        if not self.deferrable:
            return super().execute(context)
        verdict, message, summary = self._check()  # no deferral when the answer is already known
        if verdict == "wait":
            self.defer(trigger=ShardCountersTrigger(self.load_key, self.clickhouse_conn_id, self.ledger_database,
                                                    self.poke_interval),
                       method_name="execute_complete", timeout=timedelta(seconds=self.timeout))
        return self.execute_complete(context, {"status": verdict, "message": message, "summary": summary})

    def execute_complete(self, context, event: dict):
        if event["status"] == "failed":
            raise AirflowFailException(event["message"])
        self.log.info("%s: %s", self.load_key, event["message"])
        return event["summary"]

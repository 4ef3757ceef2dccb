from __future__ import annotations

from datetime import timedelta

from airflow_sync_provider.compat import AirflowFailException, BaseSensorOperator, PokeReturnValue
from airflow_sync_provider.core.failures import sensor_verdict
from airflow_sync_provider.core.ledger import DEFAULT_LEDGER_DATABASE
from airflow_sync_provider.hooks.endpoints import SyncEndpointsHook
from airflow_sync_provider.triggers.binlog_position import BinlogPositionTrigger, check


class BinlogPositionSensor(BaseSensorOperator):
    """Waits until a CDC pipeline's applied checkpoint reaches a binlog position, or its lag is
    under a bound. Fails fast when the pipeline reports an error.

    :param pipeline: the pipeline (``CdcApplyOperator(pipeline=…)``).
    :param position: ``{"file": …, "pos": …}`` to reach (or a GTID state, ``"0-1-1043"`` on MariaDB,
        ``"uuid:1-1043"`` on MySQL: reached when the checkpoint's GTID state includes it, on
        whatever server the pipeline reads by then), e.g. from XCom
        (``{{ ti.xcom_pull('bootstrap')['end_position'] }}``). Neither it nor ``max_lag_seconds``:
        the source's current position, read at the first poke (MySQL ≥ 8.2 ``SHOW BINARY LOG
        STATUS``, older ``SHOW MASTER STATUS``, MariaDB ``SHOW BINLOG STATUS``).
    :param max_lag_seconds: succeed instead when the pipeline is this close to the source.
    :param sources: a source group's pipeline (as ``CdcApplyOperator`` took them,
        ``[{"name": …, "mysql_conn_id": …}]``): every source's pipeline is waited for; ``position``
        is then a position per source name (``{"s0": {...}, "s1": "0-11-42"}``; without it, each
        source's position at the first poke), and ``max_lag_seconds`` bounds every source's lag
        (the group's is its worst source's). Fails as soon as one source's pipeline failed or
        stopped, naming it.
    Works in ``poke`` and ``reschedule`` mode, or ``deferrable=True`` (trigger).
    """

    template_fields = ("pipeline", "position", "sources")
    ui_color = "#c8e6c9"

    def __init__(self, *, pipeline: str, position: dict | None = None, max_lag_seconds: float | None = None,
                 mysql_conn_id: str = "mysql_default", clickhouse_conn_id: str = "clickhouse_default",
                 sources: list | None = None, ledger_database: str = DEFAULT_LEDGER_DATABASE,
                 deferrable: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.sources = sources
        self.pipeline = pipeline
        self.position = position
        self.max_lag_seconds = max_lag_seconds
        self.mysql_conn_id = mysql_conn_id
        self.clickhouse_conn_id = clickhouse_conn_id
        self.ledger_database = ledger_database
        self.deferrable = deferrable

    def _target(self, context) -> dict | None:
        """The position to reach: given, or the source's at the first poke (kept in XCom so a
        rescheduled poke waits for the same one)."""
        if self.position or self.max_lag_seconds is not None:
            return self.position or None
        ti = context.get("ti") if context else None
        stored = ti.xcom_pull(task_ids=self.task_id, key="target_position") if ti else None
        if stored:
            return stored
        # with the server's GTID state and epoch: reached across a failover too
        hook = SyncEndpointsHook(self.mysql_conn_id, self.clickhouse_conn_id)
        self.position = (hook.group_positions(self.sources, self.ledger_database) if self.sources
                         else hook.source_position(self.ledger_database))
        if ti:
            ti.xcom_push(key="target_position", value=self.position)
        return self.position

    def _check(self, context):
        return sensor_verdict(lambda: check(self.pipeline, self._target(context), self.max_lag_seconds,
                                            self.mysql_conn_id, self.clickhouse_conn_id, self.sources,
                                            self.ledger_database))

    def poke(self, context):
        verdict, message, summary = self._check(context)
        if verdict == "failed":
            raise AirflowFailException(message)
        self.log.info("%s", message)
        return PokeReturnValue(is_done=verdict == "success", xcom_value=summary)

    def execute(self, context):
        if not self.deferrable:
            return super().execute(context)
        verdict, message, summary = self._check(context)  # no deferral when the answer is already known
        if verdict == "wait":
            self.defer(trigger=BinlogPositionTrigger(self.pipeline, self._target(context), self.max_lag_seconds,
                                                     self.clickhouse_conn_id, self.mysql_conn_id,
                                                     self.ledger_database, self.poke_interval, self.sources),
                       method_name="execute_complete", timeout=timedelta(seconds=self.timeout))
        return self.execute_complete(context, {"status": verdict, "message": message, "summary": summary})

    def execute_complete(self, context, event: dict):
        if event["status"] == "failed":
            raise AirflowFailException(event["message"])
        self.log.info("%s", event["message"])
        return event["summary"]

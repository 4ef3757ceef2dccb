"""The one place that knows where Airflow keeps things (they move between 3.x releases).

Operators, sensors, hooks and triggers import Airflow names from here only.
"""

from __future__ import annotations

from airflow.sdk import Asset, BaseHook, BaseOperator, BaseOperatorLink, BaseSensorOperator

try:
    from airflow.sdk.bases.sensor import PokeReturnValue
except ImportError:  # pragma: no cover
    from airflow.sensors.base import PokeReturnValue

try:
    from airflow.sdk.exceptions import AirflowException, AirflowFailException
except ImportError:  # pragma: no cover
    from airflow.exceptions import AirflowException, AirflowFailException

try:  # Airflow's metrics front (StatsD, DogStatsD, OpenTelemetry as [metrics] configures them)
    from airflow.sdk.observability.stats import Stats
except ImportError:  # pragma: no cover
    from airflow.stats import Stats

try:
    from airflow.triggers.base import BaseTrigger, TriggerEvent
except ImportError:  # pragma: no cover
    from airflow.sdk.bases.trigger import BaseTrigger, TriggerEvent



def __getattr__(name: str):
    """Names only the API server's side needs (the Sync view, plugins/sync_view.py), imported
    when asked for: tasks, which run on the Task SDK, never load them."""
    if name == "AirflowPlugin":
        from airflow.plugins_manager import AirflowPlugin

        return AirflowPlugin
    if name == "conf":
        from airflow.configuration import conf

        return conf
    if name == "api_user":  # the dependency that authenticates a request: bearer token or the UI's cookie
        from airflow.api_fastapi.core_api.security import get_user

        return lambda: get_user
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# and, on demand (__getattr__): AirflowPlugin, api_user, conf
__all__ = ["AirflowException", "Asset", "AirflowFailException", "BaseHook", "BaseOperator", "BaseOperatorLink",
           "BaseSensorOperator",
           "BaseTrigger", "PokeReturnValue", "Stats", "TriggerEvent"]

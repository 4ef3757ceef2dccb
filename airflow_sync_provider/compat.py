"""The one place that knows where Airflow keeps things (they move between 3.x releases).

Operators, sensors, hooks and triggers import Airflow names from here only.
"""

from __future__ import annotations

from airflow.sdk import Asset, BaseHook, BaseOperator, BaseSensorOperator

try:
    from airflow.sdk.bases.sensor import PokeReturnValue
except ImportError:  # pragma: no cover
    from airflow.sensors.base import PokeReturnValue

try:
    from airflow.sdk.exceptions import AirflowException, AirflowFailException
except ImportError:  # pragma: no cover
    from airflow.exceptions import AirflowException, AirflowFailException

try:
    from airflow.triggers.base import BaseTrigger, TriggerEvent
except ImportError:  # pragma: no cover
    from airflow.sdk.bases.trigger import BaseTrigger, TriggerEvent

__all__ = ["AirflowException", "Asset", "AirflowFailException", "BaseHook", "BaseOperator", "BaseSensorOperator",
           "BaseTrigger", "PokeReturnValue", "TriggerEvent"]

"""The job operators; their config objects (``Selection``, ``Layout``, ``Content``, ``SpeedLimits``,
documented once in :mod:`airflow_sync_provider.operators.configs`) import from here in one line::

    from airflow_sync_provider.operators import Content, Layout, Selection, SpeedLimits
"""

from airflow_sync_provider.operators.configs import Content, Layout, Selection, SpeedLimits, TableSelection

__all__ = ["Content", "Layout", "Selection", "SpeedLimits", "TableSelection"]

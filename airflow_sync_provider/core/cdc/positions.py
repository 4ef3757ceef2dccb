"""Moved to airflow_sync_provider/core/positions.py (a temporary alias while every importer moves)."""

from airflow_sync_provider.core.positions import *  # noqa: F401,F403

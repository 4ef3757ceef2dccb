"""The "Sync view" button on our operators' task instances: a link to the ledger's page of what
the task worked on (plugins/sync_view.py). Airflow 3 asks for the link in the worker right after
the task ran, on the operator object that ran, so the operator sets ``sync_link`` as it starts."""

from __future__ import annotations

from urllib.parse import urlencode

from airflow_sync_provider.compat import BaseOperatorLink


def sync_link(page: str = "", **query: str) -> str:
    """``/sync/<page>?<query>`` on the API server (empty values left out)."""
    query = {k: v for k, v in query.items() if v}
    return f"/sync/{page}" + (f"?{urlencode(query)}" if query else "")


class SyncViewLink(BaseOperatorLink):
    name = "Sync view"

    def get_link(self, operator, *, ti_key) -> str:
        return getattr(operator, "sync_link", "") or sync_link()

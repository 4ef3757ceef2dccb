"""The Sync view in the Airflow UI: an Airflow 3 plugin (registered through the provider info)
that mounts a FastAPI app in the API server at ``/sync`` and adds a "Sync" entry to the UI's
navigation. Its page lists the ledger's loads with their shards' hook counters and verdicts, and
the CDC pipelines with their checkpoints and changes applied per minute.

Protected by Airflow's own authentication: the UI's session cookie or a bearer token (the same
JWT as the REST API). Which ClickHouse holds the ledger: ``[sync] clickhouse_conn_id``
(``AIRFLOW__SYNC__CLICKHOUSE_CONN_ID``, default ``clickhouse_default``) and
``[sync] ledger_database``.
"""

from __future__ import annotations

from fastapi import Depends, FastAPI
from fastapi.responses import HTMLResponse

from airflow_sync_provider.compat import AirflowPlugin, api_user, conf
from airflow_sync_provider.core.cdc.checkpoints import Checkpoints
from airflow_sync_provider.core.ledger import DEFAULT_LEDGER_DATABASE, Ledger, counters_verdict
from airflow_sync_provider.core.target import clickhouse as clickhouse_target
from airflow_sync_provider.core.verify.reports import sync_html
from airflow_sync_provider.hooks.endpoints import SyncEndpointsHook

app = FastAPI(title="Airflow Sync", docs_url=None, redoc_url=None, openapi_url=None)


@app.get("/", response_class=HTMLResponse, dependencies=[Depends(api_user())])
def loads_page() -> str:
    hook = SyncEndpointsHook(clickhouse_conn_id=conf.get("sync", "clickhouse_conn_id", fallback="clickhouse_default"))
    ch = clickhouse_target.client(hook.target())
    database = conf.get("sync", "ledger_database", fallback=DEFAULT_LEDGER_DATABASE)
    try:
        loads = Ledger(ch, database).recent()
        checkpoints = Checkpoints(ch, database)
        pipelines = []
        if ch.command(f"EXISTS TABLE {checkpoints.table('cdc_state')}"):
            pipelines = [(checkpoints.state(p), checkpoints.counters(p)) for p in checkpoints.pipelines()]
    finally:
        ch.close()
    return sync_html(loads, {s.load_key: counters_verdict(s) for s in loads}, pipelines)


class SyncViewPlugin(AirflowPlugin):
    name = "airflow_sync"
    fastapi_apps = [{"app": app, "url_prefix": "/sync", "name": "Airflow Sync"}]
    external_views = [{"name": "Sync", "href": "/sync/", "destination": "nav", "category": "browse",
                       "url_route": "sync"}]

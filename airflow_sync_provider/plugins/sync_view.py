"""The Sync view in the Airflow UI: an Airflow 3 plugin (registered through the provider info)
that mounts a FastAPI app in the API server at ``/sync`` and adds a "Sync" entry to the UI's
navigation. Its pages, all read from the ledger (never a worker's disk):

* ``/sync/`` — loads with their shards' hook counters and verdicts (progress while running), CDC
  pipelines with checkpoints and changes applied per minute, reconciliations and diff runs;
  ``?load=<key prefix>``, ``?pipeline=<name>``, ``?diff=<key prefix>`` narrow it (our operators'
  "Sync view" extra links point there). It reloads itself every 15 s.
* ``/sync/reconciliation?load=<key>`` — a load's newest reconciliation, shard by shard.
* ``/sync/diff?key=<diff key>[&run=<run id>]`` — a diff run: counts, pruning, sample rows.

Protected by Airflow's own authentication: the UI's session cookie or a bearer token (the same
JWT as the REST API). Which ClickHouse holds the ledger: ``[sync] clickhouse_conn_id``
(``AIRFLOW__SYNC__CLICKHOUSE_CONN_ID``, default ``clickhouse_default``) and
``[sync] ledger_database``.
"""

from __future__ import annotations

from contextlib import contextmanager

from fastapi import Depends, FastAPI, HTTPException
from fastapi.responses import HTMLResponse

from airflow_sync_provider.compat import AirflowPlugin, api_user, conf
from airflow_sync_provider.core.cdc.checkpoints import Checkpoints
from airflow_sync_provider.core.ledger import DEFAULT_LEDGER_DATABASE, Ledger, counters_verdict
from airflow_sync_provider.core.target import clickhouse as clickhouse_target
from airflow_sync_provider.core.verify.diff import change_samples
from airflow_sync_provider.core.verify.reports import diff_html, reconcile_html, sync_html
from airflow_sync_provider.hooks.endpoints import SyncEndpointsHook

app = FastAPI(title="Airflow Sync", docs_url=None, redoc_url=None, openapi_url=None)
SAMPLE_ROWS = 20


@contextmanager
def _ledger():
    hook = SyncEndpointsHook(clickhouse_conn_id=conf.get("sync", "clickhouse_conn_id", fallback="clickhouse_default"))
    ch = clickhouse_target.client(hook.target())
    try:
        yield Ledger(ch, conf.get("sync", "ledger_database", fallback=DEFAULT_LEDGER_DATABASE))
    finally:
        ch.close()


@app.get("/", response_class=HTMLResponse, dependencies=[Depends(api_user())])
def sync_page(load: str = "", pipeline: str = "", diff: str = "") -> str:
    scoped = bool(load or pipeline or diff)
    with _ledger() as ledger:
        loads = ledger.recent(prefix=load) if load or not scoped else []
        checks = ledger.reconciliations(prefix=load) if load or not scoped else []
        runs = ledger.diffs(prefix=diff) if diff or not scoped else []
        checkpoints = Checkpoints(ledger.ch, ledger.database)
        flows = []
        if (pipeline or not scoped) and ledger.ch.command(f"EXISTS TABLE {checkpoints.table('cdc_state')}"):
            flows = [(checkpoints.state(p), checkpoints.counters(p)) for p in checkpoints.pipelines()
                     if not pipeline or p == pipeline]
    scope = ", ".join(f"{what} {value}" for what, value in (("loads", load), ("pipeline", pipeline),
                                                               ("diffs", diff)) if value)
    return sync_html(loads, {s.load_key: counters_verdict(s) for s in loads}, flows, checks, runs,
                     scope=f"Showing {scope} (all: /sync/)" if scope else "")


@app.get("/reconciliation", response_class=HTMLResponse, dependencies=[Depends(api_user())])
def reconciliation_page(load: str) -> str:
    with _ledger() as ledger:
        result = ledger.reconciliation(load)
    if result is None:
        raise HTTPException(404, f"no reconciliation of load {load!r} in the ledger")
    return reconcile_html(result)


@app.get("/diff", response_class=HTMLResponse, dependencies=[Depends(api_user())])
def diff_page(key: str, run: str = "") -> str:
    with _ledger() as ledger:
        found = ledger.diff(key, run)
        if found is None:
            raise HTTPException(404, f"no diff run {key!r} {run!r} in the ledger")
        result, shards = found
        samples, note = {}, ""
        if not result["changes_table"]:
            note = "No sample rows: this run was recorded before the ledger kept its change set's name."
        else:
            try:
                samples = change_samples(ledger.ch, result["changes_table"], key, result["run_id"], SAMPLE_ROWS)
            except Exception as exc:  # e.g. the change set was dropped: the counts still stand
                note = f"No sample rows: the change set {result['changes_table']} could not be read ({exc})."[:600]
    return diff_html(result, shards, samples, note)


class SyncViewPlugin(AirflowPlugin):
    name = "airflow_sync"
    fastapi_apps = [{"app": app, "url_prefix": "/sync", "name": "Airflow Sync"}]
    external_views = [{"name": "Sync", "href": "/sync/", "destination": "nav", "category": "browse",
                       "url_route": "sync"}]

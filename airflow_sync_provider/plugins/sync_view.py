"""The Sync view in the Airflow UI: an Airflow 3 plugin (registered through the ``airflow.plugins``
entry point, so it loads with Airflow's default settings) that mounts a FastAPI app in the API
server at ``/sync`` and adds a "Sync" entry to the UI's navigation. Its pages, all read from the
ledger (never a worker's disk; core/overview.py gathers, plugins/pages.py renders them from the
Jinja2 templates in plugins/templates/):

* ``/sync/`` — what needs attention first (failed loads and shards, failed or lagging pipelines,
  each with its remedy and task instance), counts by state, running loads with progress, the
  pipelines, then one row per table load, worst first: ``?table=<db.table glob>``,
  ``?state=failed|running|published|abandoned``, ``?load=<key prefix>``, ``?page=N`` and
  ``?days=N`` (published loads older than that leave the page; default 7).
  Reloads itself every 15 s.
* ``/sync/load?key=<load key>`` — one load and its shards' hook counters.
* ``/sync/?pipeline=<name>[&window=hour|day|week]`` — one CDC pipeline: lag and changes/s over the
  window as charts, checkpoint, verification, changes per minute.
* ``/sync/table?name=<db.table>`` — a copy's shape in one place: source, key, layout, content, kept
  deletes, its loads and pipelines, foreign keys.
* ``/sync/api/pipelines/<name>/series?window=…``, ``/sync/api/loads/series?key=…`` — the series the
  charts draw, as JSON (core/series.py).
* ``/sync/?diff=<key prefix>`` — snapshot-diff runs; ``/sync/diff?key=<diff key>[&run=<run id>]`` one run.
* ``/sync/reconciliation?load=<key>`` — a load's newest reconciliation, shard by shard.

Protected by Airflow's own authentication: the UI's session cookie or a bearer token (the same
JWT as the REST API). Which ClickHouse holds the ledger: ``[sync] clickhouse_conn_id``
(``AIRFLOW__SYNC__CLICKHOUSE_CONN_ID``, default ``clickhouse_default``) and
``[sync] ledger_database``.
"""

from __future__ import annotations

from collections.abc import Iterator

from fastapi import Depends, FastAPI, HTTPException
from fastapi.responses import HTMLResponse, JSONResponse

from airflow_sync_provider.compat import AirflowException, AirflowPlugin, api_user, conf
from airflow_sync_provider.core import overview as ov
from airflow_sync_provider.core.clickhouse.client import client
from airflow_sync_provider.core.ledger import DEFAULT_LEDGER_DATABASE, Ledger
from airflow_sync_provider.core.series import LOAD, PIPELINE, WINDOWS, Series, rates
from airflow_sync_provider.core.shape import copy_shape
from airflow_sync_provider.core.verify.diff import change_samples
from airflow_sync_provider.hooks.endpoints import SyncEndpointsHook
from airflow_sync_provider.plugins import pages

SAMPLE_ROWS = 20


SETTING = "[sync] clickhouse_conn_id (AIRFLOW__SYNC__CLICKHOUSE_CONN_ID)"


class NoLedger(Exception):
    """The ledger's connection is missing or cannot be used: answered with a page saying so."""

    def __init__(self, conn_id: str, cause: str):
        super().__init__(conn_id, cause)
        self.conn_id, self.cause = conn_id, cause


def ledger() -> Iterator[Ledger]:
    """The ledger of ``[sync] clickhouse_conn_id`` for one request (a FastAPI dependency, so a test
    can serve the pages over a ledger of its own)."""
    conn_id = conf.get("sync", "clickhouse_conn_id", fallback="") or "clickhouse_default"
    try:
        endpoint = SyncEndpointsHook(clickhouse_conn_id=conn_id).target()
    except (AirflowException, ValueError) as exc:  # no such connection; extras that cannot be honoured
        raise NoLedger(conn_id, str(exc) or type(exc).__name__) from None
    ch = client(endpoint)
    try:
        yield Ledger(ch, conf.get("sync", "ledger_database", fallback=DEFAULT_LEDGER_DATABASE))
    finally:
        ch.close()


# the pages' ``book`` parameter: one (frozen, so shareable) Depends marker for every page
LEDGER = Depends(ledger)

app = FastAPI(title="Airflow Sync", docs_url=None, redoc_url=None, openapi_url=None,
              dependencies=[Depends(api_user())])


@app.exception_handler(NoLedger)
def no_ledger_page(_request, exc: NoLedger) -> HTMLResponse:
    return HTMLResponse(pages.no_ledger_html(exc.conn_id, SETTING, exc.cause), status_code=503)


def overview_filters(table: str = "", state: str = "", load: str = "", page: int = 1,
                     days: int = ov.RECENT_DAYS) -> ov.Filters:
    """The overview's query parameters (a FastAPI dependency); a bad one is a 400 naming it."""
    try:
        return ov.Filters(table=table, state=state, load=load, page=page, days=days)
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None


FILTERS = Depends(overview_filters)


@app.get("/", response_class=HTMLResponse)
def sync_page(filters: ov.Filters = FILTERS, pipeline: str = "", diff: str = "", window: str = "hour",
              book: Ledger = LEDGER) -> str:
    if pipeline:
        if window not in WINDOWS:
            raise HTTPException(400, f"window must be one of {', '.join(WINDOWS)}, not {window!r}")
        found = ov.pipeline_page(book, pipeline, window=window)
        if found is None:
            raise HTTPException(404, f"no pipeline {pipeline!r} in the ledger")
        return pages.group_html(pipeline, found) if isinstance(found, list) else pages.pipeline_html(found)
    if diff:
        return pages.diffs_html(ov.diff_runs(book, diff, limit=50), diff)
    return pages.overview_html(ov.overview(book, filters))


@app.get("/load", response_class=HTMLResponse)
def load_page(key: str, book: Ledger = LEDGER) -> str:
    found = ov.load_page(book, key)
    if found is None:
        raise HTTPException(404, f"no load {key!r} in the ledger")
    return pages.load_html(*found)


def _series_json(kind: str, subject: str, points: list, window: str) -> dict:
    return {"kind": kind, "subject": subject, "window": window, "points": [p.to_dict() for p in points],
            "rates": {total: rates(points, total) for total in (("changes", "repairs") if kind == PIPELINE
                                                                 else ("rows", "shards_done"))}}


@app.get("/api/pipelines/{name}/series", response_class=JSONResponse)
def pipeline_series(name: str, window: str = "hour", book: Ledger = LEDGER) -> dict:
    """A pipeline's series over the window (hour, day, week): at most 120 points, each with its
    time (epoch seconds), worst lag, totals; the rates per second between them."""
    if window not in WINDOWS:
        raise HTTPException(400, f"window must be one of {', '.join(WINDOWS)}, not {window!r}")
    points = Series(book.ch, book.database).window(PIPELINE, [name], window).get(name, [])
    return _series_json(PIPELINE, name, points, window)


@app.get("/api/loads/series", response_class=JSONResponse)
def load_series(key: str, window: str = "week", book: Ledger = LEDGER) -> dict:
    """A load's progress over the window: rows written and shards done, and their rates."""
    if window not in WINDOWS:
        raise HTTPException(400, f"window must be one of {', '.join(WINDOWS)}, not {window!r}")
    points = Series(book.ch, book.database).window(LOAD, [key], window).get(key, [])
    return _series_json(LOAD, key, points, window)


@app.get("/table", response_class=HTMLResponse)
def table_page(name: str, book: Ledger = LEDGER) -> str:
    shape = copy_shape(book, name)
    if not shape.found:
        raise HTTPException(404, f"no copy {name!r} in the ledger or its ClickHouse")
    return pages.table_html(shape)


@app.get("/reconciliation", response_class=HTMLResponse)
def reconciliation_page(load: str, book: Ledger = LEDGER) -> str:
    result = book.reconciliation(load)
    if result is None:
        raise HTTPException(404, f"no reconciliation of load {load!r} in the ledger")
    return pages.reconcile_html(result)


@app.get("/diff", response_class=HTMLResponse)
def diff_page(key: str, run: str = "", book: Ledger = LEDGER) -> str:
    found = book.diff(key, run)
    if found is None:
        raise HTTPException(404, f"no diff run {key!r} {run!r} in the ledger")
    result, shards = found
    samples, note = {}, ""
    if not result["changes_table"]:
        note = "No sample rows: this run was recorded before the ledger kept its change set's name."
    else:
        try:
            samples = change_samples(book.ch, result["changes_table"], key, result["run_id"], SAMPLE_ROWS)
        except Exception as exc:  # e.g. the change set was dropped: the counts still stand
            note = f"No sample rows: the change set {result['changes_table']} could not be read ({exc})."[:600]
    return pages.diff_html(result, shards, samples, note)


class SyncViewPlugin(AirflowPlugin):
    name = "airflow_sync"
    fastapi_apps = [{"app": app, "url_prefix": "/sync", "name": "Airflow Sync"}]
    external_views = [{"name": "Sync", "href": "/sync/", "destination": "nav", "category": "browse",
                       "url_route": "sync"}]

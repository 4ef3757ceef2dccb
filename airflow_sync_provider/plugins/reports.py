"""The reconciliation and snapshot-diff report pages as files: ReconcileOperator,
SnapshotDiffOperator and the command line write them next to the job's log (the Sync view serves
the same pages from the ledger). Rendered by plugins/pages.py: jinja2, no Airflow."""

from __future__ import annotations

import os
import re
import tempfile

from airflow_sync_provider.plugins.pages import diff_html, reconcile_html


def report_path(name: str, directory: str | None = None) -> str:
    """Where the page called ``name`` goes: ``directory`` (made if missing), else
    ``<temp dir>/airflow-sync-reports``."""
    directory = directory or os.path.join(tempfile.gettempdir(), "airflow-sync-reports")
    os.makedirs(directory, exist_ok=True)
    return os.path.join(directory, re.sub(r"[^A-Za-z0-9._-]+", "_", name) + ".html")


def _write(path: str, html: str) -> str:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(html)
    return path


def write_report(result: dict, directory: str | None = None) -> str:
    """Write the HTML reconciliation report; returns its path."""
    return _write(report_path(f"{result['load_key']}.g{result['generation']}", directory), reconcile_html(result))


def write_diff_report(result: dict, directory: str | None = None) -> str:
    """Write a snapshot diff's HTML page (``result`` as the job returns it); returns its path."""
    return _write(report_path(f"{result['diff_key']}.{result['run_id']}", directory),
                  diff_html(result, result["shard_results"], result["samples"]))

"""What every spark_jobs/<job>.py script does: read the spec, run, write the result."""

from __future__ import annotations

import argparse
import json
import sys
import traceback

from clickhouse_connect.driver import options as clickhouse_options

from airflow_sync_provider.core.jobspec import read_spec, write_private_json
from airflow_sync_provider.core.logs import to_stdout
from airflow_sync_provider.core.submission import secrets_from_env
from airflow_sync_provider.spark.session import LazySession


def _report(spec, result_key: str, result: dict) -> None:
    """Client mode: a file next to the spec; cluster mode: the ledger, under ``result_key``."""
    if spec.result_path:
        write_private_json(spec.result_path, result)
    if result_key:
        from airflow_sync_provider.core.ledger import Ledger
        from airflow_sync_provider.core.target.clickhouse import client

        ch = client(spec.target)
        try:
            Ledger(ch, spec.ledger_database).write_job_result(result_key, result)
        finally:
            ch.close()


def run_job(job_function, argv=None) -> None:
    """Run ``job_function(spec, spark)`` with a :class:`LazySession`: the job builds the session
    only if it needs executors."""
    # clickhouse-connect imports pandas (0.25 s) at a process's first insert, only to ask whether
    # the rows are a DataFrame; a job never passes one (a job's own process: other users of the
    # library in an Airflow worker are not touched). Jobs that convert Python values to Arrow
    # still import pandas, through pyarrow, when they first do.
    clickhouse_options.pd = clickhouse_options.pd_time_test = None
    to_stdout()
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", required=True, help="path of the job-spec JSON file")
    parser.add_argument("--secrets-from-env", action="store_true",
                        help="cluster deploy mode: the passwords come from the driver's environment")
    parser.add_argument("--result-key", default="", help="cluster deploy mode: report the result to the ledger")
    args = parser.parse_args(argv)
    spec = read_spec(args.spec)
    if args.secrets_from_env:
        secrets_from_env(spec)
    name = getattr(spec, 'source_table', '') or getattr(spec, 'load_key', '') or getattr(spec, 'pipeline', '')
    session = LazySession(f"airflow-sync {spec.job} {name}")
    try:
        result = {"status": "success", **job_function(spec, session)}
    except Exception as exc:
        # The operator raises this text, so the task log shows the job's own error; a job of many
        # tables adds every table's result (spark/tables.py), so a caller can name each failed one.
        _report(spec, args.result_key, {**getattr(exc, "result", {}), "status": "failed",
                                        "error": f"{type(exc).__name__}: {exc}"})
        traceback.print_exc()  # the driver's output: the task log, or the command line's log file
        session.stop()
        sys.exit(1)
    _report(spec, args.result_key, result)
    print("airflow-sync result: " + json.dumps(result, default=str)[:2000], flush=True)
    session.stop()

"""What every spark_jobs/<job>.py script does: read the spec, run, write the result."""

from __future__ import annotations

import argparse
import json
import sys
import threading
import traceback

import pyarrow as pa
from clickhouse_connect.driver import options as clickhouse_options

from airflow_sync_provider.core.failures import SOURCE, TARGET, WAIT_SECONDS, classify
from airflow_sync_provider.core.guard import Guard, job_probes
from airflow_sync_provider.core.logs import to_stdout
from airflow_sync_provider.core.specfile import read_spec, write_private_json
from airflow_sync_provider.core.submission import salt_from_env, secrets_from_env
from airflow_sync_provider.spark.session import LazySession


def _report(spec, result_key: str, result: dict) -> None:
    """Client mode: a file next to the spec; cluster mode: the ledger, under ``result_key``."""
    if spec.result_path:
        write_private_json(spec.result_path, result)
    if result_key:
        from airflow_sync_provider.core.clickhouse.client import client
        from airflow_sync_provider.core.ledger import Ledger

        ch = client(spec.target)
        try:
            Ledger(ch, spec.ledger_database).write_job_result(result_key, result)
        finally:
            ch.close()


def failure_result(exc: BaseException, servers: dict[str, str]) -> dict:
    """A failed job's result: its error, whether a retry may help (core/failures.py: the operator
    tells Airflow not to retry when it will not) and, where known, the server and the cause
    (``servers``: a side's name in messages)."""
    failure = classify(exc)
    error = f"{type(exc).__name__}: {exc}"
    if failure.side in servers and servers[failure.side] not in error:
        error = f"{servers[failure.side]}: {failure.cause}: {error}"
    if failure.advice() and "retry" not in str(exc).lower():
        error += f". {failure.advice()}"
    return {**getattr(exc, "result", {}), "status": "failed", "error": error, "retry_helps": failure.retry_helps,
            "failure": {"transient": failure.transient, "side": failure.side, "cause": failure.cause}}


def server_names(spec) -> dict[str, str]:
    """The job's target and (single) source as its messages name them."""
    names = {TARGET: f"ClickHouse {spec.target.host}:{spec.target.port}"}
    if len(spec.sources) == 1:
        names[SOURCE] = f"MySQL {spec.sources[0].endpoint.host}:{spec.sources[0].endpoint.port}"
    return names


class _NoPandas:
    """An import finder that has no pandas (see :func:`without_pandas`)."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "pandas":
            raise ModuleNotFoundError("a job's process goes without pandas", name=name)


def without_pandas() -> None:
    """A job's own processes (its driver, its binlog readers) never hand pandas objects to
    clickhouse-connect or pyarrow, which each import pandas (0.2 s, 0.4 s of CPU under load) the
    first time they insert or convert Python values, only to ask whether they were given some:
    tell both it is absent. pyarrow asks once per process, so it is asked now with the import
    refused; ``import pandas`` works again afterwards. Other users of these libraries in an
    Airflow worker are not touched: only job processes call this."""
    clickhouse_options.pd = clickhouse_options.pd_time_test = None
    if "pandas" not in sys.modules:
        sys.meta_path.insert(0, _NoPandas)
        try:
            pa.array([0])  # pyarrow looks for pandas here, and remembers it found none
        finally:
            sys.meta_path.remove(_NoPandas)


def run_job(job_function, argv=None) -> None:
    """Run ``job_function(spec, spark)`` with a :class:`LazySession`: the job builds the session
    only if it needs executors. A :class:`~airflow_sync_provider.core.guard.Guard` ends the job
    when its submitter is gone or a server stays silent past the job's bound."""
    without_pandas()
    to_stdout()
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", required=True, help="path of the job-spec JSON file")
    parser.add_argument("--secrets-from-env", action="store_true",
                        help="cluster deploy mode: the passwords come from the driver's environment")
    parser.add_argument("--result-key", default="", help="cluster deploy mode: report the result to the ledger")
    args = parser.parse_args(argv)
    spec = read_spec(args.spec)
    salt_from_env(spec)
    if args.secrets_from_env:
        secrets_from_env(spec)
    name = getattr(spec, 'source_table', '') or getattr(spec, 'load_key', '') or getattr(spec, 'pipeline', '')
    session = LazySession(f"airflow-sync {spec.job} {name}")
    reported, lock = [], threading.Lock()

    def report(result: dict) -> None:  # once: the job's own word, or its guard's
        with lock:
            if not reported:
                reported.append(result)
                _report(spec, args.result_key, result)

    Guard(getattr(spec, "failure_wait_seconds", WAIT_SECONDS), job_probes(spec),
          lambda reason: report({"status": "failed", "error": f"JobEnded: {reason}", "retry_helps": True})).start()
    try:
        result = {"status": "success", **job_function(spec, session)}
    except Exception as exc:
        # The operator raises this text, so the task log shows the job's own error; a job of many
        # tables adds every table's result (spark/tables.py), so a caller can name each failed one.
        report(failure_result(exc, server_names(spec)))
        traceback.print_exc()  # the driver's output: the task log, or the command line's log file
        session.stop()
        sys.exit(1)
    report(result)
    print("airflow-sync result: " + json.dumps(result, default=str)[:2000], flush=True)
    session.stop()

"""What the commands share: the connection arguments, the arguments of a command that runs a job,
and running that job (spark-submit, its log file, its failure on stderr)."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

from airflow_sync_provider.core.failures import WAIT_SECONDS
from airflow_sync_provider.core.ledger import DEFAULT_LEDGER_DATABASE
from airflow_sync_provider.core.source.planning import DEFAULT_SPLIT_FACTOR, MIN_SHARD_ROWS
from airflow_sync_provider.core.submission import spark_submit
from airflow_sync_provider.core.tls import private_dir

SPLIT_FACTOR_HELP = (f"shards per channel (default: {DEFAULT_SPLIT_FACTOR}, fewer when a shard would hold under "
                     f"{MIN_SHARD_ROWS:,} rows)")
DRIVER_COPY_ROWS_HELP = ("tables estimated at no more rows are copied by the driver's own channels, without executors "
                         "(default: 300,000 on a cluster, every table on a local master; 0: always executors)")
ERROR_CHARS = 1000  # a failed table's line on the terminal; the whole error is in the log file


def mysql_url_argument(parser) -> None:
    parser.add_argument("--mysql-url", default=os.environ.get("MYSQL_URL"),
                        help="mysql://user:pass@host:port/db[?ssl_mode=…&ssl_ca=…] (default: $MYSQL_URL)")


def url_arguments(parser, mysql=True) -> None:
    """The servers and the ledger; the URLs default to the environment so no password need be on a
    command line (``main`` refuses a missing one)."""
    if mysql:
        mysql_url_argument(parser)
    parser.add_argument("--clickhouse-url", default=os.environ.get("CLICKHOUSE_URL"),
                        help="http(s)://user:pass@host:8123/db[?ca_cert=…] (default: $CLICKHOUSE_URL)")
    parser.add_argument("--ledger-database", default=DEFAULT_LEDGER_DATABASE)


def job_arguments(parser) -> None:
    """What every command that runs a job takes."""
    parser.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    parser.add_argument("--log-file", help="where the job's whole output goes, tracebacks included (default: a new "
                                           "file in $AIRFLOW_SYNC_LOG_DIR or $TMPDIR/airflow-sync-<uid>/logs; "
                                           "named on stderr when the job fails)")
    parser.add_argument("--failure-wait-seconds", type=float,
                        help=f"how long the job waits, in all, for a server that does not answer before it fails "
                             f"(default {WAIT_SECONDS:g}; docs/troubleshooting.md)")
    parser.add_argument("--json", action="store_true", help="print the job's result as JSON")


def _log_file(args, what: str) -> str:
    """Where a job's whole output goes (``--log-file``, else a new file in ``$AIRFLOW_SYNC_LOG_DIR`` or
    this user's private temporary directory), created readable by its owner only."""
    path = getattr(args, "log_file", None)
    if not path:
        directory = os.environ.get("AIRFLOW_SYNC_LOG_DIR") or os.path.join(
            str(private_dir() or tempfile.mkdtemp(prefix="airflow-sync-")), "logs")
        os.makedirs(directory, mode=0o700, exist_ok=True)
        path = os.path.join(directory, f"{what.replace(' ', '-')}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.log")
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
    return path


def run_job(spec, args, what: str) -> tuple[dict, str]:
    """spark-submit ``spec``: the driver's whole output (tracebacks included) goes to the log file,
    its one-line progress messages (``[airflow-sync] …``) also to stderr unless ``--json``; a
    table's failure is one such line, its traceback follows it in the log file only.
    Returns the job's result and the log file's path."""
    path = _log_file(args, what)
    if getattr(args, "failure_wait_seconds", None):
        spec.failure_wait_seconds = args.failure_wait_seconds
    with open(path, "a", encoding="utf-8") as log:
        def line(text: str) -> None:
            log.write(text + "\n")
            log.flush()
            # one-line progress messages; not the per-table rows a job of many prints at its end
            # (spark/tables.py), which this command sums up itself
            if not args.json and text.startswith("[airflow-sync]") and not text.startswith("[airflow-sync]   "):
                print(text, file=sys.stderr, flush=True)

        result = spark_submit(spec, master=args.master, line=line)
    return result, path


def _one_line(text) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= ERROR_CHARS else text[:ERROR_CHARS] + " … (the whole error is in the log file)"


def report_failure(what: str, result: dict, log_path: str, hint: str = "") -> None:
    """A failed job on stderr: one line per failed table (or one for the job), where the log is."""
    failed = [t for t in result.get("tables") or [] if t.get("status") == "failed"]
    if failed:
        others = " (the others succeeded)" if len(failed) < len(result["tables"]) else ""
        print(f"airflow-sync: {what} failed for {len(failed)} of {len(result['tables'])} table(s){others}{hint}:",
              file=sys.stderr)
        for table in failed:
            print(f"airflow-sync:   {table['table']}: {_one_line(table['error'])}", file=sys.stderr)
    else:
        print(f"airflow-sync: {what} failed: {_one_line(result.get('error'))}", file=sys.stderr)
    print(f"airflow-sync: the job's whole output, tracebacks included: {log_path}", file=sys.stderr)


def submit(spec, args, what: str, done, hint: str = "") -> int:
    """spark-submit ``spec``; print the result as JSON or ``done(result)``'s line (or the error)."""
    result, log_path = run_job(spec, args, what)
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    elif result.get("status") == "success":
        print(done(result))
    if result.get("status") != "success":
        report_failure(what, result, log_path, hint)
    return 0 if result.get("status") == "success" else 1


def run_reported(spec, args, what: str, write_report) -> tuple[dict, list[dict]] | None:
    """Run a job whose tables each get a report file (a reconciliation, a diff): its result and
    its tables, each with its ``report`` (printed as JSON with ``--json``); None when it failed
    (said on stderr, with where its log is)."""
    result, log_path = run_job(spec, args, what)
    if result.get("status") != "success":
        if args.json:
            print(json.dumps(result | {"verdict": result.get("verdict", "failed")}, indent=2, default=str))
        report_failure(what, result, log_path)
        return None
    tables = result["tables"] if "tables" in result else [result]
    for one in tables:
        one["report"] = write_report(one, args.report_dir)
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    return result, tables


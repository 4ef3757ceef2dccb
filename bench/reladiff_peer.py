"""reladiff (the maintained fork of datafold's data-diff) as a peer of our reconciliation job.

reladiff's own ClickHouse driver is ``clickhouse-driver``, which speaks only the native TCP
protocol (port 9000); the local stand-in (and many managed services) speak HTTP only. So the
worker half of this file registers a small adapter in reladiff's database registry: a subclass of
reladiff's ``Clickhouse`` (same SQL dialect, same MD5/normalisation mixins) whose connections are
``clickhouse-connect`` HTTP clients behind a minimal DB-API cursor. Nothing else in reladiff changes.

The target is a ReplacingMergeTree, so the adapter's clients send the ``final=1`` setting (FINAL
applied to every table of every query), as our job reads the target with ``FINAL``. reladiff itself
knows nothing about FINAL: without it, unmerged older versions of a row count as duplicates.

Two halves, one file:

* :func:`run_reladiff` (project venv) builds/reuses the ``reladiff`` peer venv (devenv/peers.py)
  and runs this file in it as a subprocess; passwords go through the environment, never argv.
* ``--worker`` (peer venv) runs reladiff's HashDiffer through its Python API and prints one JSON line.

Run (project venv): ``python -m bench.reladiff_peer DB TABLE [--columns v,d,ts] [--threads 2]``
against the services in /tmp/st2/urls.json (or ``--urls FILE``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

PEER = "reladiff"
HERE = Path(__file__).resolve()
BISECTION_FACTOR = 32  # reladiff's defaults (hashdiff_tables.DEFAULT_BISECTION_*)
BISECTION_THRESHOLD = 16 * 1024
_ENV_MYSQL_PASSWORD = "RELADIFF_MYSQL_PASSWORD"
_ENV_CH_PASSWORD = "RELADIFF_CH_PASSWORD"


def run_reladiff(mysql_url: str, ch_url: str, mysql_db: str, table: str, ch_db: str, ch_table: str,
                 key_column: str, columns=None, threads: int = 2, timeout: float = 3600, *,
                 bisection_factor: int = BISECTION_FACTOR, bisection_threshold: int = BISECTION_THRESHOLD,
                 final: bool = True, skip_sort_results: bool = False, memory_limit: int | None = None) -> dict:
    """Diff ``mysql_db.table`` (MySQL/MariaDB) against ``ch_db.ch_table`` (ClickHouse over HTTP).

    ``columns=None`` compares the key column only (row presence: comparable to a count check, but
    also catches a missing key offset by an extra one); a list compares those columns' content too
    (comparable to a checksum). Returns ``{"seconds", "diff_rows", "ok", "how"}`` plus detail:
    ``diff_seconds`` (inside the worker, connect to result, without interpreter start-up),
    ``stats`` (reladiff's rows_A/rows_B/exclusive_A/exclusive_B/updated/…) and ``error`` if not ok.
    ``diff_rows`` counts distinct keys reported (missing, extra or changed).

    ``skip_sort_results``: reladiff's own option (CLI ``--skip-sort-results``). reladiff 0.6.0 sorts
    each downloaded segment's differing rows by the whole row tuple, which raises ``TypeError: '<'
    not supported between instances of 'str' and 'NoneType'`` when a changed row has NULL in one
    version and a value in the other (erezsh/reladiff#81, fixed after 0.6.0); skipping the sort
    changes only the order of the rows reported, not which.

    ``memory_limit``: bytes of address space for the worker (``RLIMIT_AS``); past it the worker
    fails with ``MemoryError``. reladiff keeps every differing row in memory.
    """
    from bench.harness.clients import source, target
    from devenv.peers import peer_venv, venv_python

    python = venv_python(peer_venv(PEER))
    my, ch = source(mysql_url), target(ch_url)
    args = [str(python), str(HERE), "--worker",
            "--mysql-host", my.host, "--mysql-port", str(my.port), "--mysql-user", my.user,
            "--mysql-db", mysql_db, "--table", table,
            "--ch-host", ch.host, "--ch-port", str(ch.port), "--ch-user", ch.user,
            "--ch-db", ch_db, "--ch-table", ch_table, "--key", key_column,
            "--threads", str(threads), "--bisection-factor", str(bisection_factor),
            "--bisection-threshold", str(bisection_threshold)]
    if columns:
        args += ["--columns", ",".join(columns)]
    if not final:
        args.append("--no-final")
    if skip_sort_results:
        args.append("--skip-sort-results")
    env = dict(os.environ, **{_ENV_MYSQL_PASSWORD: my.password, _ENV_CH_PASSWORD: ch.password})
    env.pop("PYTHONPATH", None)  # the peer venv must not see the project's packages
    start = time.perf_counter()
    try:
        proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout,
                              preexec_fn=memory_limit and (lambda: resource.setrlimit(
                                  resource.RLIMIT_AS, (memory_limit, memory_limit))))
    except subprocess.TimeoutExpired:
        return {"seconds": time.perf_counter() - start, "diff_rows": None, "ok": False,
                "how": "reladiff hashdiff", "error": f"timed out after {timeout}s"}
    seconds = time.perf_counter() - start
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode or not lines:
        return {"seconds": seconds, "diff_rows": None, "ok": False, "how": "reladiff hashdiff",
                "error": (proc.stderr or proc.stdout).strip()[-2000:]}
    result = json.loads(lines[-1])
    result["seconds"] = seconds
    return result


# ----------------------------------------------------------------------------- worker (peer venv)

class _HttpCursor:
    """The part of a DB-API cursor sqeleton uses: execute(sql, args), description, fetchall()."""

    _READS = ("select", "with", "show", "explain", "describe", "desc", "exists")

    def __init__(self, client):
        self._client = client
        self.description = None
        self._rows = []

    def execute(self, sql, args=None):
        if args:
            raise NotImplementedError("positional arguments (sqeleton does not send any to ClickHouse)")
        if sql.lstrip().lower().startswith(self._READS):
            result = self._client.query(sql)
            self.description = [(name, str(kind), None, None, None, None, None)
                                for name, kind in zip(result.column_names, result.column_types)]
            self._rows = [tuple(row) for row in result.result_rows]
        else:
            self._client.command(sql)
            self.description, self._rows = None, []

    def fetchall(self):
        rows, self._rows = self._rows, []
        return rows

    def close(self):
        pass


class _HttpConnection:
    def __init__(self, client):
        self._client = client
        self._cursor = _HttpCursor(client)

    def cursor(self):
        return self._cursor

    def commit(self):
        pass

    def rollback(self):
        pass

    def close(self):
        self._client.close()


def _clickhouse_http_class():
    """reladiff's Clickhouse database (dialect unchanged) over clickhouse-connect's HTTP client."""
    import clickhouse_connect
    from reladiff.databases.clickhouse import Clickhouse

    class ClickhouseHttp(Clickhouse):
        CONNECT_URI_HELP = "clickhouse_http://<user>:<password>@<host>:<port>/<database>"

        def __init__(self, *, thread_count, final=True, **kw):
            super().__init__(thread_count=thread_count, **kw)
            self._final = final

        def create_connection(self):
            kw = self._args
            client = clickhouse_connect.get_client(
                host=kw.get("host", "127.0.0.1"), port=int(kw.get("port", 8123)),
                username=kw.get("user", "default"), password=kw.get("password", ""),
                database=kw.get("database", "default"), autogenerate_session_id=False,
                settings={"final": 1} if self._final else None)
            return _HttpConnection(client)  # one per worker thread (sqeleton's ThreadedDatabase)

    return ClickhouseHttp


def _mysql_utf8mb4_class():
    """reladiff's MySQL database with a utf8mb4 session: sqeleton hard-codes ``charset="utf8"``,
    a utf8mb3 session on MariaDB 10.11, which reads every 4-byte character (emoji) as '?'."""
    from reladiff.databases.mysql import MySQL
    from sqeleton.databases.mysql import import_mysql

    class MySQLUtf8mb4(MySQL):
        def create_connection(self):
            return import_mysql().connect(charset="utf8mb4", use_unicode=True, **self._args)

    return MySQLUtf8mb4


def _worker(ns) -> dict:
    import reladiff
    from reladiff import HashDiffer
    from reladiff.databases import _connect as registry

    logging_level = os.environ.get("RELADIFF_LOG")
    if logging_level:
        import logging
        logging.basicConfig(level=logging_level.upper(), stream=sys.stderr)

    # reladiff's own registry plus the HTTP adapter; Connect_SetUTC sets MySQL's session to UTC.
    connect = registry.Connect_SetUTC(dict(registry.DATABASE_BY_SCHEME, clickhouse_http=_clickhouse_http_class(),
                                           mysql=_mysql_utf8mb4_class()))
    columns = tuple(c for c in (ns.columns or "").split(",") if c)
    start = time.perf_counter()
    db1 = connect({"driver": "mysql", "host": ns.mysql_host, "port": ns.mysql_port, "user": ns.mysql_user,
                   "password": os.environ.get(_ENV_MYSQL_PASSWORD, ""), "database": ns.mysql_db},
                  thread_count=ns.threads, shared=False)
    db2 = connect({"driver": "clickhouse_http", "host": ns.ch_host, "port": ns.ch_port, "user": ns.ch_user,
                   "password": os.environ.get(_ENV_CH_PASSWORD, ""), "database": ns.ch_db, "final": ns.final},
                  thread_count=ns.threads, shared=False)
    try:
        t1 = reladiff.connect_to_table(db1, (ns.mysql_db, ns.table), ns.key, extra_columns=columns)
        t2 = reladiff.connect_to_table(db2, (ns.ch_db, ns.ch_table), ns.key, extra_columns=columns)
        # As the CLI with --threads N: N connections per database, 2N diffing workers.
        differ = HashDiffer(bisection_factor=ns.bisection_factor, bisection_threshold=ns.bisection_threshold,
                            threaded=True, max_threadpool_size=ns.threads * 2,
                            skip_sort_results=ns.skip_sort_results)
        with differ.diff_tables(t1, t2) as diff:
            stats = diff.get_stats_dict()  # consumes the diff
            sample = [[sign, [str(v) for v in values]] for sign, values in diff.result_list[:10]]
    finally:
        db1.close()
        db2.close()
    what = f"key+columns {','.join(columns)}" if columns else "key only"
    return {
        "diff_seconds": time.perf_counter() - start,
        "diff_rows": stats["total"],
        "ok": True,
        "how": (f"reladiff {reladiff.__version__} hashdiff, {what}: count + sum of per-row MD5 (60 bits) per "
                f"key-range segment, bisection factor {ns.bisection_factor}, threshold {ns.bisection_threshold} "
                f"rows (below: download and compare); {ns.threads} connections per database, "
                f"{ns.threads * 2} diff workers; ClickHouse over HTTP (clickhouse-connect adapter)"
                + (", final=1" if ns.final else ", no FINAL")
                + (", skip_sort_results" if ns.skip_sort_results else "")),
        "stats": {k: v for k, v in stats.items() if k != "stats"} | {"internal": stats.get("stats", {})},
        "sample": sample,
    }


def _worker_main(argv) -> None:
    p = argparse.ArgumentParser(description="reladiff worker (runs in the reladiff peer venv)")
    p.add_argument("--worker", action="store_true")
    for side, user in (("mysql", "root"), ("ch", "default")):
        p.add_argument(f"--{side}-host", default="127.0.0.1")
        p.add_argument(f"--{side}-port", type=int, required=True)
        p.add_argument(f"--{side}-user", default=user)
        p.add_argument(f"--{side}-db", required=True)
    p.add_argument("--table", required=True)
    p.add_argument("--ch-table", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--columns", default="")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--bisection-factor", type=int, default=BISECTION_FACTOR)
    p.add_argument("--bisection-threshold", type=int, default=BISECTION_THRESHOLD)
    p.add_argument("--no-final", dest="final", action="store_false")
    p.add_argument("--skip-sort-results", action="store_true")
    print(json.dumps(_worker(p.parse_args(argv)), default=str), flush=True)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="Run reladiff MySQL -> ClickHouse on one table.")
    p.add_argument("database", help="MySQL database (also the ClickHouse database unless --ch-db)")
    p.add_argument("table", help="table (also the ClickHouse table unless --ch-table)")
    p.add_argument("--ch-db")
    p.add_argument("--ch-table")
    p.add_argument("--key", default="id")
    p.add_argument("--columns", help="comma-separated columns to compare (default: key only)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--bisection-factor", type=int, default=BISECTION_FACTOR)
    p.add_argument("--bisection-threshold", type=int, default=BISECTION_THRESHOLD)
    p.add_argument("--no-final", dest="final", action="store_false")
    p.add_argument("--urls", default="/tmp/st2/urls.json", help='JSON file with "mysql" and "ch" URLs')
    p.add_argument("--timeout", type=float, default=3600)
    ns = p.parse_args(argv)
    urls = json.loads(Path(ns.urls).read_text())
    result = run_reladiff(urls["mysql"], urls["ch"], ns.database, ns.table, ns.ch_db or ns.database,
                          ns.ch_table or ns.table, ns.key, ns.columns.split(",") if ns.columns else None,
                          ns.threads, ns.timeout, bisection_factor=ns.bisection_factor,
                          bisection_threshold=ns.bisection_threshold, final=ns.final)
    print(json.dumps(result, indent=1, default=str))
    sys.exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    if "--worker" in sys.argv[1:]:
        _worker_main(sys.argv[1:])
    else:
        if str(HERE.parent.parent) not in sys.path:
            sys.path.insert(0, str(HERE.parent.parent))  # `python bench/reladiff_peer.py` finds devenv
        main()

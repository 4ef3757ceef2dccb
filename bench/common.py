"""Shared bench plumbing: services, machine description, timing, result files."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    mem = int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemTotal"))) // 1024 // 1024
    maria = subprocess.run(["mariadbd", "--version"], capture_output=True, text=True).stdout.strip()
    return f"{os.cpu_count()} cores ({cpu}), {mem} GiB RAM, {platform.platform()}, {maria}"


@contextlib.contextmanager
def timer():
    box = {}
    start = time.perf_counter()
    yield box
    box["seconds"] = time.perf_counter() - start


@contextlib.contextmanager
def services(name: str):
    from devenv.services import clickhouse_service, mysql_service

    state = Path(os.environ.get("BENCH_STATE", f"/tmp/airflow-sync-bench-{name}"))
    with mysql_service(state) as mysql_url, clickhouse_service(state) as clickhouse_url:
        yield mysql_url, clickhouse_url


@contextlib.contextmanager
def tls_services(name: str):
    """For the benches' TLS variants: one MariaDB that takes TLS and plain connections alike (its
    certificate from devenv/certs.py; ``require_secure_transport`` off, so both variants read the
    same server and data), a chDB endpoint over HTTP and one over HTTPS (mutual TLS). Yields
    (plain MySQL URL, TLS MySQL URL (VERIFY_IDENTITY), HTTP URL, HTTPS URL)."""
    from devenv.certs import Certificates
    from devenv.clickhouse_http import ChdbEndpoint
    from devenv.mariadb import ROOT_PASSWORD, MariaDB

    state = Path(os.environ.get("BENCH_STATE", f"/tmp/airflow-sync-bench-{name}"))
    certs = Certificates(state / "certs").make()
    with MariaDB(state / "mariadb", tls=certs, settings={"require_secure_transport": "OFF"}) as server, \
            ChdbEndpoint(state / "clickhouse") as http, ChdbEndpoint(state / "clickhouse-https", tls=certs) as https:
        yield f"mysql://root:{ROOT_PASSWORD}@127.0.0.1:{server.port}/", server.url, http.url, https.url


def write_result(name: str, text: str) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.md"
    path.write_text(text)
    print(text)
    return path


def fmt_rate(value) -> str:
    return f"{value:,.0f}" if value else "—"


def fmt_ratio(a, b) -> str:
    return f"{a / b:.2f}×" if a and b else "—"


def drop_bench_data(ch, conn, target_db: str, source_db: str) -> None:
    """A bench's databases on both sides (``ch``: a clickhouse-connect client, ``conn``: a pymysql
    connection, both closed here) and the source's binlog of the generated rows."""
    from airflow_sync_provider.core.sql import ch_ident

    ch.command(f"DROP DATABASE IF EXISTS {ch_ident(target_db)}")
    ch.close()
    with conn, conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS `{source_db}`")
        cur.execute("RESET MASTER")  # the generated rows' binlog

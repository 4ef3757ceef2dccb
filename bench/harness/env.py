"""Where a bench runs: its services (a private MariaDB and the chDB endpoint, or the servers
MYSQL_URL / CLICKHOUSE_URL name), the machine it describes, its result files."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
RESULTS = REPO / "bench" / "results"


# --- services -------------------------------------------------------------------------------------

def state_dir(name: str) -> Path:
    """A bench's state (its servers' data): $BENCH_STATE, else /tmp/airflow-sync-bench-<name>."""
    return Path(os.environ.get("BENCH_STATE", f"/tmp/airflow-sync-bench-{name}"))


@contextlib.contextmanager
def services(name: str):
    """(MySQL URL, ClickHouse URL): a private MariaDB and the chDB endpoint under :func:`state_dir`,
    or the servers MYSQL_URL / CLICKHOUSE_URL name (devenv/services.py)."""
    from devenv.services import clickhouse_service, mysql_service

    state = state_dir(name)
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

    state = state_dir(name)
    certs = Certificates(state / "certs").make()
    with MariaDB(state / "mariadb", tls=certs, settings={"require_secure_transport": "OFF"}) as server, \
            ChdbEndpoint(state / "clickhouse") as http, ChdbEndpoint(state / "clickhouse-https", tls=certs) as https:
        yield f"mysql://root:{ROOT_PASSWORD}@127.0.0.1:{server.port}/", server.url, http.url, https.url


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    mem = int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemTotal"))) // 1024 // 1024
    maria = subprocess.run(["mariadbd", "--version"], capture_output=True, text=True).stdout.strip()
    return f"{os.cpu_count()} cores ({cpu}), {mem} GiB RAM, {platform.platform()}, {maria}"


# --- result files ---------------------------------------------------------------------------------

def write_result(name: str, text: str) -> Path:
    """bench/results/<name>.md (and the text on stdout)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.md"
    path.write_text(text)
    print(text)
    return path


def write_json(name: str, data) -> Path:
    """bench/results/<name>.json: the raw numbers behind a result file."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=1))
    return path


def tail(path, chars: int = 3000) -> str:
    """The end of a log file ("" when there is none)."""
    try:
        return Path(path).read_text(errors="replace")[-chars:]
    except OSError:
        return ""

#!/usr/bin/env bash
# Installs everything the demo and the tests need on a fresh Debian/Ubuntu machine:
# Debian packages (MariaDB server, PostgreSQL server, Chromium, Java, MariaDB client headers for mysqlclient, iproute2), the venv
# in .venv, and this package with its test extra. Idempotent and quick when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ] || need_apt+=(mariadb-server)
command -v java >/dev/null 2>&1 || need_apt+=(default-jre-headless)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need_apt+=(postgresql)  # the real-Airflow tier's metadata DB
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)  # the real-Airflow tier's screenshots of the Sync view
pkg-config --exists libmariadb 2>/dev/null || need_apt+=(libmariadb-dev pkg-config)
command -v gcc >/dev/null 2>&1 || need_apt+=(gcc)
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)  # the TLS tests' certificates (devenv/certs.py)
command -v ip >/dev/null 2>&1 || [ -x /usr/sbin/ip ] || [ -x /sbin/ip ] || need_apt+=(iproute2)  # the cluster tests' network namespace
python3 -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3-venv)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "[setup] apt-get install ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  python3 -m venv .venv
fi
stamp=.venv/.airflow-sync-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[setup] pip install -e .[test] (first time: a few minutes)"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".[test]"
  echo "$want" > "$stamp"
fi
# The repository's modules byte-compiled ahead: every job driver, Airflow task and CLI process
# imports them, and where PYTHONDONTWRITEBYTECODE is set (this machine's environment) each process
# compiled them again (~0.1 CPU-s each, a few hundred processes a test run). Quick when up to date.
.venv/bin/python -m compileall -q airflow_sync_provider spark_jobs devenv tests dags >/dev/null
# The JVM class archive a local Spark driver starts from (core/jvm_archive.py: ~5 s to a driver's
# first task instead of ~9 here); made once per Java and Spark installation, ~25 s the first time.
.venv/bin/python -m airflow_sync_provider.core.jvm_archive | sed 's/^/[setup] /'

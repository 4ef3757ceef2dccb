"""Private venvs for third-party tools ("peers") that run against our local stand-ins.

A peer's dependencies may clash with the project's (mysql-ch-replicator wants fastapi<0.116,
Airflow a newer one), so each peer gets its own venv under ``.venv-peers/<name>`` at the top
of the repository. The venv is built once and reused: a stamp file records the requirements
and the Python it was built for, and a changed pin or interpreter rebuilds it.

Tests and benchmarks call :func:`peer_venv`.

Run: ``python -m devenv.peers mysql-ch-replicator`` (prints the venv directory).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PEERS_DIR = ROOT / ".venv-peers"
STAMP = ".peer-stamp.json"

# name -> pip requirements. Direct dependencies are pinned to a set installed and run together
# (pip resolves the rest within these pins).
PEERS: dict[str, list[str]] = {
    "mysql-ch-replicator": [
        "mysql-ch-replicator==0.1.16",
        "clickhouse-connect==1.12.0",
        "mysql-connector-python==26.10.0",
        "pymysql==1.2.4",
        "pyyaml==6.0.3",
        "sqlparse==0.6.1",
        "pyparsing==3.3.3",
        "packaging==26.3",
        "requests==2.34.2",
        "fastapi==0.115.14",
        "uvicorn==0.34.3",
    ],
    # reladiff's ClickHouse driver (clickhouse-driver) is native-TCP only; bench/reladiff_peer.py
    # plugs clickhouse-connect (HTTP) in instead, so neither the [clickhouse] extra nor the driver.
    "reladiff": [
        "reladiff==0.6.0",
        "sqeleton==0.1.7",
        "runtype==0.5.3",
        "dsnparse==0.4.0",
        "click==8.5.1",
        "rich==15.0.0",
        "toml==0.10.2",
        "mysql-connector-python==26.10.0",
        "clickhouse-connect==1.12.0",
    ],
}


def _stamp_for(requirements: list[str]) -> dict:
    return {
        "requirements": list(requirements),
        "python": sys.version.split()[0],
        "base": os.path.realpath(sys.base_prefix),
    }


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def peer_venv(name: str, *, quiet: bool = True) -> Path:
    """Create (or reuse) the venv of peer ``name`` and return its directory."""
    if name not in PEERS:
        raise KeyError(f"unknown peer {name!r}; known: {', '.join(sorted(PEERS))}")
    requirements = PEERS[name]
    venv = PEERS_DIR / name
    stamp_path = venv / STAMP
    wanted = _stamp_for(requirements)
    PEERS_DIR.mkdir(parents=True, exist_ok=True)
    # One builder at a time (parallel test workers, a benchmark started alongside the tests).
    with open(PEERS_DIR / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if stamp_path.exists() and json.loads(stamp_path.read_text()) == wanted \
                    and venv_python(venv).exists():
                return venv
        except (OSError, ValueError):
            pass  # unreadable stamp: rebuild
        if venv.exists():
            shutil.rmtree(venv)
        try:
            # `-m venv` builds on the base interpreter, so the peer sees none of the project's packages.
            _run([sys.executable, "-m", "venv", str(venv)], quiet)
            _run([str(venv_python(venv)), "-m", "pip", "install", "--disable-pip-version-check",
                  *requirements], quiet)
        except BaseException:
            shutil.rmtree(venv, ignore_errors=True)  # never leave a half-built venv behind
            raise
        tmp = stamp_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(wanted, indent=1) + "\n")
        os.replace(tmp, stamp_path)  # the stamp appears only once the install succeeded
        return venv


def _run(args: list[str], quiet: bool) -> None:
    """Run a build step; when quiet, its output is shown only if it fails."""
    if not quiet:
        subprocess.run(args, check=True)
        return
    proc = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if proc.returncode:
        sys.stderr.write(proc.stdout.decode(errors="replace"))
        raise subprocess.CalledProcessError(proc.returncode, args)


def main(argv=None):
    parser = argparse.ArgumentParser(description="Create or reuse a third-party tool's private venv.")
    parser.add_argument("name", choices=sorted(PEERS))
    parser.add_argument("--verbose", action="store_true", help="show pip's output")
    args = parser.parse_args(argv)
    print(peer_venv(args.name, quiet=not args.verbose))


if __name__ == "__main__":
    main()

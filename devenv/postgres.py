"""A private PostgreSQL instance: the metadata database of the real-Airflow test tier
(tests/airflow_real.py). A LOCAL STAND-IN, like devenv/mariadb.py.

Why PostgreSQL: the LocalExecutor needs a database with concurrent writers (not SQLite), and
Airflow 3.3 does not run on MariaDB (its scheduler's asset clean-up issues ``WITH … DELETE``,
which MariaDB rejects: the scheduler exits). Debian's ``postgresql`` package; the server runs as
the ``postgres`` system user when we are root (it refuses to run as root), on its own data dir,
socket dir and a free loopback port, with a throwaway password.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from devenv.mariadb import free_port, stop_process

PASSWORD = "devenv-airflow-meta-pw"  # a throwaway instance on loopback; never a production secret


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=lambda p: int(p.split("/")[4]))
    if found:
        return found[-1]
    if shutil.which(name):
        return shutil.which(name)
    raise FileNotFoundError(f"PostgreSQL's {name} not found: apt-get install postgresql (devenv/setup.sh does)")


class PostgreSQL:
    def __init__(self, port: int | None = None):
        self.port = port or free_port()
        self.user = pwd.getpwnam("postgres") if os.geteuid() == 0 else None
        # not under pytest's root-only temporary directory: the server's user must reach it
        self.base = Path(tempfile.mkdtemp(prefix="airflow-meta-pg-"))
        self.datadir = self.base / "data"
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"postgresql+psycopg2://airflow:{PASSWORD}@127.0.0.1:{self.port}/airflow"

    def _run_as(self) -> dict:
        return {"user": self.user.pw_uid, "group": self.user.pw_gid} if self.user else {}

    def start(self, timeout: float = 60) -> "PostgreSQL":
        pwfile = self.base / "pw"
        pwfile.write_text(PASSWORD)
        pwfile.chmod(0o600)
        if self.user:
            for path in (self.base, pwfile):
                os.chown(path, self.user.pw_uid, self.user.pw_gid)
        subprocess.run([_bin("initdb"), "-D", str(self.datadir), "-U", "airflow", f"--pwfile={pwfile}",
                        "--auth=scram-sha-256", "-E", "UTF8", "--no-sync"], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, **self._run_as())
        pwfile.unlink()
        log = open(self.base / "server.log", "wb")  # noqa: SIM115 - kept open by the process
        self.proc = subprocess.Popen(
            [_bin("postgres"), "-D", str(self.datadir), "-p", str(self.port), "-h", "127.0.0.1",
             "-k", str(self.base), "-c", "max_connections=200", "-c", "fsync=off",
             "-c", "synchronous_commit=off", "-c", "full_page_writes=off"],
            stdout=log, stderr=subprocess.STDOUT, **self._run_as())
        import psycopg2

        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"postgres exited early; see {self.base / 'server.log'}")
            try:
                conn = psycopg2.connect(host="127.0.0.1", port=self.port, user="airflow", password=PASSWORD,
                                        dbname="postgres")
                break
            except psycopg2.OperationalError as exc:
                if time.monotonic() > deadline:
                    self.stop()
                    raise TimeoutError(f"PostgreSQL not ready after {timeout}s; "
                                       f"see {self.base / 'server.log'}") from exc
                time.sleep(0.2)
        conn.autocommit = True
        try:
            conn.cursor().execute("CREATE DATABASE airflow")
        finally:
            conn.close()
        return self

    def stop(self) -> None:
        stop_process(self.proc)  # SIGTERM: a smart shutdown
        self.proc = None
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

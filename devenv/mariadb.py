"""A private MariaDB instance with the binlog settings CDC needs: a LOCAL STAND-IN.

Production sources are MySQL 8.0/8.4 or MariaDB 10.6+; this starts Debian's MariaDB 10.11 on
its own data dir and a free port so tests and the demo never touch a system database.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pymysql

# The settings SPEC §2 asks of every source (python-mysql-replication needs full row metadata).
BINLOG_SETTINGS = {
    "log_bin": "mysql-bin",
    "binlog_format": "ROW",
    "binlog_row_image": "FULL",
    "binlog_row_metadata": "FULL",
    "server_id": "1",
}
ROOT_PASSWORD = "devenv-root-pw"  # a throwaway instance on loopback; never a production secret


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ensure_installed() -> None:
    """Install Debian's mariadb-server when mariadbd is missing (needs root, as in CI)."""
    if shutil.which("mariadbd") or Path("/usr/sbin/mariadbd").exists():
        return
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", "mariadb-server"], check=True, env=env)


def stop_process(proc: subprocess.Popen | None, timeout: float = 30) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``timeout`` seconds."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class MariaDB:
    def __init__(self, base_dir: str | os.PathLike, port: int | None = None):
        self.base = Path(base_dir)
        self.datadir = self.base / "data"
        self.socket = self.base / "mysqld.sock"
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"mysql://root:{ROOT_PASSWORD}@127.0.0.1:{self.port}/"

    def _user_args(self) -> list[str]:
        return ["--user=root"] if os.geteuid() == 0 else []

    def _install(self, attempts: int = 3) -> None:
        """mariadb-install-db, retried on a wiped data dir: on a fresh CI machine it once failed
        for one of two concurrent test workers (the other succeeded), so a transient failure
        gets another try and a lasting one an error that shows the tool's own output."""
        log = self.base / "install.log"
        for attempt in range(1, attempts + 1):
            shutil.rmtree(self.datadir, ignore_errors=True)
            done = subprocess.run(
                ["mariadb-install-db", "--no-defaults", f"--datadir={self.datadir}",
                 "--auth-root-authentication-method=normal", "--skip-test-db", *self._user_args()],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            )
            with log.open("a") as out:
                out.write(f"--- attempt {attempt}: exit {done.returncode}\n{done.stdout}\n")
            if done.returncode == 0:
                return
            time.sleep(attempt)
        tail = "\n".join(done.stdout.strip().splitlines()[-15:])
        raise RuntimeError(f"mariadb-install-db failed {attempts} times (full output in {log}):\n{tail}")

    def start(self, timeout: float = 60) -> "MariaDB":
        ensure_installed()
        self.base.mkdir(parents=True, exist_ok=True)
        # its internal temporary tables (every information_schema.COLUMNS query makes an Aria one)
        # in a directory of its own, not in a /tmp that other jobs on the machine clean up
        (self.base / "tmp").mkdir(exist_ok=True)
        fresh = not (self.datadir / "mysql").exists()
        if fresh:
            self._install()
        args = [
            "mariadbd", "--no-defaults", f"--datadir={self.datadir}", f"--port={self.port}",
            f"--socket={self.socket}", "--bind-address=127.0.0.1", f"--pid-file={self.base / 'mysqld.pid'}",
            f"--log-error={self.base / 'error.log'}", f"--tmpdir={self.base / 'tmp'}", "--skip-name-resolve",
            "--character-set-server=utf8mb4", "--collation-server=utf8mb4_general_ci",
            "--innodb-buffer-pool-size=512M", "--innodb-flush-log-at-trx-commit=2",
            "--max-connections=500", *self._user_args(),
            *(f"--{k.replace('_', '-')}={v}" for k, v in BINLOG_SETTINGS.items()),
        ]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mariadbd exited early; see {self.base / 'error.log'}")
            try:
                conn = pymysql.connect(unix_socket=str(self.socket), user="root",
                                       password="" if fresh else ROOT_PASSWORD)
                break
            except pymysql.err.OperationalError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise TimeoutError(f"MariaDB not ready after {timeout}s; see {self.base / 'error.log'}")
                time.sleep(0.2)
        with conn, conn.cursor() as cur:
            if fresh:  # root over TCP with a password, like a real server
                for host in ("localhost", "127.0.0.1", "::1"):
                    cur.execute("CREATE USER IF NOT EXISTS 'root'@%s", (host,))
                    cur.execute("ALTER USER 'root'@%s IDENTIFIED BY %s", (host, ROOT_PASSWORD))
                    cur.execute("GRANT ALL ON *.* TO 'root'@%s WITH GRANT OPTION", (host,))
        self._check_tcp_reaches_this_server()
        return self

    def _check_tcp_reaches_this_server(self) -> None:
        """The URL's port must lead to this data dir, not to another test worker's server that
        took the same port (free_port() only finds a port that was free a moment ago)."""
        with pymysql.connect(host="127.0.0.1", port=self.port, user="root", password=ROOT_PASSWORD) as conn:
            with conn.cursor() as cur:
                cur.execute("SELECT @@datadir")
                datadir = Path(cur.fetchone()[0]).resolve()
        if datadir != self.datadir.resolve():
            self.stop()
            raise RuntimeError(f"port {self.port} leads to the MariaDB of {datadir}, not {self.datadir}")

    def stop(self) -> None:
        stop_process(self.proc)  # SIGTERM = clean InnoDB shutdown
        self.proc = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

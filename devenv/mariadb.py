"""A private MariaDB instance with the binlog settings CDC needs: a LOCAL STAND-IN.

Production sources are MySQL 8.0/8.4 or MariaDB 10.6+; this starts Debian's MariaDB 10.11 on
its own data dir and a free port so tests and the demo never touch a system database.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import quote

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


def _copy_sparse(source: Path, target: Path) -> None:
    """Copy a data dir keeping its runs of zeros as holes (GNU cp), else a plain copy."""
    if shutil.which("cp") and subprocess.run(["cp", "-a", "--sparse=always", str(source), str(target)],
                                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0:
        return
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target, symlinks=True)


_templates: dict[tuple, Path] = {}
_templates_lock = threading.Lock()


def _remove_if_ours(path: Path, pid: int) -> None:
    if os.getpid() == pid:  # not in a forked child that exits normally
        shutil.rmtree(path, ignore_errors=True)


def _template(user_args: list[str], attempts: int = 3) -> Path:
    """The data dir ``mariadb-install-db`` makes, made once per process (servers started side by
    side wait for the first) and never started: each new server copies it. Removed at exit."""
    with _templates_lock:
        key = tuple(user_args)
        if key in _templates and (_templates[key] / "mysql" / "global_priv.MAI").is_file():
            return _templates[key]  # (made again if something cleaning the temporary directory took it)
        work = Path(tempfile.mkdtemp(prefix="airflow-sync-mariadb-template-"))
        atexit.register(_remove_if_ours, work, os.getpid())
        installed, log = work / "installed", work / "install.log"
        for attempt in range(1, attempts + 1):
            # retried on a wiped data dir: on a fresh CI machine it once failed for one of two
            # concurrent test workers (the other succeeded), so a transient failure gets another
            # try and a lasting one an error that shows the tool's own output
            shutil.rmtree(installed, ignore_errors=True)
            done = subprocess.run(
                ["mariadb-install-db", "--no-defaults", f"--datadir={installed}",
                 "--auth-root-authentication-method=normal", "--skip-test-db", *user_args],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            )
            with log.open("a") as out:
                out.write(f"--- attempt {attempt}: exit {done.returncode}\n{done.stdout}\n")
            if done.returncode == 0:
                break
            time.sleep(attempt)
        else:
            tail = "\n".join(done.stdout.strip().splitlines()[-15:])
            raise RuntimeError(f"mariadb-install-db failed {attempts} times (full output in {log}):\n{tail}")
        template = work / "data"
        _copy_sparse(installed, template)  # 6 MB on disk instead of 114
        shutil.rmtree(installed)
        _templates[key] = template
        return template


class MariaDB:
    """``settings`` add to or override BINLOG_SETTINGS (server options without the leading
    dashes, e.g. ``{"log_bin_compress": "ON"}`` or a replica's ``{"server_id": "2"}``).

    ``tls`` (devenv/certs.py): the server takes TLS connections only
    (``require_secure_transport=ON``, its certificate signed by ``tls.ca``); root keeps the local
    socket, and its TCP URL verifies the server against the CA."""

    def __init__(self, base_dir: str | os.PathLike, port: int | None = None, settings: dict | None = None,
                 tls=None):
        self.base = Path(base_dir)
        self.datadir = self.base / "data"
        self.socket = self.base / "mysqld.sock"
        self.port, self._port_chosen = port or free_port(), port is None
        self.tls = tls
        tls_settings = {"ssl_ca": tls.ca, "ssl_cert": tls.server_cert, "ssl_key": tls.server_key,
                        "require_secure_transport": "ON"} if tls else {}
        self.settings = {**BINLOG_SETTINGS, **tls_settings, **(settings or {})}
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        tls = f"?ssl_mode=VERIFY_IDENTITY&ssl_ca={quote(self.tls.ca, safe='')}" if self.tls else ""
        return f"mysql://root:{ROOT_PASSWORD}@127.0.0.1:{self.port}/{tls}"

    def _tcp_ssl(self) -> dict | None:
        """pymysql's ``ssl`` for root's own TCP connections (a TLS-only server refuses plain text)."""
        return {"ca": self.tls.ca} if self.tls else None

    def _user_args(self) -> list[str]:
        return ["--user=root"] if os.geteuid() == 0 else []

    def _install(self) -> None:
        """A fresh data dir: a copy of the one mariadb-install-db made for this process
        (_template). The copy is sparse (the 96 MB redo log is zeros) and takes ~0.05 s where an
        install took 0.6-1.6 s: a test run starts some forty servers."""
        template = _template(self._user_args())
        shutil.rmtree(self.datadir, ignore_errors=True)
        _copy_sparse(template, self.datadir)

    def _lost_port_race(self) -> bool:
        """The server just refused to start because its port was in use (its last start's log)."""
        try:
            tail = (self.base / "error.log").read_text(errors="replace")[-2000:]
        except OSError:
            return False
        last_start = tail.rsplit("Starting MariaDB", 1)[-1]
        return f"port: '{self.port}'" in last_start and "Address already in use" in last_start

    def start(self, timeout: float = 60) -> "MariaDB":
        ensure_installed()
        self.base.mkdir(parents=True, exist_ok=True)
        # its internal temporary tables (every information_schema.COLUMNS query makes an Aria one)
        # in a directory of its own, not in a /tmp that other jobs on the machine clean up
        (self.base / "tmp").mkdir(exist_ok=True)
        fresh = not (self.datadir / "mysql").exists()
        if fresh:
            self._install()
        self._run(fresh, timeout)
        return self

    def _run(self, fresh: bool, timeout: float) -> None:
        """Start mariadbd and wait until it answers (``fresh``: root has no password yet)."""
        args = [
            "mariadbd", "--no-defaults", f"--datadir={self.datadir}", f"--port={self.port}",
            f"--socket={self.socket}", "--bind-address=127.0.0.1", f"--pid-file={self.base / 'mysqld.pid'}",
            f"--log-error={self.base / 'error.log'}", f"--tmpdir={self.base / 'tmp'}", "--skip-name-resolve",
            "--character-set-server=utf8mb4", "--collation-server=utf8mb4_general_ci",
            "--innodb-buffer-pool-size=512M", "--innodb-flush-log-at-trx-commit=2",
            "--max-connections=500", *self._user_args(),
            *(f"--{k.replace('_', '-')}={v}" for k, v in self.settings.items()),
        ]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                if self._port_chosen and self._lost_port_race():
                    self.port = free_port()  # another socket took it since free_port() found it free
                    return self._run(fresh, timeout)
                raise RuntimeError(f"mariadbd exited early; see {self.base / 'error.log'}")
            try:
                conn = pymysql.connect(unix_socket=str(self.socket), user="root",
                                       password="" if fresh else ROOT_PASSWORD)
                break
            except pymysql.err.OperationalError as exc:
                if time.monotonic() > deadline:
                    self.stop()
                    raise TimeoutError(f"MariaDB not ready after {timeout}s; see {self.base / 'error.log'}") from exc
                time.sleep(0.2)
        with conn, conn.cursor() as cur:
            if fresh:  # root over TCP with a password, like a real server
                for host in ("localhost", "127.0.0.1", "::1"):
                    cur.execute("CREATE USER IF NOT EXISTS 'root'@%s", (host,))
                    cur.execute("ALTER USER 'root'@%s IDENTIFIED BY %s", (host, ROOT_PASSWORD))
                    cur.execute("GRANT ALL ON *.* TO 'root'@%s WITH GRANT OPTION", (host,))
        self._check_tcp_reaches_this_server()

    def _check_tcp_reaches_this_server(self) -> None:
        """The URL's port must lead to this data dir, not to another test worker's server that
        took the same port (free_port() only finds a port that was free a moment ago)."""
        with pymysql.connect(host="127.0.0.1", port=self.port, user="root", password=ROOT_PASSWORD,
                             ssl=self._tcp_ssl()) as conn:
            with conn.cursor() as cur:
                cur.execute("SELECT @@datadir")
                datadir = Path(cur.fetchone()[0]).resolve()
        if datadir != self.datadir.resolve():
            self.stop()
            raise RuntimeError(f"port {self.port} leads to the MariaDB of {datadir}, not {self.datadir}")

    def stop(self) -> None:
        stop_process(self.proc)  # SIGTERM = clean InnoDB shutdown
        self.proc = None

    def kill(self) -> None:
        """SIGKILL: the server dies as in a crash or a lost host (no clean shutdown)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


# --- a primary with a GTID replica behind a switchable address: failover tests (issue 35) ---


class TcpProxy:
    """A TCP forwarder on a fixed local port: clients connect to ``port`` and reach
    ``127.0.0.1:target``. :meth:`switch` points it elsewhere and drops the connections it carries,
    as a virtual IP or a proxy moving to a promoted replica looks to a client (the old
    connections break; new ones reach the new server). A connection made while the target is
    down is closed at once, as a dead address refuses it.

    It runs in a process of its own: in the test's process its threads would share the
    interpreter with the job under test, and a busy job would stall the forwarding (a lease's
    2-second ping, a pooled connection's wait) as no real proxy does."""

    def __init__(self, target: int, port: int | None = None):
        import multiprocessing

        self.target = target
        self.port = port or free_port()
        context = multiprocessing.get_context("spawn")
        self._commands, ready = context.Queue(), context.Event()
        self._process = context.Process(target=_proxy_main, args=(self.port, target, self._commands, ready),
                                        daemon=True)
        self._process.start()
        if not ready.wait(30):
            self._process.kill()
            raise RuntimeError(f"the TCP proxy on port {self.port} did not start")

    def switch(self, target: int) -> None:
        """Forward new connections to ``target`` and break the ones to the old target."""
        self.target = target
        self._commands.put(("switch", target))
        self._commands.put(("sync", None))
        deadline = time.monotonic() + 10
        while self._commands.qsize() and time.monotonic() < deadline:  # applied before this returns
            time.sleep(0.05)
        time.sleep(0.1)

    def close(self) -> None:
        self._commands.put(("close", None))
        self._process.join(timeout=5)
        if self._process.is_alive():
            self._process.kill()


def _proxy_main(port: int, target: int, commands, ready) -> None:
    """The proxy's process: accept, pair each client with a connection to the target, pump both
    ways; commands switch the target (dropping every pair) or close it."""
    import queue
    import threading

    listener = socket.create_server(("127.0.0.1", port), reuse_port=False, backlog=128)
    listener.settimeout(0.1)
    pairs, lock, state = set(), threading.Lock(), {"target": target}

    def drop(pair):
        with lock:
            pairs.discard(pair)
        for sock in pair:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def pump(src, dst, pair):
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            drop(pair)

    ready.set()
    while True:
        try:
            command, value = commands.get_nowait()
        except queue.Empty:
            command = None
        if command == "close":
            break
        if command == "switch":
            state["target"] = value
            with lock:
                current = list(pairs)
            for pair in current:
                drop(pair)
        try:
            client, _ = listener.accept()
        except (TimeoutError, socket.timeout):
            continue
        try:
            upstream = socket.create_connection(("127.0.0.1", state["target"]), timeout=5)
        except OSError:
            client.close()
            continue
        upstream.settimeout(None)
        client.settimeout(None)
        pair = (client, upstream)
        with lock:
            pairs.add(pair)
        for src, dst in (pair, pair[::-1]):
            threading.Thread(target=pump, args=(src, dst, pair), daemon=True).start()
    listener.close()
    with lock:
        current = list(pairs)
    for pair in current:
        drop(pair)


# both servers: GTID strict mode (an out-of-order or duplicate GTID is an error, not a fork) and
# every replicated transaction in the replica's own binlog (a promoted replica serves them)
PAIR_SETTINGS = {"gtid_strict_mode": "ON", "log_slave_updates": "ON", "relay_log": "relay-bin"}
LOCAL_DOMAIN = 1  # the GTID domain of the replica's own history (the primary writes domain 0)


class ReplicatedPair:
    """A MariaDB **primary A** and a **replica B** replicating from it by GTID
    (``MASTER_USE_GTID=slave_pos``), each on its own data dir (under ``base_dir``, or a temporary
    directory removed on :meth:`stop`) and free port, both with the CDC binlog settings, distinct
    ``server_id`` (1 and 2), ``log_slave_updates=ON`` and ``gtid_strict_mode=ON``; and a
    :class:`TcpProxy` — "the primary's address" — forwarding to A.

    **B's binlog is not A's.** Before replication starts B writes a history of its own in GTID
    domain 1, which A never writes (database ``replica_local``, a table, ``replica_history`` rows):
    B's file offsets for A's transactions are shifted by them, while its domain-0 history is A's,
    transaction for transaction (strict mode holds, a GTID position of A is a position on B; B's
    own fresh-install statements are wiped with ``RESET MASTER`` first so domain 0 is A's alone).

    Operations for failover tests: :meth:`wait_caught_up` (B has applied A's GTID position),
    :meth:`stop_replication` (B falls behind from here: later writes on A are what it will miss),
    :meth:`kill_primary` (SIGKILL), :meth:`promote_replica` (drain what B received, ``STOP SLAVE``,
    ``RESET SLAVE ALL``, ``read_only=OFF``), :meth:`fail_over` (kill A, promote B, the proxy to B)."""

    def __init__(self, base_dir: str | os.PathLike | None = None, replica_history: int = 3):
        import tempfile

        self._tmp = None if base_dir else tempfile.mkdtemp(prefix="mariadb-pair-")
        base = Path(base_dir or self._tmp)
        self.primary = MariaDB(base / "a", settings={**PAIR_SETTINGS, "server_id": "1"})
        self.replica = MariaDB(base / "b", settings={**PAIR_SETTINGS, "server_id": "2", "read_only": "OFF"})
        self.replica_history = replica_history
        self.proxy: TcpProxy | None = None

    # --- lifecycle ---

    def start(self) -> "ReplicatedPair":
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(2) as pool:  # two installs and start-ups side by side: ~ one server's time
            futures = [pool.submit(server.start) for server in (self.primary, self.replica)]
            errors = [f.exception() for f in futures]
        if any(errors):
            self.stop()
            raise next(e for e in errors if e)
        try:
            self._replicate()
            self.proxy = TcpProxy(self.primary.port)
            self.wait_caught_up()
        except BaseException:
            self.stop()  # no servers left running behind a failed start (a context manager's exit is not called)
            raise
        return self

    def _replicate(self) -> None:
        with self.connect(self.replica) as conn, conn.cursor() as cur:
            cur.execute("RESET MASTER")  # B's own install statements out of domain 0
            cur.execute("SET GLOBAL gtid_slave_pos = ''")  # from A's first transaction (before B's own GTIDs)
            cur.execute(f"SET SESSION gtid_domain_id = {LOCAL_DOMAIN}")
            cur.execute("CREATE DATABASE replica_local")
            cur.execute("CREATE TABLE replica_local.history (id INT PRIMARY KEY, note VARCHAR(64))")
            for i in range(self.replica_history):
                cur.execute("INSERT INTO replica_local.history VALUES (%s, %s)", (i, f"replica's own write {i}"))
            cur.execute("SET SESSION gtid_domain_id = 0")
            cur.execute("CHANGE MASTER TO MASTER_HOST = '127.0.0.1', MASTER_PORT = %s, MASTER_USER = 'root', "
                        "MASTER_PASSWORD = %s, MASTER_USE_GTID = slave_pos, MASTER_CONNECT_RETRY = 1",
                        (self.primary.port, ROOT_PASSWORD))
            cur.execute("START SLAVE")
            cur.execute("SET GLOBAL read_only = ON")

    def stop(self) -> None:
        if self.proxy is not None:
            self.proxy.close()
            self.proxy = None
        for server in (self.replica, self.primary):
            server.stop()
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # --- addresses and state ---

    @property
    def url(self) -> str:
        """The primary's address as clients know it: the proxy."""
        return f"mysql://root:{ROOT_PASSWORD}@127.0.0.1:{self.proxy.port}/"

    @staticmethod
    def connect(server: MariaDB, **kwargs) -> pymysql.connections.Connection:
        return pymysql.connect(host="127.0.0.1", port=server.port, user="root", password=ROOT_PASSWORD,
                               autocommit=True, **kwargs)

    def _one(self, server: MariaDB, statement: str, args=None):
        with self.connect(server) as conn, conn.cursor() as cur:
            cur.execute(statement, args)
            return cur.fetchone()

    def gtid_binlog_pos(self, server: MariaDB) -> str:
        return self._one(server, "SELECT @@gtid_binlog_pos")[0]

    def binlog_status(self, server: MariaDB) -> tuple[str, int]:
        file, pos = self._one(server, "SHOW BINLOG STATUS")[:2]
        return file, int(pos)

    def replica_status(self) -> dict:
        with self.connect(self.replica, cursorclass=pymysql.cursors.DictCursor) as conn, conn.cursor() as cur:
            cur.execute("SHOW SLAVE STATUS")
            return cur.fetchone() or {}

    # --- failover operations ---

    def wait_caught_up(self, timeout: float = 30) -> str:
        """Wait until B has applied everything A has written (A's ``@@gtid_binlog_pos``, by
        ``MASTER_GTID_WAIT``); returns that position."""
        position = self.gtid_binlog_pos(self.primary)
        if self._one(self.replica, "SELECT MASTER_GTID_WAIT(%s, %s)", (position, timeout))[0] != 0:
            status = self.replica_status()
            raise TimeoutError(f"replica not at {position} after {timeout}s: gtid_slave_pos "
                               f"{status.get('Gtid_Slave_Pos')}, IO {status.get('Slave_IO_Running')} "
                               f"({status.get('Last_IO_Error')}), SQL {status.get('Slave_SQL_Running')} "
                               f"({status.get('Last_SQL_Error')})")
        return position

    def stop_replication(self) -> str:
        """``STOP SLAVE``: B keeps what it has (returned: its ``gtid_slave_pos``) and misses every
        transaction written on A from now on."""
        with self.connect(self.replica) as conn, conn.cursor() as cur:
            cur.execute("STOP SLAVE")
            cur.execute("SELECT @@gtid_slave_pos")
            return cur.fetchone()[0]

    def kill_primary(self) -> None:
        self.primary.kill()

    def promote_replica(self, timeout: float = 30) -> None:
        """Apply what B has received (its relay log), then make it a primary: ``STOP SLAVE``,
        ``RESET SLAVE ALL``, ``read_only=OFF``. Its new transactions continue domain 0 as
        ``0-2-N``."""
        deadline = time.monotonic() + timeout
        while (status := self.replica_status()) and status.get("Slave_SQL_Running") == "Yes" and (
                status["Relay_Master_Log_File"], status["Exec_Master_Log_Pos"]) != (
                status["Master_Log_File"], status["Read_Master_Log_Pos"]):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the replica's SQL thread did not apply its relay log in {timeout}s")
            time.sleep(0.05)
        with self.connect(self.replica) as conn, conn.cursor() as cur:
            cur.execute("STOP SLAVE")
            cur.execute("RESET SLAVE ALL")
            cur.execute("SET GLOBAL read_only = OFF")

    def fail_over(self) -> None:
        """A dies, B is promoted and takes A's address (the proxy)."""
        self.kill_primary()
        self.promote_replica()
        self.proxy.switch(self.replica.port)


# --- several servers: a source group's shards (issue 42) ---


@contextlib.contextmanager
def group_servers(base_dir: str | os.PathLike, names, settings: dict | None = None):
    """One MariaDB per name (each its own data dir, port, binlog and ``server_id``), started side
    by side; yields ``{name: url}`` and stops them all at the end."""
    from concurrent.futures import ThreadPoolExecutor

    servers = {name: MariaDB(Path(base_dir) / name, settings={**(settings or {}), "server_id": str(11 + i)})
               for i, name in enumerate(names)}
    try:
        with ThreadPoolExecutor(len(servers)) as pool:
            for done in [pool.submit(server.start) for server in servers.values()]:
                done.result()
        yield {name: server.url for name, server in servers.items()}
    finally:
        for server in servers.values():
            server.stop()

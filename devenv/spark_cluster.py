"""A Spark standalone cluster on this machine: a LOCAL STAND-IN for a cluster on other hosts.

A master and two workers started from pyspark's own distribution (``spark-class …Master`` /
``…Worker``), separate JVMs on free ports. Worker ``b`` runs in its own network namespace
(``ip netns`` and a veth pair whose two addresses exist on this machine only), so driver ↔
executor traffic, and executor → MySQL / ClickHouse traffic, crosses a real interface as it
would between hosts; nothing reaches it over loopback. The master, worker ``a`` and the driver
use the host end of the pair, ``host_ip``. The databases listen on loopback only: ``expose``
forwards a port from ``host_ip`` to them (the executors in the namespace connect there).

Needs root (network namespaces); ``NamespaceUnavailable`` says why when they cannot be made.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import pyspark

from airflow_sync_provider.core import jvm_archive
from devenv.mariadb import free_port

SPARK_HOME = Path(pyspark.__file__).parent


class NamespaceUnavailable(RuntimeError):
    pass


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


class NetworkNamespace:
    """``ip netns`` + a veth pair: ``host_ip`` on this side, ``ns_ip`` inside (a /30 of 10.213/16)."""

    def __init__(self):
        tag = uuid.uuid4().hex[:6]
        self.name, self.host_dev, self.ns_dev = f"asp-{tag}", f"asp{tag}h", f"asp{tag}n"
        subnet = int(tag, 16) % 16000
        base = f"10.213.{subnet // 64}.{(subnet % 64) * 4}"
        prefix, last = base.rsplit(".", 1)
        self.host_ip, self.ns_ip = f"{prefix}.{int(last) + 1}", f"{prefix}.{int(last) + 2}"

    def create(self) -> "NetworkNamespace":
        if os.geteuid() != 0:
            raise NamespaceUnavailable("network namespaces need root (ip netns add)")
        if shutil.which("ip") is None:
            raise NamespaceUnavailable("the ip command (iproute2) is not installed")
        made = _ip("netns", "add", self.name, check=False)
        if made.returncode != 0:
            raise NamespaceUnavailable(f"ip netns add failed: {made.stderr.strip()}")
        try:
            _ip("link", "add", self.host_dev, "type", "veth", "peer", "name", self.ns_dev)
            _ip("link", "set", self.ns_dev, "netns", self.name)
            _ip("addr", "add", f"{self.host_ip}/30", "dev", self.host_dev)
            _ip("link", "set", self.host_dev, "up")
            for args in (("addr", "add", f"{self.ns_ip}/30", "dev", self.ns_dev), ("link", "set", self.ns_dev, "up"),
                         ("link", "set", "lo", "up")):
                _ip("netns", "exec", self.name, "ip", *args)
        except subprocess.CalledProcessError as exc:
            self.delete()
            raise NamespaceUnavailable(f"could not wire the namespace: {exc.stderr.strip()}") from exc
        return self

    def prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.name]

    def delete(self) -> None:
        _ip("link", "del", self.host_dev, check=False)
        _ip("netns", "del", self.name, check=False)


class Relay(threading.Thread):
    """Forward TCP connections from ``listen`` to ``target`` (the databases bind loopback only)."""

    def __init__(self, listen: tuple[str, int], target: tuple[str, int]):
        super().__init__(daemon=True)
        self.target = target
        self.server = socket.create_server(listen)
        self.address = self.server.getsockname()

    def run(self):
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket):
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self):
        self.server.close()


def _wait_port(host: str, port: int, timeout: float, proc: subprocess.Popen, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited early; see {log}")
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
            return
        time.sleep(0.3)
    raise TimeoutError(f"{what} did not listen on {host}:{port} within {timeout}s; see {log}")


class SparkCluster:
    """Master + worker ``a`` (this namespace) + worker ``b`` (its own namespace), 1 core each."""

    def __init__(self, base_dir: str | os.PathLike, worker_memory: str = "2g", python: str = sys.executable):
        self.base = Path(base_dir)
        self.worker_memory = worker_memory
        self.python = python
        self.netns: NetworkNamespace | None = None
        self.procs: dict[str, subprocess.Popen] = {}
        self.relays: list[Relay] = []
        self.master_port, self.master_ui = free_port(), free_port()

    @property
    def host_ip(self) -> str:
        return self.netns.host_ip

    @property
    def url(self) -> str:
        return f"spark://{self.host_ip}:{self.master_port}"

    @property
    def driver_conf(self) -> dict:
        """What a client-mode driver on this host needs: an address the executors can reach (and,
        the executors being on this host too, the host's class archive for their JVMs)."""
        conf = {"spark.driver.host": self.host_ip, "spark.driver.bindAddress": self.host_ip}
        if archive := jvm_archive.java_options():
            conf["spark.executor.extraJavaOptions"] = archive
        return conf

    def _env(self, local_ip: str) -> dict:
        # the master and workers start from the host's class archive too (core/jvm_archive.py: a
        # JVM whose classes it lacks loads those from the jars, as it would without it)
        return {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": local_ip,
                "SPARK_LOG_DIR": str(self.base / "logs"), "PYSPARK_PYTHON": self.python,
                "SPARK_DAEMON_JAVA_OPTS": jvm_archive.java_options(),
                "PATH": os.pathsep.join([os.path.dirname(self.python), os.environ.get("PATH", "")])}

    def _spawn(self, name: str, args: list[str], local_ip: str, prefix: list[str] = ()) -> subprocess.Popen:
        log = self.base / f"{name}.log"
        proc = subprocess.Popen([*prefix, str(SPARK_HOME / "bin" / "spark-class"), *args], env=self._env(local_ip),
                                stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
        self.procs[name] = proc
        return proc

    def start_worker(self, name: str) -> None:
        ip, prefix = (self.host_ip, []) if name == "a" else (self.netns.ns_ip, self.netns.prefix())
        work = self.base / f"work-{name}"
        work.mkdir(exist_ok=True)
        self._spawn(f"worker-{name}", ["org.apache.spark.deploy.worker.Worker", self.url, "--host", ip,
                                       "--cores", "1", "--memory", self.worker_memory, "--work-dir", str(work),
                                       "--webui-port", str(free_port())], ip, prefix)

    def start(self, timeout: float = 90) -> "SparkCluster":
        self.base.mkdir(parents=True, exist_ok=True)
        self.netns = NetworkNamespace().create()
        try:
            master = self._spawn("master", ["org.apache.spark.deploy.master.Master", "--host", self.host_ip,
                                            "--port", str(self.master_port), "--webui-port", str(self.master_ui)],
                                 self.host_ip)
            _wait_port(self.host_ip, self.master_port, timeout, master, "the Spark master", self.base / "master.log")
            for name in ("a", "b"):
                self.start_worker(name)
            self.wait_for_workers(2, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def workers(self) -> list[dict]:
        with urllib.request.urlopen(f"http://{self.host_ip}:{self.master_ui}/json/", timeout=5) as page:
            return [w for w in json.load(page).get("workers", []) if w.get("state") == "ALIVE"]

    def wait_for_workers(self, count: int, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                if len(self.workers()) >= count:
                    return
            time.sleep(0.5)
        raise TimeoutError(f"{count} Spark workers did not register within {timeout}s; see {self.base}/worker-*.log")

    def expose(self, port: int) -> int:
        """Forward ``host_ip:<free port>`` to ``127.0.0.1:port``; returns the forwarded port."""
        relay = Relay((self.host_ip, 0), ("127.0.0.1", port))
        relay.start()
        self.relays.append(relay)
        return relay.address[1]

    def kill_worker(self, name: str) -> None:
        """SIGKILL a worker and the executors it started (one process group), as a host dies."""
        proc = self.procs.pop(f"worker-{name}")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def stop(self) -> None:
        for _name, proc in list(self.procs.items()):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.procs.clear()
        for relay in self.relays:
            relay.close()
        self.relays.clear()
        if self.netns is not None:
            self.netns.delete()
            self.netns = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

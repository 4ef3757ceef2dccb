"""The guard of a job's process: the job ends when the process that submitted it is gone, or when
a server it works on has not answered for longer than the job's bound (core/failures.py).

Why a guard: a driver whose submitter died (an Airflow worker killed, the command line's terminal
closed, ``on_kill`` after a timeout) would otherwise run on as an orphan, holding its load's lock
so that the retry cannot start, and writing beside it once the lock is gone. A driver blocked on a
frozen server (a stopped process, a dropped network) gets no error to act on: a ping, on a clock
of its own, finds that out.

Who submitted: :func:`submitter_env` names the submitting process (pid and start time, so a
reused pid is not mistaken for it) in the driver's environment; spark-submit in client mode
passes it on to the Python driver it starts. A driver also ends when its parent changes (the
spark-submit that started it was killed). A driver in cluster mode has neither: it is the
cluster's to stop.

Ending: the job's failure is reported (``on_end``), every process the job started is killed
(reader processes, the fork server, a Spark gateway JVM) and the process exits at once
(``os._exit``: threads blocked on a socket would hold an orderly exit).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import Callable

import psutil

from airflow_sync_provider.core.clickhouse.client import client
from airflow_sync_provider.core.failures import GRACE_SECONDS

log = logging.getLogger(__name__)

SUBMITTER_ENV = "AIRFLOW_SYNC_SUBMITTER"  # "pid:start time" of the process that submitted the job
ENDED_EXIT = 75  # the driver's exit code when its guard ended it (EX_TEMPFAIL: a retry resumes)
LOOK_SECONDS = 0.5  # how often the submitter is looked at
PING_SECONDS = 2.0  # how often each server is pinged
PING_TIMEOUT = 3.0


def submitter_env() -> dict[str, str]:
    """The environment entry naming this process as a job's submitter."""
    return {SUBMITTER_ENV: f"{os.getpid()}:{psutil.Process().create_time():.3f}"}


def submitter_alive(value: str) -> bool:
    """Is the process named by a :data:`SUBMITTER_ENV` value still running?"""
    try:
        pid, started = value.split(":")
        return abs(psutil.Process(int(pid)).create_time() - float(started)) < 0.01
    except (ValueError, psutil.Error):
        return False


def target_answers(ch) -> None:
    """Raise unless ClickHouse answers ``/ping`` (served without running a query)."""
    if not ch.ping(timeout=PING_TIMEOUT):
        raise ConnectionError("ClickHouse did not answer /ping")


class TargetPing:
    """ClickHouse's liveness, on a client of its own (made when first asked: the server may be
    down when the job starts)."""

    def __init__(self, endpoint):
        self.endpoint, self.ch = endpoint, None

    def __call__(self) -> None:
        if self.ch is None:
            self.ch = client(self.endpoint, connect_timeout=PING_TIMEOUT, send_receive_timeout=PING_TIMEOUT,
                             autogenerate_session_id=False)
        target_answers(self.ch)


class SourcePing:
    """A MySQL server's liveness on one connection of its own (reopened when lost): any answer
    counts, an error the server answers with too (too many connections is a server that lives)."""

    def __init__(self, endpoint):
        self.endpoint, self.conn = endpoint, None

    def __call__(self) -> None:
        try:
            if self.conn is None:
                self.conn = self.endpoint.connect(connect_timeout=PING_TIMEOUT, read_timeout=PING_TIMEOUT,
                                                  write_timeout=PING_TIMEOUT)
            self.conn.ping(reconnect=False)
        except Exception as exc:
            self.close()
            code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
            if code is not None and 1000 <= code < 2000:  # the server's own error: it is alive
                return
            raise

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:  # noqa: BLE001 - a broken connection closes anyway
                pass
            self.conn = None


def job_probes(spec) -> dict[str, Callable[[], None]]:
    """A ping for every server ``spec``'s job works on, by its name in messages."""
    probes: dict[str, Callable[[], None]] = {f"ClickHouse {spec.target.host}:{spec.target.port}":
                                             TargetPing(spec.target)}
    for endpoint in (s.endpoint for s in spec.sources):
        probes.setdefault(f"MySQL {endpoint.host}:{endpoint.port}", SourcePing(endpoint))
    return probes


def descendants(pid: int) -> list:
    """The processes ``pid`` started, and theirs (psutil processes)."""
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def end_processes(procs: list) -> None:
    for proc in procs:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=5)


def end_tree(pid: int, itself: bool = True) -> None:
    """Kill process ``pid`` (unless not ``itself``) and every process it started, and theirs;
    the descendants are found first, so none escapes to a new parent."""
    procs = descendants(pid)
    if itself:
        try:
            procs.append(psutil.Process(pid))
        except psutil.Error:
            pass
    end_processes(procs)


def end_children() -> None:
    """Kill every process this one started, and theirs."""
    end_tree(os.getpid(), itself=False)


class Guard(threading.Thread):
    """Watches the submitter (every :data:`LOOK_SECONDS`) and the servers (``probes``: a name →
    a callable that raises unless the server answers, every :data:`PING_SECONDS`); ends the job
    (``on_end(reason)``, then :func:`end_children` and ``os._exit``) when the submitter is gone or
    a server has not answered for ``bound`` + :data:`GRACE_SECONDS` seconds (the job's own waits
    give up at ``bound``: the grace is its time to record what it can and exit by itself)."""

    def __init__(self, bound: float, probes: dict[str, Callable[[], None]], on_end: Callable[[str], None]):
        super().__init__(name="job guard", daemon=True)
        self.bound, self.probes, self.on_end = bound, probes, on_end
        self.parent = os.getppid()
        self.submitter = os.environ.get(SUBMITTER_ENV, "")
        self.answered = {name: time.monotonic() for name in probes}  # server -> its last answer
        self.stopped = threading.Event()

    def run(self) -> None:
        pinged = 0.0
        while not self.stopped.wait(LOOK_SECONDS):
            gone = self._submitter_gone()
            if gone:
                self.end(f"{gone}: the job stops (no job runs without the process that submitted it). A retry "
                         "resumes where it stopped")
                return
            if time.monotonic() - pinged >= PING_SECONDS:
                pinged = time.monotonic()
                silent = self._ping()
                if silent:
                    self.end(silent)
                    return

    def _submitter_gone(self) -> str:
        if os.getppid() != self.parent:
            return f"the process that started this job's driver (pid {self.parent}) has ended"
        if self.submitter and not submitter_alive(self.submitter):
            return f"the process that submitted this job (pid {self.submitter.split(':')[0]}) has ended"
        return ""

    def _ping(self) -> str:
        for name, probe in self.probes.items():
            try:
                probe()
            except Exception as exc:  # noqa: BLE001 - any failure is silence
                quiet = time.monotonic() - self.answered[name]
                if quiet > self.bound + GRACE_SECONDS:
                    return (f"{name} has not answered for {quiet:.0f} s ({type(exc).__name__}: {str(exc)[:200]}); "
                            f"the job is ended (failure_wait_seconds={self.bound:g}). A retry resumes where it "
                            "stopped once the server is back")
                continue
            self.answered[name] = time.monotonic()
        return ""

    def end(self, reason: str) -> None:
        log.error(reason)
        try:
            self.on_end(reason)
        finally:
            end_children()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(ENDED_EXIT)

    def stop(self) -> None:
        self.stopped.set()
        self.join(timeout=PING_TIMEOUT * 2)

"""Which failures a retry can cure, and the one bounded wait a job spends on an unreachable server.

**The policy** (:func:`classify`): every job, the operators and the sensors ask it what an error
means. *Transient*: the server is down, restarting, overloaded or briefly refusing work (a
connection refused or reset, a timeout, HTTP 5xx, ``TOO_MANY_PARTS``, ``MEMORY_LIMIT_EXCEEDED``,
a MySQL server gone away, too many connections, a lock wait or statement timeout, a server that
went ``read_only`` in a failover): retried with backoff inside the bound, and worth an Airflow
retry after it. *Permanent*: the same call fails the same way until a person changes something
(access denied, a read-only user, an unknown table, a type error, a refused TLS handshake): the
job fails at once and its message says what to change; the operator tells Airflow not to retry.
Anything else is *unknown*: it fails the job, and Airflow's retries apply as configured.

**The bound** (:class:`Outage`): one clock per job, not one per shard or per write. It starts
at a server's first transient failure and stops when work on that server succeeds again; while it
runs, channels take no new shard and wait for the server to answer (a ping), then try again; no
wait goes past ``seconds`` after the clock started. Past it every wait gives up at once, and the
job fails with :class:`ServerUnreachable`, which names the server, what failed and that a retry
resumes. A process still stuck after that (a frozen server never answers a blocked read) is ended
by its guard (core/guard.py), which watches the servers' liveness on a clock of its own.
"""

from __future__ import annotations

import errno
import logging
import re
import threading
import time
from dataclasses import dataclass
from typing import Callable

log = logging.getLogger(__name__)

WAIT_SECONDS = 40.0  # the default bound: a job fails within a minute of a server's death (frozen: + the grace)
GRACE_SECONDS = 10.0  # the guard's allowance past it for a job to record what it can and exit

TARGET, SOURCE = "ClickHouse", "MySQL"

# ClickHouse error codes (src/Common/ErrorCodes.cpp) whose cause passes by itself
CLICKHOUSE_TRANSIENT = {
    3: "UNEXPECTED_END_OF_FILE", 32: "ATTEMPT_TO_READ_AFTER_EOF", 159: "TIMEOUT_EXCEEDED",
    202: "TOO_MANY_SIMULTANEOUS_QUERIES", 209: "SOCKET_TIMEOUT", 210: "NETWORK_ERROR",
    236: "ABORTED", 241: "MEMORY_LIMIT_EXCEEDED", 242: "TABLE_IS_READ_ONLY", 243: "NOT_ENOUGH_SPACE",
    252: "TOO_MANY_PARTS", 319: "UNKNOWN_STATUS_OF_INSERT", 394: "QUERY_WAS_CANCELLED", 425: "SYSTEM_ERROR",
    999: "KEEPER_EXCEPTION", 1000: "POCO_EXCEPTION",
}
# ... and those a person must act on, with what to do
CLICKHOUSE_PERMANENT = {
    497: ("ACCESS_DENIED", "grant the target user what the job needs (docs/grants.md): CREATE, INSERT, SELECT, "
                           "ALTER, DROP on the target and ledger databases"),
    164: ("READONLY", "the target user's profile has readonly=1: connect as a user that may write"),
    516: ("AUTHENTICATION_FAILED", "fix the ClickHouse connection's user or password"),
    60: ("UNKNOWN_TABLE", "a table the job needs is missing (dropped by hand?): run the full load again"),
    81: ("UNKNOWN_DATABASE", "create the database or fix the target database's name"),
    47: ("UNKNOWN_IDENTIFIER", "the copy's columns differ from what the job expects: reload the table in full"),
    16: ("NO_SUCH_COLUMN_IN_TABLE", "the copy's columns differ from what the job expects: reload the table in full"),
    53: ("TYPE_MISMATCH", "a value does not fit the copy's column type: reload the table in full"),
    70: ("CANNOT_CONVERT_TYPE", "a value does not fit the copy's column type: reload the table in full"),
    62: ("SYNTAX_ERROR", "the server refuses the statement (an older ClickHouse?): see docs/troubleshooting.md"),
    115: ("UNKNOWN_SETTING", "the server does not know a setting the job uses (an older ClickHouse?)"),
}
# MySQL / MariaDB error codes (client and server) whose cause passes by itself
MYSQL_TRANSIENT = {
    2002: "can't connect (socket)", 2003: "can't connect", 2005: "unknown host", 2006: "server has gone away",
    2013: "lost connection during query", 2055: "lost connection", 1040: "too many connections",
    1203: "max_user_connections reached", 1205: "lock wait timeout", 1213: "deadlock", 1053: "server shutdown",
    1317: "query interrupted", 1927: "connection killed", 3024: "max_execution_time exceeded",
    1969: "max_statement_time exceeded", 1290: "the server is read_only (a failover?)",
    1836: "the server is read_only (a failover?)", 4031: "disconnected by the server (idle)",
    1159: "network read timeout", 1161: "network write timeout",
}
MYSQL_PERMANENT = {
    1045: ("access denied", "fix the MySQL connection's user, password or TLS settings (docs/connections.md)"),
    1044: ("access denied to the database", "grant SELECT on the source databases (docs/grants.md)"),
    1142: ("command denied", "grant the reader what docs/grants.md lists"),
    1143: ("column access denied", "grant SELECT on the whole table (docs/grants.md)"),
    1227: ("a privilege is missing", "grant REPLICATION SLAVE, REPLICATION CLIENT / BINLOG MONITOR (docs/grants.md)"),
    1146: ("no such table", "the source table is missing: fix the table's name or the selection"),
    1049: ("unknown database", "fix the source database's name"),
    1054: ("unknown column", "a column the job names is missing at the source: fix columns / split_column"),
    3159: ("TLS required", "connect with ssl_mode=REQUIRED or stronger (docs/connections.md)"),
}
# words of errors that carry no code (connectorx's, the socket's, urllib3's)
_TRANSIENT_TEXT = ("connection refused", "connection reset", "broken pipe", "timed out", "timeout",
                   "lost connection", "server has gone away", "can't connect", "cannot connect", "unexpected eof",
                   "connection aborted", "connection closed", "remote end closed", "network is unreachable",
                   "no route to host", "temporarily unavailable", "max retries exceeded", "eof occurred",
                   "newconnectionerror", "protocolerror", "failed to establish", "connection was killed",
                   "too many connections", "server shutdown", "errno 111", "os error 111", "os error 104")
_HTTP_STATUS = re.compile(r"HTTP status (\d{3})")
_CODE = re.compile(r"\bCode:\s*(\d+)")
_TRANSIENT_ERRNOS = {errno.ECONNREFUSED, errno.ECONNRESET, errno.ECONNABORTED, errno.EPIPE, errno.ETIMEDOUT,
                     errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EAGAIN}


@dataclass(frozen=True)
class Failure:
    """What an error means: ``transient`` True (a retry may cure it), False (it will not), None
    (not known); the ``side`` it came from (``ClickHouse`` / ``MySQL`` / ""), its ``cause`` in a
    few words and, when permanent, the ``remedy``."""

    transient: bool | None
    side: str = ""
    cause: str = ""
    remedy: str = ""

    @property
    def retry_helps(self) -> bool:
        return self.transient is not False

    def advice(self) -> str:
        """The sentence a failed task's message ends with."""
        if self.transient:
            return "A retry may help: it resumes where this run stopped"
        if self.transient is False:
            return f"A retry will not help: {self.remedy or 'fix the cause first'}"
        return ""


def classify(exc: BaseException) -> Failure:
    """The :class:`Failure` ``exc`` is, from the first error in its chain (``__cause__``,
    ``__context__``) that says: an exception's own ``retry_helps`` (the jobs' errors), a
    ClickHouse error code or HTTP status, a MySQL error code, a socket error, known words."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        found = _one(current)
        if found is not None:
            return found
        current = current.__cause__ or current.__context__
    return Failure(None, cause=type(exc).__name__)


def _one(exc: BaseException) -> Failure | None:
    if isinstance(getattr(exc, "failure", None), Failure):  # a job's error that knows its cause's class
        return exc.failure
    helps = getattr(exc, "retry_helps", None)
    if isinstance(helps, bool):  # the jobs' own errors say whether a retry helps
        return Failure(helps, getattr(exc, "side", ""), str(exc)[:200], "" if helps else "see the message above")
    module = type(exc).__module__ or ""
    if module.startswith("clickhouse_connect"):
        return _clickhouse(exc)
    if module.startswith(("pymysql", "MySQLdb")):
        return _mysql(exc)
    if module.startswith("urllib3"):  # only the ClickHouse client speaks HTTP
        return Failure(True, TARGET, _transport_cause(exc))
    if isinstance(exc, (ConnectionError, TimeoutError)) or (
            isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS):
        return Failure(True, "", _short(exc))
    if type(exc) is RuntimeError and "DriverError" in str(exc):  # connectorx (MySQL only) says it so
        text = str(exc).lower()
        return Failure(True if any(w in text for w in _TRANSIENT_TEXT) else None, SOURCE, _short(exc))
    return None


def _clickhouse(exc: BaseException) -> Failure | None:
    code = getattr(exc, "code", None)
    text = str(exc)
    if code is None and (match := _CODE.search(text)):
        code = int(match.group(1))
    if code in CLICKHOUSE_TRANSIENT:
        return Failure(True, TARGET, f"{CLICKHOUSE_TRANSIENT[code]} ({code})")
    if code in CLICKHOUSE_PERMANENT:
        name, remedy = CLICKHOUSE_PERMANENT[code]
        return Failure(False, TARGET, f"{name} ({code})", remedy)
    status = _HTTP_STATUS.search(text)
    if status and 500 <= int(status.group(1)) < 600:
        return Failure(True, TARGET, f"HTTP {status.group(1)}")
    if code is None and type(exc).__name__ == "OperationalError":  # the transport: refused, reset, timed out
        return Failure(True, TARGET, _transport_cause(exc))
    if code is not None:  # an error the server answered with and nothing says is passing
        return Failure(None, TARGET, f"code {code}")
    return None


def _transport_cause(exc: BaseException) -> str:
    text = " ".join(str(e) for e in (exc, exc.__cause__, exc.__context__) if e is not None).lower()
    for words, cause in (("refused", "connection refused"), ("reset", "connection reset"), ("timed out", "timed out"),
                         ("timeout", "timed out"), ("remote end closed", "connection closed"),
                         ("broken pipe", "broken pipe")):
        if words in text:
            return cause
    return "the connection failed"


def _mysql(exc: BaseException) -> Failure | None:
    code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
    if code in MYSQL_TRANSIENT:
        return Failure(True, SOURCE, f"{MYSQL_TRANSIENT[code]} ({code})")
    if code in MYSQL_PERMANENT:
        cause, remedy = MYSQL_PERMANENT[code]
        return Failure(False, SOURCE, f"{cause} ({code})", remedy)
    if code is None and any(w in str(exc).lower() for w in _TRANSIENT_TEXT):
        return Failure(True, SOURCE, _short(exc))
    return None


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:160]}"


def sensor_verdict(check: Callable[[], tuple[str, str, dict]]) -> tuple[str, str, dict]:
    """A sensor's check under the policy: a passing failure (the ledger's server restarting) is
    ``wait`` and the sensor looks again at its next poke; a permanent one is ``failed``, saying
    what to change; an unknown one is raised (the sensor's retries apply)."""
    try:
        return check()
    except Exception as exc:
        failure = classify(exc)
        if failure.transient:
            return "wait", (f"{failure.side or 'a server'} did not answer the check ({failure.cause}); looking "
                            "again at the next poke"), {}
        if failure.transient is False:
            return "failed", f"{type(exc).__name__}: {exc}. {failure.advice()}", {}
        raise


def common(failures: list[Failure]) -> Failure | None:
    """What several failures (a load's failed shards) mean together: the class they share, or
    None when they differ or one is not known."""
    kinds = {(f.transient, f.side, f.remedy) for f in failures}
    if len(kinds) != 1 or None in {f.transient for f in failures}:
        return None
    first = failures[0]
    return Failure(first.transient, first.side, "; ".join(sorted({f.cause for f in failures}))[:300], first.remedy)


class ServerUnreachable(RuntimeError):
    """A server did not answer for the whole bound: the job stops (a retry resumes it)."""

    retry_helps = True

    def __init__(self, message: str, side: str = ""):
        super().__init__(message)
        self.side = side


class Outage:
    """The job's one bounded wait (see the module's docstring); thread-safe, shared by the
    job's threads. ``servers``: a name per side for messages (``ClickHouse host:port``)."""

    def __init__(self, seconds: float = WAIT_SECONDS, servers: dict[str, str] | None = None,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep):
        self.seconds = seconds
        self.servers = dict(servers or {})
        self.clock, self.sleep = clock, sleep
        self.down: dict[str, tuple[float, str]] = {}  # side -> (since, the first failure's cause)
        self._lock = threading.Lock()

    def __getstate__(self):  # a Spark task gets its own copy (with its channels' waits)
        return {k: v for k, v in vars(self).items() if k not in ("_lock", "clock", "sleep")}

    def __setstate__(self, state):
        self.__dict__.update(state, _lock=threading.Lock(), clock=time.monotonic, sleep=time.sleep)

    def name(self, side: str) -> str:
        return self.servers.get(side) or side or "a server"

    # --- the clock ----------------------------------------------------------------------------

    def failed(self, exc: BaseException, side: str = "") -> Failure:
        """Note ``exc``; a transient failure starts its side's clock (if not running)."""
        failure = classify(exc)
        if failure.transient:
            side = failure.side or side
            with self._lock:
                if side not in self.down:
                    self.down[side] = (self.clock(), failure.cause)
                    log.info(f"{self.name(side)} is unreachable ({failure.cause}); waiting up to "
                             f"{self.seconds:.0f} s for it, no new shard is started meanwhile")
        return failure

    def answered(self, side: str) -> None:
        """``side`` answered: its clock stops."""
        if side in self.down:
            with self._lock:
                since = self.down.pop(side, None)
            if since is not None:
                log.info(f"{self.name(side)} answers again after {self.clock() - since[0]:.1f} s")

    def waited(self) -> float:
        """How long the longest running outage has lasted (0: every server answers)."""
        with self._lock:
            return max((self.clock() - since for since, _ in self.down.values()), default=0.0)

    @property
    def expired(self) -> bool:
        return self.waited() > self.seconds

    def unreachable(self, what: str) -> ServerUnreachable:
        with self._lock:
            down = dict(self.down)
        side, (since, cause) = max(down.items(), key=lambda kv: self.clock() - kv[1][0]) if down else (
            "", (self.clock(), "no answer"))
        doing = f" while {what}" if what else ""
        return ServerUnreachable(f"{self.name(side)} has failed the job's work for {self.clock() - since:.0f} s "
                                 f"({cause}){doing}; the job stops after one bounded wait (failure_wait_seconds="
                                 f"{self.seconds:g}). A retry resumes where it stopped once the server is back", side)

    # --- waits ----------------------------------------------------------------------------------

    def call(self, action: Callable, what: str, side: str = TARGET):
        """``action()``, retried with backoff while its failure is transient and the bound holds;
        a permanent failure, or one past the bound, is raised at once."""
        delay = 0.5
        while True:
            try:
                result = action()
            except Exception as exc:
                failure = self.failed(exc, side)
                if not failure.transient:
                    raise
                if self.expired:
                    raise self.unreachable(what) from exc
                self.sleep(min(delay, max(0.05, self.seconds - self.waited())))
                delay = min(delay * 2, 5.0)
                continue
            self.answered(side)
            return result

    def wait_until_up(self, probes: dict[str, Callable[[], None]]) -> bool:
        """While a side is down, ask its probe (in ``probes``, by side; a failure of no known
        side: every probe) until it answers: True once every side is up, False when the bound
        passed first. A probe's answer does not stop the clock: only work that succeeds does
        (a server that answers pings but refuses inserts, TOO_MANY_PARTS, is still failing)."""
        delay = 0.5
        while self.down:
            if self.expired:
                return False
            for side in list(self.down):
                asked = [probes[side]] if side in probes else list(probes.values()) if not side else []
                try:
                    for probe in asked:  # nothing to ask: a later call finds out
                        probe()
                except Exception:
                    continue
                return True
            if self.down:
                self.sleep(min(delay, max(0.05, self.seconds - self.waited())))
                delay = min(delay * 2, 3.0)
        return True

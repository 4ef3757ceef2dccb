"""A ClickHouse-HTTP endpoint over chDB: a LOCAL STAND-IN for tests and the demo.

Production targets a ClickHouse server; this adapter only exists because Debian's
`clickhouse-server` (18.16) is too old for clickhouse-connect and nothing else can be
downloaded here. It serves the subset of the HTTP interface that clickhouse-connect uses:

* the statement in the ``query`` URL parameter and/or at the start of the body (the two
  are concatenated, as ClickHouse does); ``INSERT … FORMAT X`` followed by data is streamed
  into chDB's inserter;
* chunked request bodies; ``Content-Encoding`` lz4 / zstd / gzip where the body is a
  *sequence* of compressed frames (clickhouse-connect compresses each block separately);
* ``database``, ``default_format``, ``param_*`` (server-side parameters) and settings
  URL parameters, the query and ``param_*`` also as ``multipart/form-data`` fields (what
  clickhouse-connect sends when they would make the URL too long); compressed responses when
  ``enable_http_compression=1``;
* sessions (``session_id``, ``session_timeout``, ``session_check``): a ``SET`` or ``USE``
  statement lasts for the rest of its session, and without a session for its own request only,
  so one client's ``SET`` never changes another client's queries;
* the ``X-ClickHouse-Format/-Timezone/-Summary/-Query-Id`` response headers;
* errors as HTTP 500 with a ``Code: N. DB::Exception: …`` body.

A test hook, not ClickHouse's: ``POST /_faults`` with a JSON rule ``{"pattern": REGEX, "code": N,
"times": K}`` makes the next K statements matching REGEX (case-insensitive, searched in the
statement text) fail with error code N as ClickHouse would answer it (``"after": M`` lets the
first M matches pass); ``"status": 503`` without a
code answers a bare HTTP status (a proxy in front of a restarting server), ``"reset": true``
closes the connection without an answer, ``"kill": true`` SIGKILLs this process right there (a
server dying at a chosen point of a job). ``DELETE /_faults`` clears every rule; ``GET /_faults``
lists them with the hits left. Tests inject each class of failure this way (tests/test_faults.py).

chDB opens a data path in one process only, so every client goes through this one
process; statements run one at a time under a lock (chDB's session is not re-entrant).

With ``--tls-cert/--tls-key`` it serves HTTPS instead (a ClickHouse ``https_port``), and with
``--tls-client-ca`` it also demands a client certificate signed by that CA (mutual TLS).

Run: ``python -m devenv.clickhouse_http --path DIR [--port 0] [--port-file FILE] [--tls-cert F --tls-key F]``.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import re
import signal
import ssl
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit

import lz4.frame
import zstandard
from chdb import session as chdb_session

# URL parameters that belong to the HTTP transport, not to the query engine.
_TRANSPORT_PARAMS = {
    "query", "database", "default_format", "user", "password", "query_id", "session_id",
    "session_timeout", "session_check", "compress", "decompress", "buffer_size",
    "wait_end_of_query", "client_protocol_version", "role", "quota_key", "stacktrace",
    "close_session", "enable_http_compression", "send_progress_in_http_headers",
    "http_headers_progress_interval_ms", "http_response_buffer_size",
}
_INSERT_WITH_DATA = re.compile(
    rb"^\s*(INSERT\s+INTO\s+.+?)\s+FORMAT\s+([A-Za-z0-9_]+)[ \t]*(?:\r?\n)?", re.I | re.S
)
_FORMAT_CLAUSE = re.compile(r"\bFORMAT\s+([A-Za-z0-9_]+)\s*;?\s*$", re.I)
_ERROR_CODE = re.compile(r"Code:\s*(\d+)")
_SESSION_STATEMENT = re.compile(r"^\s*(SET|USE)\b", re.I)
DEFAULT_SESSION_TIMEOUT = 60  # seconds, ClickHouse's default_session_timeout
MAX_SESSION_TIMEOUT = 3600  # ClickHouse's max_session_timeout


def decompress_frames(encoding: str, data: bytes) -> bytes:
    """Decode a body that may be several concatenated compressed frames."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return data
    if encoding == "gzip":
        return gzip.decompress(data)  # handles multi-member bodies
    if encoding == "zstd":
        reader = zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True)
        return reader.read()
    if encoding == "lz4":
        out, rest = [], data
        while rest:
            decoder = lz4.frame.LZ4FrameDecompressor()
            out.append(decoder.decompress(rest))
            if not decoder.eof:
                raise ValueError("truncated lz4 frame in request body")
            rest = decoder.unused_data
        return b"".join(out)
    raise ValueError(f"unsupported Content-Encoding {encoding!r}")


def compress_body(encoding: str, data: bytes) -> bytes:
    if encoding == "lz4":
        return lz4.frame.compress(data)
    if encoding == "zstd":
        return zstandard.ZstdCompressor().compress(data)
    return gzip.compress(data, compresslevel=1)


class HttpSession:
    """What a ClickHouse HTTP session keeps between requests: settings and current database."""

    def __init__(self, timeout: float):
        self.settings: dict[str, str] = {}
        self.database: str | None = None
        self.timeout = timeout
        self.expires = time.monotonic() + timeout


class ChdbEngine:
    """One chDB session shared by all requests, used one statement at a time.

    Each request starts from the same baseline: its session's and URL's settings and database
    are applied before the statement and undone after it, including whatever a ``SET`` / ``USE``
    statement changed (which its HTTP session, if any, keeps for its later requests).
    """

    def __init__(self, path: str):
        self.session = chdb_session.Session(path)
        self.lock = threading.Lock()
        self.timezone = bytes(self.session.query("SELECT timezone()", "TSVRaw").bytes()).decode().strip()
        self.baseline = self._changed_settings()  # chDB's own non-default settings
        self.http_sessions: dict[str, HttpSession] = {}

    def _changed_settings(self) -> dict[str, str]:
        result = self.session.query("SELECT name, value FROM system.settings WHERE changed", "JSONCompact")
        rows = json.loads(bytes(result.bytes()))["data"]
        return {name: value for name, value in rows if name != "database"}  # USE is tracked apart

    def _http_session(self, session_id: str | None, timeout: str | None, check: bool) -> HttpSession | None:
        now = time.monotonic()
        for key in [k for k, v in self.http_sessions.items() if v.expires < now]:
            del self.http_sessions[key]
        if not session_id:
            return None
        session = self.http_sessions.get(session_id)
        if session is None:
            if check:
                raise LookupError(f"Code: 372. DB::Exception: Session {session_id} not found. (SESSION_NOT_FOUND)")
            seconds = float(timeout) if timeout else DEFAULT_SESSION_TIMEOUT
            if not 0 < seconds <= MAX_SESSION_TIMEOUT:
                raise ValueError(f"Code: 69. DB::Exception: Session timeout {timeout} is out of range "
                                 f"(0, {MAX_SESSION_TIMEOUT}]. (ARGUMENT_OUT_OF_BOUND)")
            session = self.http_sessions[session_id] = HttpSession(seconds)
        elif timeout:
            session.timeout = min(float(timeout), MAX_SESSION_TIMEOUT)
        session.expires = now + session.timeout
        return session

    def _prepare(self, database: str | None, settings: dict[str, str], session: HttpSession | None) -> list[str]:
        database = database or (session.database if session else None)
        if database:
            self.session.query(f"USE `{database.replace('`', '``')}`")
        settings = {**session.settings, **settings} if session else settings
        applied = []
        for name, value in settings.items():
            if not re.fullmatch(r"[A-Za-z0-9_]+", name):
                raise ValueError(f"Code: 115. DB::Exception: Unknown setting {name!r}")
            applied.append(name)  # reset even if the SET fails half-way
            self.session.query(f"SET {name} = '{_escape(value)}'")
        return applied

    def _restore(self, names) -> None:
        for name in names:
            if name in self.baseline:
                self.session.query(f"SET {name} = '{_escape(self.baseline[name])}'")
            else:
                self.session.query(f"SET {name} = DEFAULT")
        self.session.query("USE default")

    def _statement(self, sql: str, fmt: str, params: dict, session: HttpSession | None, applied: list[str]):
        """Run one statement; a SET or USE is recorded in ``session`` and marked for undoing."""
        if not _SESSION_STATEMENT.match(sql):
            return self.session.query(sql, fmt, params=params or None)
        before = self._changed_settings()
        result = self.session.query(sql, fmt, params=params or None)
        after = self._changed_settings()
        changed = {name for name in before.keys() | after.keys() if before.get(name) != after.get(name)}
        applied.extend(changed - set(applied))
        if session is not None:
            for name in changed:
                if name in after:
                    session.settings[name] = after[name]
                else:
                    session.settings.pop(name, None)
            if sql.lstrip()[:3].upper() == "USE":
                current = self.session.query("SELECT currentDatabase()", "TSVRaw")
                session.database = bytes(current.bytes()).decode().strip()
        return result

    @contextlib.contextmanager
    def _request(self, database, settings, session_id, session_timeout, session_check):
        """Serialise a request and undo everything it applied to the shared chDB session."""
        with self.lock:
            session = self._http_session(session_id, session_timeout, session_check)
            applied: list[str] = []
            try:
                applied += self._prepare(database, settings, session)
                yield session, applied
            finally:
                self._restore(applied)

    def run(self, sql: str, fmt: str, params: dict, database: str | None, settings: dict,
            session_id: str | None = None, session_timeout: str | None = None, session_check: bool = False):
        with self._request(database, settings, session_id, session_timeout, session_check) as (session, applied):
            with _timed(sql):
                result = self._statement(sql, fmt, params, session, applied)
            return bytes(result.bytes()), {
                "read_rows": result.rows_read(), "read_bytes": result.bytes_read(),
                "written_rows": result.rows_written(), "written_bytes": result.bytes_written(),
            }

    def insert(self, statement: str, fmt: str, data: bytes, database: str | None, settings: dict,
               session_id: str | None = None, session_timeout: str | None = None, session_check: bool = False):
        with self._request(database, settings, session_id, session_timeout, session_check):
            with _timed(statement), self.session.send_insert(statement, fmt) as inserter:
                if data:
                    inserter.append(data)
                result = inserter.finish()
            rows = getattr(result, "rows_written", 0)
            return {"read_rows": 0, "read_bytes": 0, "written_rows": rows, "written_bytes": len(data)}


@contextlib.contextmanager
def _timed(sql: str):
    """``$CHDB_HTTP_TIMING`` (a file path): a line per statement — when it ended, its seconds, the
    process's CPU-seconds meanwhile (background merges included) and its start — to see where a
    job's time on the target goes (bench/)."""
    path = os.environ.get("CHDB_HTTP_TIMING")
    if not path:
        yield
        return
    started, cpu = time.perf_counter(), time.process_time()
    try:
        yield
    finally:
        with open(path, "a") as out:
            out.write(f"{time.time():.3f}\t{time.perf_counter() - started:.4f}\t{time.process_time() - cpu:.4f}\t"
                      f"{' '.join(sql.split())[:110]}\n")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


class Faults:
    """The test hook's rules (see the module's docstring)."""

    def __init__(self):
        self.rules: list[dict] = []
        self.lock = threading.Lock()

    def add(self, rule: dict) -> None:
        re.compile(rule["pattern"])  # a bad pattern is refused when given
        with self.lock:
            self.rules.append({"times": 1, **rule})

    def clear(self) -> None:
        with self.lock:
            self.rules.clear()

    def take(self, statement: str) -> dict | None:
        """The first rule with hits left whose pattern ``statement`` matches (one hit used; a
        rule's ``after`` lets that many matches pass first)."""
        with self.lock:
            for rule in self.rules:
                if rule["times"] > 0 and re.search(rule["pattern"], statement, re.I | re.S):
                    if rule.get("after", 0) > 0:
                        rule["after"] -= 1
                        return None
                    rule["times"] -= 1
                    return rule
        return None


_ERROR_NAMES = {252: "TOO_MANY_PARTS", 241: "MEMORY_LIMIT_EXCEEDED", 159: "TIMEOUT_EXCEEDED",
                242: "TABLE_IS_READ_ONLY", 243: "NOT_ENOUGH_SPACE", 497: "ACCESS_DENIED", 164: "READONLY",
                60: "UNKNOWN_TABLE", 53: "TYPE_MISMATCH"}


class InjectedFault(Exception):
    pass


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "chdb-http-standin"
    # headers and body go out in two writes: with Nagle's algorithm the body would wait for the
    # client's delayed ACK (40 ms on Linux) on every response that has one; ClickHouse has no such stall
    disable_nagle_algorithm = True
    engine: ChdbEngine  # set on the class by serve()
    faults = Faults()

    def log_message(self, format, *args):  # noqa: A002 - signature fixed by the base class
        if os.environ.get("CHDB_HTTP_VERBOSE"):
            sys.stderr.write("%s - %s\n" % (self.address_string(), format % args))

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def do_GET(self):
        if urlsplit(self.path).path == "/_faults":
            return self._send(200, json.dumps(self.faults.rules).encode(), {"Content-Type": "application/json"})
        self._handle(b"")

    def do_POST(self):
        body = self._read_body()
        if urlsplit(self.path).path == "/_faults":
            try:
                self.faults.add(json.loads(body))
            except (ValueError, KeyError, re.error) as exc:
                return self._send(400, f"bad fault rule: {exc}\n".encode(), {"Content-Type": "text/plain"})
            return self._send(200, b"Ok.\n", {"Content-Type": "text/plain"})
        self._handle(body)

    def do_DELETE(self):
        if urlsplit(self.path).path == "/_faults":
            self.faults.clear()
            return self._send(200, b"Ok.\n", {"Content-Type": "text/plain"})
        self._send(404, b"Not found\n", {"Content-Type": "text/plain"})

    def _fault(self, statement: str, headers: dict) -> bool:
        """Answer an injected fault for ``statement`` if a rule asks for one (True: answered)."""
        rule = self.faults.take(statement)
        if rule is None:
            return False
        if rule.get("kill"):
            os.kill(os.getpid(), signal.SIGKILL)
        if rule.get("reset"):
            self.close_connection = True
            self.connection.shutdown(2)
            return True
        if rule.get("code") is None:
            self._send(int(rule.get("status", 503)), b"Service Unavailable\n", {"Content-Type": "text/plain"})
            return True
        code = int(rule["code"])
        message = (f"Code: {code}. DB::Exception: {rule.get('message', 'injected by the test hook')}. "
                   f"({_ERROR_NAMES.get(code, 'INJECTED')})")
        self._send(int(rule.get("status", 500)), (message + "\n").encode(),
                   {**headers, "X-ClickHouse-Exception-Code": str(code)})
        return True

    def _handle(self, body: bytes):
        url = urlsplit(self.path)
        if url.path in ("/ping", "/") and not url.query and not body:
            return self._send(200, b"Ok.\n", {"Content-Type": "text/plain"})
        args = dict(parse_qsl(url.query, keep_blank_values=True))
        query_id = args.get("query_id") or str(uuid.uuid4())
        headers = {"X-ClickHouse-Query-Id": query_id, "X-ClickHouse-Timezone": self.engine.timezone}
        try:
            body = decompress_frames(self.headers.get("Content-Encoding", ""), body)
            kind = self.headers.get("Content-Type", "")
            if kind.lower().startswith("multipart/form-data"):  # the query and its parameters as form fields
                args.update(form_fields(kind, body))
                body = b""
            params = {k[6:]: v for k, v in args.items() if k.startswith("param_")}
            settings = {
                k: v for k, v in args.items() if k not in _TRANSPORT_PARAMS and not k.startswith("param_")
            }
            database = args.get("database")
            session = {"session_id": args.get("session_id") or None, "session_timeout": args.get("session_timeout"),
                       "session_check": args.get("session_check") == "1"}
            text = args.get("query", "")
            payload = (text.encode() + b"\n" + body) if text and body else (text.encode() or body)
            insert = _INSERT_WITH_DATA.match(payload)
            if insert:
                statement, fmt = insert.group(1).decode(), insert.group(2).decode()
                if self.faults.rules and self._fault(statement, headers):
                    return
                summary = self.engine.insert(statement, fmt, payload[insert.end():], database, settings, **session)
                out, fmt = b"", "TabSeparated"
            else:
                sql = payload.decode()
                if self.faults.rules and self._fault(sql, headers):
                    return
                match = _FORMAT_CLAUSE.search(sql)
                fmt = match.group(1) if match else args.get("default_format", "TabSeparated")
                out, summary = self.engine.run(sql, fmt, params, database, settings, **session)
        except Exception as exc:  # every engine error goes back to the client, as ClickHouse does
            message = str(exc)
            if "DB::Exception" not in message:
                message = f"Code: 1001. DB::Exception: {message}"
            code = _ERROR_CODE.search(message)
            headers["X-ClickHouse-Exception-Code"] = code.group(1) if code else "1001"
            return self._send(500, (message.rstrip() + "\n").encode(), headers)
        headers["X-ClickHouse-Format"] = fmt
        headers["X-ClickHouse-Summary"] = json.dumps({k: str(v) for k, v in summary.items()})
        headers["Content-Type"] = "application/octet-stream"
        accepted = self.headers.get("Accept-Encoding", "")
        if args.get("enable_http_compression") == "1" and out:
            for encoding in ("lz4", "zstd", "gzip"):
                if encoding in accepted:
                    out = compress_body(encoding, out)
                    headers["Content-Encoding"] = encoding
                    break
        self._send(200, out, headers)

    def _send(self, status: int, body: bytes, headers: dict):
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def form_fields(content_type: str, body: bytes) -> dict[str, str]:
    """The fields of a ``multipart/form-data`` body: clickhouse-connect sends the query and its
    ``param_*`` so when they would make the URL too long (as ClickHouse's HTTP interface allows)."""
    from email.parser import BytesParser
    from email.policy import HTTP

    message = BytesParser(policy=HTTP).parsebytes(f"Content-Type: {content_type}\r\n\r\n".encode() + body)
    fields = {}
    for part in message.iter_parts():
        if part.get_filename():
            raise ValueError("Code: 48. DB::Exception: external data (form files) is not served by this stand-in")
        fields[part.get_param("name", header="content-disposition")] = part.get_payload(decode=True).decode()
    return fields


class HttpsServer(ThreadingHTTPServer):
    """HTTPS: each accepted connection's handshake runs in its own request thread."""

    context: ssl.SSLContext

    def finish_request(self, request, client_address):
        super().finish_request(self.context.wrap_socket(request, server_side=True), client_address)


def tls_context(cert: str, key: str, client_ca: str | None) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    if client_ca:
        context.load_verify_locations(client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def serve(path: str, host: str = "127.0.0.1", port: int = 0, port_file: str | None = None,
          tls: ssl.SSLContext | None = None):
    os.makedirs(path, exist_ok=True)
    Handler.engine = ChdbEngine(path)
    if tls is not None:
        server = HttpsServer((host, port), Handler)
        server.context = tls
    else:
        server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    if port_file:
        tmp = port_file + ".tmp"
        with open(tmp, "w") as fh:
            fh.write(str(server.server_address[1]))
        os.replace(tmp, port_file)  # atomic: a reader never sees a half-written port
    print(f"chDB ClickHouse-HTTP stand-in on {'https' if tls else 'http'}://{host}:{server.server_address[1]} "
          f"(data {path})", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    try:
        server.serve_forever()
    finally:
        server.server_close()
        Handler.engine.session.close()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", required=True, help="chDB data directory")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--port-file", help="write the bound port here once listening")
    parser.add_argument("--tls-cert", help="serve HTTPS with this certificate (PEM)")
    parser.add_argument("--tls-key", help="… and its private key")
    parser.add_argument("--tls-client-ca", help="demand client certificates signed by this CA")
    args = parser.parse_args(argv)
    tls = tls_context(args.tls_cert, args.tls_key, args.tls_client_ca) if args.tls_cert else None
    serve(args.path, args.host, args.port, args.port_file, tls)


if __name__ == "__main__":
    main()


class ChdbEndpoint:
    """Runs the stand-in as a subprocess (chDB allows one process per data path). With ``tls``
    (devenv/certs.py) it serves HTTPS with the test CA's server certificate and demands the test
    client certificate; ``url`` then carries the CA and the client certificate and key."""

    def __init__(self, data_dir: str | os.PathLike, tls=None):
        self.data_dir = os.fspath(data_dir)
        self.port: int | None = None
        self.proc = None
        self.tls = tls

    @property
    def url(self) -> str:
        if self.tls is None:
            return f"http://default:@127.0.0.1:{self.port}/"
        from urllib.parse import urlencode

        files = {"ca_cert": self.tls.ca, "client_cert": self.tls.client_cert, "client_cert_key": self.tls.client_key}
        return f"https://default:@127.0.0.1:{self.port}/?{urlencode(files)}"

    def _ping(self) -> None:
        import urllib.request

        scheme, context = "http", None
        if self.tls is not None:
            scheme, context = "https", ssl.create_default_context(cafile=self.tls.ca)
            context.load_cert_chain(self.tls.client_cert, self.tls.client_key)
        urllib.request.urlopen(f"{scheme}://127.0.0.1:{self.port}/ping", timeout=10, context=context).read()

    def start(self, timeout: float = 60) -> "ChdbEndpoint":
        import subprocess
        import time

        os.makedirs(self.data_dir, exist_ok=True)
        port_file = os.path.join(self.data_dir, "http.port")
        if os.path.exists(port_file):
            os.unlink(port_file)
        args = [sys.executable, "-m", "devenv.clickhouse_http", "--path", os.path.join(self.data_dir, "chdb"),
                "--port-file", port_file]
        if self.port:
            args += ["--port", str(self.port)]
        if self.tls is not None:
            args += ["--tls-cert", self.tls.server_cert, "--tls-key", self.tls.server_key,
                     "--tls-client-ca", self.tls.ca]
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
        log = open(os.path.join(self.data_dir, "http.log"), "ab")
        self.proc = subprocess.Popen(args, stdout=log, stderr=log, env=env)
        deadline = time.monotonic() + timeout
        while not os.path.exists(port_file):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"chDB endpoint did not start; see {self.data_dir}/http.log")
            time.sleep(0.1)
        with open(port_file) as fh:
            self.port = int(fh.read())
        self._ping()
        return self

    def stop(self) -> None:
        from devenv.mariadb import stop_process

        stop_process(self.proc)
        self.proc = None

    def inject(self, pattern: str, code: int | None = None, times: int = 1, **rule) -> None:
        """The next ``times`` statements matching ``pattern`` fail with ClickHouse error ``code``
        (see the module's docstring for ``status`` and ``reset``)."""
        self._faults("POST", json.dumps({"pattern": pattern, "code": code, "times": times, **rule}).encode())

    def clear_faults(self) -> None:
        self._faults("DELETE", None)

    def _faults(self, method: str, body: bytes | None) -> None:
        import urllib.request

        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/_faults", data=body, method=method)
        urllib.request.urlopen(request, timeout=10).read()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

"""TLS to the source, one way for every driver: modes, certificates, the checks each driver lacks,
and the one error a refused connection becomes.

**Modes** are MySQL's client's (``--ssl-mode``): ``DISABLED`` plain text; ``PREFERRED`` TLS when
the server offers it, plain text otherwise, nothing verified; ``REQUIRED`` TLS or no connection,
nothing verified; ``VERIFY_CA`` TLS, the server's certificate chain verified against the CA given;
``VERIFY_IDENTITY`` that and the certificate's names (subjectAltName) checked against the host.

**Certificates travel as contents.** An endpoint holds the PEM text of its CA, client certificate
and key (read once where it is built: the CLI's URL, the Airflow connection), so it reaches Spark
executors inside the job spec and the task closures, with no shared file system. Drivers want file
paths: :func:`pem_file` writes each content once per process into this user's private directory
(0700), each file 0600 and named by its content's hash.

**What each driver does when asked for TLS** (pymysql 1.1.3, mysqlclient 2.3.2 on MariaDB
Connector/C 3.3, python-mysql-replication 1.0.17 over pymysql, connectorx 0.4.6), and what this
module adds so that a connection that asked for TLS never carries a statement in plain text:

* pymysql wraps the socket only when the server's greeting offers TLS, and otherwise goes on in
  plain text whatever ``ssl`` says. :func:`open_pymysql` refuses such a server before the
  credentials are sent (REQUIRED and up). The binlog stream's two connections (the control one
  and the dump) are opened by the same function (``pymysql_wrapper``).
* mysqlclient on MariaDB's Connector/C emulates ``ssl_mode``: its REQUIRED does not refuse a server
  without TLS (only its certificate check does), its VERIFY_CA checks the host name too, and its
  PREFERRED tries TLS only when some TLS option is set. :meth:`MySQLEndpoint.mysqlclient_args`
  maps the modes onto what the library does (VERIFY_CA: the CA with REQUIRED, which verifies the
  chain and not the name; PREFERRED: a TLS option), and :func:`open_mysqlclient` checks
  ``Ssl_cipher`` on every REQUIRED-and-up connection before anything else runs on it (the
  handshake and the scrambled password have then crossed; no statement has).
* connectorx's MySQL URL (Rust ``mysql`` 25.0.1) has no TLS parameter at all: a source that asks
  for TLS is read by mysqlclient (core/source/reader.py).
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import ssl
import stat
import tempfile
import threading
from pathlib import Path

from airflow_sync_provider.core.positions import BinlogError

MODES = ("DISABLED", "PREFERRED", "REQUIRED", "VERIFY_CA", "VERIFY_IDENTITY")
VERIFYING = ("VERIFY_CA", "VERIFY_IDENTITY")
REQUIRING = ("REQUIRED", *VERIFYING)

NO_RETRY = "A retry will not help: the connection is refused the same way until the settings or the server change"


class SourceRefused(BinlogError):
    """The source refused the connection for a reason a retry does not change: a TLS handshake
    that failed (unknown CA, a certificate for another host, a server without TLS where TLS is
    required) or an account the connection's settings cannot log in. A ``BinlogError`` whose
    ``retry_helps`` is False, so a CDC pipeline stops on it instead of retrying."""


# --- certificates as contents ------------------------------------------------------------------

_PEM_BLOCK = re.compile(r"-----BEGIN ([A-Z0-9 ]+)-----\r?\n.*?-----END \1-----[ \t]*\r?\n?", re.S)


def read_pem(path: str, parameter: str, where: str) -> tuple[str, str]:
    """The certificates and the private keys in the PEM file at ``path``, each as PEM text (a
    key found in a certificate file is kept apart: it is a secret, the certificate is not).
    ``parameter`` and ``where`` name the setting in the error."""
    try:
        with open(os.path.expanduser(path), "rb") as fh:
            text = fh.read().decode("ascii", errors="replace")  # PEM is ASCII; a DER file then has no block
    except OSError as exc:
        raise ValueError(f"{where}: {parameter}={path!r} cannot be read ({exc})") from None
    blocks = [m.group(0) for m in _PEM_BLOCK.finditer(text)]
    if not blocks:
        raise ValueError(f"{where}: {parameter}={path!r} holds no PEM block (-----BEGIN …-----); a DER file "
                         "converts with: openssl x509 -inform der -in FILE -out FILE.pem")
    keys = "".join(b for b in blocks if "PRIVATE KEY-----" in b.splitlines()[0])
    return "".join(b for b in blocks if b not in keys), keys


def private_dir() -> Path | None:
    """``$TMPDIR/airflow-sync-<uid>``, if it is this user's alone (None otherwise: another user
    could have made it, and could read or replace what is put there: certificates here, the
    package zip cache and the CLI's logs in core/submission.py and cli/common.py)."""
    directory = Path(tempfile.gettempdir()) / f"airflow-sync-{os.getuid()}"
    try:
        directory.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(directory)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None
    return directory


_FILES: dict[str, str] = {}
_FILES_LOCK = threading.Lock()
_FALLBACK: list[str] = []  # a directory of this process's own when the per-user one is not private


def _tls_dir() -> str:
    directory = private_dir()
    if directory is not None:
        return str(directory)
    if not _FALLBACK:
        _FALLBACK.append(tempfile.mkdtemp(prefix="airflow-sync-tls-"))  # 0700
    return _FALLBACK[0]


def pem_file(content: str) -> str:
    """A 0600 file holding ``content`` (a certificate or a key), written once per process."""
    digest = hashlib.sha256(content.encode()).hexdigest()[:32]
    with _FILES_LOCK:
        path = _FILES.get(digest)
        if path is not None and os.path.exists(path):
            return path
        path = os.path.join(_tls_dir(), f"tls-{digest}.pem")
        try:
            st = os.lstat(path)
            current = stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077
        except OSError:
            current = False
        if not current:  # created 0600 (mkstemp), renamed into place whole
            fd, partial = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tls-")
            with os.fdopen(fd, "w") as fh:
                fh.write(content)
            os.replace(partial, path)
        _FILES[digest] = path
        return path


@functools.lru_cache(maxsize=32)
def unverified_context(cert_file: str | None = None, key_file: str | None = None) -> ssl.SSLContext:
    """REQUIRED and PREFERRED for pymysql: TLS, nothing verified (given a dict without a CA,
    pymysql would load the system's CA store for nothing on every connection: ~50 ms each)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    if cert_file:
        context.load_cert_chain(cert_file, key_file)
    return context


# --- opening connections -----------------------------------------------------------------------


class _NoTlsOffered(Exception):
    """The server's greeting did not offer TLS (raised inside pymysql's connect, before the
    credentials are sent: pymysql passes non-OSError exceptions through unchanged), or a
    connection turned out unencrypted after its login (``after_login``: mysqlclient)."""

    def __init__(self, after_login: bool = False):
        super().__init__()
        self.after_login = after_login


@functools.cache
def _tls_required_class():
    import pymysql
    from pymysql.constants import CLIENT

    class TlsRequired(pymysql.connections.Connection):
        """pymysql, refusing a server that does not offer TLS before the login is sent."""

        def _request_authentication(self):
            if not self.server_capabilities & CLIENT.SSL:
                raise _NoTlsOffered()
            super()._request_authentication()

    return TlsRequired


def open_pymysql(endpoint, **overrides):
    """A pymysql connection to ``endpoint`` (core/endpoints.py); ``overrides`` replace its
    arguments. A handshake the settings cannot pass raises :class:`SourceRefused`."""
    import pymysql

    connection = _tls_required_class() if endpoint.ssl_mode in REQUIRING else pymysql.connections.Connection
    try:
        return connection(**{**endpoint.connect_args(), **overrides})
    except (_NoTlsOffered, pymysql.err.OperationalError) as exc:
        refused = refusal(endpoint, exc)
        if refused is None:
            raise
        raise refused from None


def pymysql_wrapper(endpoint):
    """python-mysql-replication's ``pymysql_wrapper``: both its connections through :func:`open_pymysql`."""
    return functools.partial(_open_with_settings, endpoint)


def _open_with_settings(endpoint, **settings):
    return open_pymysql(endpoint, **settings)


def open_mysqlclient(endpoint, **overrides):
    """A mysqlclient connection to ``endpoint``; on REQUIRED and up it is checked to be encrypted
    before anything runs on it, and the endpoint's ``init_command`` runs after that check."""
    import MySQLdb

    args = {**endpoint.mysqlclient_args(), **overrides}
    try:
        conn = MySQLdb.connect(**args)
    except MySQLdb.OperationalError as exc:
        refused = refusal(endpoint, exc)
        if refused is None:
            raise
        raise refused from None
    try:
        cur = conn.cursor()
        if endpoint.ssl_mode in REQUIRING:
            cur.execute("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
            rows = cur.fetchall()
            if not (rows and rows[0][1]):
                raise refusal(endpoint, _NoTlsOffered(after_login=True))
        if endpoint.init_command:
            cur.execute(endpoint.init_command)
            while cur.nextset():
                pass
        cur.close()
    except BaseException:
        conn.close()
        raise
    return conn


# --- what a refusal means -----------------------------------------------------------------------

_UNKNOWN_CA = ("certificate verify failed", "self-signed certificate", "self signed certificate",
               "unable to get local issuer", "unable to verify the first certificate", "certificate has expired")
_NAME_MISMATCH = ("mismatch", "validation of ssl server certificate failed", "does not match")
_NO_TLS = ("ssl is required, but the server does not support it", "server does not support ssl")
ACCESS_DENIED, INSECURE_TRANSPORT, SSL_CONNECTION_ERROR = 1045, 3159, 2026


def refusal(endpoint, exc: BaseException) -> SourceRefused | None:
    """``exc`` (raised while connecting to ``endpoint``) as a :class:`SourceRefused` naming the
    server, the mode and the cause, or None when it is not a refusal (a network error, a server
    that is down: those a retry may cure)."""
    where = f"MySQL {endpoint.host}:{endpoint.port} (ssl_mode={endpoint.ssl_mode}, user {endpoint.user!r})"
    if isinstance(exc, _NoTlsOffered):
        sent = ("the connection came up unencrypted and was closed before any statement ran on it"
                if exc.after_login else "nothing was sent past the server's greeting")
        return SourceRefused(f"{where}: the server does not offer TLS, and ssl_mode={endpoint.ssl_mode} requires "
                             f"it ({sent}). Enable TLS on the server (ssl_cert/ssl_key/ssl_ca) or connect to one "
                             f"that has it. {NO_RETRY}")
    code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
    text = str(exc.args[1] if code is not None and len(exc.args) > 1 else exc)
    original = getattr(exc, "original_exception", None)  # pymysql keeps the ssl module's error here
    if isinstance(original, ssl.SSLError):
        text = getattr(original, "verify_message", None) or str(original)
    elif code != SSL_CONNECTION_ERROR and code not in (ACCESS_DENIED, INSECURE_TRANSPORT):
        return None
    lower = text.lower()
    if any(s in lower for s in _NO_TLS):
        return refusal(endpoint, _NoTlsOffered())
    if any(s in lower for s in _NAME_MISMATCH):
        return SourceRefused(f"{where}: host name mismatch: the server's certificate is not valid for "
                             f"{endpoint.host!r} ({text}). VERIFY_IDENTITY checks the certificate's names "
                             "(subjectAltName) against the host you connect to: use the name the certificate "
                             f"carries, or VERIFY_CA to check the chain only. {NO_RETRY}")
    if isinstance(original, ssl.SSLError) or code == SSL_CONNECTION_ERROR or any(s in lower for s in _UNKNOWN_CA):
        cause = ("unknown CA: the server's certificate is not signed by the CA given (ssl_ca)"
                 if any(s in lower for s in _UNKNOWN_CA) else "the TLS handshake failed")
        return SourceRefused(f"{where}: {cause} ({text}). Give the CA that signed the server's certificate "
                             f"(your provider publishes it: RDS, Cloud SQL, Azure). {NO_RETRY}")
    if code == INSECURE_TRANSPORT or code == ACCESS_DENIED and endpoint.ssl_mode in ("DISABLED", "PREFERRED"):
        return SourceRefused(f"{where}: access denied over a connection without TLS ({text}). Either the password "
                             "is wrong, or the account was created REQUIRE SSL / REQUIRE X509, or the server has "
                             "require_secure_transport=ON (MariaDB answers all of them 'Access denied'): connect "
                             f"with ssl_mode=REQUIRED or stronger (ssl_mode=VERIFY_IDENTITY&ssl_ca=…). {NO_RETRY}")
    if code == ACCESS_DENIED:
        x509 = "" if endpoint.ssl_cert else (" or the account was created REQUIRE X509 and needs a client "
                                              "certificate (ssl_cert and ssl_key),")
        return SourceRefused(f"{where}: access denied over TLS ({text}): the user or password is wrong,{x509} "
                             f"or the account may not connect from this host. {NO_RETRY}")
    return None

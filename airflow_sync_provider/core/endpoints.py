"""Connection endpoints for the source and target, parsed from URLs or built by hooks.

One endpoint type per side carries the host, the credentials, TLS and the connection's extras,
and every driver's arguments come from it: pymysql (metadata, locks, the binlog stream's
connections), mysqlclient (the text reader), connectorx (the Arrow-native reader) on the MySQL
side; clickhouse-connect on the ClickHouse side. TLS certificates are carried as PEM contents
(core/tls.py), so an endpoint is complete wherever it is unpickled: a Spark executor needs no file
of the submitting host.

Passwords and private keys live here and in the 0600 job-spec file only; ``repr`` leaves them out
so that a logged endpoint never leaks one.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import logging
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from airflow_sync_provider.core.tls import MODES, REQUIRING, VERIFYING, pem_file, read_pem, unverified_context

log = logging.getLogger(__name__)

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
# what an ssl_mode may also be written as (libpq's names, MySQL's with dashes)
_MODE_ALIASES = {"DISABLE": "DISABLED", "PREFER": "PREFERRED", "REQUIRE": "REQUIRED", "VERIFY_FULL": "VERIFY_IDENTITY"}
# parameter names as the CLI's URL and the connection's extra may spell them -> the setting
_MYSQL_NAMES = {
    **{n: "ssl_mode" for n in ("ssl_mode", "ssl-mode", "sslmode")},
    **{n: "ssl_ca" for n in ("ssl_ca", "ssl-ca", "sslca")},
    **{n: "ssl_cert" for n in ("ssl_cert", "ssl-cert", "sslcert")},
    **{n: "ssl_key" for n in ("ssl_key", "ssl-key", "sslkey")},
    **{n: n for n in ("ssl", "charset", "init_command", "connect_timeout", "unix_socket")},
}
# the MySQL provider's extras that choose how *its* hook connects and change nothing the jobs' sessions see
_MYSQL_HOOK_ONLY = {"cursor": "the jobs choose their own cursors (streaming ones for rows)",
                    "client": "the jobs choose their own drivers (pymysql, mysqlclient, connectorx)",
                    "local_infile": "the jobs never run LOAD DATA LOCAL"}
_MYSQL_REFUSED = {
    "unix_socket": "the jobs connect over TCP (Spark executors on other hosts cannot reach a local socket); "
                   "give the host and port",
    "iam": "AWS IAM authentication is not supported: give the user's password",
}
_CHARSETS_READ_AS_UTF8MB4 = ("utf8mb4", "utf8", "utf8mb3")


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host.lower() == "localhost"


def _flag(value, name: str, where: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise ValueError(f"{where}: {name}={value!r} is not a boolean (true/false)")


def _seconds(value, name: str, where: str) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = 0.0
    if not seconds > 0:
        raise ValueError(f"{where}: {name}={value!r} must be a number of seconds > 0")
    return seconds


def _mode(value, where: str) -> str:
    mode = str(value).strip().upper().replace("-", "_")
    mode = _MODE_ALIASES.get(mode, mode)
    if mode not in MODES:
        raise ValueError(f"{where}: ssl_mode={value!r} is not one of {', '.join(MODES)}")
    return mode


def _json_dict(value, name: str, where: str):
    """A dict given as JSON text (a connection defined by URI gets its extras as strings)."""
    if isinstance(value, str) and value.strip().startswith("{"):
        try:
            return json.loads(value)
        except ValueError as exc:
            raise ValueError(f"{where}: {name} is not valid JSON ({exc})") from None
    return value


def _named(options: dict, names: dict, where: str) -> dict:
    """``options`` by setting (aliases resolved), refusing unknown names and a setting given twice.
    An empty value is no value (as the MySQL provider's hook reads its extras)."""
    found, spelled = {}, {}
    for name, value in options.items():
        key = names.get(str(name).lower())
        if key is not None and (value is None or value == "" or value == {}):
            continue
        if key is None:
            raise ValueError(f"{where}: unknown parameter {name!r} (known: {', '.join(sorted(set(names.values())))})")
        if key in found:
            raise ValueError(f"{where}: {spelled[key]!r} and {name!r} both set {key}; give one")
        found[key], spelled[key] = value, name
    return found


def _mysql_settings(options: dict, where: str, extra: bool) -> dict:
    """The endpoint fields the URL parameters / connection extras ``options`` set (see
    docs/connections.md): TLS, ``init_command``, ``connect_timeout``; ``charset`` checked."""
    names = {**_MYSQL_NAMES, **({n: n for n in (*_MYSQL_HOOK_ONLY, "iam", "aws_conn_id")} if extra else {})}
    given = _named(options, names, where)
    for name, why in _MYSQL_HOOK_ONLY.items():
        if name in given:
            log.info("%s: %s=%r not applied: %s", where, name, given.pop(name), why)
    if "iam" in given and _flag(given.pop("iam"), "iam", where):
        raise ValueError(f"{where}: iam: {_MYSQL_REFUSED['iam']}")
    if "aws_conn_id" in given:
        log.info("%s: aws_conn_id=%r not applied: no IAM authentication", where, given.pop("aws_conn_id"))
    if "unix_socket" in given:
        raise ValueError(f"{where}: unix_socket={given['unix_socket']!r} cannot be honoured: "
                         f"{_MYSQL_REFUSED['unix_socket']}")
    settings, files = {}, {}
    ssl = _json_dict(given.pop("ssl", None), "ssl", where)
    if isinstance(ssl, dict):  # the MySQL provider's {"ca": …, "cert": …, "key": …}
        for key, value in ssl.items():
            if key in ("ca", "cert", "key"):
                if f"ssl_{key}" in given:
                    raise ValueError(f"{where}: ssl.{key} and ssl_{key} both given; give one")
                given[f"ssl_{key}"] = value
            elif key == "capath":
                raise ValueError(f"{where}: ssl.capath cannot be honoured: a directory of CAs cannot travel with the "
                                 "job to its executors; give the CA as one PEM file (ssl.ca; a bundle may hold many)")
            else:
                raise ValueError(f"{where}: ssl.{key} is not supported (known: ca, cert, key)")
        ssl = True
    elif ssl is not None:
        ssl = _flag(ssl, "ssl", where)
    for key in ("ssl_ca", "ssl_cert", "ssl_key"):
        if given.get(key):
            files[key] = read_pem(str(given[key]), key, where)
    mode = _mode(given["ssl_mode"], where) if "ssl_mode" in given else (
        "DISABLED" if ssl is False else "VERIFY_IDENTITY" if "ssl_ca" in files
        else "REQUIRED" if ssl or files else "DISABLED")
    if "ssl_ca" in files:
        if files["ssl_ca"][1]:
            raise ValueError(f"{where}: ssl_ca holds a private key; it should hold the CA's certificate only")
        settings["ssl_ca"] = files["ssl_ca"][0]
    cert, cert_keys = files.get("ssl_cert", ("", ""))
    key = files.get("ssl_key", ("", ""))[1] or cert_keys
    if files.get("ssl_key") and not files["ssl_key"][1]:
        raise ValueError(f"{where}: ssl_key holds no private key")
    if bool(cert) != bool(key):
        raise ValueError(f"{where}: a client certificate needs both ssl_cert and ssl_key (for REQUIRE X509 accounts)")
    if cert:
        settings.update(ssl_cert=cert, ssl_key=key)
    if mode == "DISABLED" and (files or ssl):
        raise ValueError(f"{where}: ssl_mode=DISABLED with TLS settings ({', '.join(files) or 'ssl'}); give one")
    if settings.get("ssl_ca") and mode not in VERIFYING:
        raise ValueError(f"{where}: ssl_ca is used by VERIFY_CA and VERIFY_IDENTITY only; with ssl_mode={mode} the "
                         "server's certificate is not verified: set ssl_mode=VERIFY_CA or VERIFY_IDENTITY")
    settings["ssl_mode"] = mode
    charset = str(given.pop("charset", "utf8mb4")).lower()
    if charset not in _CHARSETS_READ_AS_UTF8MB4:
        raise ValueError(f"{where}: charset={charset!r} cannot be honoured: the copies' strings are UTF-8 and are "
                         "read in utf8mb4, which holds every character of every MySQL character set; a session "
                         f"in {charset} would convert them lossily. Leave charset out or set utf8mb4")
    if charset != "utf8mb4":  # utf8mb3 would turn 4-byte characters into '?'; utf8mb4 keeps them
        log.info("%s: charset=%r read as utf8mb4 (its superset: every value reads the same, 4-byte "
                 "characters too)", where, charset)
    if given.get("init_command"):
        settings["init_command"] = str(given["init_command"])
    if "connect_timeout" in given:
        settings["connect_timeout"] = _seconds(given["connect_timeout"], "connect_timeout", where)
    return settings


@dataclass(frozen=True)
class MySQLEndpoint:
    host: str = "127.0.0.1"
    port: int = 3306
    user: str = "root"
    password: str = field(default="", repr=False)
    database: str = ""
    # TLS (core/tls.py): one of MySQL's client modes; the CA, client certificate and key as PEM text
    ssl_mode: str = "DISABLED"
    ssl_ca: str = field(default="", repr=False)
    ssl_cert: str = field(default="", repr=False)
    ssl_key: str = field(default="", repr=False)
    init_command: str = ""  # run first on every connection (the jobs' own session settings follow it)
    connect_timeout: float | None = None

    def __post_init__(self):
        where = f"MySQL {self.host}:{self.port}"
        if self.ssl_mode not in MODES:
            raise ValueError(f"{where}: ssl_mode={self.ssl_mode!r} is not one of {', '.join(MODES)}")
        if self.ssl_mode in VERIFYING and not self.ssl_ca:
            raise ValueError(f"{where}: ssl_mode={self.ssl_mode} verifies the server's certificate and needs the CA "
                             "that signed it (ssl_ca)")
        if self.ssl_mode != "DISABLED" and self.host == "localhost":
            raise ValueError(f"{where}: with TLS give the server's address, not 'localhost': mysqlclient (like "
                             "MySQL's own client) takes 'localhost' for the local socket, which has no TLS")

    @classmethod
    def from_url(cls, url: str) -> "MySQLEndpoint":
        """``mysql://user:pass@host:port/db?ssl_mode=VERIFY_CA&ssl_ca=/path/ca.pem&…``
        (percent-encoded parts; the parameters: docs/connections.md)."""
        parts = urlsplit(url)
        if parts.scheme not in ("mysql", "mariadb", "mysql+pymysql"):
            raise ValueError(f"not a MySQL URL (scheme {parts.scheme!r}); expected mysql://user:pass@host:port/db")
        where = f"the MySQL URL (mysql://{parts.hostname}:{parts.port or 3306})"
        pairs = parse_qsl(parts.query, keep_blank_values=True)
        options = dict(pairs)
        if len(options) < len(pairs):
            raise ValueError(f"{where}: a parameter is given twice")
        return cls(host=parts.hostname or "127.0.0.1", port=parts.port or 3306,
                   user=unquote(parts.username or "root"), password=unquote(parts.password or ""),
                   database=unquote(parts.path.lstrip("/")), **_mysql_settings(options, where, extra=False))

    @classmethod
    def from_connection(cls, host: str, port: int, user: str, password: str, database: str, extra: dict,
                        where: str) -> "MySQLEndpoint":
        """From an Airflow ``mysql`` connection's fields and ``extra`` (the MySQL provider's names)."""
        return cls(host=host, port=port, user=user, password=password, database=database,
                   **_mysql_settings(extra, where, extra=True))

    @property
    def address(self) -> str:
        return f"MySQL {self.host}:{self.port} (ssl_mode={self.ssl_mode})"

    def _common(self) -> dict:
        args = {"host": self.host, "port": self.port, "user": self.user, "password": self.password,
                "charset": "utf8mb4"}
        if self.connect_timeout:
            args["connect_timeout"] = self.connect_timeout
        return args

    def connect_args(self, database: str | None = None) -> dict:
        """Keyword arguments for pymysql (and python-mysql-replication's ``connection_settings``).
        Connect through :meth:`connect`: pymysql alone would go on in plain text with a server
        that does not offer TLS (core/tls.py)."""
        args = self._common()
        if database or self.database:
            args["database"] = database or self.database
        client = (pem_file(self.ssl_cert), pem_file(self.ssl_key)) if self.ssl_cert else (None, None)
        if self.ssl_mode in VERIFYING:
            args["ssl"] = {"ca": pem_file(self.ssl_ca), "check_hostname": self.ssl_mode == "VERIFY_IDENTITY",
                           "verify_mode": True, **({"cert": client[0], "key": client[1]} if self.ssl_cert else {})}
        elif self.ssl_mode != "DISABLED":
            args["ssl"] = unverified_context(*client)
        if self.init_command:
            args["init_command"] = self.init_command
        return args

    def replication_args(self) -> dict:
        """python-mysql-replication's connection arguments: its ``connection_settings`` (TLS
        included) and a ``pymysql_wrapper`` that opens both its connections, the control one and
        the dump, as :meth:`connect` does (core/tls.py: TLS, or no connection)."""
        from airflow_sync_provider.core.tls import pymysql_wrapper

        settings = self.connect_args()
        settings.pop("database", None)
        return {"connection_settings": settings, "pymysql_wrapper": pymysql_wrapper(self)}

    def connect(self, **overrides):
        """A pymysql connection (``overrides`` replace arguments): core/tls.open_pymysql."""
        from airflow_sync_provider.core.tls import open_pymysql

        return open_pymysql(self, **overrides)

    def mysqlclient_args(self) -> dict:
        """Keyword arguments for mysqlclient (MySQLdb.connect), its ``ssl`` and ``ssl_mode`` mapped
        onto what its client library does (core/tls.py); open it with core/tls.open_mysqlclient,
        which checks the encryption and runs ``init_command``."""
        args = self._common()
        if self.connect_timeout:
            args["connect_timeout"] = max(1, round(self.connect_timeout))  # whole seconds
        if self.database:
            args["database"] = self.database
        if self.ssl_mode == "DISABLED":
            args["ssl_mode"] = "DISABLED"
            return args
        ssl = {}
        if self.ssl_mode in VERIFYING:
            ssl["ca"] = pem_file(self.ssl_ca)
        if self.ssl_cert:
            ssl["cert"], ssl["key"] = pem_file(self.ssl_cert), pem_file(self.ssl_key)
        mode = self.ssl_mode
        if _mariadb_client():
            if mode == "VERIFY_CA":  # the CA verifies the chain; its VERIFY_CA would check the name too
                mode = "REQUIRED"
            elif mode == "PREFERRED" and not ssl:  # it tries TLS only with a TLS option set
                ssl["cipher"] = "DEFAULT"
        if ssl:
            args["ssl"] = ssl
        args["ssl_mode"] = mode
        return args

    def connectorx_url(self, database: str) -> str:
        """connectorx's URL; it has no TLS (core/tls.py), so a source that asks for TLS is read by
        mysqlclient instead (core/source/reader.choose_reader)."""
        if self.ssl_mode != "DISABLED":
            raise ValueError(f"{self.address}: connectorx cannot connect with TLS; read this source with "
                             "reader='mysqlclient' (the default 'auto' does)")
        args = f"?tcp_connect_timeout_ms={int(self.connect_timeout * 1000)}" if self.connect_timeout else ""
        return (f"mysql://{quote(self.user, safe='')}:{quote(self.password, safe='')}@{self.host}:"
                f"{self.port}/{quote(database, safe='')}{args}")

    @property
    def tls_required(self) -> bool:
        return self.ssl_mode in REQUIRING


@functools.cache
def _mariadb_client() -> bool:
    """mysqlclient is built on MariaDB's Connector/C (3.x), which emulates ``ssl_mode``, rather than
    on MySQL's libmysqlclient (5.7, 8.x, 9.x), which has it."""
    import MySQLdb

    return MySQLdb.get_client_info().split(".")[0] not in ("5", "8", "9")


# --- ClickHouse -------------------------------------------------------------------------------------

# the clickhousedb provider's extras (its hook's ``extra`` and ``client_kwargs``) and the CLI's URL parameters
_CH_TLS = ("ca_cert", "client_cert", "client_cert_key", "server_host_name", "tls_mode")
_CH_EXTRAS = ("secure", "verify", "connect_timeout", "send_receive_timeout", "compress", "client_name",
              "session_settings", "client_kwargs")
_CH_NOTED = {"client_name": "the jobs name themselves in the User-Agent"}
# the jobs' Arrow inserts: compressed for a remote server (the network is the cost), not on this
# machine (compressing and decompressing 100 bytes a row costs both sides CPU, no time)
_COMPRESSIONS = {"true": "lz4", "1": "lz4", "lz4": "lz4", "zstd": "zstd", "false": "none", "0": "none", "none": "none"}
_TLS_MODES = ("mutual", "strict", "proxy")


def _clickhouse_settings(options: dict, where: str, secure: bool, extra: bool) -> dict:
    """The endpoint fields ``options`` set: TLS (``ca_cert``, ``verify``, ``client_cert``,
    ``client_cert_key``, ``server_host_name``, ``tls_mode``) and the timeouts (docs/connections.md)."""
    names = {n: n for n in (*(_CH_EXTRAS if extra else ("verify", "connect_timeout", "send_receive_timeout",
                                                          "compress")),
                            *(() if extra else _CH_TLS))}
    given = _named(options, names, where)
    kwargs = _json_dict(given.pop("client_kwargs", None), "client_kwargs", where) or {}
    if not isinstance(kwargs, dict):
        raise ValueError(f"{where}: client_kwargs must be a JSON object")
    for name, value in kwargs.items():  # the provider passes them to clickhouse_connect.get_client
        if name in _CH_TLS:
            given[name] = value
        elif name in ("host", "port", "username", "password", "database", "secure", "verify", "client_name",
                      "settings"):
            log.info("%s: client_kwargs.%s not applied (the clickhousedb provider ignores it too)", where, name)
        else:
            raise ValueError(f"{where}: client_kwargs.{name} cannot be honoured (known: {', '.join(_CH_TLS)})")
    for name, why in _CH_NOTED.items():
        if name in given:
            log.info("%s: %s=%r not applied: %s", where, name, given.pop(name), why)
    if given.get("session_settings"):
        raise ValueError(f"{where}: session_settings cannot be honoured: the jobs set the ClickHouse settings "
                         "their reads of FINAL and their inserts rely on, and a connection-wide setting could "
                         "change what they see; remove it from this connection")
    given.pop("session_settings", None)
    if "secure" in given:
        secure = _flag(given.pop("secure"), "secure", where)
    settings = {"secure": secure}
    if "compress" in given:
        value = str(given.pop("compress")).strip().lower()
        if value not in _COMPRESSIONS:
            raise ValueError(f"{where}: compress={value!r}: give true / lz4, zstd, or false / none (unset: "
                             "LZ4 for a remote server, none on this machine)")
        settings["compress"] = _COMPRESSIONS[value]
    if "verify" in given:
        settings["verify"] = _flag(given.pop("verify"), "verify", where)
    for name in ("connect_timeout", "send_receive_timeout"):
        if name in given:
            settings[name] = _seconds(given.pop(name), name, where)
    tls = {k: v for k, v in given.items() if v not in (None, "")}
    if tls and not secure:
        raise ValueError(f"{where}: {', '.join(tls)} need HTTPS (https:// or extra secure=true)")
    if tls.get("tls_mode") and tls["tls_mode"] not in _TLS_MODES:
        raise ValueError(f"{where}: tls_mode={tls['tls_mode']!r} is not one of {', '.join(_TLS_MODES)}")
    if "ca_cert" in tls:
        if tls["ca_cert"] == "certifi":  # clickhouse-connect's name for the certifi bundle
            settings["ca_cert"] = "certifi"
        else:
            settings["ca_cert"], keys = read_pem(str(tls["ca_cert"]), "ca_cert", where)
            if keys:
                raise ValueError(f"{where}: ca_cert holds a private key; it should hold the CA's certificate only")
    cert, cert_keys = read_pem(str(tls["client_cert"]), "client_cert", where) if "client_cert" in tls else ("", "")
    key = read_pem(str(tls["client_cert_key"]), "client_cert_key", where)[1] if "client_cert_key" in tls else ""
    key = key or cert_keys
    if bool(cert) != bool(key):
        raise ValueError(f"{where}: a client certificate needs client_cert and its private key (client_cert_key, "
                         "or in the certificate's file)")
    if cert:
        settings.update(client_cert=cert, client_cert_key=key)
    for name in ("server_host_name", "tls_mode"):
        if tls.get(name):
            settings[name] = str(tls[name])
    return settings


@dataclass(frozen=True)
class ClickHouseEndpoint:
    host: str = "127.0.0.1"
    port: int = 8123
    user: str = "default"
    password: str = field(default="", repr=False)
    database: str = "default"
    secure: bool = False
    # HTTPS, as clickhouse-connect takes it: the CA ("certifi" or PEM text), the client certificate
    # and key (PEM text), the name the certificate must carry if not the host's, and its tls_mode
    verify: bool = True
    ca_cert: str = field(default="", repr=False)
    client_cert: str = field(default="", repr=False)
    client_cert_key: str = field(default="", repr=False)
    server_host_name: str = ""
    tls_mode: str = ""
    connect_timeout: float | None = None
    send_receive_timeout: float | None = None
    compress: str = ""  # the jobs' inserts: "lz4", "zstd", "none"; "": see insert_compression

    @property
    def insert_compression(self) -> str | None:
        """The Arrow IPC compression of the jobs' inserts: as set, else LZ4 for a remote server
        and none for one on this machine (a loopback address)."""
        if self.compress:
            return None if self.compress == "none" else self.compress
        return None if _loopback(self.host) else "lz4"

    @classmethod
    def from_url(cls, url: str) -> "ClickHouseEndpoint":
        """``http(s)://user:pass@host:port/db`` or ``clickhouse://…`` (HTTP interface), with
        ``?ca_cert=/path&verify=false&client_cert=…&client_cert_key=…&server_host_name=…``."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https", "clickhouse", "clickhouses"):
            raise ValueError(f"not a ClickHouse HTTP URL (scheme {parts.scheme!r}); expected http://user:pass@host:8123/db")
        secure = parts.scheme in ("https", "clickhouses")
        where = f"the ClickHouse URL ({parts.scheme}://{parts.hostname}:{parts.port or ''})"
        pairs = parse_qsl(parts.query, keep_blank_values=True)
        if len(dict(pairs)) < len(pairs):
            raise ValueError(f"{where}: a parameter is given twice")
        return cls(host=parts.hostname or "127.0.0.1", port=parts.port or (8443 if secure else 8123),
                   user=unquote(parts.username or "default"), password=unquote(parts.password or ""),
                   database=unquote(parts.path.strip("/")) or "default",
                   **_clickhouse_settings(dict(pairs), where, secure, extra=False))

    @classmethod
    def from_connection(cls, host: str, port: int | None, user: str, password: str, database: str, extra: dict,
                        where: str) -> "ClickHouseEndpoint":
        """From an Airflow ``clickhouse`` connection (the clickhousedb provider's extras)."""
        settings = _clickhouse_settings(extra, where, False, extra=True)
        return cls(host=host, port=port or (8443 if settings["secure"] else 8123), user=user, password=password,
                   database=database, **settings)

    def client_args(self) -> dict:
        """Keyword arguments for clickhouse_connect.get_client (certificates as 0600 files)."""
        args = dict(host=self.host, port=self.port, username=self.user, password=self.password, secure=self.secure)
        if self.secure:
            args["verify"] = self.verify
            if self.ca_cert:
                args["ca_cert"] = self.ca_cert if self.ca_cert == "certifi" else pem_file(self.ca_cert)
            if self.client_cert:
                args["client_cert"] = pem_file(self.client_cert)
                args["client_cert_key"] = pem_file(self.client_cert_key)
            for name in ("server_host_name", "tls_mode"):
                if getattr(self, name):
                    args[name] = getattr(self, name)
        for name in ("connect_timeout", "send_receive_timeout"):
            if getattr(self, name):
                args[name] = getattr(self, name)
        return args

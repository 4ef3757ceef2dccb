"""A production-shaped source and target for tests: a MariaDB that takes TLS connections only
(``require_secure_transport=ON``, its certificate from devenv/certs.py), least-privileged accounts,
and the chDB stand-in served over HTTPS with mutual TLS. One of each per test session (and xdist
worker): the ``tls`` fixture of tests/conftest.py.

Accounts (password :data:`PASSWORD`, every character a URL, a shell or a JSON string mangles):

* ``sync`` — ``REQUIRE SSL``; ``SELECT`` on the test databases, ``REPLICATION SLAVE`` and
  ``BINLOG MONITOR``: what the docs' grants table asks for, nothing more;
* ``sync_x509`` — the same grants, ``REQUIRE X509`` (a client certificate signed by the CA);
* ``no_repl`` — ``REQUIRE SSL``, without ``REPLICATION SLAVE``.

Root keeps the local socket (:meth:`TlsSource.root`) for the tests' own writes, which go on
while the server is ``read_only=ON`` (:meth:`TlsSource.read_only`), as a replica applies its
primary's.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlencode

import pymysql

from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
from devenv.certs import Certificates
from devenv.clickhouse_http import ChdbEndpoint
from devenv.mariadb import ROOT_PASSWORD, MariaDB

PASSWORD = "p@ss:w/rd%#?&= x'\"\\+;"
DATABASES = ("tls_db", "tls_dag", "tls_clu")  # the tests', the example DAG's, the cluster test's
ACCOUNTS = {"sync": "SSL", "sync_x509": "X509", "no_repl": "SSL"}
OTHER_HOST = "127.0.0.2"  # the server listens here too; its certificate does not name it


@dataclass
class TlsSource:
    certs: Certificates
    server: MariaDB
    clickhouse: ChdbEndpoint

    @classmethod
    @contextlib.contextmanager
    def running(cls, base: Path):
        certs = Certificates(base / "certs").make()
        with MariaDB(base / "mariadb", tls=certs, settings={"bind_address": f"127.0.0.1,{OTHER_HOST}"}) as server, \
                ChdbEndpoint(base / "clickhouse", tls=certs) as clickhouse:
            source = cls(certs, server, clickhouse)
            source._accounts()
            yield source

    def root(self) -> pymysql.connections.Connection:
        """Root over the server's local socket (autocommit)."""
        return pymysql.connect(unix_socket=str(self.server.socket), user="root", password=ROOT_PASSWORD,
                               autocommit=True)

    def _accounts(self) -> None:
        with self.root() as conn, conn.cursor() as cur:
            for database in DATABASES:
                cur.execute(f"CREATE DATABASE IF NOT EXISTS {database}")
            for user, require in ACCOUNTS.items():
                cur.execute(f"CREATE USER '{user}'@'%%' IDENTIFIED BY %s REQUIRE {require}", (PASSWORD,))
                for database in DATABASES:
                    cur.execute(f"GRANT SELECT ON {database}.* TO '{user}'@'%'")
                cur.execute(f"GRANT {'REPLICATION SLAVE, ' if user != 'no_repl' else ''}BINLOG MONITOR ON *.* "
                            f"TO '{user}'@'%'")

    def read_only(self, on: bool) -> None:
        with self.root() as conn, conn.cursor() as cur:
            cur.execute(f"SET GLOBAL read_only = {'ON' if on else 'OFF'}")

    def url(self, user: str = "sync", mode: str = "VERIFY_IDENTITY", host: str = "127.0.0.1", port: int = 0,
            database: str = "tls_db", ca: str | None = None, client_cert: bool = False) -> str:
        """The source's URL for ``user``, the password percent-encoded, TLS in its parameters."""
        params = {"ssl_mode": mode}
        if mode in ("VERIFY_CA", "VERIFY_IDENTITY"):
            params["ssl_ca"] = ca or self.certs.ca
        if client_cert:
            params |= {"ssl_cert": self.certs.client_cert, "ssl_key": self.certs.client_key}
        return (f"mysql://{user}:{quote(PASSWORD, safe='')}@{host}:{port or self.server.port}/{database}?"
                f"{urlencode(params)}")

    def endpoint(self, user: str = "sync", mode: str = "VERIFY_IDENTITY", **kwargs) -> MySQLEndpoint:
        return MySQLEndpoint.from_url(self.url(user, mode, **kwargs))

    @property
    def clickhouse_url(self) -> str:
        return self.clickhouse.url

    def target(self) -> ClickHouseEndpoint:
        return ClickHouseEndpoint.from_url(self.clickhouse_url)

    def connection_env(self, database: str) -> dict:
        """``AIRFLOW_CONN_SYNC_MYSQL_TLS`` / ``_SYNC_CLICKHOUSE_TLS``: the MySQL provider's extras (the
        ``REQUIRE X509`` account with its client certificate) and the clickhousedb provider's."""
        certs = self.certs
        mysql = {"conn_type": "mysql", "host": "127.0.0.1", "port": self.server.port, "login": "sync_x509",
                 "password": PASSWORD, "schema": database,
                 "extra": {"ssl": {"ca": certs.ca, "cert": certs.client_cert, "key": certs.client_key},
                           "ssl_mode": "VERIFY_IDENTITY", "charset": "utf8mb4", "connect_timeout": 20,
                           "init_command": "SET SESSION lock_wait_timeout = 60"}}
        clickhouse = {"conn_type": "clickhouse", "host": "127.0.0.1", "port": self.clickhouse.port,
                      "login": "default", "password": "", "schema": "default",
                      "extra": {"secure": True, "verify": True,
                                "client_kwargs": {"ca_cert": certs.ca, "client_cert": certs.client_cert,
                                                  "client_cert_key": certs.client_key}}}
        return {"AIRFLOW_CONN_SYNC_MYSQL_TLS": json.dumps(mysql),
                "AIRFLOW_CONN_SYNC_CLICKHOUSE_TLS": json.dumps(clickhouse)}

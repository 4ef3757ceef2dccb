"""Connection endpoints for the source and target, parsed from URLs or built by hooks.

Passwords live here and in the 0600 job-spec file only; ``repr`` masks them so that a
logged endpoint never leaks one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit


@dataclass(frozen=True)
class MySQLEndpoint:
    host: str = "127.0.0.1"
    port: int = 3306
    user: str = "root"
    password: str = field(default="", repr=False)
    database: str = ""

    @classmethod
    def from_url(cls, url: str) -> "MySQLEndpoint":
        """``mysql://user:pass@host:port/db`` (percent-encoded parts allowed)."""
        parts = urlsplit(url)
        if parts.scheme not in ("mysql", "mariadb", "mysql+pymysql"):
            raise ValueError(f"not a MySQL URL (scheme {parts.scheme!r}); expected mysql://user:pass@host:port/db")
        return cls(
            host=parts.hostname or "127.0.0.1",
            port=parts.port or 3306,
            user=unquote(parts.username or "root"),
            password=unquote(parts.password or ""),
            database=unquote(parts.path.lstrip("/")),
        )

    def connect_args(self, database: str | None = None) -> dict:
        """Keyword arguments for pymysql.connect / MySQLdb.connect."""
        args = dict(host=self.host, port=self.port, user=self.user, password=self.password, charset="utf8mb4")
        if database or self.database:
            args["database"] = database or self.database
        return args


@dataclass(frozen=True)
class ClickHouseEndpoint:
    host: str = "127.0.0.1"
    port: int = 8123
    user: str = "default"
    password: str = field(default="", repr=False)
    database: str = "default"
    secure: bool = False

    @classmethod
    def from_url(cls, url: str) -> "ClickHouseEndpoint":
        """``http(s)://user:pass@host:port/db`` or ``clickhouse://…`` (HTTP interface)."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https", "clickhouse", "clickhouses"):
            raise ValueError(f"not a ClickHouse HTTP URL (scheme {parts.scheme!r}); expected http://user:pass@host:8123/db")
        secure = parts.scheme in ("https", "clickhouses")
        return cls(
            host=parts.hostname or "127.0.0.1",
            port=parts.port or (8443 if secure else 8123),
            user=unquote(parts.username or "default"),
            password=unquote(parts.password or ""),
            database=unquote(parts.path.strip("/")) or "default",
            secure=secure,
        )

    def client_args(self) -> dict:
        """Keyword arguments for clickhouse_connect.get_client."""
        return dict(host=self.host, port=self.port, username=self.user, password=self.password,
                    secure=self.secure)

"""Local stand-ins, or the external servers named by MYSQL_URL / CLICKHOUSE_URL."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from devenv.clickhouse_http import ChdbEndpoint
from devenv.mariadb import MariaDB


@contextlib.contextmanager
def mysql_service(state_dir: str | os.PathLike):
    """Yield a MySQL URL: $MYSQL_URL if set, else a private MariaDB under state_dir."""
    if os.environ.get("MYSQL_URL"):
        yield os.environ["MYSQL_URL"]
        return
    with MariaDB(Path(state_dir) / "mariadb") as server:
        yield server.url


@contextlib.contextmanager
def clickhouse_service(state_dir: str | os.PathLike):
    """Yield a ClickHouse HTTP URL: $CLICKHOUSE_URL if set, else the chDB stand-in."""
    if os.environ.get("CLICKHOUSE_URL"):
        yield os.environ["CLICKHOUSE_URL"]
        return
    with ChdbEndpoint(Path(state_dir) / "clickhouse") as endpoint:
        yield endpoint.url

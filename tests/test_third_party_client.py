"""A third-party client's workload against our ClickHouse endpoint.

mysql-ch-replicator (0.1.16, in its own venv: its pins clash with Airflow's) copies the demo
``orders`` table from the fixture MariaDB into the fixture ClickHouse endpoint with its
one-time initial copy, and the copy must hold exactly the source's keys. It exercises the
endpoint the way another real client does: DDL with skip indexes and PARTITION BY, a
ReplacingMergeTree, a session-scoped ``SET final = 1``, clickhouse-connect's native-format inserts,
``system.settings``, ``SHOW DATABASES`` and ``RENAME DATABASE``.
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest
import yaml

from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
from devenv.peers import peer_venv

PEER = "mysql-ch-replicator"
SOURCE_DB = "demo"
TABLE = "orders"
# Its own target database: the replicator builds `<target>_tmp`, then RENAMEs it over
# `<target>` (dropping an existing one), so it must not be a database other tests use.
TARGET_DB = "peer_mcr_demo"
TIMEOUT = 300


def _mysql_ids(conn) -> list[int]:
    with conn.cursor() as cur:
        cur.execute(f"SELECT id FROM `{SOURCE_DB}`.`{TABLE}` ORDER BY id")
        return [row[0] for row in cur.fetchall()]


def _drop_target(ch) -> None:
    for db in (TARGET_DB, f"{TARGET_DB}_tmp", f"{TARGET_DB}_old"):
        ch.command(f"DROP DATABASE IF EXISTS `{db}`")


@pytest.mark.slow
def test_mysql_ch_replicator_initial_copy_of_orders(demo_db, mysql_url, clickhouse_url, mysql_conn, ch, tmp_path):
    venv = peer_venv(PEER)
    my = MySQLEndpoint.from_url(mysql_url)
    chp = ClickHouseEndpoint.from_url(clickhouse_url)
    data_dir = tmp_path / "replicator-data"
    config = {
        "mysql": {"host": my.host, "port": my.port, "user": my.user, "password": my.password,
                  "charset": "utf8mb4"},
        "clickhouse": {"host": chp.host, "port": chp.port, "user": chp.user, "password": chp.password,
                       "connection_timeout": 30, "send_receive_timeout": 120},
        "binlog_replicator": {"data_dir": str(data_dir), "records_per_file": 100000},
        "databases": SOURCE_DB,
        "tables": [TABLE],
        "target_databases": {SOURCE_DB: TARGET_DB},
        "log_level": "info",
        # Several batches, so the copy pages through the key range as on a big table.
        "initial_replication_batch_size": 7000,
    }
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))

    source_ids = _mysql_ids(mysql_conn)
    assert len(source_ids) == demo_db[TABLE]
    _drop_target(ch)

    cmd = [str(venv / "bin" / "mysql_ch_replicator"), "db_replicator", "--config", str(config_path),
           "--db", SOURCE_DB, "--initial_only=True"]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MYSQL_", "CLICKHOUSE_", "PYTHON", "VIRTUAL_ENV"))}  # env overrides config
    started = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT)
        output = proc.stdout + proc.stderr
        assert proc.returncode == 0, f"replicator exited {proc.returncode} after " \
            f"{time.monotonic() - started:.0f}s:\n{output[-6000:]}"
        assert "initial replication - done" in output, output[-6000:]

        # Its `SET final = 1` belongs to its own HTTP session, not to other clients' queries.
        assert ch.query("SELECT value FROM system.settings WHERE name = 'final'").result_rows == [("0",)]

        # Where it put the table: the temporary database was swapped in under the target name.
        databases = set(ch.query("SHOW DATABASES").result_columns[0])
        assert TARGET_DB in databases and f"{TARGET_DB}_tmp" not in databases, sorted(databases)
        engine = ch.query(
            "SELECT engine FROM system.tables WHERE database = {db:String} AND name = {t:String}",
            parameters={"db": TARGET_DB, "t": TABLE}).result_rows
        assert engine and engine[0][0] == "ReplacingMergeTree", engine

        target = ch.query(f"SELECT count(), uniqExact(id) FROM `{TARGET_DB}`.`{TABLE}` FINAL").result_rows[0]
        target_ids = ch.query(f"SELECT id FROM `{TARGET_DB}`.`{TABLE}` FINAL ORDER BY id").result_columns
        target_ids = list(target_ids[0]) if target_ids else []

        assert _mysql_ids(mysql_conn) == source_ids, "demo.orders changed while the copy ran"
        assert target[0] == target[1] == len(source_ids) == demo_db[TABLE]
        missing = set(source_ids) - set(target_ids)
        extra = set(target_ids) - set(source_ids)
        assert not missing and not extra, f"{len(missing)} ids missing, {len(extra)} extra"
        assert target_ids == source_ids
    finally:
        _drop_target(ch)

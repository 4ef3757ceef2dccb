"""Session fixtures: the real local services (or MYSQL_URL / CLICKHOUSE_URL), demo data."""

from __future__ import annotations

import pymysql
import pytest

from airflow_sync_provider.core.clickhouse.client import client
from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
from devenv import demo_data
from devenv.services import clickhouse_service, mysql_service
from tests.airflow_run import close_runners

# The longest files first (seconds each takes in a whole run on an idle 2-core machine): `--dist
# loadfile` hands files to the two workers in this order, so the short ones fill in at the end
# instead of one long file running alone. Files that keep a core busy all along (Airflow's and
# Spark's processes: marked C) alternate with files that mostly wait (bounds, services, writers:
# W), so that two of the first kind rarely run side by side and slow each other down.
HEAVY_FIRST = ("test_spark_cluster.py",  # C 200
               "test_cdc_apply.py",  # W 150
               "test_example_dag.py",  # C 190
               "test_faults.py",  # W 120
               "test_airflow_real.py",  # C 225 (its Airflow daemons and tasks: about 0.6 of a core)
               "test_cdc_divergence.py",  # W 110
               "test_cdc_bootstrap.py",  # W 75
               "test_cdc_large_txn.py",  # C 55
               "test_cdc_verify.py",  # W 65
               "test_full_load_recovery.py",  # 50
               "test_cdc_recopy.py",  # W 45
               "test_layouts.py", "test_cli.py", "test_snapshot_diff.py", "test_source_groups.py",  # ~45 each
               "test_history_loads.py", "test_history_checks.py",  # W 40, 35
               "test_cdc_lease.py", "test_reconcile.py", "test_full_load_job.py", "test_cdc_failover.py",  # ~30
               "test_type_domain.py", "test_cdc_schema_changes.py", "test_cdc_patterns.py",
               "test_source_groups_cdc.py", "test_content_row_filter.py",
               "test_cdc_history.py")  # ~20; then the rest, under 15 s each


def pytest_configure(config):
    """xdist (3.x) hands files out by their number of tests by default (``--loadscope-reorder``):
    the long files, which have few tests, came last, and the run's end waited on whichever of them
    started last. Keep the collection order (HEAVY_FIRST's) instead."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items):
    def rank(item):
        name = item.path.name
        return HEAVY_FIRST.index(name) if name in HEAVY_FIRST else len(HEAVY_FIRST)

    items.sort(key=rank)  # stable: the order inside a file, and of the other files, is kept


@pytest.fixture(scope="module", autouse=True)
def airflow_runners():
    """A module's Airflow runner processes (tests/airflow_run.py) end with it."""
    yield
    close_runners()


@pytest.fixture(scope="session", autouse=True)
def package_log_lines():
    """Jobs run inside a test log as their driver does: to standard output (which capsys reads)."""
    from airflow_sync_provider.core.logs import to_stdout

    to_stdout()


DEMO_DB = "demo"
DEMO_ORDERS = 20_000


@pytest.fixture(scope="session")
def state_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("services")


@pytest.fixture(scope="session")
def mysql_url(state_dir):
    with mysql_service(state_dir) as url:
        yield url


# a MariaDB that compresses its binlog events (issue 34): every statement of 10 bytes or more
# is written as a Query_compressed / *_rows_compressed_v1 event
COMPRESSED_BINLOG = {"log_bin_compress": "ON", "log_bin_compress_min_len": "10"}


@pytest.fixture(scope="session")
def compressed_mysql_url(state_dir):
    """A MariaDB of its own started with log_bin_compress=ON (always local: MYSQL_URL is not asked
    to have that setting)."""
    from devenv.mariadb import MariaDB

    with MariaDB(state_dir / "mariadb-compressed", settings=COMPRESSED_BINLOG) as server:
        yield server.url


@pytest.fixture(scope="session")
def tls(state_dir):
    """A TLS-only MariaDB with least-privileged accounts and an HTTPS ClickHouse stand-in
    (tests/tls_source.py): always local, started once per session on first use (~4 s)."""
    from tests.tls_source import TlsSource

    with TlsSource.running(state_dir / "tls") as source:
        yield source


@pytest.fixture
def mariadb_pair():
    """A fresh primary A + GTID replica B behind a switchable address (devenv/mariadb.ReplicatedPair,
    about 4 s to start), for failover tests: each test may kill A, so each gets its own pair."""
    from devenv.mariadb import ReplicatedPair

    with ReplicatedPair() as pair:
        yield pair


@pytest.fixture(scope="session")
def clickhouse_url(state_dir):
    with clickhouse_service(state_dir) as url:
        yield url


@pytest.fixture(scope="session")
def endpoints(mysql_url, clickhouse_url):
    return MySQLEndpoint.from_url(mysql_url), ClickHouseEndpoint.from_url(clickhouse_url)


@pytest.fixture
def mysql_conn(mysql_url):
    conn = pymysql.connect(**MySQLEndpoint.from_url(mysql_url).connect_args(), autocommit=True)
    yield conn
    conn.close()


@pytest.fixture
def ch(clickhouse_url):
    ch = client(ClickHouseEndpoint.from_url(clickhouse_url))
    yield ch
    ch.close()


@pytest.fixture(scope="session")
def demo_db(mysql_url):
    """The demo schema at test size; returns {table: row count}."""
    return demo_data.generate(mysql_url, DEMO_DB, orders=DEMO_ORDERS, customers=2_000, item_orders=5_000)


@pytest.fixture(scope="session")
def matrix(mysql_url):
    """The adversarial planner matrix (tests/adversarial.py), created once; yields a connection."""
    from tests.adversarial import create_matrix

    conn = pymysql.connect(**MySQLEndpoint.from_url(mysql_url).connect_args(), autocommit=True)
    create_matrix(conn)
    yield conn
    conn.close()


@pytest.fixture(scope="session")
def spark():
    """A real Spark (local[2]) in the test process: the Spark layer's functions run on it
    directly, without a spark-submit start-up per call (the spark-submit path has its own tests)."""
    import logging
    import os
    import sys

    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    logging.getLogger("py4j").setLevel(logging.WARNING)  # no "closing down" lines after pytest closed its streams
    from airflow_sync_provider.core.jvm_archive import java_options

    session = (SparkSession.builder.master("local[2]").appName("airflow-sync tests")
               .config("spark.ui.enabled", "false").config("spark.driver.extraJavaOptions", java_options())
               .getOrCreate())
    yield session
    session.stop()

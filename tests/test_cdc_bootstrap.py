"""CDC bootstrap against the real services: chunked snapshots under live writes, handed over
to catch-up, compared with the source row for row."""

from __future__ import annotations

import os
import random
import threading
import time

import pytest

from airflow_sync_provider.core.cdc.checkpoints import Checkpoints
from airflow_sync_provider.core.cdc.chunks import UnchunkableTable
from airflow_sync_provider.core.endpoints import MySQLEndpoint
from airflow_sync_provider.core.jobspec import CdcApplySpec, CdcBootstrapSpec, ReconcileSpec
from airflow_sync_provider.core.ledger import Ledger, check_counters
from airflow_sync_provider.core.positions import current_position
from airflow_sync_provider.core.selection import TableSet
from airflow_sync_provider.core.source.group import one_server
from airflow_sync_provider.spark.cdc_apply import run_cdc_apply
from airflow_sync_provider.spark.cdc_bootstrap import run_cdc_bootstrap
from airflow_sync_provider.spark.reconcile import run_reconcile
from tests.cdc_writer import Writer, lines_ddl, mixed_ddl
from tests.helpers import assert_same_rows, recreate_tables, stop_service

pytestmark = pytest.mark.slow
DB = "boot"


def _create(mysql_conn, *ddls):
    recreate_tables(mysql_conn, DB, *ddls)


def bootstrap(endpoints, spark, pipeline, tables, **kwargs):
    kwargs.setdefault("chunk_rows", 1500)
    return run_cdc_bootstrap(CdcBootstrapSpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline=pipeline,
                                              tableset=TableSet(tables=[f"{DB}.{t}" for t in tables]), **kwargs), spark)


def apply(endpoints, spark, pipeline, **kwargs):
    return run_cdc_apply(CdcApplySpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline=pipeline, lanes=2,
                                      **kwargs), spark)


def _raw_count(ch, table):
    return int(ch.command(f"SELECT count() FROM {DB}.`{table}`"))


def test_bootstrap_under_live_writes_then_catch_up_is_exact_and_reconciles(mysql_url, mysql_conn, ch, endpoints,
                                                                           spark):
    """Both tables (one with every mapped type, one with a composite key) are bootstrapped in
    small chunks while a writer runs ~500 changes/s — inserts, updates, deletes, key changes,
    transactions across both tables and transactions held open across chunk windows. Catch-up
    from the bootstrap's start then makes FINAL equal the source row for row; reconciliation
    with checksums says ok and the counters sensor's verdict is success."""
    _create(mysql_conn, mixed_ddl(DB), lines_ddl(DB))
    writer = Writer(mysql_url, database=DB, hold_every=25, hold_seconds=1.0)
    writer.prefill(12_000)
    with mysql_conn.cursor() as cur:
        cur.execute(f"INSERT INTO {DB}.`lines` SELECT a.seq, b.seq, a.seq / 100, NULL"
                    f" FROM {DB}.seq_1_to_2000 a, {DB}.seq_0_to_4 b")
    with writer:
        time.sleep(1)
        result = bootstrap(endpoints, spark, "boot-live", ["mixed", "lines"], channels=2, split_factor=2)
        caught = apply(endpoints, spark, "boot-live", batch_events=2000)
        while writer.changes < 1000 and writer.error is None:  # changes after `caught` too: the last apply's
            time.sleep(0.2)
    assert writer.error is None, writer.error
    assert writer.held >= 2 and writer.changes >= 1000, (writer.held, writer.changes)
    tables = {t["table"]: t for t in result["tables"]}
    assert tables[f"{DB}.mixed"]["chunks"] >= 8 and tables[f"{DB}.lines"]["chunks"] >= 7
    assert caught["start"] == result["start_position"]
    apply(endpoints, spark, "boot-live")
    assert assert_same_rows(mysql_conn, ch, DB, "mixed") > 10_000
    assert assert_same_rows(mysql_conn, ch, DB, "lines") > 9_000
    for table in tables.values():
        verdict, message, _ = check_counters(endpoints[1], table["load_key"])
        assert verdict == "success", message
        checked = run_reconcile(ReconcileSpec(sources=one_server(endpoints[0]), target=endpoints[1],
                                              load_key=table["load_key"], checksum=True), spark)
        assert checked["verdict"] == "ok", checked["shards"]


def test_collated_string_key_pages_without_skipping_or_repeating_a_row(mysql_conn, ch, endpoints, spark):
    """A utf8mb4_general_ci VARCHAR key with case, accent, trailing-space and emoji variants
    (unique under the collation), read 37 rows per chunk: every row is written exactly once
    (the copy's raw row count, not just FINAL) and the copy equals the source."""
    _create(mysql_conn, f"CREATE TABLE {DB}.names (name VARCHAR(24) COLLATE utf8mb4_general_ci NOT NULL PRIMARY KEY,"
                        " n INT NOT NULL) DEFAULT CHARSET = utf8mb4")
    rng = random.Random(5)
    pieces = ["a", "A", "á", "Ä", "b", "B", "ß", "ss", "😀", "🙂", "z", "é", "E", "ñ", "-", "0"]
    candidates = {"".join(rng.choice(pieces) for _ in range(rng.randint(1, 4))) + " " * rng.randint(0, 2)
                  for _ in range(6000)}
    with mysql_conn.cursor() as cur:
        cur.executemany(f"INSERT IGNORE INTO {DB}.names VALUES (%s, %s)", [(c, i) for i, c in enumerate(candidates)])
        cur.execute(f"SELECT count(*) FROM {DB}.names")
        rows = cur.fetchone()[0]
    assert 500 < rows < len(candidates)  # the collation folded some candidates together
    result = bootstrap(endpoints, spark, "names", ["names"], chunk_rows=37, channels=2, split_factor=3)
    assert result["rows"] == rows and _raw_count(ch, "names") == rows
    assert result["tables"][0]["chunks"] >= rows // 37
    assert assert_same_rows(mysql_conn, ch, DB, "names") == rows


@pytest.mark.parametrize("channels_in", ["executors", "driver"])
def test_killed_mid_bootstrap_resumes_after_the_last_finished_chunk(mysql_conn, mysql_url, clickhouse_url, ch,
                                                                     endpoints, monkeypatch, channels_in):
    """The job (spark-submit) is killed by SIGKILL in the channel right after a chunk's rows are
    written and before the ledger records them: in an executor (the driver records the failure)
    or in the driver itself (nothing records it: the load's heartbeat goes stale). The re-run
    (through the CLI, or once stale) reads only the unfinished chunks (the killed one again), the
    ledger counts every row once, and the copy is exact."""
    import json
    import subprocess
    import sys

    from airflow_sync_provider.core.submission import spark_submit

    table = f"crash_{channels_in}"
    _create(mysql_conn, f"CREATE TABLE {DB}.{table} (id INT PRIMARY KEY, v VARCHAR(20) NOT NULL)")
    with mysql_conn.cursor() as cur:
        cur.execute(f"INSERT INTO {DB}.{table} SELECT seq, CONCAT('v', seq) FROM {DB}.seq_1_to_6000")
    spec = CdcBootstrapSpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline=table,
                            tableset=TableSet(tables=[f"{DB}.{table}"]), chunk_rows=500, channels=1, split_factor=2,
                            driver_copy_rows=0 if channels_in == "executors" else None)
    monkeypatch.setenv("AIRFLOW_SYNC_CRASH_AT", "bootstrap.chunk-written:4")
    killed = spark_submit(spec, timeout=300)
    assert killed["status"] == "failed"
    state = Ledger(ch).state(f"cdc:{table}:boot.{table}")
    recorded = sum(s.records_read for s in state.shards.values())
    assert recorded == 3 * 500  # three chunks recorded, the fourth written only
    monkeypatch.delenv("AIRFLOW_SYNC_CRASH_AT")
    if channels_in == "executors":
        assert state.status == "failed"
        cli = subprocess.run([sys.executable, "-m", "airflow_sync_provider.cli", "cdc", "bootstrap", "--pipeline",
                              table, "--table", f"{DB}.{table}", "--chunk-rows", "500", "--channels", "1", "--json",
                              "--driver-copy-rows", "0"],
                             env={**os.environ, "MYSQL_URL": mysql_url, "CLICKHOUSE_URL": clickhouse_url},
                             capture_output=True, text=True, timeout=300)
        assert cli.returncode == 0, cli.stderr[-3000:]
        resumed = json.loads(cli.stdout)
    else:
        assert state.status == "running"  # its job died: its lock is free, so the next run resumes at once
        resumed = spark_submit(spec, timeout=300)
    assert resumed["status"] == "success", resumed
    result = resumed["tables"][0]
    assert result["rows_read_now"] == 6000 - recorded and result["rows"] == 6000
    assert result["chunks_read_now"] == result["chunks"] - 3
    assert assert_same_rows(mysql_conn, ch, DB, table) == 6000


class _Churn(threading.Thread):
    """Upserts and deletes on the given tables (id, v), ~``rate`` rows per second."""

    def __init__(self, mysql_url, tables, rate=300):
        import pymysql

        super().__init__(daemon=True)
        self.conn = pymysql.connect(**MySQLEndpoint.from_url(mysql_url).connect_args(), autocommit=True)
        self.tables, self.rate, self.stop, self.changes, self.error = tables, rate, threading.Event(), 0, None

    def run(self):
        rng = random.Random(3)
        try:
            while not self.stop.wait(10 / self.rate):
                table = rng.choice(self.tables)
                with self.conn.cursor() as cur:
                    ids = [rng.randint(1, 4000) for _ in range(10)]
                    if rng.random() < 0.2:
                        cur.execute(f"DELETE FROM {DB}.{table} WHERE id IN ({', '.join(['%s'] * 10)})", ids)
                    else:
                        cur.executemany(f"INSERT INTO {DB}.{table} VALUES (%s, %s)"
                                        " ON DUPLICATE KEY UPDATE v = VALUES(v)",
                                        [(i, rng.randint(0, 10 ** 6)) for i in ids])
                self.changes += 10
        except Exception as exc:
            self.error = exc
        finally:
            self.conn.close()


def test_a_table_added_to_a_running_pipeline_joins_it_and_both_stay_exact(mysql_url, mysql_conn, ch, endpoints,
                                                                         spark):
    """Catch-up runs as a service started before the pipeline has any table (it waits); table A
    is bootstrapped and becomes its first table; while a writer changes A and B, B is
    bootstrapped into the same pipeline. The service picks B up by itself (replaying B's
    changes from its bootstrap's start) without a restart; both copies end exact."""
    for name in ("grow_a", "grow_b"):
        _create(mysql_conn, f"CREATE TABLE {DB}.{name} (id INT PRIMARY KEY, v INT NOT NULL)")
        with mysql_conn.cursor() as cur:
            cur.execute(f"INSERT INTO {DB}.{name} SELECT seq, seq FROM {DB}.seq_1_to_3000")
    results = {}
    service = threading.Thread(target=lambda: results.setdefault("service", apply(
        endpoints, spark, "grow", service=True, max_seconds=40, batch_seconds=0.5)))
    service.start()
    time.sleep(1)
    assert Checkpoints(ch).state("grow").status == "running"  # waiting for a table, heartbeat on
    # one channel: the service's lane writes keep a task slot of local[2] meanwhile
    bootstrap(endpoints, spark, "grow", ["grow_a"], chunk_rows=1000, channels=1)
    churn = _Churn(mysql_url, ["grow_a", "grow_b"])
    churn.start()
    time.sleep(3)
    added = bootstrap(endpoints, spark, "grow", ["grow_b"], chunk_rows=300, channels=1, split_factor=2)
    time.sleep(3)
    churn.stop.set()
    churn.join()
    assert churn.error is None, churn.error
    end = current_position(mysql_conn)
    stop_service(ch, "grow", service, past=end)
    assert "service" in results, "the catch-up service did not finish"
    checkpoints = Checkpoints(ch)
    assert {t.name: t.joined for t in checkpoints.registrations("grow")} == {f"{DB}.grow_a": True, f"{DB}.grow_b": True}
    assert checkpoints.position("grow").key() >= end.key()
    assert added["start_position"]["pos"] and churn.changes > 500
    assert results["service"]["joined"] == [f"{DB}.grow_b"]  # A was its first table; B joined it running
    assert assert_same_rows(mysql_conn, ch, DB, "grow_a") > 2000
    assert assert_same_rows(mysql_conn, ch, DB, "grow_b") > 2000


def test_tables_the_bootstrap_cannot_page_through_are_refused_clearly(mysql_conn, ch, endpoints, spark):
    # (a table without a key is copied whole in one snapshot: tests/test_cdc_keyless.py)
    _create(mysql_conn, f"CREATE TABLE {DB}.enumkey (k ENUM('b', 'a') NOT NULL PRIMARY KEY, v INT)")
    with pytest.raises(UnchunkableTable, match=r"boot\.enumkey: primary key column 'k' is enum"):
        bootstrap(endpoints, spark, "refused", ["enumkey"])
    assert not int(ch.command(f"EXISTS TABLE {DB}.enumkey")) and not Checkpoints(ch).registrations("refused")

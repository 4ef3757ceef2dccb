"""CDC catch-up against the real services: binlog → ClickHouse, compared with the source."""

from __future__ import annotations

import pytest

from airflow_sync_provider.core.cdc.checkpoints import Checkpoints
from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
from airflow_sync_provider.core.jobspec import CdcApplySpec, FullLoadSpec
from airflow_sync_provider.spark.cdc_apply import run_cdc_apply
from airflow_sync_provider.spark.full_load import run_full_load
from tests.helpers import assert_same_rows

pytestmark = pytest.mark.slow
DB, TARGET = "cdc", "cdc_ch"


@pytest.fixture(scope="module")
def endpoints(mysql_url, clickhouse_url):
    return MySQLEndpoint.from_url(mysql_url), ClickHouseEndpoint.from_url(clickhouse_url)


def full_load(endpoints, spark, table, key=None):
    key = key or f"cdc.{table}"
    run_full_load(FullLoadSpec(source=endpoints[0], target=endpoints[1], source_database=DB, source_table=table,
                               target_database=TARGET, target_table=table, load_key=key, channels=2,
                               split_factor=2), spark)
    return key


def apply(endpoints, spark, pipeline, **kwargs):
    return run_cdc_apply(CdcApplySpec(source=endpoints[0], target=endpoints[1], pipeline=pipeline, lanes=3,
                                      **kwargs), spark)


def test_inserts_updates_deletes_and_key_changes_reach_the_target(mysql_conn, ch, endpoints, spark):
    with mysql_conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE IF NOT EXISTS {DB}")
        cur.execute(f"DROP TABLE IF EXISTS {DB}.basic")
        cur.execute(f"CREATE TABLE {DB}.basic (id INT PRIMARY KEY, name VARCHAR(20), amount DECIMAL(12, 2) NULL)")
        cur.execute(f"INSERT INTO {DB}.basic SELECT seq, CONCAT('n', seq), seq / 4 FROM {DB}.seq_1_to_1000")
    key = full_load(endpoints, spark, "basic")
    with mysql_conn.cursor() as cur:
        cur.execute(f"INSERT INTO {DB}.basic VALUES (2001, 'new', 1.25), (2002, 'newer', NULL)")
        cur.execute(f"UPDATE {DB}.basic SET name = 'changed', amount = NULL WHERE id <= 10")
        cur.execute(f"DELETE FROM {DB}.basic WHERE id BETWEEN 11 AND 20")
        cur.execute(f"UPDATE {DB}.basic SET id = id + 5000 WHERE id BETWEEN 21 AND 25")  # key changes
        cur.execute(f"UPDATE {DB}.basic SET amount = 7 WHERE id = 2001")
        cur.execute(f"DELETE FROM {DB}.basic WHERE id = 2002")
    result = apply(endpoints, spark, "basic", start_from_loads=[key])
    assert result["events"] >= 2 + 10 + 10 + 5 + 1 + 1
    assert assert_same_rows(mysql_conn, ch, DB, "basic", TARGET) == 1000 + 1 - 10
    state = Checkpoints(ch).state("basic")
    assert state.status == "idle" and state.checkpoint.to_dict() == result["checkpoint"]
    # a second bounded run with nothing new applies nothing and keeps the copy exact
    again = apply(endpoints, spark, "basic")
    assert again["events"] == 0 and again["start"] == result["checkpoint"]
    assert assert_same_rows(mysql_conn, ch, DB, "basic", TARGET) == 991


MIXED_DDL = f"""CREATE TABLE {DB}.mixed (
  id BIGINT UNSIGNED PRIMARY KEY, amount DECIMAL(65, 30) NULL, name VARCHAR(40) NULL, at DATETIME(6) NULL,
  ts TIMESTAMP(6) NULL, t TIME(3) NULL, b BIT(12) NULL, e ENUM('a', 'b', 'c') NULL, s SET('x', 'y') NULL,
  j JSON NULL, bin VARBINARY(16) NULL, y YEAR NULL, f FLOAT NULL, d DOUBLE NULL, dt DATE NULL,
  u BIGINT UNSIGNED NULL, ci VARCHAR(20) COLLATE utf8mb4_unicode_ci NULL
) DEFAULT CHARSET = utf8mb4"""
LINES_DDL = f"""CREATE TABLE {DB}.`lines` (account_id BIGINT NOT NULL, seq INT NOT NULL, amount DECIMAL(12, 2) NOT NULL,
  note VARCHAR(20) NULL, PRIMARY KEY (account_id, seq))"""


def _value(rng, column: str):
    if rng.random() < 0.15:
        return None
    return {
        "amount": lambda: f"{rng.randint(-10 ** 34, 10 ** 34)}.{rng.randint(0, 10 ** 30 - 1):030d}",
        "name": lambda: rng.choice(["", "ñandú", "🙂 emoji", "it's", "x" * 40, f"n{rng.randint(0, 999)}"]),
        "at": lambda: f"{rng.randint(1900, 2299)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d} "
                      f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}.{rng.randint(0, 999999):06d}",
        "ts": lambda: f"{rng.randint(1971, 2037)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d} 12:00:00.{rng.randint(0, 999999):06d}",
        "t": lambda: f"{rng.choice(['-', ''])}{rng.randint(0, 838)}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}.{rng.randint(0, 999):03d}",
        "b": lambda: rng.randint(0, 4095),
        "e": lambda: rng.choice("abc"),
        "s": lambda: rng.choice(["", "x", "y", "x,y"]),
        "j": lambda: rng.choice(['{"k": [1, 2]}', "[]", '"ü"', "null"]),
        "bin": lambda: bytes(rng.randint(0, 255) for _ in range(rng.randint(0, 16))),
        "y": lambda: rng.choice([0, 1901, 2155, rng.randint(1901, 2155)]),
        "f": lambda: rng.choice([0.0, -0.0, 3.4028234e38, rng.uniform(-1e6, 1e6)]),
        "d": lambda: rng.choice([5e-324, -1.7976931348623157e308, 1e20, rng.uniform(-1e9, 1e9)]),
        "dt": lambda: f"{rng.randint(1900, 2299)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
        "u": lambda: rng.choice([0, 2 ** 64 - 1, rng.randint(0, 2 ** 64 - 1)]),
        "ci": lambda: rng.choice(["a", "A", "b ", "Ä", "z"]),
    }[column]()


MIXED_COLUMNS = ["amount", "name", "at", "ts", "t", "b", "e", "s", "j", "bin", "y", "f", "d", "dt", "u", "ci"]


class Writer:
    """Mixed INSERT / UPDATE / DELETE at about ``rate`` row changes per second: multi-row
    statements, transactions across both tables, key changes, NULL ↔ value."""

    def __init__(self, mysql_url, rate=500, seed=7):
        import random
        import threading

        import pymysql

        self.conn = pymysql.connect(**MySQLEndpoint.from_url(mysql_url).connect_args(), autocommit=False)
        with self.conn.cursor() as cur:
            cur.execute("SET time_zone = '+00:00'")
        self.rng, self.rate, self.changes = random.Random(seed), rate, 0
        self.next_id, self.live = 1, set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.error = None

    def insert(self, cur, n):
        rows = []
        for _ in range(n):
            rows.append((self.next_id, *(_value(self.rng, c) for c in MIXED_COLUMNS)))
            self.live.add(self.next_id)
            self.next_id += 1
        cur.executemany(f"INSERT INTO {DB}.mixed (id, {', '.join(MIXED_COLUMNS)}) VALUES "
                        f"({', '.join(['%s'] * (len(MIXED_COLUMNS) + 1))})", rows)
        return n

    def transaction(self, cur) -> int:
        rng, live = self.rng, sorted(self.live)
        kind = rng.random()
        if kind < 0.35 or len(live) < 20:
            return self.insert(cur, rng.randint(1, 20))
        picked = rng.sample(live, rng.randint(1, 10))
        marks = ", ".join(["%s"] * len(picked))
        if kind < 0.6:  # one or two columns, NULL ↔ value included
            columns = rng.sample(MIXED_COLUMNS, rng.randint(1, 2))
            return cur.execute(f"UPDATE {DB}.mixed SET " + ", ".join(f"{c} = %s" for c in columns)
                               + f" WHERE id IN ({marks})", [*(_value(rng, c) for c in columns), *picked])
        if kind < 0.7:
            self.live -= set(picked)
            return cur.execute(f"DELETE FROM {DB}.mixed WHERE id IN ({marks})", picked)
        if kind < 0.8:  # primary-key changes
            old = picked[0]
            self.live.discard(old)
            self.live.add(self.next_id)
            self.next_id += 1
            return cur.execute(f"UPDATE {DB}.mixed SET id = %s WHERE id = %s", (self.next_id - 1, old))
        # a transaction across both tables
        account = rng.choice(live)
        n = cur.execute(f"UPDATE {DB}.mixed SET amount = %s WHERE id = %s", (_value(rng, "amount"), account))
        n += cur.executemany(f"INSERT INTO {DB}.`lines` VALUES (%s, %s, %s, %s) ON DUPLICATE KEY UPDATE "
                             f"amount = VALUES(amount), note = VALUES(note)",
                             [(account, rng.randint(0, 5), f"{rng.randint(-999, 999)}.{rng.randint(0, 99):02d}",
                               rng.choice([None, "n", "ü"])) for _ in range(rng.randint(1, 4))])
        if rng.random() < 0.3:
            n += cur.execute(f"DELETE FROM {DB}.`lines` WHERE account_id = %s AND seq < %s", (account, rng.randint(0, 5)))
        return n

    def run(self):
        import time

        started = time.monotonic()
        try:
            while not self.stop.is_set():
                with self.conn.cursor() as cur:
                    self.changes += self.transaction(cur)
                self.conn.commit()
                ahead = self.changes / self.rate - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(ahead)
        except Exception as exc:  # surfaced by the test
            self.error = exc

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        self.conn.close()


def _create(mysql_conn, *ddls):
    with mysql_conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE IF NOT EXISTS {DB}")
        for ddl in ddls:
            name = ddl.split("(")[0].split(".")[-1].strip()
            cur.execute(f"DROP TABLE IF EXISTS {DB}.{name}")
            cur.execute(ddl)


def _same_as_a_fresh_full_load(endpoints, spark, ch, table: str, suffix: str):
    """The CDC copy equals, value for value, a fresh full load of the table now."""
    fresh = f"{table}_{suffix}"
    run_full_load(FullLoadSpec(source=endpoints[0], target=endpoints[1], source_database=DB, source_table=table,
                               target_database=TARGET, target_table=fresh, load_key=f"cdc.{fresh}", channels=2), spark)
    columns = [r[0] for r in ch.query(f"SELECT name FROM system.columns WHERE database = '{TARGET}' AND "
                                      f"table = '{fresh}' AND name NOT IN ('_version', '_deleted') "
                                      "ORDER BY position").result_rows]
    text = ", ".join(f"hex(toString(`{c}`))" for c in columns)
    cdc, loaded = (ch.query(f"SELECT {text} FROM {TARGET}.`{t}` FINAL ORDER BY {text}").result_rows
                   for t in (table, fresh))
    assert cdc == loaded and cdc


def test_live_writes_caught_up_by_bounded_runs_match_the_source_row_for_row(mysql_url, mysql_conn, ch, endpoints,
                                                                           spark):
    """A writer at ~500 row changes/s for 20 s; the tables are fully loaded while it writes, and
    catch-up runs as several bounded runs meanwhile. Afterwards FINAL equals the source and a
    fresh full load."""
    import time

    _create(mysql_conn, MIXED_DDL, LINES_DDL)
    with Writer(mysql_url) as writer:
        time.sleep(2)
        keys = [full_load(endpoints, spark, "mixed", "cdc.live.mixed"), full_load(endpoints, spark, "lines", "cdc.live.lines")]
        runs = [apply(endpoints, spark, "live", start_from_loads=keys, reset=True, batch_events=500)]
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            runs.append(apply(endpoints, spark, "live", batch_events=500))
        written = writer.changes
    assert writer.error is None, writer.error
    runs.append(apply(endpoints, spark, "live"))
    assert len(runs) >= 4 and written >= 5000 and sum(r["events"] for r in runs) >= written * 0.8
    for first, second in zip(runs, runs[1:]):  # each run resumes exactly where the previous one stopped
        assert second["start"] == first["checkpoint"]
    assert assert_same_rows(mysql_conn, ch, DB, "mixed", TARGET) > 100
    assert assert_same_rows(mysql_conn, ch, DB, "lines", TARGET) > 10
    _same_as_a_fresh_full_load(endpoints, spark, ch, "mixed", "fresh")
    _same_as_a_fresh_full_load(endpoints, spark, ch, "lines", "fresh")

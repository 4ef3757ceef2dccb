"""Snapshot diff against the real services: a 200k-row table loaded to ClickHouse, then changes
of every kind injected in MySQL; every key must get exactly its flag and changed-column list,
an apply must leave an exact copy (reconciliation with checksums: ok) and a second diff must
report only identical rows."""

from __future__ import annotations

import random
import struct

import pytest

from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
from airflow_sync_provider.core.jobspec import FullLoadSpec, ReconcileSpec, SnapshotDiffSpec
from airflow_sync_provider.core.source.group import one_server
from airflow_sync_provider.spark.diff import run_snapshot_diff
from airflow_sync_provider.spark.full_load import run_full_load
from airflow_sync_provider.spark.reconcile import run_reconcile
from tests.helpers import assert_same_rows, recreate_tables

pytestmark = pytest.mark.slow
DB, TARGET = "dif", "dif_ch"
ROWS = 200_000


@pytest.fixture(scope="module")
def endpoints(mysql_url, clickhouse_url):
    return MySQLEndpoint.from_url(mysql_url), ClickHouseEndpoint.from_url(clickhouse_url)


def _columns_ddl() -> str:
    return ("i INT NULL, d DECIMAL(12,4) NULL, big DECIMAL(65,30) NULL, dt6 DATETIME(6) NULL, f DOUBLE NULL, "
            "fl FLOAT NULL, s VARCHAR(40) COLLATE utf8mb4_general_ci NULL, b VARBINARY(16) NULL, dd DATE NULL, "
            "t TIME(3) NULL, e ENUM('x','y') NULL, j JSON NULL, y YEAR NULL, bt BIT(8) NULL, "
            "u BIGINT UNSIGNED NULL, ts TIMESTAMP(3) NULL")


def _values_sql() -> str:
    return ("seq % 1000, seq / 7, seq / 3, TIMESTAMPADD(MICROSECOND, seq * 1001, '2024-01-01'), seq / 9, "
            "seq / 4, CONCAT('a', seq), UNHEX(HEX(seq)), '2024-02-03' + INTERVAL seq % 400 DAY, "
            "SEC_TO_TIME(seq % 80000), IF(seq % 2, 'x', 'y'), JSON_OBJECT('n', seq), 2000 + seq % 50, seq % 256, "
            "seq * 1000003, TIMESTAMPADD(SECOND, seq, '2024-05-01 00:00:00')")


def _load(endpoints, spark, table: str, key: str, **kwargs) -> str:
    run_full_load(FullLoadSpec(sources=one_server(endpoints[0]), target=endpoints[1], source_database=DB,
                               source_table=table, target_database=TARGET, target_table=table, load_key=key, channels=2,
                               **kwargs), spark)
    return key


def diff(endpoints, spark, table: str, **kwargs) -> dict:
    return run_snapshot_diff(SnapshotDiffSpec(target=endpoints[1], old_table=f"{TARGET}.{table}",
                                              sources=one_server(endpoints[0]), source_database=DB, source_table=table,
                                              **kwargs), spark)


def change_set(ch, table: str, keys: list[str]) -> dict:
    rows = ch.query(f"SELECT {', '.join(keys)}, flag, changed FROM {TARGET}.{table}__changes "
                    f"WHERE diff_key = 'diff:{DB}.{table}->{TARGET}.{table}'").result_rows
    return {tuple(r[:len(keys)]): (r[-2], sorted(r[-1])) for r in rows}


def _next_double(x: float) -> float:
    return struct.unpack("<d", struct.pack("<q", struct.unpack("<q", struct.pack("<d", x))[0] + 1))[0]


def _negative_zero(ch, table: str, where: str) -> None:
    """MariaDB stores -0e0 as 0; ClickHouse keeps -0.0: the copy's row gets it (a newer version).
    The diff must call it equal to the source's 0.0 (core/verify/diff.py says why)."""
    copy = f"{TARGET}.{table}"
    ch.command(f"INSERT INTO {copy} SELECT * REPLACE (negate(toFloat64(0)) AS f, _version + 1 AS _version)"
               f" FROM {copy} FINAL WHERE {where}")
    assert ch.command(f"SELECT 1 / f < 0 FROM {copy} FINAL WHERE {where}") == 1


def _inject(conn, table: str, key_of) -> dict:
    """Changes of every kind; returns {key: (flag, changed columns)} as the diff must report them.
    ``key_of(n)`` is the WHERE clause of row n and its key tuple."""
    expected = {}
    edits = [  # (row, SET clause, changed columns)
        (101, "i = i + 1", ["i"]), (102, "d = d + 0.0001", ["d"]),  # DECIMAL: the last digit
        (103, "big = big + 0.000000000000000000000000000001", ["big"]),
        (104, "dt6 = TIMESTAMPADD(MICROSECOND, 1, dt6)", ["dt6"]),  # DATETIME(6): one microsecond
        (106, "fl = fl * 2", ["fl"]), (107, "s = UPPER(s)", ["s"]),  # 'a…' → 'A…' under utf8mb4_general_ci
        (108, "b = CONCAT(b, 0x00)", ["b"]),  # a binary 0x00 tail
        (109, "dd = dd + INTERVAL 1 DAY", ["dd"]), (110, "t = ADDTIME(t, '00:00:00.001')", ["t"]),
        (111, "e = IF(e = 'x', 'y', 'x')", ["e"]), (112, "j = JSON_OBJECT('n', -1)", ["j"]),
        (113, "y = y + 1", ["y"]), (114, "bt = bt ^ 1", ["bt"]), (115, "u = u + 1", ["u"]),
        (116, "ts = TIMESTAMPADD(SECOND, 1, ts)", ["ts"]),
        (120, "s = NULL", ["s"]), (121, "s = ''", ["s"]),  # value → NULL, value → ''
        (122, "i = NULL, d = NULL", ["d", "i"]),
        (123, "s = 'x', i = 5, f = f + 1", ["f", "i", "s"]),
    ]
    with conn.cursor() as cur:
        for row, assignment, changed in edits:
            where, key = key_of(row)
            cur.execute(f"UPDATE {DB}.{table} SET {assignment} WHERE {where}")
            assert cur.rowcount == 1, (row, assignment)
            expected[key] = ("changed", changed)
        where, key = key_of(105)  # DOUBLE: the last bit
        cur.execute(f"SELECT f FROM {DB}.{table} WHERE {where}")
        value = cur.fetchone()[0]
        cur.execute(f"UPDATE {DB}.{table} SET f = %s WHERE {where}", (_next_double(value),))
        expected[key] = ("changed", ["f"])
        for row in (150, 151, 152):
            where, key = key_of(row)
            cur.execute(f"DELETE FROM {DB}.{table} WHERE {where}")
            expected[key] = ("deleted", [])
    return expected


def _check_flags(ch, table: str, keys: list[str], expected: dict, result: dict) -> None:
    found = change_set(ch, table, keys)
    assert found == expected, {k: (found.get(k), expected.get(k)) for k in set(found) | set(expected)
                               if found.get(k) != expected.get(k)}
    counts = result["counts"]
    assert counts["changed"] == sum(1 for f, _ in expected.values() if f == "changed")
    assert counts["new"] == sum(1 for f, _ in expected.values() if f == "new")
    assert counts["deleted"] == sum(1 for f, _ in expected.values() if f == "deleted")


def _finish_and_check(endpoints, spark, ch, conn, table: str, keys: list[str], load_key: str, expected: dict):
    first = diff(endpoints, spark, table)
    _check_flags(ch, table, keys, expected, first)
    assert first["verdict"] == "changed"
    assert first["counts"]["identical"] == first["rows_new"] - sum(1 for f, _ in expected.values() if f != "deleted")
    again = diff(endpoints, spark, table)  # the same diff again: the same change set
    _check_flags(ch, table, keys, expected, again)
    applied = diff(endpoints, spark, table, on_change="apply")
    assert applied["verdict"] == "applied" and applied["counts"] == first["counts"]
    assert assert_same_rows(conn, ch, DB, table, TARGET) == first["rows_new"]
    checked = run_reconcile(ReconcileSpec(sources=one_server(endpoints[0]), target=endpoints[1], load_key=load_key,
                                          checksum=True), spark)
    assert checked["verdict"] == "ok", [s for s in checked["shards"] if s["problems"]]
    last = diff(endpoints, spark, table, on_change="apply")
    assert last["verdict"] == "identical" and last["counts"]["identical"] == first["rows_new"]
    assert last["rows_read_old"] == last["rows_read_new"] == 0  # every shard pruned by its checksums
    assert change_set(ch, table, keys) == {}


def test_bigint_key_every_kind_of_change_gets_exactly_its_flag(mysql_conn, ch, endpoints, spark, monkeypatch):
    """Every type's changes, read by connectorx (every piece of the read, however small: the
    text-key test below reads with mysqlclient)."""
    from airflow_sync_provider.spark import diff_shard as diff_job

    monkeypatch.setattr(diff_job, "NATIVE_ROWS", 0)
    recreate_tables(mysql_conn, DB, f"CREATE TABLE {DB}.wide (id BIGINT PRIMARY KEY, {_columns_ddl()})")
    with mysql_conn.cursor() as cur:
        cur.execute(f"INSERT INTO {DB}.wide SELECT seq, {_values_sql()} FROM {DB}.seq_1_to_{ROWS}")
        cur.execute(f"UPDATE {DB}.wide SET s = NULL WHERE id IN (130, 131)")
        cur.execute(f"UPDATE {DB}.wide SET s = '' WHERE id = 132")
        cur.execute(f"UPDATE {DB}.wide SET f = 0 WHERE id = 140")
    load_key = _load(endpoints, spark, "wide", "dif.wide", split_factor=4)
    _negative_zero(ch, "wide", "id = 140")
    expected = _inject(mysql_conn, "wide", lambda n: (f"id = {n}", (n,)))
    with mysql_conn.cursor() as cur:
        # NULL → value, NULL → '' (the copy holds NULL for rows 130 and 131)
        cur.execute(f"UPDATE {DB}.wide SET s = 'filled' WHERE id = 130")
        cur.execute(f"UPDATE {DB}.wide SET s = '' WHERE id = 131")
        cur.execute(f"UPDATE {DB}.wide SET s = NULL WHERE id = 132")  # '' → NULL
        cur.execute(f"INSERT INTO {DB}.wide (id, i, s) VALUES ({ROWS + 1}, 1, 'new'), ({ROWS + 2}, NULL, NULL)")
    expected |= {(130,): ("changed", ["s"]), (131,): ("changed", ["s"]), (132,): ("changed", ["s"]),
                 (ROWS + 1,): ("new", []), (ROWS + 2,): ("new", [])}
    _finish_and_check(endpoints, spark, ch, mysql_conn, "wide", ["id"], load_key, expected)


def test_composite_collated_key_case_change_is_a_delete_and_a_new_key(mysql_conn, ch, endpoints, spark, monkeypatch):
    from airflow_sync_provider.spark import diff_shard as diff_job

    monkeypatch.setattr(diff_job, "NATIVE_ROWS", 0)  # every piece through connectorx, as above
    recreate_tables(mysql_conn, DB, f"CREATE TABLE {DB}.comp (g INT NOT NULL, k VARCHAR(20) COLLATE "
                                    f"utf8mb4_general_ci NOT NULL, {_columns_ddl()}, PRIMARY KEY (g, k))")
    with mysql_conn.cursor() as cur:
        cur.execute(f"INSERT INTO {DB}.comp SELECT seq % 100, CONCAT('k', seq), {_values_sql()} "
                    f"FROM {DB}.seq_1_to_{ROWS}")
        cur.execute(f"UPDATE {DB}.comp SET s = NULL WHERE k IN ('k130', 'k131')")
        cur.execute(f"UPDATE {DB}.comp SET s = '' WHERE k = 'k132'")
        cur.execute(f"UPDATE {DB}.comp SET f = 0 WHERE k = 'k140'")
    load_key = _load(endpoints, spark, "comp", "dif.comp", split_factor=3)
    _negative_zero(ch, "comp", "k = 'k140'")
    expected = _inject(mysql_conn, "comp", lambda n: (f"g = {n % 100} AND k = 'k{n}'", (n % 100, f"k{n}")))
    with mysql_conn.cursor() as cur:
        cur.execute(f"UPDATE {DB}.comp SET s = 'filled' WHERE k = 'k130'")
        cur.execute(f"UPDATE {DB}.comp SET s = '' WHERE k = 'k131'")
        cur.execute(f"UPDATE {DB}.comp SET s = NULL WHERE k = 'k132'")  # '' → NULL
        cur.execute(f"UPDATE {DB}.comp SET k = 'K160' WHERE k = 'k160'")  # the same key to MySQL, not to bytes
        cur.execute(f"INSERT INTO {DB}.comp (g, k, i) VALUES (7, 'new-key', 1)")
    expected |= {(30, "k130"): ("changed", ["s"]), (31, "k131"): ("changed", ["s"]), (32, "k132"): ("changed", ["s"]),
                 (60, "k160"): ("deleted", []), (60, "K160"): ("new", []), (7, "new-key"): ("new", [])}
    _finish_and_check(endpoints, spark, ch, mysql_conn, "comp", ["g", "k"], load_key, expected)


def _copied_then_negated(mysql_conn, endpoints, spark, table: str, key_type: str, where: str) -> None:
    """``table`` (id, v = id) of ROWS rows, loaded to its copy, then ``v = -v`` in MySQL where ``where``."""
    recreate_tables(mysql_conn, DB, f"CREATE TABLE {DB}.{table} (id {key_type} PRIMARY KEY, v INT NOT NULL)")
    with mysql_conn.cursor() as cur:
        cur.execute(f"INSERT INTO {DB}.{table} SELECT seq, seq FROM {DB}.seq_1_to_{ROWS}")
    _load(endpoints, spark, table, f"dif.{table}")
    with mysql_conn.cursor() as cur:
        cur.execute(f"UPDATE {DB}.{table} SET v = -v WHERE {where}")


def test_a_contiguous_change_reads_only_its_neighbourhood(mysql_conn, ch, endpoints, spark):
    """100 shards, 11 consecutive rows changed: one shard is read row by row, and in it only the
    rows of the cut-down buckets around the change (ledger: diff_shards)."""
    _copied_then_negated(mysql_conn, endpoints, spark, "pr", "INT", "id BETWEEN 1000 AND 1010")
    result = diff(endpoints, spark, "pr", channels=2, split_factor=50, bucket_rows=50)
    assert result["shards"] >= 100 and result["counts"]["changed"] == 11  # 100 ranges (+ the NULL shard)
    read = ch.query(
        "SELECT shard_id, rows_read_old, rows_read_new, buckets_read, buckets FROM airflow_sync.diff_shards "
        "WHERE run_id = {r:String}", parameters={"r": result["run_id"]}).result_rows
    touched = [r for r in read if r[1] or r[2]]
    assert len(read) == result["shards"] and len(touched) == 1, touched
    assert result["positions"] == "key" and 11 <= result["rows_read_new"] == result["rows_read_old"] <= 64, result


@pytest.mark.parametrize("key, batch, first, native", [
    ("id BIGINT", 32, None, False), ("id BIGINT", 2, 256, False), ("id BIGINT", 2, None, True),
    ("id VARCHAR(12)", 32, None, False)],
    ids=["key-positions", "key-positions-2-ranges-a-query-cut", "key-positions-connectorx-2-ranges-a-query",
         "hash-positions"])
def test_scattered_changes_are_found_exactly_reading_a_small_fraction(mysql_conn, ch, endpoints, spark, key, batch,
                                                                       first, native, monkeypatch):
    """0.1 % of the rows changed at random, plus inserts and deletes: the change set is exactly
    the expected rows, and the rows read row by row (the job's own counters) stay a small
    fraction of the table, with integer keys (key ranges, read a few ranges per MySQL query) and
    text keys (CRC32 positions) alike; with first-level buckets of 256 rows the differing ones
    are cut at a second level (with the default 32, a differing bucket is read at once; with text
    keys too, although a Poisson number of rows is in each: a second level would scan again)."""
    from airflow_sync_provider.core.verify import pruning
    from airflow_sync_provider.spark import diff_shard as diff_job

    monkeypatch.setattr(diff_job, "RANGE_BATCH", batch)
    if native:  # a shard's read through connectorx, a piece per 2 key ranges (not 256)
        monkeypatch.setattr(diff_job, "NATIVE_ROWS", 0)
        monkeypatch.setattr(diff_job, "NATIVE_RANGES", batch)
    if first:
        monkeypatch.setattr(pruning, "FIRST_ROWS", first)
    table = "sc_int" if key.endswith("BIGINT") else "sc_text"  # a change set's table per key type
    recreate_tables(mysql_conn, DB,
                    f"CREATE TABLE {DB}.{table} ({key} PRIMARY KEY, v INT NOT NULL, s VARCHAR(20) NULL)")
    with mysql_conn.cursor() as cur:
        cur.execute(f"INSERT INTO {DB}.{table} SELECT seq, seq, CONCAT('s', seq) FROM {DB}.seq_1_to_{ROWS}")
    _load(endpoints, spark, table, f"dif.{table}")
    rng = random.Random(24)
    picked = rng.sample(range(1, ROWS + 1), ROWS // 1000 + 10)
    changed, gone = picked[:ROWS // 1000], picked[ROWS // 1000:]
    with mysql_conn.cursor() as cur:
        cur.executemany(f"UPDATE {DB}.{table} SET s = CONCAT(s, '!') WHERE id = %s", [(str(k),) for k in changed])
        cur.executemany(f"DELETE FROM {DB}.{table} WHERE id = %s", [(str(k),) for k in gone])
        cur.executemany(f"INSERT INTO {DB}.{table} VALUES (%s, 0, NULL)", [(str(ROWS + k),) for k in (7, 700, 7000)])
    cast = int if key.endswith("BIGINT") else str
    expected = {(cast(k),): ("changed", ["s"]) for k in changed} | {(cast(k),): ("deleted", []) for k in gone} \
        | {(cast(ROWS + k),): ("new", []) for k in (7, 700, 7000)}
    result = diff(endpoints, spark, table, bucket_rows=64)  # many comparisons: rows must arrive in order
    _check_flags(ch, table, ["id"], expected, result)
    assert result["counts"]["identical"] == ROWS - len(picked)
    assert result["positions"] == ("key" if cast is int else "hash")
    if first:
        assert result["levels"] >= 2  # the first level's differing buckets were cut, not read
    if cast is str:  # no index: buckets above LEAF_ROWS are read, not cut at a level that scans again
        assert result["levels"] == 1, result
    assert result["rows_read_new"] <= 0.05 * ROWS and result["rows_read_old"] <= 0.05 * ROWS, result


def test_a_read_of_many_scattered_buckets_is_one_query_each_side(mysql_conn, ch, endpoints, spark, monkeypatch):
    """Two in three buckets differ (one row in three changed, buckets of 2 rows): all are read,
    named by 66,667 bucket labels, a query text above ClickHouse's 256 KiB default."""
    from airflow_sync_provider.core.verify import pruning

    monkeypatch.setattr(pruning, "FIRST_ROWS", 2)
    _copied_then_negated(mysql_conn, endpoints, spark, "many", "BIGINT", "id % 3 = 0")
    result = diff(endpoints, spark, "many", channels=1)  # one shard: all labels in one query
    assert result["counts"] == {"identical": ROWS - ROWS // 3, "changed": ROWS // 3, "new": 0, "deleted": 0}
    assert result["buckets_read"] == ROWS // 3  # pairs (2k+1, 2k+2) holding a multiple of 3


def test_everything_changed_is_read_in_pieces_and_a_failed_native_piece_is_read_again(
        mysql_conn, ch, endpoints, spark, monkeypatch):
    """Every row changed: the read goes in pieces of PIECE_ROWS through connectorx. A piece whose
    native read fails after its first batch is read again by mysqlclient: every key is flagged
    once, none twice."""
    from airflow_sync_provider.core.source import reader
    from airflow_sync_provider.spark import diff_shard as diff_job

    native, pieces, failed = reader.read_shard_native, [], []

    def flaky(endpoint, read, shard, *args, **kwargs):
        pieces.append(shard.where)
        for n, batch in enumerate(native(endpoint, read, shard, *args, **kwargs)):
            if not failed and n == 1:  # the first piece of two batches or more, after its first
                failed.append(shard.where)
                raise reader.NativeReadError("injected: a value connectorx cannot decode")
            yield batch

    _copied_then_negated(mysql_conn, endpoints, spark, "every", "BIGINT", "1 = 1")
    monkeypatch.setattr(reader, "read_shard_native", flaky)
    monkeypatch.setattr(diff_job, "PIECE_ROWS", 30_000)
    result = diff(endpoints, spark, "every", channels=1, fetch_rows=5_000)
    assert result["counts"] == {"identical": 0, "changed": ROWS, "new": 0, "deleted": 0}
    assert failed and len(pieces) >= -(-ROWS // 30_000) and len(set(pieces)) == len(pieces)  # each piece once natively
    assert ch.query(f"SELECT count(), uniqExact(id), sum(id) FROM {TARGET}.every__changes").result_rows[0] == \
        (ROWS, ROWS, ROWS * (ROWS + 1) // 2)


def test_empty_sides_and_duplicate_keys(mysql_conn, ch, endpoints, spark):
    recreate_tables(mysql_conn, DB, f"CREATE TABLE {DB}.small (id INT PRIMARY KEY, v VARCHAR(5) NULL)")
    with mysql_conn.cursor() as cur:
        cur.execute(f"INSERT INTO {DB}.small SELECT seq, seq FROM {DB}.seq_1_to_500")
    _load(endpoints, spark, "small", "dif.small")
    ch.command(f"TRUNCATE TABLE {TARGET}.small")  # an empty old snapshot
    assert diff(endpoints, spark, "small")["counts"] == {"identical": 0, "changed": 0, "new": 500, "deleted": 0}
    _load(endpoints, spark, "small", "dif.small")
    with mysql_conn.cursor() as cur:
        cur.execute(f"DELETE FROM {DB}.small")  # an empty new snapshot
    assert diff(endpoints, spark, "small")["counts"] == {"identical": 0, "changed": 0, "new": 0, "deleted": 500}
    # ClickHouse vs ClickHouse, the new side with a duplicated key
    ch.command(f"DROP TABLE IF EXISTS {TARGET}.dup")
    ch.command(f"CREATE TABLE {TARGET}.dup (id Int32, v Nullable(String)) ENGINE = MergeTree ORDER BY id")
    ch.command(f"INSERT INTO {TARGET}.dup SELECT number, toString(number) FROM numbers(1, 500)")
    ch.command(f"INSERT INTO {TARGET}.dup VALUES (42, 'again')")
    spec = SnapshotDiffSpec(target=endpoints[1], old_table=f"{TARGET}.small", new_table=f"{TARGET}.dup",
                            key_columns=["id"])
    with pytest.raises(Exception, match=r"key \(id=42\) appears more than once in the new snapshot"):
        run_snapshot_diff(spec, spark)
    ch.command(f"DELETE FROM {TARGET}.dup WHERE v = 'again'")
    done = run_snapshot_diff(spec, spark)
    assert done["counts"] == {"identical": 500, "changed": 0, "new": 0, "deleted": 0}, done["counts"]
    # an engine without PREWHERE (the key filter goes to WHERE there)
    ch.command(f"DROP TABLE IF EXISTS {TARGET}.dup_memory")
    ch.command(f"CREATE TABLE {TARGET}.dup_memory ENGINE = Memory AS SELECT * FROM {TARGET}.dup WHERE id != 7")
    memory = run_snapshot_diff(SnapshotDiffSpec(target=endpoints[1], old_table=f"{TARGET}.small",
                                                new_table=f"{TARGET}.dup_memory", key_columns=["id"]), spark)
    assert memory["counts"] == {"identical": 499, "changed": 0, "new": 0, "deleted": 1}, memory["counts"]


def test_tolerances_ignored_columns_and_a_source_without_binlog_access(mysql_conn, ch, endpoints, spark):
    """Floats within the tolerance and ignored columns are identical (and not applied); a user
    who may not read the binlog position still applies, one version above the copy's highest."""
    recreate_tables(mysql_conn, DB, f"CREATE TABLE {DB}.tol (id INT PRIMARY KEY, v DOUBLE NOT NULL, "
                                    "w VARCHAR(5) NULL, note VARCHAR(10) NULL)")
    with mysql_conn.cursor() as cur:
        cur.execute(f"INSERT INTO {DB}.tol SELECT seq, seq / 3, 'w', 'n' FROM {DB}.seq_1_to_1000")
        cur.execute("CREATE USER IF NOT EXISTS 'diff_reader'@'127.0.0.1' IDENTIFIED BY 'pw'")
        cur.execute(f"GRANT SELECT ON {DB}.* TO 'diff_reader'@'127.0.0.1'")
    _load(endpoints, spark, "tol", "dif.tol")
    top = ch.command(f"SELECT max(_version) FROM {TARGET}.tol")
    with mysql_conn.cursor() as cur:
        cur.execute(f"UPDATE {DB}.tol SET v = v + 0.001 WHERE id <= 5")  # within the tolerance
        cur.execute(f"UPDATE {DB}.tol SET v = v + 1 WHERE id = 6")
        cur.execute(f"UPDATE {DB}.tol SET note = 'ignored' WHERE id = 7")
        cur.execute(f"UPDATE {DB}.tol SET w = NULL WHERE id = 8")
    weak = MySQLEndpoint(endpoints[0].host, endpoints[0].port, "diff_reader", "pw")
    result = run_snapshot_diff(SnapshotDiffSpec(target=endpoints[1], old_table=f"{TARGET}.tol",
                                                sources=one_server(weak), source_database=DB, source_table="tol",
                                                tolerances={"v": 0.01}, ignore_columns=["note"],
                                                on_change="apply"), spark)
    assert result["counts"] == {"identical": 998, "changed": 2, "new": 0, "deleted": 0}
    assert result["compared"] == ["v", "w"] and result["version"] == top + 1
    copy = dict(ch.query(f"SELECT id, (v, w, note, _version) FROM {TARGET}.tol FINAL WHERE id <= 8").result_rows)
    assert copy[6][0] == pytest.approx(3.0) and copy[6][3] == top + 1 and copy[8][1] is None
    assert copy[1][0] == pytest.approx(1 / 3) and copy[7][2] == "n"  # tolerated and ignored: left alone


def test_diffs_that_share_a_change_set_take_turns_and_keep_each_others_rows(mysql_conn, ch, endpoints, spark):
    """Two diffs of one copy with different columns (so the second recreates the shared
    `<old>__changes` table) started at once, as a backfill's runs would be: each waits for the
    other's lock and both change sets end complete (without the lock, the second dropped the
    table under the first or cleared its rows)."""
    import threading

    recreate_tables(mysql_conn, DB, f"CREATE TABLE {DB}.shared (id INT PRIMARY KEY, a INT NOT NULL, b INT NOT NULL)")
    with mysql_conn.cursor() as cur:
        cur.execute(f"INSERT INTO {DB}.shared SELECT seq, seq, seq FROM {DB}.seq_1_to_50000")
    _load(endpoints, spark, "shared", "dif.shared")
    with mysql_conn.cursor() as cur:
        cur.execute(f"UPDATE {DB}.shared SET a = -a, b = -b WHERE id % 97 = 0")
    results, errors = {}, []

    def run(name, columns):
        try:
            results[name] = diff(endpoints, spark, "shared", diff_key=name, compare_columns=columns, channels=1,
                                 split_factor=4)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=("by_a", ["a"])), threading.Thread(target=run, args=("by_b", ["b"]))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    changed = 50000 // 97
    assert results["by_a"]["counts"]["changed"] == results["by_b"]["counts"]["changed"] == changed
    last = max(results.values(), key=lambda r: r["run_id"])  # the table holds the later run's columns
    stored = ch.query(f"SELECT diff_key, count() FROM {TARGET}.shared__changes GROUP BY diff_key").result_rows
    assert dict(stored)[last["diff_key"]] == changed, stored


def test_a_plan_on_a_column_whose_value_moved_a_key_between_shards(mysql_conn, ch, endpoints, spark):
    """The copy holds two versions of some keys, the older in one shard of a plan on ``grp`` and
    the newer (the source's) in another. ClickHouse may filter by the key before FINAL's merge
    (PREWHERE: every version of a key passes or none does), never by the shard's predicate: the
    older version would then stand for its key in the first shard (a false ``deleted``)."""
    recreate_tables(mysql_conn, DB, f"CREATE TABLE {DB}.moved (id INT PRIMARY KEY, grp INT NOT NULL, v INT NOT NULL, "
                                    "KEY (grp))")
    with mysql_conn.cursor() as cur:
        cur.execute(f"INSERT INTO {DB}.moved SELECT seq, seq % 10, seq FROM {DB}.seq_1_to_20000")
    _load(endpoints, spark, "moved", "dif.moved")
    with mysql_conn.cursor() as cur:
        cur.execute(f"UPDATE {DB}.moved SET grp = 9 WHERE grp = 0 AND id % 7 = 0")
        cur.execute(f"UPDATE {DB}.moved SET v = -v WHERE id = 77")  # one real change, in a moved row
    ch.command(f"INSERT INTO {TARGET}.moved SELECT id, 9, v, _version + 1, _deleted FROM {TARGET}.moved FINAL "
               "WHERE grp = 0 AND id % 7 = 0")  # (a REPLACE (9 AS grp) alias would be the WHERE's grp too)
    result = diff(endpoints, spark, "moved", split_column="grp", channels=2, split_factor=2)
    assert result["shards"] >= 4 and result["positions"] == "key"
    assert result["counts"] == {"identical": 19999, "changed": 1, "new": 0, "deleted": 0}, result["counts"]
    assert change_set(ch, "moved", ["id"]) == {(77,): ("changed", ["v"])}


def test_a_diff_replaces_only_its_own_change_set_and_leaves_no_deleted_rows_behind(mysql_conn, ch, endpoints, spark):
    """A change-set table holds a partition per diff key: a rerun drops its own partition (a
    DELETE would only mask the rows, and every later diff re-read them), another diff key's rows
    stay. A table of an earlier release (no partitions) is rebuilt so, keeping the others' rows."""
    _copied_then_negated(mysql_conn, endpoints, spark, "parts", "INT", "id % 1000 = 0")
    changes = f"{TARGET}.parts__changes"
    ch.command(f"DROP TABLE IF EXISTS {changes}")
    first = diff(endpoints, spark, "parts")
    assert first["counts"]["changed"] == ROWS // 1000
    assert ch.command(f"SELECT partition_key FROM system.tables WHERE database = '{TARGET}'"
                      " AND name = 'parts__changes'") == "diff_key"
    # as an earlier release left it: one partition, this diff's rows and another diff key's
    ch.command(f"CREATE TABLE {changes}_old AS {changes} ENGINE = MergeTree ORDER BY (diff_key, flag, id)")
    ch.command(f"INSERT INTO {changes}_old SELECT * FROM {changes}")
    ch.command(f"INSERT INTO {changes}_old SELECT * REPLACE ('other' AS diff_key) FROM {changes} LIMIT 5")
    ch.command(f"EXCHANGE TABLES {changes} AND {changes}_old")
    ch.command(f"DROP TABLE {changes}_old")
    with mysql_conn.cursor() as cur:
        cur.execute(f"UPDATE {DB}.parts SET v = -v WHERE id = 1")
    for _ in range(2):
        again = diff(endpoints, spark, "parts")
        assert again["counts"]["changed"] == ROWS // 1000 + 1
        stored = dict(ch.query(f"SELECT diff_key, count() FROM {changes} GROUP BY diff_key").result_rows)
        assert stored == {again["diff_key"]: ROWS // 1000 + 1, "other": 5}, stored
        assert ch.command(f"SELECT partition_key FROM system.tables WHERE database = '{TARGET}' "
                          "AND name = 'parts__changes'") == "diff_key"
        physical = ch.command(f"SELECT sum(rows) FROM system.parts WHERE active AND database = '{TARGET}' "
                              "AND table = 'parts__changes'")
        assert int(physical) == ROWS // 1000 + 1 + 5  # no masked rows of earlier runs left to re-read

"""`airflow-sync load / status / reimport` end to end, secrets only in the environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import assert_same_rows

pytestmark = pytest.mark.slow
CLI = str(Path(sys.executable).parent / "airflow-sync")


def run(env, *args):
    return subprocess.run([CLI, *args], env=env, capture_output=True, text=True, timeout=600)


def test_load_fails_status_names_shard_reimport_completes(mysql_conn, mysql_url, clickhouse_url, ch):
    with mysql_conn.cursor() as cur:
        cur.execute("CREATE DATABASE IF NOT EXISTS cli_db")
        cur.execute("USE cli_db")
        cur.execute("SET SESSION sql_mode = ''")
        cur.execute("DROP TABLE IF EXISTS t")
        cur.execute("CREATE TABLE t (id INT PRIMARY KEY, d DATE NOT NULL, s VARCHAR(10))")
        cur.execute("INSERT INTO t SELECT seq, '2025-01-01' + INTERVAL seq % 300 DAY, CONCAT('s', seq)"
                    " FROM seq_1_to_5000")
        cur.execute("UPDATE t SET d = '0000-00-00' WHERE id = 4321")  # one bad row in one shard
    env = dict(os.environ, MYSQL_URL=mysql_url.rstrip("/") + "/cli_db", CLICKHOUSE_URL=clickhouse_url)
    key = "cli.t"

    load = run(env, "load", "--table", "t", "--load-key", key, "--channels", "2", "--json")
    assert load.returncode == 1
    assert "column 'd'" in json.loads(load.stdout)["error"]

    status = run(env, "status", "--load", key, "--json")
    assert status.returncode == 0, status.stderr
    state = json.loads(status.stdout)
    failed = [s["shard_id"] for s in state["shards"] if s["status"] == "failed"]
    assert state["status"] == "failed" and state["verdict"] == "failed" and len(failed) == 1
    assert f"[{failed[0]}]" in state["message"] and "reimport" in state["message"]
    assert sum(s["status"] == "success" for s in state["shards"]) == state["shard_count"] - 1

    with mysql_conn.cursor() as cur:
        cur.execute("UPDATE cli_db.t SET d = '2025-06-01' WHERE id = 4321")
    again = run(env, "reimport", "--load", key, "--failed", "--json")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    result = json.loads(again.stdout)
    assert [s["shard_id"] for s in result["per_shard"]] == failed
    assert assert_same_rows(mysql_conn, ch, "cli_db", "t") == 5000

    text = run(env, "status", "--load", key)
    assert "published" in text.stdout and "success" in text.stdout and "rows/s" in text.stdout
    password = mysql_url.split(":")[2].split("@")[0]
    assert password not in load.stdout + status.stdout + again.stdout + text.stdout


def test_missing_urls_and_unknown_load_are_clear_errors(clickhouse_url):
    env = {k: v for k, v in os.environ.items() if k not in ("MYSQL_URL", "CLICKHOUSE_URL")}
    out = run(env, "status", "--load", "x")
    assert out.returncode == 2 and "--clickhouse-url or $CLICKHOUSE_URL is required" in out.stderr
    out = run(dict(env, CLICKHOUSE_URL=clickhouse_url), "status", "--load", "no-such-load")
    assert out.returncode == 2 and "no load 'no-such-load'" in out.stderr


def test_reconcile_ok_then_mismatch_marks_the_shard_and_writes_a_report(mysql_conn, mysql_url, clickhouse_url, ch,
                                                                        tmp_path):
    from airflow_sync_provider.core.ledger import Ledger

    with mysql_conn.cursor() as cur:
        cur.execute("CREATE DATABASE IF NOT EXISTS cli_db")
        cur.execute("USE cli_db")
        cur.execute("DROP TABLE IF EXISTS r")
        cur.execute("CREATE TABLE r (id BIGINT PRIMARY KEY, amount DECIMAL(12, 2) NOT NULL, note VARCHAR(20) NULL)")
        cur.execute("INSERT INTO r SELECT seq, seq / 100, IF(seq % 3 = 0, NULL, CONCAT('n', seq)) FROM seq_1_to_8000")
    env = dict(os.environ, MYSQL_URL=mysql_url.rstrip("/") + "/cli_db", CLICKHOUSE_URL=clickhouse_url)
    key = "cli.reconcile"
    assert run(env, "load", "--table", "r", "--load-key", key, "--channels", "2", "--split-factor", "5").returncode == 0

    ok = run(env, "reconcile", "--load", key, "--checksum", "--json", "--report-dir", str(tmp_path))
    assert ok.returncode == 0, ok.stderr[-2000:]
    result = json.loads(ok.stdout)
    assert result["verdict"] == "ok" and result["mismatched"] == [] and len(result["shards"]) == 11
    assert all(s["source_rows"] == s["target_rows"] == (s["records_written"] or 0) for s in result["shards"])

    # a value changed with the counts unchanged: found only by the checksum, in the shard of id 4321
    ch.command("ALTER TABLE cli_db.r UPDATE note = 'changed' WHERE id = 4321 SETTINGS mutations_sync = 2")
    counts_only = json.loads(run(env, "reconcile", "--load", key, "--json", "--report-dir", str(tmp_path)).stdout)
    assert counts_only["verdict"] == "ok"
    bad = run(env, "reconcile", "--load", key, "--checksum", "--json", "--report-dir", str(tmp_path))
    assert bad.returncode == 3
    result = json.loads(bad.stdout)
    shard = next(s["id"] for s in json.loads(json.dumps(Ledger(ch).state(key).plan))["shards"]
                 if s["where"] != "`id` IS NULL" and _holds(mysql_conn, s, 4321))
    assert result["verdict"] == "mismatch" and result["mismatched"] == [shard]
    assert Ledger(ch).state(key).shards[shard].status == "mismatch"
    page = open(result["report"], encoding="utf-8").read()
    assert "mismatch" in page and "<svg" in page and "content checksum differs" in page

    # re-import the mismatched shard into the published table, then compare again: ok
    fixed = run(env, "reconcile", "--load", key, "--checksum", "--reimport", "--json", "--report-dir", str(tmp_path))
    assert fixed.returncode == 0, fixed.stderr[-2000:]
    result = json.loads(fixed.stdout)
    assert result["before"]["mismatched"] == [shard] and result["reimported"]["repaired"] == [shard]
    assert result["verdict"] == "ok" and result["reimported"]["rows"] == result["shards"][shard]["source_rows"]
    again = run(env, "reconcile", "--load", key, "--checksum", "--json", "--report-dir", str(tmp_path))
    assert again.returncode == 0 and json.loads(again.stdout)["verdict"] == "ok"
    assert assert_same_rows(mysql_conn, ch, "cli_db", "r") == 8000


def _holds(conn, shard, row_id) -> bool:
    with conn.cursor() as cur:
        cur.execute(f"SELECT COUNT(*) FROM cli_db.r WHERE id = %s AND ({shard['where']})", (row_id, *shard["params"]))
        return cur.fetchone()[0] == 1


def _attempts(ch, key: str) -> list[tuple]:
    """Every (generation, shard, attempt) the ledger holds for a load: a shard read again adds one."""
    return ch.query("SELECT DISTINCT generation, shard_id, attempt, status, records_read FROM airflow_sync.shards "
                    "FINAL WHERE load_key = {k:String} ORDER BY generation, shard_id, attempt",
                    parameters={"k": key}).result_rows


def test_a_pattern_load_run_again_goes_on_where_it_stopped(mysql_conn, mysql_url, clickhouse_url, ch):
    """Issue 38, part 4: `airflow-sync load --database … --load-key K` run again after a table failed
    reads no shard of the tables it published (they are `skipped`); the failed table resumes from
    its failed shard. A failed table is one line on stderr, its traceback in the log file."""
    from tests.helpers import run_sql as sql

    sql(mysql_conn, "DROP DATABASE IF EXISTS rdb", "CREATE DATABASE rdb", "SET SESSION sql_mode = ''",
        "CREATE TABLE rdb.a (id INT PRIMARY KEY, v VARCHAR(10))",
        "INSERT INTO rdb.a SELECT seq, seq FROM rdb.seq_1_to_3000",
        "CREATE TABLE rdb.b (id INT PRIMARY KEY, v VARCHAR(10))",
        "INSERT INTO rdb.b SELECT seq, seq FROM rdb.seq_1_to_1000",
        "CREATE TABLE rdb.bad (id INT PRIMARY KEY, d DATE NOT NULL)",
        "INSERT INTO rdb.bad SELECT seq, '2025-01-01' + INTERVAL seq % 300 DAY FROM rdb.seq_1_to_3000",
        "UPDATE rdb.bad SET d = '0000-00-00' WHERE id = 2500")  # one bad row in one shard
    env = dict(os.environ, MYSQL_URL=mysql_url, CLICKHOUSE_URL=clickhouse_url)
    args = ["load", "--database", "rdb", "--target-database", "rdb_ch", "--load-key", "K", "--split-factor", "3"]
    log_file = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"airflow-sync-test-{os.getpid()}.log")

    first = run(env, *args, "--log-file", log_file)
    assert first.returncode == 1
    lines = first.stderr.splitlines()
    assert "Traceback" not in first.stderr + first.stdout and not any(line.startswith("  File ") for line in lines)
    failed = [line for line in lines if line.startswith("airflow-sync:   ")]
    assert len(failed) == 1 and failed[0].startswith("airflow-sync:   rdb.bad: LoadFailed: table rdb.bad: shards ["), \
        first.stderr
    assert "column 'd'" in failed[0]
    assert "airflow-sync: load failed for 1 of 3 table(s) (the others succeeded); run the same command again" \
        in first.stderr
    assert f"tracebacks included: {log_file}" in first.stderr
    log = open(log_file, encoding="utf-8").read()
    assert "Traceback (most recent call last)" in log and "rdb.bad: FAILED: LoadFailed" in log
    assert oct(os.stat(log_file).st_mode & 0o777) == "0o600"
    published = {t: _attempts(ch, f"K:rdb.{t}") for t in ("a", "b")}
    assert all(published.values()) and all(r[0] == 1 and r[2] == 1 and r[3] == "success"
                                           for rows in published.values() for r in rows)
    status = run(env, "status", "--load", "K")  # the load of many tables: each one's state
    assert status.returncode == 0 and "load 'K', 3 table(s) — failed" in status.stdout, status.stderr
    assert "K:rdb.a: generation 1 published" in status.stdout and "K:rdb.bad: generation 1 failed" in status.stdout
    bad_before = _attempts(ch, "K:rdb.bad")
    bad_shard = [r[1] for r in bad_before if r[3] == "failed"]
    assert len(bad_shard) == 1

    sql(mysql_conn, "UPDATE rdb.bad SET d = '2025-06-01' WHERE id = 2500")
    again = run(env, *args, "--json")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    tables = {t["table"]: t for t in json.loads(again.stdout)["tables"]}
    assert tables["rdb.a"]["skipped"] and tables["rdb.b"]["skipped"] and not tables["rdb.bad"].get("skipped")
    assert tables["rdb.bad"]["shards_read"] == 1 and tables["rdb.bad"]["generation"] == 1
    # no shard of a published table was read again: the ledger holds the same attempts, nothing new
    assert {t: _attempts(ch, f"K:rdb.{t}") for t in ("a", "b")} == published
    bad_after = _attempts(ch, "K:rdb.bad")
    assert [r[1:3] for r in bad_after if r[2] == 2] == [(bad_shard[0], 2)]
    assert all(r[2] == 1 for r in bad_after if r[1] != bad_shard[0])
    for name in ("a", "b", "bad"):
        assert_same_rows(mysql_conn, ch, "rdb", name, "rdb_ch")

    # the run finished: the same command once more is a new run, which copies every table afresh
    fresh = json.loads(run(env, *args, "--json").stdout)
    assert not any(t.get("skipped") for t in fresh["tables"]) and {t["generation"] for t in fresh["tables"]} == {2}

    # one verdict for the tables beside their own (`reconcile --json`), match only if every one matched
    check = ["reconcile", "--load", "K", "--database", "rdb", "--target-database", "rdb_ch", "--checksum", "--json"]
    ok = run(env, *check)
    assert ok.returncode == 0 and json.loads(ok.stdout)["verdict"] == "ok", ok.stderr[-2000:]
    sql(mysql_conn, "UPDATE rdb.b SET v = 'changed' WHERE id = 10")
    bad = run(env, *check)
    result = json.loads(bad.stdout)
    assert bad.returncode == 3 and result["verdict"] == "mismatch"
    assert {t["table"]: t["verdict"] for t in result["tables"]} == {"rdb.a": "ok", "rdb.b": "mismatch", "rdb.bad": "ok"}


def test_reconcile_of_a_keyless_copy_after_the_source_got_a_key(mysql_conn, mysql_url, clickhouse_url, ch):
    """Issue 38, part 3, as reported: the documented remedy for a table without a key (ADD PRIMARY
    KEY) made the reconciliation of its plain MergeTree copy exit 1 with ILLEGAL_FINAL."""
    from tests.helpers import run_sql as sql

    sql(mysql_conn, "DROP DATABASE IF EXISTS kdb2", "CREATE DATABASE kdb2",
        "CREATE TABLE kdb2.n (id INT NOT NULL, v VARCHAR(10) NULL)",
        "INSERT INTO kdb2.n SELECT seq, CONCAT('v', seq) FROM kdb2.seq_1_to_2000")
    env = dict(os.environ, MYSQL_URL=mysql_url, CLICKHOUSE_URL=clickhouse_url)
    load = run(env, "load", "--database", "kdb2", "--target-database", "kdb2_ch", "--load-key", "K2")
    assert load.returncode == 0, load.stderr[-2000:]
    sql(mysql_conn, "ALTER TABLE kdb2.n ADD PRIMARY KEY (id)")

    check = ["reconcile", "--load", "K2", "--database", "kdb2", "--target-database", "kdb2_ch", "--checksum"]
    text = run(env, *check)
    assert text.returncode == 0, text.stdout[-2000:] + text.stderr[-2000:]
    assert "ILLEGAL_FINAL" not in text.stdout + text.stderr
    assert "note: the copy is a plain MergeTree" in text.stdout and "verdict: ok" in text.stdout
    result = json.loads(run(env, *check, "--json").stdout)
    assert result["verdict"] == "ok" and result["tables"][0]["shape"]["final"] is False
    assert result["tables"][0]["shards"][0]["target_rows"] == 2000


def test_cdc_bootstrap_puts_the_copy_into_the_target_database_given(mysql_conn, mysql_url, clickhouse_url, ch):
    """`cdc bootstrap --table db.t --target-database x` copies into x (an option is honoured or
    refused, never ignored: before, the copy landed in the source's database)."""
    with mysql_conn.cursor() as cur:
        cur.execute("CREATE DATABASE IF NOT EXISTS cli_boot")
        cur.execute("DROP TABLE IF EXISTS cli_boot.t")
        cur.execute("CREATE TABLE cli_boot.t (id INT PRIMARY KEY, s VARCHAR(10))")
        cur.execute("USE cli_boot")
        cur.execute("INSERT INTO t SELECT seq, CONCAT('s', seq) FROM seq_1_to_300")
    env = dict(os.environ, MYSQL_URL=mysql_url, CLICKHOUSE_URL=clickhouse_url)
    boot = run(env, "cdc", "bootstrap", "--pipeline", "cli-boot", "--table", "cli_boot.t",
               "--target-database", "cli_boot_elsewhere")
    assert boot.returncode == 0, boot.stdout[-2000:] + boot.stderr[-2000:]
    assert assert_same_rows(mysql_conn, ch, "cli_boot", "t", "cli_boot_elsewhere") == 300
    assert not ch.command("EXISTS TABLE cli_boot.t")


def test_a_copy_laid_out_from_the_command_line_refused_otherwise_then_reshaped(mysql_conn, mysql_url, clickhouse_url,
                                                                               ch):
    """`load --order-by … --partition-by … --table-setting …` lays the copy out; a load asking for
    another layout is refused naming both; `reshape` lays the followed copy out anew."""
    with mysql_conn.cursor() as cur:
        cur.execute("CREATE DATABASE IF NOT EXISTS cli_lay")
        cur.execute("DROP TABLE IF EXISTS cli_lay.t")
        cur.execute("CREATE TABLE cli_lay.t (id INT PRIMARY KEY, tenant INT, day DATE)")
        cur.execute("INSERT INTO cli_lay.t SELECT seq, seq % 5, '2025-01-01' + INTERVAL seq DAY "
                    "FROM cli_lay.seq_1_to_400")
    env = dict(os.environ, MYSQL_URL=mysql_url, CLICKHOUSE_URL=clickhouse_url)
    layout = ["--order-by", "tenant", "--partition-by", "toYYYYMM(day)", "--table-setting", "index_granularity=1024"]
    load = run(env, "load", "--database", "cli_lay", "--table", "t", "--target-database", "cli_lay_ch",
               "--load-key", "cli-lay", *layout)
    assert load.returncode == 0, load.stdout[-2000:] + load.stderr[-2000:]
    facts = ("SELECT sorting_key, partition_key, engine_full FROM system.tables WHERE database = 'cli_lay_ch' AND "
             "name = 't'")
    sorting, partition, engine = ch.query(facts).result_rows[0]
    assert (sorting, partition) == ("tenant, toYYYYMM(day), id", "toYYYYMM(day)")
    # tenant and day may hold NULL (MySQL's default): ClickHouse needs allow_nullable_key for them
    assert "index_granularity = 1024" in engine and "allow_nullable_key = 1" in engine
    other = run(env, "load", "--database", "cli_lay", "--table", "t", "--target-database", "cli_lay_ch",
                "--load-key", "cli-lay-2", "--order-by", "day")
    assert other.returncode != 0 and 'laid out as {"order_by": ["tenant"]' in other.stdout + other.stderr
    follow = run(env, "cdc", "apply", "--pipeline", "cli-lay", "--start-from-load", "cli-lay")
    assert follow.returncode == 0, follow.stdout[-2000:] + follow.stderr[-2000:]
    with mysql_conn.cursor() as cur:
        cur.execute("UPDATE cli_lay.t SET tenant = tenant + 10, day = day + INTERVAL 45 DAY WHERE id % 3 = 0")
    reshape = run(env, "reshape", "--pipeline", "cli-lay", "--table", "cli_lay.t", "--target-database", "cli_lay_ch",
                  "--order-by", "day")
    assert reshape.returncode == 0 and "laid out anew: cli_lay.t" in reshape.stdout, reshape.stdout + reshape.stderr
    assert ch.query(facts).result_rows[0][:2] == ("day, id", "")
    assert assert_same_rows(mysql_conn, ch, "cli_lay", "t", "cli_lay_ch") == 400
    status = run(env, "cdc", "status", "--pipeline", "cli-lay")
    assert 'cli_lay.t: laid out as {"order_by": ["day"]}' in status.stdout, status.stdout + status.stderr
    as_json = json.loads(run(env, "cdc", "status", "--pipeline", "cli-lay", "--json").stdout)
    assert as_json["layouts"] == {"cli_lay.t": {"order_by": ["day"]}}

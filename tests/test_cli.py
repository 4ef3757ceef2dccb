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
        cur.execute("INSERT INTO t SELECT seq, '2025-01-01' + INTERVAL seq % 300 DAY, CONCAT('s', seq) FROM seq_1_to_5000")
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

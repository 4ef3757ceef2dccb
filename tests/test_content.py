"""Copies that hold what they should (core/content/): hashed, masked, nulled, truncated columns, a
standing row filter and kept deletes — through every path (load, bootstrap, CDC, diff apply,
repair) and proved by every check (reconcile, the diff, rolling verification).

The expected copy is computed here in plain Python from the source's rows (hashlib, slicing, a
lambda for the filter), independently of the package's two renderings of each transform; the
package's own agreement of those renderings is tests/test_content_transforms.py's, and of the
filter with MySQL tests/test_content_row_filter.py's."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
import time

import pytest

from airflow_sync_provider.core.content import ContentError
from airflow_sync_provider.core.content.shaping import Content, check_same, content_comment, stored
from airflow_sync_provider.core.jobspec import (
    CdcApplySpec,
    CdcBootstrapSpec,
    FullLoadSpec,
    ReconcileSpec,
    SnapshotDiffSpec,
)
from airflow_sync_provider.core.selection import TableSet
from airflow_sync_provider.core.source.group import one_server
from airflow_sync_provider.core.specfile import public_dict

DB, TARGET = "shape", "shape_ch"
SALT = "s3cr3t-ß-'quote\"-salt"
CONTENT = {"transform": {"email": "hash", "phone": "mask(0,4)", "note": "null", "bio": "truncate(5)",
                         "name": "redact('***')"},
           "row_filter": "tenant <> 3 AND status <> 'test'", "on_delete": "keep"}


# --- the settings (fast) -----------------------------------------------------------------------

def test_content_settings_round_trip_and_unknown_options_are_refused_by_name():
    content = Content.of(CONTENT)
    assert Content.of(content.to_dict()) == content and content.keep_deletes and content.hashes
    assert Content.of({"transform": ["email=hash", "phone = mask(0, 4)"]}).transform == (
        ("email", "hash"), ("phone", "mask(0, 4)"))
    with pytest.raises(ContentError, match=r"unknown option\(s\) \['filter'\]"):
        Content.of({"filter": "x = 1"})
    with pytest.raises(ContentError, match="on_delete='archive'"):
        Content.of({"on_delete": "archive"})
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['row_filtr'\]"):
        TableSet(select={"databases": ["d"], "row_filtr": "x"})
    # a table's entry goes over the job's: by column for transforms
    tableset = TableSet(content={"transform": {"a": "null"}, "on_delete": "keep"},
                        tables=[{"source_database": "d", "source_table": "t", "transform": {"b": "hash"},
                                 "row_filter": "x = 1"}])
    table = tableset.configured().tables[0]
    assert tableset.content_of(table) == Content((("a", "null"), ("b", "hash")), "x = 1", "keep")


def test_the_comment_keeps_the_settings_and_a_salt_fingerprint_never_the_salt():
    content = Content.of(CONTENT)
    comment = "airflow_sync version=2" + content_comment(content, SALT.encode())
    assert SALT not in comment and SALT.encode().hex() not in comment
    assert stored(comment)[0] == content
    check_same("d.t", content, SALT.encode(), comment)
    with pytest.raises(ContentError, match="another salt"):
        check_same("d.t", content, b"other", comment)
    with pytest.raises(ContentError, match=r"holds \{.*\} but this job asks for the source's rows.*reshape"):
        check_same("d.t", Content(), b"", comment)


def test_the_salt_is_masked_in_the_public_spec():
    from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint

    spec = FullLoadSpec(sources=one_server(MySQLEndpoint(host="h")), target=ClickHouseEndpoint(host="h"),
                        source_database="d", source_table="t", target_database="d", target_table="t",
                        tableset=TableSet(content=CONTENT), hash_salt=SALT)
    assert SALT not in str(public_dict(spec)) and public_dict(spec)["hash_salt"] == "***"
    assert SALT not in repr(spec)


# --- on the real services ------------------------------------------------------------------------

def _source(mysql_conn, table: str, rows: int = 2000) -> None:
    with mysql_conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE IF NOT EXISTS {DB}")
        cur.execute(f"DROP TABLE IF EXISTS {DB}.{table}")
        cur.execute(f"CREATE TABLE {DB}.{table} (id INT PRIMARY KEY, tenant INT NOT NULL, status VARCHAR(10) NOT NULL,"
                    " name VARCHAR(40), email VARCHAR(100), phone VARCHAR(20), note VARCHAR(50), bio TEXT,"
                    " KEY (tenant)) DEFAULT CHARSET utf8mb4")
        cur.execute(f"INSERT INTO {DB}.{table} SELECT seq, seq % 5, ELT(1 + seq % 4, 'new', 'paid', 'test', 'Test'),"
                    " CONCAT('Name ', seq), IF(seq % 9 = 0, NULL, CONCAT('user', seq, '@example.com')),"
                    " CONCAT('+49 ', seq * 7919, IF(seq % 3 = 0, '😀', '')), CONCAT('n', seq),"
                    " IF(seq % 6 = 0, '', CONCAT('Ünïcødé 😀 bio ', seq)) "
                    f"FROM {DB}.seq_1_to_{rows}")


def _mask(value: str | None, first: int, last: int) -> str | None:
    if value is None:
        return None
    if len(value) <= first + last:
        return "*" * len(value)
    return value[:first] + "*" * (len(value) - first - last) + value[len(value) - last:]


def _expected(mysql_conn, table: str) -> dict:
    """The source's rows as the copy should hold them: filtered and transformed, by key."""
    out = {}
    with mysql_conn.cursor() as cur:
        cur.execute(f"SELECT id, tenant, status, name, email, phone, note, bio FROM {DB}.{table}")
        for id_, tenant, status, name, email, phone, _note, bio in cur.fetchall():
            if tenant == 3 or status.lower() == "test":  # utf8mb4_general_ci: 'Test' = 'test'
                continue
            out[id_] = (id_, tenant, status, None if name is None else "***",
                        None if email is None else hashlib.sha256(SALT.encode() + email.encode()).hexdigest(),
                        _mask(phone, 0, 4), None, None if bio is None else bio[:5])
    return out


def _copy(ch, table: str) -> tuple[dict, dict]:
    """The copy's live rows and its kept rows (deleted at the source), by key."""
    rows = ch.query(f"SELECT id, tenant, status, name, email, phone, note, bio, _deleted_at_source "
                    f"FROM `{TARGET}`.`{table}` FINAL").result_rows
    live = {r[0]: tuple(r[:8]) for r in rows if r[8].year == 1970}
    kept = {r[0]: tuple(r[:8]) for r in rows if r[8].year > 1970}
    assert len(live) + len(kept) == len(rows)
    return live, kept


def _tableset(table: str, content: dict | None = CONTENT) -> TableSet:
    return TableSet(tables=[{"source_database": DB, "source_table": table, "target_database": TARGET}],
                    content=content)


def _load(endpoints, spark, table: str, content: dict | None = CONTENT, salt: str = SALT) -> str:
    from airflow_sync_provider.spark.full_load import run_full_load

    key = f"shape.{table}"
    run_full_load(FullLoadSpec(sources=one_server(endpoints[0]), target=endpoints[1], source_database=DB,
                               source_table=table, target_database=TARGET, target_table=table, load_key=key,
                               channels=2, split_factor=2, tableset=TableSet(content=content), hash_salt=salt), spark)
    return key


def _apply(endpoints, spark, pipeline: str, **kwargs) -> dict:
    from airflow_sync_provider.spark.cdc_apply import run_cdc_apply

    return run_cdc_apply(CdcApplySpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline=pipeline,
                                      lanes=2, hash_salt=SALT, **kwargs), spark)


def _reconcile(endpoints, spark, key: str, reimport: bool = False) -> dict:
    from airflow_sync_provider.spark.reconcile import run_reconcile

    return run_reconcile(ReconcileSpec(sources=one_server(endpoints[0]), target=endpoints[1], load_key=key,
                                       checksum=True, reimport=reimport, hash_salt=SALT), spark)


def _changes(mysql_conn, table: str) -> set:
    """Updates of hashed and masked columns, rows moved out of the filter and into it (also by a
    case variant the collation makes equal), deletes of rows in the copy and out of it, a key
    deleted and inserted again, inserts in and out of the filter. Returns the keys the copy must
    keep (deleted at the source while it held them)."""
    t = f"{DB}.{table}"
    with mysql_conn.cursor() as cur:
        cur.execute(f"UPDATE {t} SET email = CONCAT('new', id, '@example.org') WHERE id % 4 = 1")
        cur.execute(f"UPDATE {t} SET phone = CONCAT(phone, '9😀') WHERE id % 5 = 2")
        cur.execute(f"UPDATE {t} SET tenant = 3 WHERE id % 10 = 1")  # out of the filter
        cur.execute(f"UPDATE {t} SET tenant = 1 WHERE tenant = 3 AND id % 7 = 0")  # in
        cur.execute(f"UPDATE {t} SET status = 'TEST' WHERE id % 13 = 0")  # out: equal to 'test' under _ci
        cur.execute(f"UPDATE {t} SET status = 'paid' WHERE status = 'Test' AND id % 3 = 0")  # in
        cur.execute(f"SELECT id FROM {t} WHERE tenant <> 3 AND status <> 'test' AND id % 11 = 0")
        kept = {r[0] for r in cur.fetchall()}  # the rows the copy holds when they are deleted
        cur.execute(f"DELETE FROM {t} WHERE id % 11 = 0")  # kept where the copy held them
        cur.execute("BEGIN")
        cur.execute(f"DELETE FROM {t} WHERE id = 2")
        cur.execute(f"INSERT INTO {t} VALUES (2, 1, 'new', 'Back', 'back@example.com', '123456', 'x', 'again')")
        cur.execute("COMMIT")
        cur.execute(f"INSERT INTO {t} VALUES (900001, 1, 'new', NULL, NULL, NULL, NULL, NULL), "
                    "(900002, 3, 'new', 'out', 'out@x', '1', 'x', 'x')")
    return kept - {2}


@pytest.mark.slow
@pytest.mark.parametrize("decoder", ["native", "reference"])
def test_load_and_cdc_hold_the_shaped_rows_and_keep_deletes_and_the_checks_prove_it(
        decoder, mysql_conn, ch, endpoints, spark, monkeypatch, clickhouse_url, capsys):
    if decoder == "reference":  # python-mysql-replication's values, not the compiled row images
        from airflow_sync_provider.core.cdc import rowimage

        monkeypatch.setattr(rowimage.Decoders, "get", lambda self, event, route: None)
    table = f"people_{decoder}"
    _source(mysql_conn, table)
    key = _load(endpoints, spark, table)
    live, kept = _copy(ch, table)
    assert live == _expected(mysql_conn, table) and not kept
    types = dict(ch.query(f"SELECT name, type FROM system.columns WHERE database = '{TARGET}' AND table = '{table}'"
                          ).result_rows)
    assert types["email"] == "Nullable(String)" and types["note"] == "Nullable(String)"
    assert SALT not in str(ch.command(f"SELECT comment FROM system.tables WHERE database = '{TARGET}' AND "
                                      f"name = '{table}'"))
    assert _reconcile(endpoints, spark, key)["verdict"] == "ok"

    _apply(endpoints, spark, table, start_from_loads=[key], verify_period=0)
    expected_kept = _changes(mysql_conn, table)
    result = _apply(endpoints, spark, table, verify=True)
    live, kept = _copy(ch, table)
    expected = _expected(mysql_conn, table)
    assert live.keys() == expected.keys(), (sorted(live.keys() - expected.keys())[:5],
                                            sorted(expected.keys() - live.keys())[:5])
    assert live == expected
    assert kept.keys() == expected_kept
    assert all(row[4] is None or len(row[4]) == 64 for row in kept.values())  # kept rows are shaped too
    [look] = [v for v in result["verified"] if v["table"] == f"{DB}.{table}"]  # rolling verification
    assert look["mismatched"] == [] and result["repaired_shards"] == 0, look
    verdict = _reconcile(endpoints, spark, key)
    assert verdict["verdict"] == "ok" and verdict["kept"] == len(expected_kept), verdict
    if decoder == "native":  # cdc status and the Sync view say what the copy holds, never the salt
        from airflow_sync_provider.cli import main
        from airflow_sync_provider.core.cdc.checkpoints import Checkpoints
        from airflow_sync_provider.core.overview import PipelineRow
        from airflow_sync_provider.plugins.pages import pipeline_html

        assert main(["cdc", "status", "--pipeline", table, "--clickhouse-url", clickhouse_url]) == 0
        out = capsys.readouterr().out
        assert (f"{DB}.{table}: holds bio: truncate(5), email: hash, name: redact('***'), note: null, phone: mask(0, "
                f"4); rows where {CONTENT['row_filter']}; deletes kept (_deleted_at_source)") in out, out
        page = pipeline_html(PipelineRow(Checkpoints(ch).state(table), None, None))
        assert "What the copies hold" in page and "email: hash" in page and SALT not in out + page


@pytest.mark.slow
def test_a_skipped_transform_or_a_row_let_through_is_found_and_repaired(mysql_conn, ch, endpoints, spark):
    """The checks compare the shaped copy: a row whose email was written in the clear, and a row
    the filter leaves out, are mismatches; the reconcile's re-import and the diff apply repair them,
    and a row the copy keeps stays kept through both."""
    table = "people_drift"
    _source(mysql_conn, table, rows=600)
    key = _load(endpoints, spark, table)
    with mysql_conn.cursor() as cur:
        cur.execute(f"DELETE FROM {DB}.{table} WHERE id = 5")
    _apply(endpoints, spark, table, start_from_loads=[key], verify_period=0)
    _apply(endpoints, spark, table, verify_period=0)
    assert _copy(ch, table)[1].keys() == {5}
    name = f"`{TARGET}`.`{table}`"
    ch.command(f"INSERT INTO {name} (id, tenant, status, name, email, phone, note, bio, _version) SELECT id, tenant, "
               f"status, name, 'user1@example.com', phone, note, bio, _version + 1 FROM {name} FINAL WHERE id = 1")
    ch.command(f"INSERT INTO {name} (id, tenant, status, name, _version) VALUES (3, 3, 'new', '***', 1)")
    verdict = _reconcile(endpoints, spark, key)
    assert verdict["verdict"] == "mismatch", verdict
    assert _reconcile(endpoints, spark, key, reimport=True)["verdict"] == "ok"
    live, kept = _copy(ch, table)
    # a copy that keeps deletes loses no row to a repair: the row it should not hold is kept, marked
    assert live == _expected(mysql_conn, table) and kept.keys() == {3, 5}

    from airflow_sync_provider.spark.diff import run_snapshot_diff

    ch.command(f"INSERT INTO {name} (id, tenant, status, name, email, _version) SELECT id, tenant, status, name, "
               f"'in the clear', _version + 1 FROM {name} FINAL WHERE id = 4")
    with mysql_conn.cursor() as cur:  # the binlog moves on: the diff's version outranks the row written above
        cur.execute(f"CREATE TABLE IF NOT EXISTS {DB}.tick (n INT)")
        cur.execute(f"INSERT INTO {DB}.tick VALUES (1)")
    diff = run_snapshot_diff(SnapshotDiffSpec(sources=one_server(endpoints[0]), target=endpoints[1],
                                              old_table=f"{TARGET}.{table}", source_database=DB, source_table=table,
                                              on_change="apply", hash_salt=SALT), spark)
    assert diff["counts"]["changed"] == 1 and diff["counts"]["new"] == 0 and diff["counts"]["deleted"] == 0, diff
    live, kept = _copy(ch, table)
    assert live == _expected(mysql_conn, table) and kept.keys() == {3, 5}


@pytest.mark.slow
def test_a_bootstrap_under_writes_holds_the_shaped_rows(mysql_url, mysql_conn, ch, endpoints, spark):
    import pymysql

    from airflow_sync_provider.core.endpoints import MySQLEndpoint
    from airflow_sync_provider.spark.cdc_bootstrap import run_cdc_bootstrap

    table = "people_boot"
    _source(mysql_conn, table, rows=20000)
    stop, writes = threading.Event(), [0]

    def writer():
        conn = pymysql.connect(**MySQLEndpoint.from_url(mysql_url).connect_args(), autocommit=True)
        with conn.cursor() as cur:
            step = 0
            while not stop.is_set():
                step += 1
                cur.execute(f"UPDATE {DB}.{table} SET tenant = (tenant + 1) %% 5, email = CONCAT('w', %s, email) "
                            "WHERE id BETWEEN %s AND %s", (step, step * 97 % 19900, step * 97 % 19900 + 20))
                writes[0] += cur.rowcount
        conn.close()

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        while writes[0] < 100 and thread.is_alive():  # the writer is under way before the first chunk
            time.sleep(0.01)
        run_cdc_bootstrap(CdcBootstrapSpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline=table,
                                           tableset=_tableset(table), channels=2, chunk_rows=400, hash_salt=SALT),
                          spark)
    finally:
        stop.set()
        thread.join()
    assert writes[0] > 500
    _apply(endpoints, spark, table, verify_period=0)
    live, kept = _copy(ch, table)
    assert live == _expected(mysql_conn, table) and not kept


@pytest.mark.slow
def test_a_bootstrap_read_by_mysqlclient_hashes_with_the_salt(mysql_conn, ch, endpoints, spark, monkeypatch):
    """The reader a TLS source always gets (and a table whose probe differs): its session hashes
    with the job's salt. Its bootstrap once read with no salt set, and MySQL's SHA2(CONCAT(NULL,
    …)) made every hashed value of the copy NULL."""
    from airflow_sync_provider.core.source import reader
    from airflow_sync_provider.spark.cdc_bootstrap import run_cdc_bootstrap

    monkeypatch.setattr(reader, "choose_reader", lambda *args, **kwargs: (reader.MYSQLCLIENT, "mysqlclient (test)"))
    table = "people_text"
    _source(mysql_conn, table, rows=3000)
    run_cdc_bootstrap(CdcBootstrapSpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline=table,
                                       tableset=_tableset(table), channels=2, chunk_rows=400, hash_salt=SALT), spark)
    live, kept = _copy(ch, table)
    assert live == _expected(mysql_conn, table) and not kept
    assert sum(1 for row in live.values() if row[4] is not None) > 1000  # hashed, not NULL


@pytest.mark.slow
def test_a_truncate_marks_every_kept_row_and_a_reload_carries_them_over(mysql_conn, ch, endpoints, spark):
    table = "people_truncate"
    _source(mysql_conn, table, rows=300)
    key = _load(endpoints, spark, table)
    _apply(endpoints, spark, table, start_from_loads=[key], verify_period=0)
    held = _expected(mysql_conn, table)
    with mysql_conn.cursor() as cur:
        cur.execute(f"TRUNCATE TABLE {DB}.{table}")
        cur.execute(f"INSERT INTO {DB}.{table} VALUES (1, 1, 'new', 'A', 'a@x', '12345', 'x', 'back')")
    _apply(endpoints, spark, table, verify_period=0)
    live, kept = _copy(ch, table)
    assert live == _expected(mysql_conn, table) and kept.keys() == held.keys() - {1}
    # a full reload swaps in a fresh table: the kept rows come along, and a row the source lost
    # without the copy seeing it (key 1: no CDC ran since) is kept too, marked at that load
    with mysql_conn.cursor() as cur:
        cur.execute(f"DELETE FROM {DB}.{table}")
        cur.execute(f"INSERT INTO {DB}.{table} VALUES (7, 1, 'new', 'B', 'b@x', '12345', 'x', 'seven')")
    _load(endpoints, spark, table)
    live, kept = _copy(ch, table)
    assert live == _expected(mysql_conn, table) and kept.keys() == held.keys() - {7}


@pytest.mark.slow
def test_refusals_name_the_setting(mysql_conn, ch, endpoints, spark):
    table = "people_refused"
    _source(mysql_conn, table, rows=50)
    with pytest.raises(ContentError, match=r"key column\(s\) \['id'\] cannot be transformed"):
        _load(endpoints, spark, table, {"transform": {"id": "hash"}})
    with pytest.raises(ContentError, match="column .tenant.: transform mask"):
        _load(endpoints, spark, table, {"transform": {"tenant": "mask(1,1)"}})
    with pytest.raises(ContentError, match="salt"):
        _load(endpoints, spark, table, {"transform": {"email": "hash"}}, salt="")
    with pytest.raises(ContentError, match="LIKE|like"):
        _load(endpoints, spark, table, {"row_filter": "name LIKE 'a%'"})
    _load(endpoints, spark, table)
    with pytest.raises(ContentError, match="holds .* but this job asks for"):
        _load(endpoints, spark, table, {"transform": {"email": "null"}})
    with pytest.raises(ContentError, match="another salt"):
        _load(endpoints, spark, table, salt="another")


@pytest.mark.slow
def test_the_salt_reaches_no_argv_log_or_ledger(mysql_url, clickhouse_url, ch, mysql_conn, tmp_path):
    """The CLI load with --hash-salt-env: while it runs no process's command line holds the salt,
    nor does its log file, the ledger's rows, or the copy's comment."""
    table = "people_cli"
    _source(mysql_conn, table, rows=200)
    log_file = tmp_path / "load.log"
    env = {**os.environ, "MYSQL_URL": mysql_url, "CLICKHOUSE_URL": clickhouse_url, "SHAPE_SALT": SALT}
    process = subprocess.Popen(
        [sys.executable, "-m", "airflow_sync_provider.cli", "load", "--database", DB, "--table", table,
         "--target-database", TARGET, "--load-key", "shape.cli", "--transform", "email=hash",
         "--transform", "phone=mask(0,4)", "--row-filter", "tenant <> 3", "--hash-salt-env", "SHAPE_SALT",
         "--log-file", str(log_file)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    seen = 0
    while process.poll() is None:
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as fh:
                        assert SALT.encode() not in fh.read(), f"process {pid} has the salt on its command line"
                        seen += 1
                except OSError:
                    continue
    output = process.stdout.read().decode()
    assert process.returncode == 0, output
    assert seen > 0 and SALT not in output and SALT not in log_file.read_text()
    for table_name in ("loads", "shards"):
        text = str(ch.query(f"SELECT * FROM airflow_sync.{table_name} FINAL").result_rows)
        assert SALT not in text and SALT.encode().hex() not in text
    with mysql_conn.cursor() as cur:
        cur.execute(f"SELECT email FROM {DB}.{table} WHERE id = 1")
        email = cur.fetchone()[0]
    assert ch.command(f"SELECT email FROM `{TARGET}`.`{table}` FINAL WHERE id = 1") == hashlib.sha256(
        SALT.encode() + email.encode()).hexdigest()


def test_the_salt_stays_out_of_the_spec_file_and_reaches_the_driver_by_its_environment(tmp_path, monkeypatch):
    from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
    from airflow_sync_provider.core.specfile import read_spec
    from airflow_sync_provider.core.submission import SALT_ENV, salt_from_env, stage

    spec = FullLoadSpec(sources=one_server(MySQLEndpoint(host="h", password="pw")), target=ClickHouseEndpoint(host="h"),
                        source_database="d", source_table="t", target_database="d", target_table="t",
                        tableset=TableSet(content=CONTENT), hash_salt=SALT)
    staged = stage(spec, str(tmp_path), "local[2]")
    written = (tmp_path / "spec.json").read_text()
    assert SALT not in written and '"pw"' in written and spec.hash_salt == SALT  # the caller's spec keeps it
    assert staged.env_vars[SALT_ENV] == SALT and SALT not in " ".join(staged.application_args)
    again = read_spec(str(tmp_path / "spec.json"))
    monkeypatch.setenv(SALT_ENV, SALT)
    salt_from_env(again)
    assert again.hash_salt == SALT


@pytest.mark.slow
def test_a_filtered_copy_read_as_one_slice_is_checked_on_the_filters_rows(mysql_conn, ch, endpoints, spark):
    """A table keyed by a collated string whose copy holds no weights is compared as one slice
    (the diff, the rolling verification): that slice is the filter's rows too, else every row the
    filter leaves out reads as missing and a repair writes it into the copy."""
    from airflow_sync_provider.spark.diff import run_snapshot_diff
    from airflow_sync_provider.spark.full_load import run_full_load

    table = "one_slice"
    with mysql_conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE IF NOT EXISTS {DB}")
        cur.execute(f"DROP TABLE IF EXISTS {DB}.{table}")
        cur.execute(f"CREATE TABLE {DB}.{table} (code VARCHAR(20) PRIMARY KEY, n INT NOT NULL, "
                    "status VARCHAR(10) NOT NULL, KEY (n)) DEFAULT CHARSET utf8mb4")
        cur.execute(f"INSERT INTO {DB}.{table} SELECT CONCAT('c', seq), seq, ELT(1 + seq % 3, 'new', 'test', 'paid') "
                    f"FROM {DB}.seq_1_to_600")
    content = {"row_filter": "status <> 'test'"}
    key = f"shape.{table}"
    run_full_load(FullLoadSpec(sources=one_server(endpoints[0]), target=endpoints[1], source_database=DB,
                               source_table=table, target_database=TARGET, target_table=table, load_key=key,
                               channels=1, split_column="n", tableset=TableSet(content=content)), spark)
    assert "_split_weight" not in {r[0] for r in ch.query(
        f"SELECT name FROM system.columns WHERE database = '{TARGET}' AND table = '{table}'").result_rows}
    with mysql_conn.cursor() as cur:
        cur.execute(f"UPDATE {DB}.{table} SET status = 'test' WHERE code LIKE 'c1%'")
        cur.execute(f"UPDATE {DB}.{table} SET status = 'new' WHERE code LIKE 'c2%'")
    applied = _apply(endpoints, spark, table, start_from_loads=[key], verify=True)
    looked = [v for v in applied["verified"] if v["table"] == f"{DB}.{table}"]
    assert looked and looked[-1]["shards"] == 1 and applied["repaired_shards"] == 0, applied["verified"]
    with mysql_conn.cursor() as cur:
        cur.execute(f"SELECT code FROM {DB}.{table} WHERE status <> 'test' ORDER BY code")
        want = [r[0] for r in cur.fetchall()]
    assert [r[0] for r in ch.query(f"SELECT code FROM `{TARGET}`.`{table}` FINAL ORDER BY code").result_rows] == want
    counts = run_snapshot_diff(SnapshotDiffSpec(target=endpoints[1], old_table=f"{TARGET}.{table}",
                                                sources=one_server(endpoints[0]), source_database=DB,
                                                source_table=table), spark)["counts"]
    assert (counts["new"], counts["deleted"], counts["changed"]) == (0, 0, 0), counts

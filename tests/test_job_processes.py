"""A job's own processes (the driver, its binlog readers) start lean: pandas, which clickhouse-connect
and pyarrow would import only to ask whether they were handed a DataFrame, is never imported."""

from __future__ import annotations

import re

import pytest

from airflow_sync_provider.core.jobspec import CdcApplySpec, FullLoadSpec
from airflow_sync_provider.core.source.group import one_server
from airflow_sync_provider.core.submission import spark_submit
from tests.helpers import assert_same_rows, recreate_tables

pytestmark = pytest.mark.slow
DB, TARGET = "lean", "lean_ch"
# -X importtime's lines of pandas's own modules: the refused attempt at the package prints a line too
PANDAS = re.compile(r"\|\s+pandas\.")


def test_a_load_and_a_catch_up_with_reader_processes_never_import_pandas(mysql_conn, ch, endpoints, monkeypatch):
    recreate_tables(mysql_conn, DB, "CREATE TABLE lean.t (id INT PRIMARY KEY, name VARCHAR(40), amount DECIMAL(12, 2), "
                                    "at DATETIME(6) NULL)")
    with mysql_conn.cursor() as cur:
        cur.execute(f"INSERT INTO {DB}.t SELECT seq, CONCAT('n', seq), seq / 4, NULL FROM {DB}.seq_1_to_2000")
    monkeypatch.setenv("PYTHONPROFILEIMPORTTIME", "1")  # each process prints its imports, readers too
    lines: list[str] = []
    load = spark_submit(FullLoadSpec(sources=one_server(endpoints[0]), target=endpoints[1], source_database=DB,
                                     source_table="t", target_database=TARGET, target_table="t", load_key="lean.t"),
                        line=lines.append)
    assert load["status"] == "success", load
    assert "probe rows equal" in load["reader"]  # the probe converts Python values to Arrow (pyarrow asks)
    with mysql_conn.cursor() as cur:  # over 1 MB of binlog: read by a reader process, not a driver thread
        cur.execute(f"INSERT INTO {DB}.t SELECT seq, REPEAT('x', 40), seq, NOW(6) FROM {DB}.seq_2001_to_30000")
        cur.execute(f"UPDATE {DB}.t SET amount = amount + 1 WHERE id <= 500")
    apply = spark_submit(CdcApplySpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline="lean",
                                      start_from_loads=["lean.t"], lanes=2), line=lines.append)
    assert apply["status"] == "success" and apply["events"] >= 28_500, apply
    assert assert_same_rows(mysql_conn, ch, DB, "t", TARGET) == 30_000
    forked = [line for line in lines if re.search(r"\|\s+multiprocessing\.forkserver$", line)]
    assert forked, "no reader process started: the catch-up read in a driver thread"
    imported = [line for line in lines if PANDAS.search(line)]
    assert not imported, imported

"""A whole database of the kinds real schemas have (issues 58 and 59), followed by one pipeline by
pattern: spatial columns, a JSON column, a table without a key, foreign keys that cascade (update,
delete, SET NULL, a chain). After the bootstrap and after each catch-up every copy equals its source
row for row (a multiset for the keyless table), with rolling verification off."""

from __future__ import annotations

import pytest

from airflow_sync_provider.core.jobspec import CdcApplySpec, CdcBootstrapSpec, ReconcileSpec, bootstrap_load_key
from airflow_sync_provider.core.selection import TableSet
from airflow_sync_provider.core.source.group import one_server
from airflow_sync_provider.spark.cdc_apply import run_cdc_apply
from airflow_sync_provider.spark.cdc_bootstrap import run_cdc_bootstrap
from airflow_sync_provider.spark.reconcile import run_reconcile
from tests.helpers import assert_same_rows
from tests.helpers import run_sql as _sql

pytestmark = pytest.mark.slow
DB, TARGET = "shopreal", "shopreal_ch"
TABLES = ("region", "store", "staff", "rental", "visits")
SCHEMA = (
    f"CREATE TABLE {DB}.region (id INT PRIMARY KEY, name VARCHAR(20), area POLYGON REF_SYSTEM_ID=4326 NOT NULL,"
    " SPATIAL INDEX (area)) ENGINE=InnoDB",
    f"CREATE TABLE {DB}.store (id INT PRIMARY KEY, region_id INT NULL, at POINT NULL, settings JSON NULL,"
    f" KEY (region_id), CONSTRAINT store_region FOREIGN KEY (region_id) REFERENCES {DB}.region (id)"
    " ON UPDATE CASCADE ON DELETE SET NULL) ENGINE=InnoDB",
    f"CREATE TABLE {DB}.staff (id INT PRIMARY KEY, store_id INT NOT NULL, name VARCHAR(30), KEY (store_id),"
    f" CONSTRAINT staff_store FOREIGN KEY (store_id) REFERENCES {DB}.store (id) ON UPDATE CASCADE"
    " ON DELETE CASCADE) ENGINE=InnoDB",
    f"CREATE TABLE {DB}.rental (id INT PRIMARY KEY, staff_id INT NOT NULL, amount DECIMAL(8, 2), KEY (staff_id),"
    f" CONSTRAINT rental_staff FOREIGN KEY (staff_id) REFERENCES {DB}.staff (id) ON UPDATE CASCADE"
    " ON DELETE CASCADE) ENGINE=InnoDB",
    f"CREATE TABLE {DB}.visits (store INT, day DATE, path LINESTRING NULL, note JSON NULL) ENGINE=InnoDB",
)


def _same(conn, ch):
    return {t: assert_same_rows(conn, ch, DB, t, TARGET) for t in TABLES}


def test_a_whole_database_with_spatial_json_keyless_and_cascading_tables_ends_exact(mysql_conn, ch, endpoints,
                                                                                   spark):
    _sql(mysql_conn, f"DROP DATABASE IF EXISTS {DB}", f"CREATE DATABASE {DB}", *SCHEMA,
         f"INSERT INTO {DB}.region SELECT seq, CONCAT('r', seq), ST_GeomFromText(CONCAT('POLYGON((0 0, ', seq, ' 0, ',"
         f" seq, ' ', seq, ', 0 0))'), 4326) FROM {DB}.seq_1_to_5",
         f"INSERT INTO {DB}.store SELECT seq, 1 + seq % 5, IF(seq % 4 = 0, NULL, POINT(seq / 3, -seq)),"
         f" IF(seq % 3 = 0, NULL, JSON_OBJECT('open', seq % 2 = 0, 'hours', JSON_ARRAY(8, 20), 'x', NULL))"
         f" FROM {DB}.seq_1_to_40",
         f"INSERT INTO {DB}.staff SELECT seq, 1 + seq % 40, CONCAT('s', seq) FROM {DB}.seq_1_to_200",
         f"INSERT INTO {DB}.rental SELECT seq, 1 + seq % 200, seq / 7 FROM {DB}.seq_1_to_2000",
         f"INSERT INTO {DB}.visits SELECT 1 + seq % 40, '2026-01-01' + INTERVAL seq % 9 DAY,"
         f" IF(seq % 5 = 0, NULL, LINESTRING(POINT(0, 0), POINT(seq, 1))), IF(seq % 2, JSON_OBJECT('n', seq % 3), NULL)"
         f" FROM {DB}.seq_1_to_600")
    select = {"databases": [DB], "target_database": TARGET}
    boot = run_cdc_bootstrap(CdcBootstrapSpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline="real",
                                              tableset=TableSet(select=select), channels=2, chunk_rows=300), spark)
    assert sorted(t["table"] for t in boot["tables"]) == sorted(f"{DB}.{t}" for t in TABLES)
    assert not boot["unstreamable"]
    spec = CdcApplySpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline="real", lanes=2,
                        verify_period=0, verify_after_ddl=False)
    run_cdc_apply(spec, spark)
    assert _same(mysql_conn, ch)["visits"] == 600

    _sql(mysql_conn,
         f"UPDATE {DB}.region SET id = 50 WHERE id = 2",  # stores follow
         f"DELETE FROM {DB}.region WHERE id = 3",  # its stores' region_id NULL
         f"UPDATE {DB}.store SET id = 400 WHERE id = 7",  # staff follow, their rentals do not change
         f"DELETE FROM {DB}.store WHERE id = 8",  # its staff go, and their rentals (a chain)
         f"UPDATE {DB}.staff SET id = id + 1000 WHERE id <= 10",  # rentals follow
         f"UPDATE {DB}.store SET at = ST_GeomFromText('POINT(1 1)', 4326),"
         " settings = JSON_SET(settings, '$.open', true) WHERE id % 6 = 0",
         f"UPDATE {DB}.region SET area = ST_GeomFromText('POLYGON((0 0, 9 0, 9 9, 0 0))', 4326) WHERE id = 1",
         f"INSERT INTO {DB}.visits SELECT 1, '2026-02-01', NULL, NULL FROM {DB}.seq_1_to_3",  # three equal rows
         f"DELETE FROM {DB}.visits WHERE store = 1 AND day = '2026-02-01' LIMIT 1",  # one of them
         f"UPDATE {DB}.visits SET note = JSON_OBJECT('n', 99) WHERE store = 2 LIMIT 2")
    result = run_cdc_apply(spec, spark)
    assert result["cascaded_rows"] > 0
    counts = _same(mysql_conn, ch)
    assert counts["visits"] == 602
    for table in TABLES:  # the checks agree: every copy reconciles with checksums
        key = bootstrap_load_key("real", {"source_database": DB, "source_table": table})
        checked = run_reconcile(ReconcileSpec(sources=one_server(endpoints[0]), target=endpoints[1], load_key=key,
                                              checksum=True), spark)
        assert checked["verdict"] == "ok", (table, checked["shards"])

"""CDC through schema changes against the real services: every DDL class either reaches the copy
with MySQL's values (existing rows included) or stops the pipeline with a clear error."""

from __future__ import annotations

import pytest

from airflow_sync_provider.core.cdc.checkpoints import Checkpoints
from airflow_sync_provider.core.clickhouse.columns import INTERNAL_COLUMNS
from airflow_sync_provider.core.jobspec import CdcApplySpec, CdcBootstrapSpec
from airflow_sync_provider.core.selection import TableSet
from airflow_sync_provider.core.source.group import one_server
from airflow_sync_provider.spark.cdc_apply import run_cdc_apply
from airflow_sync_provider.spark.cdc_bootstrap import run_cdc_bootstrap
from tests.helpers import assert_same_rows
from tests.helpers import run_sql as sql

pytestmark = pytest.mark.slow
DB, TARGET = "ddl", "ddl_ch"


def bootstrap(endpoints, spark, pipeline, *tables):
    return run_cdc_bootstrap(CdcBootstrapSpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline=pipeline,
                                              channels=2,
                                              tableset=TableSet(tables=[{"source_database": DB, "source_table": t,
                                                                         "target_database": TARGET}
                                                                         for t in tables])), spark)


def apply(endpoints, spark, pipeline, **kwargs):
    # the DDL follow alone: the verification after a DDL (tests/test_cdc_verify.py) would repair
    # what a wrong follow wrote, and these tests (and their mutation checks) would not see it
    kwargs.setdefault("verify_after_ddl", False)
    return run_cdc_apply(CdcApplySpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline=pipeline, lanes=2,
                                      **kwargs), spark)


def exact(conn, ch, table) -> int:
    """FINAL equals the source row for row, and the copy has exactly the source's columns."""
    with conn.cursor() as cur:
        cur.execute("SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
                    (DB, table))
        source = sorted(r[0] for r in cur.fetchall())
    copy = sorted(r[0] for r in ch.query("SELECT name FROM system.columns WHERE database = {d:String} AND "
                                         "table = {t:String}", parameters={"d": TARGET, "t": table}).result_rows
                  if r[0] not in INTERNAL_COLUMNS)
    assert copy == source, f"{table}: copy columns {copy} != source columns {source}"
    return assert_same_rows(conn, ch, DB, table, TARGET)


def seeded(conn, table, rows=2000, extra=""):
    sql(conn, f"CREATE DATABASE IF NOT EXISTS {DB}", f"DROP TABLE IF EXISTS {DB}.{table}",
        f"CREATE TABLE {DB}.{table} (id INT PRIMARY KEY, note VARCHAR(20) NULL, amount DECIMAL(10, 4) NULL,"
        f" n INT NULL{extra})",
        f"INSERT INTO {DB}.{table} (id, note, amount, n) SELECT seq, CONCAT('n', seq), seq / 7, seq % 13"
        f" FROM {DB}.seq_1_to_{rows}")


def test_the_three_reported_changes_end_exact(mysql_conn, ch, endpoints, spark):
    """The issue's report: ADD COLUMN … DEFAULT, RENAME COLUMN and TRUNCATE on caught-up copies."""
    for table in ("r_default", "r_rename", "r_truncate"):
        seeded(mysql_conn, table)
    bootstrap(endpoints, spark, "reported", "r_default", "r_rename", "r_truncate")
    apply(endpoints, spark, "reported")
    sql(mysql_conn, f"ALTER TABLE {DB}.r_default ADD COLUMN c INT DEFAULT 7",
        f"UPDATE {DB}.r_default SET c = 8 WHERE id <= 10",
        f"ALTER TABLE {DB}.r_rename RENAME COLUMN note TO memo",
        f"UPDATE {DB}.r_rename SET memo = 'changed' WHERE id <= 69",
        f"TRUNCATE TABLE {DB}.r_truncate", f"INSERT INTO {DB}.r_truncate (id, note) VALUES (1, 'after')")
    result = apply(endpoints, spark, "reported")
    assert result["ddl"] == 3
    assert exact(mysql_conn, ch, "r_default") == 2000
    assert ch.command(f"SELECT countIf(c = 7) FROM {TARGET}.r_default FINAL") == 1990
    assert exact(mysql_conn, ch, "r_rename") == 2000
    assert exact(mysql_conn, ch, "r_truncate") == 1


CLASSES = [  # (statement, is it done by a re-copy?), in the order the test applies them
    ("ADD COLUMN c1 INT NOT NULL DEFAULT 5 FIRST", False),
    ("ADD COLUMN c2 VARCHAR(10) DEFAULT 'x''y\\\\z' AFTER id", False),
    ("ADD COLUMN c3 DECIMAL(8, 2) DEFAULT (1 + 0.005)", False),  # an expression MySQL rounds
    ("ADD COLUMN c4 DATETIME(3) NOT NULL DEFAULT '2024-02-29 10:11:12.345'", False),
    ("ADD COLUMN c5 INT NOT NULL", False),  # the implicit default 0
    ("ADD COLUMN c6 BIGINT AS (n * 2) STORED", True),
    ("ADD COLUMN c7 DATETIME DEFAULT CURRENT_TIMESTAMP", True),
    ("ADD COLUMN c8 VARCHAR(40) DEFAULT (UUID())", True),
    ("DROP COLUMN c5", False),
    ("RENAME COLUMN note TO memo", False),
    ("CHANGE COLUMN memo note VARCHAR(20) NULL", False),  # rename back, same type
    ("CHANGE COLUMN note note2 VARCHAR(40) NULL", False),  # rename + widen
    ("MODIFY n BIGINT NULL", False),  # widening
    ("MODIFY amount DECIMAL(10, 2) NULL", True),  # scale down: MySQL rounds
    ("MODIFY note2 VARCHAR(3) NULL", True),  # shorter: MySQL truncates (lax sql_mode)
    ("MODIFY n VARCHAR(30) NULL", True),  # INT → VARCHAR
    ("MODIFY note2 VARCHAR(3) CHARACTER SET latin1 NULL", True),  # another character set
    ("ALTER COLUMN c1 SET DEFAULT 9", False),
    ("ALTER COLUMN c1 DROP DEFAULT", False),
    ("ADD COLUMN e ENUM('a', 'b') NOT NULL DEFAULT 'b'", False),
    ("MODIFY e ENUM('a', 'b', 'c') NOT NULL DEFAULT 'b'", False),  # a member added at the end
    ("MODIFY e ENUM('c', 'b') NOT NULL DEFAULT 'b'", True),  # reordered, 'a' removed
    ("ADD COLUMN x1 INT DEFAULT 1, DROP COLUMN c1, RENAME COLUMN c2 TO c22, MODIFY c3 DECIMAL(12, 4)", False),
    ("ADD INDEX ix (n)", False),
    ("FORCE", False),
    ("ENGINE = InnoDB", False),
    ("CONVERT TO CHARACTER SET utf8mb4", True),  # a statement the parser does not understand
]


def _changes_around(conn, i: int, clause: str):
    """Changes before and after one ALTER, so both shapes carry rows in the binlog."""
    sql(conn, f"UPDATE {DB}.classes SET n = NULL WHERE id % 97 = {i}",
        f"INSERT INTO {DB}.classes (id) VALUES ({10_000 + i})",
        f"DELETE FROM {DB}.classes WHERE id = {i * 50 + 7}",
        f"ALTER TABLE {DB}.classes {clause}",
        f"UPDATE {DB}.classes SET id = id + 100000 WHERE id = {i * 50 + 8}")


def test_every_ddl_class_ends_exact_in_place_far_behind_or_by_a_recopy(mysql_conn, ch, endpoints, spark):
    """Every DDL class with changes before and after it. First the classes followed in place,
    all in one backlog (the catch-up decodes each change with the shape of its position); then
    each class that needs a re-copy, one catch-up each. Exact after every catch-up."""
    seeded(mysql_conn, "classes", rows=3000)
    bootstrap(endpoints, spark, "classes", "classes")
    apply(endpoints, spark, "classes")
    sql(mysql_conn, "SET SESSION sql_mode = ''")
    in_place = [c for c, recopied in CLASSES if not recopied]
    for i, clause in enumerate(in_place):
        _changes_around(mysql_conn, i, clause)
    result = apply(endpoints, spark, "classes")
    assert result["ddl"] == len(in_place) and result["recopied"] == []
    assert exact(mysql_conn, ch, "classes") == 3000
    for i, clause in enumerate((c for c, recopied in CLASSES if recopied), start=len(in_place)):
        _changes_around(mysql_conn, i, clause)
        result = apply(endpoints, spark, "classes")
        assert result["ddl"] == 1 and result["recopied"] == [f"{DB}.classes"], clause
        assert exact(mysql_conn, ch, "classes") == 3000, clause
    sql(mysql_conn, "SET SESSION sql_mode = DEFAULT")


def test_a_primary_key_change_is_followed_by_a_copy_under_the_new_key(mysql_conn, ch, endpoints, spark):
    """Issue 34's case (the key widened to (code, id), then a row whose id an existing row has),
    a key column retyped, a key column renamed, and a key dropped: each table ends with FINAL ==
    the source under its new key while the pipeline's other table keeps flowing; a table left
    without a key leaves the pipeline as an unstreamable one, with the reason, its copy kept."""
    sql(mysql_conn, f"CREATE DATABASE IF NOT EXISTS {DB}", f"DROP TABLE IF EXISTS {DB}.r07",
        f"CREATE TABLE {DB}.r07 (id INT NOT NULL PRIMARY KEY, code VARCHAR(20) NOT NULL, UNIQUE KEY (code))",
        f"INSERT INTO {DB}.r07 VALUES (1,'c1'),(2,'c2'),(3,'c3'),(4,'c4'),(5,'c5')")
    seeded(mysql_conn, "retyped", rows=3000)
    seeded(mysql_conn, "renamed", rows=500)
    seeded(mysql_conn, "unkeyed", rows=300)
    seeded(mysql_conn, "bystander", rows=1000)
    tables = ("r07", "retyped", "renamed", "unkeyed", "bystander")
    bootstrap(endpoints, spark, "rekey", *tables)
    apply(endpoints, spark, "rekey")
    sql(mysql_conn, f"ALTER TABLE {DB}.r07 DROP PRIMARY KEY, ADD PRIMARY KEY (code, id)",
        f"INSERT INTO {DB}.r07 (id, code) VALUES (5, 'dup-5')",
        f"UPDATE {DB}.retyped SET n = -n WHERE id <= 100",
        f"ALTER TABLE {DB}.retyped MODIFY id BIGINT NOT NULL",
        f"INSERT INTO {DB}.retyped (id, note) VALUES (9000000000, 'big')",
        f"UPDATE {DB}.retyped SET note = 'after' WHERE id BETWEEN 200 AND 300",
        f"ALTER TABLE {DB}.renamed RENAME COLUMN id TO rid",
        f"UPDATE {DB}.renamed SET note = 'renamed key' WHERE rid <= 10",
        f"ALTER TABLE {DB}.unkeyed DROP PRIMARY KEY",
        f"UPDATE {DB}.bystander SET note = 'flowing' WHERE id <= 400")
    result = apply(endpoints, spark, "rekey")
    # unkeyed lost its key: copied again as a multiset (docs/keyless-tables.md) and followed on
    assert sorted(result["recopied"]) == [f"{DB}.r07", f"{DB}.renamed", f"{DB}.retyped", f"{DB}.unkeyed"]
    assert exact(mysql_conn, ch, "r07") == 6  # (5, 'c5') and (5, 'dup-5'): two rows under the new key
    assert exact(mysql_conn, ch, "retyped") == 3001
    assert exact(mysql_conn, ch, "renamed") == 500
    assert exact(mysql_conn, ch, "bystander") == 1000
    assert ch.command(f"SELECT sorting_key FROM system.tables WHERE database = '{TARGET}' AND name = 'r07'") \
        == "code, id"
    assert "Int64" in ch.command(f"SELECT type FROM system.columns WHERE database = '{TARGET}' AND table = 'retyped'"
                                 " AND name = 'id'")
    assert not ch.query(f"SELECT name FROM system.tables WHERE database = '{TARGET}' AND name LIKE '%rekey%'"
                        ).result_rows  # the copies under the old keys are gone
    left = {c["table"]: c["left"] for c in Checkpoints(ch).state("rekey").to_dict()["schema_changes"]
            if c.get("left")}
    assert not left
    assert exact(mysql_conn, ch, "unkeyed") == 300
    assert "_sign" in ch.command(f"SELECT groupArray(name) FROM system.columns WHERE database = '{TARGET}' "
                                 "AND table = 'unkeyed'")

    # the tables stream on under their new keys
    sql(mysql_conn, f"UPDATE {DB}.r07 SET id = 50 WHERE code = 'dup-5'", f"DELETE FROM {DB}.r07 WHERE code = 'c1'",
        f"UPDATE {DB}.retyped SET id = id + 10000000000 WHERE id <= 10", f"DELETE FROM {DB}.renamed WHERE rid > 490",
        f"UPDATE {DB}.unkeyed SET note = 'keyless' WHERE id <= 20", f"DELETE FROM {DB}.unkeyed WHERE id > 290")
    again = apply(endpoints, spark, "rekey")
    assert again["recopied"] == []
    assert exact(mysql_conn, ch, "unkeyed") == 290
    assert exact(mysql_conn, ch, "r07") == 5
    assert exact(mysql_conn, ch, "retyped") == 3001
    assert exact(mysql_conn, ch, "renamed") == 490


def test_dropped_and_renamed_away_tables_leave_and_a_swap_is_recopied(mysql_conn, ch, endpoints, spark,
                                                                       clickhouse_url, capsys):
    seeded(mysql_conn, "gone", rows=50)
    seeded(mysql_conn, "moved", rows=50)
    seeded(mysql_conn, "swapped", rows=500)
    bootstrap(endpoints, spark, "leaving", "gone", "moved", "swapped")
    apply(endpoints, spark, "leaving")
    seeded(mysql_conn, "swapped_new", rows=300, extra=", added INT DEFAULT 3")
    sql(mysql_conn, f"DROP TABLE IF EXISTS {DB}.moved_away, {DB}.swapped_old", f"DROP TABLE {DB}.gone",
        f"RENAME TABLE {DB}.moved TO {DB}.moved_away",
        f"RENAME TABLE {DB}.swapped TO {DB}.swapped_old, {DB}.swapped_new TO {DB}.swapped",
        f"UPDATE {DB}.swapped SET note = 'after the swap' WHERE id <= 5")
    result = apply(endpoints, spark, "leaving")
    assert result["tables"] == [f"{DB}.swapped"]
    assert exact(mysql_conn, ch, "swapped") == 300
    assert ch.command(f"SELECT count() FROM {TARGET}.gone FINAL") == 50  # kept as it was
    from airflow_sync_provider.cli import main

    assert main(["cdc", "status", "--pipeline", "leaving", "--clickhouse-url", clickhouse_url]) == 0
    out = capsys.readouterr().out
    assert f"{DB}.gone: left the pipeline (dropped at mysql-bin." in out
    assert f"{DB}.moved: left the pipeline (renamed to {DB}.moved_away at " in out
    assert f"{DB}.swapped: re-copied 1x, last: {DB}.swapped_new became {DB}.swapped at " in out


# --- a stateful property test: random changes and DDL on a few tables, exact after every catch-up

from hypothesis import settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule  # noqa: E402

MACHINE_TABLES = ("sm0", "sm1")


class SchemaChangeMachine(RuleBasedStateMachine):
    """Inserts, updates, deletes, key changes and DDL (each class followed in place or by a
    re-copy) on two tables, with bounded catch-ups in between; after each catch-up FINAL equals
    the source row for row and the copy has the source's columns."""

    runs = 0
    conn = ch = endpoints = spark = None

    @initialize()
    def start(self):
        SchemaChangeMachine.runs += 1
        self.pipeline = f"machine{self.runs}"
        self.columns = {t: ["note", "amount", "n"] for t in MACHINE_TABLES}  # non-key columns now
        self.next_id, self.added = 5000, 0
        for table in MACHINE_TABLES:
            seeded(self.conn, table, rows=300)
            self.ch.command(f"DROP TABLE IF EXISTS {TARGET}.{table}")  # an earlier example's copy
        bootstrap(self.endpoints, self.spark, self.pipeline, *MACHINE_TABLES)
        self.pending = True

    @rule(table=st.sampled_from(MACHINE_TABLES), rows=st.integers(1, 20))
    def insert(self, table, rows):
        sql(self.conn, f"INSERT INTO {DB}.{table} (id) SELECT seq + {self.next_id} FROM {DB}.seq_1_to_{rows}")
        self.next_id += rows
        self.pending = True

    @rule(table=st.sampled_from(MACHINE_TABLES), mod=st.integers(2, 9))
    def update(self, table, mod):
        column = "n" if "n" in self.columns[table] else "id"
        value = "NULL" if column == "n" else "id"
        sql(self.conn, f"UPDATE {DB}.{table} SET {column} = {value} WHERE id % {mod} = 1")
        if self.columns[table]:
            first = self.columns[table][0]
            sql(self.conn, f"UPDATE {DB}.{table} SET `{first}` = DEFAULT WHERE id % {mod} = 0")
        self.pending = True

    @rule(table=st.sampled_from(MACHINE_TABLES), mod=st.integers(5, 30))
    def delete_and_rekey(self, table, mod):
        sql(self.conn, f"DELETE FROM {DB}.{table} WHERE id % {mod} = 3",
            f"UPDATE {DB}.{table} SET id = id + 1000000 WHERE id % {mod} = 4 AND id < 1000000")
        self.pending = True

    @rule(table=st.sampled_from(MACHINE_TABLES), default=st.sampled_from(["7", "'x'", "NULL", "(1 + 2)"]),
          kind=st.sampled_from(["INT", "VARCHAR(10)", "DECIMAL(6, 2)"]))
    def add_column(self, table, default, kind):
        if kind == "INT" and default == "'x'":
            default = "-3"
        self.added += 1
        name = f"a{self.added}"
        sql(self.conn, f"ALTER TABLE {DB}.{table} ADD COLUMN {name} {kind} DEFAULT {default}")
        self.columns[table].append(name)
        self.pending = True

    @precondition(lambda self: any(len(c) > 1 for c in self.columns.values()))
    @rule(data=st.data())
    def drop_or_rename(self, data):
        table = data.draw(st.sampled_from([t for t in MACHINE_TABLES if len(self.columns[t]) > 1]))
        column = data.draw(st.sampled_from(self.columns[table]))
        if data.draw(st.booleans()):
            sql(self.conn, f"ALTER TABLE {DB}.{table} DROP COLUMN `{column}`")
            self.columns[table].remove(column)
        else:
            self.added += 1
            new = f"r{self.added}"
            sql(self.conn, f"ALTER TABLE {DB}.{table} RENAME COLUMN `{column}` TO {new}")
            self.columns[table][self.columns[table].index(column)] = new
        self.pending = True

    @precondition(lambda self: any("amount" in c for c in self.columns.values()))
    @rule(scale=st.sampled_from([1, 3, 6]))
    def modify_amount(self, scale):  # value-changing when the scale goes down (a re-copy)
        table = next(t for t in MACHINE_TABLES if "amount" in self.columns[t])
        sql(self.conn, f"ALTER TABLE {DB}.{table} MODIFY amount DECIMAL(14, {scale}) NULL")
        self.pending = True

    @rule(table=st.sampled_from(MACHINE_TABLES))
    def truncate(self, table):
        sql(self.conn, f"TRUNCATE TABLE {DB}.{table}",
            f"INSERT INTO {DB}.{table} (id) SELECT seq FROM {DB}.seq_1_to_50")
        self.pending = True

    @rule()
    def catch_up(self):
        apply(self.endpoints, self.spark, self.pipeline)
        self.pending = False

    @invariant()
    def exact_after_catch_up(self):
        if not self.pending:
            for table in MACHINE_TABLES:
                exact(self.conn, self.ch, table)

    def teardown(self):  # every example ends with a catch-up, so its last changes are checked too
        if self.pending and self.endpoints is not None:
            self.catch_up()
            self.exact_after_catch_up()


def test_random_changes_and_ddl_stay_exact_after_every_catch_up(mysql_conn, ch, endpoints, spark):
    SchemaChangeMachine.conn, SchemaChangeMachine.ch = mysql_conn, ch
    SchemaChangeMachine.endpoints, SchemaChangeMachine.spark = endpoints, spark
    machine = SchemaChangeMachine.TestCase
    machine.settings = settings(max_examples=5, stateful_step_count=12, derandomize=True, deadline=None,
                                database=None)
    machine().runTest()


def test_an_online_schema_change_swap_under_a_live_writer_ends_exact(mysql_url, mysql_conn, ch, endpoints, spark):
    """pt-online-schema-change's way: a shadow table with the new shape, triggers mirroring the
    writer's changes into it, the rows copied in chunks, then `RENAME TABLE t TO t_old, t_new TO
    t` — all while a writer changes the table and bounded catch-ups run."""
    import random
    import threading
    import time

    import pymysql

    seeded(mysql_conn, "osc", rows=5000)
    bootstrap(endpoints, spark, "osc", "osc")
    stop, errors, changes = threading.Event(), [], [0]

    def write():
        conn = pymysql.connect(**endpoints[0].connect_args(), autocommit=True)
        rng = random.Random(3)
        try:
            while not stop.is_set():
                key = rng.randint(1, 7000)
                try:
                    with conn.cursor() as cur:
                        cur.execute(rng.choice([
                            f"INSERT IGNORE INTO {DB}.osc (id, note, n) VALUES ({key}, 'w', {key})",
                            f"UPDATE {DB}.osc SET note = 'u{key}', amount = {key} / 3 WHERE id = {key}",
                            f"DELETE FROM {DB}.osc WHERE id = {key}"]))
                    changes[0] += 1
                except pymysql.err.ProgrammingError as exc:  # the instant of the swap
                    if exc.args[0] != 1146:
                        raise
                time.sleep(0.002)
        except Exception as exc:  # reported by the test
            errors.append(exc)
        finally:
            conn.close()

    writer = threading.Thread(target=write)
    writer.start()
    try:
        apply(endpoints, spark, "osc")
        sql(mysql_conn, f"DROP TABLE IF EXISTS {DB}.osc_new, {DB}.osc_old",
            f"CREATE TABLE {DB}.osc_new LIKE {DB}.osc",
            f"ALTER TABLE {DB}.osc_new ADD COLUMN flag TINYINT NOT NULL DEFAULT 1, MODIFY amount DECIMAL(12, 2) NULL",
            f"CREATE TRIGGER {DB}.osc_ins AFTER INSERT ON {DB}.osc FOR EACH ROW REPLACE INTO {DB}.osc_new"
            " (id, note, amount, n) VALUES (NEW.id, NEW.note, NEW.amount, NEW.n)",
            f"CREATE TRIGGER {DB}.osc_upd AFTER UPDATE ON {DB}.osc FOR EACH ROW REPLACE INTO {DB}.osc_new"
            " (id, note, amount, n) VALUES (NEW.id, NEW.note, NEW.amount, NEW.n)",
            f"CREATE TRIGGER {DB}.osc_del AFTER DELETE ON {DB}.osc FOR EACH ROW DELETE FROM {DB}.osc_new"
            " WHERE id = OLD.id")
        for low in range(0, 8000, 1000):  # the copy in chunks, the writer going on
            sql(mysql_conn, f"INSERT IGNORE INTO {DB}.osc_new (id, note, amount, n) SELECT id, note, amount, n "
                            f"FROM {DB}.osc WHERE id > {low} AND id <= {low + 1000} LOCK IN SHARE MODE")
            apply(endpoints, spark, "osc")
        sql(mysql_conn, f"RENAME TABLE {DB}.osc TO {DB}.osc_old, {DB}.osc_new TO {DB}.osc",
            f"DROP TRIGGER {DB}.osc_ins", f"DROP TRIGGER {DB}.osc_upd", f"DROP TRIGGER {DB}.osc_del")
        swapped = apply(endpoints, spark, "osc")
        time.sleep(1)
        apply(endpoints, spark, "osc")
    finally:
        stop.set()
        writer.join()
    assert not errors, errors
    assert swapped["recopied"] == [f"{DB}.osc"] and changes[0] > 500
    apply(endpoints, spark, "osc")
    assert exact(mysql_conn, ch, "osc") > 3000

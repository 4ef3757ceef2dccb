"""Foreign-key cascades followed by CDC (issue 58), on the real services: InnoDB changes the
children without binlog events; after every apply the copies equal the source row for row with
rolling verification off, so it cannot mask a miss."""

from __future__ import annotations

import pytest

from airflow_sync_provider.core.jobspec import CdcApplySpec, CdcBootstrapSpec
from airflow_sync_provider.core.source.group import one_server
from airflow_sync_provider.core.source.selection import TableSet
from airflow_sync_provider.spark.cdc_apply import run_cdc_apply
from airflow_sync_provider.spark.cdc_bootstrap import run_cdc_bootstrap
from tests.helpers import assert_same_rows

pytestmark = pytest.mark.slow
DB = "fk"


def _sql(conn, *statements):
    with conn.cursor() as cur:
        for statement in statements:
            cur.execute(statement)


def _fresh(conn, *ddls):
    _sql(conn, f"DROP DATABASE IF EXISTS {DB}", f"CREATE DATABASE {DB}", *ddls)


def bootstrap(endpoints, spark, pipeline, tables, **kwargs):
    kwargs.setdefault("chunk_rows", 500)
    return run_cdc_bootstrap(CdcBootstrapSpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline=pipeline,
                                              tableset=TableSet(tables=[f"{DB}.{t}" for t in tables]), **kwargs), spark)


def apply(endpoints, spark, pipeline, **kwargs):
    kwargs.setdefault("verify_period", 0)  # no rolling verification: it would mask a missed cascade
    kwargs.setdefault("verify_after_ddl", False)
    return run_cdc_apply(CdcApplySpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline=pipeline,
                                      lanes=2, **kwargs), spark)


def same(conn, ch, *tables):
    for table in tables:
        assert_same_rows(conn, ch, DB, table)


CHAIN = (
    f"CREATE TABLE {DB}.a (id INT PRIMARY KEY, name VARCHAR(20)) ENGINE=InnoDB",
    f"CREATE TABLE {DB}.b (id INT PRIMARY KEY, a_id INT, note VARCHAR(20), KEY (a_id),"
    f" CONSTRAINT b_a FOREIGN KEY (a_id) REFERENCES {DB}.a (id) ON UPDATE CASCADE ON DELETE CASCADE) ENGINE=InnoDB",
    f"CREATE TABLE {DB}.c (id INT PRIMARY KEY, b_id INT, KEY (b_id),"
    f" CONSTRAINT c_b FOREIGN KEY (b_id) REFERENCES {DB}.b (id) ON UPDATE CASCADE ON DELETE SET NULL) ENGINE=InnoDB",
)


def test_a_chain_of_three_follows_update_cascade_delete_cascade_and_set_null(mysql_conn, ch, endpoints, spark):
    """a ← b (ON UPDATE CASCADE, ON DELETE CASCADE) ← c (ON UPDATE CASCADE, ON DELETE SET NULL):
    a renumbered key rewrites b's references; a renumbered b key rewrites c's; a deleted a row
    deletes its b rows, which set their c rows' references to NULL."""
    _fresh(mysql_conn, *CHAIN)
    _sql(mysql_conn,
         f"INSERT INTO {DB}.a SELECT seq, CONCAT('a', seq) FROM {DB}.seq_1_to_50",
         f"INSERT INTO {DB}.b SELECT seq, 1 + seq % 50, 'b' FROM {DB}.seq_1_to_500",
         f"INSERT INTO {DB}.c SELECT seq, 1 + seq % 500 FROM {DB}.seq_1_to_2000")
    bootstrap(endpoints, spark, "chain", ["a", "b", "c"])
    apply(endpoints, spark, "chain")
    same(mysql_conn, ch, "a", "b", "c")
    _sql(mysql_conn, f"UPDATE {DB}.a SET id = 1000 WHERE id = 7")  # b rows with a_id 7 → 1000
    result = apply(endpoints, spark, "chain")
    same(mysql_conn, ch, "a", "b", "c")
    assert result["cascaded_rows"] == 10
    _sql(mysql_conn, f"UPDATE {DB}.b SET id = id + 10000 WHERE id <= 20")  # c's references follow
    _sql(mysql_conn, f"DELETE FROM {DB}.a WHERE id IN (3, 4)")  # b rows deleted, their c rows' b_id NULL
    result = apply(endpoints, spark, "chain")
    same(mysql_conn, ch, "a", "b", "c")
    assert result["cascaded_rows"] > 20 + 20 + 80


def test_with_cascade_following_off_the_copy_goes_wrong(mysql_conn, ch, endpoints, spark):
    """The control: the same renumbering with follow_cascades=False leaves b's copy behind, so the
    tests above can fail."""
    _fresh(mysql_conn, *CHAIN)
    _sql(mysql_conn,
         f"INSERT INTO {DB}.a SELECT seq, CONCAT('a', seq) FROM {DB}.seq_1_to_50",
         f"INSERT INTO {DB}.b SELECT seq, 1 + seq % 50, 'b' FROM {DB}.seq_1_to_500",
         f"INSERT INTO {DB}.c SELECT seq, 1 + seq % 500 FROM {DB}.seq_1_to_2000")
    bootstrap(endpoints, spark, "chain-off", ["a", "b", "c"])
    apply(endpoints, spark, "chain-off", follow_cascades=False)
    _sql(mysql_conn, f"UPDATE {DB}.a SET id = 1000 WHERE id = 7")
    result = apply(endpoints, spark, "chain-off", follow_cascades=False)
    assert result["cascaded_rows"] == 0
    same(mysql_conn, ch, "a", "c")
    with pytest.raises(AssertionError, match="10 rows differ"):
        same(mysql_conn, ch, "b")


def test_a_self_referencing_tree_deleted_from_its_root_and_a_set_null_hierarchy(mysql_conn, ch, endpoints, spark):
    """tree(parent → tree.id ON DELETE CASCADE), 1,023 nodes eleven levels deep: deleting the root
    deletes every node (InnoDB logs one row). org(boss → org.id ON DELETE SET NULL): deleting a
    boss orphans their reports, who keep their own reports."""
    _fresh(mysql_conn,
           f"CREATE TABLE {DB}.tree (id INT PRIMARY KEY, parent INT NULL, label VARCHAR(10), KEY (parent),"
           f" CONSTRAINT tree_up FOREIGN KEY (parent) REFERENCES {DB}.tree (id) ON DELETE CASCADE) ENGINE=InnoDB",
           f"CREATE TABLE {DB}.org (id INT PRIMARY KEY, boss INT NULL, KEY (boss),"
           f" CONSTRAINT org_boss FOREIGN KEY (boss) REFERENCES {DB}.org (id) ON DELETE SET NULL) ENGINE=InnoDB")
    _sql(mysql_conn,
         f"INSERT INTO {DB}.tree SELECT seq, IF(seq = 1, NULL, seq DIV 2), 'n' FROM {DB}.seq_1_to_1023",
         f"INSERT INTO {DB}.tree VALUES (5000, NULL, 'other root'), (5001, 5000, 'leaf')",
         f"INSERT INTO {DB}.org SELECT seq, IF(seq <= 3, NULL, 1 + seq % 3 + (seq > 100) * 3) FROM {DB}.seq_1_to_400")
    bootstrap(endpoints, spark, "tree", ["tree", "org"])
    apply(endpoints, spark, "tree")
    _sql(mysql_conn, f"DELETE FROM {DB}.tree WHERE id = 2")  # a subtree: 511 nodes
    _sql(mysql_conn, f"DELETE FROM {DB}.org WHERE id IN (2, 5)")
    result = apply(endpoints, spark, "tree")
    same(mysql_conn, ch, "tree", "org")
    assert result["cascaded_rows"] >= 510
    _sql(mysql_conn, f"DELETE FROM {DB}.tree WHERE id = 1")  # the rest of the first tree
    apply(endpoints, spark, "tree")
    same(mysql_conn, ch, "tree", "org")
    assert int(ch.command(f"SELECT count() FROM {DB}.tree FINAL WHERE _deleted = 0")) == 2


def test_composite_keys_a_key_inside_the_childs_primary_key_and_changes_around_the_cascade(mysql_conn, ch, endpoints,
                                                                                           spark):
    """orders(region, no) ← lines(region, no, line) with the foreign key inside lines' primary key
    ← notes(region, no, line) (composite, ON DELETE SET NULL); in one transaction the children are
    changed before the cascade, the parent renumbered, the children changed again after it; a
    renumbered order re-keys its lines (a tombstone of each old key), and notes follow both."""
    _fresh(mysql_conn,
           f"CREATE TABLE {DB}.orders (region CHAR(2) NOT NULL, no INT NOT NULL, total DECIMAL(10, 2),"
           f" PRIMARY KEY (region, no)) ENGINE=InnoDB",
           f"CREATE TABLE {DB}.`lines` (region CHAR(2) NOT NULL, no INT NOT NULL, line INT NOT NULL, qty INT,"
           f" PRIMARY KEY (region, no, line), CONSTRAINT lines_order FOREIGN KEY (region, no)"
           f" REFERENCES {DB}.orders (region, no) ON UPDATE CASCADE ON DELETE CASCADE) ENGINE=InnoDB",
           f"CREATE TABLE {DB}.notes (id INT PRIMARY KEY, region CHAR(2), no INT, line INT, text VARCHAR(20),"
           f" KEY (region, no, line), CONSTRAINT notes_line FOREIGN KEY (region, no, line)"
           f" REFERENCES {DB}.`lines` (region, no, line) ON UPDATE CASCADE ON DELETE SET NULL) ENGINE=InnoDB")
    _sql(mysql_conn,
         f"INSERT INTO {DB}.orders SELECT IF(seq % 2, 'EU', 'US'), seq, seq FROM {DB}.seq_1_to_100",
         f"INSERT INTO {DB}.`lines` SELECT IF(o.seq % 2, 'EU', 'US'), o.seq, l.seq, o.seq * l.seq"
         f" FROM {DB}.seq_1_to_100 o, {DB}.seq_1_to_5 l",
         f"INSERT INTO {DB}.notes SELECT no * 10 + line, region, no, line, 'n' FROM {DB}.`lines` WHERE line <= 3")
    bootstrap(endpoints, spark, "comp", ["orders", "lines", "notes"])
    apply(endpoints, spark, "comp")
    same(mysql_conn, ch, "orders", "lines", "notes")
    _sql(mysql_conn, "BEGIN",
         f"UPDATE {DB}.`lines` SET qty = -1 WHERE region = 'EU' AND no = 3",  # before the cascade
         f"INSERT INTO {DB}.`lines` VALUES ('EU', 3, 9, 9)",
         f"UPDATE {DB}.orders SET no = 3003 WHERE region = 'EU' AND no = 3",  # lines re-keyed, notes follow
         f"UPDATE {DB}.`lines` SET qty = -2 WHERE region = 'EU' AND no = 3003 AND line = 2",  # after it
         f"UPDATE {DB}.orders SET region = 'AP' WHERE region = 'EU' AND no = 5",
         f"DELETE FROM {DB}.`lines` WHERE region = 'EU' AND no = 7 AND line = 1",  # notes → NULL
         f"DELETE FROM {DB}.orders WHERE region = 'EU' AND no = 9",  # lines deleted, notes → NULL
         "COMMIT")
    result = apply(endpoints, spark, "comp")
    same(mysql_conn, ch, "orders", "lines", "notes")
    assert result["cascaded_rows"] >= 6 + 5 + 5
    # the old keys are tombstoned, not left beside the new ones
    assert int(ch.command(f"SELECT count() FROM {DB}.`lines` FINAL WHERE region = 'EU' AND no IN (3, 5, 9)"
                          " AND _deleted = 0")) == 0


PARENT_DB = "fk_parent"


def test_a_child_whose_parent_is_not_copied_and_a_child_in_another_database(mysql_conn, ch, endpoints, spark):
    """Only the child is copied: its parent (in another database) is read for its events, not
    copied; a renumbered and a deleted parent reach the copy."""
    _sql(mysql_conn, f"DROP DATABASE IF EXISTS {PARENT_DB}", f"CREATE DATABASE {PARENT_DB}",
         f"CREATE TABLE {PARENT_DB}.customers (id BIGINT UNSIGNED PRIMARY KEY, name VARCHAR(20)) ENGINE=InnoDB")
    _fresh(mysql_conn,
           f"CREATE TABLE {DB}.invoices (id INT PRIMARY KEY, customer BIGINT UNSIGNED, amount DECIMAL(12, 2),"
           f" KEY (customer), CONSTRAINT inv_cust FOREIGN KEY (customer) REFERENCES {PARENT_DB}.customers (id)"
           f" ON UPDATE CASCADE ON DELETE SET NULL) ENGINE=InnoDB")
    _sql(mysql_conn,
         f"INSERT INTO {PARENT_DB}.customers SELECT seq, 'c' FROM {DB}.seq_1_to_30",
         f"INSERT INTO {PARENT_DB}.customers VALUES (18446744073709551615, 'max')",
         f"INSERT INTO {DB}.invoices SELECT seq, 1 + seq % 30, seq / 7 FROM {DB}.seq_1_to_600",
         f"INSERT INTO {DB}.invoices VALUES (9999, 18446744073709551615, 1)")
    bootstrap(endpoints, spark, "orphan", ["invoices"])
    apply(endpoints, spark, "orphan")
    _sql(mysql_conn, f"UPDATE {PARENT_DB}.customers SET id = id + 100 WHERE id <= 3",
         f"UPDATE {PARENT_DB}.customers SET id = 18446744073709551614 WHERE id = 18446744073709551615",
         f"DELETE FROM {PARENT_DB}.customers WHERE id = 10")
    result = apply(endpoints, spark, "orphan")
    same(mysql_conn, ch, "invoices")
    assert result["cascaded_rows"] == 3 * 20 + 1 + 20
    assert not int(ch.command(f"EXISTS TABLE {PARENT_DB}.customers"))  # read for its events, not copied


def test_foreign_keys_added_dropped_renamed_far_behind_are_followed_as_of_each_position(mysql_conn, ch, endpoints,
                                                                                       spark):
    """One catch-up far behind a history of DDL: a key added, acting, dropped (a renumber then
    changes no child), its parent renamed and a key added to the new name, the child's column
    renamed, a new child table created with a key (selected by the pipeline's patterns): every
    cascade as the keys were at its position, not as they are at the end."""
    _fresh(mysql_conn,
           f"CREATE TABLE {DB}.p (id INT PRIMARY KEY) ENGINE=InnoDB",
           f"CREATE TABLE {DB}.k (id INT PRIMARY KEY, p_id INT, KEY (p_id)) ENGINE=InnoDB")
    _sql(mysql_conn, f"INSERT INTO {DB}.p SELECT seq FROM {DB}.seq_1_to_20",
         f"INSERT INTO {DB}.k SELECT seq, 1 + seq % 20 FROM {DB}.seq_1_to_200")
    bootstrap(endpoints, spark, "fk-ddl", ["k"])
    apply(endpoints, spark, "fk-ddl")
    _sql(mysql_conn,
         f"ALTER TABLE {DB}.k ADD CONSTRAINT k_p FOREIGN KEY (p_id) REFERENCES {DB}.p (id) ON UPDATE CASCADE",
         f"UPDATE {DB}.p SET id = 101 WHERE id = 1",  # k follows
         f"ALTER TABLE {DB}.k DROP FOREIGN KEY k_p",
         f"UPDATE {DB}.p SET id = 102 WHERE id = 2",  # no key: k keeps 2
         f"UPDATE {DB}.k SET p_id = 102 WHERE p_id = 2",  # (by hand, in the binlog: the new key needs it)
         f"RENAME TABLE {DB}.p TO {DB}.p2",
         f"ALTER TABLE {DB}.k ADD FOREIGN KEY (p_id) REFERENCES {DB}.p2 (id) ON DELETE CASCADE",
         f"DELETE FROM {DB}.p2 WHERE id = 3",  # k's rows of 3 deleted
         f"ALTER TABLE {DB}.k RENAME COLUMN p_id TO parent",
         f"DELETE FROM {DB}.p2 WHERE id = 4")  # through the renamed column
    result = apply(endpoints, spark, "fk-ddl")
    same(mysql_conn, ch, "k")
    assert result["cascaded_rows"] == 10 + 10 + 10

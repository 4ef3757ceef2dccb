"""An adversarial matrix of MariaDB tables for the planner and the loads (keys, types, collations, names)."""

from __future__ import annotations

from airflow_sync_provider.core.sql import mysql_ident, mysql_table

DB = "planner_matrix"
N = 3000  # rows in the larger tables (seq_1_to_3000)

WEIRD = 'c`ol "q" ü'
QUOTES = ["a'b", "a\\b", "\\'", "'", "\\", "a\\'b'c", "''", "%s", "x%sy", "\\0\\n", '"q"', "`bt`"]

TABLES = {
    "bigint_signed": ("(k BIGINT PRIMARY KEY, v INT)",
                      [f"INSERT INTO {{t}} SELECT CAST(seq AS SIGNED) * 3074457345618258 - 4611686018427387904, seq"
                       f" FROM seq_1_to_{N}",
                       "INSERT INTO {t} VALUES (-9223372036854775808, 0), (9223372036854775807, 0), (-1, 0), (0, 0)"]),
    "bigint_unsigned": ("(k BIGINT UNSIGNED PRIMARY KEY, v INT)",
                        [f"INSERT INTO {{t}} SELECT seq * 6148914691236517, seq FROM seq_1_to_{N}",
                         "INSERT INTO {t} VALUES (0, 0), (18446744073709551615, 0), (18446744073709551614, 0)"]),
    "decimal_65_30": ("(k DECIMAL(65, 30) PRIMARY KEY)",
                      [f"INSERT INTO {{t}} SELECT CAST(seq AS SIGNED) * 1234567.000000000000000000000000000001"
                       f" - 1000000000 FROM seq_1_to_{N}",
                       "INSERT INTO {t} VALUES (99999999999999999999999999999999999.999999999999999999999999999999),"
                       " (-99999999999999999999999999999999999.999999999999999999999999999999),"
                       " (0.000000000000000000000000000001)"]),
    "double_key": ("(id INT PRIMARY KEY, k DOUBLE NOT NULL, UNIQUE KEY uk (k))",
                   [f"INSERT INTO {{t}} SELECT seq, (CAST(seq AS SIGNED) - 1500) * 1.000001e100 FROM seq_1_to_{N}",
                    "INSERT INTO {t} VALUES (-1, -1.7e308), (-2, 1.7e308), (-3, 5e-324), (-4, 0.1)"]),
    "datetime6_same_second": ("(k DATETIME(6) PRIMARY KEY)",
                              [f"INSERT INTO {{t}} SELECT TIMESTAMP('2024-02-29 23:59:59') + INTERVAL seq MICROSECOND"
                               f" FROM seq_1_to_{N}",
                               "INSERT INTO {t} VALUES ('1000-01-01 00:00:00'), ('9999-12-31 23:59:59.999999')"]),
    "date_key": ("(id INT AUTO_INCREMENT PRIMARY KEY, d DATE NULL, KEY ix_d (d))",
                 [f"INSERT INTO {{t}} (d) SELECT DATE('2000-01-01') + INTERVAL (seq % 400) DAY FROM seq_1_to_{N}",
                  "INSERT INTO {t} (d) VALUES ('1000-01-01'), ('9999-12-31'), (NULL), (NULL)"]),
    "varchar_ci_pad": ("(id INT AUTO_INCREMENT PRIMARY KEY,"
                       " s VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci NOT NULL, KEY ix_s (s))",
                       ["INSERT INTO {t} (s) SELECT ELT(1 + seq % 12, 'abc', 'ABC', 'Abc', 'abc ', 'abc  ', 'ÀBC',"
                        " 'abd', 'ABD ', 'b', 'B', 'zz', 'Zz ') FROM seq_1_to_600",
                        f"INSERT INTO {{t}} (s) SELECT CONCAT(IF(seq % 2, 'k', 'K'), seq % 97, REPEAT(' ', seq % 3))"
                        f" FROM seq_1_to_{N}"]),
    "emoji_4byte": ("(k VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_520_ci PRIMARY KEY)",
                    [f"INSERT INTO {{t}} SELECT CONCAT(ELT(1 + seq % 8,"
                     " '🙂', '🚀', '𠀀', '😀x', 'a🙂', 'Ω', '€', '💩'),"
                     f" seq) FROM seq_1_to_{N}"]),
    "emoji_general_ci": ("(id INT AUTO_INCREMENT PRIMARY KEY,"
                         " s VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci, KEY ix_s (s))",
                         [f"INSERT INTO {{t}} (s) SELECT ELT(1 + seq % 6, '🙂', '🚀', '𠀀', '😀', 'a', NULL)"
                          f" FROM seq_1_to_{N}"]),
    "nullable_key": ("(id INT AUTO_INCREMENT PRIMARY KEY, k INT NULL, KEY ix_k (k))",
                     [f"INSERT INTO {{t}} (k) SELECT IF(seq % 4 = 0, NULL, seq) FROM seq_1_to_{N}"]),
    "empty_table": ("(k INT PRIMARY KEY)", []),
    "one_row": ("(k INT PRIMARY KEY)", ["INSERT INTO {t} VALUES (42)"]),
    "all_equal": ("(id INT AUTO_INCREMENT PRIMARY KEY, k INT NOT NULL, KEY ix_k (k))",
                  [f"INSERT INTO {{t}} (k) SELECT 7 FROM seq_1_to_{N}"]),
    "composite_pk": ("(a INT NOT NULL, b VARCHAR(8) NOT NULL, PRIMARY KEY (a, b))",
                     [f"INSERT INTO {{t}} SELECT seq % 50, CONCAT('b', seq) FROM seq_1_to_{N}"]),
    "no_index": ("(a INT, b VARCHAR(8))", [f"INSERT INTO {{t}} SELECT seq, 'x' FROM seq_1_to_{N}"]),
    "we`ird tab'le ñ": (f"({mysql_ident(WEIRD)} INT NOT NULL, v INT,"
                        f" UNIQUE KEY {mysql_ident('u`k ñ')} ({mysql_ident(WEIRD)}))",
                        [f"INSERT INTO {{t}} SELECT seq * 7, seq FROM seq_1_to_{N}"]),
    "quoted_values": ("(k VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PRIMARY KEY)", ["QUOTES"]),
    "binary_key": ("(k VARBINARY(8) PRIMARY KEY)",
                   [f"INSERT INTO {{t}} SELECT UNHEX(LPAD(HEX(seq * 2654435761 % 4294967296), 8, '0'))"
                    f" FROM seq_1_to_{N}",
                    "INSERT INTO {t} VALUES (X''), (X'00'), (X'27'), (X'5C'), (X'5C27'), (X'FF'), (X'C0AF')"]),
    "boolean_key": ("(id INT AUTO_INCREMENT PRIMARY KEY, f BOOLEAN NOT NULL, KEY ix_f (f))",
                    [f"INSERT INTO {{t}} (f) SELECT seq % 2 FROM seq_1_to_{N}"]),
    # PAD SPACE with characters below the space (a tab sorts before 'a' + padding) and
    # expansions ('ß' = 'ss', 'Æ' = 'AE') in strings of the column's full length
    "pad_below_space": ("(id INT AUTO_INCREMENT PRIMARY KEY,"
                        " s VARCHAR(6) CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_520_ci NULL, KEY ix_s (s))",
                        ["INSERT INTO {t} (s) SELECT ELT(1 + seq % 16, 'a', 'a ', 'a\t', 'a \t', 'A\t', 'ßßßßßß',"
                         " 'ssssss', 'ßßßßßt', 'Æ', 'ae', 'AE ', 'b', 'a\n', '', ' ', NULL) FROM seq_1_to_1600"]),
    # NO PAD: 'a' < 'a ' (and 'a\t' between them)
    "nopad_ci": ("(id INT AUTO_INCREMENT PRIMARY KEY,"
                 " s VARCHAR(8) CHARACTER SET utf8mb4 COLLATE utf8mb4_general_nopad_ci NOT NULL, KEY ix_s (s))",
                 ["INSERT INTO {t} (s) SELECT ELT(1 + seq % 8, 'a', 'a ', 'a\t', 'A', 'a  ', 'b', 'B ', '')"
                  " FROM seq_1_to_1600"]),
    "time_key": ("(k TIME(3) PRIMARY KEY)",
                 [f"INSERT INTO {{t}} SELECT SEC_TO_TIME(CAST(seq AS SIGNED) * 1000 - 1500000) FROM seq_1_to_{N}",
                  "INSERT INTO {t} VALUES ('-838:59:59.000'), ('838:59:59.000')"]),
}


# Tables whose interesting column is a secondary index: split on it (the PK would win otherwise).
SPLIT = {"double_key": "k", "date_key": "d", "varchar_ci_pad": "s", "emoji_general_ci": "s",
         "pad_below_space": "s", "nopad_ci": "s",
         "nullable_key": "k", "all_equal": "k", "boolean_key": "f"}




def create_matrix(conn) -> None:
    """(Re)create every table of the matrix in database ``DB`` (an autocommit pymysql connection)."""
    with conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {DB}")
        cur.execute(f"CREATE DATABASE {DB} DEFAULT CHARSET utf8mb4")
        cur.execute(f"USE {DB}")
        for name, (columns, inserts) in TABLES.items():
            table = mysql_table(DB, name)
            cur.execute(f"CREATE TABLE {table} {columns}")
            for sql in inserts:
                if sql == "QUOTES":
                    cur.executemany(f"INSERT INTO {table} VALUES (%s)", QUOTES + [f"z{i}'\\" for i in range(200)])
                else:
                    cur.execute(sql.format(t=table))

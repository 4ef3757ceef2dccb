"""Demo schema for the local MariaDB: orders, customers, order_items (sizes configurable).

Uses MariaDB's sequence engine (``seq_1_to_N``), so 1M orders take seconds; on MySQL it
builds the same numbers as a table of cross-joined digits.

Run: ``python -m devenv.demo_data --mysql-url mysql://root:pw@127.0.0.1:PORT/ --orders 1000000``
"""

from __future__ import annotations

import argparse

import pymysql

from airflow_sync_provider.core.endpoints import MySQLEndpoint
from airflow_sync_provider.core.sql import mysql_ident

# Customer ids mix case, accents, CJK and 4-byte emoji; the number keeps them unique under
# the case- and accent-insensitive collation.
CUSTOMER_PREFIXES = ["Alice", "bob", "ÉMILE", "zoë", "Zoë", "ñandú", "李雷", "🙂smile", "🚀Rocket", "o'neil"]

DDL = {
    "customers": """
        CREATE TABLE customers (
          id VARCHAR(64) NOT NULL COLLATE utf8mb4_unicode_ci,
          name VARCHAR(128) NOT NULL,
          email VARCHAR(128) NULL,
          created_at DATETIME(6) NOT NULL,
          PRIMARY KEY (id)
        ) DEFAULT CHARSET = utf8mb4""",
    "orders": """
        CREATE TABLE orders (
          id BIGINT NOT NULL,
          customer_id VARCHAR(64) NOT NULL,
          amount DECIMAL(12, 2) NOT NULL,
          discount DECIMAL(5, 2) NULL,
          created_at DATETIME(3) NOT NULL,
          shipped_at DATETIME NULL,
          status VARCHAR(16) NOT NULL,
          note VARCHAR(255) NULL,
          quantity INT UNSIGNED NOT NULL,
          weight DOUBLE NULL,
          PRIMARY KEY (id),
          KEY ix_created (created_at)
        ) DEFAULT CHARSET = utf8mb4""",
    "order_items": """
        CREATE TABLE order_items (
          order_id BIGINT NOT NULL,
          line_no SMALLINT UNSIGNED NOT NULL,
          sku VARCHAR(32) NOT NULL,
          price DECIMAL(10, 2) NOT NULL,
          qty INT NOT NULL,
          PRIMARY KEY (order_id, line_no),
          -- InnoDB renumbers and deletes an order's items itself, without binlog events: CDC
          -- follows them (docs/foreign-keys.md)
          CONSTRAINT items_order FOREIGN KEY (order_id) REFERENCES orders (id) ON UPDATE CASCADE ON DELETE CASCADE
        ) DEFAULT CHARSET = utf8mb4""",
}


def _numbers(cur, n: int) -> str:
    """A table expression with one column ``seq`` = 1..n."""
    cur.execute("SELECT VERSION()")
    if "mariadb" in cur.fetchone()[0].lower():
        return f"seq_1_to_{n}"
    cur.execute("DROP TABLE IF EXISTS _demo_numbers")
    cur.execute("CREATE TABLE _demo_numbers (seq BIGINT PRIMARY KEY)")
    digits = " UNION ALL ".join(f"SELECT {d} AS d" for d in range(10))
    width = len(str(n))
    joins = " CROSS JOIN ".join(f"({digits}) d{i}" for i in range(width))
    value = " + ".join(f"d{i}.d * {10 ** i}" for i in range(width))
    cur.execute(f"INSERT INTO _demo_numbers SELECT {value} + 1 FROM {joins} WHERE {value} < {n}")
    return "_demo_numbers"


def generate(mysql_url: str, database: str = "demo", orders: int = 1_000_000, customers: int = 10_000,
             items_per_order: int = 3, item_orders: int | None = None) -> dict[str, int]:
    """(Re)create the demo tables and fill them; returns the row count of each table."""
    item_orders = min(orders, item_orders if item_orders is not None else 100_000)
    endpoint = MySQLEndpoint.from_url(mysql_url)
    conn = pymysql.connect(**MySQLEndpoint(**{**endpoint.__dict__, "database": ""}).connect_args(), autocommit=True)
    with conn, conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE IF NOT EXISTS {mysql_ident(database)} DEFAULT CHARSET utf8mb4")
        cur.execute(f"USE {mysql_ident(database)}")
        for table in reversed(DDL):  # children first: a foreign key holds its parent
            cur.execute(f"DROP TABLE IF EXISTS {mysql_ident(table)}")
        for ddl in DDL.values():
            cur.execute(ddl)
        seq = _numbers(cur, max(orders, customers, item_orders, items_per_order))
        prefixes = ", ".join(conn.escape(p) for p in CUSTOMER_PREFIXES)
        n_prefix = len(CUSTOMER_PREFIXES)
        cur.execute(f"""
            INSERT INTO customers
            SELECT CONCAT(ELT(1 + seq % {n_prefix}, {prefixes}), '-', seq),
                   CONCAT('Customer ', seq), IF(seq % 7 = 0, NULL, CONCAT('c', seq, '@example.com')),
                   TIMESTAMP('2024-01-01') + INTERVAL seq SECOND + INTERVAL seq % 1000000 MICROSECOND
            FROM {seq} WHERE seq <= {customers}""")
        cur.execute(f"""
            INSERT INTO orders
            SELECT seq,
                   CONCAT(ELT(1 + (seq % {customers} + 1) % {n_prefix}, {prefixes}), '-', seq % {customers} + 1),
                   (seq * 7919 % 1000000) / 100, IF(seq % 5 = 0, NULL, (seq % 5000) / 100),
                   TIMESTAMP('2025-01-01') + INTERVAL (seq * 37) SECOND + INTERVAL seq % 1000 * 1000 MICROSECOND,
                   IF(seq % 3 = 0, NULL, TIMESTAMP('2025-01-02') + INTERVAL (seq * 37) SECOND),
                   ELT(1 + seq % 4, 'new', 'paid', 'shipped', 'cancelled'),
                   IF(seq % 10 = 0, NULL, CONCAT('note ', seq, IF(seq % 97 = 0, ' ünïcödé 🙂 \\'q\\'', ''))),
                   IF(seq % 1000 = 0, 4294967295, seq % 100 + 1),
                   IF(seq % 11 = 0, NULL, seq / 3)
            FROM {seq} WHERE seq <= {orders}""")
        cur.execute(f"""
            INSERT INTO order_items
            SELECT o.seq, l.seq, CONCAT('SKU-', (o.seq * l.seq) % 5000), (o.seq % 10000) / 100 + l.seq, l.seq
            FROM {seq} o JOIN {seq} l ON o.seq <= {item_orders} AND l.seq <= {items_per_order}""")
        cur.execute("DROP TABLE IF EXISTS _demo_numbers")
        counts = {}
        for table in DDL:
            cur.execute(f"SELECT COUNT(*) FROM {mysql_ident(table)}")
            counts[table] = cur.fetchone()[0]
    return counts


def main(argv=None):
    parser = argparse.ArgumentParser(description="Create the demo schema in a MySQL/MariaDB server.")
    parser.add_argument("--mysql-url", required=True)
    parser.add_argument("--database", default="demo")
    parser.add_argument("--orders", type=int, default=1_000_000)
    parser.add_argument("--customers", type=int, default=10_000)
    parser.add_argument("--item-orders", type=int, default=100_000, help="orders that get order_items rows")
    args = parser.parse_args(argv)
    print(generate(args.mysql_url, args.database, args.orders, args.customers, item_orders=args.item_orders))


if __name__ == "__main__":
    main()

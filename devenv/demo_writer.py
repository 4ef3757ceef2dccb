"""A steady writer on the demo's ``orders`` and ``order_items`` (the CDC demo and bench).

About ``rate`` row changes per second in small transactions: new orders with their items,
updates (NULL ↔ value included), deletes of orders with their items, primary-key changes. A
second connection keeps a transaction open for ``hold_seconds`` every ``hold_every`` seconds
(updates held across a bootstrap's chunk windows, then committed).
"""

from __future__ import annotations

import random
import threading
import time

import pymysql

from airflow_sync_provider.core.endpoints import MySQLEndpoint
from airflow_sync_provider.core.sql import mysql_table


class DemoWriter(threading.Thread):
    def __init__(self, mysql_url: str, database: str = "demo", rate: float = 500, hold_every: float = 3.0,
                 hold_seconds: float = 1.5, seed: int = 11):
        super().__init__(daemon=True, name="demo-writer")
        self.conn = pymysql.connect(**MySQLEndpoint.from_url(mysql_url).connect_args(), autocommit=False)
        self.holder = pymysql.connect(**MySQLEndpoint.from_url(mysql_url).connect_args(), autocommit=False)
        self.orders, self.items = mysql_table(database, "orders"), mysql_table(database, "order_items")
        self.rate, self.hold_every, self.hold_seconds = rate, hold_every, hold_seconds
        self.rng = random.Random(seed)
        self.stop_event = threading.Event()
        self.changes = self.transactions = self.held = 0
        self.error: Exception | None = None
        with self.conn.cursor() as cur:
            cur.execute(f"SELECT COALESCE(MAX(id), 0), COUNT(*) FROM {self.orders}")
            self.top, self.count = cur.fetchone()
        self.next_id = max(self.top, 0) + 1_000_000_000  # clear of the generated ids

    def _some_id(self) -> int:
        return self.rng.randint(1, max(1, self.top))

    def _transaction(self, cur) -> int:
        rng, kind = self.rng, self.rng.random()
        if kind < 0.35:  # a new order with its items
            order = self.next_id
            self.next_id += 1
            cur.execute(f"INSERT INTO {self.orders} VALUES (%s, %s, %s, %s, UTC_TIMESTAMP(3), NULL, 'new', %s, %s, %s)",
                        (order, f"Alice-{rng.randint(1, 100)}", rng.randint(100, 99999) / 100,
                         rng.choice([None, 1.5]), rng.choice([None, "writer 🙂"]), rng.randint(1, 9), None))
            lines = rng.randint(1, 3)
            cur.executemany(f"INSERT INTO {self.items} VALUES (%s, %s, %s, %s, %s)",
                            [(order, n, f"SKU-{rng.randint(1, 5000)}", rng.randint(100, 9999) / 100, n)
                             for n in range(1, lines + 1)])
            return 1 + lines
        if kind < 0.75:  # updates, NULL ↔ value included
            ids = [self._some_id() for _ in range(rng.randint(1, 5))]
            n = cur.executemany(f"UPDATE {self.orders} SET status = %s, note = %s, discount = %s WHERE id = %s",
                                [(rng.choice(["paid", "shipped", "cancelled"]), rng.choice([None, "upd ü"]),
                                  rng.choice([None, rng.randint(0, 999) / 100]), i) for i in ids])
            n += cur.execute(f"UPDATE {self.items} SET qty = qty + 1 WHERE order_id = %s", (ids[0],))
            return n
        if kind < 0.9:  # an order and its items deleted
            order = self._some_id()
            return (cur.execute(f"DELETE FROM {self.items} WHERE order_id = %s", (order,))
                    + cur.execute(f"DELETE FROM {self.orders} WHERE id = %s", (order,)))
        order, new = self._some_id(), self.next_id  # a primary-key change
        self.next_id += 1
        return cur.execute(f"UPDATE {self.orders} SET id = %s WHERE id = %s", (new, order))

    def _hold(self) -> None:
        """Every ``hold_every`` s: update a few orders, keep the transaction open, then commit."""
        rng = random.Random(self.rng.random())
        try:
            while not self.stop_event.wait(self.hold_every):
                with self.holder.cursor() as cur:
                    self.changes += cur.executemany(
                        f"UPDATE {self.orders} SET note = %s WHERE id = %s",
                        [(f"held {self.held}", rng.randint(1, max(1, self.top))) for _ in range(5)])
                    time.sleep(self.hold_seconds)
                self.holder.commit()
                self.held += 1
        except Exception as exc:
            self.error = exc
        finally:
            self.holder.close()

    def run(self) -> None:
        holder = threading.Thread(target=self._hold, daemon=True)
        if self.hold_every:
            holder.start()
        started = time.monotonic()
        try:
            while not self.stop_event.is_set():
                with self.conn.cursor() as cur:
                    self.changes += self._transaction(cur)
                self.conn.commit()
                self.transactions += 1
                ahead = self.changes / self.rate - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(ahead)
        except Exception as exc:  # reported by the caller
            self.error = exc
        finally:
            self.conn.close()
            if holder.is_alive():
                holder.join()

    def stop(self) -> None:
        self.stop_event.set()
        self.join()
        if self.error is not None:
            raise RuntimeError(f"the demo writer failed: {self.error}") from self.error

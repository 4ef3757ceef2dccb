"""A writer for CDC tests: mixed INSERT / UPDATE / DELETE / key changes / transactions across
two tables (``mixed``: every mapped type; ``lines``: a composite key) at a steady rate."""

from __future__ import annotations

from airflow_sync_provider.core.endpoints import MySQLEndpoint


def mixed_ddl(db: str) -> str:
    return f"""CREATE TABLE {db}.mixed (
  id BIGINT UNSIGNED PRIMARY KEY, amount DECIMAL(65, 30) NULL, name VARCHAR(40) NULL, at DATETIME(6) NULL,
  ts TIMESTAMP(6) NULL, t TIME(3) NULL, b BIT(12) NULL, e ENUM('a', 'b', 'c') NULL, s SET('x', 'y') NULL,
  j JSON NULL, bin VARBINARY(16) NULL, y YEAR NULL, f FLOAT NULL, d DOUBLE NULL, dt DATE NULL,
  u BIGINT UNSIGNED NULL, ci VARCHAR(20) COLLATE utf8mb4_unicode_ci NULL
) DEFAULT CHARSET = utf8mb4"""


def lines_ddl(db: str) -> str:
    return f"""CREATE TABLE {db}.`lines` (account_id BIGINT NOT NULL, seq INT NOT NULL, amount DECIMAL(12, 2) NOT NULL,
  note VARCHAR(20) NULL, PRIMARY KEY (account_id, seq))"""



def _value(rng, column: str):
    if rng.random() < 0.15:
        return None
    return {
        "amount": lambda: f"{rng.randint(-10 ** 34, 10 ** 34)}.{rng.randint(0, 10 ** 30 - 1):030d}",
        "name": lambda: rng.choice(["", "ñandú", "🙂 emoji", "it's", "x" * 40, f"n{rng.randint(0, 999)}"]),
        "at": lambda: f"{rng.randint(1900, 2299)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d} "
                      f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}."
                      f"{rng.randint(0, 999999):06d}",
        "ts": lambda: f"{rng.randint(1971, 2037)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d} "
                      f"12:00:00.{rng.randint(0, 999999):06d}",
        "t": lambda: f"{rng.choice(['-', ''])}{rng.randint(0, 838)}:{rng.randint(0, 59):02d}:"
                     f"{rng.randint(0, 59):02d}.{rng.randint(0, 999):03d}",
        "b": lambda: rng.randint(0, 4095),
        "e": lambda: rng.choice("abc"),
        "s": lambda: rng.choice(["", "x", "y", "x,y"]),
        "j": lambda: rng.choice(['{"k": [1, 2]}', "[]", '"ü"', "null"]),
        "bin": lambda: bytes(rng.randint(0, 255) for _ in range(rng.randint(0, 16))),
        "y": lambda: rng.choice([0, 1901, 2155, rng.randint(1901, 2155)]),
        "f": lambda: rng.choice([0.0, -0.0, 3.4028234e38, rng.uniform(-1e6, 1e6)]),
        "d": lambda: rng.choice([5e-324, -1.7976931348623157e308, 1e20, rng.uniform(-1e9, 1e9)]),
        "dt": lambda: f"{rng.randint(1900, 2299)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
        "u": lambda: rng.choice([0, 2 ** 64 - 1, rng.randint(0, 2 ** 64 - 1)]),
        "ci": lambda: rng.choice(["a", "A", "b ", "Ä", "z"]),
    }[column]()


MIXED_COLUMNS = ["amount", "name", "at", "ts", "t", "b", "e", "s", "j", "bin", "y", "f", "d", "dt", "u", "ci"]


class Writer:
    """Mixed INSERT / UPDATE / DELETE at about ``rate`` row changes per second: multi-row
    statements, transactions across both tables, key changes, NULL ↔ value."""

    def __init__(self, mysql_url, rate=500, seed=7, database="cdc", hold_every=0, hold_seconds=1.5):
        import random
        import threading

        import pymysql

        self.db = database
        self.conn = pymysql.connect(**MySQLEndpoint.from_url(mysql_url).connect_args(), autocommit=False)
        with self.conn.cursor() as cur:
            cur.execute("SET time_zone = '+00:00'")
        self.rng, self.rate, self.changes = random.Random(seed), rate, 0
        self.next_id, self.live = 1, set()
        self.stop = threading.Event()
        # every hold_every-th transaction stays open hold_seconds before it commits (across
        # the bootstrap's chunk windows)
        self.hold_every, self.hold_seconds, self.held = hold_every, hold_seconds, 0
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.error = None
        # a test whose point is writes *during* something else sets this: while it says the
        # reader is too far behind, the writer waits (at most once a second it asks), so a
        # loaded machine slows the workload instead of drowning the reader
        self.behind = None

    def insert(self, cur, n):
        rows = []
        for _ in range(n):
            rows.append((self.next_id, *(_value(self.rng, c) for c in MIXED_COLUMNS)))
            self.live.add(self.next_id)
            self.next_id += 1
        cur.executemany(f"INSERT INTO {self.db}.mixed (id, {', '.join(MIXED_COLUMNS)}) VALUES "
                        f"({', '.join(['%s'] * (len(MIXED_COLUMNS) + 1))})", rows)
        return n

    def prefill(self, rows: int) -> None:
        """Rows the table starts with (before the writer runs), in 1,000-row transactions."""
        while rows > 0:
            with self.conn.cursor() as cur:
                self.insert(cur, min(rows, 1000))
            self.conn.commit()
            rows -= 1000

    def transaction(self, cur) -> int:
        rng, live = self.rng, sorted(self.live)
        kind = rng.random()
        if kind < 0.35 or len(live) < 20:
            return self.insert(cur, rng.randint(1, 20))
        picked = rng.sample(live, rng.randint(1, 10))
        marks = ", ".join(["%s"] * len(picked))
        if kind < 0.6:  # one or two columns, NULL ↔ value included
            columns = rng.sample(MIXED_COLUMNS, rng.randint(1, 2))
            return cur.execute(f"UPDATE {self.db}.mixed SET " + ", ".join(f"{c} = %s" for c in columns)
                               + f" WHERE id IN ({marks})", [*(_value(rng, c) for c in columns), *picked])
        if kind < 0.7:
            self.live -= set(picked)
            return cur.execute(f"DELETE FROM {self.db}.mixed WHERE id IN ({marks})", picked)
        if kind < 0.8:  # primary-key changes
            old = picked[0]
            self.live.discard(old)
            self.live.add(self.next_id)
            self.next_id += 1
            return cur.execute(f"UPDATE {self.db}.mixed SET id = %s WHERE id = %s", (self.next_id - 1, old))
        # a transaction across both tables
        account = rng.choice(live)
        n = cur.execute(f"UPDATE {self.db}.mixed SET amount = %s WHERE id = %s", (_value(rng, "amount"), account))
        n += cur.executemany(f"INSERT INTO {self.db}.`lines` VALUES (%s, %s, %s, %s) ON DUPLICATE KEY UPDATE "
                             f"amount = VALUES(amount), note = VALUES(note)",
                             [(account, rng.randint(0, 5), f"{rng.randint(-999, 999)}.{rng.randint(0, 99):02d}",
                               rng.choice([None, "n", "ü"])) for _ in range(rng.randint(1, 4))])
        if rng.random() < 0.3:
            n += cur.execute(f"DELETE FROM {self.db}.`lines` WHERE account_id = %s AND seq < %s",
                             (account, rng.randint(0, 5)))
        return n

    def run(self):
        import time

        started = asked = time.monotonic()
        try:
            while not self.stop.is_set():
                if self.behind is not None and time.monotonic() - asked >= 1.0:
                    paused = time.monotonic()
                    while not self.stop.is_set() and self.behind():
                        time.sleep(0.2)
                    asked = time.monotonic()
                    started += asked - paused  # the pause is not made up with a burst
                with self.conn.cursor() as cur:
                    self.changes += self.transaction(cur)
                    if self.hold_every and self.rng.randrange(self.hold_every) == 0:
                        self.held += 1
                        self.changes += self.transaction(cur)  # more changes in the same open transaction
                        time.sleep(self.hold_seconds)
                self.conn.commit()
                ahead = self.changes / self.rate - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(ahead)
        except Exception as exc:  # surfaced by the test
            self.error = exc

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        self.conn.close()

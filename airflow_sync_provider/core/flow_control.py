"""DataX-style flow control: hold a channel to its records/s and bytes/s limits."""

from __future__ import annotations

import time


class Throttle:
    """Sleeps just enough that the channel's totals since its start stay within the limits.

    Judging the totals (not each batch) keeps the long-run rate exact whatever the batch sizes.
    """

    def __init__(self, records_per_second: int | None = None, bytes_per_second: int | None = None,
                 clock=time.monotonic, sleep=time.sleep):
        self.records_limit = records_per_second or None
        self.bytes_limit = bytes_per_second or None
        self.clock, self.sleep = clock, sleep
        self.start = clock()
        self.records = self.bytes = 0

    def chunk_rows(self, batch_rows: int) -> int:
        """Rows to fetch at a time: about 20 chunks a second under a record limit, so the rate is smooth."""
        if self.records_limit:
            return max(1, min(batch_rows, self.records_limit // 20))
        return batch_rows

    def account(self, records: int, nbytes: int) -> float:
        """Count what was just moved and wait if ahead of the limits; returns seconds slept."""
        self.records += records
        self.bytes += nbytes
        due = max(self.records / self.records_limit if self.records_limit else 0.0,
                  self.bytes / self.bytes_limit if self.bytes_limit else 0.0)
        wait = self.start + due - self.clock()
        if wait > 0:
            self.sleep(wait)
            return wait
        return 0.0

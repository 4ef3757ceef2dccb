"""The peak memory of a job's process tree, sampled from /proc as bench/full_load.py does.

``PeakRss`` samples every ``interval`` s the VmRSS of every process that descends from this one
and was started after sampling began (a job's driver, its reader processes, Spark's JVM and
workers), summed per sample, and keeps the largest sum: the job's whole tree, without the
services (MariaDB, the ClickHouse endpoint) the same test or bench started before it.
"""

from __future__ import annotations

import os
import threading


def _stat(pid: str) -> int | None:
    """The parent pid of ``pid`` (None: gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def rss_kib(pid: int) -> int:
    """A process's resident set (VmRSS, KiB; 0: gone)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit() and (parent := _stat(pid)) is not None:
            children.setdefault(parent, []).append(int(pid))
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


class PeakRss(threading.Thread):
    """``with PeakRss() as peak: run the job`` → ``peak.mib``: the largest sum of the job tree's RSS."""

    def __init__(self, interval: float = 0.2):
        super().__init__(daemon=True)
        self.interval, self.stop = interval, threading.Event()
        self.before = descendants(os.getpid())
        self.peak_kib, self.samples, self.processes = 0, 0, set()

    def run(self):
        while True:
            pids = descendants(os.getpid()) - self.before
            self.processes |= pids
            self.peak_kib = max(self.peak_kib, sum(rss_kib(p) for p in pids))
            self.samples += 1
            if self.stop.wait(self.interval):
                return

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.join()

    @property
    def mib(self) -> float:
        return self.peak_kib / 1024

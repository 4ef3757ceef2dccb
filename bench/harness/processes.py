"""What a job's processes cost: CPU (every process the job starts, wherever it ends up), memory,
and the CPU of other work on the machine, sampled from /proc.

``with ProcessSampler() as s: run the job`` and then:

* ``s.cpu()``: CPU seconds of every process that descended from this bench during the block
  (a job's driver, the fork server its binlog readers are forked from and the readers, Spark's
  JVM and Python workers, a peer's processes), its own services (MariaDB, the ClickHouse
  endpoint) excepted; ``s.cpu_by_role()`` the same by role (``roles``: a function of a process's
  command line and its parent's; the default: :data:`GROUPS`, services included);
* ``s.foreign_cores``: the CPU of processes that are not this bench's (other work), cores on
  average; ``s.contention()`` with the load average;
* the peak RSS of Spark's Python workers, its JVM and the job's Python driver.

How the CPU is counted. Every ``interval`` s each process is read once (/proc/PID/stat: its own
user + system time, and its reaped children's ``cutime + cstime``); a process is kept, by pid and
start time, once it has been below this bench, and read on after it left the tree (the fork
server outlives the driver that started it and is reparented to init: the bench's own
``RUSAGE_CHILDREN`` never sees it, nor the readers it reaped). A process counts what it had at its
last reading (less what it had at its first, if it was there when the block began). What it used
after its last reading reaches its parent's ``cutime + cstime`` once the parent reaps it, so every
process is also credited with the reaped time beyond what was counted for its children seen
gone — and the bench itself with its ``RUSAGE_CHILDREN`` (exact for what it waits for: a job's
driver). Lost is only what ends up reaped by a process that is no longer read (init): a process
that exits between two readings, orphaned or with a parent that is, loses at most its last
interval (``interval`` s of CPU). When the block ends, processes of the block still running
outside the tree are waited for up to ``linger`` s and read every 0.05 s, so the fork server's
last reading holds its readers.
"""

from __future__ import annotations

import collections
import os
import resource
import threading
import time
from dataclasses import dataclass

from bench.harness.measure import LoadAverage
from devenv.rss import rss_kib

TICKS = os.sysconf("SC_CLK_TCK")
SERVICES = ("MariaDB", "ClickHouse endpoint")
GROUPS = (*SERVICES, "Spark JVM", "Python workers", "Python driver")


def proc_stat(pid) -> tuple[int, int, int, int] | None:
    """(ppid, own utime + stime, reaped children's cutime + cstime, start time), ticks; None: gone
    (a zombie is not: its parent has not reaped it yet)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14]), int(fields[19])


def cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def service(cmd: list[str]) -> str | None:
    """The bench's own services: its MariaDB, its ClickHouse endpoint."""
    if not cmd:
        return None
    if os.path.basename(cmd[0]) == "mariadbd":
        return "MariaDB"
    if "devenv.clickhouse_http" in cmd:
        return "ClickHouse endpoint"
    return None


def is_python_worker(cmd: list[str]) -> bool:
    text = " ".join(cmd)
    return "pyspark.daemon" in text or "pyspark/worker" in text or "pyspark.worker" in text


def process_group(cmd: list[str], parent: list[str]) -> str | None:
    """:data:`GROUPS`: the services, Spark's JVM, Spark's Python workers (``pyspark.daemon`` and
    the workers it forks), any other Python process (a driver, its fork server and readers, a
    peer)."""
    name = os.path.basename(cmd[0]) if cmd else ""
    if service(cmd):
        return service(cmd)
    if name == "java":
        return "Spark JVM"
    if is_python_worker(cmd) or is_python_worker(parent):
        return "Python workers"
    if "python" in name:
        return "Python driver"
    return None


@dataclass
class _Proc:
    """One process as last read (ticks)."""

    pid: int
    ppid: int
    own: int
    reaped: int
    existed: bool  # there when the block began: counted from its first reading
    first_own: int
    first_reaped: int
    role: str | None = None
    service: str | None = None
    alive: bool = True

    def window(self) -> tuple[int, int]:
        if not self.existed:
            return self.own, self.reaped
        return self.own - self.first_own, self.reaped - self.first_reaped


class ProcessSampler(threading.Thread):
    """See the module's docstring. ``roles(cmd, parent_cmd)`` names a process's role for
    :meth:`cpu_by_role`; ``self_cpu``: count this process's own CPU too (less the sampler's), for
    work the bench runs in itself."""

    def __init__(self, interval: float = 0.2, roles=process_group, linger: float = 2.0, self_cpu: bool = False):
        super().__init__(daemon=True)
        self.interval, self.roles, self.linger, self.self_cpu = interval, roles, linger, self_cpu
        self.stop_event = threading.Event()
        self.procs: dict[tuple[int, int], _Proc] = {}  # (pid, start time) -> what was last read of it
        self.foreign_ticks = 0
        self._foreign_last: dict[tuple[int, int], int] = {}
        self.samples = 0
        # RSS (KiB): Spark's Python workers (forked by the daemon) and daemon, JVM, the Python driver
        self.worker_max: dict[int, int] = {}
        self.daemon_max = self.workers_sum_max = self.jvm_max = self.driver_max = 0
        self.settle: float | None = None  # set by the caller: the target's CPU after the block (merges)

    # --- reading ------------------------------------------------------------------------------------

    def _sample(self, initial: bool = False, foreign: bool = True) -> None:
        me = os.getpid()
        stats = {}
        for name in os.listdir("/proc"):
            if name.isdigit() and (stat := proc_stat(name)):
                stats[int(name)] = stat
        children: dict[int, list[int]] = {}
        for pid, stat in stats.items():
            children.setdefault(stat[0], []).append(pid)
        ours, todo = set(), [me]
        while todo:
            for child in children.get(todo.pop(), []):
                if child not in ours:
                    ours.add(child)
                    todo.append(child)
        if foreign:
            now = {}
            for pid, (_, own, _, start) in stats.items():
                if pid not in ours and pid != me and (pid, start) not in self.procs:
                    now[pid, start] = own
                    self.foreign_ticks += max(0, own - self._foreign_last.get((pid, start), own))
            self._foreign_last = now
        commands: dict[int, list[str]] = {}

        def command(pid):
            if pid not in commands:
                commands[pid] = cmdline(pid)
            return commands[pid]

        for proc in self.procs.values():
            proc.alive = False
        for pid, (ppid, own, reaped, start) in stats.items():
            proc = self.procs.get((pid, start))
            if pid not in ours and proc is None:
                continue
            if proc is None:
                proc = self.procs[pid, start] = _Proc(pid, ppid, own, reaped, initial, own, reaped)
            proc.ppid, proc.own, proc.reaped, proc.alive = ppid, own, reaped, True
            if pid in ours and command(pid):  # (again: an exec changes it; a zombie has none)
                proc.service = service(command(pid))
                proc.role = self.roles(command(pid), command(ppid))
        self._memory(ours, stats, command)
        self.samples += 1

    def _memory(self, ours: set[int], stats: dict, command) -> None:
        workers_sum = 0
        for pid in ours:
            cmd = command(pid)
            if not cmd:
                continue
            if is_python_worker(cmd):
                rss = rss_kib(pid)
                if is_python_worker(command(stats[pid][0])):  # forked by the daemon: a worker
                    self.worker_max[pid] = max(self.worker_max.get(pid, 0), rss)
                    workers_sum += rss
                else:
                    self.daemon_max = max(self.daemon_max, rss)
            elif os.path.basename(cmd[0]) == "java":
                self.jvm_max = max(self.jvm_max, rss_kib(pid))
            elif any(a.endswith(("full_load.py", "diy_spark_jdbc.py", "snapshot_diff.py")) for a in cmd[1:]) \
                    and "python" in os.path.basename(cmd[0]):
                self.driver_max = max(self.driver_max, rss_kib(pid))
        self.workers_sum_max = max(self.workers_sum_max, workers_sum)

    def _guarded(self, **kwargs) -> None:
        try:
            self._sample(**kwargs)
        except Exception as exc:  # a sampling hiccup must not kill the bench
            print(f"sampler: {type(exc).__name__}: {exc}", flush=True)

    def run(self):
        began = time.thread_time()
        self._guarded(initial=True)
        while not self.stop_event.wait(self.interval):
            self._guarded()
        self._children_end = _children_seconds()  # before the last readings: never counted twice
        deadline = time.monotonic() + self.linger
        while self._orphans() and time.monotonic() < deadline:
            time.sleep(0.05)
            self._guarded(foreign=False)
        self._guarded(foreign=False)
        self._own_seconds = time.thread_time() - began

    def _orphans(self) -> list[_Proc]:
        """The block's processes still running outside this bench's tree (reparented)."""
        me = os.getpid()
        ours = {p.pid for p in self.procs.values() if p.alive}
        return [p for p in self.procs.values()
                if p.alive and not p.service and not p.existed and p.ppid not in ours and p.ppid != me]

    def __enter__(self):
        self.started = time.monotonic()
        self.load = LoadAverage().__enter__()
        self._children_start, self._self_start = _children_seconds(), _self_seconds()
        self.start()
        return self

    def __exit__(self, *exc):
        self.seconds = time.monotonic() - self.started  # the block's (the linger is not)
        self.stop_event.set()
        self.join()
        self._self_end = _self_seconds()
        self.load.__exit__()

    # --- CPU ----------------------------------------------------------------------------------------

    def _credits(self) -> list[tuple[str | None, float]]:
        """(role, CPU seconds) pieces that add up to the block's CPU (services excepted): each
        process's own, and what it reaped beyond its gone children's counted time."""
        gone: dict[int, list[_Proc]] = collections.defaultdict(list)
        for proc in self.procs.values():
            if not proc.alive and not proc.service:
                gone[proc.ppid].append(proc)

        def beyond(reaped: float, pid: int, role: str | None) -> tuple[str | None, float]:
            kids = gone.get(pid, [])
            counted = sum(k.own + k.reaped for k in kids) / TICKS  # a reaped child's whole life is in ``reaped``
            roles = {k.role for k in kids}
            return (roles.pop() if len(roles) == 1 else role), max(0.0, reaped - counted)

        out = []
        for proc in self.procs.values():
            if proc.service:
                continue
            own, reaped = proc.window()
            out += [(proc.role, own / TICKS), beyond(reaped / TICKS, proc.pid, proc.role)]
        out.append(beyond(self._children_end - self._children_start, os.getpid(), None))
        if self.self_cpu:
            out.append(("this process", max(0.0, self._self_end - self._self_start - self._own_seconds)))
        return out

    def cpu(self) -> float:
        """CPU seconds of everything the block ran (see the module's docstring)."""
        return sum(seconds for _, seconds in self._credits())

    def cpu_by_role(self) -> dict[str, float]:
        """CPU seconds by role; the services' own CPU in the block under their names."""
        out: dict[str, float] = collections.Counter()
        for role, seconds in self._credits():
            if role is not None:
                out[role] += seconds
        for proc in self.procs.values():
            if proc.service:
                out[proc.service] += proc.window()[0] / TICKS
        return out

    def services_cpu(self) -> float:
        return sum(proc.window()[0] for proc in self.procs.values() if proc.service) / TICKS

    def processes(self, role: str) -> int:
        return sum(1 for proc in self.procs.values() if proc.role == role and not proc.service)

    # --- memory and other work ----------------------------------------------------------------------

    @property
    def worker_peak_mib(self) -> float:
        return max(self.worker_max.values(), default=0) / 1024

    @property
    def foreign_cores(self) -> float:
        return self.foreign_ticks / TICKS / self.seconds if self.seconds else 0.0

    def contention(self) -> str:
        """1-min load average before→after / other work's CPU, cores on average."""
        return f"{self.load} / {self.foreign_cores:.2f}"


def _children_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _self_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def target_settle_cpu(max_seconds: float = 60.0) -> float | None:
    """CPU seconds the ClickHouse endpoint spends after a path returned, until it is idle (under
    2 % of a core for a second): background merges of the parts the path wrote. None when the
    target is not the local stand-in (an external server's CPU is not ours to sample)."""
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit() and "devenv.clickhouse_http" in cmdline(int(p))]
    if not pids:
        return None

    def ticks():
        return sum((proc_stat(p) or (0, 0))[1] for p in pids)

    start = last = ticks()
    deadline = time.monotonic() + max_seconds
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = ticks()
        if now - last <= 0.02 * TICKS:
            break
        last = now
    return (ticks() - start) / TICKS

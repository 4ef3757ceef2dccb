"""The pipeline checks itself: every table of a pipeline is compared with the source slice by
slice, at least once per ``verify_period``, while the stream goes on; mismatched slices are
repaired in place.

**A slice look.** A slice is one shard of a plan of the table on its split column (about
``SHARD_ROWS`` rows; up to ``MAX_SHARDS``, plus the NULL shard). A look opens a consistent
snapshot of the source at a binlog position S (core/positions.snapshot_position; the
table's definition read on both sides of S must agree) and waits until the stream has applied
everything before S — it does not stop the stream. The copy is then read once, ``FINAL``:
keys whose newest version is at or above S's (changed at or after S) are set aside, and the
count and checksum of the other live rows are taken; those rows are each key's value at S, as
nothing changed them since. The source's count and checksum of the same slice, without the
keys set aside, are computed in the snapshot. Equal: the slice is right at S. Different: the
slice is repaired from the same snapshot — its rows written with S's repair version (above
every change before S, below every change after it, so the keys set aside keep their newer
values) and tombstones of that version for the copy's rows the source does not have — and
looked at again with a new snapshot. Still different on the third look: the pipeline stops.
A repaired table that foreign-key cascades reach has its cascades since S resolved again (the
stream went on past S before the look, and a cascade meanwhile missed the rows that were wrong).

**When.** Each table's pass goes through its slices evenly over ``verify_period`` (a table
joins the schedule when it is first seen), at most ``verify_budget`` of one source core
(MySQL's hashing measured as it goes). A DDL, a TRUNCATE, a re-copy or a takeover that touched
a table makes it due (``PipelineTable.mark_due``): its next pass starts at once and goes as
fast as the budget allows. A service does this in a thread of the driver; a bounded run does it
while it streams and, before it ends, whatever its tables are due or behind schedule, at one
snapshot to which it catches up (the source's rows and the copy's at the same position, no key
set aside). ``verify=True`` makes every table due once.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import queue
import threading
import time
from dataclasses import dataclass, field

from airflow_sync_provider.core.cdc.history_checks import gaps, record_holes
from airflow_sync_provider.core.cdc.history_ledger import HistoryLedger
from airflow_sync_provider.core.cdc.tables import PipelineTable
from airflow_sync_provider.core.clickhouse.client import client
from airflow_sync_provider.core.clickhouse.described import column_types
from airflow_sync_provider.core.clickhouse.ttl import Window
from airflow_sync_provider.core.positions import (
    BinlogError,
    BinlogPosition,
)
from airflow_sync_provider.spark.cdc_run import VerifiedRun
from airflow_sync_provider.spark.cdc_slices import (
    MAX_SET_ASIDE,
    Snapshot,
    TableCheck,
    copy_at,
    copy_columns,
    history_look,
    plan_check,
    repair,
)

LOOKS = 3  # a repaired slice is looked at again; still different on the third look: stop
SCHEDULE_TICK = 0.5  # how often an idle verifier looks whether a slice is due
PUT_OFF_WAIT, PUT_OFF_WAIT_MAX = 0.1, 2.0  # seconds before a put-off look is tried again, per time in a row


class VerifyFailed(BinlogError):
    pass


@dataclass
class Look:
    """One slice looked at: its verdict at S and what the repair wrote."""

    table: str
    slice_id: int
    position: BinlogPosition
    source: tuple
    copy: tuple
    set_aside: int
    repaired_rows: int = -1  # -1: not repaired (equal, or the look was given up)
    note: str = ""
    began: float = 0.0  # when its snapshot was taken
    history: tuple = ()  # a copy that keeps one: its newest versions at S (rows, checksum), its keys in conflict
    holes: list = field(default_factory=list)  # its history's ranges counted wrong at a pass's end, recorded

    @property
    def equal(self) -> bool:
        return self.source == self.copy and (not self.history or self.history == (*self.source, 0))


@dataclass
class Pass:
    """A table's pass through its slices, carried in its entry (``verify_pass``) between runs."""

    started: float
    slices: int
    next: int = 0
    position: dict | None = None  # the first look's S
    mismatched: list = field(default_factory=list)
    repaired: int = 0
    rows_repaired: int = 0
    due: bool = False  # started because the table was due: not paced, only budgeted
    history_holes: list = field(default_factory=list)  # its history's ranges counted wrong, recorded as holes

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class Verifier:
    """The pipeline's checks of its tables (see the module docstring). The stream's thread owns
    the tables' entries; the looks run in a thread of their own (:meth:`start`) and hand their
    outcomes over (:meth:`collect`), or in the stream's thread at the end of a bounded run
    (:meth:`catch_up`). ``run``: the :class:`~airflow_sync_provider.spark.cdc_apply.PipelineRun`."""

    def __init__(self, run: VerifiedRun):
        self.run, self.spec = run, run.spec
        self.period, self.budget = run.spec.verify_period, run.spec.verify_budget
        self.outcomes: queue.Queue = queue.Queue()
        self.stop, self.thread, self.error = threading.Event(), None, None
        self.checks: dict[str, TableCheck] = {}
        self.strikes: dict[tuple, int] = {}  # (table, slice) → looks that found it different in a row
        self.put_off: dict[tuple, int] = {}  # (table, slice) → looks put off in a row (too many keys set aside)
        self.again: dict[str, set] = {}  # slices repaired, to be looked at again first
        # repaired tables whose cascades since the earliest look's S are to be resolved again
        # (:meth:`replay`): one replay per table however many of its slices were repaired
        self.replays: dict[str, tuple[PipelineTable, BinlogPosition]] = {}
        self.mysql_seconds, self.began = 0.0, time.monotonic()
        self._ch = None

    @property
    def ch(self):
        """Its own client (the looks run beside the stream's writes), opened at the first look:
        a run with nothing to verify does not pay for it."""
        if self._ch is None:
            self._ch = client(self.run.spec.target)
        return self._ch

    @property
    def enabled(self) -> bool:
        """Rolling passes over the period (``verify_period`` 0: only tables marked due are looked at)."""
        return self.period > 0

    # --- the schedule ---------------------------------------------------------------------

    def _passes(self) -> dict[str, tuple[PipelineTable, Pass | None]]:
        """The streaming tables the verifier may look at now, with their passes."""
        routes, busy = self.run.stream.routes, self.run.recopies.busy
        out = {}
        for table in list(self.run.state.tables):
            if table.name in routes and not busy(table.name):
                out[table.name] = (table, Pass(**table.verify_pass) if table.verify_pass else None)
        return out

    def due_slices(self, now: float, ahead: float = 0.0) -> list[tuple[str, int]]:
        """(table, slice) pairs due by ``now + ahead``: repaired slices first, then tables marked
        due, then passes behind their even schedule over the period."""
        work = [(name, s) for name, slices in self.again.items() for s in sorted(slices)]
        for name, (table, current) in self._passes().items():
            if name in self.again:
                continue
            if table.verify_due and (current is None or not current.due or current.started < table.due_since):
                check = self.checks.get(name)  # a new pass at once
                work += [(name, s) for s in (check.slices if check else [0])]
                continue
            if current is None:
                continue  # :meth:`collect` starts its first pass
            if not current.slices:  # its first look plans its slices
                work.append((name, 0))
                continue
            if current.due:
                work.append((name, current.next))
                continue
            if not self.enabled:
                continue
            wanted = current.slices * min(1.0, (now + ahead - current.started) / self.period)
            if current.next < math.floor(wanted) or (current.next < current.slices and wanted >= current.slices):
                work.append((name, current.next))
        return work

    def _schedule(self) -> None:
        """Tables seen for the first time start their first pass (a pass done starts the next)."""
        for table, current in self._passes().values():
            if current is None and (self.enabled or table.verify_due):
                table.verify_pass = Pass(time.time(), 0).to_dict()  # its slices are known at its first look

    # --- a look ---------------------------------------------------------------------------

    def look(self, snapshot: Snapshot, work: list[tuple[str, int]], wait) -> list[Look]:
        """Look at ``work``'s slices at one snapshot S; ``wait(S)`` returns once the stream has
        applied everything before S (False: it cannot, the look is given up)."""
        passes = self._passes()
        tables = [passes[name][0] for name in dict.fromkeys(n for n, _ in work) if name in passes]
        if not tables:
            return []
        schemas = snapshot.open(tables)
        checks = {}
        for table, schema in zip(tables, schemas):
            check = self.checks.get(table.name)
            if schema is None:
                continue
            if check is None or copy_columns(check.schema) != copy_columns(schema) or \
                    check.recopies != table.recopies:
                with self.run.writing:  # no re-copy swaps the copy in meanwhile
                    if self.run.recopies.busy(table.name):
                        continue
                    check = self.checks[table.name] = plan_check(snapshot.pconn, self.ch, table, schema)
            check.table, check.schema = table, schema
            check.window = Window.of(check.ttl, schema.mappings(), table.name,
                                     dt.datetime.fromtimestamp(snapshot.began, dt.timezone.utc).replace(tzinfo=None))
            checks[table.name] = check
        if not wait(snapshot.position):
            return []
        looks = []
        for name, slice_id in dict.fromkeys(work):
            check = checks.get(name)
            if check is None:
                continue
            if slice_id not in check.slices:
                slice_id = check.slices[-1]  # a pass planned on an older plan: the plan's end
            with self.run.writing:  # no DDL is followed meanwhile (a repair writes the copy's shape at S)
                look = self._look(snapshot, check, slice_id)
            if look is not None:
                route = self.run.stream.routes.get(name)
                if slice_id == check.slices[-1] and route is not None and route.history is not None:
                    look.holes = self._gaps(check, route.history)
                looks.append(look)
        snapshot.sconn.rollback()
        return looks

    def _look(self, snapshot: Snapshot, check: TableCheck, slice_id: int) -> Look | None:
        name, route = check.name, self.run.stream.routes.get(check.name)
        if route is None or self.run.recopies.busy(name) or copy_columns(route.schema) != copy_columns(check.schema):
            return None  # it left, is being re-copied, or a DDL changed it since S: later
        wanted = copy_columns(check.schema)
        present = column_types(self.ch, check.table.target_database, check.table.writes_to)
        wrong = sorted((c, t, present.get(c)) for c, t in wanted.items() if present.get(c) != t)
        if wrong:  # the copy is not of the source's shape: it is copied again (recorded by the stream's thread)
            return Look(name, slice_id, snapshot.position, (), (), 0, began=snapshot.began,
                        note=f"the copy's columns are not the source's at {snapshot.position}: (column, source "
                             f"type, copy type) {wrong[:6]} (missing or of another type)")
        copy, set_aside = copy_at(self.ch, check, slice_id, snapshot.position)
        key = (name, slice_id)
        if len(set_aside) > MAX_SET_ASIDE:  # too busy right now: looked at again later
            times = self.put_off[key] = self.put_off.get(key, 0) + 1
            if times in (10, 100) or times % 1000 == 0:  # never verified while it lasts: said, not hidden
                self.run.log(f"{name}: the look at slice {slice_id} was put off {times} times in a row: more than "
                             f"{MAX_SET_ASIDE:,} of its keys changed between the snapshot and the read of the copy "
                             "(the stream far behind, or the slice this hot); it is verified once that settles")
            return None
        self.put_off.pop(key, None)
        began = time.monotonic()
        source = snapshot.checksum(check, slice_id, set_aside)
        self.mysql_seconds += time.monotonic() - began
        look = Look(name, slice_id, snapshot.position, source, copy, len(set_aside), began=snapshot.began)
        if route.history is not None:  # checked like the copy; a slice repair writes its events
            look.history = history_look(self.ch, route.history, check, slice_id, snapshot.position, set_aside)
        if look.equal:
            self.strikes.pop(key, None)
            return look
        self.strikes[key] = self.strikes.get(key, 0) + 1
        if self.strikes[key] >= LOOKS:
            look.note = "still different"
            return look
        self.run.checkpoints.fence()  # repairs write the copy: only under the lease
        look.repaired_rows = repair(self.spec, self.ch, snapshot, check, slice_id)
        return look

    def _gaps(self, check: TableCheck, history) -> list:
        """At a pass's last slice, the gap-free check of the table's history against what this
        pipeline recorded writing (core/cdc/history_checks.gaps): a range counted wrong is recorded as a
        hole with its reason (the binlog is not read again; the slices' looks repair the keys whose
        newest version is wrong). Returns the holes recorded."""
        ledger = HistoryLedger(self.ch, self.spec.ledger_database)
        ledger.ensure()
        found = gaps(self.ch, history, ledger, self.spec.pipeline, check.name)
        if found.ok:
            return []
        self.run.checkpoints.fence()  # the ledger's ranges are written under the lease
        holes = record_holes(ledger, self.spec.pipeline, check.name, found,
                             f"pipeline {self.spec.pipeline!r}'s verification")
        self.run.log(f"{check.name}: {found.describe()}; recorded as {len(holes)} hole(s) in its history's ranges")
        return [dataclasses.asdict(h) for h in holes]

    def _paced(self) -> None:
        """Sleep as long as the budget asks: MySQL's hashing at most ``budget`` of one core."""
        if self.budget > 0:
            ahead = self.mysql_seconds / self.budget - (time.monotonic() - self.began)
            if ahead > 0:
                self.stop.wait(min(ahead, 5.0))

    # --- in a thread beside the stream -------------------------------------------------------

    def start(self) -> None:
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, name="verify", daemon=True)
            self.thread.start()

    def _run(self) -> None:
        snapshot, failures = None, 0
        try:
            while not self.stop.is_set():
                work = self.due_slices(time.time())[:1]
                if not work:
                    self.stop.wait(SCHEDULE_TICK)
                    continue
                try:
                    snapshot = snapshot or Snapshot(self.spec, self.run.epoch)
                    looked = self.look(snapshot, work, self._wait)
                    for look in looked:
                        self.outcomes.put(look)
                    failures = 0
                    if not looked and (times := self.put_off.get(work[0])):  # not in a tight loop
                        self.stop.wait(min(PUT_OFF_WAIT_MAX, PUT_OFF_WAIT * times))
                except Exception as exc:  # e.g. the copy swapped away under a look: try again later
                    failures += 1
                    if failures >= LOOKS or isinstance(exc, BinlogError) and not exc.retry_helps:
                        raise
                    self.run.log(f"a verification look at {work} failed ({type(exc).__name__}: {str(exc)[:300]}); "
                                 "looking again later")
                    if snapshot is not None:
                        snapshot.close()
                        snapshot = None
                    self.stop.wait(2.0)
                self._paced()
        except BaseException as exc:  # handed to the stream's thread
            self.outcomes.put(exc)
        finally:
            if snapshot is not None:
                snapshot.close()

    def _wait(self, position: BinlogPosition) -> bool:
        while not self.stop.is_set():
            if self.run.state.checkpoint.key() >= position.key():
                return True
            if self.run.stream_ended:
                return False
            time.sleep(0.05)
        return False

    def close(self) -> None:
        """Stop the thread (its last look finishes first)."""
        self.stop.set()
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        self.stop.clear()

    def shut(self) -> None:
        self.close()
        if self._ch is not None:
            self._ch.close()

    # --- in the stream's thread ---------------------------------------------------------------

    def collect(self) -> None:
        """Record the looks the thread made (in the tables' entries) and start passes that are due."""
        self._schedule()
        while True:
            try:
                item = self.outcomes.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, BaseException):
                raise item
            self.record(item)

    def record(self, look: Look) -> None:
        table = self.run.state.table(look.table)
        if table is None or not table.verify_pass:
            return
        current, check = Pass(**table.verify_pass), self.checks[look.table]
        if table.verify_due and (not current.due or current.started < table.due_since):
            current = Pass(look.began, len(check.slices), due=True)
        current.slices = len(check.slices)
        if look.note.startswith("the copy's columns"):
            if self.run.recopies.start(self.run.stream.routes, table, f"verification: {look.note}"):
                self.run.totals.recopied.append(look.table)
            table.verify_pass = None  # the re-copy makes it due again when done
            self.run.totals.verified.append({"table": look.table, "position": look.position.to_dict(),
                                             "at": time.time(), "shards": current.slices, "mismatched": [],
                                             "repaired_shards": 0, "rows_repaired": 0, "note": look.note})
            return
        if look.note == "still different":
            table.mark_due()  # every retry looks first, and stops here again while it differs
            raise VerifyFailed(
                f"table {look.table}: its copy still differs from the source at {look.position} in slice "
                f"{look.slice_id} after {LOOKS - 1} repairs; the copy may hold values the checksums cannot match "
                "(see docs/cdc.md, Verification). A retry stops here again: re-bootstrap the table (restart=True)")
        current.position = current.position or look.position.to_dict()
        current.history_holes += look.holes
        if look.repaired_rows >= 0:
            self.again.setdefault(look.table, set()).add(look.slice_id)
            current.mismatched.append(look.slice_id)
            current.repaired += 1
            current.rows_repaired += look.repaired_rows
            table.repaired += 1
            self.run.totals.repaired_shards += 1
            history = f", history {look.history[:2]} with {look.history[2]} key(s) in conflict" if look.history else ""
            self.run.log(f"{look.table} differed from the source at {look.position} in slice {look.slice_id} "
                         f"(source {look.source}, copy {look.copy}{history}); repaired ({look.repaired_rows:,} rows "
                         "rewritten)")
            # the stream went on past S before the look began: a cascade into the slice's wrong
            # rows meanwhile missed them, and the repair wrote them back as at S
            pending = self.replays.get(table.name)
            if pending is None or look.position.key() < pending[1].key():
                self.replays[table.name] = (table, look.position)
        elif look.table in self.again and look.slice_id in self.again[look.table]:
            self.again[look.table].discard(look.slice_id)  # right after its repair
            if not self.again[look.table]:
                del self.again[look.table]
        if look.slice_id == current.next:
            current.next += 1
        if current.next >= current.slices and look.table not in self.again:
            self._passed(table, current, look.position)
        else:
            table.verify_pass = current.to_dict()

    def replay(self) -> None:
        """The repaired tables' cascades since their looks resolved again. In the stream's thread
        while it does not read (the replay reads the binlog as the same replica)."""
        while self.replays:
            table, since = self.replays.pop(next(iter(self.replays)))
            self.run.replay_cascades(table, since, cause="repair")

    def _passed(self, table: PipelineTable, current: Pass, position: BinlogPosition) -> None:
        now = time.time()
        outcome = {"position": position.to_dict(), "started": current.started, "at": now,
                   "shards": current.slices, "mismatched": sorted(set(current.mismatched)),
                   "repaired_shards": current.repaired, "rows_repaired": current.rows_repaired,
                   "seconds": round(now - current.started, 3),
                   **({"history_holes": current.history_holes} if current.history_holes else {})}
        table.verified = outcome
        table.verifications += 1
        table.verify_pass = Pass(now, current.slices).to_dict() if self.enabled else None
        self.run.totals.verified.append({"table": table.name} | outcome)

    def catch_up(self) -> None:
        """At a bounded run's end: every slice due or behind schedule, at one snapshot the stream
        catches up to (so nothing is set aside), and the repaired slices again, at a new one."""
        for _ in range(LOOKS + 1):
            self.collect()
            work = self.due_slices(time.time(), ahead=1.0)
            for name, (_table, current) in self._passes().items():  # a pass of a due table is finished
                if current is not None and current.due and name in self.checks:
                    work += [(name, s) for s in self.checks[name].slices[current.next:]]
            if not work:
                return
            snapshot = Snapshot(self.spec, self.run.epoch)
            try:
                for look in self.look(snapshot, work, self.run.follow_to):
                    self.record(look)
            finally:
                snapshot.close()
            self.replay()

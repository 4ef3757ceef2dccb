"""The changes a foreign-key cascade makes to the copies, at the parent's binlog position.

A parent row event whose key acts (core/cdc/foreign_keys.py: ``ON UPDATE``/``ON DELETE``
``CASCADE`` or ``SET NULL``) is a :class:`Trigger`: the parent's referenced values before and
after (None: deleted), its version (the parent row's, core/positions.py) and commit time. The
binlog says nothing of the children, so they are derived here from the copies, exactly as InnoDB
changed them: every child row whose foreign-key columns equal the parent's old values takes the
parent's new values (CASCADE), NULL (SET NULL) or is deleted (ON DELETE CASCADE), and a child
changed so is the parent of its own children in turn (chains, self-referencing trees), depth
first, key by key in name order, as InnoDB walks them.

**Where the children are read from.** The applier resolves a batch's triggers *before* it writes
the batch's rows (spark/cdc_cascades.py, spark/cdc_apply.py), so each copy holds its rows as they
were at the batch's start: every copy row is a state of its source row at its ``_version``, and the
batch is the rest. The batch's own changes of the children are handed over with the triggers, in
binlog order (:class:`Rows`), and go into an overlay as the walk passes them; a trigger's
candidates are the overlay's rows where the batch changed them and the copy's rows ranked below
its version where it did not. So each trigger sees the children exactly as InnoDB saw them at
its position — also when a later event of the same batch gives a removed row's key to another
row — and writes their new state at its version: above everything before the parent's event,
below everything after it. A deeper level and a later trigger see the rows changed so far.

**A replay after a crash.** The cascades are written before the batch's rows, deepest tables first
(:attr:`Change.depth`), and the checkpoint passes the batch only after both. A replay reads copies
that may hold some of that: a child already written is ranked at its trigger's version (not
below it), so it is not taken again. What the replay does take are the rows still as they were,
so it writes what the crash left out and nothing twice.

**Through rows already written.** The walk also passes *through* a child its trigger already
changed (ranked at exactly the trigger's version: removed, re-keyed, or its foreign key moved to
the parent's new values) on to that child's own children, without writing it again: below it
may be rows put back to an older state since — a verification's repair at a snapshot the stream
had gone past (spark/cdc_verify.py), after which the cascades since are resolved again. So
``acct`` deleted → its ``txn`` rows deleted → their ``memo`` rows set to NULL reaches a repaired
``memo`` row although the ``txn`` rows are already gone from the copy. After a crash the rows
below are at the trigger's version too, so passing through writes nothing twice.

:class:`Cascades` is plain Python over a :class:`CopyRows` (the copies as the Spark layer reads
them from ClickHouse; a dict in the tests), bounded by ``max_rows`` rows held at once.
"""

from __future__ import annotations

import operator
from collections import defaultdict
from dataclasses import dataclass
from typing import Protocol

from airflow_sync_provider.core.cdc.foreign_keys import CASCADE, MAX_DEPTH, CascadePlan, ForeignKey
from airflow_sync_provider.core.positions import BinlogError


class CascadeError(BinlogError):
    """A cascade the pipeline cannot follow exactly (a chain through a table it does not copy, a
    cascade larger than the bound): it stops before writing, with the remedy named."""


@dataclass(frozen=True)
class Trigger:
    """A parent row's change that acts on its children: ``old`` and ``new`` are the parent's values
    of the plan's referenced columns (CascadePlan.parents[parent]); ``new`` None: deleted.
    ``inclusive``: an XA transaction's rows all take its commit's version, so children the same
    transaction wrote before are ranked at ``version`` too and count as before it."""

    parent: str
    version: int
    old: tuple
    new: tuple | None
    at: int = 0  # the commit time (a copy that keeps deletes marks a cascaded delete with it)
    inclusive: bool = False

    @property
    def deleted(self) -> bool:
        return self.new is None


@dataclass(slots=True)
class Change:
    """A child row changed by a cascade: ``before`` as the copy held it, ``after`` (None: deleted),
    at ``version``; rows are tuples in :meth:`CopyRows.columns` order."""

    table: str
    before: tuple
    after: tuple | None
    version: int
    at: int
    # False: the change only leads on to the row's own children; the row itself is being re-copied
    # (a stale row, or a change its re-copy's snapshot already holds) and is not written
    written: bool = True
    depth: int = 1  # how far below the trigger's parent (the deepest tables are written first)
    # an XA transaction's (Trigger.inclusive): ranked at the version its rows have too, so written
    # after them (of two rows of one version, ReplacingMergeTree keeps the one written last)
    inclusive: bool = False


@dataclass(frozen=True)
class Rows:
    """The batch's own changes of a child table's rows in one rows event, in binlog order, handed
    to :meth:`Cascades.resolve` between the triggers: rows ``start`` … ``start + len(gone)`` of the
    batch's changed rows of ``table`` (as its copy holds them, :meth:`CopyRows.columns` order);
    ``gone[i]``: that row leaves the copy (a delete, the old key of a re-keyed row, a row leaving a
    filter). ``rows``: the rows themselves, on the reader's side until :func:`gathered` numbers them."""

    table: str
    gone: tuple
    start: int = 0
    rows: list | None = None


def gathered(items: list) -> tuple[list, dict[str, list]]:
    """A batch's cascade items as the reader made them, with its child changes numbered per table
    (:class:`Rows` ``start``), and those rows per table; no trigger: nothing (its children's
    changes matter to no cascade)."""
    if not any(isinstance(item, Trigger) for item in items):
        return [], {}
    rows: dict[str, list] = defaultdict(list)
    out = []
    for item in items:
        if isinstance(item, Rows):
            into = rows[item.table]
            start = len(into)
            into += item.rows
            item = Rows(item.table, item.gone, start)
        out.append(item)
    return out, dict(rows)


class CopyRows(Protocol):
    def columns(self, table: str) -> list[str]:
        """The copy's columns as its rows hold them (the source's, as copied)."""

    def key(self, table: str) -> list[str]:
        """The columns that tell the copy's rows apart (its key)."""

    def fetch(self, table: str, columns: tuple[str, ...], values: list[tuple],
              below: int, since: int | None) -> list[tuple[tuple, int, bool, bool]]:
        """The copy's rows whose ``columns`` hold one of ``values``, ranked below ``below``: live
        ones, and (``since`` not None) removals ranked at or above ``since`` — tombstones, also
        ones a newer version of their key out-ranks, and rows kept as deleted at the source:
        (row, version, stale, gone) — stale: a row a re-copy in place has not replaced yet, good
        to follow a chain through, never to be written back; gone: a removal (the row's values
        before it left)."""

    def normalize(self, table: str, columns: tuple[str, ...], values: tuple) -> tuple:
        """``values`` (a parent row's, as the binlog reader makes them) as ``table``'s copy holds
        values of ``columns``, so that equal values compare equal."""


def project(row: tuple, at: list[int]) -> tuple:
    return tuple(row[i] for i in at)


class Cascades:
    """Resolves a batch's triggers against the copies; :meth:`resolve` returns the changes per
    table, in the order InnoDB made them."""

    def __init__(self, plan: CascadePlan, copies: CopyRows, max_rows: int = 2_000_000,
                 skip_before: dict | None = None, recopying: frozenset = frozenset()):
        self.plan, self.copies, self.max_rows = plan, copies, max_rows
        # a copy being filled by a re-copy from a later position: that copy holds the cascades before it
        self.skip_before = skip_before or {}
        # copies being re-copied: their rows are not written (a chunk read before a cascade may land
        # after it and after a later one, which would then take it for the state before it); every
        # cascade since the re-copy began is resolved again, in order, once it is whole
        self.recopying = recopying
        self._at: dict = {}  # (table, columns) → their places in a row
        self._rows: dict = defaultdict(dict)  # table → key → (row, version, stale): copy rows fetched
        self._removed: dict = defaultdict(lambda: defaultdict(list))  # (table, columns) → value → (row, version)
        self._found: dict = defaultdict(lambda: defaultdict(list))  # (table, columns) → value → keys
        self._fetched: dict = defaultdict(set)  # (table, columns) → values fetched
        self._state: dict = defaultdict(dict)  # table → key → row or None: rows changed so far (the overlay)
        self._index: dict = defaultdict(lambda: defaultdict(dict))  # (table, columns) → value → overlay keys (in order)
        self._stale: dict = {}  # (table, key) → the overlay row is not written (see Change.written)
        self._getters: dict = {}
        self._keys: dict = {}
        self._log: dict = defaultdict(list)  # table → its overlay's changes, in order (see _indexed)
        self._seen: dict = {}  # (table, columns) → how many of them its index has taken in
        self._below = self._since = 0
        self.changes: list[Change] = []
        self.unresolved: set[str] = set()  # chains through a table another stream copies (CascadePlan.ahead)

    # --- rows ----------------------------------------------------------------------------

    def places(self, table: str, columns: tuple[str, ...]) -> list[int]:
        found = self._at.get((table, columns))
        if found is None:
            names = self.copies.columns(table)
            missing = [c for c in columns if c not in names]
            if missing:
                raise CascadeError(f"table {table}: its copy lacks column(s) {missing} of a foreign key, so the "
                                   "rows a cascade changes cannot be found in it; copy those columns (a retry "
                                   "stops here again)")
            found = self._at[(table, columns)] = [names.index(c) for c in columns]
        return found

    def getter(self, table: str, columns: tuple[str, ...]):
        """A function of a row of ``table``: its ``columns``' values, as a tuple."""
        found = self._getters.get((table, columns))
        if found is None:
            at = self.places(table, columns)
            found = self._getters[(table, columns)] = (lambda row, i=at[0]: (row[i],)) if len(at) == 1 \
                else operator.itemgetter(*at)
        return found

    def key_getter(self, table: str):
        found = self._keys.get(table)
        if found is None:
            found = self._keys[table] = self.getter(table, tuple(self.copies.key(table)))
        return found

    def _prefetch(self, table: str, columns: tuple[str, ...], values) -> None:
        """Fetch the copy rows of ``values`` not fetched yet (one query for them all)."""
        wanted = [v for v in dict.fromkeys(values) if v not in self._fetched[(table, columns)]]
        if not wanted:
            return
        get, key_of, rows = self.getter(table, columns), self.key_getter(table), self._rows[table]
        found, removed = self._found[(table, columns)], self._removed[(table, columns)]
        # removals matter only to walk through to a table's own children (see _written)
        since = self._since if table in self.plan.parents else None
        for row, version, stale, gone in self.copies.fetch(table, columns, wanted, self._below, since):
            if gone:
                removed[get(row)].append((row, version))
                continue
            key = key_of(row)
            if key not in rows:
                rows[key] = (row, version, stale)
            found[get(row)].append(key)
        self._fetched[(table, columns)].update(wanted)
        held = sum(len(r) for r in self._rows.values())
        if held > self.max_rows:
            raise CascadeError(f"a cascade into {table} reaches more than {self.max_rows:,} rows in one batch "
                               "(cascade_rows, the bound on rows held at once): raise cascade_rows for this "
                               "pipeline; a retry stops here again")

    def _candidates(self, key: ForeignKey, value: tuple, trigger: Trigger) -> list[tuple[tuple, bool]]:
        """The child rows of ``key`` that reference ``value`` as they are before ``trigger``:
        copy rows ranked below its version that no change here has touched, then rows changed
        here whose values now match; each with whether it is stale."""
        self._prefetch(key.child, key.columns, [value])
        state, out = self._state[key.child], []
        rows = self._rows[key.child]
        for k in self._found[(key.child, key.columns)].get(value, ()):
            if k in state:
                continue
            row, version, stale = rows[k]
            if version < trigger.version or (trigger.inclusive and version == trigger.version):
                out.append((row, stale))
        get = self.getter(key.child, key.columns)
        for k in list(self._indexed(key.child, key.columns).get(value, ())):
            row = state.get(k)
            if row is not None and get(row) == value:
                out.append((row, self._stale.get((key.child, k), False)))
        return out

    def _written(self, key: ForeignKey, value: tuple, new: tuple | None, trigger: Trigger) -> list[tuple]:
        """The child rows of ``key`` that ``trigger``'s ``CASCADE`` already changed in the copy (see
        the module's text, "Through rows already written"), as they were before it: removed or
        re-keyed ones (their old rows, gone at its version, ``columns`` still ``value``) and ones
        updated in place (live at its version, ``columns`` now ``new``: fetched only when that
        changes what their own children reference)."""
        if trigger.inclusive:  # an XA transaction's rows share its version: taken as candidates already
            return []
        state, rows, key_of = self._state[key.child], self._rows[key.child], self.key_getter(key.child)
        out = list({key_of(row): row for row, version in self._removed[(key.child, key.columns)].get(value, ())
                    if version == trigger.version and key_of(row) not in state}.values())  # written twice: once
        below = self.plan.parents.get(key.child)
        if new is None or not below or not set(below) & set(key.columns):
            return out
        self._prefetch(key.child, key.columns, [new])
        at = self.places(key.child, key.columns)
        for k in self._found[(key.child, key.columns)].get(new, ()):
            row, version, _ = rows[k]
            if version != trigger.version or k in state:
                continue
            before = list(row)
            for i, v in zip(at, value):
                before[i] = v
            if key_of(tuple(before)) == k:  # a re-keyed row is reached by its old key's tombstone
                out.append(tuple(before))
        return out

    def _indexed(self, table: str, columns: tuple[str, ...]) -> dict:
        """The overlay's rows of ``table`` by their ``columns``' values (value → keys, in the
        order they were changed), brought up to date with the changes made since it was last
        looked at: an index nobody looks at again (most cascades) costs nothing."""
        index = self._index[(table, columns)]
        log, done = self._log[table], self._seen.get((table, columns), 0)
        if done < len(log):
            get = self.getter(table, columns)
            for old_key, before, new_key, after in log[done:]:
                if before is not None:
                    index[get(before)].pop(old_key, None)
                if after is not None:
                    index[get(after)][new_key] = None
            self._seen[(table, columns)] = len(log)
        return index

    def _record(self, table: str, before: tuple, after: tuple | None, trigger: Trigger, written: bool,
                depth: int) -> None:
        key_of = self.key_getter(table)
        old_key = key_of(before)
        state = self._state[table]
        state[old_key] = None
        new_key = None
        if after is not None:
            new_key = key_of(after)
            state[new_key] = after
            if not written:
                self._stale[(table, new_key)] = True
        self._log[table].append((old_key, before, new_key, after))
        self.changes.append(Change(table, before, after, trigger.version, trigger.at, written, depth,
                                   trigger.inclusive))

    def _overlay(self, item: Rows, rows: list[tuple]) -> None:
        """The batch's own changes of a child's rows, at their place among the triggers: the
        overlay holds them from here on (a row written by the batch is never stale)."""
        key_of, state, log = self.key_getter(item.table), self._state[item.table], self._log[item.table]
        for row, gone in zip(rows[item.start:item.start + len(item.gone)], item.gone):
            key = key_of(row)
            after = None if gone else row
            log.append((key, state.get(key), key, after))
            state[key] = after
            self._stale.pop((item.table, key), None)

    # --- the walk ------------------------------------------------------------------------

    def resolve(self, items: list, changed: dict[str, list[tuple]] | None = None) -> list[Change]:
        """Every trigger's cascade, in order (each one's whole depth before the next), against the
        copies as they were at the batch's start and the batch's own changes of the children
        (:class:`Rows` among the triggers: ``changed`` holds their rows per table)."""
        triggers = [item for item in items if isinstance(item, Trigger)]
        if not triggers:
            return []
        self._below = max(t.version for t in triggers) + 1
        self._since = min(t.version for t in triggers)
        # one query per key for the first level of every trigger (and, speculatively, for the
        # levels below, from the rows found): most cascades then need no query of their own
        self._speculate(triggers)
        for item in items:
            if isinstance(item, Trigger):
                self._walk(item, 0)
            else:
                self._overlay(item, changed[item.table])
        return self.changes

    def _speculate(self, triggers: list[Trigger]) -> None:
        level = defaultdict(list)
        for trigger in triggers:
            for key, _ in self.plan.acting(trigger.parent, trigger.deleted):
                values = self._values(trigger, key)
                if values is not None:
                    level[(key, trigger.deleted)].append(values[0])
        for _ in range(MAX_DEPTH):
            deeper = defaultdict(list)
            for (key, deleted), values in level.items():
                self._prefetch(key.child, key.columns, values)
                below = self.plan.acting(key.child, deleted)
                if not below:
                    continue
                found, rows = self._found[(key.child, key.columns)], self._rows[key.child]
                for value in values:
                    for k in found.get(value, ()):
                        row = rows[k][0]
                        for child_key, _ in below:
                            if deleted or set(child_key.referenced) & set(key.columns):
                                derived = project(row, self.places(key.child, child_key.referenced))
                                if None not in derived:
                                    deeper[(child_key, deleted)].append(derived)
            if not deeper:
                return
            level = deeper

    def _values(self, trigger: Trigger, key: ForeignKey) -> tuple[tuple, tuple | None] | None:
        """The old values ``key`` matches children by and the new ones (None when deleted), as the
        child's copy holds them; None: nothing to do (a NULL never matches, and an update that
        leaves the referenced columns as they were changes no child)."""
        columns = self.plan.parents[trigger.parent]
        at = [columns.index(c) for c in key.referenced]
        old = project(trigger.old, at)
        new = None if trigger.new is None else project(trigger.new, at)
        if None in old or new == old:
            return None
        normalize = self.copies.normalize
        return (normalize(key.child, key.columns, old),
                None if new is None else normalize(key.child, key.columns, new))

    def _walk(self, trigger: Trigger, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise CascadeError(f"a cascade from {trigger.parent} nests deeper than {MAX_DEPTH} levels, which InnoDB "
                               "refuses: the binlog and the copies disagree about the foreign keys; re-bootstrap "
                               "the tables (a retry stops here again)")
        for key, action in self.plan.acting(trigger.parent, trigger.deleted):
            values = self._values(trigger, key)
            if values is None:
                continue
            value, new = values
            if key.child in self.plan.ahead:
                self.unresolved.add(key.child)
                continue
            if key.child in self.plan.gaps:
                raise CascadeError(f"a cascade from {trigger.parent} changes rows of {key.child}, which the pipeline "
                                   f"does not copy, and they cascade further ({'; '.join(self.plan.gaps[key.child])})"
                                   f": add {key.child} to the pipeline so its rows can be followed. A retry stops "
                                   "here again")
            at = self.places(key.child, key.columns)
            new_values = new if new is not None and action == CASCADE else (None,) * len(at)
            child_columns = self.plan.parents.get(key.child)
            # a change the child's re-copy snapshot holds already is followed to its own children only
            covered = trigger.version < self.skip_before.get(key.child, 0) or key.child in self.recopying
            candidates = self._candidates(key, value, trigger)
            passed = self._written(key, value, new, trigger) if action == CASCADE and child_columns else []
            for row, write, stale in [(r, True, s) for r, s in candidates] + [(r, False, False) for r in passed]:
                if trigger.new is None and action == CASCADE:
                    after = None
                else:
                    changed = list(row)
                    for i, v in zip(at, new_values):
                        changed[i] = v
                    after = tuple(changed)
                if write:
                    self._record(key.child, row, after, trigger, not (stale or covered), depth + 1)
                if child_columns is not None:  # the child is a parent too: its own children follow
                    child_at = self.places(key.child, child_columns)
                    was = project(row, child_at)
                    now = None if after is None else project(after, child_at)
                    if now != was:
                        self._walk(Trigger(key.child, trigger.version, was, now, trigger.at, trigger.inclusive),
                                   depth + 1)

"""Where the snapshot diff looks: buckets compared inside the databases, subdivided only where
they differ, so that only rows near a change are read row by row.

Every row has an integer *position* that depends on its key alone, the same in both databases:
the key's first column when it is a NOT NULL integer (then a bucket is a key range, read through
the index), else ``CRC32`` of the key's row text (core/verify/reconcile.py: ``row_text``), in
``[0, 2**32)``. Positions are counted from a ``base`` at or below every position of both sides,
so offsets are never negative.

A *level* groups the rows of some intervals of offsets by ``offset DIV width`` (``width`` a power
of two) and asks each database, in one aggregation, for every bucket's row count and sum of
64-bit row hashes. Buckets that agree are identical (up to a 64-bit hash collision: the
reconciliation checksum's own bound) and are never looked at again. A differing bucket is read
row by row when it is small (``leaf_rows``), when it cannot be cut (width 1), or when most of its
level's buckets (at least 16 of them) differ (cutting would find them all differing again:
everything changed); otherwise it is cut into ``2**fanout_bits`` buckets at the next level, which
aggregates only the differing buckets' intervals. Where positions follow no index (CRC32
positions, or a plan on another column), a next level scans the whole shard again for its labels:
there the buckets to cut are read instead while they hold at most :data:`SCAN_SHARE` of the
shard's rows. Because a key has one position, its row on either side is in the same bucket at
every level: a differing key is always in a differing bucket, and a bucket read
row by row holds both sides' rows of each of its keys.

The rows of the read buckets travel once per side, ordered by position, and
:func:`aligned_batches` cuts the two streams at a common position, so each batch pairs every
key's old and new rows while memory holds about ``max_rows`` rows per side.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc

HASH_BITS = 32  # CRC32 positions
FIRST_ROWS = 32  # rows per bucket at the first level (about): a scattered change costs its bucket's rows
MAX_BUCKETS = 200_000  # the most buckets one aggregation groups (a larger shard gets wider buckets)
LEAF_ROWS = 32  # a differing bucket this small is read, not cut
FANOUT_BITS = 4  # a cut bucket becomes 16
MOST_DIFFER = 0.5  # a level where more of the buckets differ is read, not cut
MIN_JUDGED = 16  # ... when it has at least this many buckets
# without an index, buckets to cut that hold at most this share of the shard's rows are read
# instead of scanned for again (bench/results/diff_text_keys.md)
SCAN_SHARE = 0.25


@dataclass(frozen=True)
class Positions:
    """Offsets ``0 .. top`` (``position - base``) hold every row of both snapshots."""

    base: int
    top: int  # the largest offset (inclusive)

    @classmethod
    def of_keys(cls, lows: Iterable[int | None], highs: Iterable[int | None]) -> "Positions":
        """From each side's smallest and largest key value (None: an empty side)."""
        lows, highs = [v for v in lows if v is not None], [v for v in highs if v is not None]
        if not lows:
            return cls(0, 0)
        return cls(min(lows), max(highs) - min(lows))

    @classmethod
    def of_hash(cls) -> "Positions":
        return cls(0, (1 << HASH_BITS) - 1)

    def first_width(self, rows: int, first_rows: int = FIRST_ROWS) -> int:
        """The first level's bucket width: a power of two with about ``first_rows`` rows per
        bucket when the ``rows`` spread evenly over the offsets."""
        ideal = (self.top + 1) * first_rows / max(1, rows)
        width = 1 << max(0, math.floor(math.log2(ideal))) if ideal >= 1 else 1
        return min(width, 1 << (self.top.bit_length()))  # one bucket for all at most (an estimate of 0 rows)


def first_rows(shard_rows: int) -> int:
    """Rows per first-level bucket: :data:`FIRST_ROWS`, or more where a shard would otherwise
    group more than :data:`MAX_BUCKETS` (the databases' in-memory grouping has a size limit)."""
    return max(FIRST_ROWS, -(-int(shard_rows) // MAX_BUCKETS))


@dataclass(frozen=True)
class Step:
    """What one level decided: rows settled as identical, intervals to read, intervals to cut."""

    identical: int
    read: list[tuple[int, int, int]]  # (first offset, last offset, rows of the larger side)
    cut: list[tuple[int, int]]
    buckets: int  # buckets this level saw (on either side)
    differing: int
    read_labels: list[int] = field(default_factory=list)  # the same buckets as labels at this width
    cut_labels: list[int] = field(default_factory=list)


def step(old: dict, new: dict, width: int, top: int, leaf_rows: int = LEAF_ROWS,
         most_differ: float = MOST_DIFFER, read_below: float = 0) -> Step:
    """Decide one level from each side's ``{bucket: (rows, checksum)}`` (``bucket = offset DIV width``).
    Buckets that would be cut are read instead when they hold ``read_below`` rows or fewer in all
    (a next level that costs a scan of the shard is dearer than reading them)."""
    # one pass over a side (a first level has up to MAX_BUCKETS), the rest over the differing few
    differing_set = {b for b, v in old.items() if new.get(b) != v} if old != new else set()
    differing_set.update(new.keys() - old.keys())
    differing = sorted(differing_set)
    identical = sum(n for n, _ in new.values()) - sum(new[b][0] for b in differing if b in new)
    buckets = len(old) + len(new.keys() - old.keys())
    read, cut, read_labels, cut_labels, cut_rows = [], [], [], [], []
    # most buckets differ: most rows changed, and cutting would find them all differing again
    # (judged only on enough buckets: one differing bucket of one says nothing)
    cut_none = width == 1 or (buckets >= MIN_JUDGED and len(differing) > most_differ * buckets)
    for b in differing:
        rows = max(old.get(b, (0, 0))[0], new.get(b, (0, 0))[0])
        first, last = b * width, min(b * width + width - 1, top)
        if cut_none or rows <= leaf_rows:
            read.append((first, last, rows))
            read_labels.append(b)
        else:
            cut.append((first, last))
            cut_labels.append(b)
            cut_rows.append(rows)
    if cut and sum(cut_rows) <= read_below:
        read = sorted(read + [(a, z, n) for (a, z), n in zip(cut, cut_rows)])
        read_labels, cut, cut_labels = sorted(read_labels + cut_labels), [], []
    return Step(identical, read, cut, buckets, len(differing), read_labels, cut_labels)


def next_width(width: int, fanout_bits: int = FANOUT_BITS) -> int:
    return max(1, width >> fanout_bits)


def merged(intervals: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, with touching or overlapping intervals joined (fewer ranges in the SQL)."""
    out: list[list[int]] = []
    for first, last in sorted(intervals):
        if out and first <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], last)
        else:
            out.append([first, last])
    return [(a, b) for a, b in out]


@dataclass(frozen=True)
class Scope:
    """Some buckets of a shard, said two ways: intervals of offsets (a range read through an index)
    and bucket labels per width (a set lookup where no index helps)."""

    intervals: list[tuple[int, int]]
    labels: dict[int, list[int]]  # width -> labels (offset DIV width)


def label_sql(bucket_sql, labels: dict[int, list[int]]) -> str:
    """``bucket IN (…)`` per width (``bucket_sql(width)`` the dialect's ``offset DIV width``)."""
    parts = [f"{bucket_sql(w)} IN ({', '.join(str(int(b)) for b in sorted(ls))})" for w, ls in sorted(labels.items())
             if ls]
    return "(" + " OR ".join(parts) + ")" if parts else "1 = 0"


def interval_sql(position_sql: str, intervals: list[tuple[int, int]], base: int) -> str:
    """``position BETWEEN …`` for each interval of offsets, as integer literals (both dialects)."""
    if not intervals:
        return "1 = 0"
    return "(" + " OR ".join(f"{position_sql} BETWEEN {int(base + a)} AND {int(base + b)}"
                             for a, b in merged(intervals)) + ")"


@dataclass
class Pruning:
    """The whole descent of one shard: feed each level's aggregations to :meth:`feed`."""

    positions: Positions
    width: int
    leaf_rows: int = LEAF_ROWS
    fanout_bits: int = FANOUT_BITS
    most_differ: float = MOST_DIFFER
    # where a level costs a scan of the shard (no index orders its positions): buckets to cut that
    # hold at most this share of the shard's rows are read instead (SCAN_SHARE)
    read_share: float = 0.0
    intervals: list[tuple[int, int]] | None = None  # None: the whole shard
    identical: int = 0
    read: list[tuple[int, int, int]] = field(default_factory=list)
    labels: dict | None = None  # the next level's buckets, by the previous width
    read_labels: dict = field(default_factory=dict)
    levels: int = 0
    first_buckets: int = 0
    shard_rows: int = 0  # the larger side's rows, as the first level counted them

    @property
    def done(self) -> bool:
        return self.intervals is not None and not self.intervals

    def feed(self, old: dict, new: dict) -> None:
        if not self.levels:
            self.shard_rows = max(sum(n for n, _ in old.values()), sum(n for n, _ in new.values()))
        s = step(old, new, self.width, self.positions.top, self.leaf_rows, self.most_differ,
                 self.read_share * self.shard_rows)
        if not self.levels:
            self.first_buckets = s.buckets
        self.levels += 1
        self.identical += s.identical
        self.read += s.read
        self.read_labels.setdefault(self.width, []).extend(s.read_labels)
        self.intervals = merged(s.cut)
        self.labels = {self.width: s.cut_labels}
        self.width = next_width(self.width, self.fanout_bits)

    @property
    def scope(self) -> Scope | None:
        """The buckets the next level aggregates (None: the whole shard)."""
        return None if self.intervals is None else Scope(self.intervals, self.labels)

    @property
    def read_scope(self) -> Scope:
        return Scope(self.to_read, self.read_labels)

    @property
    def to_read(self) -> list[tuple[int, int]]:
        return merged((a, b) for a, b, _ in self.read)


def pieces(read: Iterable[tuple[int, int, int]], max_rows: int, max_intervals: int
           ) -> list[tuple[list[tuple[int, int]], int]]:
    """The read buckets ``(first offset, last offset, rows)`` in offset order, as consecutive
    pieces of at most ``max_rows`` rows (or one bucket, when it alone has more) and at most
    ``max_intervals`` merged intervals: one read query each, so that a reader that buffers a
    query's result holds one piece, and a range list stays short for the optimizer. Returns
    ``(intervals, rows)`` per piece."""
    out: list[tuple[list[tuple[int, int]], int]] = []
    current: list[tuple[int, int]] = []
    rows = 0
    for first, last, n in sorted(read):
        touches = bool(current) and first <= current[-1][1] + 1
        if current and (rows + n > max_rows or (not touches and len(current) >= max_intervals)):
            out.append((current, rows))
            current, rows, touches = [], 0, False
        if touches:
            current[-1] = (current[-1][0], max(current[-1][1], last))
        else:
            current.append((first, last))
        rows += n
    if current:
        out.append((current, rows))
    return out


def aligned_batches(old: Iterable[pa.Table], new: Iterable[pa.Table], label: str,
                    max_rows: int) -> Iterator[tuple[pa.Table, pa.Table]]:
    """Pairs of (old rows, new rows) from two streams each sorted by the integer column ``label``:
    every label's rows of both sides are in the same pair, and a pair holds about ``max_rows``
    rows per side (more only when one label has more)."""
    sides = [iter(old), iter(new)]
    buffers: list[list[pa.Table]] = [[], []]
    done = [False, False]

    def rows(i):
        return sum(t.num_rows for t in buffers[i])

    def pull(i) -> None:
        for table in sides[i]:
            if table.num_rows:
                buffers[i].append(table)
                return
        done[i] = True

    def last(i):
        return buffers[i][-1].column(label)[-1].as_py() if buffers[i] else None

    def take(i, cut) -> pa.Table | None:
        if not buffers[i]:
            return None
        table = pa.concat_tables(buffers[i])
        if cut is None:
            buffers[i] = []
            return table
        below = pc.less(table.column(label), pa.scalar(cut, table.schema.field(label).type))
        buffers[i] = [table.filter(pc.invert(below))]
        return table.filter(below)

    while True:
        for i in (0, 1):
            while not done[i] and rows(i) < max_rows:
                pull(i)
        if all(done):
            pair = [take(0, None), take(1, None)]
            if any(t is not None and t.num_rows for t in pair):
                yield tuple(pair)
            return
        # rows below the smallest last label of the unfinished sides are complete on both sides
        cut = min(last(i) for i in (0, 1) if not done[i] and buffers[i])
        pair = [take(0, cut), take(1, cut)]
        if any(t is not None and t.num_rows for t in pair):
            yield tuple(pair)
        else:  # one label fills the buffer: read on until it ends
            for i in (0, 1):
                if not done[i] and last(i) == cut:
                    pull(i)

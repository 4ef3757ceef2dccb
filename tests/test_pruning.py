"""core/verify/pruning.py: the descent through buckets against an in-memory model of the two
databases (hypothesis): every differing key is read, agreeing buckets are settled exactly, and
scattered changes read a small fraction; the aligned batches pair every key's two rows."""

from __future__ import annotations

import bisect
import hashlib
import random

import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from airflow_sync_provider.core.verify.pruning import (
    FIRST_ROWS,
    LEAF_ROWS,
    MAX_BUCKETS,
    SCAN_SHARE,
    Positions,
    Pruning,
    aligned_batches,
    first_rows,
    interval_sql,
    merged,
    pieces,
    step,
)


def _aggregate(rows: dict, base: int, width: int, intervals) -> dict:
    """What a database returns for one level: {offset DIV width: (count, sum of row hashes)}."""
    out: dict = {}
    firsts = [a for a, _ in intervals or ()]
    for position, value in rows.items():
        offset = position - base
        if intervals is not None:
            i = bisect.bisect_right(firsts, offset) - 1
            if i < 0 or offset > intervals[i][1]:
                continue
        n, s = out.get(offset // width, (0, 0))
        out[offset // width] = (n + 1, (s + _row_hash(position, value)) % (1 << 64))
    return out


def _row_hash(position: int, value: int) -> int:
    """A 64-bit hash as the databases' (not Python's ``hash``: ``hash(-1) == hash(-2)``, which once made
    this model's two different rows collide)."""
    return int.from_bytes(hashlib.blake2b(f"{position}:{value}".encode(), digest_size=8).digest(), "big")


def _descend(old: dict, new: dict, positions: Positions, rows_hint: int, first: int = FIRST_ROWS,
             **kwargs) -> Pruning:
    pruning = Pruning(positions, positions.first_width(rows_hint, first), **kwargs)
    while not pruning.done:
        if pruning.scope is not None:  # the two ways of saying a level's buckets select the same rows
            for rows in (old, new):
                assert _by_labels(rows, positions.base, pruning.scope.labels) == _read(rows, positions.base,
                                                                                       pruning.scope.intervals)
        pruning.feed(_aggregate(old, positions.base, pruning.width, pruning.intervals),
                     _aggregate(new, positions.base, pruning.width, pruning.intervals))
    return pruning


def _by_labels(rows: dict, base: int, labels: dict) -> set:
    """The positions ClickHouse's label lookup selects."""
    return {p for p in rows if any((p - base) // w in set(ls) for w, ls in labels.items())}


def _read(rows: dict, base: int, intervals) -> set:
    """The positions a read of ``intervals`` returns (width-1 buckets are the positions' offsets)."""
    return {base + offset for offset in _aggregate(rows, base, 1, intervals)}


snapshots = st.dictionaries(st.integers(-300, 300), st.integers(0, 3), max_size=120)


@settings(max_examples=300, deadline=None)
@given(snapshots, snapshots, st.integers(1, 8), st.integers(1, 4), st.sampled_from([0.3, 0.5, 1.0]),
       st.sampled_from([0.0, 0.05, 0.3]))
@example({-1: 0}, {-2: 0}, 1, 1, 0.3, 0.0)  # negative keys (and the model's old hash collision)
def test_every_differing_key_is_read_and_the_rest_counted_identical(old, new, leaf, fanout, most, share):
    positions = Positions.of_keys([min(old, default=None), min(new, default=None)],
                                  [max(old, default=None), max(new, default=None)])
    pruning = _descend(old, new, positions, max(len(old), len(new)), leaf_rows=leaf, fanout_bits=fanout,
                       most_differ=most, read_share=share)
    differing = {p for p in set(old) | set(new) if old.get(p) != new.get(p)}
    for rows in (old, new):
        assert _by_labels(rows, positions.base, pruning.read_scope.labels) == _read(rows, positions.base,
                                                                                    pruning.read_scope.intervals)
    read_old, read_new = _read(old, positions.base, pruning.to_read), _read(new, positions.base, pruning.to_read)
    assert differing <= read_old | read_new
    # every key is either settled as identical by the buckets or read (on the sides that hold it)
    settled = {p for p in new if p not in read_new}
    assert pruning.identical == len(settled) and all(old.get(p) == new[p] for p in settled)
    assert not {p for p in old if p not in read_old} - settled


@pytest.mark.parametrize("first", [32, 256])
def test_scattered_changes_read_a_small_fraction(first):
    """With first-level buckets of 32 rows (the default) a differing bucket is read at once; with
    256 it is cut first. Either way little of the table is read."""
    rows = 200_000
    old = {k: 0 for k in range(1, rows + 1)}
    new = dict(old)
    rng = random.Random(7)
    for k in rng.sample(range(1, rows + 1), rows // 1000):  # 0.1 % at random
        new[k] = 1
    for k in (5, 99_999, 150_000):
        del new[k]
    new.update({rows + 10: 0, rows + 20: 0})
    positions = Positions.of_keys([1, 1], [rows + 20, rows])
    pruning = _descend(old, new, positions, rows, first=first)
    read = _read(new, positions.base, pruning.to_read) | _read(old, positions.base, pruning.to_read)
    assert len(read) <= 0.05 * rows, len(read)
    assert pruning.levels == (1 if first <= LEAF_ROWS else 2)


@pytest.mark.parametrize("share, levels", [(0.0, 2), (SCAN_SHARE, 1)])
def test_hash_positions_read_small_cuts_instead_of_scanning_again(share, levels):
    """CRC32 positions put a Poisson number of rows in a bucket, so about half the differing
    buckets hold more than LEAF_ROWS. Without an index a next level would scan the shard again:
    with SCAN_SHARE they are read at once, still a small fraction of the table."""
    rng = random.Random(11)
    rows = 100_000
    old = {p: 0 for p in rng.sample(range(2**32), rows)}
    new = dict(old)
    for p in rng.sample(sorted(old), rows // 1000):
        new[p] = 1
    pruning = _descend(old, new, Positions.of_hash(), rows, read_share=share)
    read = _read(new, 0, pruning.to_read)
    assert pruning.levels == levels and {p for p in new if new[p]} <= read
    assert len(read) <= 0.05 * rows and pruning.identical == rows - len(read)


def test_everything_changed_is_read_without_cutting():
    old = {k: 0 for k in range(10_000)}
    new = {k: 1 for k in range(10_000)}
    pruning = _descend(old, new, Positions.of_keys([0], [9_999]), 10_000)
    assert pruning.levels == 1 and pruning.to_read == [(0, 9_999)]


def test_an_underestimated_table_is_cut_not_read_whole():
    """One first-level bucket that differs says nothing about how much changed: it is cut."""
    old = {k: 0 for k in range(5_000)}
    new = old | {2_500: 1}
    positions = Positions.of_keys([0], [4_999])
    pruning = Pruning(positions, positions.first_width(0))
    while not pruning.done:
        pruning.feed(_aggregate(old, 0, pruning.width, pruning.intervals),
                     _aggregate(new, 0, pruning.width, pruning.intervals))
    assert pruning.first_buckets == 1 and len(_read(new, 0, pruning.to_read)) <= 32


def test_hash_positions_and_widths():
    assert Positions.of_hash().top == 2**32 - 1
    assert Positions.of_hash().first_width(2**20, 256) == 2**20
    assert Positions.of_keys([None], [None]) == Positions(0, 0)
    assert Positions.of_keys([5, None], [9, None]).first_width(1000) == 1
    assert Positions.of_hash().first_width(0) == 2**32  # no estimate: one bucket, then cut
    assert merged([(5, 6), (0, 2), (3, 3), (9, 9), (6, 7)]) == [(0, 3), (5, 7), (9, 9)]
    assert interval_sql("`id`", [(0, 2), (3, 4), (10, 10)], -5) == "(`id` BETWEEN -5 AND -1 OR `id` BETWEEN 5 AND 5)"
    assert interval_sql("x", [], 0) == "1 = 0"
    s = step({0: (4, 1), 1: (40, 9)}, {0: (4, 1), 1: (40, 8), 2: (1, 3)}, 64, 1000, leaf_rows=8, most_differ=1.0)
    assert s.identical == 4 and s.cut == [(64, 127)] and s.read == [(128, 191, 1)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 30), max_size=60), st.lists(st.integers(0, 30), max_size=60),
       st.integers(1, 7), st.integers(1, 9), st.randoms())
def test_aligned_batches_pair_every_label(old_labels, new_labels, max_rows, chunk, rnd):
    def stream(labels, side):
        labels = sorted(labels)
        table = pa.table({"p": pa.array(labels, pa.int64()), "side": [side] * len(labels)})
        at = 0
        while at < len(labels):  # uneven fetches, empty ones included
            size = rnd.randint(0, chunk)
            yield table.slice(at, size)
            at += size

    seen = {"old": [], "new": []}
    for old, new in aligned_batches(stream(old_labels, "old"), stream(new_labels, "new"), "p", max_rows):
        o = old.column("p").to_pylist() if old is not None else []
        n = new.column("p").to_pylist() if new is not None else []
        assert o or n
        seen["old"] += o
        seen["new"] += n
        for label in set(o) | set(n):  # all of this label's rows, both sides, in this batch
            assert o.count(label) == old_labels.count(label) and n.count(label) == new_labels.count(label)
    assert seen["old"] == sorted(old_labels) and seen["new"] == sorted(new_labels)


def test_first_buckets_stay_within_one_aggregations_limit():
    assert first_rows(0) == first_rows(FIRST_ROWS * MAX_BUCKETS) == FIRST_ROWS
    assert first_rows(FIRST_ROWS * MAX_BUCKETS + 1) > FIRST_ROWS
    for shard_rows in (10**6, 5 * 10**7, 10**9):
        assert shard_rows / first_rows(shard_rows) <= MAX_BUCKETS



@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 200), st.integers(1, 4), st.integers(0, 50)), max_size=40,
                unique_by=lambda t: t[0]),
       st.integers(1, 120), st.integers(1, 5))
def test_pieces_cover_the_read_buckets_in_order_within_their_bounds(buckets, max_rows, max_intervals):
    # disjoint buckets (first, last, rows): label b of width 4 is offsets 4b .. 4b + length - 1
    read = [(4 * b, 4 * b + length - 1, rows) for b, length, rows in buckets]
    out = pieces(read, max_rows, max_intervals)
    covered = [o for intervals, _ in out for a, z in intervals for o in range(a, z + 1)]
    assert covered == sorted(o for a, z, _ in read for o in range(a, z + 1))  # each offset once, in order
    for intervals, rows in out:
        inside = [r for a, z, r in read if any(x <= a and z <= y for x, y in intervals)]
        assert rows == sum(inside)
        assert rows <= max_rows or len(inside) == 1  # only a bucket larger than the bound stands alone
        assert len(intervals) <= max_intervals
        assert all(b[0] > a[1] + 1 for a, b in zip(intervals, intervals[1:]))  # merged: no touching neighbours

"""core/verify/diff.py: flags and changed columns against a plain-Python reference (hypothesis), the
equality rules one by one, and the column choices users make."""

from __future__ import annotations

import datetime as dt
import decimal
import math

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_sync_provider.core.verify.diff import (
    CHANGED,
    DELETED,
    IDENTICAL,
    NEW,
    DiffColumns,
    DiffError,
    DuplicateKey,
    Tolerance,
    compare,
)

SCHEMA = pa.schema([("k1", pa.int64()), ("k2", pa.string()), ("f", pa.float64()), ("s", pa.string()),
                    ("b", pa.binary()), ("d", pa.decimal128(10, 2))])
COLUMNS = DiffColumns.resolve("t", SCHEMA.names, ["k1", "k2"])

values = st.fixed_dictionaries({
    "f": st.one_of(st.none(), st.sampled_from([0.0, -0.0, 1.0, 1.0000000000000002, -2.5, 1e300])),
    "s": st.one_of(st.none(), st.sampled_from(["", "a", "A", "a ", "ä"])),
    "b": st.one_of(st.none(), st.sampled_from([b"", b"\x00", b"a", b"a\x00"])),
    "d": st.one_of(st.none(), st.sampled_from([decimal.Decimal("0.00"), decimal.Decimal("0.01"),
                                               decimal.Decimal("1.10")])),
})
keys = st.tuples(st.integers(0, 5), st.sampled_from(["x", "X", "y"]))
snapshots = st.dictionaries(keys, values, max_size=25)


def table(rows: dict) -> pa.Table:
    return pa.Table.from_pylist([{"k1": k[0], "k2": k[1], **v} for k, v in rows.items()], schema=SCHEMA)


def same(a, b) -> bool:
    """The documented equality: NULL-safe, -0.0 == 0.0, everything else exact."""
    if a is None or b is None:
        return a is None and b is None
    return a == b


@settings(max_examples=300, deadline=None)
@given(snapshots, snapshots)
def test_flags_and_changed_columns_match_a_plain_reference(old, new):
    result = compare(table(old), table(new), COLUMNS)
    expected = {}
    for key in old.keys() | new.keys():
        if key not in new:
            expected[key] = (DELETED, [])
        elif key not in old:
            expected[key] = (NEW, [])
        else:
            changed = [c for c in ("f", "s", "b", "d") if not same(old[key][c], new[key][c])]
            if changed:
                expected[key] = (CHANGED, changed)
    found = {}
    if result.changes is not None:
        for row in result.changes.to_pylist():
            found[(row["k1"], row["k2"])] = (row["flag"], row["changed"])
            if row["flag"] == CHANGED:  # old and new values are the two snapshots' own
                for c in ("f", "s", "b", "d"):
                    assert same(row[f"old__{c}"], old[(row["k1"], row["k2"])][c])
                    assert same(row[f"new__{c}"], new[(row["k1"], row["k2"])][c])
    assert found == expected
    assert result.counts[IDENTICAL] == len(old.keys() & new.keys()) - sum(1 for f, _ in expected.values()
                                                                          if f == CHANGED)
    assert (result.upserts.num_rows if result.upserts is not None else 0) == \
        sum(1 for f, _ in expected.values() if f in (NEW, CHANGED))
    assert (result.tombstones.num_rows if result.tombstones is not None else 0) == \
        sum(1 for f, _ in expected.values() if f == DELETED)


def _pair(column_type, old, new, tolerance=None):
    schema = pa.schema([("id", pa.int32()), ("v", column_type)])
    columns = DiffColumns.resolve("t", ["id", "v"], ["id"], tolerances={"v": tolerance} if tolerance else None,
                                  float_columns=["v"])
    result = compare(pa.table({"id": [1], "v": [old]}, schema=schema), pa.table({"id": [1], "v": [new]}, schema=schema),
                     columns)
    return result.counts[CHANGED] == 1


@pytest.mark.parametrize("column_type, old, new, differs", [
    (pa.string(), None, "", True),  # NULL is not ''
    (pa.string(), None, None, False),
    (pa.string(), "a", "A", True),  # byte-exact, whatever the source collation says
    (pa.binary(), b"a", b"a\x00", True),
    (pa.decimal256(65, 30), decimal.Decimal("1.5"), decimal.Decimal("1.500"), False),  # by value at the scale
    (pa.decimal256(65, 30), decimal.Decimal(0), decimal.Decimal("1e-30"), True),
    (pa.timestamp("us"), dt.datetime(2024, 1, 1), dt.datetime(2024, 1, 1, 0, 0, 0, 1), True),
    (pa.float64(), 0.0, -0.0, False),
    (pa.float64(), 1.0, math.nextafter(1.0, 2.0), True),  # the last bit
    (pa.float64(), math.nan, math.nan, False),
    (pa.float32(), 1.5, 1.5, False),
])
def test_equality_rules(column_type, old, new, differs):
    assert _pair(column_type, old, new) is differs


def test_float_tolerances():
    assert not _pair(pa.float64(), 100.0, 100.4, Tolerance(abs=0.5))
    assert _pair(pa.float64(), 100.0, 100.6, Tolerance(abs=0.5))
    assert not _pair(pa.float64(), 1e9, 1e9 + 1, {"rel": 1e-8})
    assert _pair(pa.float64(), 1e9, 1e9 + 100, {"rel": 1e-8})
    assert _pair(pa.float64(), None, 1.0, 10)  # NULL is never within a tolerance


def test_duplicate_keys_are_an_error_naming_the_key():
    schema = pa.schema([("id", pa.int32()), ("v", pa.int32())])
    dup = pa.table({"id": [1, 2, 2], "v": [1, 2, 3]}, schema=schema)
    with pytest.raises(DuplicateKey, match=r"key \(id=2\) appears more than once in the old snapshot"):
        compare(dup, schema.empty_table(), DiffColumns.resolve("t", ["id", "v"], ["id"]))


def test_column_choices_are_checked_and_named():
    names = ["id", "a", "b", "f"]
    assert DiffColumns.resolve("t", names, ["id"]).compared == ("a", "b", "f")
    assert DiffColumns.resolve("t", names, ["id"], ignore_columns=["b"]).compared == ("a", "f")
    assert DiffColumns.resolve("t", names, ["id"], compare_columns=["b"]).compared == ("b",)
    with pytest.raises(DiffError, match=r"table t: ignore_columns \['zz'\] not among its columns"):
        DiffColumns.resolve("t", names, ["id"], ignore_columns=["zz"])
    with pytest.raises(DiffError, match="no primary key"):
        DiffColumns.resolve("t", names, [])
    with pytest.raises(DiffError, match=r"tolerances apply to FLOAT/DOUBLE columns only, not \['a'\]"):
        DiffColumns.resolve("t", names, ["id"], tolerances={"a": 1}, float_columns=["f"])
    with pytest.raises(DiffError, match=r"both compared and ignored"):
        DiffColumns.resolve("t", names, ["id"], compare_columns=["a"], ignore_columns=["a"])


def test_the_operator_fails_on_changes_only_when_asked(tmp_path):
    from airflow_sync_provider.compat import AirflowException
    from airflow_sync_provider.operators.snapshot_diff import SnapshotDiffOperator

    result = {"diff_key": "d", "run_id": "r", "old": "c.t", "new": "s.t", "verdict": "changed",
              "counts": {IDENTICAL: 8, CHANGED: 1, NEW: 0, DELETED: 1}, "rows_old": 10, "rows_new": 9,
              "rows_read_old": 4, "rows_read_new": 3, "shards": 2, "shards_read": 1, "buckets_read": 1,
              "changes_table": "c.t__changes", "keys": ["id"], "compared": ["v"],
              "shard_results": [{"shard_id": 0, "old_rows": 10, "new_rows": 9, "buckets": 1, "buckets_read": 1,
                                 "rows_read_old": 4, "rows_read_new": 3, CHANGED: 1, NEW: 0, DELETED: 1}],
              "samples": {CHANGED: [{"id": "1", "changed": ["v"], "old__v": "1", "new__v": "2"}],
                          DELETED: [{"id": "2", "changed": [], "old__v": "5", "new__v": None}], NEW: []}}
    kwargs = dict(source_table="s.t", old_table="c.t", report_dir=str(tmp_path))
    warned = SnapshotDiffOperator(task_id="w", **kwargs).summarize(result)
    assert warned["counts"][CHANGED] == 1
    page = open(warned["report"]).read()
    assert "<td class='chg'><s>1</s> → 2</td>" in page and "deleted: 1 (first 1)" in page
    with pytest.raises(AirflowException, match=r"snapshot diff 'd'.*changed 1.*deleted 1"):
        SnapshotDiffOperator(task_id="f", on_change="fail", **kwargs).summarize(result)

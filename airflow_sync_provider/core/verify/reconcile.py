"""Reconciliation: per-shard counts and content checksums on both sides, and what differs.

The shards are the load's own (core/clickhouse/shards.py evaluates them on the target). Both
databases compute the numbers themselves; only one row per shard travels.
"""

from __future__ import annotations

from airflow_sync_provider.core.clickhouse.columns import SIGN_COLUMN
from airflow_sync_provider.core.source.planning import Plan
from airflow_sync_provider.core.sql import ch_ident, ch_table
from airflow_sync_provider.core.verify.rowhash import ch_row_hash, mysql_row_hash

# A table's verdict: every shard matched; shards differ (a re-import of those shards repairs them);
# the copy's columns or key no longer match the source's (core/verify/shape.py: a full reload
# repairs it). A job of many tables adds FAILED for a table it could not check at all.
OK, MISMATCH, SHAPE_MISMATCH, FAILED = "ok", "mismatch", "shape_mismatch", "failed"
# The overall verdict of many tables is the first of these that any table has: a table that was
# not checked says least about its copy, a copy of the wrong shape needs a full reload, a
# mismatched shard a re-import of that shard; ``ok`` only when every table matched.
PRECEDENCE = (FAILED, SHAPE_MISMATCH, MISMATCH, OK)


def overall_verdict(verdicts) -> str:
    """The verdict of many tables (:data:`PRECEDENCE`); ``ok`` only if every one is ``ok``. An
    unknown verdict ranks as ``failed``; no tables at all is ``ok`` (nothing differs)."""
    found = set(verdicts)
    if found - set(PRECEDENCE):
        return FAILED
    return next((v for v in PRECEDENCE if v in found), OK)


def shard_problems(row: dict, counters=None) -> list[str]:
    """Why one shard does not reconcile (empty when it does): source vs target rows, checksums
    (None when not computed), and the load's hook counters (a ledger ShardState, if any)."""
    out = []
    if row["source_rows"] != row["target_rows"]:
        out.append(f"source {row['source_rows']} != target {row['target_rows']}")
    if row.get("source_checksum") != row.get("target_checksum"):
        out.append("content checksum differs")
    if counters is not None and counters.counters_disagree():
        out.append(f"hook counters read {counters.records_read} / written {counters.records_written} / "
                   f"failed {counters.records_failed}")
    return out


def count_source(conn, plan: Plan) -> list[int]:
    """COUNT(*) of every shard in MySQL, through the split index (pymysql connection)."""
    counts = []
    with conn.cursor() as cur:
        for shard in plan.shards:
            cur.execute(f"SELECT COUNT(*) {plan.from_clause()} WHERE {shard.where}", shard.params)
            counts.append(int(cur.fetchone()[0]))
    return counts


def count_target(ch, database: str, table: str, predicates: list[tuple[str, dict]], final: bool = True,
                 multiset: bool = False) -> list[int]:
    """count() of every shard in ClickHouse; ``FINAL`` for ReplacingMergeTree targets, so
    unmerged older versions of a row do not count (tables without a primary key have none);
    a ``multiset`` copy's rows are counted by their signs."""
    source = ch_table(database, table) + (" FINAL" if final else "")
    counted = f"sum({ch_ident(SIGN_COLUMN)})" if multiset else "count()"
    return [int(ch.command(f"SELECT {counted} FROM {source} WHERE {where}", parameters=params) or 0)
            for where, params in predicates]


# --- content checksums: an order-independent sum of 64-bit row hashes (core/verify/rowhash.py) ---
# The text of each value is its type rule's canonical text (core/typemap.py), computed in MySQL
# from the same expression the loader reads, so every documented conversion is made on both sides.

def mysql_checksum_sql(schema, plan: Plan) -> str:
    """``SELECT COUNT(*), SUM(hash)`` for one shard (append the shard's WHERE and params)."""
    return f"SELECT COUNT(*), COALESCE(SUM({mysql_row_hash(schema.mappings())}), 0) {plan.from_clause()} WHERE "


def clickhouse_checksum_sql(schema, database: str, table: str, final: bool = True, multiset: bool = False) -> str:
    """The same count and checksum in ClickHouse (append the shard's predicate); a ``multiset``
    copy's by its signs: an occurrence that went cancels one that came, so the sums are the
    source's whenever the multisets are equal."""
    if multiset:
        sign = ch_ident(SIGN_COLUMN)
        return (f"SELECT sum({sign}), ifNull(sum(toInt128({sign}) * toInt128({ch_row_hash(schema.mappings())})), 0)"
                f" FROM {ch_table(database, table)} FINAL WHERE ")
    return (f"SELECT count(), ifNull(sum(toUInt128({ch_row_hash(schema.mappings())})), 0)"
            f" FROM {ch_table(database, table)}{' FINAL' if final else ''} WHERE ")


def checksum_source(conn, head: str, plan: Plan) -> list[tuple[int, int]]:
    """Every shard's count and checksum in MySQL; ``head`` is :func:`mysql_checksum_sql`."""
    out = []
    with conn.cursor() as cur:
        for shard in plan.shards:
            cur.execute(head + shard.where, shard.params)
            count, total = cur.fetchone()
            out.append((int(count), int(total)))
    return out


def checksum_target(ch, head: str, predicates) -> list[tuple[int, int]]:
    """Every shard's count and checksum in ClickHouse; ``head`` is :func:`clickhouse_checksum_sql`."""
    return [tuple(int(v) for v in ch.query(head + where, parameters=params).result_rows[0])
            for where, params in predicates]

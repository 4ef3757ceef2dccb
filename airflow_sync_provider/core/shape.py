"""A copy's shape in one place (the Sync view's table page, ``/sync/table?name=<db.table>``): its
source, the key its rows collapse by, its layout, what it holds (transforms, row filter, kept
deletes; never the salt), the loads that wrote it (its history) and the pipelines that follow it,
with the foreign keys they follow through it. Read from the copy's table comment in ClickHouse (as
``airflow-sync cdc status`` reads it), the loads and the pipelines' states in the ledger. Plain
Python: no Airflow, no HTML.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from airflow_sync_provider.core.cdc.checkpoints import Checkpoints
from airflow_sync_provider.core.clickhouse.columns import SIGN_COLUMN
from airflow_sync_provider.core.clickhouse.described import TableFacts, table_facts
from airflow_sync_provider.core.ledger import Ledger

HISTORY_ROWS = 20  # the newest loads into the copy shown


@dataclass
class CopyShape:
    name: str  # db.table: the copy (or a source whose copy is looked for)
    facts: TableFacts | None = None  # the copy as ClickHouse has it (None: no such table here)
    sources: list[str] = field(default_factory=list)  # the source tables its loads and pipelines read
    loads: list[dict] = field(default_factory=list)  # newest first: key, generation, status, source, at
    pipelines: list[dict] = field(default_factory=list)  # pipeline, source table, streaming or why not
    foreign_keys: list[dict] = field(default_factory=list)  # followed through it: name, child, parent, rules

    @property
    def found(self) -> bool:
        return self.facts is not None or bool(self.loads or self.pipelines)

    @property
    def multiset(self) -> bool:
        """A copy of a table without a primary key that CDC follows (docs/keyless-tables.md): no
        key, its rows signed occurrences (``_sign``), the table the sum of the signs per distinct
        row. (A full load's copy of such a table is a plain MergeTree: keyless, not signed.)"""
        return self.facts is not None and not self.facts.key and SIGN_COLUMN in self.facts.columns


def _split(name: str) -> tuple[str, str]:
    database, _, table = name.partition(".")
    return database, table


def copy_shape(ledger: Ledger, name: str) -> CopyShape:
    """What the ledger and the ClickHouse that holds it know of the copy ``name`` (``db.table``;
    a source table's name finds the copies made of it)."""
    ledger.snapshot_tables()
    shape = CopyShape(name)
    if ledger.exists("loads"):
        rows = ledger.ch.query(
            f"SELECT load_key, generation, status, source_table, target_table, toFloat64(updated_at)"
            f" FROM {ledger.table('loads')} FINAL WHERE target_table = {{n:String}} OR source_table = {{n:String}}"
            " ORDER BY updated_at DESC LIMIT 1 BY load_key LIMIT {h:UInt32}",
            parameters={"n": name, "h": HISTORY_ROWS}).result_rows
        shape.loads = [{"load_key": k, "generation": g, "status": s, "source": src, "target": dst, "at": at}
                       for k, g, s, src, dst, at in rows]
    target = next((row["target"] for row in shape.loads if row["target"] == name), None)
    if ledger.exists("cdc_state"):
        checkpoints = Checkpoints(ledger.ch, ledger.database)
        for pipeline in checkpoints.pipelines():
            state = checkpoints.state(pipeline)
            for t in state.tables if state else []:
                copy = f"{t.target_database}.{t.target_table}"
                if name in (t.name, copy):
                    target = target or copy
                    shape.pipelines.append({"pipeline": pipeline, "source": t.name, "copy": copy,
                                            "streaming": t.streaming, "left": t.left})
                    shape.foreign_keys += [dict(k, pipeline=pipeline) for k in state.foreign_keys or []
                                           if isinstance(k, dict) and t.name in (k.get("child"), k.get("parent"))]
    shape.sources = sorted({row["source"] for row in shape.loads if row["target"] == (target or name)}
                           | {p["source"] for p in shape.pipelines})
    pair = _split(target or name)
    shape.facts = table_facts(ledger.ch, [pair]).get(pair)
    if target and target != name:
        shape.name = target
    return shape

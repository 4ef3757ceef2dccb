"""DDL on one shard of a merged copy (core/source/group.py), decided per class of change.

Each shard (a *member*: one source table) follows its own binlog in a pipeline of its own, and
reaches a DDL at its own time; the merged copy has one set of columns for all of them. The rule
for each class (TiDB DM's "optimistic" shard DDL is the reference), docs/source-groups.md:

* **ADD COLUMN** reaches the merged copy when the first shard adds it (``ADD COLUMN IF NOT
  EXISTS … Nullable(…)``: the other shards' rows are NULL there until they add it); the shard's
  existing rows take MySQL's value of the default in one mutation of that shard's rows (a
  per-row or time-dependent default: the shard is re-copied). A name another shard added with
  a type that does not fit one ClickHouse type stops the shard, naming both.
* **DROP COLUMN** leaves the merged copy only when no other shard has the column any more (the
  last one drops it); until then the shard's rows are NULL there (one mutation; the column
  becomes Nullable if it was not).
* **RENAME / CHANGE of a column's name or ClickHouse type** is followed once every shard has made
  it: a shard that reaches it while others have not stops there (``Waiting``), naming them, and
  every retry stops there again; the shard that finds all the others made it or stopped at the
  same change renames the merged column (a type change: only one the old values fit, else the
  group is re-loaded) and follows; the stopped ones follow on their next run. A change that keeps
  the ClickHouse type (``VARCHAR(16)`` → ``VARCHAR(32)``) is followed at once.
* **A primary key change** stops the shard: a merged copy is keyed by one primary key; re-load
  the group.

Only what the statement itself says is used (the shard's shape at the statement, not the
source's current one), as for single copies (core/cdc/ddl.py, which probes definitions).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from airflow_sync_provider.core.cdc.ddl import (
    ADD,
    CHANGE,
    DROP,
    KEEP,
    KEY,
    NOT_CONSTANT,
    RECOPY,
    RENAME,
    ProbeFailed,
    Statement,
    ch_literal,
    keeps_values,
    probe_column,
    widens,
)
from airflow_sync_provider.core.positions import BinlogError
from airflow_sync_provider.core.sql import ch_ident
from airflow_sync_provider.core.typemap import MySQLColumn, map_column


class Waiting(BinlogError):
    """A shard reached a change the merged copy follows only once every shard has made it
    (``change``: what it waits at, recorded with its table)."""

    def __init__(self, message: str, change: dict):
        super().__init__(message)
        self.change = change


@dataclass(frozen=True)
class Sibling:
    """Another member of the merged copy, as its pipeline last recorded it: its columns (name →
    definition, the table's own ones) and the change it is stopped at, if any."""

    name: str
    columns: dict
    waiting: dict | None = None


@dataclass
class MemberFollowed:
    """What a shard's ALTER does: its columns (its view) after it, ALTER clauses for the merged
    copy (idempotent), assignments of one mutation of the shard's rows, and a re-copy reason."""

    columns: list[MySQLColumn]
    merged: list[str] = field(default_factory=list)
    rows: list[str] = field(default_factory=list)
    recopy: str = ""


def base_type(ch_type: str) -> str:
    """A ClickHouse type without its Nullable()."""
    return ch_type[9:-1] if ch_type.startswith("Nullable(") else ch_type


def nullable_type(ch_type: str) -> str:
    return ch_type if ch_type.startswith("Nullable(") else f"Nullable({ch_type})"


def follow_member_alter(conn, statement: Statement, columns: list[MySQLColumn], key: list[str], member: str,
                        merged: dict, siblings: list[Sibling], where: str, collation: str | None) -> MemberFollowed:
    """Decide one ALTER TABLE on ``member`` (``columns``: its view before it, ``key``: its primary
    key) for the merged copy whose columns are ``merged`` (name → ClickHouse type), given the
    other members ``siblings``. Raises :class:`Waiting` (a change the others have not made) or
    :class:`BinlogError` (a change a merged copy cannot follow)."""
    database = statement.tables[0].partition(".")[0]
    columns = list(columns)
    out = MemberFollowed(columns)

    def index(name):
        return next((i for i, c in enumerate(columns) if c.name.lower() == name.lower() and c.tag is None), None)

    def mine(name):
        at = index(name)
        return None if at is None or columns[at].absent else at

    def probe(action):
        try:
            return probe_column(conn, database, action.definition, collation, where)
        except ProbeFailed as exc:
            out.recopy = out.recopy or str(exc)
            return None, NOT_CONSTANT

    def others_with(name: str) -> list[str]:
        return [s.name for s in siblings if any(n.lower() == name.lower() for n in s.columns)]

    for action in statement.actions:
        if action.kind == KEY or action.column in key and action.kind in (DROP, RENAME, CHANGE):
            raise BinlogError(f"{where}: a primary-key change on {member}; a merged copy is keyed by one primary key "
                              "(then its source columns), so it cannot follow one shard's. A retry stops here again: "
                              "make the change on every shard, then load the group again (a full load of the merged "
                              "copy) and bootstrap its pipeline again")
        if action.kind == KEEP:
            continue
        if action.kind == RECOPY:
            out.recopy = out.recopy or action.note
        elif action.kind == ADD:
            if mine(action.column) is not None:
                continue
            column, value = probe(action)
            if column is None:
                out.recopy = out.recopy or f"column {action.column!r} is computed from other columns"
                continue
            column = dataclasses.replace(column, name=action.column, nullable=True)
            ch_type = map_column(column, where).ch_type
            present = merged.get(action.column)
            if present is not None and base_type(present) != base_type(ch_type):
                raise BinlogError(f"{where}: {member} adds column {action.column!r} as {column.column_type} "
                                  f"({base_type(ch_type)}), but the merged copy has it as {present} (from "
                                  f"{', '.join(others_with(action.column)) or 'another shard'}): one merged column "
                                  "cannot hold both. A retry stops here again: give the shards one type for it")
            if present is None:
                out.merged.append(f"ADD COLUMN IF NOT EXISTS {ch_ident(column.name)} {nullable_type(ch_type)}")
            if value is NOT_CONSTANT:
                out.recopy = out.recopy or f"column {column.name!r} takes a per-row, time-dependent or random value"
            elif value is not None:
                out.rows.append(f"{ch_ident(column.name)} = {ch_literal(value, nullable_type(ch_type))}")
            at = index(action.column)
            if at is not None:
                columns[at] = column
            else:
                tags = next((i for i, c in enumerate(columns) if c.tag is not None), len(columns))
                columns.insert(tags, column)
        elif action.kind == DROP:
            at = mine(action.column)
            if at is None:
                continue
            old = columns[at]
            present = merged.get(old.name)
            if others_with(old.name):
                if present is not None and not present.startswith("Nullable("):
                    out.merged.append(f"MODIFY COLUMN {ch_ident(old.name)} {nullable_type(present)}")
                out.rows.append(f"{ch_ident(old.name)} = NULL")
                columns[at] = dataclasses.replace(old, absent=True, nullable=True)
            else:  # the last shard that had it
                out.merged.append(f"DROP COLUMN IF EXISTS {ch_ident(old.name)}")
                columns.pop(at)
        elif action.kind in (RENAME, CHANGE):
            at = mine(action.column)
            if at is None:
                continue
            old = columns[at]
            new = old
            if action.kind == CHANGE:
                new, _ = probe(action)
                if new is None:
                    raise BinlogError(f"{where}: {member} makes column {old.name!r} a computed one; a merged copy "
                                      "cannot follow it. A retry stops here again: load the group again")
            new = dataclasses.replace(new, name=action.new_name, nullable=old.nullable or new.nullable)
            a, b = map_column(old, where).ch_type, map_column(new, where).ch_type
            if new.name.lower() == old.name.lower() and base_type(a) == base_type(b):
                if not keeps_values(old, new, where):
                    out.recopy = out.recopy or (f"column {old.name!r} {old.column_type} → {new.column_type} may "
                                                "change its values")
                columns[at] = new
                continue
            change = {"column": old.name, "to": new.name, "type": base_type(b)}
            behind = [s.name for s in siblings if not _made(s, change) and s.waiting != change]
            if behind:
                raise Waiting(f"{where}: {member} {_what(change, a)}; the merged copy follows it once every shard has "
                              f"made it, and {', '.join(behind)} {'has' if len(behind) == 1 else 'have'} not: this "
                              "shard's stream stops here (a retry stops here again) until they reach the same change; "
                              "then the last one changes the merged copy and the others follow on their next run",
                              change)
            if new.name != old.name:
                out.merged.append(f"RENAME COLUMN IF EXISTS {ch_ident(old.name)} TO {ch_ident(new.name)}")
            present = merged.get(new.name) or merged.get(old.name) or a
            if base_type(present) != base_type(b):
                if not widens(base_type(present), base_type(b)):
                    raise BinlogError(f"{where}: every shard of the merged copy changed column {old.name!r} to "
                                      f"{new.column_type}, whose values the copy's {present} does not hold unchanged "
                                      "the other way round; a retry stops here again: load the group again")
                out.merged.append(f"MODIFY COLUMN {ch_ident(new.name)} "
                                  f"{nullable_type(b) if present.startswith('Nullable(') else b}")
            if not keeps_values(old, new, where):
                out.recopy = out.recopy or (f"column {old.name!r} {old.column_type} → {new.column_type} may change "
                                            "its values")
            columns[at] = new
    out.columns = columns
    return out


def _made(sibling: Sibling, change: dict) -> bool:
    """Has the sibling's table already made ``change`` (its column has the new name and type)?"""
    found = next((c for n, c in sibling.columns.items() if n.lower() == change["to"].lower()), None)
    gone = change["column"].lower() == change["to"].lower() or not any(
        n.lower() == change["column"].lower() for n in sibling.columns)
    return found is not None and gone and base_type(map_column(found, sibling.name).ch_type) == change["type"]


def _what(change: dict, was: str) -> str:
    if change["column"] != change["to"]:
        return f"renames column {change['column']!r} to {change['to']!r}" + (
            f" ({change['type']})" if base_type(was) != change["type"] else "")
    return f"changes column {change['column']!r} from {base_type(was)} to {change['type']}"

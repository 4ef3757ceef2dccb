"""The one place a schema change is decided: what an ALTER TABLE on a followed table does to its
copy (:func:`decide`), by the copy's rule — a table copied alone (:class:`OwnCopy`), or one shard
of a merged copy (:class:`MergedCopy`, core/source/group.py). The statement is parsed, and its
column definitions probed in MySQL, by core/cdc/ddl.py; the decision is carried out by
spark/cdc_ddl.py. Only what the statement says is used (the table's shape at the statement, not
the source's current one).

**A table copied alone** follows every change in place:

* ADD COLUMN: added with MySQL's value of its default for every existing row (a per-row, time-
  dependent or computed default: added, and the table re-copied);
* DROP COLUMN: dropped; RENAME / CHANGE: renamed, its ClickHouse type changed when the mapping
  changes; a change that may alter values (a narrower type, another charset) re-copies the table;
* a primary key change re-copies the table into a copy ordered by its new key (``rekey``), except
  a MODIFY of a key column that keeps its values and its ClickHouse type.

**A shard of a merged copy** (TiDB DM's "optimistic" shard DDL is the reference,
docs/source-groups.md):

* ADD COLUMN reaches the merged copy when the first shard adds it (``ADD COLUMN IF NOT EXISTS
  … Nullable(…)``: the other shards' rows are NULL there until they add it); the shard's existing
  rows take MySQL's value of the default in one mutation of that shard's rows (a per-row or
  time-dependent default: the shard is re-copied). A name another shard added with a type that
  does not fit one ClickHouse type stops the shard, naming both.
* DROP COLUMN leaves the merged copy only when no other shard has the column any more (the last
  one drops it); until then the shard's rows are NULL there (one mutation; the column becomes
  Nullable if it was not).
* RENAME / CHANGE of a column's name or ClickHouse type is followed once every shard has made it:
  a shard that reaches it while others have not stops there (:class:`Waiting`), naming them, and
  every retry stops there again; the shard that finds all the others made it or stopped at the
  same change renames the merged column (a type change: only one the old values fit, else the
  group is re-loaded) and follows; the stopped ones follow on their next run. A change that keeps
  the ClickHouse type (``VARCHAR(16)`` → ``VARCHAR(32)``) is followed at once.
* A primary key change stops the shard: a merged copy is keyed by one primary key; re-load the group.
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
    Action,
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


@dataclass
class Alter:
    """One ALTER TABLE to decide: the table's ``columns`` (as copied; a merged copy's member: its
    view) and primary ``key`` before it; ``conn`` (pymysql, to the source) and ``collation`` probe
    the definitions it gives; ``where`` names the table and the statement in messages."""

    conn: object
    statement: Statement
    columns: list[MySQLColumn]
    key: list[str]
    where: str
    collation: str | None = None


@dataclass
class Decision:
    """What a schema change does: the table's columns after it, ALTER clauses for the copy (the
    merged one for a shard; idempotent), assignments of one mutation of the table's rows in the
    copy (a shard's), why the table must be re-copied ("" : not needed), and whether under a new
    key."""

    columns: list[MySQLColumn]
    copy: list[str] = field(default_factory=list)
    rows: list[str] = field(default_factory=list)
    recopy: str = ""
    rekey: bool = False

    def because(self, reason: str) -> None:
        """The table is re-copied (the first reason is the one given)."""
        self.recopy = self.recopy or reason


class OwnCopy:
    """The rule of a table copied alone (see the module's text). ``config``: the pipeline's table
    entry (``columns`` / ``exclude_columns``: a column the copy leaves out is not added)."""

    def __init__(self, config: dict):
        self.chosen, self.excluded = config.get("columns"), set(config.get("exclude_columns") or ())

    def index(self, columns: list[MySQLColumn], name: str) -> int | None:
        """Where the table's own column ``name`` is in ``columns`` (None: the copy has none)."""
        return next((i for i, c in enumerate(columns) if c.name.lower() == name.lower()), None)

    def key_changed(self, alter: Alter, action: Action, out: Decision) -> bool:
        """A change of the primary key: True when it keeps the copy as it is (a MODIFY of a key
        column that keeps its values and type), else the table is re-copied under its new key."""
        if action.kind == CHANGE and action.new_name == action.column:  # e.g. MODIFY id … AUTO_INCREMENT
            new, _ = probe(alter, action, out)
            at = self.index(out.columns, action.column)
            old = out.columns[at]
            if new is not None and keeps_values(old, new, alter.where) \
                    and map_column(new, alter.where).ch_type == map_column(old, alter.where).ch_type:
                out.columns[at] = dataclasses.replace(new, name=old.name)
                return True
        # the copy is keyed and sorted by it: nothing is changed in place; the table is copied anew
        # into a copy ordered by its new key (spark/cdc_ddl.Recopies), then swapped in
        what = "a new primary key" if action.kind == KEY else f"{action.kind} of key column {action.column!r}"
        out.copy, out.rows, out.rekey = [], [], True
        out.recopy = f"{alter.where} changes the primary key {alter.key} ({what})"
        return False

    def add(self, alter: Alter, action: Action, out: Decision) -> None:
        if self.index(out.columns, action.column) is not None or action.column in self.excluded \
                or (self.chosen is not None and action.column not in self.chosen):
            return
        column, value = probe(alter, action, out)
        if column is None:  # the definition reads other columns: MySQL computes it per row
            out.because(f"column {action.column!r} is computed from other columns")
            return
        column = dataclasses.replace(column, name=action.column)
        ch_type = map_column(column, alter.where).ch_type
        if value is NOT_CONSTANT:
            out.copy.append(f"ADD COLUMN IF NOT EXISTS {ch_ident(column.name)} {ch_type}")
            out.because(f"column {column.name!r} takes a per-row, time-dependent or random value")
        else:  # every existing row takes MySQL's value of the default
            out.copy.append(f"ADD COLUMN IF NOT EXISTS {ch_ident(column.name)} {ch_type} "
                            f"DEFAULT {ch_literal(value, ch_type)}")
        out.columns.append(column)

    def drop(self, alter: Alter, at: int, out: Decision) -> None:
        out.copy.append(f"DROP COLUMN IF EXISTS {ch_ident(out.columns.pop(at).name)}")

    def change(self, alter: Alter, at: int, new: MySQLColumn | None, name: str, out: Decision) -> None:
        """RENAME / CHANGE of the column at ``at`` into ``new`` named ``name`` (None: a column now
        computed from others, which the probe cannot define)."""
        old = out.columns[at]
        if new is None:
            new = old
            out.because(f"column {name!r} is now computed from other columns")
        new = dataclasses.replace(new, name=name)
        if new.name != old.name:
            out.copy.append(f"RENAME COLUMN IF EXISTS {ch_ident(old.name)} TO {ch_ident(new.name)}")
        a, b = map_column(old, alter.where).ch_type, map_column(new, alter.where).ch_type
        if not keeps_values(old, new, alter.where):
            out.because(f"column {old.name!r} {old.column_type} → {new.column_type} may change its values")
            if a != b:  # a fresh column: the re-copy fills it
                out.copy += [f"DROP COLUMN IF EXISTS {ch_ident(new.name)}",
                             f"ADD COLUMN IF NOT EXISTS {ch_ident(new.name)} {b}"]
        elif a != b:
            out.copy.append(f"MODIFY COLUMN {ch_ident(new.name)} {b}")
        out.columns[at] = new


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


def base_type(ch_type: str) -> str:
    """A ClickHouse type without its Nullable()."""
    return ch_type[9:-1] if ch_type.startswith("Nullable(") else ch_type


def nullable_type(ch_type: str) -> str:
    return ch_type if ch_type.startswith("Nullable(") else f"Nullable({ch_type})"


class MergedCopy(OwnCopy):
    """The rule of one shard (``member``) of a merged copy whose columns are ``merged`` (name →
    ClickHouse type), given the other members ``siblings`` (see the module's text)."""

    def __init__(self, member: str, merged: dict, siblings: list[Sibling]):
        super().__init__({})
        self.member, self.merged, self.siblings = member, merged, siblings

    def index(self, columns: list[MySQLColumn], name: str) -> int | None:
        """The member's own column ``name`` (not a source column, not one it lacks)."""
        at = self.at(columns, name)
        return None if at is None or columns[at].absent else at

    @staticmethod
    def at(columns: list[MySQLColumn], name: str) -> int | None:
        return next((i for i, c in enumerate(columns) if c.name.lower() == name.lower() and c.tag is None), None)

    def others_with(self, name: str) -> list[str]:
        return [s.name for s in self.siblings if any(n.lower() == name.lower() for n in s.columns)]

    def key_changed(self, alter: Alter, action: Action, out: Decision) -> bool:
        raise BinlogError(f"{alter.where}: a primary-key change on {self.member}; a merged copy is keyed by one "
                          "primary key (then its source columns), so it cannot follow one shard's. A retry stops here "
                          "again: make the change on every shard, then load the group again (a full load of the "
                          "merged copy) and bootstrap its pipeline again")

    def add(self, alter: Alter, action: Action, out: Decision) -> None:
        if self.index(out.columns, action.column) is not None:
            return
        column, value = probe(alter, action, out)
        if column is None:
            out.because(f"column {action.column!r} is computed from other columns")
            return
        column = dataclasses.replace(column, name=action.column, nullable=True)
        ch_type = map_column(column, alter.where).ch_type
        present = self.merged.get(action.column)
        if present is not None and base_type(present) != base_type(ch_type):
            raise BinlogError(f"{alter.where}: {self.member} adds column {action.column!r} as {column.column_type} "
                              f"({base_type(ch_type)}), but the merged copy has it as {present} (from "
                              f"{', '.join(self.others_with(action.column)) or 'another shard'}): one merged column "
                              "cannot hold both. A retry stops here again: give the shards one type for it")
        if present is None:
            out.copy.append(f"ADD COLUMN IF NOT EXISTS {ch_ident(column.name)} {nullable_type(ch_type)}")
        if value is NOT_CONSTANT:
            out.because(f"column {column.name!r} takes a per-row, time-dependent or random value")
        elif value is not None:
            out.rows.append(f"{ch_ident(column.name)} = {ch_literal(value, nullable_type(ch_type))}")
        at = self.at(out.columns, action.column)  # a column it lacked becomes its own
        if at is not None:
            out.columns[at] = column
        else:
            tags = next((i for i, c in enumerate(out.columns) if c.tag is not None), len(out.columns))
            out.columns.insert(tags, column)

    def drop(self, alter: Alter, at: int, out: Decision) -> None:
        old = out.columns[at]
        present = self.merged.get(old.name)
        if self.others_with(old.name):
            if present is not None and not present.startswith("Nullable("):
                out.copy.append(f"MODIFY COLUMN {ch_ident(old.name)} {nullable_type(present)}")
            out.rows.append(f"{ch_ident(old.name)} = NULL")
            out.columns[at] = dataclasses.replace(old, absent=True, nullable=True)
        else:  # the last shard that had it
            out.copy.append(f"DROP COLUMN IF EXISTS {ch_ident(old.name)}")
            out.columns.pop(at)

    def change(self, alter: Alter, at: int, new: MySQLColumn | None, name: str, out: Decision) -> None:
        old = out.columns[at]
        if new is None:
            raise BinlogError(f"{alter.where}: {self.member} makes column {old.name!r} a computed one; a merged copy "
                              "cannot follow it. A retry stops here again: load the group again")
        new = dataclasses.replace(new, name=name, nullable=old.nullable or new.nullable)
        a, b = map_column(old, alter.where).ch_type, map_column(new, alter.where).ch_type
        if not keeps_values(old, new, alter.where):
            out.because(f"column {old.name!r} {old.column_type} → {new.column_type} may change its values")
        if new.name.lower() == old.name.lower() and base_type(a) == base_type(b):
            out.columns[at] = new
            return
        change = {"column": old.name, "to": new.name, "type": base_type(b)}
        behind = [s.name for s in self.siblings if not _made(s, change) and s.waiting != change]
        if behind:
            raise Waiting(f"{alter.where}: {self.member} {_what(change, a)}; the merged copy follows it once every "
                          f"shard has made it, and {', '.join(behind)} {'has' if len(behind) == 1 else 'have'} not: "
                          "this shard's stream stops here (a retry stops here again) until they reach the same "
                          "change; then the last one changes the merged copy and the others follow on their next run",
                          change)
        if new.name != old.name:
            out.copy.append(f"RENAME COLUMN IF EXISTS {ch_ident(old.name)} TO {ch_ident(new.name)}")
        present = self.merged.get(new.name) or self.merged.get(old.name) or a
        if base_type(present) != base_type(b):
            if not widens(base_type(present), base_type(b)):
                raise BinlogError(f"{alter.where}: every shard of the merged copy changed column {old.name!r} to "
                                  f"{new.column_type}, whose values the copy's {present} does not hold unchanged "
                                  "the other way round; a retry stops here again: load the group again")
            out.copy.append(f"MODIFY COLUMN {ch_ident(new.name)} "
                            f"{nullable_type(b) if present.startswith('Nullable(') else b}")
        out.columns[at] = new


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


def probe(alter: Alter, action: Action, out: Decision) -> tuple[MySQLColumn | None, object]:
    """The column ``action`` defines and its default's value, as MySQL evaluates them; a
    definition the probe cannot take re-copies the table (the copy then reads the source's)."""
    database = alter.statement.tables[0].partition(".")[0]
    try:
        return probe_column(alter.conn, database, action.definition, alter.collation, alter.where)
    except ProbeFailed as exc:
        out.because(str(exc))
        return None, NOT_CONSTANT


def decide(alter: Alter, rule: OwnCopy) -> Decision:
    """What ``alter`` does to the copy, by ``rule`` (:class:`OwnCopy` or :class:`MergedCopy`).
    Raises :class:`Waiting` or a BinlogError where the rule stops the table."""
    out = Decision(list(alter.columns))
    for action in alter.statement.actions:
        if action.kind == KEY or action.column in alter.key and action.kind in (DROP, RENAME, CHANGE):
            if rule.key_changed(alter, action, out):
                continue
            return out
        if action.kind == KEEP:
            continue
        if action.kind == RECOPY:
            out.because(action.note)
        elif action.kind == ADD:
            rule.add(alter, action, out)
        elif action.kind in (DROP, RENAME, CHANGE) and (at := rule.index(out.columns, action.column)) is not None:
            if action.kind == DROP:
                rule.drop(alter, at, out)
                continue
            new = probe(alter, action, out)[0] if action.kind == CHANGE else out.columns[at]
            rule.change(alter, at, new, action.new_name, out)
    return out

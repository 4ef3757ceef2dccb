"""Foreign keys among a pipeline's tables: what InnoDB changes without a binlog event.

InnoDB applies ``ON UPDATE`` / ``ON DELETE`` ``CASCADE`` and ``SET NULL`` inside the storage
engine: the binlog of MariaDB and of MySQL 8.0/8.4 holds the parent's row event only, never the
children's (checked with ``mariadb-binlog -v``). MySQL 9.6 moved foreign keys into the SQL layer
and logs the cascaded rows itself (``innodb_native_foreign_keys=OFF``, its default there):
:func:`logs_cascades` tells the two apart, and such a server's cascades are not derived again.

A pipeline knows the foreign keys that act (:class:`ForeignKey`, read from
``information_schema`` by :func:`read_foreign_keys`) and keeps them current through the DDL it
reads (:meth:`ForeignKeys.after`: ``ADD`` / ``DROP FOREIGN KEY``, ``CREATE TABLE``, renamed
tables and columns, dropped tables), as of each binlog position — the set travels with the
checkpoint. :class:`CascadePlan` says, for the tables a stream copies, which parents' row events
cause changes in them and through which keys; core/cdc/cascades.py derives those changes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError

from airflow_sync_provider.core.cdc import ddl
from airflow_sync_provider.core.sql import mysql_table

log = logging.getLogger(__name__)

CASCADE, SET_NULL = "CASCADE", "SET NULL"
ACTING = (CASCADE, SET_NULL)  # RESTRICT, NO ACTION (and SET DEFAULT, which InnoDB rejects) change nothing
MAX_DEPTH = 15  # InnoDB stops cascades nested deeper than this (the statement fails)


@dataclass(frozen=True)
class ForeignKey:
    """``child``'s ``columns`` reference ``parent``'s ``referenced`` (tables as ``db.table``)."""

    name: str
    child: str
    columns: tuple[str, ...]
    parent: str
    referenced: tuple[str, ...]
    on_update: str = "RESTRICT"
    on_delete: str = "RESTRICT"

    def action(self, deleted: bool) -> str | None:
        """What a delete (``deleted``) or a change of the referenced columns of a parent row
        does to the rows that reference it: CASCADE, SET NULL, or None (nothing)."""
        rule = self.on_delete if deleted else self.on_update
        return rule if rule in ACTING else None

    @property
    def acts(self) -> bool:
        return self.on_update in ACTING or self.on_delete in ACTING

    def describe(self) -> str:
        return (f"{self.child}({', '.join(self.columns)}) → {self.parent}({', '.join(self.referenced)}) "
                f"ON UPDATE {self.on_update} ON DELETE {self.on_delete} [{self.name}]")

    def to_dict(self) -> dict:
        return {"name": self.name, "child": self.child, "columns": list(self.columns), "parent": self.parent,
                "referenced": list(self.referenced), "on_update": self.on_update, "on_delete": self.on_delete}

    @classmethod
    def from_dict(cls, data: dict) -> ForeignKey:
        return cls(data["name"], data["child"], tuple(data["columns"]), data["parent"], tuple(data["referenced"]),
                   data.get("on_update", "RESTRICT"), data.get("on_delete", "RESTRICT"))


def read_foreign_keys(conn, tables: set[str], known: set[str] = frozenset()) -> list[ForeignKey]:
    """The foreign keys of ``tables`` that act (a rule CASCADE or SET NULL) as the server defines
    them now, and those of the parents they reach, theirs, … (a chain through tables not copied);
    ``known``: tables whose keys the caller follows already (not read again). Only the schemas
    of the tables asked about are looked at: information_schema over a server's every schema
    opens every table there is (thousands, on a shared server)."""
    found, seen, asking = [], set(known), set(tables) - set(known)
    while asking:
        seen |= asking
        keys = _of_tables(conn, asking)
        found += keys
        asking = {k.parent for k in keys if k.acts} - seen
    return found


def _of_tables(conn, tables: set[str]) -> list[ForeignKey]:
    """``tables``' own keys. A least-privileged user (SELECT only) sees every key's columns in
    KEY_COLUMN_USAGE, but MariaDB shows it no rules in REFERENTIAL_CONSTRAINTS: those tables'
    keys are read from SHOW CREATE TABLE instead."""
    schemas = sorted({t.split(".", 1)[0] for t in tables})
    marks = ", ".join(["%s"] * len(schemas))
    found = [k for k in _with_rules(conn, schemas) if k.child in tables]
    seen = {(k.child, k.name.lower()) for k in found}
    with conn.cursor() as cur:
        cur.execute("SELECT DISTINCT TABLE_SCHEMA, TABLE_NAME, CONSTRAINT_NAME FROM information_schema.KEY_COLUMN_USAGE"
                    f" WHERE REFERENCED_TABLE_NAME IS NOT NULL AND TABLE_SCHEMA IN ({marks})", schemas)
        hidden = sorted({(schema, table) for schema, table, name in cur.fetchall()
                         if (f"{schema}.{table}", name.lower()) not in seen and f"{schema}.{table}" in tables})
        for schema, table in hidden:  # their rules are not shown: the definition says them
            cur.execute(f"SHOW CREATE TABLE {mysql_table(schema, table)}")
            text = cur.fetchone()[1]
            keys, _ = ForeignKeys().after(text, schema, ddl.Statement("create", (f"{schema}.{table}",)))
            found += [k for k in keys.keys if (k.child, k.name.lower()) not in seen]
    return found


def _with_rules(conn, schemas: list[str]) -> list[ForeignKey]:
    """The acting keys of ``schemas``' tables whose rules information_schema shows this user."""
    marks = ", ".join(["%s"] * len(schemas))
    with conn.cursor() as cur:
        cur.execute(
            "SELECT rc.CONSTRAINT_SCHEMA, rc.CONSTRAINT_NAME, rc.TABLE_NAME, rc.UPDATE_RULE, rc.DELETE_RULE,"
            " k.COLUMN_NAME, k.REFERENCED_TABLE_SCHEMA, k.REFERENCED_TABLE_NAME, k.REFERENCED_COLUMN_NAME"
            " FROM information_schema.REFERENTIAL_CONSTRAINTS rc"
            " JOIN information_schema.KEY_COLUMN_USAGE k ON k.CONSTRAINT_SCHEMA = rc.CONSTRAINT_SCHEMA"
            "  AND k.CONSTRAINT_NAME = rc.CONSTRAINT_NAME AND k.TABLE_NAME = rc.TABLE_NAME"
            "  AND k.REFERENCED_TABLE_NAME IS NOT NULL"
            f" WHERE rc.CONSTRAINT_SCHEMA IN ({marks}) AND k.TABLE_SCHEMA IN ({marks})"
            "  AND (rc.UPDATE_RULE IN ('CASCADE', 'SET NULL') OR rc.DELETE_RULE IN ('CASCADE', 'SET NULL'))"
            " ORDER BY rc.CONSTRAINT_SCHEMA, rc.TABLE_NAME, rc.CONSTRAINT_NAME, k.ORDINAL_POSITION", schemas + schemas)
        rows = cur.fetchall()
    found: dict[tuple, dict] = {}
    for schema, name, table, on_update, on_delete, column, ref_schema, ref_table, ref_column in rows:
        entry = found.setdefault((f"{schema}.{table}", name), {
            "name": name, "child": f"{schema}.{table}", "columns": [], "parent": f"{ref_schema}.{ref_table}",
            "referenced": [], "on_update": on_update, "on_delete": on_delete})
        entry["columns"].append(column)
        entry["referenced"].append(ref_column)
    return [ForeignKey.from_dict(e) for e in found.values()]


def logs_cascades(conn) -> bool:
    """Does this server write the rows a cascade changes to its binlog itself? MySQL ≥ 9.6 does
    unless ``innodb_native_foreign_keys`` is ON (InnoDB's own foreign keys, as before); MariaDB
    and MySQL ≤ 9.5 never do."""
    with conn.cursor() as cur:
        cur.execute("SELECT VERSION()")
        version = str(cur.fetchone()[0])
        if "mariadb" in version.lower():
            return False
        numbers = tuple(int(p) for p in version.split("-")[0].split(".")[:2] if p.isdigit())
        if numbers < (9, 6):
            return False
        try:
            cur.execute("SELECT @@GLOBAL.innodb_native_foreign_keys")
        except Exception:  # the variable is gone: foreign keys are the SQL layer's, logged
            return True
        value = cur.fetchone()[0]
    return str(value).upper() not in ("1", "ON")


@dataclass
class ForeignKeys:
    """The acting foreign keys as of a binlog position (kept with the pipeline's checkpoint)."""

    keys: list[ForeignKey] = field(default_factory=list)

    def to_list(self) -> list[dict]:
        return [k.to_dict() for k in self.keys]

    @classmethod
    def of(cls, data) -> ForeignKeys | None:
        if data is None:
            return None
        return cls([k if isinstance(k, ForeignKey) else ForeignKey.from_dict(k) for k in data])

    def merged(self, more: list[ForeignKey]) -> ForeignKeys:
        """With ``more`` (a table joining: its foreign keys as read now), replacing same-named ones."""
        names = {(k.child, k.name.lower()) for k in more}
        return ForeignKeys([k for k in self.keys if (k.child, k.name.lower()) not in names] + list(more))

    def known(self) -> set[str]:
        """The tables whose own keys are followed: each key's child, and the parents an acting key
        chains through (read_foreign_keys reads those)."""
        return {k.child for k in self.keys} | {k.parent for k in self.keys if k.acts}

    def touches(self, statement: ddl.Statement) -> bool:
        """Might ``statement`` change these keys (it names a table they involve)?"""
        involved = {k.child for k in self.keys} | {k.parent for k in self.keys}
        return bool(involved.intersection(statement.tables))

    def after(self, text: str, schema: str, statement: ddl.Statement | None) -> tuple[ForeignKeys, bool]:
        """The keys after the DDL ``text`` (run in ``schema``): (keys, understood). Not
        understood: the caller reads the server's current definitions instead."""
        if statement is None:
            return self, True
        keys = list(self.keys)
        renames = dict(statement.renames)
        if statement.kind == "rename" or renames:
            keys = [_renamed_table(k, renames) for k in keys]
        if statement.kind == "drop":
            dropped = set(statement.tables)
            return ForeignKeys([k for k in keys if k.child not in dropped]), True
        if statement.kind not in ("alter", "create"):
            return ForeignKeys(keys), True
        if not _mentions_keys(text) and statement.kind == "create":
            return ForeignKeys(keys), True
        try:
            tree = sqlglot.parse_one(text, read="mysql", error_level=sqlglot.ErrorLevel.RAISE)
        except ParseError:
            return ForeignKeys(keys), not _mentions_keys(text)
        table = statement.tables[0]
        if isinstance(tree, exp.Create):
            schema_node = tree.this if isinstance(tree.this, exp.Schema) else None
            added = _declared(schema_node.expressions if schema_node is not None else [], table, schema, keys)
            return ForeignKeys([k for k in keys if k.child != table] + added), True
        if not isinstance(tree, exp.Alter):
            return ForeignKeys(keys), not _mentions_keys(text)
        table = next(iter(renames.values()), table) if renames else table  # ALTER … RENAME TO: its new name
        for action in tree.args.get("actions") or []:
            if isinstance(action, exp.Drop) and (action.args.get("kind") or "").upper() == "FOREIGN KEY":
                gone = {t.name.lower() for t in action.args.get("tables") or []}
                keys = [k for k in keys if not (k.child == table and k.name.lower() in gone)]
            elif isinstance(action, exp.AddConstraint):
                keys += _declared(action.expressions, table, schema, keys)
            elif isinstance(action, exp.RenameColumn):
                keys = [_renamed_column(k, table, action.this.name, action.args["to"].name) for k in keys]
            elif isinstance(action, exp.ModifyColumn) and action.args.get("rename_from") is not None:
                keys = [_renamed_column(k, table, action.args["rename_from"].name, action.this.name) for k in keys]
            elif isinstance(action, exp.ColumnDef):  # ADD COLUMN … REFERENCES (MariaDB ≥ 10.5 makes it a key)
                keys += _declared([action], table, schema, keys)
        return ForeignKeys(keys), True

    def plan(self, copied: set[str], elsewhere: set[str] = frozenset()) -> CascadePlan:
        """What changes in ``copied`` tables (a stream's) without binlog events: the foreign keys
        whose child is copied, and those whose child is the parent of one of them (a chain).
        ``elsewhere``: tables the pipeline copies in another stream (a joining table's replay
        runs beside the pipeline's stream, whose copies are ahead of it)."""
        relevant: dict[tuple, ForeignKey] = {}
        wanted = set(copied)
        while True:
            more = {(k.child, k.name): k for k in self.keys if k.acts and k.child in wanted
                    and (k.child, k.name) not in relevant}
            if not more:
                break
            relevant.update(more)
            wanted |= {k.parent for k in more.values()}
        keys = tuple(sorted(relevant.values(), key=lambda k: (k.parent, k.name, k.child)))
        parents: dict[str, list[str]] = {}
        for key in keys:
            columns = parents.setdefault(key.parent, [])
            columns += [c for c in key.referenced if c not in columns]
        # a table whose rows a cascade changes and whose changes cascade further: its rows are
        # needed, so it must be copied too
        between = {k.child for k in keys} & set(parents)
        gaps = {t: sorted(k.describe() for k in keys if k.child == t) for t in between - set(copied)}
        ahead = frozenset(t for t in gaps if t in elsewhere)
        return CascadePlan(keys, {p: tuple(c) for p, c in parents.items()},
                           {t: g for t, g in gaps.items() if t not in ahead}, ahead)


@dataclass(frozen=True)
class CascadePlan:
    """For a stream's copied tables: ``keys``, the acting foreign keys that reach them (directly
    or through a chain); ``parents``, every parent table of those with the referenced columns
    its row events are read for (the union over its keys, in order); ``gaps``, tables in a chain
    that are not copied (their rows are needed to follow the chain further); ``ahead``, see there."""

    keys: tuple[ForeignKey, ...] = ()
    parents: dict = field(default_factory=dict)
    gaps: dict = field(default_factory=dict)
    # tables in a chain that another stream of the pipeline copies, ahead of this one: a cascade
    # through them cannot be followed here; the tables it would reach are verified instead
    ahead: frozenset = frozenset()

    def __bool__(self) -> bool:
        return bool(self.keys)

    def acting(self, parent: str, deleted: bool) -> list[tuple[ForeignKey, str]]:
        """The keys of ``parent`` that act on a delete (``deleted``) or a referenced-column change."""
        return [(k, a) for k in self.keys if k.parent == parent and (a := k.action(deleted)) is not None]

    def into(self, table: str) -> list[ForeignKey]:
        return [k for k in self.keys if k.child == table]

    def below(self, table: str) -> set[str]:
        """The tables a cascade from ``table`` can reach (its children, theirs, …)."""
        found, todo = set(), [table]
        while todo:
            parent = todo.pop()
            for key in self.keys:
                if key.parent == parent and key.child not in found:
                    found.add(key.child)
                    todo.append(key.child)
        found.discard(table)
        return found

    def to_dict(self) -> dict:
        return {"keys": [k.to_dict() for k in self.keys], "parents": {p: list(c) for p, c in self.parents.items()},
                "gaps": self.gaps}


def _mentions_keys(text: str) -> bool:
    upper = text.upper()
    return "FOREIGN" in upper or "REFERENCES" in upper


def _renamed_table(key: ForeignKey, renames: dict) -> ForeignKey:
    return ForeignKey(key.name, renames.get(key.child, key.child), key.columns, renames.get(key.parent, key.parent),
                      key.referenced, key.on_update, key.on_delete)


def _renamed_column(key: ForeignKey, table: str, old: str, new: str) -> ForeignKey:
    """InnoDB renames a column in the foreign keys that name it, on both sides."""
    columns = tuple(new if key.child == table and c.lower() == old.lower() else c for c in key.columns)
    referenced = tuple(new if key.parent == table and c.lower() == old.lower() else c for c in key.referenced)
    return ForeignKey(key.name, key.child, columns, key.parent, referenced, key.on_update, key.on_delete)


def _rules(reference: exp.Reference) -> tuple[str, str]:
    on_update = on_delete = "RESTRICT"
    for option in reference.args.get("options") or []:
        text = " ".join(str(option).upper().split())
        if text.startswith("ON UPDATE "):
            on_update = text[len("ON UPDATE "):]
        elif text.startswith("ON DELETE "):
            on_delete = text[len("ON DELETE "):]
    return on_update, on_delete


def _declared(nodes, table: str, schema: str, existing: list[ForeignKey]) -> list[ForeignKey]:
    """The foreign keys ``nodes`` (a CREATE TABLE's items, an ADD CONSTRAINT's) declare on
    ``table``. Unnamed ones get InnoDB's generated name, ``<table>_ibfk_<n>``."""
    found = []
    taken = [k.name for k in existing if k.child == table]

    def add(name: str | None, columns: list[str], reference: exp.Reference) -> None:
        target = reference.this
        parent_table = target.this if isinstance(target, exp.Schema) else target
        referenced = [e.name for e in target.expressions] if isinstance(target, exp.Schema) else []
        parent = f"{parent_table.db or schema}.{parent_table.name}"
        if not name:
            prefix = f"{table.split('.', 1)[1]}_ibfk_"
            numbers = [int(n[len(prefix):]) for n in taken + [k.name for k in found]
                       if n.startswith(prefix) and n[len(prefix):].isdigit()]
            name = f"{prefix}{max(numbers, default=0) + 1}"
        on_update, on_delete = _rules(reference)
        key = ForeignKey(name, table, tuple(columns), parent, tuple(referenced), on_update, on_delete)
        if key.acts:
            found.append(key)
        else:
            taken.append(name)

    for node in nodes:
        constraint_name = None
        inner = [node]
        if isinstance(node, exp.Constraint):
            constraint_name, inner = node.name, node.expressions
        for item in inner:
            if isinstance(item, exp.ForeignKey):
                add(constraint_name, [e.name for e in item.expressions], item.args["reference"])
            elif isinstance(item, exp.ColumnDef):
                for constraint in item.constraints:
                    if isinstance(constraint.kind, exp.Reference):
                        add(None, [item.name], constraint.kind)
    return found

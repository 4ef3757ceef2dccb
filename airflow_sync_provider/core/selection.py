"""Tables chosen by pattern, as mysql-ch-replicator, Debezium and Flink CDC users write them:
``databases`` / ``tables`` / ``exclude_tables``, resolved against the source when a job runs.

A pattern is a shell-style wildcard (``orders_*``, ``log_20??``; case-sensitive, as MySQL table
names are on Linux) or, prefixed with ``re:``, a Python regular expression that must match the
whole name. A table pattern with a dot (``shop.orders_*``) is matched against ``database.table``,
one without against the table's name alone. A table is selected when its database matches one of
``databases``, its name one of ``tables`` and none of ``exclude_tables``.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field

from airflow_sync_provider.core.clickhouse.layout import Layout, LayoutError
from airflow_sync_provider.core.content.shaping import OPTIONS as CONTENT_OPTIONS
from airflow_sync_provider.core.content.shaping import Content


def _matches(pattern: str, database: str, table: str) -> bool:
    if pattern.startswith("re:"):
        expression = re.compile(pattern[3:])
        return bool(expression.fullmatch(table) or expression.fullmatch(f"{database}.{table}"))
    return fnmatch.fnmatchcase(f"{database}.{table}" if "." in pattern else table, pattern)


def _database_matches(pattern: str, database: str) -> bool:
    if pattern.startswith("re:"):
        return bool(re.fullmatch(pattern[3:], database))
    return fnmatch.fnmatchcase(database, pattern)


@dataclass(frozen=True)
class TableSelection:
    databases: tuple[str, ...]
    tables: tuple[str, ...] = ("*",)
    exclude_tables: tuple[str, ...] = ()
    # where the copies go: a database name, ``{database}`` standing for the source's
    target_database: str = "{database}"
    layout: dict | None = None  # the selected tables' layout (core/clickhouse/layout.py)
    content: dict | None = None  # what their copies hold (core/content/shaping.py)

    def __post_init__(self):
        if not self.databases:
            raise ValueError("a table selection needs databases=[…] (names or patterns)")
        for pattern in (*self.databases, *self.tables, *self.exclude_tables):
            if not isinstance(pattern, str) or not pattern:
                raise ValueError(f"table selection: {pattern!r} is not a pattern")
            if pattern.startswith("re:"):
                try:
                    re.compile(pattern[3:])
                except re.error as exc:
                    raise ValueError(f"table selection: {pattern!r} is not a regular expression ({exc})") from None

    @classmethod
    def of(cls, value: "dict | TableSelection | None") -> "TableSelection | None":
        if value is None or isinstance(value, TableSelection):
            return value
        unknown = set(value) - {"databases", "tables", "exclude_tables", "target_database", "layout", "content",
                                *CONTENT_OPTIONS}
        if unknown:
            raise ValueError(f"table selection: unknown key(s) {sorted(unknown)}; use databases, tables, "
                             "exclude_tables, target_database, layout, transform, row_filter, on_delete, history")
        as_tuple = lambda v: (v,) if isinstance(v, str) else tuple(v or ())  # noqa: E731
        return cls(as_tuple(value["databases"]), as_tuple(value.get("tables", ("*",))) or ("*",),
                   as_tuple(value.get("exclude_tables")), value.get("target_database") or "{database}",
                   _layout(value.get("layout")), _content(value))

    def to_dict(self) -> dict:
        return {"databases": list(self.databases), "tables": list(self.tables),
                "exclude_tables": list(self.exclude_tables), "target_database": self.target_database,
                **({"layout": self.layout} if self.layout else {}),
                **({"content": self.content} if self.content else {})}

    def matches(self, name: str) -> bool:
        """Is ``database.table`` selected?"""
        database, _, table = name.partition(".")
        return (any(_database_matches(p, database) for p in self.databases)
                and any(_matches(p, database, table) for p in self.tables)
                and not any(_matches(p, database, table) for p in self.exclude_tables))

    def resolve(self, conn) -> list[str]:
        """The selected base tables of the source now, as ``database.table``, sorted (pymysql)."""
        with conn.cursor() as cur:
            cur.execute("SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES WHERE TABLE_TYPE = 'BASE TABLE'"
                        " AND TABLE_SCHEMA NOT IN ('mysql', 'information_schema', 'performance_schema', 'sys')")
            names = [f"{database}.{table}" for database, table in cur.fetchall()]
        return sorted(n for n in names if self.matches(n))

    def config(self, name: str) -> dict:
        """The table's entry (:func:`table_config`'s keys) with its target database."""
        database, _, table = name.partition(".")
        return {"source_database": database, "source_table": table,
                "target_database": self.target_database.replace("{database}", database),
                **({"layout": self.layout} if self.layout else {}),
                **({"content": self.content} if self.content else {})}


SELECTION_FIELDS = ("table", "select", "tables", "columns", "exclude_columns", "source_database", "target_database",
                    "target_table")


@dataclass(frozen=True)
class Selection:
    """The tables a job operator works on, as one object (``selection=Selection(…)``); each field
    is also the operator's plain argument of the same name, which it stands for.

    One table (the full load):

    * ``table``: the source table's name;
    * ``source_database``: default the MySQL connection's schema;
    * ``target_database``: default the ClickHouse connection's schema (unless ``default``), then the
      source database;
    * ``target_table``: default ``table``;
    * ``columns``: copy only these columns (default all; key columns always stay);
      ``exclude_columns``: leave these out (e.g. a type without a ClickHouse mapping).

    Many tables (every job operator), instead of ``table``:

    * ``select``: tables by pattern, resolved when the task runs: ``{"databases": [...],
      "tables": [...], "exclude_tables": [...], "target_database": "{database}"}`` (shell
      wildcards or ``re:`` regular expressions, :class:`TableSelection`; docs/whole-databases.md),
      with the selection's own ``layout`` / ``transform`` / ``row_filter`` / ``on_delete`` / ``history`` over the
      job's;
    * ``tables``: tables by name, alone or beside ``select``: ``"db.table"`` or entries with
      :func:`table_config`'s keys (``source_database``, ``source_table``, ``target_database``,
      ``target_table``, ``columns``, ``exclude_columns``, ``split_column``, and their own
      ``layout`` / ``transform`` / ``row_filter`` / ``on_delete`` / ``history``).

    The values are kept as given (a pattern or a name may be a Jinja template the operator renders);
    they are checked where the plain arguments are, when the job's spec is built."""

    table: str | None = None
    select: "dict | TableSelection | None" = None
    tables: "tuple | list" = ()
    columns: "tuple[str, ...] | list | None" = None
    exclude_columns: "tuple[str, ...] | list" = ()
    source_database: str | None = None
    target_database: str | None = None
    target_table: str | None = None

    def __post_init__(self):
        if self.table and (self.select or self.tables):
            raise ValueError("selection: give table= (one table) or select= / tables= (many), not both")
        for name in ("tables", "columns", "exclude_columns"):
            if isinstance(getattr(self, name), str) and "{{" not in getattr(self, name):
                raise ValueError(f"selection {name}: give a list, not the name {getattr(self, name)!r}")

    def arguments(self) -> dict:
        """The plain operator arguments it stands for (None: not given)."""
        def plain(value):  # a list (an empty one: not given); a template or an XComArg as it is
            return (list(value) or None) if isinstance(value, (list, tuple)) else value

        select = self.select.to_dict() if isinstance(self.select, TableSelection) else self.select
        return {"table": self.table, "select": select, "tables": plain(self.tables), "columns": plain(self.columns),
                "exclude_columns": plain(self.exclude_columns), "source_database": self.source_database,
                "target_database": self.target_database, "target_table": self.target_table}


@dataclass
class TableSet:
    """The tables a job works on: named (``tables``: ``"db.table"`` or entries with their target
    and column choices, :func:`table_config`) and by pattern (``select``: :class:`TableSelection`'s
    form), ``parallel`` of them at once (a job of many tables); ``layout``: how their copies are
    laid out (core/clickhouse/layout.py) and ``content``: what they hold (core/content/shaping.py),
    unless a table's entry or the selection says otherwise."""

    select: dict | None = None
    tables: list = field(default_factory=list)
    parallel: int = 2
    # given as their dict forms too (a spec read back, the command line): parsed here, once; a
    # spec's JSON holds the dict forms again (core/specfile.spec_to_dict)
    layout: Layout = field(default_factory=Layout)
    content: Content = field(default_factory=Content)

    def __post_init__(self):
        TableSelection.of(self.select)  # a bad pattern fails here, before any work
        self.layout = Layout.of(self.layout)  # an unknown option fails here too
        self.content = Content.of(self.content)
        for table in self.tables:
            if isinstance(table, dict):
                _layout(table.get("layout"))
                _content(table)
        if self.parallel < 1:
            raise ValueError(f"parallel_tables must be >= 1, got {self.parallel}")

    def layout_of(self, table: dict | None = None) -> Layout:
        """A table's layout: its entry's options over the job's (``table``: a table_config)."""
        return Layout.of({**self.layout.to_dict(), **((table or {}).get("layout") or {})})

    def content_of(self, table: dict | None = None) -> Content:
        """What a table's copy holds: its entry's settings over the job's (``table``: a table_config)."""
        return self.content.merged((table or {}).get("content"))

    @property
    def has_content(self) -> bool:
        """Does the job, its selection or a named table ask for content settings?"""
        return bool(self.content or _content(self.select or {})
                    or any(isinstance(t, dict) and _content(t) for t in self.tables))

    def merged_layout(self, into: str = "") -> Layout:
        """A merged copy's one layout (``into``: its name, for the refusal): the job's, with the
        selection's own over it, or a named table's; the copy is one table, so the tables that make
        it must agree. Its key (the one appended to the sorting key) is the merged key: the primary
        key and the source columns (core/source/group.py)."""
        asked = ([self.layout_of({"layout": self.select.get("layout")})] if self.select else []) + \
            [self.layout_of(t) for t in self.tables if isinstance(t, dict)]
        found = list(dict.fromkeys(asked)) or [self.layout_of()]
        if len(found) > 1:
            raise LayoutError(f"the merged copy {into or '(merge_into)'} is one table with one layout, but its tables "
                              f"ask for {' and '.join(layout.describe() for layout in found)}; give the layout once, "
                              "as the job's layout=")
        return found[0]

    def merged_member(self) -> "TableSet":
        """What a merged copy's member spec carries: the merged copy's layout and the job's content."""
        return TableSet(layout=self.merged_layout(), content=self.content)

    def one(self, table: dict) -> "TableSet":
        """What a one-table spec of ``table`` (a table_config) carries: its layout and content."""
        return TableSet(layout=self.layout_of(table), content=self.content_of(table))

    @classmethod
    def of(cls, value: "TableSet | dict | None") -> "TableSet":
        if isinstance(value, TableSet):
            return value
        return cls(**value) if value else cls()

    def __bool__(self) -> bool:
        """Does it name or select any table?"""
        return bool(self.select or self.tables)

    def configured(self, target_database: str = "") -> "TableSet":
        """The named tables as :func:`table_config` entries; with ``target_database`` (a template
        of ``{database}``, ``{source}``), the tables and patterns that name no target database go
        there. Configuring again changes nothing."""
        select, tables = self.select, list(self.tables)
        if target_database:
            if select and not select.get("target_database"):
                select = {**select, "target_database": target_database}
            tables = [_with_target(t, target_database) for t in tables]
        return TableSet(select, [table_config(t) for t in tables], self.parallel, self.layout, self.content)

    def for_source(self, name: str) -> "TableSet":
        """A group's tables for its source ``name`` (copied side by side): ``{source}`` in their
        target databases replaced by the name."""
        select = self.select and {**self.select, "target_database": (self.select.get("target_database")
                                                                      or "{database}").replace("{source}", name)}
        tables = [t | {"target_database": t["target_database"].replace("{source}", name)} for t in self.tables]
        return TableSet(select, tables, self.parallel, self.layout, self.content)


def _with_target(table, template: str) -> dict:
    entry = dict(table) if isinstance(table, dict) else table_config(table) | {"target_database": None}
    entry["target_database"] = entry.get("target_database") or template.replace("{database}", entry["source_database"])
    return entry


def table_config(table) -> dict:
    """``"db.table"`` or a dict → {source_database, source_table, target_database, target_table,
    columns, exclude_columns, split_column, layout, content} (targets default to the source's names;
    an entry's ``transform`` / ``row_filter`` / ``on_delete`` / ``history`` are its ``content``)."""
    if isinstance(table, str):
        database, _, name = table.partition(".")
        if not name:
            raise ValueError(f"table {table!r}: give it as database.table")
        table = {"source_database": database, "source_table": name}
    out = {"source_database": table["source_database"], "source_table": table["source_table"],
           "target_database": table.get("target_database") or table["source_database"],
           "target_table": table.get("target_table") or table["source_table"],
           "columns": table.get("columns"), "exclude_columns": list(table.get("exclude_columns") or []),
           # a full load split on a collated string keeps each row's collation weight: so must CDC
           "split_column": table.get("split_column")}
    if table.get("layout"):  # the table's own layout (core/clickhouse/layout.py), over the job's
        out["layout"] = _layout(table["layout"])
    if _content(table):  # what the table's copy holds (core/content/shaping.py), over the job's
        out["content"] = _content(table)
    if table.get("member"):  # a merged copy's member (core/source/group.member_config) and its view
        out |= {"member": table["member"], "view": table.get("view")}
    return out


def _layout(value) -> dict | None:
    """A layout's dict form, checked (an unknown option is refused by name)."""
    if isinstance(value, Layout):
        return value.to_dict() or None
    return Layout.of(value).to_dict() or None if value else None


def _content(entry: dict) -> dict | None:
    """An entry's content settings (``content`` or its ``transform`` / ``row_filter`` /
    ``on_delete`` / ``history``) in their dict form, checked (an unknown option is refused by name)."""
    value = entry.get("content")
    if isinstance(value, Content):
        value = value.to_dict()
    given = {**(value or {}), **{k: entry[k] for k in CONTENT_OPTIONS if entry.get(k)}}
    return Content.of(given).to_dict() or None if given else None


def largest_first(conn, configs: list[dict]) -> list[dict]:
    """``configs`` by size on disk (InnoDB's DATA_LENGTH), largest first: a job of many tables
    that starts its big tables first does not end with one of them running alone."""
    if not configs:
        return []
    with conn.cursor() as cur:
        cur.execute("SELECT TABLE_SCHEMA, TABLE_NAME, COALESCE(DATA_LENGTH, 0) FROM information_schema.TABLES"
                    " WHERE TABLE_SCHEMA IN (" + ", ".join(["%s"] * len({c["source_database"] for c in configs}))
                    + ")", sorted({c["source_database"] for c in configs}))
        size = {(d, t): int(n) for d, t, n in cur.fetchall()}
    return sorted(configs, key=lambda c: -size.get((c["source_database"], c["source_table"]), 0))


def selected_tables(conn, select: "dict | TableSelection | None", tables: list) -> list[dict]:
    """The table configs (:func:`table_config`) a job works on: the named ``tables`` first,
    then those the selection resolves to now (a named table is not taken twice)."""
    configs = [table_config(t) for t in tables]
    named = {f"{c['source_database']}.{c['source_table']}" for c in configs}
    selection = TableSelection.of(select)
    if selection is not None:
        configs += [table_config(selection.config(n)) for n in selection.resolve(conn) if n not in named]
    return configs

"""Source groups: several MySQL sources (servers), one table selection, one merged copy.

A sharded estate keeps one logical table as many tables on many servers (``shop_0.orders_00`` …
``shop_7.orders_63``). A *source group* names the servers (:class:`Source`: a name and an
endpoint each) and applies one selection to every one of them; each selected table is a
*member* (:class:`Member`: source, database, table). With ``merge_into`` every member's rows go
into one ClickHouse table, the **merged copy**, which carries where each row came from in three
source columns (:data:`SOURCE_COLUMNS`) placed after the primary key in the copy's key:

* ids that overlap from shard to shard never collide, and a row moved from one shard to another
  is a delete in one member and an insert in the other;
* ReplacingMergeTree compares versions only among rows of one key, so only among rows of one
  member, which come from one server's binlog: versions of two servers are never compared
  (each server's positions and epochs rank its own changes only, core/positions.py);
* the key still starts with the primary key, so queries by id use the index.

Columns are the union over the members (:func:`merged_schema`), checked before anything is
copied: one name must map to one ClickHouse type in every member, and every member must have the
same primary key, or the group is refused naming both members and the column. A column a member
lacks is NULL in its rows (so the merged column is Nullable).

A member is read through its **view** (:func:`member_view`): its table's schema in the merged
copy's column order, where a column it lacks is *absent* (read as NULL) and the source columns
are *tags* (read as the member's own constants) — ``MySQLColumn.absent`` / ``.tag``, which the
type rules' ``source_sql`` turn into SQL (core/typemap.py). Every path that copies or compares a
table (readers, checksums, the diff, CDC) then handles a member as it handles any table, and the
target DDL made from a view is the merged copy's.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from airflow_sync_provider.core.endpoints import MySQLEndpoint
from airflow_sync_provider.core.source.schema import TableSchema
from airflow_sync_provider.core.sql import ch_ident
from airflow_sync_provider.core.typemap import MySQLColumn, UnsupportedType, map_column

SOURCE_COLUMNS = ("_source", "_source_database", "_source_table")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class IncompatibleShards(ValueError):
    """Members of a group whose tables cannot be merged into one copy (names both)."""

    retry_helps = False


UNNAMED = ""  # the one source of a job that names none: no group (its keys and names as they always were)


@dataclass(frozen=True)
class Source:
    """One server the job reads: its name (in the merged copy's ``_source`` column, in ledger keys
    and in ``$MYSQL_URL_<NAME>``; :data:`UNNAMED` for the one source of a job that is no group)
    and where to connect. Every spec carries its sources as a list: one server is a group of one
    (:func:`one_server`)."""

    name: str
    endpoint: MySQLEndpoint

    def __post_init__(self):
        if self.name != UNNAMED and (not isinstance(self.name, str) or not _NAME.match(self.name)):
            raise ValueError(f"source name {self.name!r}: 1-64 letters, digits, '_', '-' or '.', starting with a "
                             "letter or digit (it is written into the merged copy and into ledger keys)")

    @classmethod
    def of(cls, value: "dict | Source | MySQLEndpoint") -> "Source":
        if isinstance(value, Source):
            return value
        if isinstance(value, MySQLEndpoint):
            return cls(UNNAMED, value)
        endpoint = value["endpoint"]
        return cls(value["name"], endpoint if isinstance(endpoint, MySQLEndpoint) else MySQLEndpoint(**endpoint))


def one_server(endpoint: MySQLEndpoint | None) -> list[Source]:
    """The sources of a job that reads one server (none: a job without a MySQL side)."""
    return [] if endpoint is None else [Source(UNNAMED, endpoint)]


def only_endpoint(sources: list[Source]) -> MySQLEndpoint | None:
    """The endpoint of a job's one server (None: it reads none); a group's own spec has several,
    and only its parts (one source each) ask for it."""
    if len(sources) > 1:
        raise ValueError(f"a source group of {len(sources)} sources has no one endpoint: each of its parts has one")
    return sources[0].endpoint if sources else None


def is_group(sources: list[Source], merge: "Merge | None") -> bool:
    """Is the job a source group's (several named sources, or one named source, or a merged copy),
    or a plain job of one server?"""
    return merge is not None or len(sources) > 1 or any(s.name != UNNAMED for s in sources)


def env_name(source: str) -> str:
    """``$MYSQL_URL_<NAME>``: the source's name upper-cased, other characters as ``_``."""
    return "MYSQL_URL_" + re.sub(r"[^A-Z0-9]", "_", source.upper())


def check_sources(sources: list[Source]) -> None:
    seen = set()
    for source in sources:
        if source.name in seen:
            raise ValueError(f"source {source.name!r} is named twice in the group")
        if source.name == UNNAMED and len(sources) > 1:
            raise ValueError("every source of a group needs a name (sources=[Source('s0', …), …])")
        seen.add(source.name)


PLACEMENTS, ON_SHARD_REMOVED = ("driver", "executors"), ("keep", "delete")


@dataclass(frozen=True)
class Merge:
    """A source group's tables merged into one copy, ``into`` ("db.table"); for CDC also where the
    group's runs go (``placement``: in the job's driver, or as long-running tasks on the cluster's
    executors) and what happens to the rows of a shard that leaves the group (``on_shard_removed``:
    ``keep`` or ``delete``)."""

    into: str
    placement: str = "driver"
    on_shard_removed: str = "keep"

    def __post_init__(self):
        if "." not in self.into:
            raise ValueError(f"merge_into {self.into!r}: give it as database.table")
        if self.placement not in PLACEMENTS or self.on_shard_removed not in ON_SHARD_REMOVED:
            raise ValueError(f"merge into {self.into}: placement must be one of {PLACEMENTS}, on_shard_removed one "
                             f"of {ON_SHARD_REMOVED}")

    @classmethod
    def of(cls, value: "Merge | dict | str | None", **options) -> "Merge | None":
        """A Merge from its spec form (a dict), its target alone ("db.table"), or nothing ("" / None)."""
        if isinstance(value, Merge) or not value:
            return value or None
        return cls(**value) if isinstance(value, dict) else cls(value, **options)

    @property
    def database(self) -> str:
        return self.into.partition(".")[0]

    @property
    def table(self) -> str:
        return self.into.partition(".")[2]


@dataclass(frozen=True)
class Member:
    """One source table of a group."""

    source: str
    database: str
    table: str

    @property
    def name(self) -> str:
        return f"{self.source}:{self.database}.{self.table}"

    @property
    def tags(self) -> tuple[str, str, str]:
        return self.source, self.database, self.table

    @classmethod
    def of(cls, value: dict) -> "Member":
        """From a member spec's ``member`` entry (which may carry more, e.g. its ``shard_base``)."""
        return cls(value["source"], value["database"], value["table"])

    @classmethod
    def parse(cls, name: str) -> "Member":
        source, _, qualified = name.partition(":")
        database, _, table = qualified.partition(".")
        return cls(source, database, table)


def part_pipeline(pipeline: str, source: str) -> str:
    """A source group's CDC pipeline is a pipeline per source: ``<pipeline>@<source>``."""
    return f"{pipeline}@{source}"


@dataclass(frozen=True)
class GroupPart:
    """One source's pipeline of a source group's CDC (``CdcApplySpec.group``, set by the group's
    run on each part): the group's pipeline, this part's source, every source of the group, the
    merged copy (``""``: the sources' tables side by side) and what happens to the rows of a shard
    that leaves it. In a spec's JSON: the dict of these fields, in this order."""

    pipeline: str
    source: str
    sources: tuple[str, ...]
    merge_into: str = ""
    on_shard_removed: str = "keep"

    @classmethod
    def of(cls, value: "GroupPart | dict | None") -> "GroupPart | None":
        """From a spec's dict (nothing: not a group's part)."""
        if isinstance(value, GroupPart) or not value:
            return value or None
        return cls(value["pipeline"], value["source"], tuple(value["sources"]), value.get("merge_into", ""),
                   value.get("on_shard_removed", "keep"))

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "sources": list(self.sources)}

    @property
    def merged(self) -> bool:
        return bool(self.merge_into)


def member_config(merge_into: str, member: Member, config: dict) -> dict:
    """A member's table entry (core/selection.table_config's keys): its target is the merged
    copy, and it knows which member it is."""
    database, _, table = merge_into.partition(".")
    return {**config, "target_database": database, "target_table": table, "member": dataclasses.asdict(member)}


def tags_view(member: Member) -> TableSchema:
    """The view of a member that has none yet (it joins a running group): its source columns only;
    :func:`refresh_view` adds its table's own."""
    return TableSchema(member.database, member.table, tuple(_tag_column(n, v) for n, v in zip(SOURCE_COLUMNS,
                                                                                                member.tags)), ())


def refresh_view(view: TableSchema, own: TableSchema) -> TableSchema:
    """A member's view kept up with its table's definition now (``own``): its columns in the view's
    order, those the table no longer has absent, new ones before the source columns, the tags
    kept. A view only grows: a column leaves the merged copy when its last shard drops it
    (core/cdc/alter.py), not here."""
    present = {c.name: c for c in own.columns}
    columns, seen = [], set()
    for column in view.columns:
        if column.tag is not None:
            continue
        seen.add(column.name)
        now = present.get(column.name)
        columns.append(dataclasses.replace(now, nullable=now.nullable or column.nullable) if now is not None
                       else dataclasses.replace(column, absent=True, nullable=True))
    columns += [c for c in own.columns if c.name not in seen]
    columns += [c for c in view.columns if c.tag is not None]
    return dataclasses.replace(own, columns=tuple(columns))


def _tag_column(name: str, value: str) -> MySQLColumn:
    return MySQLColumn(name, "varchar", "varchar(255)", False, charset="utf8mb4", collation="utf8mb4_bin", tag=value)


def _base_type(column: MySQLColumn, where: str) -> str:
    try:
        return map_column(dataclasses.replace(column, nullable=False), where).ch_type
    except UnsupportedType as exc:
        raise IncompatibleShards(str(exc)) from None


def merged_schema(members: list[tuple[Member, TableSchema]], merge_into: str) -> TableSchema:
    """The merged copy's shape: the union of the members' columns (in order of first appearance),
    Nullable where a member lacks one, the members' common primary key, then the source columns.
    Refuses, naming both members, a column one name maps to two ClickHouse types or two type
    families, and members with different primary keys."""
    if not members:
        raise ValueError(f"merge into {merge_into}: no source table is selected on any source")
    database, _, table = merge_into.partition(".")
    first, first_schema = members[0]
    union: dict[str, tuple[MySQLColumn, Member, str]] = {}
    for member, schema in members:
        for column in schema.columns:
            if column.name in SOURCE_COLUMNS:
                raise IncompatibleShards(f"{member.name}: column {column.name!r} has the name of a merged copy's "
                                         f"source column {list(SOURCE_COLUMNS)}; leave it out (exclude_columns) or "
                                         "rename it")
            base = _base_type(column, member.name)
            seen = union.get(column.name)
            if seen is None:
                union[column.name] = (column, member, base)
                continue
            other, other_member, other_base = seen
            if other_base != base or type(map_column(other).rule) is not type(map_column(column).rule):
                raise IncompatibleShards(
                    f"column {column.name!r} is {other.column_type} in {other_member.name} but {column.column_type} in "
                    f"{member.name}: one merged column cannot hold both ({other_base} vs {base}). Make the shards "
                    "agree, or leave the column out (exclude_columns)")
            if column.nullable and not other.nullable:
                union[column.name] = (dataclasses.replace(other, nullable=True), other_member, base)
        if schema.primary_key != first_schema.primary_key:
            raise IncompatibleShards(
                f"{member.name} has PRIMARY KEY ({', '.join(schema.primary_key)}) but {first.name} has "
                f"({', '.join(first_schema.primary_key)}): a merged copy is keyed by one primary key (then the "
                "source columns). Make the shards' keys agree")
    columns = []
    for name, (column, _, _) in union.items():
        everywhere = all(any(c.name == name for c in schema.columns) for _, schema in members)
        columns.append(column if everywhere else dataclasses.replace(column, nullable=True))
    columns += [_tag_column(name, "") for name in SOURCE_COLUMNS]
    return TableSchema(database, table, tuple(columns), first_schema.primary_key)


def member_view(merged: TableSchema, member: Member, schema: TableSchema) -> TableSchema:
    """``member``'s table (``schema``: as copied) in the merged copy's columns: its own columns
    (with the merged nullability), the ones it lacks absent, the source columns its tags."""
    own = {c.name: c for c in schema.columns}
    tags = dict(zip(SOURCE_COLUMNS, member.tags))
    columns = []
    for column in merged.columns:
        if column.name in tags:
            columns.append(_tag_column(column.name, tags[column.name]))
        elif column.name in own:
            columns.append(dataclasses.replace(own[column.name], nullable=column.nullable))
        else:
            columns.append(dataclasses.replace(column, absent=True, nullable=True))
    unknown = [name for name in own if name not in {c.name for c in merged.columns}]
    if unknown:
        raise IncompatibleShards(f"{member.name}: columns {unknown} are not in the merged copy {merged.qualified}")
    return dataclasses.replace(schema, columns=tuple(columns))


def member_filter(schema: TableSchema) -> tuple[str, dict]:
    """The ClickHouse predicate (with its parameters) that picks a member's rows from the merged
    copy, for a member's view (``("1", {})`` for a table that is not a member)."""
    tags = [c for c in schema.columns if c.tag is not None]
    if not tags:
        return "1", {}
    where = " AND ".join(f"{ch_ident(c.name)} = {{member_tag{i}:String}}" for i, c in enumerate(tags))
    return where, {f"member_tag{i}": c.tag for i, c in enumerate(tags)}

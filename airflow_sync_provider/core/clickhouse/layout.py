"""How a copy is laid out in ClickHouse: its sorting key, partitions, primary key, TTL, table
settings, engine, and the columns ClickHouse derives for queries (JSON, typed geo: the options
here, the columns in core/clickhouse/derived.py) (docs/layouts.md).

A copy is a ReplacingMergeTree versioned in binlog order (core/positions.py) with ``_deleted``
tombstones. ReplacingMergeTree collapses only rows with the same sorting key in the same
partition, so the source's primary-key columns are appended to ``order_by`` where missing (two
rows of one source key then collapse only when they also agree on every other column the key
and the partition expression read), and every writer that moves a row out of its old place —
a change to a column :meth:`Layout.place_columns` names — tombstones it there under its old
values (core/cdc/binlog: from the update's before-image; a diff apply: from the copy's row; a
repair: by key). The partition expression joins the sorting key (:meth:`Layout.sorting_key`),
so ``FINAL`` and merges collapse the same rows.

The layout a copy was created with is kept in its table comment (:func:`layout_comment`); a job
that asks for another is refused (:func:`check_same`) rather than mixing two layouts.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace

from airflow_sync_provider.core.clickhouse.ttl import expiries
from airflow_sync_provider.core.sql import ch_ident, ch_string

DEFAULT_ENGINE = "ReplacingMergeTree"
REPLICATED = "ReplicatedReplacingMergeTree"
ENGINES = (DEFAULT_ENGINE, REPLICATED)
# ClickHouse's own default for a replicated table's path and replica (its macros)
REPLICATION_DEFAULT = ("/clickhouse/tables/{shard}/{database}/{table}", "{replica}")
JSON_AS = ("string", "json")
OPTIONS = ("order_by", "partition_by", "primary_key", "ttl", "settings", "engine", "cluster", "json", "geo")

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ENGINE = re.compile(r"\s*([A-Za-z]+)\s*(?:\((.*)\))?\s*", re.S)
_QUOTED_ARG = re.compile(r"\s*'((?:[^'\\]|\\.)*)'\s*(?:,|$)", re.S)
# what an expression names: `quoted`, "quoted" and bare identifiers, outside string literals
_TOKENS = re.compile(r"'(?:[^'\\]|\\.)*'|`((?:[^`\\]|\\.)*)`|\"((?:[^\"\\]|\\.)*)\"|([A-Za-z_][A-Za-z0-9_]*)", re.S)


class LayoutError(ValueError):
    retry_helps = False  # core/failures.py: the message names the option to change


def _exprs(value, option: str) -> tuple[str, ...]:
    items = (value,) if isinstance(value, str) else tuple(value or ())
    for item in items:
        if not isinstance(item, str) or not item.strip():
            raise LayoutError(f"layout {option}: {item!r} is not a column or expression")
    return tuple(i.strip() for i in items)


def _settings(value) -> tuple[tuple[str, str], ...]:
    if isinstance(value, (list, tuple)):  # ["name=value", …] as the command line gives them
        pairs = []
        for item in value:
            name, sep, setting = str(item).partition("=")
            if not sep:
                raise LayoutError(f"layout settings: {item!r} is not NAME=VALUE")
            pairs.append((name.strip(), setting.strip()))
        value = dict(pairs)
    if not isinstance(value, dict):
        raise LayoutError(f"layout settings: give a dict of table settings, not {value!r}")
    for name in value:
        if not _NAME.fullmatch(str(name)):
            raise LayoutError(f"layout settings: {name!r} is not a setting name")
    return tuple(sorted((str(k), str(v)) for k, v in value.items()))


def _json(value) -> "str | tuple[str, ...]":
    """The ``json`` option: "string" (no derived column), "json" (one for every JSON column), or
    the columns that get one, as a list or as {column: "json" | "string"}."""
    if value is None or isinstance(value, str):
        value = value or "string"
        if value not in JSON_AS:
            raise LayoutError(f"layout json {value!r}: give 'string', 'json' or the JSON columns that get a derived "
                              "JSON column (a list, or {column: 'json'})")
        return value
    if isinstance(value, dict):
        wrong = {k: v for k, v in value.items() if v not in JSON_AS}
        if wrong:
            raise LayoutError(f"layout json {wrong}: a column's value is 'json' (a derived JSON column) or 'string'")
        value = [k for k, v in value.items() if v == "json"]
    return _columns(value, "json") or "string"


def _columns(value, option: str) -> tuple[str, ...]:
    """A per-column option's columns (a name, or a list of names), sorted: the layout compares equal
    whatever order they were given in."""
    items = (value,) if isinstance(value, str) else tuple(value or ())
    for item in items:
        if not isinstance(item, str) or not item:
            raise LayoutError(f"layout {option}: {item!r} is not a column name")
    return tuple(sorted(set(items)))


def setting_sql(value: str) -> str:
    return value if re.fullmatch(r"-?\d+(\.\d+)?", value) else ch_string(value)


def _engine(value: str) -> tuple[str, tuple[str, ...]]:
    """``ReplacingMergeTree`` or ``ReplicatedReplacingMergeTree['(path', 'replica')]`` → name, args."""
    match = _ENGINE.fullmatch(value or "")
    name = match.group(1) if match else ""
    if name not in ENGINES:
        raise LayoutError(f"layout engine {value!r}: a copy's engine is one of {list(ENGINES)} (versioned "
                          "rows and tombstones need the ReplacingMergeTree family; the version and "
                          "deleted columns are added by the copy)")
    args, rest = [], (match.group(2) or "").strip()
    while rest:
        arg = _QUOTED_ARG.match(rest)
        if not arg:
            raise LayoutError(f"layout engine {value!r}: its arguments are the replication path and the "
                              "replica name, quoted: ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/"
                              "{database}/{table}', '{replica}')")
        args.append(arg.group(1))
        rest = rest[arg.end():].strip()
    if (name == DEFAULT_ENGINE and args) or (name == REPLICATED and len(args) not in (0, 2)):
        raise LayoutError(f"layout engine {value!r}: {name} takes "
                          + ("no arguments" if name == DEFAULT_ENGINE else "a path and a replica name, or none"))
    return name, tuple(args)


@dataclass(frozen=True)
class Layout:
    """A copy's layout; every field's default is the mirror's (``ORDER BY`` the key, no partitions)."""

    order_by: tuple[str, ...] = ()  # columns or expressions; the source key is appended where missing
    partition_by: str = ""
    primary_key: tuple[str, ...] = ()  # a prefix of the sorting key (ClickHouse's sparse index)
    ttl: str = ""
    settings: tuple[tuple[str, str], ...] = ()  # table settings, (name, value)
    engine: str = DEFAULT_ENGINE
    replication: tuple[str, ...] = ()  # a Replicated… engine's path and replica (default: the macros)
    cluster: str = ""  # DDL ON CLUSTER and a Distributed table over the local ones
    # columns ClickHouse derives from the exact ones for queries (core/clickhouse/derived.py): a JSON
    # column next to MySQL JSON ("string": none, "json": every JSON column, or these columns) and a
    # typed geo column (Point, Polygon, …) next to these spatial columns
    json: "str | tuple[str, ...]" = "string"
    geo: tuple[str, ...] = ()
    # a load's working table leaves its TTL out of the DDL (the comment keeps it) until it is counted
    # and swapped in: ClickHouse's merges would delete expired rows while the load counts them
    ttl_held: bool = field(default=False, compare=False)

    @classmethod
    def of(cls, value: "Layout | dict | None") -> "Layout":
        """A layout from its dict form; an unknown option is refused by name."""
        if isinstance(value, Layout):
            return value
        value = dict(value or {})
        unknown = sorted(set(value) - set(OPTIONS))
        if unknown:
            raise LayoutError(f"layout: unknown option(s) {unknown}; the options are {list(OPTIONS)}")
        engine, replication = _engine(value.get("engine") or DEFAULT_ENGINE)
        layout = cls(order_by=_exprs(value.get("order_by"), "order_by"),
                     partition_by=(value.get("partition_by") or "").strip(),
                     primary_key=_exprs(value.get("primary_key"), "primary_key"),
                     ttl=(value.get("ttl") or "").strip(), settings=_settings(value.get("settings") or {}),
                     engine=engine, replication=replication, cluster=(value.get("cluster") or "").strip(),
                     json=_json(value.get("json")), geo=_columns(value.get("geo"), "geo"))
        if layout.cluster and not _NAME.fullmatch(layout.cluster):
            raise LayoutError(f"layout cluster {layout.cluster!r} is not a cluster name")
        return layout

    def to_dict(self) -> dict:
        """The options that differ from the mirror's, in the form :meth:`of` reads."""
        out: dict = {}
        if self.order_by:
            out["order_by"] = list(self.order_by)
        if self.partition_by:
            out["partition_by"] = self.partition_by
        if self.primary_key:
            out["primary_key"] = list(self.primary_key)
        if self.ttl:
            out["ttl"] = self.ttl
        if self.settings:
            out["settings"] = dict(self.settings)
        if self.engine != DEFAULT_ENGINE:
            out["engine"] = self.engine_text()
        if self.cluster:
            out["cluster"] = self.cluster
        if self.json != "string":
            out["json"] = self.json if isinstance(self.json, str) else list(self.json)
        if self.geo:
            out["geo"] = list(self.geo)
        return out

    def __bool__(self) -> bool:
        """Is it other than the mirror's?"""
        return bool(self.to_dict())

    def engine_text(self) -> str:
        if not self.replication:
            return self.engine
        return f"{self.engine}(" + ", ".join(ch_string(a) for a in self.replication) + ")"

    def describe(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True) if self else "the default (ORDER BY the source key)"

    def summary(self, key: "list[str] | tuple[str, ...] | None" = None) -> str:
        """The layout in a line of its clauses, for people (the Sync view): ``ORDER BY (status,
        toYYYYMM(day), id) · PARTITION BY toYYYYMM(day) · TTL …``, its sorting key as
        :meth:`sorting_key` makes it (unquoted), ending in the source ``key``'s columns ("the
        source key" when unknown; a copy of a table without one is a plain MergeTree, ``ORDER BY
        tuple()``); the mirror's is "by its source key"."""
        ordered = list(self.order_by)
        if self.partition_by and self.partition_by not in ordered:
            ordered.append(self.partition_by)
        ordered += ["the source key"] if key is None else [k for k in key if k not in ordered]
        keyless = key is not None and not key  # a plain MergeTree
        order = "tuple()" if keyless else f"({', '.join(ordered)})"
        if not self:
            return ("ORDER BY tuple(): the source table has no primary key" if keyless
                    else f"by its source key: ORDER BY {order}" if key else "by its source key")
        parts = [f"ORDER BY {order}"]
        if self.partition_by:
            parts.append(f"PARTITION BY {self.partition_by}")
        if self.primary_key:
            parts.append(f"PRIMARY KEY ({', '.join(self.primary_key)})")
        if self.ttl:
            parts.append(f"TTL {self.ttl}")
        if self.settings:
            parts.append("SETTINGS " + ", ".join(f"{n} = {v}" for n, v in self.settings))
        if self.engine != DEFAULT_ENGINE:
            parts.append(f"ENGINE {self.engine_text()}")
        if self.cluster:
            parts.append(f"ON CLUSTER {self.cluster}")
        if self.json != "string":
            parts.append("JSON derived from " + ("every JSON column" if self.json == "json" else ", ".join(self.json)))
        if self.geo:
            parts.append("geo derived from " + ", ".join(self.geo))
        return " · ".join(parts)

    # --- the sorting key and what moves a row ----------------------------------------------------

    def sorting_key(self, key: tuple[str, ...], columns: list[str]) -> list[str]:
        """ORDER BY's items: ``order_by`` (a column's name quoted, an expression as written), the
        partition expression, then the key's columns it lacks, so the key stays unique.

        The partition expression is in it because ``SELECT … FINAL`` collapses rows of one
        sorting key across partitions (unless do_not_merge_across_partitions_select_final),
        while merges collapse them only inside one: a row moved to another partition leaves a
        tombstone there of its own version, which must meet its new row in neither."""
        items = [ch_ident(e) if e in columns else e for e in self.order_by]
        partition = ch_ident(self.partition_by) if self.partition_by in columns else self.partition_by
        if partition and partition not in items:
            items.append(partition)
        return items + [ch_ident(k) for k in key if ch_ident(k) not in items]

    def place_columns(self, columns: list[str]) -> list[str]:
        """The columns the sorting key and the partition expression read (beyond the key): a
        change to one moves the row to another sorting key or partition, where the old one is
        not replaced. A name that appears in an expression counts, whatever it does there."""
        named: set[str] = set()
        for expression in (*self.order_by, self.partition_by):
            for match in _TOKENS.finditer(expression):
                quoted = match.group(1) if match.group(1) is not None else match.group(2)
                named.add(quoted.replace("\\", "") if quoted is not None else match.group(3) or "")
        return [c for c in columns if c in named]

    def check(self, table: str, key: tuple[str, ...], columns: list[str]) -> None:
        """Refuse, naming the table and the option, what this release cannot honour exactly."""
        if not key and (self.order_by or self.primary_key or self.engine != DEFAULT_ENGINE):
            raise LayoutError(f"table {table}: a table without a primary key is copied as a plain MergeTree "
                              f"(ORDER BY tuple()); a sorting key, primary key or engine ({self.describe()}) "
                              "needs the key its rows collapse by")
        if self.primary_key:
            sorting = self.sorting_key(key, columns)
            given = [ch_ident(e) if e in columns else e for e in self.primary_key]
            if sorting[:len(given)] != given:
                raise LayoutError(f"table {table}: layout primary_key {list(self.primary_key)} is not a prefix of "
                                  f"the sorting key ({', '.join(sorting)})")
        expiries(self.ttl, table)  # a deleting TTL the checks can window (core/clickhouse/ttl.py), else refused
        # json and geo are checked against the columns' types where the derived columns are made
        # (core/clickhouse/derived.py)
        if self.cluster:
            raise LayoutError(f"table {table}: layout cluster={self.cluster!r}: jobs do not write to a cluster "
                              "yet (the DDL, the Distributed table and the key-to-shard routing are planned in "
                              "core/clickhouse/layout.py, docs/layouts.md); copy into one server's tables")

    # --- DDL -------------------------------------------------------------------------------------

    def engine_sql(self, version: str, deleted: str) -> str:
        args = [ch_string(a) for a in (self.replication or (REPLICATION_DEFAULT if self.engine == REPLICATED
                                                             else ()))]
        return f"{self.engine}(" + ", ".join([*args, ch_ident(version), ch_ident(deleted)]) + ")"

    def clauses(self, key: tuple[str, ...], columns: list[str], nullable: tuple[str, ...] = ()) -> str:
        """``PARTITION BY … ORDER BY … [PRIMARY KEY …] [TTL …] [SETTINGS …]`` of a keyed copy.
        ``nullable``: the columns that may hold NULL; a sorting key or partition that reads one
        needs ``allow_nullable_key`` (MySQL columns are nullable unless declared NOT NULL), set
        here without becoming part of the layout."""
        partition = self.partition_by
        sql = f" PARTITION BY {partition}" if partition else ""
        sql += " ORDER BY (" + ", ".join(self.sorting_key(key, columns)) + ")"
        if self.primary_key:
            sql += " PRIMARY KEY (" + ", ".join(ch_ident(e) if e in columns else e for e in self.primary_key) + ")"
        if self.ttl and not self.ttl_held:
            sql += f" TTL {self.ttl}"
        settings = dict(self.settings)
        if set(nullable) & set(self.place_columns(columns)):
            settings.setdefault("allow_nullable_key", "1")
        if settings:
            sql += " SETTINGS " + ", ".join(f"{n} = {setting_sql(v)}" for n, v in sorted(settings.items()))
        return sql

    def holding_ttl(self) -> "Layout":
        """This layout for a load's working table: its TTL applied only when it is swapped in."""
        return replace(self, ttl_held=True) if self.ttl else self

    def on_cluster(self) -> str:
        return f" ON CLUSTER {ch_ident(self.cluster)}" if self.cluster else ""


MIRROR = Layout()  # every copy's before layouts: ORDER BY the source key, no partitions


def reshape_refused(pipeline: str, merge_into: str) -> LayoutError:
    """Why a pipeline does not reshape a merged copy (docs/source-groups.md), and what does."""
    return LayoutError(
        f"pipeline {pipeline!r}: the merged copy {merge_into} cannot be reshaped by its pipeline: a pipeline re-copies "
        "one source table at a time into a new table, and a merged copy holds every source's tables. Lay it out anew "
        f"by loading the group again under the new layout — airflow-sync load --source … --merge-into {merge_into} "
        "--reshape --order-by … (FullLoadOperator(sources=…, merge_into=…, reshape=True, layout={…})) — then "
        "bootstrap the group's pipeline again (CdcBootstrapOperator(…, restart=True)); a retry here is refused again")


# --- a cluster's tables (planned: generated and tested as logic, not yet written to) -------------

def local_name(table: str) -> str:
    """A cluster copy's table on each shard; ``table`` itself is the Distributed table over them."""
    return f"{table}_local"


def shard_of(key_hash: int, weights: list[int]) -> int:
    """The shard a Distributed table sends a row to: its sharding expression's value modulo the
    sum of the shards' weights, each shard taking its weight's share in order (ClickHouse's rule)."""
    slot, total = key_hash % sum(weights), 0
    for index, weight in enumerate(weights):
        total += weight
        if slot < total:
            return index
    raise AssertionError("unreachable")


def distributed_sql(layout: Layout, database: str, table: str, key: tuple[str, ...]) -> str:
    """The Distributed table over a cluster copy's local tables, sharded by a hash of the source
    key: every version and tombstone of a key goes to the one shard, where its place collapses."""
    sharding = "cityHash64(" + ", ".join(ch_ident(k) for k in key) + ")"
    name = f"{ch_ident(database)}.{ch_ident(table)}"
    return (f"CREATE TABLE IF NOT EXISTS {name}{layout.on_cluster()} AS {ch_ident(database)}."
            f"{ch_ident(local_name(table))} ENGINE = Distributed({ch_ident(layout.cluster)}, {ch_ident(database)}, "
            f"{ch_ident(local_name(table))}, {sharding})")


# --- the layout a copy keeps in its comment ----------------------------------------------------

_MARK = " layout="


def layout_comment(layout: Layout, key: tuple[str, ...]) -> str:
    """What a copy's comment carries of its layout: nothing for the mirror's (tables created before
    layouts read as the default), else the options and the source key (the sorting key no longer
    says which columns are the key)."""
    if not layout:
        return ""
    return _MARK + json.dumps({**layout.to_dict(), "key": list(key)}, sort_keys=True, separators=(",", ":"))


def stored(comment: str) -> tuple[Layout, list[str] | None]:
    """The layout and source key a copy's comment records (the default and None when it has none)."""
    at = (comment or "").find(_MARK)
    if at < 0:
        return Layout(), None
    data, _ = json.JSONDecoder().raw_decode(comment, at + len(_MARK))
    key = data.pop("key", None)
    return Layout.of(data), key


def relaid_comment(comment: str, layout: Layout) -> str:
    """``comment`` recording ``layout`` instead of the layout it records (its source key kept)."""
    at = (comment or "").find(_MARK)
    if at < 0:
        return comment
    data, end = json.JSONDecoder().raw_decode(comment, at + len(_MARK))
    return comment[:at] + layout_comment(layout, tuple(data.get("key") or ())) + comment[end:]


def check_same(table: str, requested: Layout, comment: str) -> None:
    """Refuse a job whose layout differs from the one the copy was created with. A copy made
    before layouts existed records none: only a period load's partitions were chosen then."""
    have, _ = stored(comment)
    if _MARK not in (comment or ""):
        requested = Layout.of({k: v for k, v in requested.to_dict().items() if k != "partition_by"})
    if have != requested:
        raise LayoutError(f"table {table}: the copy is laid out as {have.describe()} but this job asks for "
                          f"{requested.describe()}; change a copy's layout with airflow-sync reshape (or drop the "
                          "copy and load it again)")

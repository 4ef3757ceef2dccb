"""Columns ClickHouse derives from a copy's exact columns, for queries (docs/layouts.md, "Derived
columns"; docs/type-mapping.md).

The exact column stays what every check compares: MySQL JSON as its text in a ``String``, a
spatial value as MySQL's own bytes (SRID + WKB) in a ``String`` (core/typemap.py). Next to it a
layout may ask for a typed column that ClickHouse computes from it, ``MATERIALIZED``:

* ``json``: ``<column>_json Nullable(JSON)``, ``accurateCastOrNull(<column>, 'JSON')``. ClickHouse's
  JSON type drops nulls inside objects, re-types numbers beyond 64 bits as strings and rounds
  decimals to doubles; a document it cannot hold at all (an array or a scalar at the top, a path
  given twice such as ``{"a.b": 1, "a": {"b": 2}}``) is NULL there, never an error.
* ``geo``: ``<column>_geo`` of ClickHouse's type for the column's MySQL type (``Point``,
  ``LineString``, ``Polygon``, ``MultiPoint``, ``MultiLineString``, ``MultiPolygon``: 2-D
  Float64, which holds MySQL's coordinates exactly), ``readWKB<Type>(substring(<column>, 5))``: the
  WKB behind the 4 SRID bytes. It loses the SRID (``reinterpretAsUInt32(substring(<column>, 1,
  4))`` reads it from the exact column). A NULL is the type's empty value (``(nan, nan)``, ``[]``).
  GEOMETRY (any kind, collections included) and GEOMETRYCOLLECTION have no ClickHouse type that
  holds every value they can hold: refused by name.

ClickHouse fills a MATERIALIZED column on every insert, so every writer (load, bootstrap, CDC,
repair, diff apply, tombstone) fills it without code of its own; ``SELECT *`` leaves it out, and
the columns a writer writes (core/clickhouse/described.py: ``column_types``) leave it out too.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from airflow_sync_provider.core.clickhouse.layout import Layout, LayoutError
from airflow_sync_provider.core.sql import ch_ident
from airflow_sync_provider.core.typemap import ColumnMapping, SpatialRule, StringRule

JSON_SUFFIX, GEO_SUFFIX = "_json", "_geo"

# MySQL's spatial type → ClickHouse's type and the empty value's WKB (little-endian; a point's
# is POINT(NaN NaN), the WKB convention for an empty point)
GEO_TYPES = {
    "point": ("Point", "0101000000000000000000F87F000000000000F87F"),
    "linestring": ("LineString", "010200000000000000"),
    "polygon": ("Polygon", "010300000000000000"),
    "multipoint": ("MultiPoint", "010400000000000000"),
    "multilinestring": ("MultiLineString", "010500000000000000"),
    "multipolygon": ("MultiPolygon", "010600000000000000"),
}
_EMPTY = {"Point": "(nan, nan)"}  # the others are []
# MariaDB's JSON is LONGTEXT utf8mb4_bin with a json_valid() CHECK: information_schema says longtext
_MARIADB_JSON = ("longtext", "utf8mb4_bin")


@dataclass(frozen=True)
class Derived:
    """A column ClickHouse computes from the copy's column ``source``."""

    name: str
    source: str
    ch_type: str
    expression: str

    def ddl(self) -> str:
        return f"{ch_ident(self.name)} {self.ch_type} MATERIALIZED {self.expression}"


def geo_expression(column: str, ch_type: str, nullable: bool) -> str:
    """``column``'s WKB (after its 4 SRID bytes) read as ``ch_type``; a NULL as the type's empty
    value. ClickHouse calls a function of a Nullable column on every row's nested value, '' for a
    NULL, on which readWKB throws: NULL rows read a valid empty WKB instead."""
    kind = next(k for k, (t, _) in GEO_TYPES.items() if t == ch_type)
    col = ch_ident(column)
    if not nullable:
        return f"readWKB{ch_type}(substring({col}, 5))"
    empty = f"CAST({_EMPTY.get(ch_type, '[]')}, '{ch_type}')"
    return (f"if(isNull({col}), {empty}, readWKB{ch_type}(substring(ifNull({col}, "
            f"unhex('00000000{GEO_TYPES[kind][1]}')), 5)))")


def json_expression(column: str) -> str:
    return f"accurateCastOrNull({ch_ident(column)}, 'JSON')"


def is_json(mapping: ColumnMapping) -> bool:
    """A MySQL JSON column (on MariaDB: LONGTEXT utf8mb4_bin, which its JSON is)."""
    col = mapping.source
    return col.data_type == "json" or (col.mariadb and (col.data_type, (col.collation or "").lower()) == _MARIADB_JSON)


def derived_columns(layout: Layout, mappings: list[ColumnMapping], table: str) -> list[Derived]:
    """The columns ``layout`` derives from ``mappings`` (the copy's), or an error naming the
    column and why: a column the table lacks, of a type the option does not apply to, whose copy
    is transformed (core/content/), or whose derived column's name is taken."""
    by_name = {m.name: m for m in mappings}
    out: list[Derived] = []
    json_columns = ([m.name for m in mappings if is_json(m) and m.transform is None] if layout.json == "json"
                    else [] if layout.json == "string" else list(layout.json))
    for name in json_columns:
        mapping = _column(by_name, name, "json", table)
        if not isinstance(mapping.rule, StringRule) or mapping.source.data_type in ("enum", "set"):
            raise LayoutError(f"table {table}: layout json names column {name!r}, a {mapping.source.column_type} "
                              "column; a derived JSON column reads a JSON or text column")
        out.append(Derived(name + JSON_SUFFIX, name, "Nullable(JSON)", json_expression(name)))
    for name in layout.geo:
        mapping = _column(by_name, name, "geo", table)
        if not isinstance(mapping.rule, SpatialRule):
            raise LayoutError(f"table {table}: layout geo names column {name!r}, a {mapping.source.column_type} "
                              "column; a derived geo column reads a spatial column (POINT, LINESTRING, POLYGON, "
                              "MULTIPOINT, MULTILINESTRING, MULTIPOLYGON)")
        kind = mapping.source.data_type
        if kind not in GEO_TYPES:
            raise LayoutError(
                f"table {table}: layout geo names column {name!r}, a {mapping.source.column_type.upper()} column: "
                + ("its values may be of any kind, GEOMETRYCOLLECTION included, and no ClickHouse type holds every "
                   "one (ClickHouse's geo types hold one kind each, and no collection)" if kind == "geometry" else
                   "ClickHouse has no type for a geometry collection")
                + "; leave it out of geo (its exact value stays in the copy), or copy a typed column (POINT, "
                  "POLYGON, …) of it through a view")
        ch_type = GEO_TYPES[kind][0]
        nullable = mapping.ch_type.startswith("Nullable(")
        out.append(Derived(name + GEO_SUFFIX, name, ch_type, geo_expression(name, ch_type, nullable)))
    order = list(by_name)
    out.sort(key=lambda d: order.index(d.source))  # in the table's order
    for derived in out:
        if derived.name in by_name:
            raise LayoutError(f"table {table}: the column derived from {derived.source!r} would be named "
                              f"{derived.name!r}, which the table has; leave {derived.source!r} out of the layout's "
                              "json / geo, or copy the table through a view that renames one of them")
    return out


def _column(by_name: dict, name: str, option: str, table: str) -> ColumnMapping:
    mapping = by_name.get(name)
    if mapping is None:
        raise LayoutError(f"table {table}: layout {option} names column {name!r}, which the copy does not have "
                          f"(its columns: {', '.join(by_name)})")
    if mapping.transform is not None:
        raise LayoutError(f"table {table}: layout {option} names column {name!r}, whose copy is transformed "
                          f"({mapping.transform.spec()}): a derived column would read the transformed value")
    return mapping


def after_change(layout: Layout, before: list[ColumnMapping], after: list) -> tuple[Layout, list[Derived]]:
    """A schema change followed by CDC (core/cdc/alter.py) that drops, renames or retypes a column
    with a derived column: ClickHouse would refuse to drop or rename the column under it, or the
    derived column would read values it cannot hold (POINT → GEOMETRY). Returns the layout
    without those columns (``json="json"`` stays: it names no column) and the derived columns
    to drop first. ``before``: the copy's mappings before the change; ``after``: its columns
    (MySQLColumn) after it. A derived column dropped this way comes back with a reshape."""
    types = {c.name: c.data_type for c in after}
    touched = [d for d in derived_columns(layout, before, "")
               if types.get(d.source) != next(m.source.data_type for m in before if m.name == d.source)]
    if not touched:
        return layout, []
    gone = {d.source for d in touched}
    json = layout.json if isinstance(layout.json, str) else tuple(c for c in layout.json if c not in gone) or "string"
    return replace(layout, json=json, geo=tuple(c for c in layout.geo if c not in gone)), touched

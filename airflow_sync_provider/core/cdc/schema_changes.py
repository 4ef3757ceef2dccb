"""DDL on a replicated table (patent S3): bring the target's columns along, or stop clearly.

Added columns are added, dropped columns dropped, and a column whose mapped type widens
(a larger integer, more decimal digits at the same scale, more fractional seconds, FLOAT to
DOUBLE, NOT NULL to NULL) is modified. A change the copy cannot follow without rewriting it —
a new primary key, a narrowing or otherwise incompatible type — stops the pipeline before
any row of the new shape is written, naming table, statement and position.
"""

from __future__ import annotations

import re

from airflow_sync_provider.core.cdc.binlog import TableRoute
from airflow_sync_provider.core.cdc.positions import BinlogError, BinlogPosition
from airflow_sync_provider.core.jobspec import copied_schema
from airflow_sync_provider.core.sql import ch_ident, ch_table
from airflow_sync_provider.core.target import clickhouse as target

_INT = re.compile(r"^(U?)Int(\d+)$")
_DEC = re.compile(r"^Decimal\((\d+), (\d+)\)$")
_DT = re.compile(r"^DateTime64\((\d), 'UTC'\)$")


def widens(old: str, new: str) -> bool:
    """Can every value of ClickHouse type ``old`` be stored unchanged in ``new``?"""
    if old == new:
        return True
    if new.startswith("Nullable("):
        return widens(old[9:-1] if old.startswith("Nullable(") else old, new[9:-1])
    if old.startswith("Nullable("):
        return False  # NULL to NOT NULL: NULLs would have nowhere to go
    (a, b), (c, d) = ((_INT.match(old), _INT.match(new)), (_DEC.match(old), _DEC.match(new)))
    if a and b:  # signed never fits unsigned; unsigned fits a signed type twice as wide
        old_unsigned, new_unsigned, old_bits, new_bits = a.group(1), b.group(1), int(a.group(2)), int(b.group(2))
        if old_unsigned == new_unsigned:
            return new_bits >= old_bits
        return bool(old_unsigned) and new_bits > old_bits
    if c and d:  # no fewer integer digits, no fewer decimals
        (p, s), (q, t) = (int(c.group(1)), int(c.group(2))), (int(d.group(1)), int(d.group(2)))
        return t >= s and q - t >= p - s
    e, f = _DT.match(old), _DT.match(new)
    if e and f:
        return int(f.group(1)) >= int(e.group(1))
    return (old, new) == ("Float32", "Float64")


def apply_ddl(conn, ch, route: TableRoute, statement: str, position: BinlogPosition) -> TableRoute:
    """Align the target of ``route`` with the source table's columns after ``statement``.

    The target is compared with the source table's *current* definition: a catch-up far behind
    gets all later column changes at the first DDL it meets (columns appear early and are NULL
    until rows carry them), and one that cannot be followed is refused there already."""
    where = f"table {route.source}, DDL at {position}: {statement[:300]!r}"
    schema = copied_schema(conn, route.config or {"source_database": route.schema.database,
                                                  "source_table": route.schema.table})
    if list(schema.primary_key) != route.key:
        raise BinlogError(f"{where} changes the primary key {route.key} → "
                          f"{list(schema.primary_key)}; the copy is keyed by it. Re-bootstrap the table (a fresh full "
                          "load) and start its pipeline again")
    target.check_columns(schema)
    present = {k: v for k, v in target.column_types(ch, route.target_database, route.target_table).items()
               if k not in target.INTERNAL_COLUMNS}
    table = ch_table(route.target_database, route.target_table)
    changes = []
    for mapping in schema.mappings():
        old = present.get(mapping.name)
        if old is None:
            changes.append(f"ADD COLUMN IF NOT EXISTS {ch_ident(mapping.name)} {mapping.ch_type}")
        elif old != mapping.ch_type:
            if not widens(old, mapping.ch_type):
                raise BinlogError(f"{where}: the source's column {mapping.name!r} is now {mapping.source.column_type} "
                                  f"({mapping.ch_type}) and the copy's {old}, which cannot hold every new value "
                                  "without rewriting the copy; re-bootstrap the table")
            changes.append(f"MODIFY COLUMN {ch_ident(mapping.name)} {mapping.ch_type}")
    names = {m.name for m in schema.mappings()}
    changes += [f"DROP COLUMN IF EXISTS {ch_ident(name)}" for name in present if name not in names]
    for change in changes:
        ch.command(f"ALTER TABLE {table} {change}")
    return TableRoute(schema, route.target_database, route.target_table, route.config, route.weight)

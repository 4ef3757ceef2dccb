"""The applier's side of foreign-key cascades: InnoDB's changes that no binlog event carries.

A :class:`Cascading` is held by the pipeline run. It knows the pipeline's acting foreign keys as
of the checkpoint (core/cdc/foreign_keys.py; kept with the checkpoint, followed through DDL), says
which parent tables a stream's reader must watch (core/cdc/binlog/parents.py) and whose changes go
with the triggers (:meth:`Cascading.children`), and before a batch's rows are written, resolves its
triggers against the copies and its own changes of the children (core/cdc/cascades.py: why that is
exact, also after a crash) and writes the children's new rows at their parents' versions, deepest
tables first, under the run's ``writing`` lock, so a verification's look never sees half of a
resolution.

Copies being filled while a cascade lands (a re-copy's chunks, a reshape's new copy) are brought
level afterwards: when a re-copy of a child ends, its cascades from the re-copy's position on are
resolved again against the now whole copy (spark/cdc_apply.PipelineRun.replay_cascades) — resolving is
idempotent, so rows already right are left alone. A server that logs cascaded rows itself
(MySQL ≥ 9.6, core/cdc/foreign_keys.logs_cascades) gets none of this.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import defaultdict

import pyarrow as pa

from airflow_sync_provider.core.cdc import ddl
from airflow_sync_provider.core.cdc.binlog.parents import ParentWatch
from airflow_sync_provider.core.cdc.binlog.routes import TableRoute
from airflow_sync_provider.core.cdc.cascades import CascadeError, Cascades, Change, Trigger
from airflow_sync_provider.core.cdc.ddl import ch_literal
from airflow_sync_provider.core.cdc.foreign_keys import (
    CascadePlan,
    ForeignKeys,
    logs_cascades,
    read_foreign_keys,
)
from airflow_sync_provider.core.clickhouse.columns import DELETED_COLUMN, VERSION_COLUMN, WEIGHT_SETTINGS
from airflow_sync_provider.core.clickhouse.described import column_types
from airflow_sync_provider.core.clickhouse.history import refuse_unwritten
from airflow_sync_provider.core.content.shaping import DELETED_AT_SOURCE
from airflow_sync_provider.core.crash_points import crash_point
from airflow_sync_provider.core.positions import BinlogError, BinlogPosition
from airflow_sync_provider.core.source import reader as mysql_reader
from airflow_sync_provider.core.source.group import member_filter
from airflow_sync_provider.core.source.schema import TableNotFound, TableSchema, read_table_schema
from airflow_sync_provider.core.source.weights import SPLIT_WEIGHT_COLUMN, weights_of
from airflow_sync_provider.core.sql import ch_ident, ch_table
from airflow_sync_provider.spark.cdc_run import CascadingRun

log = logging.getLogger(__name__)

IN_LIST = 1000  # values per query: the query stays far below ClickHouse's max_query_size


class CopiesInClickHouse:
    """The copies of a stream's routes as core/cdc/cascades.CopyRows reads them: each copy's
    columns as its route has them (a collated split key's weight after them), live rows under
    ``FINAL`` — a merged copy's of this source's member only, a copy that keeps deletes without
    the rows deleted at the source."""

    def __init__(self, ch, routes: dict[str, TableRoute]):
        self.ch, self.routes = ch, routes
        self._types: dict[str, dict[str, pa.DataType]] = {}
        self._ch_types: dict[str, dict[str, str]] = {}

    def route(self, table: str) -> TableRoute:
        route = self.routes.get(table)
        if route is None:
            raise CascadeError(f"a cascade changes rows of {table}, which this stream does not copy")
        return route

    def reads_from(self, table: str) -> tuple[str, str]:
        """A reshape's old copy is whole and current while the new one fills: read that one."""
        route = self.route(table)
        return route.also or (route.target_database, route.target_table)

    def columns(self, table: str) -> list[str]:
        route = self.route(table)
        return route.names + ([SPLIT_WEIGHT_COLUMN] if route.weight is not None else [])

    def key(self, table: str) -> list[str]:
        route = self.route(table)
        return [route.names[i] for i in route.key_at]

    def types(self, table: str) -> dict[str, pa.DataType]:
        """The Arrow type of each column as the copy hands it out (and takes it back)."""
        found = self._types.get(table)
        if found is None:
            database, name = self.reads_from(table)
            columns = self.columns(table) + [VERSION_COLUMN, DELETED_COLUMN] + (
                [DELETED_AT_SOURCE] if self.route(table).keep else [])
            empty = self.ch.query_arrow(f"SELECT {', '.join(map(ch_ident, columns))} FROM {ch_table(database, name)} "
                                        "WHERE 0", use_strings=False)
            found = self._types[table] = {f.name: f.type for f in empty.schema}
            self._ch_types[table] = column_types(self.ch, database, name)
        return found

    def normalize(self, table: str, columns: tuple[str, ...], values: tuple) -> tuple:
        """Values as the copy's rows hold them (a trigger's come from a row event's image)."""
        types = self.types(table)
        return tuple(pa.array([v], type=types[c]).to_pylist()[0] for c, v in zip(columns, values))

    def rows_of(self, table: str, data: pa.Table) -> list[tuple]:
        """A batch's changed rows of ``table`` as the reader shaped them, as the copy's rows are."""
        types, names = self.types(table), self.columns(table)
        data = data.select(names).cast(pa.schema([pa.field(n, types[n]) for n in names]))
        return list(zip(*(data.column(i).to_pylist() for i in range(len(names)))))

    def fetch(self, table: str, columns: tuple[str, ...], values: list[tuple],
              below: int, since: int | None) -> list[tuple[tuple, int, bool, bool]]:
        route, types = self.route(table), self.types(table)
        ch_types = self._ch_types[table]  # read with the types
        names = self.columns(table)
        database, name = self.reads_from(table)
        mine, params = member_filter(route.schema)
        version = ch_ident(VERSION_COLUMN)
        live = [f"{ch_ident(DELETED_COLUMN)} = 0", f"{version} < {int(below)}", mine]
        kept = f"{ch_ident(DELETED_AT_SOURCE)} != 0" if route.keep else "0"
        if since is None:
            live.append(f"NOT ({kept})")
        else:
            live.append(f"(NOT ({kept}) OR {version} >= {int(since)})")
            # FINAL leaves tombstones out (the engine's is_deleted): removals are read without it
            removed = [f"{ch_ident(DELETED_COLUMN)} = 1", f"{version} >= {int(since)}", f"{version} < {int(below)}",
                       mine]
        # rows older than a re-copy in place are stale (out-ranked or removed when it ends)
        recopying = (route.table.recopying or {}) if route.table is not None else {}
        floor = BinlogPosition.from_dict(recopying["position"]).snapshot_version() \
            if recopying.get("position") and not route.also else 0
        probe = f"({', '.join(map(ch_ident, columns))})" if len(columns) > 1 else ch_ident(columns[0])

        def select(gone: str) -> str:  # the row, its version, and whether it is a removal
            return (f"SELECT {', '.join(map(ch_ident, names))}, {version}, toUInt8({gone}) "
                    f"FROM {ch_table(database, name)}")

        out = []
        for start in range(0, len(values), IN_LIST):
            items = [", ".join(ch_literal(v, ch_types[c]) for c, v in zip(columns, value))
                     for value in values[start:start + IN_LIST]]
            listed = ", ".join(f"({i})" if len(columns) > 1 else i for i in items)
            sql = f"{select(kept)} FINAL WHERE {' AND '.join(live)} AND {probe} IN [{listed}]"
            if since is not None:  # one statement for both
                sql += f" UNION ALL {select('1')} WHERE {' AND '.join(removed)} AND {probe} IN [{listed}]"
            found = self.ch.query_arrow(sql, parameters=params, use_strings=False)
            if not found.num_rows:
                continue
            found = found.rename_columns(names + [VERSION_COLUMN, "gone"]).cast(
                pa.schema([pa.field(n, types[n]) for n in names + [VERSION_COLUMN]] + [pa.field("gone", pa.uint8())]))
            data = [found.column(i).to_pylist() for i in range(found.num_columns)]
            out += [(row[:-2], row[-2], row[-2] < floor, bool(row[-1])) for row in zip(*data)]
        return out

    def arrow(self, table: str, rows: list[tuple], versions: list[int], deleted: list[int], at: list[int]) -> pa.Table:
        """Rows (in :meth:`columns` order) as the copy takes them, with their versions, tombstone
        flags and (a copy that keeps deletes) when the source deleted them."""
        route, types = self.route(table), self.types(table)
        names = self.columns(table)
        columns = list(zip(*rows)) if rows else [[] for _ in names]
        arrays = [pa.array(values, type=types[n]) for n, values in zip(names, columns)]
        arrays += [pa.array(versions, type=types[VERSION_COLUMN]),
                   pa.array(deleted, type=types[DELETED_COLUMN])]
        names = names + [VERSION_COLUMN, DELETED_COLUMN]
        if route.keep:
            kind = types[DELETED_AT_SOURCE]  # a DateTime: Unix seconds, as an integer or a timestamp
            arrays.append(pa.array(at, kind) if pa.types.is_integer(kind) else
                          pa.array(at, pa.int64()).cast(pa.timestamp("s")).cast(kind))
            names.append(DELETED_AT_SOURCE)
        return pa.Table.from_arrays(arrays, names=names)


class Cascading:
    """A run's foreign keys and the cascades they cause (see the module's text). ``run``: the
    :class:`~airflow_sync_provider.spark.cdc_apply.PipelineRun` (spec, state, ClickHouse client)."""

    def __init__(self, run: CascadingRun):
        self.run = run
        self.logged = False  # the server logs cascaded rows itself: nothing to derive
        self._plans: dict = {}
        self._watches: dict = {}
        self.rows = 0  # child rows written by cascades in this run
        self.triggers = 0

    @property
    def keys(self) -> ForeignKeys:
        return ForeignKeys.of(self.run.state.foreign_keys) or ForeignKeys()

    def start(self, conn, routes: dict[str, TableRoute]) -> None:
        """At the run's start: whether the server logs cascades; the foreign keys as of the
        checkpoint (read from the server the first time, later carried with the checkpoint);
        shaped copies whose combination with a cascade cannot stay exact are refused by name."""
        spec = self.run.spec
        self.logged = not spec.follow_cascades or logs_cascades(conn)
        if self.run.state.foreign_keys is None:
            self.run.state.foreign_keys = ForeignKeys(read_foreign_keys(conn, set(routes))).to_list()
        plan = self.plan(routes)
        if plan:
            self.run.log(f"foreign keys followed: {len(plan.keys)} acting key(s) into the copies"
                         + (f"; not derived: {self.why_not()}" if self.logged else "")
                         + (f"; chains through tables not copied: {sorted(plan.gaps)}" if plan.gaps else ""))

    def why_not(self) -> str:
        return ("switched off (follow_cascades=False)" if not self.run.spec.follow_cascades
                else "the server logs cascaded rows itself (MySQL ≥ 9.6, innodb_native_foreign_keys=OFF)")

    def joined(self, conn, names: list[str]) -> None:
        """Tables joining: their foreign keys as the server defines them now."""
        more = read_foreign_keys(conn, set(names), self.keys.known() - set(names))
        self.run.state.foreign_keys = self.keys.merged(more).to_list()
        self._plans.clear()

    def plan(self, routes: dict[str, TableRoute]) -> CascadePlan:
        """The plan for a stream's copies (checked once per set of copies and keys)."""
        if self.logged:
            return CascadePlan()
        cached = (frozenset(routes), tuple(id(r) for r in routes.values()))
        plan = self._plans.get(cached)
        if plan is None:
            main = self.run.stream.routes if self.run.stream is not None else {}
            plan = self.keys.plan(set(routes), set(main) - set(routes))
            # a table without a key (a multiset copy): cascades into it are not derived yet; it is
            # verified against the source after each one instead (docs/foreign-keys.md, limits)
            keyless = {k.child for k in plan.keys if k.child in routes and routes[k.child].multiset}
            if keyless:
                plan = dataclasses.replace(plan, ahead=plan.ahead | keyless)
            _refuse_shapes(plan, routes)
            self._plans = {cached: plan}
        return plan

    def watch(self, routes: dict[str, TableRoute]) -> dict[str, ParentWatch] | None:
        """The parents a reader of ``routes`` must watch (None: none)."""
        plan = self.plan(routes)
        if not plan:
            return None
        cached = (frozenset(routes), tuple(id(r) for r in routes.values()), tuple(plan.parents.items()))
        watches = self._watches.get(cached)
        if watches is None:
            watches = {}
            for parent, columns in plan.parents.items():
                followed = routes.get(parent)
                schema = followed.schema if followed is not None and all(c in followed.names for c in columns) \
                    else _parent_schema(plan, routes, parent, columns, self.run.spec.source)
                if schema is not None:
                    watches[parent] = ParentWatch.of(schema, columns, followed)
            self._watches = {cached: watches}
        return watches

    def after_ddl(self, text: str, schema: str, statement: ddl.Statement | None, after) -> None:
        """The keys after a DDL the stream read (a batch ends before every DDL on a followed
        table or a parent): parsed from the statement, or, when it cannot be parsed, read from
        the server (its definitions now: said in the log)."""
        if statement is None or not (self.keys.touches(statement) or "FOREIGN" in text.upper()
                                     or "REFERENCES" in text.upper()):
            return
        keys, understood = self.keys.after(text, schema, statement)
        streamed = set(self.run.stream.routes) if self.run.stream is not None else set()
        if not understood:
            with mysql_reader.connect(self.run.spec.source) as conn:
                keys = ForeignKeys(read_foreign_keys(conn, streamed | self.keys.known() | set(statement.tables)))
            self.run.log(f"the foreign keys after the DDL at {after} are read from the server as they are now "
                         f"(the statement could not be parsed): {text[:200]!r}")
        else:
            # a parent this DDL brings into a chain: its own keys were never followed
            followed = {k.child for k in keys.keys} | self.keys.known() | streamed
            reached = keys.known() - followed
            if reached:
                with mysql_reader.connect(self.run.spec.source) as conn:
                    keys = keys.merged(read_foreign_keys(conn, reached, followed))
                self.run.log(f"the foreign keys of {sorted(reached)} (reached by the DDL at {after}) are read from "
                             "the server as they are now")
        if keys.keys != self.keys.keys:
            self.run.log(f"foreign keys changed at {after}: {len(keys.keys)} acting key(s)")
        self.run.state.foreign_keys = keys.to_list()
        self._plans.clear()

    # --- resolving ------------------------------------------------------------------------

    def children(self, routes: dict[str, TableRoute]) -> frozenset:
        """The copies whose rows a cascade of ``routes``' stream can change: a batch's own changes
        of them travel with its triggers (core/cdc/cascades.Rows)."""
        plan = self.plan(routes)
        return frozenset(k.child for k in plan.keys if k.child in routes and k.child not in plan.ahead)

    def follow(self, routes: dict[str, TableRoute], items: list, changed: dict[str, pa.Table],
               per_table: dict | None = None) -> list[Change]:
        """Resolve a batch's cascade items (its triggers and its own changes of the children, in
        binlog order; ``changed``: those rows per table) against ``routes``' copies — before the
        batch's rows are written — and write the children's new rows at their parents' versions,
        deepest tables first. Returns the changes an XA transaction's triggers made, which are
        written after the batch's rows (:meth:`write_after`)."""
        plan = self.plan(routes)
        triggers = [item for item in items if isinstance(item, Trigger)]
        if not plan or not triggers:
            return []
        copies = CopiesInClickHouse(self.run.ch, routes)
        skip = {name: route.skip_before for name, route in routes.items() if route.skip_before}
        recopying = frozenset(name for name, route in routes.items()
                              if route.table is not None and route.table.recopying)
        with self.run.writing:  # no verification looks at the copies in between
            cascades = Cascades(plan, copies, self.run.spec.cascade_rows, skip, recopying)
            changes = cascades.resolve(items, {table: copies.rows_of(table, data) for table, data in changed.items()})
            self.rows += self._write(copies, [c for c in changes if not c.inclusive], per_table)
        if cascades.unresolved:  # through a copy ahead of this replay, or into a multiset: the net catches it
            reached = set(cascades.unresolved).union(*(plan.below(t) for t in cascades.unresolved))
            reached = reached & set(routes) or set(routes)  # a replay's own table, when the chain leaves it
            for name in reached:
                if routes[name].table is not None:
                    routes[name].table.mark_due()
            self.run.log(f"cascades into or through {sorted(cascades.unresolved)} (a copy ahead of this replay, or a "
                         f"table without a key) reach {sorted(reached)}: verified against the source instead")
        self.triggers += len(triggers)
        return [c for c in changes if c.inclusive]

    def write_after(self, routes: dict[str, TableRoute], changes: list[Change], per_table: dict | None = None) -> None:
        """The changes of XA transactions' triggers (Change.inclusive), once the batch's rows are written."""
        if changes:
            with self.run.writing:
                self.rows += self._write(CopiesInClickHouse(self.run.ch, routes), changes, per_table)

    def _write(self, copies: CopiesInClickHouse, changes: list[Change], per_table: dict | None) -> int:
        """One insert per copy, the deepest tables first: a replay after a crash in between finds
        a table's rows written only when the rows below them are too (core/cdc/cascades.py)."""
        by_table: dict[str, list[Change]] = defaultdict(list)
        depth: dict[str, int] = defaultdict(int)
        for change in changes:
            if change.written:
                by_table[change.table].append(change)
                depth[change.table] = max(depth[change.table], change.depth)
        written = 0
        for table in sorted(by_table, key=lambda t: -depth[t]):
            items = by_table[table]
            route = copies.route(table)
            rows = _rows(route, items, self._weights(route, items))
            if not rows:
                continue
            arrow = copies.arrow(table, *map(list, zip(*rows)))
            settings = WEIGHT_SETTINGS if route.weight is not None else None
            refuse_unwritten(route.history, table, "a foreign-key cascade from its parent", "slice 3", BinlogError)
            self.run.checkpoints.fence()  # the copies are written only under the lease
            # a reshape's old copy last: it is the one read (CopiesInClickHouse.reads_from)
            for database, name in dict.fromkeys([(route.target_database, route.target_table),
                                                 *([route.also] if route.also else [])]):
                self.run.ch.insert_arrow(name, arrow, database=database, settings=settings)
            written += len(rows)
            if per_table is not None:
                per_table.setdefault(table, [0, 0, 0])[1] += len(rows)
            crash_point("cdc.cascade-table")
        return written

    def _weights(self, route: TableRoute, items: list[Change]) -> dict:
        """New collation weights of a collated split key's values that a cascade changed."""
        if route.weight is None:
            return {}
        at = route.names.index(route.weight.name)
        values = list(dict.fromkeys(c.after[at] for c in items
                                    if c.after is not None and c.after[at] != c.before[at]))
        if not values:
            return {}
        with mysql_reader.connect(self.run.spec.source) as conn:
            return dict(zip(values, weights_of(conn, route.weight, values)))


def _parent_schema(plan: CascadePlan, routes: dict[str, TableRoute], parent: str, columns: tuple[str, ...],
                   source) -> TableSchema | None:
    """A parent the stream does not copy, as far as its triggers are read: its referenced columns.
    Their types are taken from the copied children's foreign-key columns (InnoDB requires them to
    match: integers of one size and sign, decimals of one precision, strings of one character
    set), as of the checkpoint — the parent may have been renamed or dropped since (a catch-up
    far behind). Read from the server only when no copied child has them (a chain's middle)."""
    found = {}
    for key in plan.keys:
        route = routes.get(key.child)
        if key.parent != parent or route is None:
            continue
        for column, referenced in zip(key.columns, key.referenced):
            if referenced not in found and column in route.names:
                found[referenced] = dataclasses.replace(route.schema.column(column), name=referenced)
    database, name = parent.split(".", 1)
    if all(c in found for c in columns):
        return TableSchema(database, name, tuple(found[c] for c in columns), tuple(columns))
    with mysql_reader.connect(source) as conn:
        try:
            return read_table_schema(conn, database, name)
        except TableNotFound:
            return None  # dropped since, and no copy tells its columns: no row of it cascades into a copy


def _rows(route: TableRoute, changes: list[Change], weights: dict) -> list[tuple]:
    """The rows a batch of cascaded changes writes: (row, version, deleted flag, deleted at) per
    place of the copy, the last change of each place kept; a row whose key or place changed
    leaves a tombstone of its old values. A copy that keeps deletes keeps a cascaded delete live,
    marked with its commit time."""
    weight_at = route.names.index(route.weight.name) if route.weight is not None else None
    final: dict = {}
    place_of = route.place_getter  # a value (one column) or a tuple: compared, not unpacked
    for change in changes:
        before, after = change.before, change.after
        old = place_of(before)
        if after is None:
            final[old] = (before, change.version, 0, change.at) if route.keep else (before, change.version, 1, 0)
            continue
        if weight_at is not None and after[weight_at] != before[weight_at]:
            after = after[:-1] + (weights[after[weight_at]],)
        new = place_of(after)
        if new != old:
            final[old] = (before, change.version, 1, 0)
        final[new] = (after, change.version, 0, 0)
    return list(final.values())


def _refuse_shapes(plan: CascadePlan, routes: dict[str, TableRoute]) -> None:
    """Shaped copies a cascade cannot keep exact are refused by name, before anything is read:
    a transformed foreign-key column (the copy holds no value to find or set), a row filter that
    reads a foreign-key column a cascade changes (rows would have to enter the copy from
    nowhere), and a filtered table in the middle of a chain (its filtered-out rows cascade too)."""
    for key in plan.keys:
        route = routes.get(key.child)
        if route is None:
            continue
        where = f"table {key.child}, foreign key {key.describe()}"
        transformed = [m.name for m in route.mappings if m.transform is not None and m.name in key.columns]
        missing = [c for c in key.columns if c not in route.names]
        if missing:
            raise BinlogError(f"{where}: the copy leaves out column(s) {missing}, which a cascade changes; copy them "
                              "(a retry stops here again)")
        if transformed:
            raise BinlogError(f"{where}: column(s) {transformed} are transformed in the copy, so the rows a cascade "
                              "changes cannot be found in it or given their new values; leave them untransformed "
                              "or copy the table without following its foreign keys (a retry stops here again)")
        updates = key.on_update in ("CASCADE", "SET NULL") or key.on_delete == "SET NULL"
        read = sorted(set(route.row_filter.columns) & set(key.columns)) if route.row_filter is not None else []
        if updates and read:
            raise BinlogError(f"{where}: the copy's row filter reads {read}, "
                              "which a cascade changes without a binlog event, so rows could enter the copy that it "
                              "never held; filter on other columns (a retry stops here again)")
        if key.child in plan.parents and route.row_filter is not None:
            raise BinlogError(f"{where}: {key.child} is filtered, and its rows cascade further "
                              f"({', '.join(k.describe() for k in plan.keys if k.parent == key.child)}): the rows its "
                              "filter leaves out would be missed; copy it without a filter (a retry stops here again)")
        referenced = plan.parents.get(key.child, ())
        shaped = [m.name for m in route.mappings if m.transform is not None and m.name in referenced]
        if shaped:
            raise BinlogError(f"{where}: {key.child}'s column(s) {shaped} are referenced by other foreign keys and "
                              "transformed in its copy, so its cascades cannot be followed further; leave them "
                              "untransformed (a retry stops here again)")

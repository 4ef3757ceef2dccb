"""The applier's side of DDL: follow a statement (core/cdc/ddl.py says what it means), re-copy
a table whose values changed without row events, tombstone a truncated one, let go of a
dropped one.

What the applier learns of a table between runs is in its :class:`PipelineTable` (the
pipeline state, written with every checkpoint): its shape at the checkpoint (so a run
resuming far behind decodes with the shape of that position, not the source's current one),
``skip_before`` (changes ranked below it are covered by a re-copy), ``recopying`` and ``left``.
Following a DDL is idempotent: the checkpoint passes a statement only once it is followed, so an
applier killed half-way follows it again (core/cdc/binlog/, core/cdc/alter.py, follow_alter here).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor

from airflow_sync_provider.core.cdc import alter, ddl
from airflow_sync_provider.core.cdc.alter import Sibling, nullable_type
from airflow_sync_provider.core.cdc.binlog.routes import TableRoute
from airflow_sync_provider.core.cdc.checkpoints import Checkpoints
from airflow_sync_provider.core.cdc.chunks import ChunkKey, streaming_problem
from airflow_sync_provider.core.cdc.tables import PipelineTable
from airflow_sync_provider.core.clickhouse import multisets, repairs
from airflow_sync_provider.core.clickhouse.client import shared_client
from airflow_sync_provider.core.clickhouse.columns import DELETED_COLUMN, INTERNAL_COLUMNS, SIGN_COLUMN
from airflow_sync_provider.core.clickhouse.ddl import create_multiset_sql, create_working, private_name
from airflow_sync_provider.core.clickhouse.derived import after_change
from airflow_sync_provider.core.clickhouse.described import (
    check_layout,
    column_types,
    copy_key,
    copy_layout,
    relaid,
    relay_comment,
    resolve_layout,
    swapped_in,
    table_exists,
    table_facts,
    working_marker,
)
from airflow_sync_provider.core.clickhouse.history import HistoryTable, refuse_unwritten
from airflow_sync_provider.core.clickhouse.publishing import publish_working
from airflow_sync_provider.core.crash_points import crash_point
from airflow_sync_provider.core.jobspec import CdcBootstrapSpec, bootstrap_load_key, copied_schema
from airflow_sync_provider.core.ledger import Ledger
from airflow_sync_provider.core.positions import BinlogError, BinlogPosition, TransientBinlogError, current_position
from airflow_sync_provider.core.selection import TableSet, table_config
from airflow_sync_provider.core.source import reader as mysql_reader
from airflow_sync_provider.core.source.group import Member, member_config, member_filter, part_pipeline
from airflow_sync_provider.core.source.schema import TableNotFound, TableSchema
from airflow_sync_provider.core.source.weights import SPLIT_WEIGHT_COLUMN, needs_weight
from airflow_sync_provider.core.sql import ch_ident, ch_table
from airflow_sync_provider.core.typemap import map_column
from airflow_sync_provider.spark import cdc_bootstrap
from airflow_sync_provider.spark.cdc_run import DdlRun

log = logging.getLogger(__name__)


def note(pipeline: str, text: str) -> None:
    """A line of the pipeline's log."""
    log.info(f"pipeline {pipeline!r}: {text}")


def route_for(conn, ch, table: PipelineTable, salt: bytes, facts: dict | None = None) -> TableRoute:
    """The route of a pipeline table: the shape it had at the checkpoint (the source's current
    definition the first time), the copy's key, and the weight column of a collated split key.
    ``facts``: the copies' (core/clickhouse/clickhouse.table_facts), when read for many tables at once;
    ``salt``: the job's, for the table's hash transforms (core/content/)."""
    database, name = table.target_database, table.writes_to
    facts = (table_facts(ch, [(database, name)]) if facts is None else facts).get((database, name))
    if facts is None:
        raise BinlogError(f"table {table.name}: its target {database}.{name} does not exist; a full load "
                          "creates it (start the pipeline from one, or bootstrap the table again)")
    check_layout(ch, database, name, facts.comment)
    present = set(facts.columns)
    # what the copy holds (core/content/) is what its comment says, whoever made it (a load, a bootstrap)
    table.content = facts.content or None
    schema = table.schema()
    if schema is None:  # the stream writes a copy's history (spark/cdc_history.py)
        schema = copied_schema(conn, table.copy_spec(), salt, writer="cdc")
        schema = schema.select([c.name for c in schema.columns if c.name in present])
        table.remember_shape(schema)
    else:
        schema = schema.shaped(table.content, salt, writer="cdc")
    route = TableRoute(schema, database, name, table, skip_before=table.skip_before,
                       multiset=SIGN_COLUMN in present, history=HistoryTable.of_facts(facts, schema, database, name))
    if route.row_filter is not None:  # what exact string comparison needs from the server (core/content/)
        route.row_filter = route.row_filter.prepare(conn)
    # the copy's key (a later key change is refused) and the columns its layout places rows by
    place, route.partitioned = facts.layout.place_columns(route.names), bool(facts.layout.partition_by)
    if (table.recopying or {}).get("also"):  # a reshape: the old copy takes the same rows until the swap
        old = table_facts(ch, [(database, table.target_table)]).get((database, table.target_table))
        if old is not None:  # rows placed by both layouts' columns: a tombstone too many is harmless in either
            route.also = (database, table.target_table)
            place += [c for c in old.layout.place_columns(route.names) if c not in place]
            route.partitioned = route.partitioned or bool(old.layout.partition_by)
    route.keyed(facts.key, place)
    if SPLIT_WEIGHT_COLUMN in present and table.split_column:
        route.weight = schema.column(table.split_column)
    return route


def open_routes(conn, ch, tables: list[PipelineTable], salt: bytes) -> dict[str, TableRoute]:
    """The routes of the tables still streaming (those that left stay in ``tables``); their
    copies looked at together (a run's fixed cost does not grow by queries per table)."""
    streaming = [t for t in tables if not t.left]
    facts = table_facts(ch, [(t.target_database, t.writes_to) for t in streaming])
    routes = {}
    for table in streaming:
        try:
            routes[table.name] = route_for(conn, ch, table, salt, facts)
        except TableNotFound as exc:
            raise BinlogError(f"table {table.name}: {exc}") from exc
    return routes


def _create_copy(ch, schema: TableSchema, table: PipelineTable, name: str) -> None:
    """A new copy ``name`` of ``table`` in the layout of ``schema``, split (chunked) on its key's first column."""
    names = ChunkKey.of(schema).names
    key = names[0] if names else None  # a table without a key is one snapshot (a multiset)
    ch.command(f"CREATE DATABASE IF NOT EXISTS {ch_ident(table.target_database)}")
    # the layout its entry asks for (a reshape's); else a re-keyed copy keeps the copy's
    layout = resolve_layout(ch, table.target_database, table.target_table, table.layout, reshape=True)
    # marked as a working table: publish_working's swap of it is idempotent
    if key is None:  # a table without a key: a multiset (docs/keyless-tables.md), swapped in as a working table
        ch.command(create_multiset_sql(schema, table.target_database, name, layout, working_marker(name)))
    else:
        create_working(ch, schema, table.target_database, name, weight=needs_weight(schema.column(key)),
                              direct=True, layout=layout)
    table.split_column = key


def _rekeyed(ch, schema: TableSchema, table: PipelineTable) -> bool:
    """Is the copy ordered by another key than ``schema``'s primary key (other columns, or a key
    column of another type)?"""
    database, name = table.target_database, table.target_table
    if copy_key(ch, database, name) != list(schema.target_key):
        return True
    present, wanted = column_types(ch, database, name), {m.name: m.ch_type for m in schema.mappings()}
    return any(present.get(k) != wanted[k] for k in schema.primary_key)


def _relaid(ch, table: PipelineTable) -> bool:
    """Is the table asked for another layout than its copy has (a reshape: CdcApplySpec.reshape)?
    Never a merged copy's member: the copy holds every source's tables, and is laid out anew by a
    group load (core/clickhouse/layout.reshape_refused); a member writes under the copy's layout."""
    return not table.member and relaid(ch, table.target_database, table.target_table, table.layout)


def align_target(ch, schema: TableSchema, database: str, table: str) -> None:
    """Give the copy exactly the columns of ``schema`` (before a re-copy fills them); a merged
    copy (``schema`` a member's view) only gains the member's new columns: the other members'
    stay (core/cdc/alter.py decides when a column leaves it)."""
    present = {k: v for k, v in column_types(ch, database, table).items() if k not in INTERNAL_COLUMNS}
    name = ch_table(database, table)
    if member_filter(schema)[0] != "1":
        for mapping in schema.mappings():
            if mapping.name not in present:
                ch.command(f"ALTER TABLE {name} ADD COLUMN IF NOT EXISTS {ch_ident(mapping.name)} "
                           f"{nullable_type(mapping.ch_type)}")
        return
    wanted = {m.name: m.ch_type for m in schema.mappings()}
    for column in [c for c in present if c not in wanted]:
        ch.command(f"ALTER TABLE {name} DROP COLUMN {ch_ident(column)}")
    for column, ch_type in wanted.items():
        if column not in present:
            ch.command(f"ALTER TABLE {name} ADD COLUMN {ch_ident(column)} {ch_type}")
        elif present[column] != ch_type:  # (not a key column: Recopies re-keys those)
            ch.command(f"ALTER TABLE {name} DROP COLUMN {ch_ident(column)}")  # the re-copy fills it anew
            ch.command(f"ALTER TABLE {name} ADD COLUMN {ch_ident(column)} {ch_type}")


class Recopies:
    """Re-copies running beside the stream, one thread each: the pipeline's other tables (and
    this table's changes after the re-copy's position P) keep flowing while the chunks are read,
    as they do beside a bootstrap. A re-copy's state travels with the checkpoint (``recopying``
    in the table's entry, with ``skip_before`` already at P), so an applier that crashed resumes
    it after its last finished chunk. Only the driver's main thread touches the entries: a
    finished re-copy is recorded by :meth:`collect`.

    ``run``: the :class:`~airflow_sync_provider.spark.cdc_apply.PipelineRun` (spec, session,
    ClickHouse client, checkpoints)."""

    def __init__(self, run: DdlRun):
        self.run, self.spec = run, run.spec
        self.pool = ThreadPoolExecutor(max(1, self.spec.recopy_tables), thread_name_prefix="recopy")
        self.running: dict[str, tuple] = {}  # name → (table, future)

    def start(self, routes: dict, table: PipelineTable, reason: str) -> bool:
        """Re-copy a pipeline table in place with the bootstrap's chunks, at the source's position
        now and with its definition now (read on both sides of that position, so they are of the
        same moment); the table's older changes are skipped from then on (docs/cdc.md). Its route
        in ``routes`` takes the new shape at once; the copy is filled in the background. A table
        that cannot stream any more (e.g. its primary key dropped) leaves instead: False."""
        name, ch = table.name, self.run.ch
        refuse_unwritten(getattr(routes.get(name), "history", None), name, f"a re-copy ({reason[:200]})", "slice 3",
                         BinlogError)
        self.wait(name)
        note(self.spec.pipeline, f"{'re-' if table.shape else ''}copying {name}: {reason}")
        with mysql_reader.connect(self.spec.source) as conn:
            for _ in range(10):
                try:
                    before = copied_schema(conn, table.copy_spec(), self.spec.salt)
                except TableNotFound:  # dropped or renamed further on in the binlog: that DDL follows
                    routes.pop(name, None)
                    table.leave(f"not found when its copy was to begin ({reason[:200]})")
                    return False
                position = current_position(conn, epoch=self.run.epoch)
                if copied_schema(conn, table.copy_spec(), self.spec.salt) == before:
                    break
            else:
                raise TransientBinlogError(f"table {name}: its definition kept changing while a re-copy began; "
                                           "a retry may find it settled")
            problem = streaming_problem(before)
            if problem:
                routes.pop(name, None)
                table.leave(f"not streamable: {problem}", unstreamable=True)
                note(self.spec.pipeline,
                     f"{name} cannot be streamed and is left out (a copy it had is kept): {problem}")
                return False
            table.recopying = {"reason": reason[:500], "position": position.to_dict(), "started": time.time()}
            if not table_exists(ch, table.target_database, table.target_table):  # a new table
                _create_copy(ch, before, table, table.target_table)
            elif table.member and _rekeyed(ch, before, table):
                keyed = copy_key(ch, table.target_database, table.target_table)
                raise BinlogError(f"table {name} (a shard of the merged copy {table.target_database}."
                                  f"{table.target_table}): its primary key is now {list(before.primary_key)}, but the "
                                  f"merged copy is keyed by {keyed}; a merged copy has one key. A retry stops here "
                                  "again: make the change on every shard, then load the group again and bootstrap "
                                  "its pipeline")
            elif (rekeyed := _rekeyed(ch, before, table)) or _relaid(ch, table) or not before.primary_key:
                # (a multiset is re-copied beside its copy too: in place its rows would add up meanwhile)
                # ordered by another key or laid out otherwise: a new copy beside it, swapped in when done
                table.recopying["into"] = private_name(table.target_table, "rekey", self.spec.pipeline)
                split, columns = table.split_column, column_types(ch, table.target_database, table.target_table)
                ch.command(f"DROP TABLE IF EXISTS {ch_table(table.target_database, table.writes_to)}")
                _create_copy(ch, before, table, table.writes_to)
                # a reshape keeps the old copy current until the swap when the stream's rows fit both:
                # the same columns (a change the binlog has not reached yet may differ) and key, and
                # weights, if any, of the same column
                table.recopying["also"] = not rekeyed and columns == column_types(
                    ch, table.target_database, table.writes_to) and (
                    SPLIT_WEIGHT_COLUMN not in columns or split == table.split_column)
                note(self.spec.pipeline, f"{name}: " + (f"its primary key is now {list(before.primary_key)}"
                                                        if rekeyed else
                                                        f"laid out as {table.layout.describe()}")
                     + f"; copied into {table.target_database}.{table.writes_to}, swapped in when done (readers see "
                     + ("the old copy, kept current, until then)" if table.recopying["also"] else
                        "the copy as it was until then)"))
            else:
                align_target(ch, before, table.target_database, table.target_table)
            table.remember_shape(before)
            table.skip_before = position.version()
            table.rejoin()
            routes[name] = route_for(conn, ch, table, self.spec.salt)
        self._submit(table, restart=True)
        return True

    def adopt(self, routes: dict, tables: list[PipelineTable], name: str, why: str) -> bool:
        """A table the pipeline's patterns select joins it: copied beside the stream, or, when CDC
        cannot stream it, named with the reason (in the pipeline state and its log)."""
        table = PipelineTable.of(selected_config(self.spec, self.run.selection, name))
        table.by_selection = True
        with mysql_reader.connect(self.spec.source) as conn:
            try:
                problem = streaming_problem(copied_schema(conn, table.copy_spec(), self.spec.salt))
            except TableNotFound:
                return False  # gone again further on in the binlog: its DROP or RENAME follows
        tables.append(table)
        if problem:
            table.leave(f"not streamable: {problem}", unstreamable=True)
            note(self.spec.pipeline, f"{name} ({why}) cannot be streamed and stays out: {problem}")
            return False
        return self.start(routes, table, why)

    def resume(self, tables: list[PipelineTable]) -> None:
        """Re-copies a crashed applier left unfinished: resumed after their last finished chunk."""
        for table in tables:
            if table.recopying and not table.left and table.name not in self.running:
                note(self.spec.pipeline, f"resuming the re-copy of {table.name} ({table.recopying['reason']})")
                self._submit(table, restart=False)

    def settle(self, tables: list[PipelineTable]) -> None:
        """Re-copies under a new key whose copy was swapped in by an applier that died before
        recording it: recorded now (before any route would look for the copy swapped away)."""
        for table in tables:
            into = (table.recopying or {}).get("into")
            if into and swapped_in(self.run.ch, table.target_database, into, table.target_database,
                                          table.target_table):
                done = Future()
                done.set_result(cdc_bootstrap.copied_rows(self.run.loads, self.spec.pipeline, table.copy_spec()))
                self.running[table.name] = (table, done)
                self.collect()

    def _submit(self, table: PipelineTable, restart: bool) -> None:
        position = BinlogPosition.from_dict(table.recopying["position"])
        self.running[table.name] = (table, self.pool.submit(self._copy, table.copy_spec(), position, restart))

    def _copy(self, table: dict, position: BinlogPosition, restart: bool) -> dict:
        spec = self.spec
        ch = shared_client(spec.target)  # a client of the thread's own
        ledger = Ledger(ch, spec.ledger_database)
        if not restart:  # the re-copy's load in the ledger: resume it, unless it is an older copy's
            state = ledger.state(bootstrap_load_key(spec.pipeline, table))
            restart = state is None or BinlogPosition.from_dict(state.start_position).key() < position.key()
        bootstrap = CdcBootstrapSpec(sources=spec.sources, target=spec.target, pipeline=spec.pipeline,
                                     tableset=TableSet(tables=[table]), channels=spec.recopy_channels, restart=restart,
                                     recopy=True, channel_record_speed=spec.recopy_record_speed,
                                     driver_copy_rows=spec.driver_copy_rows, ledger_database=spec.ledger_database)
        checkpoints = Checkpoints(ch, spec.ledger_database)
        checkpoints.lease = self.run.checkpoints.lease
        return cdc_bootstrap.bootstrap_table(bootstrap, self.run.session, ch, ledger, checkpoints,
                                             bootstrap.tableset.tables[0])

    def wait(self, name: str) -> bool:
        """Let ``name``'s running re-copy finish and record it (before a DDL on the table is followed)."""
        if name not in self.running:
            return False
        self.running[name][1].exception()
        return bool(self.collect())

    def busy(self, name: str) -> bool:
        return name in self.running

    def finished(self) -> bool:
        return any(future.done() for _, future in self.running.values())

    def collect(self) -> list[str]:
        """Record the re-copies that finished; a failed one fails the run (the next resumes it)."""
        done = []
        for name, (table, future) in list(self.running.items()):
            if not future.done():
                continue
            del self.running[name]
            try:
                result = future.result()
            except Exception as exc:
                raise TransientBinlogError(f"table {name}: its re-copy failed ({type(exc).__name__}: "
                                           f"{str(exc)[:500]}); run the pipeline again: it resumes the re-copy "
                                           "after its last finished chunk") from exc
            began = table.recopying
            if result.get("snapshot_position"):  # a multiset (a table without a key): its rows add up, so
                # the stream's changes before its one snapshot go (they are in it) and are not written again
                snapshot = BinlogPosition.from_dict(result["snapshot_position"])
                table.skip_before = max(table.skip_before, snapshot.version())
                route = self.run.stream.routes.get(name) if self.run.stream else None
                if route is not None:
                    route.skip_before = table.skip_before
                multisets.drop_before(self.run.ch, table.target_database, table.writes_to, snapshot)
            if began.get("into"):  # the copy under the new key replaces the old one, atomically
                with self.run.writing:  # not under a verification's look
                    publish_working(self.run.ch, table.target_database, began["into"],
                                           table.target_database, table.target_table)
                crash_point("cdc.rekey-swapped")
                route = self.run.stream.routes.get(name) if self.run.stream else None
                if route is not None:
                    route.target_table, route.also = table.target_table, None
            table.recopying = None
            # a chunk read before a cascade into the table may have landed after it was resolved
            self.run.replay_cascades(table, BinlogPosition.from_dict(began["position"]))
            table.recopies += 1
            table.last_recopy = {"reason": began["reason"], "position": began["position"], "rows": result["rows"],
                                 "seconds": round(time.time() - began["started"], 3)}
            if self.spec.verify_after_ddl:
                table.mark_due()
            note(self.spec.pipeline, f"{name} re-copied from {BinlogPosition.from_dict(began['position'])}: "
                                    f"{result['rows']:,} rows in {time.time() - began['started']:.1f} s")
            done.append(name)
        return done

    def close(self) -> None:
        """Wait for every running re-copy (none may write once the lease is let go)."""
        for _, future in self.running.values():
            future.exception()
        self.pool.shutdown()


def truncate(ch, route: TableRoute, after: BinlogPosition, at: int = 0) -> int:
    """A tombstone for every live row (a merged copy's: the member's), ranked between the changes
    before the TRUNCATE and after it; a copy that keeps deletes marks them deleted at ``at``, the
    TRUNCATE's commit time."""
    table = ch_table(route.target_database, route.target_table)
    if route.multiset:
        return multisets.empty(ch, route.target_database, route.target_table, route.names, after)
    mine, params = member_filter(route.schema)
    rows = int(ch.command(f"SELECT count() FROM {table} FINAL WHERE {ch_ident(DELETED_COLUMN)} = 0 AND {mine}",
                          parameters=params))
    repairs.tombstone_older(ch, route.target_database, route.target_table, after.snapshot_version(), mine, params,
                           at=at)
    return rows


def _collation(conn, table: PipelineTable) -> str | None:
    """The table's default collation (for columns the DDL gives none): tracked when known, else the source's."""
    if table.collation:
        return table.collation
    with conn.cursor() as cur:
        cur.execute("SELECT TABLE_COLLATION FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
                    (table.source_database, table.source_table))
        row = cur.fetchone()
    table.collation = row[0] if row else None
    return table.collation


def follow(run: DdlRun, routes: dict, tables: list[PipelineTable], statement: ddl.Statement, after: BinlogPosition,
           text: str, committed: int = 0) -> tuple[list[str], list[str]]:
    """Follow one DDL statement (``text``, parsed: ``statement``; ``committed``: its timestamp) at
    ``after`` (the position right after it) for the pipeline's tables: ``routes`` (name → route, updated in place) and
    ``tables`` (every table of the pipeline, including those that left). Returns the names of
    the tables it changed and of those it re-copies."""
    recopies, ch, pipeline = run.recopies, run.ch, run.spec.pipeline
    for name in {*statement.tables, *(n for pair in statement.renames for n in pair)}:
        recopies.wait(name)  # a table being re-copied has the shape the re-copy reads until it is done
    where_of = lambda name: f"table {name}, DDL at {after}: {text[:300]!r}"  # noqa: E731
    by_name = {t.name: t for t in tables}
    changed, recopied = [], []

    def current(name):  # a route the statement is not already covered for by a later re-copy
        route = routes.get(name)
        return route if route is not None and after.version() > route.skip_before else None

    left_out = by_name.get(statement.tables[0]) if statement.tables else None  # a table CDC could not stream
    if statement.kind == "alter" and left_out is not None and left_out.unstreamable:
        with mysql_reader.connect(run.spec.source) as conn:
            try:
                problem = streaming_problem(copied_schema(conn, left_out.copy_spec(), run.spec.salt))
            except TableNotFound:
                problem = "gone"  # dropped or renamed further on in the binlog
        if problem is None and recopies.start(routes, left_out, f"streamable since {after}"):
            changed.append(left_out.name)  # e.g. a primary key added: the table streams from now on
            recopied.append(left_out.name)
    elif statement.kind == "alter" and current(statement.tables[0]) is not None and statement.actions:
        name = statement.tables[0]
        route = routes[name]
        with mysql_reader.connect(run.spec.source) as conn:
            change = alter.Alter(conn, statement, list(route.schema.columns), list(route.schema.primary_key),
                                 where_of(name), _collation(conn, route.table))
            followed = follow_alter(run, route, change)
            route.table.remember_shape(dataclasses.replace(route.schema, columns=tuple(followed.columns), indexes=()))
            routes[name] = route_for(conn, ch, route.table, run.spec.salt)
        done = followed.copy + [f"UPDATE {r} (its rows)" for r in followed.rows]
        if done:
            note(pipeline, f"{name} follows {text[:200]!r}: " + "; ".join(done))
        if followed.recopy:
            if recopies.start(routes, route.table, followed.recopy):
                recopied.append(name)
        else:
            if run.spec.verify_after_ddl:
                route.table.mark_due()  # the pipeline checks the table against the source (cdc_verify.py)
        changed.append(name)
    elif statement.kind == "truncate":
        for name in statement.tables:
            if current(name) is not None:
                rows = truncate(ch, routes[name], after, committed)
                if run.spec.verify_after_ddl:
                    routes[name].table.mark_due()
                kept = "marked deleted at the source (on_delete='keep')" if routes[name].keep else "tombstoned"
                note(pipeline, f"{name} truncated at {after}: {rows:,} rows {kept}")
                changed.append(name)
    elif statement.kind == "drop":
        for name in statement.tables:
            if current(name) is not None:
                shard_removed(run, routes[name], after)
                _leave(pipeline, routes, by_name[name], f"dropped at {after}")
                changed.append(name)
    renames = list(statement.renames)
    if statement.kind == "create":
        renames = [("", statement.tables[0])]  # a table created under a name the pipeline follows
    for source, destination in renames:
        if source and current(source) is not None:
            shard_removed(run, routes[source], after)
            _leave(pipeline, routes, by_name[source], f"renamed to {destination} at {after}")
            changed.append(source)
        table = by_name.get(destination)
        # only the pipeline's stream takes in new tables (a joining table's replay sees its own alone)
        if table is None and tables is run.state.tables and run.selection is not None \
                and run.selection.matches(destination):
            if recopies.adopt(routes, tables, destination,
                              f"{'renamed from ' + source if source else 'created'} at {after}, selected by the "
                              "patterns"):
                changed.append(destination)
                recopied.append(destination)
        elif table is not None and destination not in routes:
            # another table now has the followed name (an online schema change's swap): copy it
            if recopies.start(routes, table, f"{source or 'a new table'} became {destination} at {after}"):
                recopied.append(destination)
            changed.append(destination)
    return changed, recopied


def selected_config(spec, selection, name: str) -> dict:
    """The entry of a table the pipeline's patterns select: its target by the selection, or, in a
    source group's pipeline with a merged copy, the merged copy as the table's member."""
    config = table_config(selection.config(name))
    group = spec.group
    if group and group.merged:
        database, _, table = name.partition(".")
        return member_config(group.merge_into, Member(group.source, database, table), config)
    return config


def siblings(run: DdlRun, table: PipelineTable) -> list[Sibling]:
    """The other members of ``table``'s merged copy as their pipelines last recorded them: this
    pipeline's other tables, and the tables of the group's other sources' pipelines."""
    copy = (table.target_database, table.target_table)
    entries = [t for t in run.state.tables if t is not table]
    group = run.spec.group
    for source in group.sources if group else ():
        if source != group.source:
            state = run.checkpoints.state(part_pipeline(group.pipeline, source))
            entries += state.tables if state is not None else []
    found = []
    for entry in entries:
        if entry.member and (entry.target_database, entry.target_table) == copy and not entry.left:
            schema = entry.schema()
            columns = {c.name: c for c in schema.columns if c.in_table} if schema is not None else {}
            found.append(Sibling(Member.of(entry.member).name, columns, entry.waiting))
    return found


def _drop_derived(ch, route: TableRoute, after: list) -> list[str]:
    """Before a followed schema change: drop the derived columns (JSON, typed geo) whose source
    column it drops, renames or retypes (core/clickhouse/derived.after_change), and record the layout
    without them in the copy's comment. Idempotent; returns the columns dropped."""
    database, table = route.target_database, route.target_table
    layout = copy_layout(ch, database, table)
    relaid, dropped = after_change(layout, route.schema.mappings(), after)
    for derived in dropped:
        ch.command(f"ALTER TABLE {ch_table(database, table)} DROP COLUMN IF EXISTS {ch_ident(derived.name)}")
    if relaid != layout:
        relay_comment(ch, database, table, relaid)
    return [d.name for d in dropped]


def follow_alter(run: DdlRun, route: TableRoute, change: alter.Alter) -> alter.Decision:
    """One ALTER TABLE on a followed table, decided by its copy's rule (core/cdc/alter.py: a table
    copied alone, or a shard of a merged copy) and carried out on the copy: its ALTER clauses,
    and a merged copy's one mutation of the shard's rows. A shard that must wait for the others
    stops here with its table waiting at the change (a retry stops here again).

    The checkpoint stays before the statement until it is followed, so an applier killed half-way
    follows it again: a copy of one table that already has the columns after it is left alone
    (a merged copy's clauses are idempotent)."""
    table, ch = route.table, run.ch
    copy = ch_table(route.target_database, route.target_table)
    present = {k: v for k, v in column_types(ch, route.target_database, route.target_table).items()
               if k not in INTERNAL_COLUMNS}
    if not table.member:
        decided = alter.decide(change, alter.OwnCopy(table.copy_spec()))
        # a derived column (JSON, typed geo) of a column the change drops, renames or retypes goes first
        for name in _drop_derived(ch, route, decided.columns):
            log.warning(f"table {table.name}: {change.where} drops, renames or retypes the column that the derived "
                        f"column {name!r} reads: {name!r} is dropped and left out of the copy's layout (a reshape "
                        "brings it back)")
        if decided.copy and present != {c.name: map_column(c, change.where).ch_type for c in decided.columns}:
            for clause in decided.copy:
                ch.command(f"ALTER TABLE {copy} {clause}")
        return decided
    try:
        decided = alter.decide(change, alter.MergedCopy(Member.of(table.member).name, present, siblings(run, table)))
    except alter.Waiting as waiting:
        table.waiting = waiting.change
        raise
    for clause in decided.copy:
        ch.command(f"ALTER TABLE {copy} {clause}")
    if decided.rows:
        mine, params = member_filter(dataclasses.replace(route.schema, columns=tuple(decided.columns)))
        ch.command(f"ALTER TABLE {copy} UPDATE {', '.join(decided.rows)} WHERE {mine}", parameters=params,
                   settings={"mutations_sync": 2})
    table.waiting = None
    return decided


def shard_rows_deleted(spec) -> bool:
    """Are the rows of a shard that leaves this group's merged copy deleted (else kept)?"""
    return spec.group is not None and spec.group.on_shard_removed == "delete"


def shard_removed(run: DdlRun, route: TableRoute, after: BinlogPosition) -> None:
    """A merged copy's member that leaves (its table dropped or renamed away): its rows are kept,
    or with ``on_shard_removed="delete"`` get tombstones ranked at the statement."""
    if route.table.member and shard_rows_deleted(run.spec):
        rows = truncate(run.ch, route, after)
        note(run.spec.pipeline, f"{route.table.name} left the merged copy {route.target_database}."
                                f"{route.target_table}: its {rows:,} rows deleted (on_shard_removed='delete')")


def _leave(pipeline: str, routes: dict, table: PipelineTable, why: str) -> None:
    routes.pop(table.name, None)
    table.leave(why)
    note(pipeline, f"{table.name} {why}: it leaves the pipeline; its copy {table.target_database}."
                  f"{table.target_table} is kept as it was")

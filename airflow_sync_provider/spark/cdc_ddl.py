"""The applier's side of DDL: follow a statement (core/cdc/ddl.py says what it means), re-copy
a table whose values changed without row events, tombstone a truncated one, let go of a
dropped one.

A pipeline table's config (its entry in the pipeline state, written with every checkpoint)
carries what the applier knows of it between runs: ``shape`` (its columns as copied at the
checkpoint, so a run resuming far behind decodes with the shape of that position, not the
source's current one), ``skip_before`` (changes ranked below it are covered by a re-copy) and
``left`` (why it no longer streams).
"""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor

from airflow_sync_provider.core.cdc import ddl
from airflow_sync_provider.core.cdc.binlog import TableRoute
from airflow_sync_provider.core.cdc.checkpoints import Checkpoints, PipelineTable
from airflow_sync_provider.core.cdc.chunks import ChunkKey, streaming_problem
from airflow_sync_provider.core.cdc.positions import BinlogError, BinlogPosition, current_position
from airflow_sync_provider.core.jobspec import (
    CdcApplySpec, CdcBootstrapSpec, bootstrap_load_key, copied_schema, table_config,
)
from airflow_sync_provider.core.ledger import Ledger
from airflow_sync_provider.core.source import reader as mysql_reader
from airflow_sync_provider.core.source.schema import TableSchema, TableNotFound
from airflow_sync_provider.core.source.selection import TableSelection
from airflow_sync_provider.core.sql import ch_ident, ch_table
from airflow_sync_provider.core.target import clickhouse as target
from airflow_sync_provider.core.target.shards import SPLIT_WEIGHT_COLUMN, needs_weight
from airflow_sync_provider.core.typemap import MySQLColumn


def _log(spec: CdcApplySpec, text: str) -> None:
    print(f"[airflow-sync] pipeline {spec.pipeline!r}: {text}", flush=True)


def name_of(config: dict) -> str:
    return f"{config['source_database']}.{config['source_table']}"


# what a table's config learns while it streams, carried from checkpoint to checkpoint
_LEARNED = ("shape", "key", "collation", "split_column", "skip_before", "left", "recopies", "last_recopy", "recopying",
            "verify_due", "verified", "verifications", "repaired")


def carried(config: dict, at_checkpoint: dict | None) -> dict:
    """``config`` (as registered) with what the checkpoint's copy of it learned since."""
    if not at_checkpoint:
        return config
    return config | {k: at_checkpoint[k] for k in _LEARNED if k in at_checkpoint}


def remember_shape(config: dict, schema: TableSchema) -> None:
    config.update(schema.shape())


def shape_of(config: dict) -> TableSchema | None:
    if not config.get("shape"):
        return None
    return TableSchema(config["source_database"], config["source_table"],
                       tuple(MySQLColumn(**c) for c in config["shape"]), tuple(config["key"]))


def route_for(conn, ch, config: dict) -> TableRoute:
    """The route of a pipeline table: the shape it had at the checkpoint (the source's current
    definition the first time), the copy's key, and the weight column of a collated split key."""
    database, name = config["target_database"], config["target_table"]
    if not target.table_exists(ch, database, name):
        raise BinlogError(f"table {name_of(config)}: its target {database}.{name} does not exist; a full load "
                          "creates it (start the pipeline from one)")
    target.check_layout(ch, database, name)
    present = set(target.column_types(ch, database, name))
    schema = shape_of(config)
    if schema is None:
        schema = copied_schema(conn, config)
        schema = schema.select([c.name for c in schema.columns if c.name in present])
        remember_shape(config, schema)
    route = TableRoute(schema, database, name, config, skip_before=config.get("skip_before", 0))
    route.key = target.sorting_key(ch, database, name)  # the copy's key (a later key change is refused)
    if SPLIT_WEIGHT_COLUMN in present and config.get("split_column"):
        route.weight = schema.column(config["split_column"])
    return route


def align_target(ch, schema: TableSchema, database: str, table: str) -> None:
    """Give the copy exactly the columns of ``schema`` (before a re-copy fills them)."""
    present = {k: v for k, v in target.column_types(ch, database, table).items() if k not in target.INTERNAL_COLUMNS}
    wanted = {m.name: m.ch_type for m in schema.mappings()}
    name = ch_table(database, table)
    for column in [c for c in present if c not in wanted]:
        ch.command(f"ALTER TABLE {name} DROP COLUMN {ch_ident(column)}")
    for column, ch_type in wanted.items():
        if column not in present:
            ch.command(f"ALTER TABLE {name} ADD COLUMN {ch_ident(column)} {ch_type}")
        elif present[column] != ch_type:
            if column in schema.primary_key:
                raise BinlogError(f"table {schema.qualified}: key column {column!r} is now {ch_type} in the copy's "
                                  f"terms (was {present[column]}); the copy is sorted by it. Re-bootstrap the table "
                                  "(restart=True)")
            ch.command(f"ALTER TABLE {name} DROP COLUMN {ch_ident(column)}")  # the re-copy fills it anew
            ch.command(f"ALTER TABLE {name} ADD COLUMN {ch_ident(column)} {ch_type}")


class Recopies:
    """Re-copies running beside the stream, one thread each: the pipeline's other tables (and
    this table's changes after the re-copy's position P) keep flowing while the chunks are read,
    as they do beside a bootstrap. A re-copy's state travels with the checkpoint (``recopying``
    in the table's config, with ``skip_before`` already at P), so an applier that crashed resumes
    it after its last finished chunk. Only the driver's main thread touches the configs: a
    finished re-copy is recorded by :meth:`collect`."""

    def __init__(self, spec: CdcApplySpec, session, checkpoints):
        self.spec, self.session, self.checkpoints = spec, session, checkpoints
        self.pool = ThreadPoolExecutor(max(1, spec.recopy_tables), thread_name_prefix="recopy")
        self.running: dict[str, tuple] = {}  # name → (config, future)

    def start(self, ch, routes: dict, config: dict, reason: str) -> bool:
        """Re-copy a pipeline table in place with the bootstrap's chunks, at the source's position
        now and with its definition now (read on both sides of that position, so they are of the
        same moment); the table's older changes are skipped from then on (docs/cdc.md). Its route
        in ``routes`` takes the new shape at once; the copy is filled in the background. A table
        that cannot stream any more (e.g. its primary key dropped) leaves instead: False."""
        name = name_of(config)
        self.wait(name)
        _log(self.spec, f"{'re-' if config.get('shape') else ''}copying {name}: {reason}")
        with mysql_reader.connect(self.spec.source) as conn:
            for _ in range(10):
                try:
                    before = copied_schema(conn, config)
                except TableNotFound:  # dropped or renamed further on in the binlog: that DDL follows
                    routes.pop(name, None)
                    config["left"] = f"not found when its copy was to begin ({reason[:200]})"
                    return False
                position = current_position(conn)
                if copied_schema(conn, config) == before:
                    break
            else:
                raise BinlogError(f"table {name}: its definition kept changing while a re-copy began")
            problem = streaming_problem(before)
            if problem:
                routes.pop(name, None)
                config["left"] = config["unstreamable"] = f"not streamable: {problem}"
                _log(self.spec, f"{name} cannot be streamed and is left out (a copy it had is kept): {problem}")
                return False
            if not target.table_exists(ch, config["target_database"], config["target_table"]):  # a new table
                key = ChunkKey.of(before).names[0]
                ch.command(f"CREATE DATABASE IF NOT EXISTS {ch_ident(config['target_database'])}")
                ch.command(target.create_table_sql(before, config["target_database"], config["target_table"],
                                                   weight=needs_weight(before.column(key))))
                config["split_column"] = key
            align_target(ch, before, config["target_database"], config["target_table"])
            remember_shape(config, before)
            config["skip_before"] = position.version()
            config.pop("left", None)
            config.pop("unstreamable", None)
            config["recopying"] = {"reason": reason[:500], "position": position.to_dict(), "started": time.time()}
            routes[name] = route_for(conn, ch, config)
        self._submit(config, restart=True)
        return True

    def adopt(self, ch, routes: dict, configs: list[dict], name: str, since: BinlogPosition, why: str) -> bool:
        """A table the pipeline's patterns select joins it: bootstrapped beside the stream, or,
        when CDC cannot stream it, named with the reason (in the pipeline state and its log)."""
        config = table_config(TableSelection.of(self.spec.select).config(name))
        with mysql_reader.connect(self.spec.source) as conn:
            try:
                problem = streaming_problem(copied_schema(conn, config))
            except TableNotFound:
                return False  # gone again further on in the binlog: its DROP or RENAME follows
        configs.append(config)
        if problem:
            config["left"] = config["unstreamable"] = f"not streamable: {problem}"
            _log(self.spec, f"{name} ({why}) cannot be streamed and stays out: {problem}")
        self.checkpoints.write_table(self.spec.pipeline, PipelineTable(dict(config), since, joined=True))
        return not problem and self.start(ch, routes, config, f"{why} at {since}")

    def resume(self, configs: list[dict]) -> None:
        """Re-copies a crashed applier left unfinished: resumed after their last finished chunk."""
        for config in configs:
            if config.get("recopying") and not config.get("left") and name_of(config) not in self.running:
                _log(self.spec, f"resuming the re-copy of {name_of(config)} ({config['recopying']['reason']})")
                self._submit(config, restart=False)

    def _submit(self, config: dict, restart: bool) -> None:
        table, position = table_config(config), BinlogPosition.from_dict(config["recopying"]["position"])
        self.running[name_of(config)] = (config, self.pool.submit(self._copy, table, position, restart))

    def _copy(self, table: dict, position: BinlogPosition, restart: bool) -> dict:
        from airflow_sync_provider.spark.cdc_bootstrap import bootstrap_table

        spec = self.spec
        ch = target.shared_client(spec.target)  # a client of the thread's own
        ledger = Ledger(ch, spec.ledger_database)
        if not restart:  # the re-copy's load in the ledger: resume it, unless it is an older copy's
            state = ledger.state(bootstrap_load_key(spec.pipeline, table))
            older = state is None or BinlogPosition.from_dict(state.start_position).key() < position.key()
            restart = older
        bootstrap = CdcBootstrapSpec(spec.source, spec.target, spec.pipeline, tables=[table],
                                     channels=spec.recopy_channels, restart=restart,
                                     channel_record_speed=spec.recopy_record_speed,
                                     driver_copy_rows=spec.driver_copy_rows, ledger_database=spec.ledger_database)
        checkpoints = Checkpoints(ch, spec.ledger_database)
        checkpoints.lease = self.checkpoints.lease
        return bootstrap_table(bootstrap, self.session, ch, ledger, checkpoints, bootstrap.tables[0])

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
        for name, (config, future) in list(self.running.items()):
            if not future.done():
                continue
            del self.running[name]
            try:
                result = future.result()
            except Exception as exc:
                raise BinlogError(f"table {name}: its re-copy failed ({type(exc).__name__}: {str(exc)[:500]}); run "
                                  "the pipeline again: it resumes the re-copy after its last finished chunk") from exc
            began = config.pop("recopying")
            config["recopies"] = config.get("recopies", 0) + 1
            config["last_recopy"] = {"reason": began["reason"], "position": began["position"], "rows": result["rows"],
                                     "seconds": round(time.time() - began["started"], 3)}
            config["verify_due"] = True
            _log(self.spec, f"{name} re-copied from {BinlogPosition.from_dict(began['position'])}: "
                            f"{result['rows']:,} rows in {time.time() - began['started']:.1f} s")
            done.append(name)
        return done

    def close(self) -> None:
        """Wait for every running re-copy (none may write once the lease is let go)."""
        for _, future in self.running.values():
            future.exception()
        self.pool.shutdown()


def truncate(ch, route: TableRoute, after: BinlogPosition) -> int:
    """A tombstone for every live row, ranked between the changes before the TRUNCATE and after it."""
    table = ch_table(route.target_database, route.target_table)
    rows = int(ch.command(f"SELECT count() FROM {table} FINAL WHERE {ch_ident(target.DELETED_COLUMN)} = 0"))
    target.tombstone_older(ch, route.target_database, route.target_table, after.snapshot_version())
    return rows


def _collation(conn, config: dict) -> str | None:
    """The table's default collation (for columns the DDL gives none): tracked in the shape when
    known, else the source's."""
    if config.get("collation"):
        return config["collation"]
    with conn.cursor() as cur:
        cur.execute("SELECT TABLE_COLLATION FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
                    (config["source_database"], config["source_table"]))
        row = cur.fetchone()
    config["collation"] = row[0] if row else None
    return config["collation"]


def follow(spec: CdcApplySpec, recopies: Recopies, ch, routes: dict, configs: list[dict], statement: str,
           schema: str, after: BinlogPosition) -> tuple[list[str], list[str]]:
    """Follow one DDL statement at ``after`` (the position right after it) for the pipeline's
    tables: ``routes`` (name → route, updated in place) and ``configs`` (every table of the
    pipeline, including those that left). Returns the names of the tables it changed."""
    parsed = ddl.parse(statement, schema)
    for name in {*parsed.tables, *(n for pair in parsed.renames for n in pair)}:
        recopies.wait(name)  # a table being re-copied has the shape the re-copy reads until it is done
    where_of = lambda name: f"table {name}, DDL at {after}: {statement[:300]!r}"  # noqa: E731
    by_name = {name_of(c): c for c in configs}
    changed, recopied = [], []

    def current(name):  # a route the statement is not already covered for by a later re-copy
        route = routes.get(name)
        return route if route is not None and after.version() > route.skip_before else None

    selection = TableSelection.of(spec.select)
    left_out = by_name.get(parsed.tables[0]) if parsed.tables else None  # a table CDC could not stream
    if parsed.kind == "alter" and left_out is not None and left_out.get("unstreamable"):
        with mysql_reader.connect(spec.source) as conn:
            try:
                problem = streaming_problem(copied_schema(conn, left_out))
            except TableNotFound:
                problem = "gone"  # dropped or renamed further on in the binlog
        if problem is None and recopies.start(ch, routes, left_out, f"streamable since {after}"):
            changed.append(parsed.tables[0])  # e.g. a primary key added: the table streams from now on
            recopied.append(parsed.tables[0])
    elif parsed.kind == "alter" and current(parsed.tables[0]) is not None and parsed.actions:
        name = parsed.tables[0]
        route = routes[name]
        with mysql_reader.connect(spec.source) as conn:
            followed = ddl.follow_alter(conn, ch, parsed, list(route.schema.columns), list(route.schema.primary_key),
                                        route.config, (route.target_database, route.target_table), where_of(name),
                                        _collation(conn, route.config))
        schema_after = dataclasses.replace(route.schema, columns=tuple(followed.columns), indexes=())
        remember_shape(route.config, schema_after)
        with mysql_reader.connect(spec.source) as conn:
            routes[name] = route_for(conn, ch, route.config)
        if followed.statements:
            _log(spec, f"{name} follows {statement[:200]!r}: " + "; ".join(followed.statements))
        if followed.recopy:
            if recopies.start(ch, routes, route.config, followed.recopy):
                recopied.append(name)
        if not followed.recopy:
            route.config["verify_due"] = True  # the pipeline checks the table against the source (cdc_verify.py)
        changed.append(name)
    elif parsed.kind == "truncate":
        for name in parsed.tables:
            if current(name) is not None:
                rows = truncate(ch, routes[name], after)
                routes[name].config["verify_due"] = True
                _log(spec, f"{name} truncated at {after}: {rows:,} rows tombstoned")
                changed.append(name)
    elif parsed.kind == "drop":
        for name in parsed.tables:
            if current(name) is not None:
                _leave(spec, routes, by_name[name], f"dropped at {after}")
                changed.append(name)
    renames = list(parsed.renames)
    if parsed.kind == "create":
        renames = [("", parsed.tables[0])]  # a table created under a name the pipeline follows
    for source, destination in renames:
        if source and current(source) is not None:
            _leave(spec, routes, by_name[source], f"renamed to {destination} at {after}")
            changed.append(source)
        config = by_name.get(destination)
        if config is None and selection is not None and selection.matches(destination):
            if recopies.adopt(ch, routes, configs, destination, after,
                              f"{'renamed from ' + source if source else 'created'}, selected by the patterns"):
                changed.append(destination)
                recopied.append(destination)
        elif config is not None and destination not in routes:
            # another table now has the followed name (an online schema change's swap): copy it
            if recopies.start(ch, routes, config, f"{source or 'a new table'} became {destination} at {after}"):
                recopied.append(destination)
            changed.append(destination)
    return changed, recopied


def _leave(spec: CdcApplySpec, routes: dict, config: dict, why: str) -> None:
    routes.pop(name_of(config), None)
    config["left"] = why
    _log(spec, f"{name_of(config)} {why}: it leaves the pipeline; its copy "
               f"{config['target_database']}.{config['target_table']} is kept as it was")


def open_routes(conn, ch, configs: list[dict]) -> dict[str, TableRoute]:
    """The routes of the tables still streaming (those that left stay in ``configs``)."""
    routes = {}
    for config in configs:
        if config.get("left"):
            continue
        try:
            routes[name_of(config)] = route_for(conn, ch, config)
        except TableNotFound as exc:
            raise BinlogError(f"table {name_of(config)}: {exc}") from exc
    return routes

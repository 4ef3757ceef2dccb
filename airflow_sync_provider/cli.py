"""``airflow-sync``: the ops command line (no Airflow needed).

  airflow-sync plan     --mysql-url mysql://user:pass@host:port/db --table NAME [--json]
  airflow-sync load     --mysql-url … --clickhouse-url http://user:pass@host:8123/ --table NAME [--load-key K]
  airflow-sync status   --load KEY [--json]
  airflow-sync reimport --load KEY --failed
  airflow-sync reconcile --load KEY [--checksum] [--json]   (exit 3 on a mismatch)
  airflow-sync diff --old DB.TABLE (--table DB.NAME | --new DB.TABLE) [--apply | --fail]
                                                                   (exit 3 on changes with --fail)
  airflow-sync cdc bootstrap --pipeline P --table DB.NAME …     (chunked snapshot under live writes)
  airflow-sync cdc apply  --pipeline P [--start-from-load KEY …]   (catch up to the source's position now)
  airflow-sync cdc run    --pipeline P [--max-seconds S]          (a long-running service)
  airflow-sync cdc status --pipeline P [--json]

Passwords may come from the environment instead: ``MYSQL_URL`` and ``CLICKHOUSE_URL`` are used
when the options are absent, so no password need appear on a command line. TLS and the other
connection settings are the URLs' query parameters (``?ssl_mode=VERIFY_IDENTITY&ssl_ca=/path/ca.pem``,
``https://…?ca_cert=/path/ca.pem``): docs/connections.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

from airflow_sync_provider.core.cdc.checkpoints import PIPELINE_RUNNING, PIPELINE_STOPPED, Checkpoints
from airflow_sync_provider.core.cdc.positions import current_position
from airflow_sync_provider.core.cdc.servers import Server, reached, server_of, source_epoch
from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
from airflow_sync_provider.core.failures import WAIT_SECONDS
from airflow_sync_provider.core.jobspec import (
    DEFAULT_CHUNK_ROWS,
    READERS,
    CdcApplySpec,
    CdcBootstrapSpec,
    FullLoadSpec,
    ReconcileSpec,
    SnapshotDiffSpec,
    reimport_group_spec,
    reimport_spec,
)
from airflow_sync_provider.core.ledger import DEFAULT_LEDGER_DATABASE, Ledger, check_counters
from airflow_sync_provider.core.source.group import Source, env_name, part_pipeline
from airflow_sync_provider.core.source.locks import lock_holder, lock_name
from airflow_sync_provider.core.source.planning import (
    DEFAULT_SPLIT_FACTOR,
    MIN_SHARD_ROWS,
    STRATEGIES,
    Plan,
    PlanError,
    SpeedLimits,
    plan_table,
)
from airflow_sync_provider.core.source.reader import connect
from airflow_sync_provider.core.source.schema import read_table_schema
from airflow_sync_provider.core.submission import spark_submit
from airflow_sync_provider.core.target import clickhouse as clickhouse_target
from airflow_sync_provider.core.tls import SourceRefused, private_dir
from airflow_sync_provider.core.verify.reconcile import FAILED, OK, SHAPE_MISMATCH
from airflow_sync_provider.core.verify.reports import (
    diff_summary,
    reconcile_table,
    shard_table,
    write_diff_report,
    write_report,
)

SPLIT_FACTOR_HELP = (f"shards per channel (default: {DEFAULT_SPLIT_FACTOR}, fewer when a shard would hold under "
                     f"{MIN_SHARD_ROWS:,} rows)")
DRIVER_COPY_ROWS_HELP = ("tables estimated at no more rows are copied by the driver's own channels, without executors "
                         "(default: 300,000 on a cluster, every table on a local master; 0: always executors)")


def _print_plan(plan: Plan) -> None:
    print(f"table {plan.database}.{plan.table}: split on {plan.split_column!r} via index {plan.index!r}, "
          f"strategy {plan.strategy}, {plan.channels} channel(s), {len(plan.shards)} shard(s)")
    print(f"{'id':>4}  {'est. rows':>10}  where / params")
    for shard in plan.shards:
        print(f"{shard.id:>4}  {shard.estimated_rows if shard.estimated_rows is not None else '?':>10}  "
              f"{shard.where}  {list(shard.params)}")
    for warning in plan.warnings:
        print(f"warning: {warning}")


def cmd_plan(args) -> int:
    endpoint = MySQLEndpoint.from_url(args.mysql_url)
    database = args.database or endpoint.database
    if not database:
        raise PlanError("no database: put it in the URL path (mysql://…/db) or pass --database")
    channels = args.channels if args.channels is not None or args.byte_speed or args.record_speed else 1
    speed = SpeedLimits(channels=channels, byte=args.byte_speed, record=args.record_speed,
                        channel_byte=args.channel_byte_speed, channel_record=args.channel_record_speed)
    with connect(endpoint) as conn:
        schema = read_table_schema(conn, database, args.table)
        plan = plan_table(conn, schema, speed=speed, split_column=args.split_column,
                          split_factor=args.split_factor, strategy=args.strategy)
    if args.json:
        print(plan.to_json(indent=2))
    else:
        _print_plan(plan)
    return 0


ERROR_CHARS = 1000  # a failed table's line on the terminal; the whole error is in the log file


def _log_file(args, what: str) -> str:
    """Where a job's whole output goes (``--log-file``, else a new file in ``$AIRFLOW_SYNC_LOG_DIR`` or
    this user's private temporary directory), created readable by its owner only."""
    path = getattr(args, "log_file", None)
    if not path:
        directory = os.environ.get("AIRFLOW_SYNC_LOG_DIR") or os.path.join(
            str(private_dir() or tempfile.mkdtemp(prefix="airflow-sync-")), "logs")
        os.makedirs(directory, mode=0o700, exist_ok=True)
        path = os.path.join(directory, f"{what.replace(' ', '-')}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.log")
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
    return path


def _run_job(spec, args, what: str) -> tuple[dict, str]:
    """spark-submit ``spec``: the driver's whole output (tracebacks included) goes to the log file,
    its one-line progress messages (``[airflow-sync] …``) also to stderr unless ``--json``; a
    table's failure is one such line, its traceback follows it in the log file only.
    Returns the job's result and the log file's path."""
    path = _log_file(args, what)
    if getattr(args, "failure_wait_seconds", None):
        spec.failure_wait_seconds = args.failure_wait_seconds
    with open(path, "a", encoding="utf-8") as log:
        def line(text: str) -> None:
            log.write(text + "\n")
            log.flush()
            # one-line progress messages; not the per-table rows a job of many prints at its end
            # (spark/tables.py), which this command sums up itself
            if not args.json and text.startswith("[airflow-sync]") and not text.startswith("[airflow-sync]   "):
                print(text, file=sys.stderr, flush=True)

        result = spark_submit(spec, master=args.master, line=line)
    return result, path


def _one_line(text) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= ERROR_CHARS else text[:ERROR_CHARS] + " … (the whole error is in the log file)"


def _report_failure(what: str, result: dict, log_path: str, hint: str = "") -> None:
    """A failed job on stderr: one line per failed table (or one for the job), where the log is."""
    failed = [t for t in result.get("tables") or [] if t.get("status") == "failed"]
    if failed:
        others = " (the others succeeded)" if len(failed) < len(result["tables"]) else ""
        print(f"airflow-sync: {what} failed for {len(failed)} of {len(result['tables'])} table(s){others}{hint}:",
              file=sys.stderr)
        for table in failed:
            print(f"airflow-sync:   {table['table']}: {_one_line(table['error'])}", file=sys.stderr)
    else:
        print(f"airflow-sync: {what} failed: {_one_line(result.get('error'))}", file=sys.stderr)
    print(f"airflow-sync: the job's whole output, tracebacks included: {log_path}", file=sys.stderr)


def _submit(spec, args, what: str, done, hint: str = "") -> int:
    """spark-submit ``spec``; print the result as JSON or ``done(result)``'s line (or the error)."""
    result, log_path = _run_job(spec, args, what)
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    elif result.get("status") == "success":
        print(done(result))
    if result.get("status") != "success":
        _report_failure(what, result, log_path, hint)
    return 0 if result.get("status") == "success" else 1


def _loaded(r: dict) -> str:
    name = r.get("member") or (f"{r['source']}:{r['table']}" if r.get("source") else r["table"])
    if r.get("skipped"):
        return (f"skipped {name} → {r['target']}: {r['rows']:,} rows, published by this load's earlier run "
                f"(generation {r['generation']}); load key {r['load_key']!r}")
    return (f"loaded {name} → {r['target']}: {r['rows']:,} rows, {r['shards']} shards ({r['shards_read']} read "
            f"now), {r['seconds']:.1f} s; load key {r['load_key']!r}")


def _run_load(spec: FullLoadSpec, args) -> int:
    hint = (f"; run the same command again to go on: the tables published are skipped (load key {spec.load_key!r})"
            if (spec.select or spec.tables) and not spec.merge_into else
            f"; run the same command again to go on (load key {spec.load_key!r})" if spec.merge_into else "")
    return _submit(spec, args, "load", lambda r: "\n".join(
        [_loaded(t) for t in r["tables"]] + [f"{len(r['tables'])} table(s), {sum(t['rows'] for t in r['tables']):,} "
                                            f"rows in {r['seconds']:.1f} s"]) if "tables" in r else _loaded(r), hint)


def _pattern_key(select: dict) -> str:
    """A pattern load's default key, from its selection: running the same command again after it
    failed goes on with it (published tables skipped); after it finished, copies afresh."""
    key = "+".join(select["databases"])
    if select["tables"] != ["*"]:
        key += "[" + ",".join(select["tables"]) + "]"
    if select["exclude_tables"]:
        key += "-[" + ",".join(select["exclude_tables"]) + "]"
    return f"{key}->{select['target_database']}"


def _many(args, source: MySQLEndpoint) -> dict | None:
    """A command's tables by pattern (--select-table / --exclude-table, or no --table): the selection."""
    if getattr(args, "table", None) and not (args.select_table or args.exclude_table):
        return None
    databases = args.database or ([source.database] if source.database else [])
    if not databases:
        raise SystemExit("select tables with --database (pattern; repeat) or put the database in the MySQL URL")
    return {"databases": databases, "tables": args.select_table or ["*"], "exclude_tables": args.exclude_table or [],
            "target_database": args.target_database or "{database}"}


def _one_database(args, source: MySQLEndpoint) -> str:
    if args.database and len(args.database) > 1:
        raise SystemExit("one --database with --table (several select tables by pattern)")
    return (args.database or [source.database])[0]


def _sources(args) -> list[Source]:
    """``--source NAME`` (repeat): a source group, each source's URL from ``$MYSQL_URL_<NAME>`` (the
    name upper-cased, other characters as ``_``), so no password is on a command line."""
    sources = []
    for name in getattr(args, "source", None) or []:
        variable = env_name(name)
        if not os.environ.get(variable):
            raise SystemExit(f"airflow-sync: --source {name}: set ${variable} to its mysql://user:pass@host:port/ URL")
        sources.append(Source(name, MySQLEndpoint.from_url(os.environ[variable])))
    if getattr(args, "merge_into", None) and not sources:
        raise SystemExit("airflow-sync: --merge-into merges the tables of a source group: name the sources with "
                         "--source NAME (repeat)")
    return sources


def _group_tables(args) -> list[str]:
    """A group's ``--table`` (one database): the same table on every source."""
    if not getattr(args, "table", None):
        return []
    if "." in args.table:
        return [args.table]
    if not args.database or len(args.database) != 1:
        raise SystemExit("airflow-sync: with --source, give --table as db.table or with one --database")
    return [f"{args.database[0]}.{args.table}"]


def _group_select(args) -> dict | None:
    if getattr(args, "table", None) and not (args.select_table or args.exclude_table):
        return None
    if not args.database:
        raise SystemExit("airflow-sync: with --source, select tables with --database (pattern; repeat) "
                         "[--select-table …] or name one with --table db.table")
    return {"databases": args.database, "tables": args.select_table or ["*"],
            "exclude_tables": args.exclude_table or [],
            **({"target_database": args.target_database} if args.target_database else {})}


def _group_load(args, sources: list[Source], target: ClickHouseEndpoint) -> FullLoadSpec:
    return FullLoadSpec(
        source=None, target=target, source_database="", source_table="", target_database="", target_table="",
        sources=sources, merge_into=args.merge_into or "", select=_group_select(args), tables=_group_tables(args),
        parallel_tables=args.parallel_tables, load_key=args.load_key or "", channels=args.channels,
        columns=args.column, exclude_columns=args.exclude_column or [], split_column=args.split_column,
        split_factor=args.split_factor, strategy=args.strategy, channel_record_speed=args.channel_record_speed,
        channel_byte_speed=args.channel_byte_speed, ledger_database=args.ledger_database, reader=args.reader,
        driver_copy_rows=args.driver_copy_rows)


def cmd_load(args) -> int:
    target = ClickHouseEndpoint.from_url(args.clickhouse_url)
    sources = _sources(args)
    if sources:
        return _run_load(_group_load(args, sources, target), args)
    source = MySQLEndpoint.from_url(args.mysql_url)
    select = _many(args, source)
    database = "" if select else _one_database(args, source)
    table = "" if select else args.table
    spec = FullLoadSpec(
        source=source, target=target, source_database=database, source_table=table, select=select,
        parallel_tables=args.parallel_tables,
        target_database="" if select else args.target_database or (
            target.database if target.database != "default" else database),
        target_table="" if select else args.target_table or table,
        load_key=args.load_key or (_pattern_key(select) if select else ""), channels=args.channels,
        columns=args.column, exclude_columns=args.exclude_column or [],
        split_column=args.split_column, split_factor=args.split_factor, strategy=args.strategy,
        channel_record_speed=args.channel_record_speed, channel_byte_speed=args.channel_byte_speed,
        ledger_database=args.ledger_database, reader=args.reader, driver_copy_rows=args.driver_copy_rows)
    return _run_load(spec, args)


def cmd_reimport(args) -> int:
    target = ClickHouseEndpoint.from_url(args.clickhouse_url)
    ch = clickhouse_target.client(target)
    try:
        ledger = Ledger(ch, args.ledger_database)
        state = ledger.state(args.load)
        members = ledger.load_set(args.load) if state is None else None
        first = ledger.state(members[0][0]) if members and members[0] else None
    finally:
        ch.close()
    if first is not None and first.spec.get("member"):  # a source group's merged copy: its members are the load set's
        member = first.spec["member"]
        return _run_load(reimport_group_spec(first.spec, _sources(args), target, args.load,
                                             [f"{member['database']}.{member['table']}"]), args)
    if state is None:
        raise LookupError(f"no load {args.load!r} in {args.ledger_database}")
    return _run_load(reimport_spec(state.spec, MySQLEndpoint.from_url(args.mysql_url), target), args)


def cmd_status(args) -> int:
    target = ClickHouseEndpoint.from_url(args.clickhouse_url)
    verdict, message, summary = check_counters(target, args.load, args.ledger_database)
    ch = clickhouse_target.client(target)
    try:
        ledger = Ledger(ch, args.ledger_database)
        state = ledger.state(args.load)
        found = ledger.load_set(args.load) if state is None else None
        tables = {key: ledger.state(key) for key in found[0]} if found else {}
    finally:
        ch.close()
    if state is None and found is not None:  # a load of many tables: each one's
        if args.json:
            print(json.dumps(summary | {"loads": {k: s.to_dict() if s else None for k, s in tables.items()}},
                             indent=2, default=str))
            return 0
        print(f"load {args.load!r}, {len(tables)} table(s) — {verdict}: {message}")
        for key, one in tables.items():
            print(f"  {key}: " + (f"generation {one.generation} {one.status}" if one else
                                  f"never recorded ({found[1].get(key, 'not run yet')})"))
        return 0
    if state is None:
        raise LookupError(f"no load {args.load!r} in {args.ledger_database}")
    if args.json:
        print(json.dumps(state.to_dict() | {"verdict": verdict, "message": message}, indent=2, default=str))
    else:
        print(f"load {state.load_key!r} generation {state.generation}: {state.status}"
              f"{' (stale: no heartbeat)' if state.stale else ''} — {verdict}: {message}")
        print(shard_table([vars(s) | {"seconds": s.seconds} for s in state.shards.values()]))
    return 0


def cmd_reconcile(args) -> int:
    sources = _sources(args)
    if sources:
        select = _group_select(args) if args.database else None
        if not args.merge_into and not select:
            raise SystemExit("airflow-sync: reconcile a group's merged copy with --merge-into (as loaded), or its "
                             "side-by-side copies with --database [--select-table …]")
        spec = ReconcileSpec(source=None, target=ClickHouseEndpoint.from_url(args.clickhouse_url),
                             load_key=args.load or "", checksum=args.checksum, reimport=args.reimport,
                             ledger_database=args.ledger_database, select=select,
                             parallel_tables=args.parallel_tables, sources=sources, merge_into=args.merge_into or "")
    else:
        source = MySQLEndpoint.from_url(args.mysql_url)
        select = _many(args, source) if args.database or args.select_table or args.exclude_table or not args.load \
            else None
        spec = ReconcileSpec(source=source, target=ClickHouseEndpoint.from_url(args.clickhouse_url),
                             load_key=args.load or "", checksum=args.checksum, reimport=args.reimport,
                             ledger_database=args.ledger_database, select=select,
                             parallel_tables=args.parallel_tables)
    result, log_path = _run_job(spec, args, "reconcile")
    if result.get("status") != "success":
        if args.json:
            print(json.dumps(result | {"verdict": result.get("verdict", FAILED)}, indent=2, default=str))
        _report_failure("reconcile", result, log_path)
        return 1
    tables = result["tables"] if "tables" in result else [result]
    for one in tables:
        one["report"] = write_report(one, args.report_dir)
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    else:
        for one in tables:
            if len(tables) > 1:
                print(f"{one.get('member') or one['table']} → {one['target']} (load {one['load_key']!r}):")
            if one["shards"]:
                print(reconcile_table(one["shards"]))
            for note in one["shape"]["notes"]:
                print(f"note: {note}")
            if one.get("before"):
                print(f"first pass: shards {one['before']['mismatched']} mismatched; re-imported "
                      f"{one['reimported']['rows']:,} rows into them")
            if one["verdict"] == SHAPE_MISMATCH:
                print(f"verdict: {SHAPE_MISMATCH}: {'; '.join(one['shape']['problems'])}; {one['remedy']}; "
                      f"report {one['report']}")
            else:
                print(f"verdict: {one['verdict']}; mismatched shards: {one['mismatched'] or 'none'}; "
                      f"report {one['report']}")
        if len(tables) > 1:
            print(f"verdict of the {len(tables)} tables: {result['verdict']}")
    return 0 if result["verdict"] == OK else 3


def cmd_diff(args) -> int:
    sources = _sources(args)
    if sources:  # a source group: its merged copy (--merge-into) or its side-by-side copies
        if args.old or args.new:
            raise SystemExit("airflow-sync: a group's diff compares its sources with their copies: give --merge-into "
                             "or --database [--select-table …], not --old/--new")
        select, tables, database, table = _group_select(args), _group_tables(args), "", ""
        if not (select or tables):
            raise SystemExit("airflow-sync: with --source, select tables with --database [--select-table …]")
    else:
        if not args.old and not (args.database or args.select_table):
            raise SystemExit("give --old with --table or --new (one table), or --database [--select-table …] (many)")
        select, tables = _many(args, MySQLEndpoint.from_url(args.mysql_url)) if not args.old else None, []
        database, _, table = (args.table or "").partition(".")
    on_change = "apply" if args.apply else "fail" if args.fail else "warn"
    tolerances = {}
    for item in args.tolerance or []:
        column, _, value = item.partition("=")
        tolerances[column] = float(value)
    spec = SnapshotDiffSpec(
        target=ClickHouseEndpoint.from_url(args.clickhouse_url), old_table=args.old or "", select=select,
        tables=tables, parallel_tables=args.parallel_tables, sources=sources, merge_into=args.merge_into or "",
        source=MySQLEndpoint.from_url(args.mysql_url) if not sources and (args.table or select) else None,
        source_database=database, source_table=table, new_table=args.new or "", key_columns=args.key or None,
        compare_columns=args.compare or None, ignore_columns=args.ignore or [], tolerances=tolerances,
        on_change=on_change, diff_key=args.diff_key or "", changes_table=args.changes_table or "",
        channels=args.channels, ledger_database=args.ledger_database, reader=args.reader)
    result, log_path = _run_job(spec, args, "diff")
    if result.get("status") != "success":
        if args.json:
            print(json.dumps(result, indent=2, default=str))
        _report_failure("diff", result, log_path)
        return 1
    tables = result["tables"] if "tables" in result else [result]
    for one in tables:
        one["report"] = write_diff_report(one, args.report_dir)
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    else:
        for one in tables:
            print(diff_summary(one))
            print(f"change set: {one['changes_table']} (diff_key {one['diff_key']!r}); report {one['report']}")
        if result.get("orphans"):
            print(f"in the copy but no longer selected (a re-load removes them): {', '.join(result['orphans'])}")
    return 3 if args.fail and any(one["verdict"] == "changed" for one in tables) else 0


def _cdc_spec(args, service: bool) -> CdcApplySpec:
    sources = _sources(args)
    return CdcApplySpec(source=None if sources else MySQLEndpoint.from_url(args.mysql_url),
                        sources=sources, merge_into=args.merge_into or "", placement=args.placement,
                        on_shard_removed=args.on_shard_removed,
                        target=ClickHouseEndpoint.from_url(args.clickhouse_url), pipeline=args.pipeline,
                        tables=_named_tables(args), select=_selection(args),
                        start_from_loads=args.start_from_load or [],
                        lanes=args.lanes, batch_events=args.batch_events, batch_bytes=args.batch_bytes,
                        driver_write_rows=args.driver_write_rows,
                        reset=args.reset, service=service, verify=args.verify,
                        verify_period=args.verify_every or args.verify_period, verify_budget=args.verify_budget,
                        verify_after_ddl=not args.no_verify_after_ddl, change_selection=args.change_selection,
                        on_binlog_lost=args.on_binlog_lost,
                        max_seconds=getattr(args, "max_seconds", None), batch_seconds=0.5 if service else 1.0,
                        ledger_database=args.ledger_database)


def _named_tables(args) -> list:
    """``--table db.name`` (repeat), each into ``--target-database`` when one is given."""
    bad = [t for t in args.table or [] if "." not in t]
    if bad:
        raise SystemExit(f"airflow-sync: --table {bad[0]}: give it as db.table")
    if not args.target_database:
        return list(args.table or [])
    return [{"source_database": t.partition(".")[0], "source_table": t.partition(".")[2],
             "target_database": args.target_database} for t in args.table or []]


def _selection(args) -> dict | None:
    if not args.database:
        if args.select_table or args.exclude_table:
            raise SystemExit("--select-table / --exclude-table need --database (the databases to select from)")
        return None
    return {"databases": args.database, "tables": args.select_table or ["*"],
            "exclude_tables": args.exclude_table or [], "target_database": args.target_database or "{database}"}


def _selection_arguments(parser, one: str = "") -> None:
    parser.add_argument("--database", action="append",
                        help=one or "select tables of these databases (pattern; repeat)")
    parser.add_argument("--select-table", action="append",
                        help="table name or db.table pattern (shell wildcards, or re:REGEX; repeat)")
    parser.add_argument("--exclude-table", action="append", help="pattern to leave out (repeat)")
    parser.add_argument("--target-database",
                        help="where the copies go (selected tables: {database} stands for the source's name)")
    parser.add_argument("--source", action="append", metavar="NAME",
                        help="a source group: this source (repeat), its URL in $MYSQL_URL_<NAME> (upper-cased, other "
                             "characters as _); the selection applies to every source")
    parser.add_argument("--merge-into", metavar="DB.TABLE",
                        help="with --source: every selected table of every source into this one table, keyed by the "
                             "primary key and _source, _source_database, _source_table (docs/source-groups.md)")
    if parser.prog.split()[-1] in ("load", "reconcile", "diff"):
        parser.add_argument("--parallel-tables", type=int, default=2, help="selected tables worked on at once")
    else:  # a pipeline keeps the patterns it was first given; other patterns are refused unless
        parser.add_argument("--change-selection", action="store_true",
                            help="replace the patterns the pipeline keeps with these")


def _applied(r: dict) -> str:
    if "sources" in r:  # a source group: a line per source's pipeline
        return "\n".join([f"{name}: " + _applied(one) for name, one in r["sources"].items()]
                         + [f"pipeline {r['pipeline']!r}: {r['events']:,} row changes from {len(r['sources'])} "
                            f"source(s), {r['seconds']:.1f} s"])
    return (f"pipeline {r['pipeline']!r}: {r['events']:,} row changes applied, checkpoint "
            f"{r['checkpoint']['file']}:{r['checkpoint']['pos']}, {r['seconds']:.1f} s"
            + (f"; {len(r['verified'])} table check(s), {r['repaired_shards']} shard(s) repaired" if r["verified"]
               else ""))


def cmd_cdc_apply(args) -> int:
    return _submit(_cdc_spec(args, service=args.cdc_command == "run"), args, f"cdc {args.cdc_command}", _applied)


def cmd_cdc_bootstrap(args) -> int:
    sources = _sources(args)
    spec = CdcBootstrapSpec(source=None if sources else MySQLEndpoint.from_url(args.mysql_url),
                            sources=sources, merge_into=args.merge_into or "",
                            target=ClickHouseEndpoint.from_url(args.clickhouse_url), pipeline=args.pipeline,
                            tables=_named_tables(args), select=_selection(args), channels=args.channels,
                            chunk_rows=args.chunk_rows,
                            watermark_table=args.watermark_table, restart=args.restart,
                            change_selection=args.change_selection,
                            ledger_database=args.ledger_database, driver_copy_rows=args.driver_copy_rows)
    return _submit(spec, args, "cdc bootstrap", _bootstrapped)


def _bootstrapped(r: dict) -> str:
    lines = [f"bootstrapped {(t['source'] + ':') if t.get('source') else ''}{t['table']} → {t['target']}: "
             f"{t['rows']:,} rows in {t['chunks']} chunks ({t['rows_read_now']:,} rows read now), {t['seconds']:.1f} s"
             for t in r["tables"]]
    if "sources" in r:  # a source group
        return "\n".join(lines + [f"pipeline {r['pipeline']!r}: {len(r['sources'])} source(s)"
                                  + (f" merged into {r['merge_into']}" if r["merge_into"] else "")
                                  + f"; `airflow-sync cdc apply --pipeline {r['pipeline']} --source …` catches it up"])
    return "\n".join(lines + [f"left out {name}: {why}" for name, why in r["unstreamable"].items()]
                     + [f"pipeline {r['pipeline']!r}: from {r['start_position']['file']}:{r['start_position']['pos']} "
                        f"to {r['end_position']['file']}:{r['end_position']['pos']}; `airflow-sync cdc apply "
                        f"--pipeline {r['pipeline']}` catches it up"])


def cmd_cdc_status(args) -> int:
    """A pipeline's status; a source group's: one line for the group, then every source's pipeline
    (its lag against the source when ``$MYSQL_URL_<NAME>`` is set)."""
    ch = clickhouse_target.client(ClickHouseEndpoint.from_url(args.clickhouse_url))
    try:
        checkpoints = Checkpoints(ch, args.ledger_database)
        checkpoints.ensure()
        group = checkpoints.group(args.pipeline)
        parts = {name: checkpoints.state(part_pipeline(args.pipeline, name)) for name in (group or {}).get("sources",
                                                                                                           [])}
    finally:
        ch.close()
    if group is None:
        return _pipeline_status(args)
    if not args.json:
        print(f"source group {args.pipeline!r}: {len(parts)} source(s)"
              + (f" merged into {group['merge_into']}" if group["merge_into"] else "") + "; "
              + ", ".join(f"{name}: {state.status if state else 'no state yet'}" for name, state in parts.items()))
    out = {}
    for name in parts:
        if not args.json:
            print(f"\n[{name}]")
        one = argparse.Namespace(**{**vars(args), "pipeline": part_pipeline(args.pipeline, name),
                                    "mysql_url": os.environ.get(env_name(name)),
                                    "json_into": out.setdefault(name, {}) if args.json else None})
        if parts[name] is not None:
            _pipeline_status(one)
    if args.json:
        lags = [o.get("lag_seconds") for o in out.values()]
        print(json.dumps({"pipeline": args.pipeline, "group": group, "sources": out,
                          "lag_seconds": max(lags) if lags and None not in lags else None}, indent=2, default=str))
    return 0


def _pipeline_status(args) -> int:
    ch = clickhouse_target.client(ClickHouseEndpoint.from_url(args.clickhouse_url))
    try:
        ledger = Checkpoints(ch, args.ledger_database)
        ledger.ensure()
        state = ledger.state(args.pipeline)
        if state is None:
            raise LookupError(f"no pipeline {args.pipeline!r} in {args.ledger_database}")
        counters = ledger.counters(args.pipeline)
        selection = ledger.selection(args.pipeline)
    finally:
        ch.close()
    status = state.to_dict() | {"counters": counters, "selection": selection}
    if args.mysql_url:  # lag against the source now, and whether the lease is held
        ch = clickhouse_target.client(ClickHouseEndpoint.from_url(args.clickhouse_url))
        try:
            with connect(MySQLEndpoint.from_url(args.mysql_url)) as conn:
                here = server_of(conn)
                now = current_position(conn, epoch=source_epoch(conn, ch, args.ledger_database))
                status["lease_connection"] = lock_holder(conn, lock_name(args.ledger_database, args.pipeline))
        finally:
            ch.close()
        moved = bool(state.server) and Server.from_dict(state.server).key != here.key
        behind = state.checkpoint is not None and not reached(state.checkpoint, now)
        lag = round(time.time() - state.source_time, 1) if behind and state.source_time else (None if behind else 0.0)
        status |= {"source_now": now.to_dict(), "source_server": here.to_dict(), "moved": moved,
                   "caught_up": not behind, "lag_seconds": lag,
                   "lag_bytes": (now.pos - state.checkpoint.pos if now.file == state.checkpoint.file
                                 and now.epoch == state.checkpoint.epoch else None) if behind else 0}
    if getattr(args, "json_into", None) is not None:  # a source group's, printed with the others
        args.json_into.update(status)
        return 0
    if args.json:
        print(json.dumps(status, indent=2, default=str))
        return 0
    gone = state.status == PIPELINE_RUNNING and "lease_connection" in status and status["lease_connection"] is None
    print(f"pipeline {state.pipeline!r}: {state.status}{' (stale: no heartbeat)' if state.stale else ''}"
          f"{' (its applier is gone: the lease is free, a new applier takes over at once)' if gone else ''}; "
          f"checkpoint {state.checkpoint}; {state.events:,} row changes applied")
    if state.generation:
        print(f"lease generation {state.generation}, held by {state.holder}" if state.status == PIPELINE_RUNNING
              and not gone else f"last applier: {state.holder} (lease generation {state.generation})")
    if state.server:
        print(f"source server: {Server.from_dict(state.server)}, "
              f"epoch {state.checkpoint.epoch if state.checkpoint else 0}")
    if "source_now" in status:
        if status["moved"]:
            print(f"the source is now {here}: the next run resumes there by GTID (core/cdc/servers.py)")
        elif state.ended_badly and not status["caught_up"]:  # no lag to speak of: nothing is applied
            print(f"source now {now}; {state.status}: nothing is applied until it runs again "
                  + (f"(last applied change {status['lag_seconds']} s old)" if status["lag_seconds"] else ""))
        else:
            print(f"source now {now}; " + ("caught up" if status["caught_up"] else
                                          f"behind by {status['lag_seconds']} s" + (
                                              f", {status['lag_bytes']:,} bytes" if status["lag_bytes"] else "")))
    if selection:
        print(f"tables selected by {json.dumps(selection)} (every run applies them; --change-selection replaces them)")
    if state.applying:
        print(state.applying_line())
    if state.prepared:
        staged = ", ".join(f"{xid} ({sum(rows.values()):,} rows)" for xid, rows in status["staged_xa"].items())
        print(f"{len(state.prepared)} XA transaction(s) prepared and not committed at the checkpoint (applied at "
              f"their XA COMMIT): {', '.join(sorted(state.prepared))}"
              + (f"; waiting in staging tables: {staged}" if staged else ""))
    if state.error:
        print(("stopped, a retry stops here again until the remedy is applied: " if state.status == PIPELINE_STOPPED
               else "last error: ") + state.error)
    for change in status["schema_changes"]:
        last, running = change.get("last_recopy"), change.get("recopying")
        if change.get("left"):
            print(f"{change['table']}: left the pipeline ({change['left']}), copy kept")
            continue
        if last:
            print(f"{change['table']}: re-copied {change['recopies']}x, last: {last['reason']} "
                  f"({last['rows']:,} rows in {last['seconds']} s)")
        if running:
            print(f"{change['table']}: re-copy under way for {time.time() - running['started']:.0f} s (other tables "
                  f"keep flowing): {running['reason']}")
    print(f"verification: {state.verification_line()}")
    for table in status["verification"]["tables"]:
        last = table["last"]
        if last:
            print(f"  {table['table']}: last verified at {last['position']['file']}:{last['position']['pos']} "
                  f"({time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(last['at']))} UTC), {last['shards']} shard(s), "
                  f"{len(last['mismatched'])} mismatched, {table['repaired_shards']} repaired in total"
                  + (f"; {last['note']}" if last.get("note") else "") + ("; due again" if table["due"] else ""))
    if counters:
        print(f"{'minute':<26} {'table':<30} {'events':>9} {'written':>9} {'failed':>7}")
        for row in counters:
            print(f"{row['minute']:<26} {row['table']:<30} {row['events']:>9,} {row['rows_written']:>9,} "
                  f"{row['rows_failed']:>7,}")
    return 0


def _job_arguments(parser) -> None:
    """What every command that runs a job takes."""
    parser.add_argument("--log-file", help="where the job's whole output goes, tracebacks included (default: a new "
                                           "file in $AIRFLOW_SYNC_LOG_DIR or $TMPDIR/airflow-sync-<uid>/logs; "
                                           "named on stderr when the job fails)")
    parser.add_argument("--failure-wait-seconds", type=float,
                        help=f"how long the job waits, in all, for a server that does not answer before it fails "
                             f"(default {WAIT_SECONDS:g}; docs/troubleshooting.md)")


def _urls(parser, mysql=True):
    if mysql:
        parser.add_argument("--mysql-url", default=os.environ.get("MYSQL_URL"),
                            help="mysql://user:pass@host:port/db[?ssl_mode=…&ssl_ca=…] (default: $MYSQL_URL)")
    parser.add_argument("--clickhouse-url", default=os.environ.get("CLICKHOUSE_URL"),
                        help="http(s)://user:pass@host:8123/db[?ca_cert=…] (default: $CLICKHOUSE_URL)")
    parser.add_argument("--ledger-database", default=DEFAULT_LEDGER_DATABASE)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="airflow-sync", description="MySQL → ClickHouse sync operations")
    sub = parser.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("plan", help="print the shard plan of a table (reads keys and EXPLAINs, loads nothing)")
    plan.add_argument("--mysql-url", default=os.environ.get("MYSQL_URL"),
                      help="mysql://user:pass@host:port/db[?ssl_mode=…&ssl_ca=…] (default: $MYSQL_URL)")
    plan.add_argument("--database", help="source database (default: the URL's path)")
    plan.add_argument("--table", required=True)
    plan.add_argument("--split-column")
    plan.add_argument("--channels", type=int, default=None, help="concurrent source connections (default 1)")
    plan.add_argument("--split-factor", type=int, help=SPLIT_FACTOR_HELP)
    plan.add_argument("--strategy", choices=STRATEGIES, default="balanced")
    plan.add_argument("--byte-speed", type=int, help="global bytes/s limit (needs --channel-byte-speed)")
    plan.add_argument("--record-speed", type=int, help="global records/s limit (needs --channel-record-speed)")
    plan.add_argument("--channel-byte-speed", type=int)
    plan.add_argument("--channel-record-speed", type=int)
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    plan.set_defaults(func=cmd_plan)

    load = sub.add_parser("load", help="spark-submit a full load (no Airflow); resumes an unfinished --load-key")
    _urls(load)
    load.add_argument("--table", help="the table (or select many: --database / --select-table / --exclude-table)")
    _selection_arguments(load, one="source database (default: the MySQL URL's path); with --select-table or "
                                   "without --table, databases to select tables from (pattern; repeat)")
    load.add_argument("--target-table")
    load.add_argument("--load-key", help="ledger key (default: source → target names)")
    load.add_argument("--column", action="append", help="copy only this column (repeat; key columns always stay)")
    load.add_argument("--exclude-column", action="append", help="leave this column out (repeat)")
    load.add_argument("--channels", type=int, default=2)
    load.add_argument("--split-column")
    load.add_argument("--split-factor", type=int, help=SPLIT_FACTOR_HELP)
    load.add_argument("--strategy", choices=STRATEGIES, default="balanced")
    load.add_argument("--channel-record-speed", type=int)
    load.add_argument("--channel-byte-speed", type=int)
    load.add_argument("--reader", choices=READERS, default="auto",
                      help="auto (Arrow-native unless a probe disagrees with mysqlclient), native or mysqlclient")
    load.add_argument("--driver-copy-rows", type=int, default=None, help=DRIVER_COPY_ROWS_HELP)
    load.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    _job_arguments(load)
    load.add_argument("--json", action="store_true")
    load.set_defaults(func=cmd_load)

    status = sub.add_parser("status", help="a load's shards and hook counters from the ledger")
    _urls(status, mysql=False)
    status.add_argument("--load", required=True, help="load key")
    status.add_argument("--json", action="store_true")
    status.set_defaults(func=cmd_status)

    reimport = sub.add_parser("reimport", help="re-read only the failed shards of an unfinished load, then publish; "
                              "or the mismatched shards of a published load, replaced in place")
    _urls(reimport)
    reimport.add_argument("--load", required=True, help="load key")
    reimport.add_argument("--failed", action="store_true", required=True, help="only failed/unfinished shards")
    reimport.add_argument("--source", action="append", metavar="NAME",
                          help="a source group's load: its sources (repeat; URLs in $MYSQL_URL_<NAME>)")
    reimport.add_argument("--master", default="local[2]")
    _job_arguments(reimport)
    reimport.add_argument("--json", action="store_true")
    reimport.set_defaults(func=cmd_reimport)
    reconcile = sub.add_parser("reconcile", help="compare a published load shard by shard (counts, --checksum)")
    _urls(reconcile)
    reconcile.add_argument("--load", help="load key (with --database / --select-table: the prefix of the tables' keys)")
    _selection_arguments(reconcile)
    reconcile.add_argument("--checksum", action="store_true", help="also compare content checksums per shard")
    reconcile.add_argument("--reimport", action="store_true",
                           help="re-import mismatched shards into the published table, then compare again")
    reconcile.add_argument("--report-dir", help="where the HTML report goes")
    reconcile.add_argument("--master", default="local[2]")
    _job_arguments(reconcile)
    reconcile.add_argument("--json", action="store_true")
    reconcile.set_defaults(func=cmd_reconcile)

    diff = sub.add_parser("diff", help="compare a ClickHouse table with the MySQL table (or another ClickHouse "
                                       "table) by key: identical / changed / new / deleted; write the change set")
    _urls(diff)
    diff.add_argument("--old", help="the old snapshot: db.table on ClickHouse (e.g. the copy)")
    _selection_arguments(diff)
    new_side = diff.add_mutually_exclusive_group()
    new_side.add_argument("--table", help="the new snapshot: db.table in MySQL")
    new_side.add_argument("--new", help="the new snapshot: db.table on ClickHouse")
    diff.add_argument("--key", action="append", help="key column (repeat; default: the primary key)")
    diff.add_argument("--compare", action="append", help="compare only this column (repeat)")
    diff.add_argument("--ignore", action="append", help="leave this column out of the comparison (repeat)")
    diff.add_argument("--tolerance", action="append", metavar="COLUMN=ABS", help="float tolerance (repeat)")
    mode = diff.add_mutually_exclusive_group()
    mode.add_argument("--apply", action="store_true", help="upsert new/changed rows and tombstone deleted keys")
    mode.add_argument("--fail", action="store_true", help="exit 3 when anything differs")
    diff.add_argument("--diff-key", help="the diff's name in the ledger (default: from the tables)")
    diff.add_argument("--changes-table", help="db.table for the change set (default: <old>__changes)")
    diff.add_argument("--channels", type=int, default=2)
    diff.add_argument("--reader", choices=READERS, default="auto",
                      help="large reads of MySQL rows: auto (Arrow-native unless a probe disagrees), native or "
                           "mysqlclient")
    diff.add_argument("--report-dir", help="where the HTML report goes")
    diff.add_argument("--master", default="local[2]")
    _job_arguments(diff)
    diff.add_argument("--json", action="store_true")
    diff.set_defaults(func=cmd_diff)

    cdc = sub.add_parser("cdc", help="change data capture: apply the binlog to the copies, or show a pipeline")
    cdc_sub = cdc.add_subparsers(dest="cdc_command", required=True)
    for name, text in (("apply", "catch up from the checkpoint to the source's position now, then exit"),
                       ("run", "apply continuously (a long-running service) until stopped or --max-seconds")):
        command = cdc_sub.add_parser(name, help=text)
        _urls(command)
        command.add_argument("--pipeline", required=True)
        command.add_argument("--start-from-load", action="append",
                             help="a new pipeline: a full-load key whose table it replicates (repeat)")
        command.add_argument("--table", action="append", help="db.table (with a start position from a load)")
        _selection_arguments(command)
        command.add_argument("--lanes", type=int, default=4)
        command.add_argument("--batch-events", type=int, default=50_000)
        command.add_argument("--batch-bytes", type=int, default=16 << 20,
                             help="row-event bytes per batch; a larger transaction is written in pieces")
        command.add_argument("--driver-write-rows", type=int, default=500_000,
                             help="batches up to this many row changes are written by the driver (0: Spark tasks)")
        command.add_argument("--reset", action="store_true", help="forget the checkpoint; start from the loads again")
        command.add_argument("--on-binlog-lost", choices=("recopy", "stop"), default="recopy",
                             help="the binlog the checkpoint needs is gone: copy every table again beside a stream "
                                  "restarted now (recopy), or stop")
        command.add_argument("--verify", action="store_true",
                             help="check every table against the source once (per-shard checksums), repair shards")
        command.add_argument("--verify-period", type=float, default=900.0, metavar="SECONDS",
                             help="check every table, slice by slice beside the stream, once per this many seconds "
                                  "(0: only tables due after a DDL, a re-copy or a takeover)")
        command.add_argument("--verify-budget", type=float, default=0.1, metavar="SHARE",
                             help="share of one source core the checks may use")
        command.add_argument("--verify-every", type=float, default=0.0, help=argparse.SUPPRESS)
        command.add_argument("--no-verify-after-ddl", action="store_true",
                             help="do not check a table after a DDL changed it")
        command.add_argument("--placement", choices=("driver", "executors"), default="driver",
                             help="a source group: every source's pipeline in the driver (a thread each), or as a "
                                  "long-running Spark task each on the cluster's executors")
        command.add_argument("--on-shard-removed", choices=("keep", "delete"), default="keep",
                             help="a source group: a shard (table or source) that leaves keeps its rows in the merged "
                                  "copy, or they are deleted")
        if name == "run":
            command.add_argument("--max-seconds", type=float, help="stop after this long (default: never)")
        command.add_argument("--master", default="local[2]")
        _job_arguments(command)
        command.add_argument("--json", action="store_true")
        command.set_defaults(func=cmd_cdc_apply)
    boot = cdc_sub.add_parser("bootstrap", help="copy tables chunk by chunk under live writes (no locks; resumable) "
                                                "and hand them to the pipeline's catch-up")
    _urls(boot)
    boot.add_argument("--pipeline", required=True)
    boot.add_argument("--table", action="append", help="db.table (repeat)")
    _selection_arguments(boot)
    boot.add_argument("--channels", type=int, default=2)
    boot.add_argument("--chunk-rows", type=int, default=DEFAULT_CHUNK_ROWS)
    boot.add_argument("--watermark-table", help="MySQL only: db.table the job may create and write (exact positions)")
    boot.add_argument("--restart", action="store_true", help="start again instead of resuming")
    boot.add_argument("--driver-copy-rows", type=int, default=None, help=DRIVER_COPY_ROWS_HELP)
    boot.add_argument("--master", default="local[2]")
    _job_arguments(boot)
    boot.add_argument("--json", action="store_true")
    boot.set_defaults(func=cmd_cdc_bootstrap)
    status = cdc_sub.add_parser("status", help="checkpoint, source position, lag, counters, last error")
    status.add_argument("--mysql-url", default=os.environ.get("MYSQL_URL"),
                        help="the source, for lag (default: $MYSQL_URL; optional)")
    status.add_argument("--clickhouse-url", default=os.environ.get("CLICKHOUSE_URL"))
    status.add_argument("--ledger-database", default=DEFAULT_LEDGER_DATABASE)
    status.add_argument("--pipeline", required=True)
    status.add_argument("--json", action="store_true")
    status.set_defaults(func=cmd_cdc_status)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    for name in ("mysql_url", "clickhouse_url"):
        optional = name == "mysql_url" and (getattr(args, "cdc_command", None) == "status"
                                            or bool(getattr(args, "source", None)))
        if hasattr(args, name) and not getattr(args, name) and not optional:
            option = name.replace("_", "-")
            print(f"airflow-sync: error: --{option} or ${name.upper()} is required", file=sys.stderr)
            return 2
    try:
        return args.func(args)
    except (PlanError, KeyError, LookupError, ValueError, SourceRefused) as exc:
        print(f"airflow-sync: error: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

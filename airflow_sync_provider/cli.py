"""``airflow-sync``: the ops command line (no Airflow needed).

  airflow-sync plan     --mysql-url mysql://user:pass@host:port/db --table NAME [--json]
  airflow-sync load     --mysql-url … --clickhouse-url http://user:pass@host:8123/ --table NAME [--load-key K]
  airflow-sync status   --load KEY [--json]
  airflow-sync reimport --load KEY --failed
  airflow-sync reconcile --load KEY [--checksum] [--json]   (exit 3 on a mismatch)

Passwords may come from the environment instead: ``MYSQL_URL`` and ``CLICKHOUSE_URL`` are used
when the options are absent, so no password need appear on a command line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from airflow_sync_provider.core import clickhouse_target
from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
from airflow_sync_provider.core.jobspec import FullLoadSpec, ReconcileSpec, reimport_spec
from airflow_sync_provider.core.ledger import DEFAULT_LEDGER_DATABASE, Ledger, check_counters
from airflow_sync_provider.core.mysql_reader import connect
from airflow_sync_provider.core.mysql_schema import read_table_schema
from airflow_sync_provider.core.planning import DEFAULT_SPLIT_FACTOR, STRATEGIES, Plan, PlanError, SpeedLimits, plan_table
from airflow_sync_provider.core.reports import reconcile_table, shard_table, write_report
from airflow_sync_provider.core.submission import spark_submit


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


def _run_load(spec: FullLoadSpec, args) -> int:
    result = spark_submit(spec, master=args.master, log=None if args.json else sys.stderr)
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    elif result.get("status") == "success":
        print(f"loaded {result['table']} → {result['target']}: {result['rows']:,} rows, {result['shards']} shards "
              f"({result['shards_read']} read now), {result['seconds']:.1f} s; load key {result['load_key']!r}")
    else:
        print(f"airflow-sync: load failed: {result.get('error')}", file=sys.stderr)
    return 0 if result.get("status") == "success" else 1


def cmd_load(args) -> int:
    source = MySQLEndpoint.from_url(args.mysql_url)
    target = ClickHouseEndpoint.from_url(args.clickhouse_url)
    database = args.database or source.database
    spec = FullLoadSpec(
        source=source, target=target, source_database=database, source_table=args.table,
        target_database=args.target_database or (target.database if target.database != "default" else database),
        target_table=args.target_table or args.table, load_key=args.load_key or "", channels=args.channels,
        columns=args.column, exclude_columns=args.exclude_column or [],
        split_column=args.split_column, split_factor=args.split_factor, strategy=args.strategy,
        channel_record_speed=args.channel_record_speed, channel_byte_speed=args.channel_byte_speed,
        ledger_database=args.ledger_database)
    return _run_load(spec, args)


def cmd_reimport(args) -> int:
    target = ClickHouseEndpoint.from_url(args.clickhouse_url)
    ch = clickhouse_target.client(target)
    state = Ledger(ch, args.ledger_database).state(args.load)
    ch.close()
    if state is None:
        raise LookupError(f"no load {args.load!r} in {args.ledger_database}")
    return _run_load(reimport_spec(state.spec, MySQLEndpoint.from_url(args.mysql_url), target), args)


def cmd_status(args) -> int:
    target = ClickHouseEndpoint.from_url(args.clickhouse_url)
    verdict, message, _ = check_counters(target, args.load, args.ledger_database)
    ch = clickhouse_target.client(target)
    state = Ledger(ch, args.ledger_database).state(args.load)
    ch.close()
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
    spec = ReconcileSpec(source=MySQLEndpoint.from_url(args.mysql_url), target=ClickHouseEndpoint.from_url(args.clickhouse_url),
                         load_key=args.load, checksum=args.checksum, reimport=args.reimport,
                         ledger_database=args.ledger_database)
    result = spark_submit(spec, master=args.master, log=None if args.json else sys.stderr)
    if result.get("status") != "success":
        print(f"airflow-sync: reconcile failed: {result.get('error')}", file=sys.stderr)
        return 1
    result["report"] = write_report(result, args.report_dir)
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    else:
        print(reconcile_table(result["shards"]))
        if result.get("before"):
            print(f"first pass: shards {result['before']['mismatched']} mismatched; re-imported "
                  f"{result['reimported']['rows']:,} rows into them")
        print(f"verdict: {result['verdict']}; mismatched shards: {result['mismatched'] or 'none'}; report {result['report']}")
    return 0 if result["verdict"] == "ok" else 3


def _urls(parser, mysql=True):
    if mysql:
        parser.add_argument("--mysql-url", default=os.environ.get("MYSQL_URL"),
                            help="mysql://user:pass@host:port/db (default: $MYSQL_URL)")
    parser.add_argument("--clickhouse-url", default=os.environ.get("CLICKHOUSE_URL"),
                        help="http://user:pass@host:8123/db (default: $CLICKHOUSE_URL)")
    parser.add_argument("--ledger-database", default=DEFAULT_LEDGER_DATABASE)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="airflow-sync", description="MySQL → ClickHouse sync operations")
    sub = parser.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("plan", help="print the shard plan of a table (reads keys and EXPLAINs, loads nothing)")
    plan.add_argument("--mysql-url", default=os.environ.get("MYSQL_URL"),
                      help="mysql://user:pass@host:port/db (default: $MYSQL_URL)")
    plan.add_argument("--database", help="source database (default: the URL's path)")
    plan.add_argument("--table", required=True)
    plan.add_argument("--split-column")
    plan.add_argument("--channels", type=int, default=None, help="concurrent source connections (default 1)")
    plan.add_argument("--split-factor", type=int, default=DEFAULT_SPLIT_FACTOR)
    plan.add_argument("--strategy", choices=STRATEGIES, default="balanced")
    plan.add_argument("--byte-speed", type=int, help="global bytes/s limit (needs --channel-byte-speed)")
    plan.add_argument("--record-speed", type=int, help="global records/s limit (needs --channel-record-speed)")
    plan.add_argument("--channel-byte-speed", type=int)
    plan.add_argument("--channel-record-speed", type=int)
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    plan.set_defaults(func=cmd_plan)

    load = sub.add_parser("load", help="spark-submit a full load (no Airflow); resumes an unfinished --load-key")
    _urls(load)
    load.add_argument("--database", help="source database (default: the MySQL URL's path)")
    load.add_argument("--table", required=True)
    load.add_argument("--target-database")
    load.add_argument("--target-table")
    load.add_argument("--load-key", help="ledger key (default: source → target names)")
    load.add_argument("--column", action="append", help="copy only this column (repeat; key columns always stay)")
    load.add_argument("--exclude-column", action="append", help="leave this column out (repeat)")
    load.add_argument("--channels", type=int, default=2)
    load.add_argument("--split-column")
    load.add_argument("--split-factor", type=int, default=DEFAULT_SPLIT_FACTOR)
    load.add_argument("--strategy", choices=STRATEGIES, default="balanced")
    load.add_argument("--channel-record-speed", type=int)
    load.add_argument("--channel-byte-speed", type=int)
    load.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
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
    reimport.add_argument("--master", default="local[2]")
    reimport.add_argument("--json", action="store_true")
    reimport.set_defaults(func=cmd_reimport)
    reconcile = sub.add_parser("reconcile", help="compare a published load shard by shard (counts, --checksum)")
    _urls(reconcile)
    reconcile.add_argument("--load", required=True, help="load key")
    reconcile.add_argument("--checksum", action="store_true", help="also compare content checksums per shard")
    reconcile.add_argument("--reimport", action="store_true",
                           help="re-import mismatched shards into the published table, then compare again")
    reconcile.add_argument("--report-dir", help="where the HTML report goes")
    reconcile.add_argument("--master", default="local[2]")
    reconcile.add_argument("--json", action="store_true")
    reconcile.set_defaults(func=cmd_reconcile)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    for name in ("mysql_url", "clickhouse_url"):
        if hasattr(args, name) and not getattr(args, name):
            option = name.replace("_", "-")
            print(f"airflow-sync: error: --{option} or ${name.upper()} is required", file=sys.stderr)
            return 2
    try:
        return args.func(args)
    except (PlanError, KeyError, LookupError, ValueError) as exc:
        print(f"airflow-sync: error: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

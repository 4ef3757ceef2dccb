"""``airflow-sync``: the ops command line (no Airflow needed).

  airflow-sync plan --mysql-url mysql://user:pass@host:port/db --table NAME [--json]

Passwords may also come from the environment: ``MYSQL_URL`` is used when --mysql-url is absent,
so the password need not appear on the command line.
"""

from __future__ import annotations

import argparse
import os
import sys

from airflow_sync_provider.core.endpoints import MySQLEndpoint
from airflow_sync_provider.core.mysql_reader import connect
from airflow_sync_provider.core.mysql_schema import read_table_schema
from airflow_sync_provider.core.planning import DEFAULT_SPLIT_FACTOR, STRATEGIES, Plan, PlanError, SpeedLimits, plan_table


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
    speed = SpeedLimits(channels=args.channels, byte=args.byte_speed, record=args.record_speed,
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
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "plan" and not args.mysql_url:
        print("airflow-sync: error: --mysql-url or $MYSQL_URL is required", file=sys.stderr)
        return 2
    if getattr(args, "channels", 0) is None and not (args.byte_speed or args.record_speed):
        args.channels = 1
    try:
        return args.func(args)
    except (PlanError, KeyError, LookupError, ValueError) as exc:
        print(f"airflow-sync: error: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

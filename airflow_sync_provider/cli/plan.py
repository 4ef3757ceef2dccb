"""``airflow-sync plan``: a table's shard plan, read from the source (loads nothing)."""

from __future__ import annotations

from airflow_sync_provider.cli.common import SPLIT_FACTOR_HELP, mysql_url_argument
from airflow_sync_provider.core.endpoints import MySQLEndpoint
from airflow_sync_provider.core.source.planning import STRATEGIES, Plan, PlanError, Sharding, SpeedLimits, plan_table
from airflow_sync_provider.core.source.reader import connect
from airflow_sync_provider.core.source.schema import read_table_schema


def add_parser(sub) -> None:
    plan = sub.add_parser("plan", help="print the shard plan of a table (reads keys and EXPLAINs, loads nothing)")
    mysql_url_argument(plan)
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
        plan = plan_table(conn, schema, Sharding(speed=speed, split_column=args.split_column,
                          split_factor=args.split_factor, strategy=args.strategy))
    if args.json:
        print(plan.to_json(indent=2))
    else:
        _print_plan(plan)
    return 0


def _print_plan(plan: Plan) -> None:
    print(f"table {plan.database}.{plan.table}: split on {plan.split_column!r} via index {plan.index!r}, "
          f"strategy {plan.strategy}, {plan.channels} channel(s), {len(plan.shards)} shard(s)")
    print(f"{'id':>4}  {'est. rows':>10}  where / params")
    for shard in plan.shards:
        print(f"{shard.id:>4}  {shard.estimated_rows if shard.estimated_rows is not None else '?':>10}  "
              f"{shard.where}  {list(shard.params)}")
    for warning in plan.warnings:
        print(f"warning: {warning}")

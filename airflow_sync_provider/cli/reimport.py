"""``airflow-sync reimport``: re-read only the failed shards of an unfinished load, then publish it;
or the mismatched shards of a published load, replaced in place. Either is a load job (``run_load``)."""

from __future__ import annotations

from airflow_sync_provider.cli.common import job_arguments, url_arguments
from airflow_sync_provider.cli.load import run_load
from airflow_sync_provider.cli.selection import group_sources, salt_argument, salt_of
from airflow_sync_provider.core.clickhouse.client import client
from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
from airflow_sync_provider.core.ledger import Ledger
from airflow_sync_provider.core.specfile import reimport_group_spec, reimport_spec


def add_parser(sub) -> None:
    reimport = sub.add_parser("reimport", help="re-read only the failed shards of an unfinished load, then publish; "
                              "or the mismatched shards of a published load, replaced in place")
    url_arguments(reimport)
    reimport.add_argument("--load", required=True, help="load key")
    reimport.add_argument("--failed", action="store_true", required=True, help="only failed/unfinished shards")
    reimport.add_argument("--source", action="append", metavar="NAME",
                          help="a source group's load: its sources (repeat; URLs in $MYSQL_URL_<NAME>)")
    salt_argument(reimport)
    job_arguments(reimport)
    reimport.set_defaults(func=cmd_reimport)


def cmd_reimport(args) -> int:
    target = ClickHouseEndpoint.from_url(args.clickhouse_url)
    ch = client(target)
    try:
        ledger = Ledger(ch, args.ledger_database)
        state = ledger.state(args.load)
        members = ledger.load_set(args.load) if state is None else None
        first = ledger.state(members[0][0]) if members and members[0] else None
    finally:
        ch.close()
    if first is not None and first.spec.get("member"):  # a source group's merged copy: its members are the load set's
        member = first.spec["member"]
        return run_load(reimport_group_spec(first.spec, group_sources(args), target, args.load,
                                            [f"{member['database']}.{member['table']}"]), args)
    if state is None:
        raise LookupError(f"no load {args.load!r} in {args.ledger_database}")
    return run_load(reimport_spec(state.spec, MySQLEndpoint.from_url(args.mysql_url), target, salt_of(args)), args)

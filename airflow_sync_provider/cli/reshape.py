"""``airflow-sync reshape``: lay out a CDC pipeline's copies otherwise (docs/layouts.md). The
pipeline re-copies each named table beside the stream into a new table under the new layout and
swaps it in when done, while its changes go on into the new copy; the run ends once every swap is
recorded. A copy no pipeline follows is laid out otherwise by ``airflow-sync load --reshape``."""

from __future__ import annotations

import argparse

from airflow_sync_provider.cli.cdc import applied_line, named_tables
from airflow_sync_provider.cli.common import job_arguments, submit, url_arguments
from airflow_sync_provider.cli.selection import layout_arguments, layout_of
from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
from airflow_sync_provider.core.jobspec import CdcApplySpec
from airflow_sync_provider.core.selection import TableSet
from airflow_sync_provider.core.source.group import one_server


def add_parser(sub) -> None:
    reshape = sub.add_parser("reshape", help="rebuild a pipeline's copies under another layout while CDC goes on, "
                                             "swapped in when done")
    url_arguments(reshape)
    reshape.add_argument("--pipeline", required=True, help="the pipeline that follows the tables")
    reshape.add_argument("--table", action="append", required=True, help="db.table (repeat)")
    reshape.add_argument("--target-database", help=argparse.SUPPRESS)
    layout_arguments(reshape)
    job_arguments(reshape)
    reshape.set_defaults(func=cmd_reshape)


def cmd_reshape(args) -> int:
    spec = CdcApplySpec(sources=one_server(MySQLEndpoint.from_url(args.mysql_url)),
                        target=ClickHouseEndpoint.from_url(args.clickhouse_url), pipeline=args.pipeline,
                        tableset=TableSet(tables=named_tables(args), layout=layout_of(args) or {}),
                        reshape=True, ledger_database=args.ledger_database)
    return submit(spec, args, "reshape", _reshaped)


def _reshaped(result: dict) -> str:
    return applied_line(result) + "; laid out anew: " + (", ".join(result["recopied"]) or "none (laid out so already)")

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
  airflow-sync cdc stop   --pipeline P [--wait S]                 (a running service ends at its next batch)
  airflow-sync reshape --pipeline P --table DB.NAME --order-by EXPR …  (lay a followed copy out anew)

Passwords may come from the environment instead: ``MYSQL_URL`` and ``CLICKHOUSE_URL`` are used
when the options are absent, so no password need appear on a command line. TLS and the other
connection settings are the URLs' query parameters (``?ssl_mode=VERIFY_IDENTITY&ssl_ca=/path/ca.pem``,
``https://…?ca_cert=/path/ca.pem``): docs/connections.md.
"""

from __future__ import annotations

import argparse
import sys

from airflow_sync_provider.cli import cdc, diff, load, plan, reconcile, reimport, reshape, status
from airflow_sync_provider.core.source.planning import PlanError
from airflow_sync_provider.core.tls import SourceRefused

# A module per command: each declares its arguments in add_parser(sub), next to the command
# (set as the parser's ``func``). This order is the order of the commands in --help.
COMMANDS = (plan, load, status, reimport, reconcile, diff, cdc, reshape)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="airflow-sync", description="MySQL → ClickHouse sync operations")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
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

"""``airflow-sync diff``: compare a ClickHouse table with the MySQL table (or another ClickHouse
table) by key, write the change set, and apply it (``--apply``) or exit 3 on changes (``--fail``)."""

from __future__ import annotations

from airflow_sync_provider.cli.common import job_arguments, run_reported, url_arguments
from airflow_sync_provider.cli.selection import (
    content_arguments,
    content_of,
    group_selection,
    group_sources,
    group_tables,
    layout_arguments,
    layout_of,
    pattern_selection,
    salt_of,
    selection_arguments,
)
from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
from airflow_sync_provider.core.jobspec import READERS, SnapshotDiffSpec
from airflow_sync_provider.core.selection import TableSet
from airflow_sync_provider.core.source.group import Merge, one_server
from airflow_sync_provider.core.verify.reports import diff_summary
from airflow_sync_provider.plugins.reports import write_diff_report


def add_parser(sub) -> None:
    diff = sub.add_parser("diff", help="compare a ClickHouse table with the MySQL table (or another ClickHouse "
                                       "table) by key: identical / changed / new / deleted; write the change set")
    url_arguments(diff)
    diff.add_argument("--old", help="the old snapshot: db.table on ClickHouse (e.g. the copy)")
    selection_arguments(diff)
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
    layout_arguments(diff)  # with --apply, when the copy does not exist yet
    content_arguments(diff)
    job_arguments(diff)
    diff.set_defaults(func=cmd_diff)


def cmd_diff(args) -> int:
    sources = group_sources(args)
    if sources:  # a source group: its merged copy (--merge-into) or its side-by-side copies
        if args.old or args.new:
            raise SystemExit("airflow-sync: a group's diff compares its sources with their copies: give --merge-into "
                             "or --database [--select-table …], not --old/--new")
        select, tables, database, table = group_selection(args), group_tables(args), "", ""
        if not (select or tables):
            raise SystemExit("airflow-sync: with --source, select tables with --database [--select-table …]")
    else:
        if not args.old and not (args.database or args.select_table):
            raise SystemExit("give --old with --table or --new (one table), or --database [--select-table …] (many)")
        select, tables = pattern_selection(args, MySQLEndpoint.from_url(args.mysql_url)) if not args.old else None, []
        database, _, table = (args.table or "").partition(".")
    on_change = "apply" if args.apply else "fail" if args.fail else "warn"
    tolerances = {}
    for item in args.tolerance or []:
        column, _, value = item.partition("=")
        tolerances[column] = float(value)
    spec = SnapshotDiffSpec(target=ClickHouseEndpoint.from_url(args.clickhouse_url), old_table=args.old or "",
                            tableset=TableSet(select=select, tables=tables, parallel=args.parallel_tables,
                                              layout=layout_of(args), content=content_of(args)),
                            hash_salt=salt_of(args),
                            merge=Merge.of(args.merge_into or ""),
                            sources=sources or one_server(
                                MySQLEndpoint.from_url(args.mysql_url) if args.table or select else None),
                            source_database=database, source_table=table, new_table=args.new or "",
                            key_columns=args.key or None, compare_columns=args.compare or None,
                            ignore_columns=args.ignore or [], tolerances=tolerances, on_change=on_change,
                            diff_key=args.diff_key or "", changes_table=args.changes_table or "",
                            channels=args.channels, ledger_database=args.ledger_database, reader=args.reader)
    reported = run_reported(spec, args, "diff", write_diff_report)
    if reported is None:
        return 1
    result, tables = reported
    if not args.json:
        for one in tables:
            print(diff_summary(one))
            print(f"change set: {one['changes_table']} (diff_key {one['diff_key']!r}); report {one['report']}")
        if result.get("orphans"):
            print(f"in the copy but no longer selected (a re-load removes them): {', '.join(result['orphans'])}")
    return 3 if args.fail and any(one["verdict"] == "changed" for one in tables) else 0

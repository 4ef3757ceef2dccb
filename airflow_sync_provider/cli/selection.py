"""Which tables a command works on: many by pattern (``--database`` / ``--select-table`` /
``--exclude-table``), source groups (``--source NAME``, ``--merge-into``), and how the copies it
creates are laid out (``--order-by`` …: core/clickhouse/layout.py)."""

from __future__ import annotations

import os

from airflow_sync_provider.core.endpoints import MySQLEndpoint
from airflow_sync_provider.core.source.group import Source, env_name


def selection_arguments(parser, database_help: str = "", pipeline: bool = False) -> None:
    parser.add_argument("--database", action="append",
                        help=database_help or "select tables of these databases (pattern; repeat)")
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
    if pipeline:  # a pipeline keeps the patterns it was first given; other patterns are refused unless
        parser.add_argument("--change-selection", action="store_true",
                            help="replace the patterns the pipeline keeps with these")
    else:
        parser.add_argument("--parallel-tables", type=int, default=2, help="selected tables worked on at once")


def pattern_selection(args, source: MySQLEndpoint) -> dict | None:
    """A command's tables by pattern (--select-table / --exclude-table, or no --table): the selection."""
    if getattr(args, "table", None) and not (args.select_table or args.exclude_table):
        return None
    databases = args.database or ([source.database] if source.database else [])
    if not databases:
        raise SystemExit("select tables with --database (pattern; repeat) or put the database in the MySQL URL")
    return {"databases": databases, "tables": args.select_table or ["*"], "exclude_tables": args.exclude_table or [],
            "target_database": args.target_database or "{database}"}


def group_sources(args) -> list[Source]:
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


def group_tables(args) -> list[str]:
    """A group's ``--table`` (one database): the same table on every source."""
    if not getattr(args, "table", None):
        return []
    if "." in args.table:
        return [args.table]
    if not args.database or len(args.database) != 1:
        raise SystemExit("airflow-sync: with --source, give --table as db.table or with one --database")
    return [f"{args.database[0]}.{args.table}"]


def group_selection(args) -> dict | None:
    """A group's tables by pattern: unlike ``pattern_selection``, its databases come from ``--database`` only."""
    if getattr(args, "table", None) and not (args.select_table or args.exclude_table):
        return None
    if not args.database:
        raise SystemExit("airflow-sync: with --source, select tables with --database (pattern; repeat) "
                         "[--select-table …] or name one with --table db.table")
    return {"databases": args.database, "tables": args.select_table or ["*"],
            "exclude_tables": args.exclude_table or [],
            **({"target_database": args.target_database} if args.target_database else {})}


def layout_arguments(parser) -> None:
    """The copy's layout, on every command that creates a copy (docs/layouts.md)."""
    group = parser.add_argument_group("layout of the copies it creates (docs/layouts.md)")
    group.add_argument("--order-by", action="append", metavar="EXPR",
                       help="sorting key column or expression (repeat); the primary key is appended where missing")
    group.add_argument("--partition-by", metavar="EXPR", help="PARTITION BY expression, e.g. toYYYYMM(created_at)")
    group.add_argument("--primary-key", action="append", metavar="EXPR", help="a prefix of the sorting key (repeat)")
    group.add_argument("--ttl", metavar="EXPR",
                       help="TTL expression, e.g. 'day + INTERVAL 90 DAY' (the checks compare only the rows no merge "
                            "can have expired: docs/layouts.md)")
    group.add_argument("--table-setting", action="append", metavar="NAME=VALUE", help="table setting (repeat)")
    group.add_argument("--engine", metavar="NAME",
                       help="ReplacingMergeTree (default) or ReplicatedReplacingMergeTree[('path', 'replica')]")
    group.add_argument("--cluster", metavar="NAME",
                       help="ON CLUSTER and a Distributed table: refused by every job for now (docs/layouts.md, "
                            "Clusters)")
    group.add_argument("--json-as", choices=("json", "string"),
                       help="string (default): MySQL JSON as its exact text in a String; json: also a ClickHouse "
                            "JSON column <col>_json derived from every JSON column, for queries by path (the String "
                            "stays the exact copy the checks compare)")
    group.add_argument("--json-column", action="append", metavar="COL",
                       help="a derived JSON column <COL>_json for this JSON column only (repeat)")
    group.add_argument("--geo-column", action="append", metavar="COL",
                       help="a derived typed geo column <COL>_geo (Point, Polygon, …) for this spatial column (repeat)")


def layout_of(args) -> dict | None:
    """The layout the arguments give (None: the copy's own, or the default for a new one)."""
    layout = {"order_by": args.order_by, "partition_by": args.partition_by, "primary_key": args.primary_key,
              "ttl": args.ttl, "settings": args.table_setting, "engine": args.engine, "cluster": args.cluster,
              "json": getattr(args, "json_column", None) or args.json_as, "geo": getattr(args, "geo_column", None)}
    return {k: v for k, v in layout.items() if v} or None


def salt_argument(parser) -> None:
    """The salt of hash transforms, by the name of the variable holding it (never on a command line)."""
    parser.add_argument("--hash-salt-env", metavar="NAME",
                        help="environment variable holding the salt of the copies' hash transforms (docs/content.md)")


def content_arguments(parser) -> None:
    """What the copies a command creates hold (docs/content.md)."""
    group = parser.add_argument_group("content of the copies it creates (docs/content.md)")
    group.add_argument("--transform", action="append", metavar="COL=FN",
                       help="hash | mask(first,last) | null | truncate(n) | redact('text') of a column (repeat)")
    group.add_argument("--row-filter", metavar="EXPR", help="MySQL condition the copy's rows meet, e.g. tenant_id = 7")
    group.add_argument("--on-delete", choices=("delete", "keep"),
                       help="keep: a row deleted at the source stays, marked in _deleted_at_source")
    group.add_argument("--history", action="store_true",
                       help="every version of every row in <table>_history (issue 61: written by `cdc apply`, full "
                            "loads, re-imports and the diff's apply; bootstraps and re-copies refuse it so far)")
    group.add_argument("--history-partition-by", metavar="EXPR",
                       help="the history's PARTITION BY (default toYYYYMM(_commit_time)); implies --history")
    group.add_argument("--history-retention-days", type=int, metavar="DAYS",
                       help="versions older than this expire from the history (default: kept); implies --history")
    salt_argument(group)


def content_of(args) -> dict | None:
    """The content settings the arguments give (None: the copy's own, or the mirror's for a new one)."""
    content = {"transform": getattr(args, "transform", None), "row_filter": getattr(args, "row_filter", None),
               "on_delete": getattr(args, "on_delete", None), "history": history_of(args)}
    return {k: v for k, v in content.items() if v} or None


def history_of(args) -> "dict | bool | None":
    """``--history`` and its options: True (the defaults), their dict, or None."""
    options = {"partition_by": getattr(args, "history_partition_by", None),
               "retention_days": getattr(args, "history_retention_days", None)}
    options = {k: v for k, v in options.items() if v is not None}
    return options or (True if getattr(args, "history", False) else None)


def salt_of(args) -> str:
    """The salt ``--hash-salt-env`` names ("" without it); a variable that is not set is an error."""
    name = getattr(args, "hash_salt_env", None)
    if not name:
        return ""
    if not os.environ.get(name):
        raise SystemExit(f"airflow-sync: --hash-salt-env {name}: ${name} is not set (it holds the hash salt)")
    return os.environ[name]

"""``airflow-sync load``: a full load of one table, of tables selected by pattern, or of a source
group's; running it again with the same load key resumes an unfinished one."""

from __future__ import annotations

from airflow_sync_provider.cli.common import (
    DRIVER_COPY_ROWS_HELP,
    SPLIT_FACTOR_HELP,
    job_arguments,
    submit,
    url_arguments,
)
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
from airflow_sync_provider.core.jobspec import READERS, FullLoadSpec
from airflow_sync_provider.core.selection import TableSet
from airflow_sync_provider.core.source.group import Merge, Source, one_server
from airflow_sync_provider.core.source.planning import STRATEGIES


def add_parser(sub) -> None:
    load = sub.add_parser("load", help="spark-submit a full load (no Airflow); resumes an unfinished --load-key")
    url_arguments(load)
    load.add_argument("--table", help="the table (or select many: --database / --select-table / --exclude-table)")
    selection_arguments(load, database_help="source database (default: the MySQL URL's path); with --select-table or "
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
    layout_arguments(load)
    content_arguments(load)
    load.add_argument("--reshape", action="store_true",
                      help="the copy exists laid out otherwise: replace it under this layout (no pipeline follows it)")
    job_arguments(load)
    load.set_defaults(func=cmd_load)


def cmd_load(args) -> int:
    target = ClickHouseEndpoint.from_url(args.clickhouse_url)
    sources = group_sources(args)
    if sources:
        return run_load(_group_load(args, sources, target), args)
    source = MySQLEndpoint.from_url(args.mysql_url)
    select = pattern_selection(args, source)
    database = "" if select else _one_database(args, source)
    table = "" if select else args.table
    spec = FullLoadSpec(sources=one_server(source), target=target, source_database=database, source_table=table,
                        tableset=TableSet(select=select, parallel=args.parallel_tables, layout=layout_of(args),
                                          content=content_of(args)), hash_salt=salt_of(args),
                        target_database="" if select else args.target_database or (
            target.database if target.database != "default" else database),
                        target_table="" if select else args.target_table or table,
                        load_key=args.load_key or (_pattern_key(select) if select else ""), channels=args.channels,
                        columns=args.column, exclude_columns=args.exclude_column or [], split_column=args.split_column,
                        split_factor=args.split_factor, strategy=args.strategy,
                        channel_record_speed=args.channel_record_speed, channel_byte_speed=args.channel_byte_speed,
                        ledger_database=args.ledger_database, reader=args.reader,
                        driver_copy_rows=args.driver_copy_rows, reshape=args.reshape)
    return run_load(spec, args)


def run_load(spec: FullLoadSpec, args) -> int:
    """Run a load (or a re-import, which is one) and print its tables; on a failure, how to go on."""
    hint = (f"; run the same command again to go on: the tables published are skipped (load key {spec.load_key!r})"
            if spec.tableset and not spec.merge else
            f"; run the same command again to go on (load key {spec.load_key!r})" if spec.merge else "")
    return submit(spec, args, "load", lambda r: "\n".join(
        [_loaded(t) for t in r["tables"]] + [f"{len(r['tables'])} table(s), {sum(t['rows'] for t in r['tables']):,} "
                                            f"rows in {r['seconds']:.1f} s"]) if "tables" in r else _loaded(r), hint)


def _loaded(r: dict) -> str:
    name = r.get("member") or (f"{r['source']}:{r['table']}" if r.get("source") else r["table"])
    if r.get("skipped"):
        return (f"skipped {name} → {r['target']}: {r['rows']:,} rows, published by this load's earlier run "
                f"(generation {r['generation']}); load key {r['load_key']!r}")
    return (f"loaded {name} → {r['target']}: {r['rows']:,} rows, {r['shards']} shards ({r['shards_read']} read "
            f"now), {r['seconds']:.1f} s; load key {r['load_key']!r}")


def _pattern_key(select: dict) -> str:
    """A pattern load's default key, from its selection: running the same command again after it
    failed goes on with it (published tables skipped); after it finished, copies afresh."""
    key = "+".join(select["databases"])
    if select["tables"] != ["*"]:
        key += "[" + ",".join(select["tables"]) + "]"
    if select["exclude_tables"]:
        key += "-[" + ",".join(select["exclude_tables"]) + "]"
    return f"{key}->{select['target_database']}"


def _one_database(args, source: MySQLEndpoint) -> str:
    if args.database and len(args.database) > 1:
        raise SystemExit("one --database with --table (several select tables by pattern)")
    return (args.database or [source.database])[0]


def _group_load(args, sources: list[Source], target: ClickHouseEndpoint) -> FullLoadSpec:
    return FullLoadSpec(target=target, source_database="", source_table="", target_database="", target_table="",
                        sources=sources, merge=Merge.of(args.merge_into or ""),
                        tableset=TableSet(select=group_selection(args), tables=group_tables(args),
                                          parallel=args.parallel_tables, layout=layout_of(args),
                                          content=content_of(args)), hash_salt=salt_of(args),
                        load_key=args.load_key or "", channels=args.channels, columns=args.column,
                        exclude_columns=args.exclude_column or [], split_column=args.split_column,
                        split_factor=args.split_factor, strategy=args.strategy,
                        channel_record_speed=args.channel_record_speed, channel_byte_speed=args.channel_byte_speed,
                        ledger_database=args.ledger_database, reader=args.reader,
                        driver_copy_rows=args.driver_copy_rows, reshape=args.reshape)

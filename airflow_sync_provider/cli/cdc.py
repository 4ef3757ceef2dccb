"""``airflow-sync cdc``: change data capture. ``bootstrap`` copies tables chunk by chunk under live
writes, ``apply`` catches a pipeline up to the source's position now, ``run`` applies continuously
(a long-running service), ``status`` shows a pipeline (or a source group's pipelines)."""

from __future__ import annotations

import argparse
import json
import os
import time

from airflow_sync_provider.cli.common import DRIVER_COPY_ROWS_HELP, job_arguments, submit, url_arguments
from airflow_sync_provider.cli.selection import (
    content_arguments,
    content_of,
    group_sources,
    layout_arguments,
    layout_of,
    salt_argument,
    salt_of,
    selection_arguments,
)
from airflow_sync_provider.core.cdc.checkpoints import PIPELINE_RUNNING, PIPELINE_STOPPED, Checkpoints
from airflow_sync_provider.core.cdc.servers import Server, reached, server_of, source_epoch
from airflow_sync_provider.core.clickhouse.client import client
from airflow_sync_provider.core.content.shaping import describe_content
from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
from airflow_sync_provider.core.jobspec import DEFAULT_CHUNK_ROWS, CdcApplySpec, CdcBootstrapSpec
from airflow_sync_provider.core.ledger import DEFAULT_LEDGER_DATABASE
from airflow_sync_provider.core.positions import current_position
from airflow_sync_provider.core.selection import TableSet
from airflow_sync_provider.core.source.group import Merge, env_name, one_server, part_pipeline
from airflow_sync_provider.core.source.locks import lock_holder, lock_name
from airflow_sync_provider.core.source.reader import connect


def add_parser(sub) -> None:
    cdc = sub.add_parser("cdc", help="change data capture: apply the binlog to the copies, or show a pipeline")
    cdc_sub = cdc.add_subparsers(dest="cdc_command", required=True)
    for name, text in (("apply", "catch up from the checkpoint to the source's position now, then exit"),
                       ("run", "apply continuously (a long-running service) until stopped or --max-seconds")):
        _add_apply_parser(cdc_sub, name, text)
    _add_bootstrap_parser(cdc_sub)
    _add_status_parser(cdc_sub)
    _add_stop_parser(cdc_sub)


def _add_apply_parser(cdc_sub, name: str, text: str) -> None:
    """``cdc apply`` and ``cdc run`` take the same arguments; ``run`` also ``--max-seconds``."""
    command = cdc_sub.add_parser(name, help=text)
    url_arguments(command)
    command.add_argument("--pipeline", required=True)
    command.add_argument("--start-from-load", action="append",
                         help="a new pipeline: a full-load key whose table it replicates (repeat)")
    command.add_argument("--table", action="append", help="db.table (with a start position from a load)")
    selection_arguments(command, pipeline=True)
    command.add_argument("--lanes", type=int, default=4)
    command.add_argument("--batch-events", type=int, default=50_000)
    command.add_argument("--batch-bytes", type=int, default=16 << 20,
                         help="row-event bytes per batch; a larger transaction is written in pieces")
    command.add_argument("--driver-write-rows", type=int, default=500_000,
                         help="batches up to this many row changes are written by the driver (0: Spark tasks)")
    command.add_argument("--reset", action="store_true", help="forget the checkpoint; start from the loads again")
    command.add_argument("--history", action="store_true",
                         help="keep every version of the copies' rows in <table>_history, begun from each copy as it "
                              "is at the checkpoint (docs/content.md); until they write it too, XA, cascades, "
                              "TRUNCATE, DDL, re-copies and repairs of such a copy stop the pipeline")
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
    command.add_argument("--no-follow-cascades", action="store_true",
                         help="do not derive the rows foreign-key cascades change without binlog events (the "
                              "copies of their children then go wrong; for measuring, or a server known to log them: "
                              "MySQL >= 9.6 is detected by itself)")
    command.add_argument("--cascade-rows", type=int, default=2_000_000,
                         help="child rows a batch's cascades may hold in memory at once (the bound)")
    command.add_argument("--placement", choices=("driver", "executors"), default="driver",
                         help="a source group: every source's pipeline in the driver (a thread each), or as a "
                              "long-running Spark task each on the cluster's executors")
    command.add_argument("--on-shard-removed", choices=("keep", "delete"), default="keep",
                         help="a source group: a shard (table or source) that leaves keeps its rows in the merged "
                              "copy, or they are deleted")
    if name == "run":
        command.add_argument("--max-seconds", type=float, help="stop after this long (default: never)")
    salt_argument(command)
    job_arguments(command)
    command.set_defaults(func=cmd_cdc_apply)


def cmd_cdc_apply(args) -> int:
    return submit(_cdc_spec(args, service=args.cdc_command == "run"), args, f"cdc {args.cdc_command}", applied_line)


def _cdc_spec(args, service: bool) -> CdcApplySpec:
    sources = group_sources(args)
    return CdcApplySpec(sources=sources or one_server(MySQLEndpoint.from_url(args.mysql_url)),
                        merge=Merge.of(args.merge_into or "", placement=args.placement,
                                       on_shard_removed=args.on_shard_removed),
                        target=ClickHouseEndpoint.from_url(args.clickhouse_url), pipeline=args.pipeline,
                        tableset=TableSet(tables=named_tables(args), select=_selection(args),
                                          content={"history": True} if args.history else None),
                        start_from_loads=args.start_from_load or [], lanes=args.lanes, batch_events=args.batch_events,
                        batch_bytes=args.batch_bytes, driver_write_rows=args.driver_write_rows, reset=args.reset,
                        service=service, verify=args.verify, verify_period=args.verify_every or args.verify_period,
                        verify_budget=args.verify_budget, verify_after_ddl=not args.no_verify_after_ddl,
                        change_selection=args.change_selection, on_binlog_lost=args.on_binlog_lost,
                        follow_cascades=not args.no_follow_cascades, cascade_rows=args.cascade_rows,
                        max_seconds=getattr(args, "max_seconds", None), batch_seconds=0.5 if service else 1.0,
                        ledger_database=args.ledger_database, hash_salt=salt_of(args))


def named_tables(args) -> list:
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


def applied_line(r: dict) -> str:
    if "sources" in r:  # a source group: a line per source's pipeline
        return "\n".join([f"{name}: " + applied_line(one) for name, one in r["sources"].items()]
                         + [f"pipeline {r['pipeline']!r}: {r['events']:,} row changes from {len(r['sources'])} "
                            f"source(s), {r['seconds']:.1f} s"])
    return (f"pipeline {r['pipeline']!r}: {r['events']:,} row changes applied, checkpoint "
            f"{r['checkpoint']['file']}:{r['checkpoint']['pos']}, {r['seconds']:.1f} s"
            + (f"; {r['cascaded_rows']:,} child rows of foreign-key cascades" if r.get("cascaded_rows") else "")
            + (f"; {len(r['verified'])} table check(s), {r['repaired_shards']} shard(s) repaired" if r["verified"]
               else ""))


def _add_bootstrap_parser(cdc_sub) -> None:
    boot = cdc_sub.add_parser("bootstrap", help="copy tables chunk by chunk under live writes (no locks; resumable) "
                                                "and hand them to the pipeline's catch-up")
    url_arguments(boot)
    boot.add_argument("--pipeline", required=True)
    boot.add_argument("--table", action="append", help="db.table (repeat)")
    selection_arguments(boot, pipeline=True)
    boot.add_argument("--channels", type=int, default=2)
    boot.add_argument("--chunk-rows", type=int, default=DEFAULT_CHUNK_ROWS)
    boot.add_argument("--watermark-table", help="MySQL only: db.table the job may create and write (exact positions)")
    boot.add_argument("--restart", action="store_true", help="start again instead of resuming")
    boot.add_argument("--driver-copy-rows", type=int, default=None, help=DRIVER_COPY_ROWS_HELP)
    layout_arguments(boot)
    content_arguments(boot)
    job_arguments(boot)
    boot.set_defaults(func=cmd_cdc_bootstrap)


def cmd_cdc_bootstrap(args) -> int:
    sources = group_sources(args)
    spec = CdcBootstrapSpec(sources=sources or one_server(MySQLEndpoint.from_url(args.mysql_url)),
                            merge=Merge.of(args.merge_into or ""),
                            target=ClickHouseEndpoint.from_url(args.clickhouse_url), pipeline=args.pipeline,
                            tableset=TableSet(tables=named_tables(args), select=_selection(args),
                                              layout=layout_of(args), content=content_of(args)),
                            hash_salt=salt_of(args),
                            channels=args.channels, chunk_rows=args.chunk_rows, watermark_table=args.watermark_table,
                            restart=args.restart, change_selection=args.change_selection,
                            ledger_database=args.ledger_database, driver_copy_rows=args.driver_copy_rows)
    return submit(spec, args, "cdc bootstrap", _bootstrapped)


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


def _add_status_parser(cdc_sub) -> None:
    # its own URL arguments: the MySQL URL is optional here (main lets it be missing), only for lag
    status = cdc_sub.add_parser("status", help="checkpoint, source position, lag, counters, last error")
    status.add_argument("--mysql-url", default=os.environ.get("MYSQL_URL"),
                        help="the source, for lag (default: $MYSQL_URL; optional)")
    status.add_argument("--clickhouse-url", default=os.environ.get("CLICKHOUSE_URL"))
    status.add_argument("--ledger-database", default=DEFAULT_LEDGER_DATABASE)
    status.add_argument("--pipeline", required=True)
    status.add_argument("--json", action="store_true")
    status.set_defaults(func=cmd_cdc_status)


def _add_stop_parser(cdc_sub) -> None:
    stop = cdc_sub.add_parser("stop", help="ask a running service to stop at its next batch boundary (checkpoint "
                                           "written, re-copies finished; exits once it has)")
    stop.add_argument("--clickhouse-url", default=os.environ.get("CLICKHOUSE_URL"))
    stop.add_argument("--ledger-database", default=DEFAULT_LEDGER_DATABASE)
    stop.add_argument("--pipeline", required=True)
    stop.add_argument("--reason", default="", help="recorded with the request and logged by the service")
    stop.add_argument("--wait", type=float, default=60.0, metavar="SECONDS",
                      help="how long to wait for the service to stop (0: ask and return; default 60)")
    stop.set_defaults(func=cmd_cdc_stop)


def cmd_cdc_stop(args) -> int:
    """Ask the pipeline's running applier (every source's, for a source group) to stop; 0 once each
    has stopped (or none was running), 1 if one still runs after ``--wait``."""
    ch = client(ClickHouseEndpoint.from_url(args.clickhouse_url))
    try:
        checkpoints = Checkpoints(ch, args.ledger_database)
        checkpoints.ensure()
        group = checkpoints.group(args.pipeline)
        names = [part_pipeline(args.pipeline, s) for s in group.sources] if group else [args.pipeline]
        asked = {name: checkpoints.request_stop(name, args.reason) for name in names}
        deadline = time.monotonic() + args.wait
        waiting = {name: g for name, g in asked.items() if g is not None}
        while waiting and time.monotonic() < deadline:
            time.sleep(0.5)
            waiting = {name: g for name, g in waiting.items() if _still_running(checkpoints.state(name), g)}
    finally:
        ch.close()
    for name, generation in asked.items():
        print(f"{name}: " + ("no applier running" if generation is None else
                             "still running (asked to stop; it stops at its next batch boundary)" if name in waiting
                             else "stopped as asked" if args.wait else "asked to stop"))
    return 1 if waiting and args.wait else 0


def _still_running(state, generation: int) -> bool:
    return state is not None and state.generation == generation and state.status == PIPELINE_RUNNING


def cmd_cdc_status(args) -> int:
    """A pipeline's status; a source group's: one line for the group, then every source's pipeline
    (its lag against the source when ``$MYSQL_URL_<NAME>`` is set)."""
    ch = client(ClickHouseEndpoint.from_url(args.clickhouse_url))
    try:
        checkpoints = Checkpoints(ch, args.ledger_database)
        checkpoints.ensure()
        group = checkpoints.group(args.pipeline)
        parts = {name: checkpoints.state(part_pipeline(args.pipeline, name)) for name in (group.sources if group
                                                                                          else ())}
    finally:
        ch.close()
    if group is None:
        return _pipeline_status(args)
    if not args.json:
        print(f"source group {args.pipeline!r}: {len(parts)} source(s)"
              + (f" merged into {group.merge_into}" if group.merged else "") + "; "
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
        print(json.dumps({"pipeline": args.pipeline, "group": group.to_dict(), "sources": out,
                          "lag_seconds": max(lags) if lags and None not in lags else None}, indent=2, default=str))
    return 0


def _pipeline_status(args) -> int:
    ch = client(ClickHouseEndpoint.from_url(args.clickhouse_url))
    try:
        ledger = Checkpoints(ch, args.ledger_database)
        ledger.ensure()
        state = ledger.state(args.pipeline)
        if state is None:
            raise LookupError(f"no pipeline {args.pipeline!r} in {args.ledger_database}")
        counters = ledger.counters(args.pipeline)
        selection = ledger.selection(args.pipeline)
        # each copy's layout (core/clickhouse/layout.py) as its table comment records it, and what each
        # holds (core/content/): transforms by column, filter, delete rule; never the salt
        copies = ledger.copies(state)
        layouts = {name: copy.layout.to_dict() for name, copy in copies.items()}
        contents = {name: copy.content.to_dict() for name, copy in copies.items()}
    finally:
        ch.close()
    status = state.to_dict() | {"counters": counters, "selection": selection, "layouts": layouts,
                                "contents": contents}
    if args.mysql_url:  # lag against the source now, and whether the lease is held
        ch = client(ClickHouseEndpoint.from_url(args.clickhouse_url))
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
    for name, layout in sorted(layouts.items()):
        if layout:  # the mirror's (ORDER BY the key) goes unsaid
            print(f"{name}: laid out as {json.dumps(layout, sort_keys=True)} (airflow-sync reshape changes it)")
    for name, content in sorted(contents.items()):
        if content:  # every row and value as the source has them goes unsaid
            print(f"{name}: holds {describe_content(content)}")
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

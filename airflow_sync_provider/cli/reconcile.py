"""``airflow-sync reconcile``: compare a published load with its source shard by shard (counts,
``--checksum``), optionally re-import what differs; exit 3 on a mismatch."""

from __future__ import annotations

from airflow_sync_provider.cli.common import job_arguments, run_reported, url_arguments
from airflow_sync_provider.cli.selection import (
    group_selection,
    group_sources,
    pattern_selection,
    salt_argument,
    salt_of,
    selection_arguments,
)
from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
from airflow_sync_provider.core.jobspec import ReconcileSpec
from airflow_sync_provider.core.selection import TableSet
from airflow_sync_provider.core.source.group import Merge, one_server
from airflow_sync_provider.core.verify.reconcile import OK, SHAPE_MISMATCH
from airflow_sync_provider.core.verify.reports import reconcile_table
from airflow_sync_provider.plugins.reports import write_report


def add_parser(sub) -> None:
    reconcile = sub.add_parser("reconcile", help="compare a published load shard by shard (counts, --checksum)")
    url_arguments(reconcile)
    reconcile.add_argument("--load", help="load key (with --database / --select-table: the prefix of the tables' keys)")
    selection_arguments(reconcile)
    reconcile.add_argument("--checksum", action="store_true", help="also compare content checksums per shard")
    reconcile.add_argument("--reimport", action="store_true",
                           help="re-import mismatched shards into the published table, then compare again")
    reconcile.add_argument("--report-dir", help="where the HTML report goes")
    salt_argument(reconcile)
    job_arguments(reconcile)
    reconcile.set_defaults(func=cmd_reconcile)


def cmd_reconcile(args) -> int:
    sources = group_sources(args)
    if sources:
        select = group_selection(args) if args.database else None
        if not args.merge_into and not select:
            raise SystemExit("airflow-sync: reconcile a group's merged copy with --merge-into (as loaded), or its "
                             "side-by-side copies with --database [--select-table …]")
        spec = ReconcileSpec(target=ClickHouseEndpoint.from_url(args.clickhouse_url), load_key=args.load or "",
                             checksum=args.checksum, reimport=args.reimport, ledger_database=args.ledger_database,
                             tableset=TableSet(select=select, parallel=args.parallel_tables), sources=sources,
                             merge=Merge.of(args.merge_into or ""), hash_salt=salt_of(args))
    else:
        source = MySQLEndpoint.from_url(args.mysql_url)
        select = pattern_selection(args, source) if args.database or args.select_table or args.exclude_table \
            or not args.load else None
        spec = ReconcileSpec(sources=one_server(source), target=ClickHouseEndpoint.from_url(args.clickhouse_url),
                             load_key=args.load or "", checksum=args.checksum, reimport=args.reimport,
                             ledger_database=args.ledger_database,
                             tableset=TableSet(select=select, parallel=args.parallel_tables), hash_salt=salt_of(args))
    reported = run_reported(spec, args, "reconcile", write_report)
    if reported is None:
        return 1
    result, tables = reported
    if not args.json:
        _print_verdicts(result, tables)
    return 0 if result["verdict"] == OK else 3


def _print_verdicts(result: dict, tables: list[dict]) -> None:
    for one in tables:
        if len(tables) > 1:
            print(f"{one.get('member') or one['table']} → {one['target']} (load {one['load_key']!r}):")
        if one["shards"]:
            print(reconcile_table(one["shards"]))
        for note in one["shape"]["notes"]:
            print(f"note: {note}")
        if one.get("before"):
            print(f"first pass: shards {one['before']['mismatched']} mismatched; re-imported "
                  f"{one['reimported']['rows']:,} rows into them")
            for warning in one["reimported"].get("warnings") or []:
                print(f"note: {warning}")
        if one.get("history"):  # a copy that keeps a history: its three checks (core/verify/history.py)
            history = one["history"]
            faults = {c: history[c]["faults"] for c in ("latest", "conflicts")}
            faults |= {f"gaps ({p})": g["faults"] for p, g in history["gaps"].items()}
            print(f"history: {'ok' if history['ok'] else 'fails'}; faults {faults}"
                  + (f"; holes recorded {len(one['history_holes'])}" if one.get("history_holes") else ""))
        if one["verdict"] == SHAPE_MISMATCH:
            print(f"verdict: {SHAPE_MISMATCH}: {'; '.join(one['shape']['problems'])}; {one['remedy']}; "
                  f"report {one['report']}")
        else:
            print(f"verdict: {one['verdict']}; mismatched shards: {one['mismatched'] or 'none'}; "
                  f"report {one['report']}")
    if len(tables) > 1:
        print(f"verdict of the {len(tables)} tables: {result['verdict']}")

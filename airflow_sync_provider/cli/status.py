"""``airflow-sync status``: a load's shards and hook counters, from the ledger (or, for a load of
many tables, each table's)."""

from __future__ import annotations

import json

from airflow_sync_provider.cli.common import url_arguments
from airflow_sync_provider.core.clickhouse.client import client
from airflow_sync_provider.core.endpoints import ClickHouseEndpoint
from airflow_sync_provider.core.ledger import Ledger, check_counters
from airflow_sync_provider.core.verify.reports import shard_table


def add_parser(sub) -> None:
    status = sub.add_parser("status", help="a load's shards and hook counters from the ledger")
    url_arguments(status, mysql=False)
    status.add_argument("--load", required=True, help="load key")
    status.add_argument("--json", action="store_true")
    status.set_defaults(func=cmd_status)


def cmd_status(args) -> int:
    target = ClickHouseEndpoint.from_url(args.clickhouse_url)
    verdict, message, summary = check_counters(target, args.load, args.ledger_database)
    ch = client(target)
    try:
        ledger = Ledger(ch, args.ledger_database)
        state = ledger.state(args.load)
        found = ledger.load_set(args.load) if state is None else None
        tables = {key: ledger.state(key) for key in found[0]} if found else {}
    finally:
        ch.close()
    if state is None and found is not None:  # a load of many tables: each one's
        if args.json:
            print(json.dumps(summary | {"loads": {k: s.to_dict() if s else None for k, s in tables.items()}},
                             indent=2, default=str))
            return 0
        print(f"load {args.load!r}, {len(tables)} table(s) — {verdict}: {message}")
        for key, one in tables.items():
            print(f"  {key}: " + (f"generation {one.generation} {one.status}" if one else
                                  f"never recorded ({found[1].get(key, 'not run yet')})"))
        return 0
    if state is None:
        raise LookupError(f"no load {args.load!r} in {args.ledger_database}")
    if args.json:
        print(json.dumps(state.to_dict() | {"verdict": verdict, "message": message}, indent=2, default=str))
    else:
        print(f"load {state.load_key!r} generation {state.generation}: {state.status}"
              f"{' (stale: no heartbeat)' if state.stale else ''} — {verdict}: {message}")
        print(shard_table([vars(s) | {"seconds": s.seconds} for s in state.shards.values()]))
    return 0

"""Reports a person reads in a log or a terminal, as plain text: a load's per-shard table, a
reconciliation's per-shard table, a snapshot diff's summary line. (The reconciliation and diff
pages, HTML, are rendered by plugins/pages.py and written as files by plugins/reports.py.)"""

from __future__ import annotations


def shard_table(shards: list[dict]) -> str:
    """The final per-shard report (shard, status, rows, MB, seconds, rows/s)."""
    lines = [f"{'shard':>5} {'status':>8} {'attempt':>7} {'rows':>12} {'MB':>9} {'seconds':>8} {'rows/s':>10}"]
    for s in sorted(shards, key=lambda s: s["shard_id"]):
        rate = s["records_written"] / s["seconds"] if s["seconds"] else 0
        lines.append(f"{s['shard_id']:>5} {s['status']:>8} {s['attempt']:>7} {s['records_written']:>12,} "
                     f"{s['bytes'] / 1e6:>9.1f} {s['seconds']:>8.2f} {rate:>10,.0f}")
    return "\n".join(lines)


def reconcile_table(shards: list[dict]) -> str:
    """Per-shard reconciliation report for the log."""
    lines = [f"{'shard':>5} {'source':>12} {'target':>12} {'read':>12} {'written':>12} {'failed':>7}  verdict"]
    for s in shards:
        lines.append(f"{s['shard_id']:>5} {s['source_rows']:>12,} {s['target_rows']:>12,} "
                     f"{s['records_read'] if s['records_read'] is not None else '-':>12} "
                     f"{s['records_written'] if s['records_written'] is not None else '-':>12} "
                     f"{s['records_failed'] if s['records_failed'] is not None else '-':>7}  "
                     + ("; ".join(s["problems"]) if s["problems"] else "ok"))
    return "\n".join(lines)


def diff_summary(result: dict) -> str:
    """One line per flag and what pruning saved, for logs and the command line."""
    counts = result["counts"]
    return (f"{result['new']} → {result['old']}: {result['verdict']}; "
            + ", ".join(f"{flag} {n:,}" for flag, n in counts.items())
            + f"; read row by row: {result['rows_read_old'] + result['rows_read_new']:,} of "
              f"{result['rows_old'] + result['rows_new']:,} rows ({result['shards_read']}/{result['shards']} shards)")

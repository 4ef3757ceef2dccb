"""Reports a person reads: the per-shard table of a load."""

from __future__ import annotations


def shard_table(shards: list[dict]) -> str:
    """The final per-shard report (shard, status, rows, MB, seconds, rows/s)."""
    lines = [f"{'shard':>5} {'status':>8} {'attempt':>7} {'rows':>12} {'MB':>9} {'seconds':>8} {'rows/s':>10}"]
    for s in sorted(shards, key=lambda s: s["shard_id"]):
        rate = s["records_written"] / s["seconds"] if s["seconds"] else 0
        lines.append(f"{s['shard_id']:>5} {s['status']:>8} {s['attempt']:>7} {s['records_written']:>12,} "
                     f"{s['bytes'] / 1e6:>9.1f} {s['seconds']:>8.2f} {rate:>10,.0f}")
    return "\n".join(lines)

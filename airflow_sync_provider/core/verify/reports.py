"""Reports a person reads: a load's per-shard table, reconciliation and snapshot-diff pages."""

from __future__ import annotations

import os
import re
import tempfile


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


def reconcile_html(result: dict) -> str:
    """A page a person would rather look at: source vs target bars per shard, mismatches in red."""
    from html import escape

    shards = result["shards"]
    top = max([max(s["source_rows"], s["target_rows"]) for s in shards] + [1])
    bar_w, gap, height = 18, 14, 220
    width = len(shards) * (2 * bar_w + gap) + 60
    bars = []
    for i, s in enumerate(shards):
        x = 50 + i * (2 * bar_w + gap)
        bad = bool(s["problems"])
        for j, (value, colour) in enumerate(((s["source_rows"], "#4e79a7"),
                                             (s["target_rows"], "#e15759" if bad else "#59a14f"))):
            h = value / top * height
            bars.append(f'<rect x="{x + j * bar_w}" y="{20 + height - h:.1f}" width="{bar_w - 2}" height="{h:.1f}" '
                        f'fill="{colour}"><title>shard {s["shard_id"]}: {"source" if j == 0 else "target"} '
                        f'{value:,}</title></rect>')
        bars.append(f'<text x="{x + bar_w}" y="{height + 38}" font-size="11" text-anchor="middle">{s["shard_id"]}'
                    f'{" ✗" if bad else ""}</text>')
    def num(value):
        return "–" if value is None else f"{value:,}"

    rows = "".join(
        f"<tr class='{'bad' if s['problems'] else ''}'><td>{s['shard_id']}</td><td>{num(s['source_rows'])}</td>"
        f"<td>{num(s['target_rows'])}</td><td>{num(s['records_read'])}</td><td>{num(s['records_written'])}</td>"
        f"<td>{num(s['records_failed'])}</td><td class='v'>{escape('; '.join(s['problems']) or 'ok')}</td></tr>"
        for s in shards)
    title = escape(f"{result['table']} → {result['target']}: {result['verdict']}")
    repaired = ""
    shape = result.get("shape") or {}
    if shape.get("problems"):  # no shard was compared: the copy's shape is not the source's
        repaired += ("\n<p class='bad'>The copy's shape no longer matches the source's, so no shard was compared:"
                     "</p><ul>"
                     + "".join(f"<li>{escape(p)}</li>" for p in shape["problems"]) + "</ul>"
                     + f"\n<p>{escape(result.get('remedy', ''))}</p>")
    for note in shape.get("notes", []):
        repaired += f"\n<p class='note'>{escape(note)}</p>"
    if result.get("before"):
        repaired += (f"\n<p>First pass: shards {result['before']['mismatched']} mismatched; they were re-imported "
                    f"({result['reimported']['rows']:,} rows) and every shard compared again (below).</p>")
    return f"""<!doctype html><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:sans-serif;margin:2em}} td,th{{padding:2px 8px;text-align:right}}
tr.bad td,p.bad{{color:#b00;font-weight:bold}} td.v,th.v{{text-align:left}} \
.legend span{{display:inline-block;width:12px;height:12px;margin:0 4px}}</style>
<h1>{title}</h1>
<p>load <code>{escape(result['load_key'])}</code>, generation {result['generation']}, checksums
{'on' if result['checksum'] else 'off'}; mismatched shards: {result['mismatched'] or 'none'}</p>{repaired}
<p class="legend"><span style="background:#4e79a7"></span>source rows \
<span style="background:#59a14f"></span>target rows
<span style="background:#e15759"></span>target rows of a mismatched shard</p>
<svg width="{width}" height="{height + 50}" role="img">{''.join(bars)}</svg>
<table><tr><th>shard</th><th>source</th><th>target</th><th>read</th><th>written</th><th>failed</th>\
<th class="v">verdict</th></tr>
{rows}</table>
"""


def write_report(result: dict, directory: str | None = None) -> str:
    """Write the HTML reconciliation report; returns its path."""
    path = _page_path(f"{result['load_key']}.g{result['generation']}", directory)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(reconcile_html(result))
    return path


def _page_path(name: str, directory: str | None) -> str:
    directory = directory or os.path.join(tempfile.gettempdir(), "airflow-sync-reports")
    os.makedirs(directory, exist_ok=True)
    return os.path.join(directory, re.sub(r"[^A-Za-z0-9._-]+", "_", name) + ".html")


def diff_html(result: dict, shards: list[dict], samples: dict, note: str = "") -> str:
    """Counts per flag, what pruning saved, and sample rows per flag with changed cells marked
    (``note``: why there are none, e.g. the change set could not be read)."""
    from html import escape

    counts = result["counts"]
    title = escape(f"{result['new']} → {result['old']}: {result['verdict']}")
    flags = "".join(f"<tr><td class='v'>{f}</td><td>{counts[f]:,}</td></tr>" for f in counts)
    read = (f"{result['rows_read_old'] + result['rows_read_new']:,} rows read row by row "
            f"(old {result['rows_read_old']:,}, new {result['rows_read_new']:,}) of "
            f"{result['rows_old'] + result['rows_new']:,}; {result['shards_read']} of {result['shards']} shards, "
            f"{result['buckets_read']} buckets")
    keys, compared = result["keys"], result["compared"]

    def cell(value):
        return escape("NULL" if value is None else str(value))

    sections = []
    for flag, rows in samples.items():
        if not rows:
            continue
        head = "".join(f"<th>{escape(k)}</th>" for k in keys) + "".join(f"<th>{escape(c)}</th>" for c in compared)
        body = []
        for row in rows:
            cells = "".join(f"<td>{cell(row[k])}</td>" for k in keys)
            for c in compared:
                old, new = row[f"old__{c}"], row[f"new__{c}"]
                if c in row["changed"]:
                    cells += f"<td class='chg'><s>{cell(old)}</s> → {cell(new)}</td>"
                else:
                    cells += f"<td>{cell(new if flag != 'deleted' else old)}</td>"
            body.append(f"<tr>{cells}</tr>")
        sections.append(f"<h2>{flag}: {counts[flag]:,} (first {len(rows)})</h2>"
                        f"<table><tr>{head}</tr>{''.join(body)}</table>")
    per_shard = "".join(
        f"<tr><td>{s['shard_id']}</td><td>{s['old_rows']:,}</td><td>{s['new_rows']:,}</td>"
        f"<td>{s['buckets_read']}/{s['buckets']}</td><td>{s['rows_read_old'] + s['rows_read_new']:,}</td>"
        f"<td>{s['changed']:,}</td><td>{s['new']:,}</td><td>{s['deleted']:,}</td></tr>" for s in shards)
    return f"""<!doctype html><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:sans-serif;margin:2em}} td,th{{padding:2px 8px;text-align:right;border-bottom:1px solid #eee}}
td.v{{text-align:left}} td.chg{{background:#ffe0e0}} s{{color:#888}}</style>
<h1>{title}</h1>
<p>diff <code>{escape(result['diff_key'])}</code>, run <code>{escape(result['run_id'])}</code>; change set in
<code>{escape(result['changes_table'])}</code>; compared columns: {escape(', '.join(compared) or '(none)')}</p>
<table>{flags}</table><p>{read}</p>{f"<p class='note'>{escape(note)}</p>" if note else ""}
{''.join(sections)}
<h2>shards</h2><table><tr><th>shard</th><th>old</th><th>new</th><th>buckets read</th><th>rows read</th>
<th>changed</th><th>new</th><th>deleted</th></tr>{per_shard}</table>
"""


def write_diff_report(result: dict, directory: str | None = None) -> str:
    """Write a snapshot diff's HTML page (``result`` as the job returns it); returns its path."""
    path = _page_path(f"{result['diff_key']}.{result['run_id']}", directory)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(diff_html(result, result["shard_results"], result["samples"]))
    return path


def diff_summary(result: dict) -> str:
    """One line per flag and what pruning saved, for logs and the command line."""
    counts = result["counts"]
    return (f"{result['new']} → {result['old']}: {result['verdict']}; "
            + ", ".join(f"{flag} {n:,}" for flag, n in counts.items())
            + f"; read row by row: {result['rows_read_old'] + result['rows_read_new']:,} of "
              f"{result['rows_old'] + result['rows_new']:,} rows ({result['shards_read']}/{result['shards']} shards)")

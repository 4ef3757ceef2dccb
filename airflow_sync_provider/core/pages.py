"""The Sync view's pages as HTML (core/overview.py gathers what they show): server-rendered, no
script, every value escaped, every row linked to the Airflow task instance that produced it.

Links are relative to ``/sync/``: a task instance is ``../dags/<dag>/runs/<run>/tasks/<task>``
(``/mapped/<index>`` for a mapped one), the Airflow UI's own route, so they hold under any
``[api] base_url`` path.
"""

from __future__ import annotations

import json
import time
from html import escape
from urllib.parse import quote, urlencode

from airflow_sync_provider.core.ledger import SHARD_SUCCESS, TaskRef, counters_disagree
from airflow_sync_provider.core.overview import (
    ATTENTION_ROWS,
    FAILED,
    LAG_WARNING_SECONDS,
    PAGE_ROWS,
    RECENT_DAYS,
    STATES,
    Filters,
    LoadRow,
    Overview,
    PipelineRow,
)

REFRESH_SECONDS = 15

_STYLE = """body{font-family:sans-serif;margin:1.2em;color:#222} h1{margin:.2em 0} \
h2{margin:1em 0 .3em;font-size:1.15em}
td,th{padding:2px 8px;text-align:right;border-bottom:1px solid #eee;vertical-align:top} td.v,th.v{text-align:left}
table{border-collapse:collapse} .failed,tr.failed td,p.error{color:#b00} .behind,tr.behind td{color:#a60}
.running{color:#06c} .ok,.published,.success,.idle{color:#2a7} form{margin:.4em 0} input{width:14em}
ul.attention{padding-left:1.2em;margin:.2em 0} ul.attention li{margin:.25em 0} .err{color:#666;font-size:.9em}
code{background:#f4f4f4;padding:0 3px} .counts span{margin-right:1.2em} .pager a{margin:0 .3em}
.bar{display:inline-block;height:.7em;background:#4e79a7;vertical-align:middle}"""


def ti_path(task: TaskRef) -> str:
    """The Airflow UI's page of a task instance, relative to ``/sync/``."""
    path = (f"../dags/{quote(task.dag_id, safe='')}/runs/{quote(task.run_id, safe='')}"
            f"/tasks/{quote(task.task_id, safe='')}")
    return path + (f"/mapped/{task.map_index}" if task.map_index >= 0 else "")


def task_link(task: TaskRef | None) -> str:
    if task is None:
        return "<span class='err'>no task recorded (the command line?)</span>"
    label = f"{task.dag_id}.{task.task_id}" + (f"[{task.map_index}]" if task.map_index >= 0 else "")
    return (f"<a class='ti' href='{escape(ti_path(task))}'"
            f" title='{escape(f'run {task.run_id}, try {task.try_number}')}'>"
            f"{escape(label)}</a> <span class='err'>{escape(task.run_id)}</span>")


def ago(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60), ("s", 1)):
        if seconds >= size or unit == "s":
            return f"{seconds / size:.0f} {unit} ago"


def _since(at: float | None, now: float) -> str:
    return ago(now - at) if at else "–"


def _query(filters: Filters, **change) -> str:
    values = {"table": filters.table, "state": filters.state, "load": filters.load, "page": filters.page,
              "days": filters.days} | change
    defaults = {"page": 1, "days": RECENT_DAYS}
    return "?" + urlencode({k: v for k, v in values.items() if v and defaults.get(k) != v})


def _page(title: str, body: str, refresh: int | None = REFRESH_SECONDS) -> str:
    meta = f'<meta http-equiv="refresh" content="{int(refresh)}">' if refresh else ""
    return (f'<!doctype html><meta charset="utf-8"><title>{escape(title)}</title>{meta}<style>{_STYLE}</style>'
            f"\n{body}\n")


def _load_link(row: LoadRow) -> str:
    s = row.state
    return (f"<a href='load?key={quote(s.load_key, safe='')}'>{escape(s.source_table)} → {escape(s.target_table)}</a>")


def _cmd(command: str) -> str:
    return f"<code>{escape(command)}</code>"


def _attention(view: Overview, now: float) -> str:
    items = []
    for row in view.failed[:ATTENTION_ROWS]:
        what, command = row.remedy()
        shards = row.failed_shards
        items.append(
            f"<li class='failed' data-kind='load'><b>✗ {_load_link(row)}</b> {escape(row.state.status)}"
            f"{' (its job died: no heartbeat)' if row.state.stale else ''}: shards {escape(str(shards))} of "
            f"{row.planned} {'differ from the source' if row.state.status == 'published' else 'did not complete'}"
            f" <span class='err'>{escape(row.error[:300])}</span><br>remedy: {escape(what)} — {task_link(row.task)};"
            f" or {_cmd(command)}</li>")
    if len(view.failed) > ATTENTION_ROWS:
        items.append(f"<li><a href='{escape(_query(view.filters, state=FAILED, page=1))}'>… and "
                     f"{len(view.failed) - ATTENTION_ROWS} more failed loads</a></li>")
    for e in view.set_errors:
        items.append(f"<li class='failed' data-kind='table'><b>✗ {escape(e['table'])}</b> (job "
                     f"<code>{escape(e['job'])}</code>) failed before its load began: <span class='err'>"
                     f"{escape(e['error'][:300])}</span><br>remedy: fix the cause and clear the job's task (its retry "
                     "copies the tables not yet published)</li>")
    for p in view.pipelines:
        if not (p.failing or p.behind):
            continue
        what, command = p.remedy()
        state = p.state
        head = (f"{state.status} at checkpoint {state.checkpoint}" if state.ended_badly else
                f"stopped reporting {ago(p.age)}" if state.stale else f"{p.lag:,.0f} s behind the source")
        items.append(
            f"<li class='{p.kind}' data-kind='pipeline'><b>{'✗' if p.failing else '⚠'} pipeline "
            f"<a href='?pipeline={quote(state.pipeline, safe='')}'>{escape(state.pipeline)}</a></b> {escape(head)}"
            f" (last report {ago(p.age)})"
            + (f" <span class='err'>{escape(state.error[:300])}</span>" if state.error else "")
            + f"<br>remedy: {escape(what)} — {task_link(p.task)}; or {_cmd(command)}</li>")
    if not items:
        return "<h2>Needs attention</h2><p class='ok' id='attention'>Nothing failed; no pipeline is behind.</p>"
    return (f"<h2>Needs attention ({len(items)})</h2><ul class='attention' id='attention'>{''.join(items)}</ul>")


def _counts(view: Overview) -> str:
    c, f = view.counts, view.filters

    def part(title: str, values: dict, link: bool = False) -> str:
        shown = [f"<a class='{k}' href='{escape(_query(f, state=k, page=1))}'>{n:,} {k}</a>" if link and n else
                 f"<b class='{k}'>{n:,}</b> {k}" for k, n in values.items() if n or k in (FAILED,)]
        return f"<span>{title}: {' · '.join(shown) or '0'}</span>"

    parts = [part("Loads", c["loads"], link=True), part("Shards", c["shards"])]
    if view.shown_pipelines:
        parts.append(part("Pipelines", c["pipelines"]))
    parts.append(part("Checks", c["reconciliations"]))
    if view.shown_pipelines:
        parts.append(part("Diffs", c["diffs"]))
    return f"<p class='counts' id='counts'>{''.join(parts)}</p>"


def _form(f: Filters) -> str:
    states = "".join(f"<option value='{s}'{' selected' if s == f.state else ''}>{s}</option>" for s in STATES)
    return ("<form method='get' action='./'>"
            f"<label>table <input name='table' value='{escape(f.table)}'"
            " placeholder='db.table, shop.*, *orders*'></label> "
            f"<label>state <select name='state'><option value=''>any</option>{states}</select></label> "
            f"<label>load key <input name='load' value='{escape(f.load)}' placeholder='key prefix'></label> "
            + (f"<input type='hidden' name='days' value='{f.days}'>" if f.days != RECENT_DAYS else "")
            + "<button>filter</button> <a href='./'>all</a></form>")


def _progress(row: LoadRow) -> str:
    estimated = row.estimated_rows
    share = min(0.99, row.rows_written / estimated) if estimated else 0.0
    return (f"<span class='bar' style='width:{share * 8:.1f}em'></span> {row.done}/{row.planned} shards, "
            f"{row.rows_written:,} of ~{estimated:,} rows ({share:.0%})")


def _running(view: Overview, now: float) -> str:
    if not view.running:
        return ""
    rows = "".join(
        f"<tr class='running'><td class='v'>{_load_link(r)}</td><td class='v'>{_progress(r)}</td>"
        f"<td>{_since(r.updated, now)}</td><td class='v'>{task_link(r.task)}</td></tr>" for r in view.running)
    more = view.counts["loads"]["running"] - len(view.running)
    return (f"<h2>Running ({view.counts['loads']['running']})</h2><table id='running'><tr><th class='v'>table</th>"
            f"<th class='v'>progress</th><th>last report</th><th class='v'>task</th></tr>{rows}</table>"
            + (f"<p>… and {more} more: <a href='{escape(_query(view.filters, state='running', page=1))}'>"
               "state=running</a></p>" if more > 0 else ""))


def _verification(p: PipelineRow, now: float) -> str:
    """The table verified longest ago (never verified first), and what the newest pass found."""
    v = p.state.verification()
    oldest = v["oldest"]
    if oldest is None:
        return "–"
    head = (f"oldest: {escape(oldest['table'])} "
            + ("<span class='failed'>never verified</span>" if not oldest["verified_at"]
               else _since(oldest["verified_at"], now)))
    last = p.last_verified
    return head + (f"; {v['repaired_shards']} slice(s) repaired in all" if v["repaired_shards"] else "") + (
        f"; newest: <span class='failed'>{len(last['mismatched'])} mismatched</span>" if last and last["mismatched"]
        else "")


def _applying(state) -> str:
    a = state.applying
    return (f"<br><span class='running' title='{escape(state.applying_line())}'>in a large transaction: "
            f"{a['changes'] + a.get('staged', 0):,} rows written</span>" if a else "")


def _pipeline_table(pipelines: list[PipelineRow], now: float) -> str:
    """A row per pipeline; a source group's are together under a row of the group (its merged copy,
    its sources, its worst lag), at the place of its first one."""
    order, seen = [], set()
    for p in pipelines:
        if p.group and p.group not in seen:
            seen.add(p.group)
            order += [p.group, *(q for q in pipelines if q.group == p.group)]
        elif not p.group:
            order.append(p)
    rows = []
    for p in order:
        if isinstance(p, str):  # a source group's row
            parts = [q for q in pipelines if q.group == p]
            lags = [q.lag for q in parts]
            worst = "–" if None in lags else f"{max(lags):,.0f} s"
            kind = FAILED if any(q.failing for q in parts) else "behind" if any(q.behind for q in parts) else "idle"
            rows.append(f"<tr class='{kind} group'><td class='v' colspan='9'><b>source group "
                        f"<a href='?pipeline={quote(p, safe='')}'>{escape(p)}</a></b> → {escape(parts[0].merge_into)}: "
                        f"{len(parts)} source(s), worst lag {worst}</td></tr>")
            continue
        s = p.state
        lag = ("–" if p.lag is None else "stopped" if p.failing and p.lag == 0 else "caught up" if p.lag == 0
               else f"{p.lag:,.0f} s")
        rows.append(
            f"<tr class='{p.kind}'><td class='v'><a href='?pipeline={quote(s.pipeline, safe='')}'>"
            f"{escape(s.pipeline)}</a>"
            f"</td><td class='v'>{escape(p.kind)}{_applying(s)}</td><td>{lag}</td><td>{ago(p.age)}</td>"
            f"<td>{s.events:,}</td>"
            f"<td class='v'>{_verification(p, now)}</td><td class='v'>{escape(', '.join(p.recopying)) or '–'}</td>"
            f"<td class='v'>{task_link(p.task)}</td><td class='v err'>{escape(s.error[:200])}</td></tr>")
    return ("<table id='pipelines'><tr><th class='v'>pipeline</th><th class='v'>state</th><th>lag</th>"
            "<th>checkpoint written</th><th>changes applied</th><th class='v'>last verification</th>"
            "<th class='v'>re-copies under way</th><th class='v'>task</th><th class='v'>error</th></tr>"
            f"{''.join(rows)}</table>")


def _check_cell(row: LoadRow) -> str:
    check = row.check
    if not check:
        return "–"
    cls = "ok" if check["verdict"] == "ok" else FAILED
    return (f"<a class='{cls}' href='reconciliation?load={quote(row.state.load_key, safe='')}'>"
            f"{escape(check['verdict'])}"
            + (f" {escape(str(check['mismatched']))}" if check["mismatched"] else "") + "</a>")


def _rows(view: Overview, now: float) -> str:
    f = view.filters
    body = "".join(
        f"<tr class='{r.kind}' data-key='{escape(r.state.load_key)}'><td class='v'>{escape(r.kind)}</td>"
        f"<td class='v'>{_load_link(r)}</td><td class='v'><code>{escape(r.state.load_key)}</code>"
        f" g{r.state.generation}</td>"
        f"<td>{r.done}/{r.planned}"
        + (f" <span class='failed'>✗{len(r.failed_shards)}</span>" if r.failed_shards else "")
        + f"</td><td>{r.rows_written:,}</td><td>{_since(r.updated, now)}</td><td class='v'>{_check_cell(r)}</td>"
        f"<td class='v'>{task_link(r.task)}</td><td class='v'><a href='load?key={quote(r.state.load_key, safe='')}'>"
        "shards</a></td></tr>" for r in view.rows)
    pager = ""
    if view.pages > 1:
        links = [f"<a href='{escape(_query(f, page=n))}'>{n}</a>" if n != f.page else f"<b>{n}</b>"
                 for n in range(1, view.pages + 1)]
        pager = f"<p class='pager'>page {' '.join(links)}</p>"
    title = (f"Tables ({view.total:,} load(s){', ' + escape(f.state) if f.state else ''}; page {f.page} of "
             f"{view.pages}, {PAGE_ROWS} a page)")
    if not view.rows:
        return f"<h2>{title}</h2><p class='empty'>No loads match.</p>"
    return (f"<h2>{title}</h2><table id='tables'><tr><th class='v'>state</th><th class='v'>table</th>"
            "<th class='v'>load key</th><th>shards done</th><th>rows written</th><th>last report</th>"
            f"<th class='v'>last check</th><th class='v'>task</th><th></th></tr>{body}</table>{pager}")


def _reconciliations(checks: list[dict]) -> str:
    if not checks:
        return ""
    rows = "".join(
        f"<tr class='{'' if r['verdict'] == 'ok' else 'failed'}'><td class='v'><a href='reconciliation?load="
        f"{quote(r['load_key'], safe='')}'>{escape(r['load_key'])}</a></td><td>{r['generation']}</td>"
        f"<td class='v'>{escape(r['verdict'])}</td>"
        f"<td class='v'>{escape(str(list(r['mismatched']))) if r['mismatched'] else ''}"
        f"</td><td class='v'>{'yes' if r['checksum'] else 'no'}</td><td class='v'>{task_link(r.get('task'))}</td></tr>"
        for r in checks)
    return ("<h2>Recent reconciliations</h2><table id='reconciliations'><tr><th class='v'>load</th><th>generation</th>"
            "<th class='v'>verdict</th><th class='v'>mismatched shards</th><th class='v'>checksums</th>"
            f"<th class='v'>task</th></tr>{rows}</table>")


def diffs_table(runs: list[dict]) -> str:
    if not runs:
        return "<p class='empty'>No diffs yet.</p>"
    rows = "".join(
        f"<tr class='{'behind' if d['verdict'] == 'changed' else ''}'><td class='v'><a href='diff?key="
        f"{quote(d['diff_key'], safe='')}&amp;run={quote(d['run_id'], safe='')}'>{escape(d['diff_key'])}</a></td>"
        f"<td class='v'>{escape(d['run_id'])}</td><td class='v'>{escape(d['verdict'])}</td>"
        + "".join(f"<td>{d['counts'].get(f, 0):,}</td>" for f in ("identical", "changed", "new", "deleted"))
        + f"<td>{d['rows_read_old'] + d['rows_read_new']:,}</td><td class='v'>{task_link(d.get('task'))}</td></tr>"
        for d in runs)
    return ("<table id='diffs'><tr><th class='v'>diff</th><th class='v'>run</th><th class='v'>verdict</th>"
            "<th>identical</th><th>changed</th><th>new</th><th>deleted</th><th>rows read</th><th class='v'>task</th>"
            f"</tr>{rows}</table>")


def overview_html(view: Overview, now: float | None = None) -> str:
    """The first page: counts, what needs attention with its remedy, running loads, pipelines,
    then a page of table loads (collapsed: a load's shards are on its own page)."""
    now = time.time() if now is None else now
    f = view.filters
    scope = f" — loads {escape(f.load)}*" if f.load else ""
    body = [f"<h1>Sync{scope}</h1>", _form(f), _counts(view), _attention(view, now), _running(view, now)]
    if view.shown_pipelines:
        body.append(f"<h2>CDC pipelines ({len(view.pipelines)})</h2>"
                    + (_pipeline_table(view.pipelines, now) if view.pipelines
                       else "<p class='empty'>No pipelines.</p>"))
    body.append(_rows(view, now))
    body.append(_reconciliations(view.reconciliations))
    if view.shown_pipelines:
        body.append("<h2>Recent snapshot diffs</h2>" + diffs_table(view.diffs))
    body.append(f"<p class='err'>A pipeline more than {LAG_WARNING_SECONDS:.0f} s behind is listed under "
                f"“needs attention”. Published loads older than {f.days} days leave this page. "
                f"This page reloads every {REFRESH_SECONDS} s.</p>")
    return _page("Sync", "\n".join(body))


def _minute_chart(counters: list[dict]) -> str:
    """Row changes applied per minute (all tables), as bars."""
    minutes: dict[str, int] = {}
    for c in counters:
        minutes[c["minute"]] = minutes.get(c["minute"], 0) + c["events"]
    if not minutes:
        return "<p>No changes applied in the last minutes.</p>"
    top, bar, height = max(minutes.values()) or 1, 24, 80
    bars = "".join(
        f'<rect x="{i * (bar + 6)}" y="{height - n / top * height:.1f}" width="{bar}" height="{n / top * height:.1f}" '
        f'fill="#4e79a7"><title>{escape(m)}: {n:,} changes</title></rect>'
        for i, (m, n) in enumerate(sorted(minutes.items())))
    return (f'<svg class="chart" width="{len(minutes) * (bar + 6)}" height="{height}" role="img">{bars}</svg>'
            f"<p>changes applied per minute, {escape(min(minutes))} … {escape(max(minutes))} (peak {top:,})</p>")


def group_html(name: str, parts: list[PipelineRow], now: float | None = None) -> str:
    """A source group's pipelines: one copy, a row per source."""
    now = time.time() if now is None else now
    merged = parts[0].merge_into
    body = (f"<h1>Source group <code>{escape(name)}</code></h1><p>{len(parts)} source(s)"
            + (f", merged into <code>{escape(merged)}</code>" if merged else "") + "; a pipeline per source "
            "(its own checkpoint, server and lag), each linked</p>" + _pipeline_table(parts, now))
    return _page(f"Sync: {name}", body)


def pipeline_html(p: PipelineRow, now: float | None = None) -> str:
    """One pipeline: state, lag, checkpoint, its tables' verification and schema changes, a chart
    of the changes applied per minute."""
    now = time.time() if now is None else now
    s = p.state
    info = s.to_dict()
    tables = "".join(
        f"<tr><td class='v'>{escape(t['table'])}</td><td>{t['verifications']}</td><td>{t['repaired_shards']}</td>"
        f"<td class='v'>{_since((t['last'] or {}).get('at'), now)}</td>"
        f"<td class='v'>{'due' if t['due'] else ''}</td></tr>"
        for t in info["verification"]["tables"])
    changes = "".join(f"<li>{escape(c['table'])}: {escape(str({k: v for k, v in c.items() if k != 'table'}))}</li>"
                      for c in info["schema_changes"])
    what, command = p.remedy()
    body = (f"<h1>Pipeline <code>{escape(s.pipeline)}</code> — <span class='{p.kind}'>{escape(s.status)}</span>"
            f"{' (stale)' if s.stale else ''}</h1><p><a href='./'>all of Sync</a></p>"
            + _pipeline_table([p], now)
            + f"<p>checkpoint {escape(str(s.checkpoint))}; source seen at {escape(str(s.source_position))}; "
            f"{s.events:,} row changes applied in total; {escape(s.verification_line())}; lease generation "
            f"{s.generation}{', holder ' + escape(s.holder) if s.holder else ''}</p>"
            + (f"<p>source server: {escape(_server(s.server))}, epoch {s.checkpoint.epoch if s.checkpoint else 0}</p>"
               if s.server else "")
            + (f"<p class='running' id='applying'>{escape(s.applying_line(now))}</p>" if s.applying else "")
            + (f"<p>tables selected by <code>{escape(json.dumps(p.selection))}</code> (every run applies them; "
               "<code>change_selection=True</code> replaces them)</p>" if p.selection else "")
            + (f"<p class='error'>{escape(s.error)}</p><p>remedy: {escape(what)} — {task_link(p.task)}; or "
               f"{_cmd(command)}</p>" if p.failing else "")
            + _minute_chart(p.counters)
            + "<h2>Tables</h2><table><tr><th class='v'>table</th><th>verifications</th><th>shards repaired</th>"
            f"<th class='v'>last verified</th><th></th></tr>{tables}</table>"
            + (f"<h2>Schema changes</h2><ul>{changes}</ul>" if changes else ""))
    return _page(f"Sync: {s.pipeline}", body)


def _server(server: dict) -> str:
    from airflow_sync_provider.core.cdc.servers import Server

    return str(Server.from_dict(server))


def load_html(state, verdict: tuple[str, str], task: TaskRef | None, check: dict | None,
              now: float | None = None) -> str:
    """One load in full: verdict, the task instance behind it, every shard's newest attempt."""
    now = time.time() if now is None else now
    shards = []
    for s in sorted(state.shards.values(), key=lambda s: s.shard_id):
        bad = s.status != SHARD_SUCCESS or counters_disagree(s)
        shards.append(f"<tr class='{'failed' if bad else ''}'><td>{s.shard_id}</td>"
                      f"<td class='v'>{escape(s.status)}</td>"
                      f"<td>{s.attempt}</td><td>{s.records_read:,}</td><td>{s.records_written:,}</td>"
                      f"<td>{s.records_failed:,}</td><td>{s.seconds:.1f}</td><td class='v'>{escape(s.executor)}</td>"
                      f"<td class='v err'>{escape(s.error[:300])}</td></tr>")
    check_line = (f"<p>last check: <a href='reconciliation?load={quote(state.load_key, safe='')}'>"
                  f"{escape(check['verdict'])}</a> (generation {check['generation']})</p>" if check else "")
    body = (f"<h1><code>{escape(state.load_key)}</code> — <span class='{escape(verdict[0])}'>{escape(state.status)}"
            f"</span>{' (stale)' if state.stale else ''}</h1><p><a href='./'>all of Sync</a></p>"
            f"<p>{escape(state.source_table)} → {escape(state.target_table)}, generation {state.generation}, "
            f"{sum(1 for s in state.shards.values() if s.status == 'success')}/{len(state.plan.get('shards', []))} "
            f"shards done; last report {_since(state.heartbeat, now)}; task {task_link(task)}</p>"
            f"<p>counters: <b class='{escape(verdict[0])}'>{escape(verdict[0])}</b> {escape(verdict[1])}</p>"
            + (f"<p class='error'>{escape(state.error)}</p>" if state.error else "") + check_line
            + "<table id='shards'><tr><th>shard</th><th class='v'>status</th><th>attempt</th><th>read</th>"
            "<th>written</th><th>failed</th><th>seconds</th><th class='v'>executor</th><th class='v'>error</th></tr>"
            f"{''.join(shards)}</table>")
    return _page(f"Sync: {state.load_key}", body)


def diffs_html(runs: list[dict], prefix: str) -> str:
    return _page("Sync: diffs", f"<h1>Snapshot diffs {escape(prefix)}*</h1><p><a href='./'>all of Sync</a></p>"
                 + diffs_table(runs))


def no_ledger_html(conn_id: str, setting: str, cause: str) -> str:
    """The page shown when the ledger's ClickHouse connection is missing or cannot be used."""
    body = (f"<p class='error'>The Sync view reads its ledger from the ClickHouse connection "
            f"<code>{escape(conn_id)}</code>, and it cannot be used: {escape(cause)}</p>"
            f"<p>The connection is chosen by <code>{escape(setting)}</code> (default "
            "<code>clickhouse_default</code>); its ledger database by <code>[sync] ledger_database</code>. "
            "Create the connection (type <code>clickhouse</code>, docs/connections.md) or point the setting at "
            "the one your sync jobs use.</p>")
    return _page("Sync: no ledger connection", body, refresh=None)

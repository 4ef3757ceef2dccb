"""The Sync view's pages as core gathers them (core/overview.py) and the plugin renders them
(plugins/pages.py, from the Jinja2 templates in plugins/templates/) over a real ledger in
ClickHouse; tests/test_sync_view_scale.py serves them to Chromium with 200 tables,
tests/test_airflow_real.py from a running API server."""

from __future__ import annotations

import re
import time

import pytest

from airflow_sync_provider.core import overview as ov
from airflow_sync_provider.core.cdc.checkpoints import PipelineState
from airflow_sync_provider.core.ledger import TASK_LOAD, TASK_PIPELINE, TASK_RECONCILIATION, TaskRef
from airflow_sync_provider.core.metrics import lag_seconds
from airflow_sync_provider.core.positions import BinlogPosition
from airflow_sync_provider.core.series import PIPELINE, Point, Series
from airflow_sync_provider.plugins import pages
from tests.ledger_fill import FillLedger, add_load, add_pipeline, add_task, fresh

OK = ("success", 100, 100, 0, "")


@pytest.fixture
def book(ch):
    yield from fresh(ch, FillLedger, "sync_page")


def _section(page: str, element_id: str) -> str:
    """The element with ``id=element_id`` (a table or list), as text."""
    match = re.search(rf"<(\w+) [^>]*id='{element_id}'.*?</\1>", page, re.S)
    assert match, f"no #{element_id} on the page"
    return match.group(0)


def test_the_first_screen_names_failures_with_their_remedy_and_task_before_the_tables(book, ch):
    now = time.time()
    add_load(book, "daily.2025-01-02", "shop.orders", "shop.orders_daily", "failed",
             [OK, ("failed", 7, 0, 7, "ValueError: <bad> date in 'shipped_at'"), OK, ("failed", 0, 0, 0, "reset")])
    add_task(book, TASK_LOAD, "daily.2025-01-02", "sync_daily", "load_day", "backfill__2025-01-03T00:00:00+00:00")
    add_load(book, "nightly.orders", "shop.orders", "shop.orders", "published", [OK, OK, OK], at=now - 3600)
    # published, then a reconciliation marked shard 1 (its copy differs there)
    add_load(book, "nightly.items", "shop.items", "shop.items", "published",
             [OK, ("mismatch", 100, 100, 0, ""), OK], at=now - 3000)
    book.write_reconciliation("nightly.items", 1, "mismatch", [1], True, [])
    add_task(book, TASK_RECONCILIATION, "nightly.items", "sync_nightly", "check_items", "scheduled__x")
    add_load(book, "big.events", "shop.events", "shop.events", "running", [OK] * 4 + [("running", 50, 50, 0, "")],
             estimated_rows=1_000, heartbeat=True, planned=10)
    # running, but its job stopped reporting 10 minutes ago: it died
    add_load(book, "gone.users", "crm.users", "crm.users", "running", [OK, ("running", 5, 5, 0, "")], at=now - 600)
    add_pipeline(ch, book.database, "orders_cdc", "running", ["shop.orders"], behind_seconds=900, events=5_000)
    add_task(book, TASK_PIPELINE, "orders_cdc", "sync_cdc", "catch_up", "scheduled__2025-01-05T00:00:00+00:00")
    add_pipeline(ch, book.database, "crm_cdc", "failed", ["crm.users"], error="BinlogError: the binlog was purged")
    add_pipeline(ch, book.database, "steady_cdc", "idle", ["crm.accounts"], events=7,
                 verified={"position": {"file": "f", "pos": 1}, "at": now - 60, "shards": 3, "mismatched": [],
                           "repaired_shards": 0, "rows_repaired": 0})

    view = ov.overview(book, ov.Filters())
    page = pages.overview_html(view)
    assert view.counts["loads"] == {"failed": 3, "running": 1, "published": 1, "abandoned": 0}
    assert view.counts["shards"]["failed"] == 2 + 1 + 1  # two failed, one mismatched, one left running by a dead job
    assert view.counts["pipelines"] == {"failed": 1, "behind": 1, "running": 0, "idle": 1}
    attention = _section(page, "attention")
    assert page.index("id='attention'") < page.index("id='running'") < page.index("id='pipelines'") \
        < page.index("id='tables'")
    daily = next(li for li in attention.split("<li") if "shop.orders → shop.orders_daily" in li)
    assert "shards [1, 3] of 4 did not complete" in daily and "ValueError: &lt;bad&gt; date" in daily
    assert "<bad>" not in page  # escaped everywhere
    assert "clear the task: its retry resumes the load and reads only shards 1, 3" in daily
    assert "<code>airflow-sync reimport --load daily.2025-01-02 --failed</code>" in daily
    assert "href='../dags/sync_daily/runs/backfill__2025-01-03T00%3A00%3A00%2B00%3A00/tasks/load_day'" in daily
    items = next(li for li in attention.split("<li") if "shop.items" in li)
    assert "shards [1] of 3 differ from the source" in items and "reimport=&#39;failed&#39;" in items
    gone = next(li for li in attention.split("<li") if "crm.users" in li)
    assert "its job died" in gone and "shards [1] of 2" in gone and "no task recorded" in gone
    lag = next(li for li in attention.split("<li") if "orders_cdc" in li)
    behind = re.search(r"([\d,]+) s behind the source", lag)
    assert behind and int(behind.group(1).replace(",", "")) >= 900 and "../dags/sync_cdc/runs/" in lag
    assert "airflow-sync cdc apply --pipeline orders_cdc" in lag
    crm = next(li for li in attention.split("<li") if "crm_cdc" in li)
    assert "the binlog was purged" in crm and "replays from its checkpoint mysql-bin.000003:1000" in crm
    assert "steady_cdc" not in attention
    running = _section(page, "running")
    assert "shop.events" in running and "4/10 shards" in running and "450 of ~1,000 rows (45%)" in running
    pipelines = _section(page, "pipelines")
    assert re.search(r"steady_cdc.*caught up.*oldest: crm\.accounts 1 min ago", pipelines, re.S)
    tables = _section(page, "tables")
    assert tables.index("daily.2025-01-02") < tables.index("big.events") < tables.index("nightly.orders")
    assert "href='reconciliation?load=nightly.items'" in tables and "mismatch [1]" in tables
    assert '<meta http-equiv="refresh" content="15">' in page


def test_filters_narrow_the_rows_and_pages_split_them(book):
    now = time.time()
    for i in range(60):
        add_load(book, f"job:shop.t{i:02d}", f"shop.t{i:02d}", f"shop_copy.t{i:02d}", "published", [OK],
                 at=now - 100 - i)
    for i in range(15):
        add_load(book, f"other:crm.c{i:02d}", f"crm.c{i:02d}", f"crm.c{i:02d}", "failed",
                 [("failed", 1, 0, 1, "boom")])

    everything = ov.overview(book, ov.Filters())
    assert everything.total == 75 and everything.pages == 2 and len(everything.rows) == ov.PAGE_ROWS
    assert all(r.kind == "failed" for r in everything.rows[:15])  # worst first
    second = ov.overview(book, ov.Filters(page=2))
    assert {r.state.load_key for r in everything.rows} | {r.state.load_key for r in second.rows} == \
        {r.state.load_key for r in ov.load_rows(book, ov.Filters())}
    assert len(second.rows) == 25 and "href='?page=2'" in pages.overview_html(everything)

    shop = ov.overview(book, ov.Filters(table="shop.*"))
    assert shop.total == 60 and {r.state.source_table[:5] for r in shop.rows} == {"shop."}
    assert shop.counts["loads"]["failed"] == 0 and not shop.failed
    assert ov.overview(book, ov.Filters(table="shop_copy.t0?")).total == 10  # the target's name matches too
    assert ov.overview(book, ov.Filters(table="C1*")).total == 5  # no dot: a table in any database, any case
    failed = ov.overview(book, ov.Filters(state="failed"))
    assert failed.total == 15 and {r.kind for r in failed.rows} == {"failed"}
    assert failed.counts["loads"]["published"] == 60  # the counts are the tabs: not narrowed by state
    by_key = ov.overview(book, ov.Filters(load="other:"))
    assert by_key.total == 15 and not by_key.shown_pipelines
    page = pages.overview_html(ov.overview(book, ov.Filters(table="shop.t1*", state="published")))
    assert "value='shop.t1*'" in page and "<option value='published' selected>" in page
    assert page.count("data-key='job:shop.t1") == 10 and "crm." not in _section(page, "tables")
    with pytest.raises(ValueError, match="state must be one of"):
        ov.Filters(state="nope")


def test_old_published_loads_leave_the_page_failed_ones_stay(book):
    old = time.time() - 10 * 86400
    add_load(book, "old.ok", "a.ok", "a.ok", "published", [OK], at=old)
    add_load(book, "old.bad", "a.bad", "a.bad", "failed", [("failed", 0, 0, 0, "x")], at=old)
    assert [r.state.load_key for r in ov.load_rows(book, ov.Filters())] == ["old.bad"]
    assert {r.state.load_key for r in ov.load_rows(book, ov.Filters(days=30))} == {"old.ok", "old.bad"}


def test_rows_link_to_the_task_instance_of_their_job_even_a_job_of_many_tables(book):
    add_load(book, "whole:db.a", "db.a", "db.a", "published", [OK])
    add_load(book, "whole:db.b", "db.b", "db.b", "published", [OK])
    add_load(book, "mapped.load.run1.db.c", "db.c", "db.c", "published", [OK])
    add_task(book, TASK_LOAD, "whole", "dag_w", "load_all", "manual__1")
    add_task(book, TASK_LOAD, "mapped.load.run1.db.c", "dag_m", "load", "manual__2", map_index=3)
    tasks = book.tasks(TASK_LOAD, ["whole:db.a", "whole:db.b", "mapped.load.run1.db.c", "unknown"])
    assert tasks["whole:db.a"] == tasks["whole:db.b"] == TaskRef("dag_w", "load_all", "manual__1", -1, 1)
    assert pages.ti_path(tasks["mapped.load.run1.db.c"]) == "../dags/dag_m/runs/manual__2/tasks/load/mapped/3"
    assert "unknown" not in tasks
    add_task(book, TASK_LOAD, "whole", "dag_w", "load_all", "manual__9")  # a newer run of the same job
    assert book.tasks(TASK_LOAD, ["whole:db.a"])["whole:db.a"].run_id == "manual__9"
    page = pages.overview_html(ov.overview(book, ov.Filters()))
    assert page.count("href='../dags/dag_w/runs/manual__9/tasks/load_all'") == 2


def test_a_load_page_shows_every_shard_and_a_pipeline_page_its_chart(book, ch):
    add_load(book, "k<1>", "db.t", "db.t2", "failed", [OK, ("failed", 10, 5, 5, "ValueError: <bad> date")])
    add_task(book, TASK_LOAD, "k<1>", "d", "t", "r")
    page = pages.load_html(*ov.load_page(book, "k<1>"))
    assert "<code>k&lt;1&gt;</code>" in page and "<1>" not in page
    shards = _section(page, "shards")
    assert "<tr class='failed'><td>1</td><td class='v'>failed</td><td>1</td><td>10</td><td>5</td><td>5</td>" in shards
    assert "ValueError: &lt;bad&gt; date" in shards and "../dags/d/runs/r/tasks/t" in page
    assert ov.load_page(book, "nope") is None

    add_pipeline(ch, book.database, "p", "running", ["db.t"], behind_seconds=42)
    from tests.ledger_fill import FillCheckpoints
    FillCheckpoints(ch, book.database).count("p", {"db.t": (30, 30, 0)})
    found = ov.pipeline_page(book, "p")
    page = pages.pipeline_html(found)
    assert page.count("<rect ") == 1 and "peak 30" in page and "4" in _section(page, "pipelines")
    add_pipeline(ch, book.database, "q", "failed", ["db.t"], error="BinlogError: purged", seen=False)
    page = pages.pipeline_html(ov.pipeline_page(book, "q"))
    assert "the source's position not seen yet" in page and "None" not in page
    assert ov.pipeline_page(book, "nope") is None


def test_a_pipeline_page_shows_each_copys_layout_and_a_load_page_the_one_it_asked_for(book, ch):
    """A pipeline's page names each copy's layout as its table comment records it (where
    ``cdc status`` reads it), a copy without one laid out by its source key; a load's page the
    layout its spec asks for. Every part escaped."""
    from airflow_sync_provider.core.clickhouse.layout import Layout, layout_comment
    from airflow_sync_provider.core.loads import LoadState
    from airflow_sync_provider.core.sql import ch_string, ch_table

    db = book.database
    ttl = "day + INTERVAL 1 YEAR DELETE WHERE status = '<old>'"
    layout = Layout.of({"order_by": ["status"], "partition_by": "toYYYYMM(day)", "ttl": ttl})
    ch.command(f"CREATE TABLE {ch_table(db, 'laid')} (id UInt64, status String, day Date) ENGINE = MergeTree "
               f"PARTITION BY toYYYYMM(day) ORDER BY (status, toYYYYMM(day), id) TTL {ttl} "
               f"COMMENT {ch_string(layout_comment(layout, ('id',)))}")
    ch.command(f"CREATE TABLE {ch_table(db, 'plain')} (id UInt64, name String) ENGINE = MergeTree ORDER BY id")
    add_pipeline(ch, db, "shaped", "idle", [f"{db}.laid", f"{db}.plain", f"{db}.not_copied_yet"])
    found = ov.pipeline_page(book, "shaped")
    assert list(found.copies) == [f"{db}.laid", f"{db}.plain"]  # a table without a copy goes unsaid
    page = pages.pipeline_html(found)
    shown = ("ORDER BY (status, toYYYYMM(day), id) · PARTITION BY toYYYYMM(day) · TTL day + INTERVAL 1 YEAR "
             "DELETE WHERE status = &#39;&lt;old&gt;&#39;")
    layouts = _section(page, "layouts")
    assert f"<li>{db}.laid: {shown}</li>" in layouts and "<old>" not in page
    assert f"<li>{db}.plain: by its source key: ORDER BY (id)</li>" in layouts
    assert "How the copies are laid out" not in pages.pipeline_html(ov.pipeline_rows(book, ov.Filters())[0])
    assert pages.ENV.filters["layout"](Layout(), []) == "ORDER BY tuple(): the source table has no primary key"

    spec = {"load_key": "shaped<1>", "tableset": {"layout": layout.to_dict()}}
    book.write_load(LoadState("shaped<1>", 1, "published", "src.laid", f"{db}.laid", {"shards": []}, "parts_s", 1,
                              spec))
    page = pages.load_html(*ov.load_page(book, "shaped<1>"))
    assert _section(page, "layout") == (
        "<p id='layout'>the copy's layout: ORDER BY (status, toYYYYMM(day), the source key) · PARTITION BY "
        "toYYYYMM(day) · TTL day + INTERVAL 1 YEAR DELETE WHERE status = &#39;&lt;old&gt;&#39;</p>")
    period = LoadState("p", 1, "published", "src.e", "db.e", {"shards": []}, "parts_p", 1,
                       {"partition_by": "toYYYYMMDD(day)"})  # a period load's partitions are part of it
    assert ("the copy's layout: ORDER BY (toYYYYMMDD(day), the source key) · PARTITION BY toYYYYMMDD(day)</p>"
            in pages.load_html(period, ("ok", ""), None, None))
    add_load(book, "plain<1>", "src.plain", f"{db}.plain", "published", [OK])
    assert "<p id='layout'>the copy's layout: by its source key</p>" in pages.load_html(
        *ov.load_page(book, "plain<1>"))


def test_lag_is_the_age_of_the_last_applied_change_while_behind_else_zero():
    now = 1_000_000.0
    behind = PipelineState("p", "running", BinlogPosition("f.2", 400), source_position=BinlogPosition("f.2", 900),
                           source_time=now - 42, heartbeat=now)
    assert lag_seconds(behind, now) == 42
    caught_up = PipelineState("p", "idle", BinlogPosition("f.2", 900), source_position=BinlogPosition("f.2", 900),
                              source_time=now - 42, heartbeat=now - 5)
    assert lag_seconds(caught_up, now) == 0
    assert lag_seconds(PipelineState("p"), now) is None


@pytest.mark.parametrize("conn_id", ["no_such_ledger", ""])
def test_without_its_ledger_connection_the_view_names_the_connection_and_the_setting(monkeypatch, conn_id):
    """[sync] clickhouse_conn_id unset (its default, clickhouse_default, does not exist here) or
    naming no connection: a page saying which connection was looked for and what chooses it."""
    from fastapi.testclient import TestClient

    from airflow_sync_provider.compat import api_user
    from airflow_sync_provider.plugins import sync_view

    monkeypatch.setenv("AIRFLOW__SYNC__CLICKHOUSE_CONN_ID", conn_id)
    monkeypatch.delenv("AIRFLOW_CONN_CLICKHOUSE_DEFAULT", raising=False)
    monkeypatch.setitem(sync_view.app.dependency_overrides, api_user(), lambda: None)
    page = TestClient(sync_view.app).get("/", params={"table": "shop.*"})
    assert page.status_code == 503, page.text
    assert f"<code>{conn_id or 'clickhouse_default'}</code>" in page.text and "isn&#39;t defined" in page.text
    assert "[sync] clickhouse_conn_id (AIRFLOW__SYNC__CLICKHOUSE_CONN_ID)" in page.text


def test_a_source_group_is_one_copy_with_a_row_per_source(book, ch):
    """A group's pipelines (one per source) sit together under a row of the group — its merged
    copy, its sources, its worst lag — and the group's own page lists them."""
    from airflow_sync_provider.core.cdc.checkpoints import Checkpoints, GroupRecord

    # the group's lag line, like a pipeline's: the worst of its sources' lags in each 90 s of the hour (written
    # first: the lags below are read as the page is made)
    series, start = Series(ch, book.database), (time.time() // 90 - 20) * 90
    series.ensure()
    series.write(PIPELINE, {"shops@s0": Point(start + 10, 10.0)})
    series.write(PIPELINE, {"shops@s1": Point(start + 20, 120.0)})
    series.write(PIPELINE, {"shops@s0": Point(start + 400, 30.0)})
    add_pipeline(ch, book.database, "shops@s0", "idle", ["shop_x.orders_0"])
    add_pipeline(ch, book.database, "shops@s1", "running", ["shop_x.orders_0"], behind_seconds=120)
    add_pipeline(ch, book.database, "shops@s2", "stopped", ["shop_x.orders_0"], error="BinlogError: retyped on s2")
    add_pipeline(ch, book.database, "lonely", "idle", ["crm.users"])
    Checkpoints(ch, book.database).write_group("shops", GroupRecord(("s0", "s1", "s2"), "analytics.orders"))
    page = pages.overview_html(ov.overview(book, ov.Filters()))
    table = _section(page, "pipelines")
    group_row = table.index("source group")
    # the lag is read as the page is made: 120 s and the time the test took since it wrote it
    assert re.search(r"→ analytics\.orders: 3 source\(s\), worst lag 12\d s", table), table
    row = re.search(r"<tr class='\w+ group'>.*?</tr>", table, re.S).group(0)
    assert re.search(r"<td title='the worst lag of its sources'>12\d s</td>", row), row
    drawn = [(float(t) - start, float(v)) for t, v in re.findall(r"data-t='([\d.]+)' data-v='([\d.]+)'", row)]
    assert drawn[:2] == [(20.0, 120.0), (400.0, 30.0)] and 120 <= drawn[2][1] < 125, drawn  # then: written now
    assert group_row < table.index(">shops@s0<") and group_row < table.index(">shops@s1<") < table.index(">lonely<")
    parts = ov.pipeline_page(book, "shops")
    assert [p.state.pipeline for p in parts] == ["shops@s2", "shops@s1", "shops@s0"]  # worst first
    html = pages.group_html("shops", parts)
    assert "Source group <code>shops</code>" in html and "retyped on s2" in html


def test_the_templates_are_shipped_and_autoescaped():
    """Every template the pages render is package data (pyproject.toml), so a wheel carries it, and
    the templates escape every value (autoescape: none marks a value safe)."""
    from fnmatch import fnmatch
    from pathlib import Path

    pyproject = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    shipped = re.search(r'^"airflow_sync_provider\.plugins" = \[(.*)\]$', pyproject, re.M)
    assert shipped, "no package data for airflow_sync_provider.plugins in pyproject.toml"
    globs = re.findall(r'"([^"]+)"', shipped.group(1))
    templates = sorted(p.relative_to(pages.TEMPLATES.parent).as_posix() for p in pages.TEMPLATES.rglob("*")
                       if p.is_file())
    assert templates and all(any(fnmatch(t, g) for g in globs) for t in templates), (templates, globs)
    assert pages.ENV.autoescape is True
    for path in pages.TEMPLATES.glob("*.html"):
        assert "|safe" not in path.read_text().replace(" ", ""), path.name
    page = pages.no_ledger_html("<conn>", "<setting>", "it's <bad>")
    assert "<code>&lt;conn&gt;</code>" in page and "it&#39;s &lt;bad&gt;" in page and "<bad>" not in page


def test_the_overview_filters_come_from_the_query_and_a_bad_one_is_refused(monkeypatch, book, ch):
    """The overview's query parameters reach ov.Filters (a FastAPI dependency of the page); a value
    Filters refuses is a 400 naming it, before the ledger is read."""
    from fastapi.testclient import TestClient

    from airflow_sync_provider.compat import api_user
    from airflow_sync_provider.plugins import sync_view

    monkeypatch.setitem(sync_view.app.dependency_overrides, api_user(), lambda: None)
    monkeypatch.setitem(sync_view.app.dependency_overrides, sync_view.ledger, lambda: book)
    bad = TestClient(sync_view.app).get("/", params={"state": "bogus"})
    assert bad.status_code == 400 and "state must be one of" in bad.text, bad.text
    good = TestClient(sync_view.app).get("/", params={"state": "failed", "table": "shop.*", "days": 3})
    assert good.status_code == 200 and "Published loads older than 3 days leave this page" in good.text

"""What the Sync view's browser tests check on every page (tests/test_sync_view_scale.py over the
plugin's own app, tests/test_airflow_real.py over a real API server): no horizontal scrolling at
the window's width, a light and a dark screenshot, the first paint, and a chart drawn from a
series the test wrote — its points where the test put them."""

from __future__ import annotations

import time
from pathlib import Path

from airflow_sync_provider.core.series import PIPELINE, Point, Series
from airflow_sync_provider.plugins import charts

# a lag series (seconds ago, lag) a test writes: each point in its own 30 s bucket of the hour window
LAG_POINTS = ((3000, 0.0), (2400, 120.0), (1800, 600.0), (1200, 300.0), (600, 30.0))


def write_lag_series(ch, database: str, pipeline: str) -> list[tuple[float, float]]:
    now = time.time()
    wrote = [(round(now - ago, 3), lag) for ago, lag in LAG_POINTS]
    book = Series(ch, database)
    book.ensure()
    for at, lag in wrote:
        book.write(PIPELINE, {pipeline: Point(at, lag)})
    return wrote


def page_checks(browser, png: Path, dark: bool = True) -> dict:
    """On the page the browser shows: no horizontal overflow; screenshots (``png`` and, with
    ``dark``, ``<png>-dark.png`` with the system in dark mode); the first paint (ms) and the page's
    own background in each mode."""
    width = browser.evaluate("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
    assert width[0] <= width[1], f"{png.name}: {width[0]} px wide in a {width[1]} px window"
    paint = browser.send("Runtime.evaluate", returnByValue=True, awaitPromise=True, expression=(
        "new Promise(done => { new PerformanceObserver(list => done(list.getEntries()[0].startTime))"
        ".observe({type: 'paint', buffered: true}); setTimeout(() => done(-1), 5000); })"))["result"]["value"]
    background = "getComputedStyle(document.body).backgroundColor"
    out = {"first_paint": paint, "light": browser.evaluate(background)}
    browser.screenshot(png)
    if dark:
        browser.send("Emulation.setEmulatedMedia", features=[{"name": "prefers-color-scheme", "value": "dark"}])
        out["dark"] = browser.evaluate(background)
        browser.screenshot(png.with_name(png.stem + "-dark.png"))
        browser.send("Emulation.setEmulatedMedia", features=[{"name": "prefers-color-scheme", "value": "light"}])
        assert out["dark"] != out["light"], out
    return out


def chart_points(browser, chart_id: str, line: str) -> list[dict]:
    """The dots of ``line`` in the chart ``#chart_id`` as drawn: time and value, and where on the
    screen (their centres), with the SVG's box and window."""
    return browser.evaluate(
        f"(() => {{ const svg = document.getElementById('{chart_id}'); const box = svg.getBoundingClientRect();"
        f" return [...svg.querySelectorAll('g.{line} circle')].map(c => {{ const r = c.getBoundingClientRect();"
        " return {t: +c.dataset.t, v: +c.dataset.v, x: r.left + r.width / 2 - box.left,"
        " y: r.top + r.height / 2 - box.top, width: box.width, vw: svg.viewBox.baseVal.width,"
        " start: +svg.dataset.start, end: +svg.dataset.end, top: +svg.dataset.top}; }); })()")


def assert_drawn_where_written(drawn: list[dict], wrote: list[tuple[float, float]]) -> None:
    """Each written (time, value) is a dot of the chart, at the x its time and the y its value
    give on the chart's axes (plugins/charts.py), within a pixel."""
    assert drawn, "no dots drawn"
    d0 = drawn[0]
    geometry = charts.time_chart({}, d0["start"], d0["end"])
    geometry.top_value = d0["top"]
    scale = d0["width"] / d0["vw"]
    for t, v in wrote:
        dot = next((d for d in drawn if abs(d["t"] - t) < 0.01), None)
        assert dot is not None, (t, v, [(d["t"], d["v"]) for d in drawn])
        assert dot["v"] == v
        assert abs(dot["x"] - geometry.x(t) * scale) <= 1.0, (dot, geometry.x(t) * scale)
        assert abs(dot["y"] - geometry.y(v) * scale) <= 1.0, (dot, geometry.y(v) * scale)


# what is compared between a page of Airflow's UI and the Sync view: (Airflow's element, ours)
_STYLE = ("(e => { const s = getComputedStyle(e);"
          " return [s.fontFamily, s.fontSize, s.fontWeight, s.color, s.backgroundColor]; })")
_LINK = "(e => getComputedStyle(e).color)"
_MATCHED = {"page title": ("h2", "h2"), "table header": ("th", "th"), "table cell": ("td", "td")}


def in_airflow_ui(browser, base: str, out: Path) -> dict:
    """Airflow's own UI beside the Sync view, in its light and dark mode (as the UI stores it:
    ``localStorage['theme']``), signed in by the UI's cookie: its DAG list and its audit log
    (``airflow-dags[-dark].png``, ``airflow-events[-dark].png``), the Sync view as the UI shows it
    — its nav entry's route ``/plugin/sync``, the page in the UI's frame — (``sync-in-airflow[-dark].png``)
    and the DAG list and the framed view side by side (``side-by-side[-dark].png``). Asserted in
    each mode: the framed page takes the UI's mode and background, and its headings, table headers
    and cells have the font, size, weight, colour and background of the audit log's (its
    striped first row), its links the colour of the DAG list's. Returns the styles seen."""
    seen = {}
    frame = "document.querySelector('iframe')?.contentDocument"
    for mode, suffix in (("light", ""), ("dark", "-dark")):
        browser.open(base + "/")
        browser.evaluate(f"localStorage.setItem('theme', '{mode}')")
        browser.open(base + "/dags")
        browser.wait_for("document.querySelectorAll('a[href*=\"/dags/\"]').length > 0")
        dags = browser.screenshot(out / f"airflow-dags{suffix}.png")
        link = browser.evaluate(f"{_LINK}(document.querySelector('a[href*=\"/dags/\"]'))")
        browser.open(base + "/events")
        browser.wait_for("document.querySelectorAll('tbody td').length > 0")
        browser.screenshot(out / f"airflow-events{suffix}.png")
        theirs = {what: browser.evaluate(f"{_STYLE}(document.querySelector('{a}'))")
                  for what, (a, _) in _MATCHED.items()}
        background = browser.evaluate("getComputedStyle(document.documentElement).backgroundColor")
        browser.open(base + "/plugin/sync")
        browser.wait_for(f"{frame}?.readyState == 'complete' && {frame}.querySelector('#attention, h1') != null")
        framed = browser.screenshot(out / f"sync-in-airflow{suffix}.png")
        ours = {what: browser.evaluate(f"{_STYLE}({frame}.querySelector('{b}'))") for what, (_, b) in _MATCHED.items()}
        assert browser.evaluate(f"{frame}.documentElement.className") == mode
        # Airflow's nav beside it leaves the frame narrower than the window: nothing cut off there
        width = browser.evaluate(f"[{frame}.documentElement.scrollWidth, {frame}.documentElement.clientWidth]")
        assert width[0] <= width[1], f"the Sync view in Airflow's frame: {width[0]} px wide in {width[1]} px"
        seen["frame_width"] = width[1]
        assert browser.evaluate(f"getComputedStyle({frame}.body).backgroundColor") == background, mode
        ours["link"], theirs["link"] = browser.evaluate(f"{_LINK}({frame}.querySelector('td a'))"), link
        assert ours == theirs, (mode, ours, theirs)
        seen[mode] = {"airflow": theirs, "sync": ours, "background": background}
        browser.side_by_side([dags, framed], out / f"side-by-side{suffix}.png")
    return seen

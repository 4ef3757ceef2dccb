"""ReconcileOperator's verdict handling (the job itself runs in tests/test_reconcile.py and test_cli.py)."""

from __future__ import annotations

import pytest

from airflow_sync_provider.compat import AirflowException
from airflow_sync_provider.operators.reconcile import ReconcileOperator


def result(verdict, mismatched, before=None):
    shards = [{"shard_id": 0, "source_rows": 5, "target_rows": 5 if verdict == "ok" else 4, "source_checksum": None,
               "target_checksum": None, "records_read": 5, "records_written": 5, "records_failed": 0,
               "problems": [] if verdict == "ok" else ["source 5 != target 4"]}]
    out = {"load_key": "k", "generation": 1, "table": "db.t", "target": "db.t", "verdict": verdict,
           "mismatched": mismatched, "checksum": True, "shards": shards}
    if before:
        out |= {"before": {"verdict": "mismatch", "mismatched": before, "shards": shards},
                "reimported": {"repaired": before, "rows": 5, "seconds": 1.0}}
    return out


def op(on_mismatch, tmp_path):
    return ReconcileOperator(task_id="check", load_key="k", on_mismatch=on_mismatch, report_dir=str(tmp_path))


def test_reimport_asks_the_job_to_repair_and_reports_what_it_did(tmp_path):
    summary = op("reimport", tmp_path).summarize(result("ok", [], before=[0]))
    assert summary["verdict"] == "ok" and summary["mismatched_before"] == [0]
    assert summary["reimported"]["repaired"] == [0] and summary["report"].endswith(".html")


def test_a_mismatch_that_survives_the_reimport_fails_the_task(tmp_path):
    with pytest.raises(AirflowException, match=r"shards \[0\] do not match"):
        op("reimport", tmp_path).summarize(result("mismatch", [0], before=[0]))
    with pytest.raises(AirflowException):
        op("fail", tmp_path).summarize(result("mismatch", [0]))
    assert op("warn", tmp_path).summarize(result("mismatch", [0]))["verdict"] == "mismatch"


def test_unknown_on_mismatch_is_refused():
    with pytest.raises(ValueError, match="on_mismatch must be one of"):
        ReconcileOperator(task_id="check", load_key="k", on_mismatch="ignore")


def test_the_report_says_what_was_reimported(tmp_path):
    from airflow_sync_provider.plugins.pages import reconcile_html

    page = reconcile_html(result("ok", [], before=[0]))
    assert "First pass: shards [0] mismatched; they were re-imported (5 rows)" in page
    assert "First pass" not in reconcile_html(result("ok", []))


def test_the_report_pages_escape_every_value_and_are_written_without_airflow(tmp_path):
    """The reconciliation and diff pages (plugins/templates/, autoescaped) as the operators and the
    command line write them: every value from the source or the copy is escaped; the rendering
    modules import jinja2, not Airflow."""
    import subprocess
    import sys

    from airflow_sync_provider.plugins.reports import write_diff_report, write_report

    bad = result("mismatch", [0]) | {"table": "db.<t>", "load_key": "k<1>'"}
    bad["shards"][0]["problems"] = ["source <5> != target 4"]
    page = (tmp_path / "k_1_.g1.html")
    assert write_report(bad, str(tmp_path)) == str(page)
    html = page.read_text()
    assert "db.&lt;t&gt; → db.t: mismatch" in html and "<code>k&lt;1&gt;&#39;</code>" in html
    assert "source &lt;5&gt; != target 4" in html and "<5>" not in html and "<t>" not in html
    assert html.count("<rect ") == 2 and "<tr class='bad'><td>0</td><td>5</td><td>4</td>" in html
    diff = {"new": "db.t", "old": "copy.t", "verdict": "changed", "counts": {"identical": 1, "changed": 1, "new": 0,
                                                                           "deleted": 0},
            "rows_read_old": 2, "rows_read_new": 2, "rows_old": 2, "rows_new": 2, "shards_read": 1, "shards": 1,
            "buckets_read": 1, "keys": ["id"], "compared": ["note"], "diff_key": "d", "run_id": "r",
            "changes_table": "x.y", "shard_results": [],
            "samples": {"changed": [{"id": 1, "old__note": "<b>old</b>", "new__note": None, "changed": ["note"]}]}}
    html = open(write_diff_report(diff, str(tmp_path)), encoding="utf-8").read()
    assert "<td class='chg'><s>&lt;b&gt;old&lt;/b&gt;</s> → NULL</td>" in html and "<b>old" not in html
    assert "<h2>changed: 1 (first 1)</h2>" in html
    probe = ("import sys, airflow_sync_provider.plugins.reports\n"
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('airflow', 'jinja2')))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert "'jinja2'" in loaded and "'airflow'" not in loaded, loaded


def test_a_history_that_fails_its_checks_is_named_in_the_failure_and_in_xcom(tmp_path):
    """A copy with a history (core/verify/history.py): the summary carries the checks, and a
    mismatch of the history alone (no shard of the copy differs) says which check failed."""
    failed = result("mismatch", [])
    failed["history"] = {"table": "db.t", "ok": False, "latest": {"check": "latest", "faults": 0, "examples": [],
                                                                  "notes": []},
                         "conflicts": {"check": "conflicts", "faults": 1, "examples": [{"key": 3}], "notes": []},
                         "gaps": {"p": {"check": "gaps", "faults": 2, "examples": [], "notes": []}}}
    with pytest.raises(AirflowException, match=r"its history fails: conflicts \(1 fault\(s\)\), gaps of pipeline "
                                               r"'p' \(2\)"):
        op("fail", tmp_path).summarize(failed)
    assert op("warn", tmp_path).summarize(failed)["history"]["conflicts"]["faults"] == 1

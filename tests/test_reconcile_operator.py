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
    from airflow_sync_provider.core.verify.reports import reconcile_html

    page = reconcile_html(result("ok", [], before=[0]))
    assert "First pass: shards [0] mismatched; they were re-imported (5 rows)" in page
    assert "First pass" not in reconcile_html(result("ok", []))
